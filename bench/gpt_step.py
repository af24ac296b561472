"""One training step of the transformer (issue 37: 2 blocks, width 64, 4 heads, context 32,
batch 64 = 4 micro-batches of 16) in the INT8 engine against torch float32, both on one
thread, interleaved in one run.

    OPENBLAS_NUM_THREADS=1 python bench/gpt_step.py [--data TEXT] [--steps 10]

Prints the median milliseconds a step of each, wall-clock and process CPU time (every
library on one thread: on a loaded machine the CPU time is the steadier measure), and the
ratio torch / engine (above 1: the engine is faster), and the engine on its numpy rules (``attn_ops = None``, the reference
route: the same bits as the compiled rules of engine/attnfast.py). The engine step is ``contribute`` of all micro-batches + ``apply``; the
torch step is forward, backward and Adam on the same samples (all positions, as the engine).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.floatref import float_model
from daisychain.engine.model import seq_targets
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="a text file (default: the embedded text)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", default="block64h4,block64h4")
    p.add_argument("--context", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    ds = prepare_task("text", args.data, context=args.context)
    spec = model_for(ds, tuple(args.layers.split(",")))
    tr = Trainer(spec, Hyper(seed=0), ds, load_luts())
    model = float_model(spec, tr.theta)
    opt = torch.optim.Adam(model.parameters(), lr=tr.hp.lr)
    T = args.context

    def engine_step():
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)

    def torch_step():
        x, y = tr.inputs(tr.state.step, range(tr.hp.n_micro))
        out = model(torch.tensor(x.reshape(-1, T)))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                 torch.tensor(seq_targets(x, y).reshape(-1)))
        opt.zero_grad()
        loss.backward()
        opt.step()

    ds8 = prepare_task("text", args.data)  # today's default: the char window, context 8
    base = Trainer(model_for(ds8), Hyper(seed=0), ds8, load_luts())

    def default_step():
        base.apply(base.contribute(range(base.hp.n_micro)).grad)

    ref = Trainer(spec, Hyper(seed=0), ds, load_luts())
    ref.engine.attn_ops = None

    def numpy_step():
        ref.apply(ref.contribute(range(ref.hp.n_micro)).grad)

    engine_step(), torch_step(), default_step(), numpy_step()  # warm-up (and numba's load)
    fns = (engine_step, torch_step, default_step, numpy_step)
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for _ in range(args.steps):
        for fn, w, c in zip(fns, wall, cpu):
            t, tc = time.perf_counter(), time.process_time()
            fn()
            c.append(time.process_time() - tc)
            w.append(time.perf_counter() - t)
    assert tr.params_sha256() == ref.params_sha256(), "the compiled and numpy rules disagree"
    for what, v in (("wall", wall), ("CPU", cpu)):  # CPU time: what a loaded machine distorts least
        e, f, d, r = (float(np.median(x)) for x in v)
        print(f"{what}: {args.layers} context {T}, {tr.layout.size:,} parameters: engine {e * 1e3:.1f} ms/step, "
              f"torch float32 (1 thread) {f * 1e3:.1f} ms/step, torch/engine = {f / e:.2f}x; "
              f"engine on its numpy rules {r * 1e3:.1f} ms/step ({r / e:.1f}x slower); "
              f"today's char-window default (engine) {d * 1e3:.1f} ms/step, {e / d:.0f}x faster")


if __name__ == "__main__":
    main()
