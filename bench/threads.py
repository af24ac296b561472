"""``--threads 2`` against ``--threads 1`` (issue 33): the trainer of ``daisychain train`` on
the image task (its defaults: the default CNN, batch 64 = 4 micro-batches of 16) and on
digits, on 1 and on 2 threads, in one process: warm-up steps first (the numba caches, each
thread's engine), then alternating rounds of steps, best round of each; the parameters must
end the same.

Run: ``python -m bench.threads [--steps N] [--rounds R]`` (writes the "threads" section of
docs/BENCHMARKS.md). The ratio is steps/s on 2 threads over 1, measured interleaved in one
run; on a machine other processes share, it is what the cores had left.
"""

from __future__ import annotations

import os
import argparse
import time

from tqdm import tqdm

from bench._report import write_section
from daisychain.engine.data import prepare_task
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.threads import cores
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

TASKS = ("image", "digits")
WARM = 5


def _trainers(task: str) -> tuple[Trainer, Trainer, str]:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", task]))
    luts = load_luts()
    return (Trainer(rs.spec, rs.hp, rs.ds, luts, threads=1), Trainer(rs.spec, rs.hp, rs.ds, luts, threads=2),
            f"{task}: batch {rs.hp.batch} = {rs.hp.n_micro} micro-batches of {rs.hp.micro_batch}")


def _steps(tr: Trainer, n: int) -> float:
    ids = list(range(tr.hp.n_micro))
    t0 = time.perf_counter()
    for _ in range(n):
        tr.apply(tr.contribute(ids).grad)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="steps per round")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    rows = []
    bar = tqdm(total=len(TASKS) * a.rounds * 2, desc="bench threads", unit="round")
    for task in TASKS:
        one, two, name = _trainers(task)
        _steps(one, WARM)
        _steps(two, WARM)
        best = {1: 0.0, 2: 0.0}
        for _ in range(a.rounds):
            for n, tr in ((1, one), (2, two)):
                best[n] = max(best[n], _steps(tr, a.steps))
                bar.update(1)
        same = one.params_sha256() == two.params_sha256() and one.state.step == two.state.step
        rows.append(f"| {name} | {best[1]:.1f} (1.00x) | {best[2]:.1f} ({best[2] / best[1]:.2f}x) | "
                    f"{'yes' if same else 'NO'} |")
    bar.close()
    body = "\n".join([
        f"This machine has {cores()} cores (load average {os.getloadavg()[0]:.1f} at the end of the run), "
        f"shared with other work while this ran. Steps/s of the trainer "
        f"`daisychain train` runs (`Trainer(threads=N)`), after {WARM} warm-up steps, the best of {a.rounds} "
        f"alternating rounds of {a.steps} steps; baseline (1.00) one thread in the same run.",
        "",
        "| run | `--threads 1` steps/s | `--threads 2` | same params-sha256 after the same steps |",
        "|---|---|---|---|",
        *rows])
    print(body)
    write_section("threads", "## `--threads`: a step's micro-batches on several cores (Python)\n\n" + body,
                  f"python -m bench.threads --steps {a.steps} --rounds {a.rounds}")


if __name__ == "__main__":
    main()
