"""Engine speed: micro-batches/s of the INT8 engine against a torch float32 implementation of
the same MLP (same micro-batch schedule, same Adam), one thread, in one run; peak memory.

Run: ``python -m bench.train`` (writes the "train" section of docs/BENCHMARKS.md).
"""

from __future__ import annotations

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
from daisychain.engine.data import model_for, prepare_task  # noqa: E402
from daisychain.engine.floatref import FloatModel  # noqa: E402
from daisychain.engine.model import init_params  # noqa: E402
from daisychain.engine.spec import Hyper  # noqa: E402
from daisychain.engine.trainer import Trainer  # noqa: E402
from daisychain.units import load_luts  # noqa: E402

STEPS = 300


def int8_rate(ds, spec, hp) -> tuple[float, float]:
    tr = Trainer(spec, hp, ds, load_luts())
    ids = list(range(hp.n_micro))
    tr.apply(tr.contribute(ids).grad)  # warm-up
    t = time.process_time()
    for _ in range(STEPS):
        tr.apply(tr.contribute(ids).grad)
    dt = time.process_time() - t
    tracemalloc.start()  # memory in a separate short run: tracing slows everything down
    for _ in range(10):
        tr.apply(tr.contribute(ids).grad)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return STEPS * hp.n_micro / dt, peak / 2**20


def torch_rate(ds, spec, hp) -> float:
    model = FloatModel(spec, init_params(spec, hp.seed))
    opt = torch.optim.Adam(model.parameters(), lr=hp.lr)
    tr = Trainer(spec, hp, ds, load_luts())
    idx = [np.concatenate([tr.schedule.samples(s, j) for j in range(hp.n_micro)])
           for s in range(STEPS + 1)]
    xs = [torch.tensor(ds.x_train[i], dtype=torch.float32) for i in idx]
    ys = [torch.tensor(ds.y_train[i], dtype=torch.long) for i in idx]

    def step(k):
        loss = torch.nn.functional.cross_entropy(model(xs[k]), ys[k])
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(STEPS)
    t = time.process_time()
    for k in range(STEPS):
        step(k)
    return STEPS * hp.n_micro / (time.process_time() - t)


def main() -> None:
    torch.set_num_threads(1)
    ds = prepare_task("digits")
    hp = Hyper()
    rows = []
    for hidden in tqdm([128, 256], desc="bench train"):
        spec = model_for(ds, hidden)
        torch_runs, runs = [], []
        for _ in range(5):  # alternate, so both see the same machine conditions
            torch_runs.append(torch_rate(ds, spec, hp))
            runs.append(int8_rate(ds, spec, hp))
        best_t = max(torch_runs)
        best_i = max(r for r, _ in runs)
        rows.append((hidden, best_t, best_i, max(m for _, m in runs)))
    lines = ["## Engine: INT8 micro-batch rate vs torch float32 (digits MLP 64-H-10)", "",
             f"Batch {hp.batch} = {hp.n_micro} micro-batches of {hp.micro_batch}, {STEPS} steps, "
             "one thread, best of 5 alternating runs, CPU time of this process (robust to other load on the machine).", "",
             "| hidden | torch float32 (baseline) | INT8 engine | ratio | INT8 peak traced memory |",
             "|---|---|---|---|---|"]
    for hidden, t, i, mem in rows:
        lines.append(f"| {hidden} | {t:,.0f} micro-batches/s | {i:,.0f} micro-batches/s | "
                     f"{i / t:.2f} | {mem:.1f} MiB |")
    lines += ["", "Goal: ratio >= 1.0 (match or beat float32 torch on one thread)."]
    write_section("train", "\n".join(lines), "python -m bench.train")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
