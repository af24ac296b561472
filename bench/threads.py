"""``--threads 2`` against ``--threads 1`` (issue 33): the trainer of ``daisychain train`` on
the image task (its defaults: the default CNN, batch 64 = 4 micro-batches of 16) and on
digits, in one process: ``--threads 1``; ``--threads 2`` as it runs (a split call's shares
in this process and one worker process, engine/procs.py); and, for the image task, the two
other ways measured beside it: 2 worker processes computing every share (the caller only
hands out and sums) and 2 threads of this process (stop 44's path). Warm-up steps first (the
numba caches, each engine, the worker processes started and ready), then alternating rounds
of steps, best round of each; the parameters must end the same.

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
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.threads import cores
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

TASKS = ("image", "digits")
WARM = 5


#: (column, ThreadedGrad settings) of the image task's 2-way runs; digits runs the first only
WAYS = (("--threads 2", {}), ("2 workers, caller hands out", {"parent_computes": False}),
        ("2 threads (stop 44)", {"mode": "threads"}))


def _trainers(task: str) -> tuple[list[Trainer], str]:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", task]))
    luts = load_luts()
    out = [Trainer(rs.spec, rs.hp, rs.ds, luts, threads=1)]
    for _, kw in WAYS[:1 if task == "digits" else None]:
        tr = Trainer(rs.spec, rs.hp, rs.ds, luts, threads=2)
        for k, v in kw.items():
            setattr(tr.threads, k, v)
        out.append(tr)
    return out, f"{task}: batch {rs.hp.batch} = {rs.hp.n_micro} micro-batches of {rs.hp.micro_batch}"


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
    load0 = os.getloadavg()[0]
    bar = tqdm(total=a.rounds * (2 + len(WAYS) + 1), desc="bench threads", unit="round")
    for task in TASKS:
        trs, name = _trainers(task)
        for tr in trs:
            _steps(tr, WARM)
            tr.threads.wait_ready()  # the worker processes, where the split rule started them
            _steps(tr, WARM)
        best = [0.0] * len(trs)
        for _ in range(a.rounds):
            for i, tr in enumerate(trs):
                best[i] = max(best[i], _steps(tr, a.steps))
                bar.update(1)
        same = all(tr.params_sha256() == trs[0].params_sha256() and tr.state.step == trs[0].state.step
                   for tr in trs)
        cells = [f"{b:.1f} ({b / best[0]:.2f}x)" for b in best] + ["n/a"] * (1 + len(WAYS) - len(trs))
        used = "/".join(f"{tr.threads.most_used}:{tr.threads.most_procs}" for tr in trs[1:])
        rows.append(f"| {name} | {' | '.join(cells)} | {used} | {'yes' if same else 'NO'} |")
        for tr in trs:
            tr.threads.close()
    bar.close()
    body = "\n".join([
        f"This machine has {cores()} cores (load average {load0:.1f} at the start of the run, "
        f"{os.getloadavg()[0]:.1f} at the end), shared with other work while this ran. Steps/s of the "
        f"trainer `daisychain train` runs (`Trainer(threads=N)`), after {WARM} warm-up steps, the worker "
        f"processes ready and {WARM} more, the best of {a.rounds} alternating rounds of {a.steps} steps; "
        f"baseline (1.00) `--threads 1` in the same run. \"shares\": the most shares a step was split into, "
        f"and how many of them worker processes computed.",
        "",
        "| run | `--threads 1` steps/s | " + " | ".join(f"{c}" for c, _ in WAYS)
        + " | shares : of them in worker processes | same params-sha256 after the same steps |",
        "|---|---|" + "---|" * len(WAYS) + "---|---|",
        *rows])
    print(body)
    write_section("threads", "## `--threads`: a step's micro-batches on several cores (Python)\n\n" + body,
                  f"python -m bench.threads --steps {a.steps} --rounds {a.rounds}")


if __name__ == "__main__":
    main()
