"""The text model on long runs, engine version 2 (the output error zero-sum per sample)
against version 1 (the same code without that step), in the same run.

Version 1 rounded q(p - onehot(y)) and used it as it came: a sample's row then summed to
about minus the mass of its small probabilities (they round to 0), and the char model's
validation loss rose again after ~2,000 steps (docs/LIMITS.md before version 2). This bench
trains the synchronous text run (`daisychain train --task text` at its defaults, or
``--batch``) on each corpus twice, once with ``detmath.zero_sum_errors`` replaced by the
identity in this process (version 1's arithmetic: the bench checks it reproduces version
1's pinned 20-step golden hash), and prints the validation loss every ``--every`` steps.

    .venv/bin/python -m bench.output_error [--steps 5000] [--every 500] [--no-write]

Writes the section between ``<!-- bench:output-error -->`` markers of docs/BENCHMARKS.md and
docs/output_error.png (validation loss against steps, both versions, each corpus).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.local_steps import ROOT, default_text, val_loss

#: version 1's 20-step params hash of the golden text run (daisychain/golden/step_text.json
#: before version 2): the identity patch must give it back
V1_GOLDEN_TEXT = "6772ab51c5b01e7d7ed89d5e9ba1b2935cc14d9fb0b7f05e4cbbbdcca542af00"


def all_licences() -> Path:
    """Every text under /usr/share/common-licenses (~300 kB on Debian), one file."""
    out = Path("/tmp/daisychain-bench-all-licences.txt")
    base = Path("/usr/share/common-licenses")
    parts = sorted(p for p in base.iterdir() if p.is_file()) if base.is_dir() else sorted((ROOT / "docs").glob("*.md"))
    out.write_text("".join(p.read_text(encoding="utf-8", errors="replace") for p in parts), encoding="utf-8")
    return out


@contextmanager
def version(v: int):
    """Version 1's arithmetic in this process: the zero-sum step replaced by the identity in
    every engine path that calls it (model.py, fast.py, convfast.py through detmath)."""
    from daisychain.engine import detmath, fast, model

    keep = (detmath.zero_sum_errors, fast.zero_sum_errors, model.zero_sum_errors)
    if v == 1:
        detmath.zero_sum_errors = fast.zero_sum_errors = model.zero_sum_errors = lambda G, y: G
    try:
        yield
    finally:
        detmath.zero_sum_errors, fast.zero_sum_errors, model.zero_sum_errors = keep


def golden_text_hash() -> str:
    """The 20-step params hash of the golden text run under the current arithmetic."""
    from daisychain.engine.golden import build

    return build("text")["run"]["params_sha256"]


def run(data: Path, steps: int, every: int, batch: int, val: int, label: str) -> dict:
    import argparse as ap

    from tqdm import tqdm

    from daisychain.engine.local import make_trainer
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    from daisychain.units import load_luts

    p = ap.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", "text", "--data", str(data), "--batch", str(batch),
                                          "--steps", str(steps)]))
    tr = make_trainer(rs.spec, rs.hp, rs.ds, load_luts())
    tasks = list(range(tr.n_tasks))
    points = [(0, val_loss(tr, val))]
    t0 = time.process_time()
    for step in tqdm(range(1, steps + 1), desc=label, unit="step", mininterval=2):
        tr.apply(tr.contribute(tasks).grad)
        if step % every == 0:
            points.append((step, val_loss(tr, val)))
    return {"points": points, "cpu_s": time.process_time() - t0, "hash": tr.params_sha256(),
            "params": tr.layout.size}


def report(res: dict) -> str:
    m = res["meta"]
    lines = [f"`daisychain train --task text --data FILE --batch {m['batch']}` (the char model at its other "
             f"defaults), validation loss (mean cross-entropy over the first {m['val']} test windows) every "
             f"{m['every']} steps. Version 1 is this code with `detmath.zero_sum_errors` replaced by the "
             "identity (the bench checks that it gives back version 1's golden text hash, "
             f"`{res['v1_golden'][:16]}...`). Machine: {m['cpus']} cores.", ""]
    for corpus in res["corpora"]:
        lines += [f"**{corpus['name']}** ({corpus['bytes']:,} bytes, sha256 {corpus['sha'][:12]}):", "",
                  "| steps | " + " | ".join(str(s) for s, _ in corpus["v2"]["points"]) + " | lowest (at step) |",
                  "|---|" + "---|" * (len(corpus["v2"]["points"]) + 1)]
        for v in ("v1", "v2"):
            pts = corpus[v]["points"]
            low = min(pts, key=lambda p: p[1])
            name = "version 1 (rounded as it came)" if v == "v1" else "**version 2 (zero-sum)**"
            lines.append(f"| {name} | " + " | ".join(f"{l:.3f}" for _, l in pts) + f" | {low[1]:.3f} ({low[0]}) |")
        lines.append("")
    lines += [f"Command: `{m['command']}`  ", "Plot: docs/output_error.png."]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for i, corpus in enumerate(res["corpora"]):
        for v, ls in (("v1", "--"), ("v2", "-")):
            pts = corpus[v]["points"][1:]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=f"C{i}",
                    label=f"{corpus['name']}, version {v[1]}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.set_title("The char model on long runs: the output error rounded (v1) and zero-sum (v2)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_section(text: str) -> None:
    doc = ROOT / "docs" / "BENCHMARKS.md"
    src = doc.read_text()
    start, end = "<!-- bench:output-error -->", "<!-- /bench:output-error -->"
    block = f"{start}\n{text}\n{end}"
    if start in src:
        src = src[:src.index(start)] + block + src[src.index(end) + len(end):]
    else:
        src = src.rstrip("\n") + f"\n\n## The output error: the text model on long runs (bench/output_error.py)\n\n{block}\n"
    doc.write_text(src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--val", type=int, default=2048)
    ap.add_argument("--data", action="append", default=None,
                    help="text files (default: three licence texts ~87 kB, and every licence text ~300 kB)")
    ap.add_argument("--out", default=None, help="also write the raw results (JSON) here")
    ap.add_argument("--report", default=None, help="only rewrite the report and plot from an --out file")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.report:
        res = json.loads(Path(args.report).read_text())
    else:
        with version(1):
            v1_golden = golden_text_hash()
        want = json.loads((ROOT / "daisychain" / "golden" / "step_text.json").read_text())["run"]["params_sha256"]
        if golden_text_hash() != want:
            sys.exit("output_error: the committed golden text hash is not this engine's")
        if v1_golden != V1_GOLDEN_TEXT:
            sys.exit(f"output_error: the identity patch gives {v1_golden}, not version 1's golden hash")
        files = [Path(d) for d in args.data] if args.data else [default_text(), all_licences()]
        names = args.data or ["GPL-3 + LGPL-2.1 + MPL-1.1", "every text in /usr/share/common-licenses"]
        res = {"v1_golden": v1_golden, "corpora": [],
               "meta": {"batch": args.batch, "val": args.val, "every": args.every, "cpus": os.cpu_count(),
                        "command": ".venv/bin/python -m bench.output_error " + " ".join(sys.argv[1:])}}
        for f, name in zip(files, names):
            raw = f.read_bytes()
            c = {"name": name, "bytes": len(raw), "sha": hashlib.sha256(raw).hexdigest()}
            for v in (1, 2):
                with version(v):
                    c[f"v{v}"] = run(f, args.steps, args.every, args.batch, args.val, f"{name[:20]} v{v}")
            res["corpora"].append(c)
    if args.out:
        Path(args.out).write_text(json.dumps(res))
    text = report(res)
    print(text)
    if not args.no_write:
        write_section(text)
        plot(res, ROOT / "docs" / "output_error.png")


if __name__ == "__main__":
    main()
