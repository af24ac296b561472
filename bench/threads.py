"""``--threads 2`` against ``--threads 1`` (issue 33): the trainer of ``daisychain train`` on
the image task (its defaults: the default CNN, batch 64 = 4 micro-batches of 16) and on
digits, in one process: ``--threads 1``; ``--threads 2`` as it runs (a split call's shares
in this process and one worker process, engine/procs.py); and, for the image task, the two
other ways measured beside it: 2 worker processes computing every share (the caller only
hands out and sums) and 2 threads of this process (stop 44's path). Warm-up steps first (the
numba caches, each engine, the worker processes started and ready), then alternating rounds
of steps, best round of each; the parameters must end the same. ``--command-steps S`` adds
the command itself, ``daisychain train --task image --steps S --threads 1`` and ``2`` in
fresh processes, alternating (start-up and the worker's start included as a user meets them).

Run: ``python -m bench.threads [--steps N] [--rounds R] [--command-steps S]`` (writes the "threads" section of
docs/BENCHMARKS.md). The ratio is steps/s on 2 threads over 1, measured interleaved in one
run; on a machine other processes share, it is what the cores had left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from tqdm import tqdm

from bench._proc import pid_cpu_s
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


def _cpu(tr: Trainer) -> float:
    """CPU seconds of this process (all its threads) and of the trainer's worker processes."""
    return time.process_time() + sum(pid_cpu_s(w.proc.pid) for w in tr.threads._workers)


def _steps(tr: Trainer, n: int) -> tuple[float, float]:
    """(steps/s, CPU ms a step) of n steps."""
    ids = list(range(tr.hp.n_micro))
    c0, t0 = _cpu(tr), time.perf_counter()
    for _ in range(n):
        tr.apply(tr.contribute(ids).grad)
    return n / (time.perf_counter() - t0), (_cpu(tr) - c0) / n * 1000


def _command(n: int, steps: int) -> dict:
    """``daisychain train --task image --steps S --threads n --json`` as a user runs it."""
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--task", "image", "--steps", str(steps),
                        "--threads", str(n), "--json", "--quiet"], capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise SystemExit(f"bench.threads: train --threads {n} failed: {r.stderr[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _commands(steps: int, rounds: int, bar) -> list[str]:
    """Alternating runs of the command on 1 and 2 threads: micro-batches/s of its training
    loop (start-up and the final test excluded; the worker's start inside it), best of each."""
    best, hashes, procs = {1: 0.0, 2: 0.0}, set(), 0
    for _ in range(rounds):
        for n in (1, 2):
            out = _command(n, steps)
            best[n] = max(best[n], out["micro_batches_per_s"])
            hashes.add(out["params_sha256"])
            procs = max(procs, out["processes_used"]) if n == 2 else procs
            bar.update(1)
    return ["", f"The command as a user runs it, `daisychain train --task image --steps {steps} --threads N "
            f"--json` (a fresh process each run, the worker started inside the training loop on "
            f"`--threads 2`), {rounds} alternating runs of each, micro-batches/s "
            f"of the training loop, best of each:", "",
            "| run | `--threads 1` micro-batches/s | `--threads 2` | worker processes | same params-sha256 |",
            "|---|---|---|---|---|",
            f"| image, {steps} steps | {best[1]:.0f} (1.00x) | {best[2]:.0f} ({best[2] / best[1]:.2f}x) | {procs} | "
            f"{'yes' if len(hashes) == 1 else 'NO'} |"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="steps per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--command-steps", type=int, default=0,
                    help="also time `daisychain train --task image --steps N` on 1 and 2 threads (0: not)")
    a = ap.parse_args()
    rows = []
    load0 = os.getloadavg()[0]
    bar = tqdm(total=a.rounds * (2 + len(WAYS) + 1 + (2 if a.command_steps else 0)), desc="bench threads",
               unit="round")
    for task in TASKS:
        trs, name = _trainers(task)
        for tr in trs:
            _steps(tr, WARM)
            tr.threads.wait_ready()  # the worker processes, where the split rule started them
            _steps(tr, WARM)
        best, cpu = [0.0] * len(trs), [1e9] * len(trs)
        for _ in range(a.rounds):
            for i, tr in enumerate(trs):
                rate, ms = _steps(tr, a.steps)
                best[i], cpu[i] = max(best[i], rate), min(cpu[i], ms)
                bar.update(1)
        same = all(tr.params_sha256() == trs[0].params_sha256() and tr.state.step == trs[0].state.step
                   for tr in trs)
        cells = ([f"{b:.1f} ({b / best[0]:.2f}x); {c:.1f} ms" for b, c in zip(best, cpu)]
                 + ["n/a"] * (1 + len(WAYS) - len(trs)))
        used = "/".join(f"{tr.threads.most_used}:{tr.threads.most_procs}" for tr in trs[1:])
        rows.append(f"| {name} | {' | '.join(cells)} | {used} | {'yes' if same else 'NO'} |")
        for tr in trs:
            tr.threads.close()
    tail = _commands(a.command_steps, a.rounds, bar) if a.command_steps else []
    bar.close()
    body = "\n".join([
        f"This machine has {cores()} cores (load average {load0:.1f} at the start of the run, "
        f"{os.getloadavg()[0]:.1f} at the end), shared with other work while this ran. Steps/s of the "
        f"trainer `daisychain train` runs (`Trainer(threads=N)`), after {WARM} warm-up steps, the worker "
        f"processes ready and {WARM} more, the best of {a.rounds} alternating rounds of {a.steps} steps; "
        f"baseline (1.00) `--threads 1` in the same run; after the `;` the least CPU time a step took in a "
        f"round (this process's threads and its worker processes together: on a loaded machine the figure "
        f"that still compares; a split adds what the hand-off costs). \"shares\": the most shares a step was "
        f"split into, and how many of them worker processes computed.",
        "",
        "| run | `--threads 1` steps/s | " + " | ".join(c if c.startswith("2") else f"`{c}`" for c, _ in WAYS)
        + " | shares : of them in worker processes | same params-sha256 after the same steps |",
        "|---|---|" + "---|" * len(WAYS) + "---|---|",
        *rows, *tail])
    print(body)
    write_section("threads", "## `--threads`: a step's micro-batches on several cores (Python)\n\n" + body,
                  f"python -m bench.threads --steps {a.steps} --rounds {a.rounds}"
                  + (f" --command-steps {a.command_steps}" if a.command_steps else ""))


if __name__ == "__main__":
    main()
