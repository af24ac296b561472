"""Engine speed: micro-batches/s of the INT8 engine against torch float32 training the same
MLP on the same batches, one thread, in one run; peak memory.

The baseline is a plain ``torch.nn.Sequential`` of ``nn.Linear`` / ``nn.ReLU`` with
``torch.optim.Adam`` (same initial parameters, lr, betas, eps), one forward/backward/step
per global batch of 64, inputs already tensors. The INT8 engine does what a replica does:
``Trainer.contribute`` (all 4 micro-batches of 16, including gathering the samples) and
``Trainer.apply`` (fixed-point total -> Adam), with the compiled kernels loaded at the start
(``fast.load_compiled``: a long run switches to them by itself). Runs alternate (torch,
INT8, torch, ...) so both see the same machine conditions; each figure is the best of the
rounds, in CPU time of this process.

Run: ``python -m bench.train`` (writes the "train" section of docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._report import write_section  # noqa: E402
from daisychain.engine import adam as adam_mod, fast  # noqa: E402
from daisychain.engine.data import prepare_task  # noqa: E402
from daisychain.engine.model import ParamLayout, init_params  # noqa: E402
from daisychain.engine.spec import Hyper, mlp  # noqa: E402
from daisychain.engine.trainer import Trainer  # noqa: E402
from daisychain.units import load_luts  # noqa: E402

MODELS = [("64-128-10", mlp(64, 128, 10)), ("64-256-10", mlp(64, 256, 10)),
          ("64-256-256-10", mlp(64, 256, 10, depth=2))]


def torch_model(spec, theta):
    """nn.Sequential of nn.Linear / nn.ReLU holding the engine's initial parameters."""
    mods, views = [], iter(ParamLayout(spec).views(theta))
    for layer in spec.layers:
        if layer.type == "linear":
            lin = torch.nn.Linear(layer.n_in, layer.n_out)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(next(views)))
                lin.bias.copy_(torch.from_numpy(next(views)))
            mods.append(lin)
        else:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


class TorchRun:
    def __init__(self, ds, spec, hp, steps):
        self.model = torch_model(spec, init_params(spec, hp.seed))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=hp.lr, betas=(hp.beta1, hp.beta2),
                                    eps=hp.eps)
        sched = Trainer(spec, hp, ds, load_luts()).schedule
        idx = [sched.step_samples(s).ravel() for s in range(steps)]
        self.xs = [torch.tensor(ds.x_train[i], dtype=torch.float32) for i in idx]
        self.ys = [torch.tensor(ds.y_train[i], dtype=torch.long) for i in idx]

    def step(self, k):
        loss = torch.nn.functional.cross_entropy(self.model(self.xs[k]), self.ys[k])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def timed(self, steps) -> float:
        t = time.process_time()
        for k in range(steps):
            self.step(k)
        return time.process_time() - t


class Int8Run:
    def __init__(self, ds, spec, hp):
        self.tr = Trainer(spec, hp, ds, load_luts())
        self.ids = list(range(hp.n_micro))

    def step(self):
        self.tr.apply(self.tr.contribute(self.ids).grad)

    def timed(self, steps) -> float:
        t = time.process_time()
        for _ in range(steps):
            self.step()
        return time.process_time() - t

    def timed_parts(self, steps) -> tuple[float, float]:
        """CPU seconds in contribute and in apply, timed apart."""
        c = a = 0.0
        for _ in range(steps):
            t0 = time.process_time()
            res = self.tr.contribute(self.ids)
            t1 = time.process_time()
            self.tr.apply(res.grad)
            c, a = c + t1 - t0, a + time.process_time() - t1
        return c, a


def same_bits_as_literal(ds, spec, hp, steps=3) -> bool:
    """The fast engine and the literal one (every product, requantize and ReLU read from
    its table) end on the same params-sha256."""
    a, b = (Trainer(spec, hp, ds, load_luts(), gemm=g) for g in ("fast", "lut"))
    for t in (a, b):
        for _ in range(steps):
            t.apply(t.contribute(list(range(hp.n_micro))).grad)
    return a.params_sha256() == b.params_sha256()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps per timed run")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (best of)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    compiled = fast.load_compiled()
    ds = prepare_task("digits")
    hp = Hyper()
    rows = []
    for name, spec in tqdm(MODELS, desc="bench train"):
        trun, irun = TorchRun(ds, spec, hp, args.steps), Int8Run(ds, spec, hp)
        for _ in range(10):  # warm-up
            trun.step(0)
            irun.step()
        t_best = i_best = float("inf")
        ratios, parts = [], []
        for _ in range(args.rounds):
            t = trun.timed(args.steps)
            i = irun.timed(args.steps)
            t_best, i_best = min(t_best, t), min(i_best, i)
            ratios.append(t / i)
            parts.append(irun.timed_parts(args.steps))
        c_best, a_best = min(p[0] for p in parts), min(p[1] for p in parts)
        tracemalloc.start()  # memory in a separate short run: tracing slows everything down
        for _ in range(10):
            irun.step()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        mb = args.steps * hp.n_micro
        rows.append((name, mb / t_best, mb / i_best, sorted(ratios), peak / 2**20,
                     same_bits_as_literal(ds, spec, hp), c_best / args.steps, a_best / args.steps))
    fused = adam_mod._fused_kernel() is not None
    lines = ["## Engine: INT8 micro-batch rate vs torch float32 (digits)", "",
             f"Batch {hp.batch} = {hp.n_micro} micro-batches of {hp.micro_batch}, {args.steps} steps "
             f"per run, one thread (torch.set_num_threads(1), OPENBLAS/OMP/MKL_NUM_THREADS=1), "
             f"{args.rounds} alternating rounds (torch, INT8, torch, ...), best of each, CPU time "
             "of this process. Baseline: nn.Sequential(nn.Linear, nn.ReLU, ...) + "
             "torch.optim.Adam, one forward/backward/step per batch of 64. INT8 engine: "
             f"compiled kernels {'loaded' if compiled else 'NOT available (numpy passes)'}, "
             f"Adam {'fused (one compiled pass)' if fused else 'numpy passes'}.", "",
             "| model | torch float32 (baseline) | INT8 engine | ratio (best/best) | "
             "ratio per round, min / median / max | INT8 contribute / apply per step | "
             "INT8 peak traced memory | same bits as the literal-table engine |",
             "|---|---|---|---|---|---|---|---|"]
    for name, t, i, rs, mem, same, c, a in rows:
        lines.append(f"| {name} | {t:,.0f} micro-batches/s | {i:,.0f} micro-batches/s | "
                     f"{i / t:.2f} | {rs[0]:.2f} / {rs[len(rs) // 2]:.2f} / {rs[-1]:.2f} | "
                     f"{c * 1e6:,.0f} / {a * 1e6:,.0f} us | "
                     f"{mem:.1f} MiB | {'yes' if same else 'NO'} |")
    lines += ["", "Goal: ratio >= 1.0 (match or beat float32 torch on one thread). The machine "
              "is shared with other work, so absolute rates vary between runs; the per-round "
              "ratios show the spread.", "",
              "Contribute is forward + backward of the step's micro-batches: every GEMM one float32 "
              "BLAS call over all micro-batches' rows (exact: integer operands, K * 127^2 < 2^24, "
              "the weight gradients folded over micro-batches with each one's power-of-two scale "
              "when a bound on every partial sum stays below 2^24, float64 below 2^53), and one "
              "compiled loop (numba, no fastmath) for each pass between them: quantize, bias + "
              "rounding shift in integers, softmax and output error, fixed-point bias and weight "
              "gradients, ReLU mask + requantize. Apply is the mean gradient and Adam"
              f"{' (one compiled pass)' if fused else ''}. Same bits as the numpy passes and the "
              "literal-table engine (tests/engine/test_engine_fast.py). Peak traced memory is what "
              "tracemalloc sees (numpy's and Python's allocations, not numba's small scratch "
              "arrays)."]
    text = "\n".join(lines)
    if not args.no_write:
        write_section("train", text, "python -m bench.train")
    print(text)


if __name__ == "__main__":
    main()
