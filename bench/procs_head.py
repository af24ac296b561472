"""The serial head of a ``--threads 2`` image step (stop 46): the caller's work from
``contribute()`` until the worker process has its message (the worker waits meanwhile), and
then the caller's work before its own grad, the way stop 45 did it (the whole step's inputs,
the ±2-pixel shifts by numpy's gather, the worker's x and y written into the mapping) against
this stop's (the worker sent the step and its micro-batch indices and making its own inputs;
the caller's own half's inputs, compiled shifts), interleaved step by step in one process;
the worker's answer is collected outside the timing.

Run: ``python -m bench.procs_head [--steps N]`` (prints; writes nothing).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from daisychain.engine import augment
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", "image"]))
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts(), threads=2)
    ids = np.arange(tr.hp.n_micro)
    half = len(ids) // 2
    for _ in range(4):
        tr.contribute(ids)
    tr.threads.wait_ready()
    tr.contribute(ids)
    w = tr.threads._workers[0]
    fb, lim = tr.hp.grad_frac_bits, tr.limit
    compiled = augment.shift_images

    def before(step):
        augment.shift_images = augment.shift_images_numpy
        try:
            t0 = time.perf_counter()
            x, y = tr.inputs(step, ids)
            w.send(tr.theta, x[half:], y[half:], fb, lim)
            t1 = time.perf_counter()
        finally:
            augment.shift_images = compiled
        w.result(600)
        return t1 - t0, t1 - t0

    def after(step):
        t0 = time.perf_counter()
        w.send_at(tr.theta, step, ids[half:], fb, lim)
        t1 = time.perf_counter()
        tr.inputs(step, ids[:half])
        t2 = time.perf_counter()
        w.result(600)
        return t1 - t0, t2 - t0

    load0 = os.getloadavg()[0]
    got = {"stop 45 (caller makes every input)": [], "stop 46 (worker makes its own)": []}
    for s in range(a.steps):
        for (name, v), f in zip(got.items(), (before, after)):
            v.append(f(s))
    print(f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {a.steps} steps each")
    for name, v in got.items():
        v = np.array(v) * 1e3
        print(f"{name}: head median {np.median(v[:, 0]):.3f} ms (min {v[:, 0].min():.3f}); "
              f"before its own grad median {np.median(v[:, 1]):.3f} ms")
    tr.threads.close()


if __name__ == "__main__":
    main()
