"""Test accuracy of ``--task image`` runs: the INT8 engine (``daisychain train``) and torch
float32 (``train --float``) on the same settings, several runs at once, one thread each.

    python bench/image_recipe.py --jobs 8 --mode both -- "" "--lr 0.01" "--steps 6000"
    python bench/image_recipe.py --make-fashion /tmp/f.npz -- "--data /tmp/f.npz"

Each positional argument is one run's extra ``daisychain train`` flags (after ``--task
image``; quote each). Prints one JSON line per run (``mode``, ``flags``, ``accuracy``,
``seconds`` of wall time, ``cpu_seconds`` of this process's CPU time, and the engine's
``params_sha256``) and, with ``--out``, writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one(mode: str, flags: str) -> dict:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    import torch

    torch.set_num_threads(1)
    from daisychain.engine.cli import train
    from daisychain.engine.settings import add_run_arguments, settings_from_args

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", "image", *shlex.split(flags)]))
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "float":
        from daisychain.engine.floatref import train_float

        out = train_float(rs, quiet=True)
    else:
        out = train(rs, quiet=True)
    return {"mode": mode, "flags": flags, "steps": rs.steps, "accuracy": out["accuracy"],
            "seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1),
            "params_sha256": out.get("params_sha256"), "hyper": rs.hp.to_json(),
            "layers": [l.type for l in rs.spec.layers]}


def fashion_like(path: Path, n_train: int = 6000, n_test: int = 1000, seed: int = 0) -> Path:
    """A Fashion-MNIST-shaped Keras .npz (28x28 grey uint8, 10 classes) of synthetic
    garments: each class a smooth random silhouette with a texture, pairs of classes sharing
    most of their shape (as shirt / T-shirt / pullover do); each sample scaled, shifted by up
    to 3 pixels and noised. Deterministic in ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def smooth(lo: np.ndarray) -> np.ndarray:  # 7x7 -> 28x28, blocky then box-blurred
        x = np.kron(lo, np.ones((4, 4)))
        for axis in (0, 1):
            x = (np.roll(x, 1, axis) + x + np.roll(x, -1, axis)) / 3
        return x

    bases = [smooth(rng.random((7, 7))) for _ in range(5)]
    protos = []
    for c in range(10):
        shape = bases[c // 2] + 0.35 * smooth(rng.random((7, 7)))
        mask = shape > np.quantile(shape, 0.45)
        texture = 0.6 + 0.4 * smooth(rng.random((7, 7)))
        protos.append(mask * texture)
    protos = np.stack(protos)

    def draw(n: int):
        y = rng.integers(0, 10, n)
        img = protos[y] * rng.uniform(0.6, 1.0, (n, 1, 1)) * 255
        dx, dy = rng.integers(-3, 4, n), rng.integers(-3, 4, n)
        img = np.stack([np.roll(np.roll(im, a, 1), b, 0) for im, a, b in zip(img, dx, dy)])
        img = img + rng.normal(0, 40, img.shape)
        return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.uint8)

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    np.savez_compressed(path, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--mode", choices=["engine", "float", "both"], default="both")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--make-fashion", type=Path, metavar="NPZ",
                    help="first write the synthetic Fashion-MNIST-shaped set (fashion_like) there")
    ap.add_argument("runs", nargs="*", default=[""])
    args = ap.parse_args(argv)
    if args.make_fashion:
        fashion_like(args.make_fashion)
    modes = ["engine", "float"] if args.mode == "both" else [args.mode]
    work = [(m, f) for f in args.runs for m in modes]
    lines = []
    with ProcessPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(one, m, f): (m, f) for m, f in work}
        for fut in as_completed(futs):
            try:
                res = fut.result()
            except Exception as exc:  # report and go on with the other runs
                res = {"mode": futs[fut][0], "flags": futs[fut][1], "error": repr(exc)}
            line = json.dumps(res)
            print(line, flush=True)
            lines.append(line)
            if args.out:
                args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
