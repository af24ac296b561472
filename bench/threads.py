"""``daisychain train --threads 2`` against ``--threads 1`` (issue 33): the same run (the image
task's defaults, the default CNN, and the digits MLP) alternately on 1 and 2 threads, each a
fresh process, best of the rounds; the hash must be the same on both.

Run: ``python -m bench.threads [--steps N] [--rounds R]`` (writes the "threads" section of
docs/BENCHMARKS.md). The ratio is micro-batches/s on 2 threads over 1, measured interleaved
in one run; on a machine other processes share, it is what the cores had left.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

from tqdm import tqdm

from bench._report import write_section
from daisychain.engine.threads import cores

RUNS = {"image": ["--task", "image"], "digits": ["--task", "digits"]}


def _run(argv: list[str], threads: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--json", "--quiet", *argv,
                        "--threads", str(threads)], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = []
    bar = tqdm(total=len(RUNS) * a.rounds * 2, desc="bench threads", unit="run")
    for name, argv in RUNS.items():
        argv = [*argv, "--steps", str(a.steps)]
        best = {1: None, 2: None}
        for _ in range(a.rounds):
            for n in (1, 2):
                got = _run(argv, n)
                if best[n] is None or got["micro_batches_per_s"] > best[n]["micro_batches_per_s"]:
                    best[n] = got
                bar.update(1)
        one, two = best[1], best[2]
        rows.append(f"| `train {' '.join(argv)}` | {one['micro_batches_per_s']:.1f} (1.00x) | "
                    f"{two['micro_batches_per_s']:.1f} ({two['micro_batches_per_s'] / one['micro_batches_per_s']:.2f}x) | "
                    f"{'yes' if one['params_sha256'] == two['params_sha256'] else 'NO'} |")
    bar.close()
    body = "\n".join([
        f"This machine has {cores()} cores. Micro-batches/s of the whole run (start-up excluded), the best "
        f"of {a.rounds} alternating rounds, each a fresh process; baseline (1.00) `--threads 1` in the same run.",
        "",
        "| run | `--threads 1` micro-batches/s | `--threads 2` | same params-sha256 |",
        "|---|---|---|---|",
        *rows])
    print(body)
    write_section("threads", "## `--threads`: a step's micro-batches on several cores (Python)\n\n" + body,
                  f"python -m bench.threads --steps {a.steps} --rounds {a.rounds}")


if __name__ == "__main__":
    main()
