"""CNN step speed: the INT8 engine's training step against torch float32 training the same
convolutional model on the same batches, one thread, in one run.

The baseline is the registry's float twin (``torch.nn.Sequential`` of ``Conv2d`` / ``ReLU``
/ ``MaxPool2d`` / ``Flatten`` / ``Linear``, engine's initial parameters) with
``torch.optim.Adam``: forward, cross-entropy, backward, step per global batch, inputs already
tensors (float32 (B, C, H, W)). The INT8 engine does what a replica does: ``Trainer.contribute``
(all micro-batches of 16, gathering the samples) and ``Trainer.apply`` (fixed-point total ->
Adam), compiled kernels loaded at the start. Runs alternate (torch, INT8, ...) so both see
the same machine conditions; each figure is the best of the rounds, CPU time of this process.
Data: random uint8 28x28 images (the step's arithmetic does not depend on the pixels' values).

Run: ``python -m bench.cnn`` (writes the "cnn" section of docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._report import write_section  # noqa: E402
from daisychain.engine import fast  # noqa: E402
from daisychain.engine.data import Dataset  # noqa: E402
from daisychain.engine.floatref import float_model  # noqa: E402
from daisychain.engine.model import init_params  # noqa: E402
from daisychain.engine.spec import DEFAULT_CNN, Hyper, cnn, layers_text  # noqa: E402
from daisychain.engine.trainer import Trainer  # noqa: E402
from daisychain.units import load_luts  # noqa: E402


def dataset(n: int = 2048, shape=(1, 28, 28), seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, int(np.prod(shape)))).astype(np.uint8)
    y = rng.integers(0, 10, n).astype(np.int32)
    return Dataset("bench-image", x, y, x[:64], y[:64], 10, meta={"image_shape": list(shape)})


class TorchRun:
    def __init__(self, ds, spec, hp):
        self.model = float_model(spec, init_params(spec, hp.seed))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps)
        c, h, w = spec.image
        self.x = torch.tensor(ds.x_train.astype(np.float32) / 256.0).reshape(-1, c, h, w)
        self.y = torch.tensor(ds.y_train, dtype=torch.long)
        self.model = torch.nn.Sequential(*list(self.model.children())[1:])  # inputs are float already
        self.batch = hp.batch

    def steps(self, k: int, start: int = 0):
        for t in range(start, start + k):
            i = (t * self.batch) % (len(self.y) - self.batch)
            loss = torch.nn.functional.cross_entropy(self.model(self.x[i:i + self.batch]), self.y[i:i + self.batch])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


class EngineRun:
    def __init__(self, ds, spec, hp, luts):
        self.tr = Trainer(spec, hp, ds, luts)
        self.ids = list(range(hp.n_micro))

    def steps(self, k: int, start: int = 0):
        for _ in range(k):
            self.tr.apply(self.tr.contribute(self.ids).grad)


def _cpu(fn, k):
    t = time.process_time()
    fn(k)
    return (time.process_time() - t) / k


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cnn", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default=",".join(DEFAULT_CNN), help="the CNN (default: the image default)")
    p.add_argument("--batches", default="64,256", help="global batches (micro-batch 16)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="about this long per round and side")
    p.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    fast.load_compiled()
    luts = load_luts()
    ds = dataset()
    items = tuple(int(t) if t.isdigit() else t for t in args.layers.split(","))
    spec = cnn((1, 28, 28), items, 10)
    n_params = sum(int(np.prod(s)) for _, s in spec.param_shapes())
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        hp = Hyper(batch=batch, micro_batch=16, seed=1)
        runs = {"torch": TorchRun(ds, spec, hp), "int8": EngineRun(ds, spec, hp, luts)}
        k = {}
        for name, r in runs.items():  # warm-up and a step count that takes ~seconds
            r.steps(2)
            t = _cpu(r.steps, 2)
            k[name] = max(2, int(args.seconds / max(t, 1e-4)))
        best = {name: float("inf") for name in runs}
        for _ in range(args.rounds):
            for name, r in runs.items():
                best[name] = min(best[name], _cpu(r.steps, k[name]))
        ratio = best["torch"] / best["int8"]
        rows.append((batch, best["torch"] * 1e3, best["int8"] * 1e3, ratio))
        print(f"batch {batch}: torch float32 {best['torch'] * 1e3:.2f} ms/step, INT8 engine "
              f"{best['int8'] * 1e3:.2f} ms/step: {ratio:.2f}x", flush=True)
    body = (f"## CNN step: INT8 engine vs torch float32 (one thread)\n\n"
            f"Model `--layers {layers_text(spec)}` on 1x28x28 images ({n_params:,} parameters), "
            f"micro-batch 16; one training step (forward, backward, fixed-point total, Adam) "
            f"in CPU ms, best of {args.rounds} alternating rounds. Ratio = torch time / engine "
            f"time (above 1: the engine is faster).\n\n"
            "| global batch | torch float32 ms/step | INT8 engine ms/step | ratio |\n|---|---|---|---|\n"
            + "".join(f"| {b} | {t:.2f} | {e:.2f} | {r:.2f}x |\n" for b, t, e, r in rows)
            + "\nWhere the engine's step goes (cProfile, batch 64): the int8 GEMMs (`torch._int_mm`: "
            "forward, weight gradients per micro-batch, input errors) about a third; the compiled "
            "loops between them (backward requantize with the ReLU mask, the pool's backward "
            "scatter, im2col, col2im) most of the rest. torch runs `Conv2d` / `MaxPool2d` in "
            "float32 on one thread; the engine's products are int8 x int8 -> int32.\n")
    print(body)
    if not args.no_write:
        write_section("cnn", body, "python -m bench.cnn" + "".join(f" {a}" for a in (argv or sys.argv[1:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
