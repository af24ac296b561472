"""The single-process reference trainer: trains through the INT8 units and prints the test
accuracy, the loss and ``params-sha256: <hex>``, the hash every peer of the same run prints.

``--workers K --assign ...`` simulates K peers in this one process (each computes only its
own micro-batches; their integer sums are added in a shuffled order): the hash must not
change. ``--float`` trains the same model in plain float32 (torch), for accuracy only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from tqdm import tqdm

from daisychain.engine.settings import USER_ERRORS, add_run_arguments, setting_type, settings_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.add_argument("--workers", type=setting_type("workers"), default=1, help="simulated peers (default 1)")
    p.add_argument("--assign", default="round-robin", choices=["round-robin", "random", "capacity"],
                   help="how micro-batches are assigned to the simulated peers")
    p.add_argument("--gemm", default="fast", choices=["fast", "lut"],
                   help="unit GEMM: exact BLAS (fast) or every product from the table (lut)")
    p.add_argument("--float", action="store_true", dest="float_mode",
                   help="plain float32 torch training of the same model (accuracy comparison)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        rs = settings_from_args(args)
        if args.workers < 1:
            raise ValueError("--workers must be >= 1")
    except (*USER_ERRORS, ValueError) as exc:
        print(f"daisychain train: error: {exc}", file=sys.stderr)
        return 2
    if args.float_mode:
        from daisychain.engine.floatref import train_float

        out = train_float(rs, quiet=args.quiet or args.json)
        if args.json:
            print(json.dumps(out))
        else:
            print(f"float32 test accuracy: {out['accuracy'] * 100:.2f}%  loss: {out['loss']:.4f}")
        return 0
    out = train(rs, args.workers, args.assign, args.gemm, quiet=args.quiet or args.json)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"test accuracy: {out['accuracy'] * 100:.2f}%  loss: {out['loss']:.4f}  "
              f"({out['steps']} steps, {out['micro_batches_per_s']:.0f} micro-batches/s)")
        print(f"params-sha256: {out['params_sha256']}")
    return 0


def train(rs, workers: int = 1, how: str = "round-robin", gemm: str = "fast",
          quiet: bool = False) -> dict:
    from daisychain.engine.trainer import Trainer, assign
    from daisychain.units import load_luts

    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts(), gemm)
    order_rng = np.random.default_rng(rs.hp.seed + 1)  # only shuffles summation order
    loss = float("nan")
    t0 = time.perf_counter()
    with tqdm(total=rs.steps, desc="train", unit="step", disable=quiet, leave=False) as bar:
        for step in range(rs.steps):
            parts = assign(rs.hp.n_micro, workers, how, step, rs.hp.seed)
            results = [tr.contribute(p) for p in parts]
            total = np.zeros(tr.layout.size, np.int64)
            for k in order_rng.permutation(len(results)):
                total += results[k].grad
            tr.apply(total)
            loss = float(np.mean(np.concatenate([r.loss for r in results])))
            bar.update(1)
            if step % 20 == 0:
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    elapsed = time.perf_counter() - t0
    return {"task": rs.ds.task, "steps": rs.steps, "seed": rs.hp.seed,
            "accuracy": tr.accuracy("test"), "loss": loss,
            "params_sha256": tr.params_sha256(), "run_id": tr.run_id,
            "dataset_fingerprint": rs.ds.fingerprint, "manifest_sha256": tr.luts.manifest_sha256,
            "workers": workers, "assign": how, "gemm": gemm,
            "micro_batches_per_s": rs.steps * rs.hp.n_micro / elapsed if elapsed > 0 else 0.0,
            "identity": tr.identity}
