"""The outer step's defaults, measured: validation (test split) loss of local-steps runs
(``--replicas R --sync-every H``) with several (outer lr, outer momentum) pairs, and of the
synchronous run, at equal samples; or, with ``--to-target N``, the rounds (and samples per
replica) each pair needs to reach the validation loss the synchronous run at ``--target-batch``
reaches after N steps. Prints a markdown table.

    python -m bench.local_sweep --task text --replicas 4 --sync-every 8 --rounds 20
    python -m bench.local_sweep --task text --batch 32 --replicas 2 --sync-every 32 --to-target 600
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from daisychain.engine.local import make_trainer
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.units import load_luts

PAIRS = ((1.0, 0.0), (0.7, 0.9), (1.0, 0.9), (0.5, 0.9), (1.0, 0.5), (0.7, 0.5), (0.8, 0.7), (1.2, 0.5))


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
    p.add_argument("--to-target", type=int, default=0, metavar="N",
                   help="rounds to the loss of the synchronous run at --target-batch after N steps")
    p.add_argument("--target-batch", type=int, default=64)
    p.add_argument("--val", type=int, default=2048, help="validation samples (--to-target)")
    p.add_argument("--max-samples", type=int, default=400_000, help="per row (--to-target)")
    args = p.parse_args(argv)
    rs = settings_from_args(args)
    if args.to_target:
        return to_target(rs, args)
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


def to_target(rs, args) -> None:
    """Rounds to a target validation loss (bench/local_steps.py's curves) per outer pair."""
    from bench.local_steps import Run, curve

    r, h, b = rs.hp.replicas, rs.hp.sync_every, rs.hp.batch
    base = Run(f"sync, batch {args.target_batch}", args.target_batch)
    sync = dataclasses.replace(rs, hp=dataclasses.replace(rs.hp, replicas=1, sync_every=1, batch=args.target_batch))
    target = curve(sync, base, None, args.to_target * base.batch, args.val, every=args.to_target)["points"][-1][2]
    print(f"task {rs.ds.task}, lr {rs.hp.lr}; target: val loss {target:.4f} (first {args.val} test samples), "
          f"what {base.name} reaches after {args.to_target} steps ({args.to_target * base.batch:,} samples)\n")
    print("| run | outer lr | outer momentum | rounds to target | samples per replica | all samples | s |\n"
          "|---|---|---|---|---|---|---|")
    for lr, mu in PAIRS:
        hp = dataclasses.replace(rs.hp, outer_lr=lr, outer_momentum=mu)
        c = curve(dataclasses.replace(rs, hp=hp), Run("", b, r, h), target, args.max_samples, args.val)
        k = c["rounds_to_target"]
        cells = f"{k} | {k * h * b:,} | {k * h * b * r:,}" if k else f"not reached | - | > {args.max_samples:,}"
        print(f"| R={r} H={h}, batch {b} | {lr} | {mu} | {cells} | {c['cpu_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
