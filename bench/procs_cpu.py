"""What a share costs in CPU when both cores compute (issue 33, ``--threads 2``): one image-task
trainer on 2 processes (engine/procs.py); in alternating rounds, a step's 4 micro-batches
split (this process's 2 and its worker's 2 at the same time: the CPU seconds of each), a
share of 2 alone in this process, and all 4 alone. On free cores the split shares cost what
the lone share does; more CPU when they run together is what the cores lose to each other
(caches, memory, other work on a shared machine), apart from the GIL and the hand-off.

Run: ``python -m bench.procs_cpu [ROUNDS]``. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from bench._proc import pid_cpu_s
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

CALLS = 100


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", "image"]))
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts(), threads=2)
    tr.threads.min_share_s = 0
    ids = np.arange(rs.hp.n_micro)
    tr.contribute(ids)
    tr.threads.wait_ready()
    w, eng = tr.threads._workers[0], tr.engine
    x, y = tr.inputs(0, ids)
    theta, fb, lim, h = tr.theta, rs.hp.grad_frac_bits, tr.limit, len(ids) // 2
    got: dict[str, list[float]] = {"this process's share, split": [], "the worker's share, split": [],
                                   "a share alone": [], "all 4 alone": []}
    for _ in range(rounds):
        c, wc = time.process_time(), pid_cpu_s(w.proc.pid)
        for _ in range(CALLS):
            w.send(theta, x[h:], y[h:], fb, lim)
            eng.grad(theta, x[:h], y[:h], fb, lim)
            w.result(60)
        got["this process's share, split"].append(time.process_time() - c)
        got["the worker's share, split"].append(pid_cpu_s(w.proc.pid) - wc)
        for name, n in (("a share alone", h), ("all 4 alone", len(ids))):
            c = time.process_time()
            for _ in range(CALLS):
                eng.grad(theta, x[:n], y[:n], fb, lim)
            got[name].append(time.process_time() - c)
    tr.threads.close()
    print(f"CPU ms a call, least of {rounds} alternating rounds of {CALLS} (load average "
          f"{os.getloadavg()[0]:.1f}): " + ", ".join(f"{k} {min(v) / CALLS * 1e3:.2f}" for k, v in got.items()))


if __name__ == "__main__":
    main()
