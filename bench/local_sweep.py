"""The outer step's defaults, measured: validation (test split) loss of local-steps runs
(``--replicas R --sync-every H``) with several (outer lr, outer momentum) pairs, and of the
synchronous run, at equal samples. Prints a markdown table.

    python -m bench.local_sweep --task text --replicas 4 --sync-every 8 --rounds 20
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from daisychain.engine.local import make_trainer
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.units import load_luts

PAIRS = ((1.0, 0.0), (0.7, 0.9), (1.0, 0.9), (0.5, 0.9), (1.0, 0.5), (0.7, 0.5))


def val_loss(tr) -> float:
    """Mean cross-entropy over the test split (display arithmetic: library log)."""
    ds, eng, mb = tr.ds, tr.engine, tr.hp.micro_batch
    total, n = 0.0, 0
    for i in range(0, len(ds.y_test), mb):
        x, y = ds.x_test[i:i + mb], ds.y_test[i:i + mb]
        z, _ = eng.forward(tr.theta, x[None])
        p = eng.softmax(z)[0]
        total += float(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)).sum())
        n += len(y)
    return total / max(n, 1)


def run(rs, hp, steps: int) -> tuple[float, float, float]:
    tr = make_trainer(rs.spec, hp, rs.ds, load_luts())
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.apply(tr.contribute(list(range(tr.n_tasks))).grad)
    return val_loss(tr), tr.accuracy("test"), time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_run_arguments(p)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    rs = settings_from_args(args)
    r, h = rs.hp.replicas, rs.hp.sync_every
    samples = args.rounds * r * h * rs.hp.batch
    print(f"task {rs.ds.task}, batch {rs.hp.batch}, lr {rs.hp.lr}, {samples} samples each row\n")
    print("| run | outer lr | outer momentum | val loss | test acc | s |\n|---|---|---|---|---|---|")
    sync = dataclasses.replace(rs.hp, replicas=1, sync_every=1)
    loss, acc, sec = run(rs, sync, args.rounds * r * h)
    print(f"| synchronous, {args.rounds * r * h} steps | - | - | {loss:.4f} | {acc * 100:.1f}% | {sec:.1f} |")
    for lr, mu in PAIRS:
        hp = dataclasses.replace(rs.hp, outer_lr=lr, outer_momentum=mu)
        loss, acc, sec = run(rs, hp, args.rounds)
        print(f"| R={r} H={h}, {args.rounds} rounds | {lr} | {mu} | {loss:.4f} | {acc * 100:.1f}% | {sec:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
