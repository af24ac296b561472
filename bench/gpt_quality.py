"""Validation loss of the transformer (issue 37) at equal steps: the INT8 engine against its
``--float`` twin (torch float32) and against today's char-window default, on one text.

    python bench/gpt_quality.py --make-texts DIR     # DIR/py300k.txt, DIR/docs200k.txt
    python bench/gpt_quality.py --data TEXT --steps 400 [--seeds 0]

Every run is ``daisychain train --json`` (one thread); the number compared is ``test_loss``:
the mean cross-entropy of the character after a full window, last position, test split.
Prints one JSON line per run and a table; no timing asserts anywhere (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

RUNS = {  # name -> extra train flags
    "transformer (engine)": ["--context", "32", "--layers", "block64h4,block64h4"],
    "transformer (--float)": ["--context", "32", "--layers", "block64h4,block64h4", "--float"],
    "char window default (engine)": [],
}


def run(data: str, steps: int, seed: int, extra: list[str]) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--task", "text", "--data", data,
                          "--steps", str(steps), "--seed", str(seed), "--threads", "1", "--json", *extra],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def make_texts(out: str) -> None:
    """The two texts of docs/BENCHMARKS.md: the first 300,000 characters of this Python's
    standard library ``*.py`` files in name order, and of this repository's docs/*.md then
    README.md (200,000), both with non-ASCII characters dropped after the cut."""
    import glob
    import sysconfig
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    srcs = {"py300k.txt": (sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py")), 300_000),
            "docs200k.txt": (sorted(glob.glob(str(root / "docs" / "*.md"))) + [str(root / "README.md")], 200_000)}
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, (files, n) in srcs.items():
        text = "".join(Path(f).read_text(encoding="utf-8", errors="ignore") for f in files)[:n]
        (Path(out) / name).write_text("".join(c for c in text if " " <= c <= "~" or c in "\t\n"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--make-texts", metavar="DIR", help="write the two texts there and stop")
    p.add_argument("--data")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", default="0")
    args = p.parse_args()
    if args.make_texts:
        return make_texts(args.make_texts)
    if not args.data:
        p.error("--data TEXT is required")
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, extra in RUNS.items():
            d = run(args.data, args.steps, seed, extra)
            rows.append((name, seed, d["test_loss"]))
            print(json.dumps({"run": name, "seed": seed, "steps": args.steps, "test_loss": d["test_loss"],
                              "accuracy": d["accuracy"]}), flush=True)
    print("| run | seed | test_loss |\n|---|---|---|")
    for name, seed, loss in rows:
        print(f"| {name} | {seed} | {loss:.3f} |")


if __name__ == "__main__":
    main()
