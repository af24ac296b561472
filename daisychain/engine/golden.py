"""Golden vectors for the full training step, for the browser engine to match.

``python -m daisychain.engine.golden`` rewrites ``daisychain/golden/step_<name>.json`` (one
per entry of ``TASKS``: each task with one hidden layer, and with two; two conv models on
digits made images, see ``image_digits``); a
test checks the committed files are current. Arrays are given by the SHA-256 of their
canonical bytes (float64 or int64 little-endian, row-major) and, where small, by value:
integers as numbers, floats as 16-hex-digit IEEE-754 bit patterns (big-endian text,
e.g. ``"3ff0000000000000"`` is 1.0), because JSON decimals lose -0 and need care.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from daisychain.engine import prng
from daisychain.engine.adam import adam_step
from daisychain.engine.data import Dataset, load_digits, model_for, prepare_task
from daisychain.engine.detmath import dexp
from daisychain.engine.model import init_params
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer, params_sha256
from daisychain.units import load_luts

DIR = Path(__file__).resolve().parent.parent / "golden"
RUN_STEPS = 20
#: golden step file name -> (task, hidden widths): one hidden layer per task, and a
#: 2-hidden-layer model of each task (``--layers 32,24``)
TASKS = {"digits": ("digits", 32), "text": ("text", 32),
         "digits_2layers": ("digits", (32, 24)), "text_2layers": ("text", (32, 24)),
         # conv models (docs/ENGINE.md "conv2d"): 1x8x8 and 3x8x8 images made from digits
         "image_conv": ("digits-image", ("conv4", "pool", "conv8k5", "pool")),
         "image_conv_rgb": ("digits-image-rgb", ("conv4", "pool", 12)),
         # the transformer (docs/ENGINE.md "The transformer"): width 16, 2 heads, context 8
         "text_gpt": ("text", ("block16h2", "block16h2"))}


def image_digits(channels: int = 1) -> Dataset:
    """The digits as uint8 images for the conv goldens (and tests): 1x8x8 with pixel =
    15 * intensity (0..240); with 3 channels, (15 * x, 15 * x transposed, 240 - 15 * x).
    The same samples and split as the digits task. Task "digits-image" / "digits-image-rgb"
    (a test server serves them with ``create_app(datasets=...)``)."""
    d = load_digits()

    def conv(x):
        x = (x * 15.0).astype(np.uint8).reshape(-1, 8, 8)
        if channels == 1:
            return x.reshape(len(x), 64)
        return np.stack([x, x.transpose(0, 2, 1), 240 - x], axis=1).reshape(len(x), 192)

    task = "digits-image" if channels == 1 else "digits-image-rgb"
    return Dataset(task, conv(d.x_train), d.y_train, conv(d.x_test), d.y_test, 10,
                   meta={"source": "digits as uint8 images", "image_shape": [channels, 8, 8]})


GOLDEN_DATA = {"digits-image": lambda: image_digits(1), "digits-image-rgb": lambda: image_digits(3)}


def sha(a: np.ndarray) -> str:
    a = np.asarray(a)
    dt = "<f8" if a.dtype.kind == "f" else "<i8"
    return hashlib.sha256(np.ascontiguousarray(a, dt).tobytes()).hexdigest()


def fhex(a) -> list[str]:
    return [f"{int(v):016x}" for v in np.asarray(a, "<f8").ravel().view("<u8")]


def _value(v):
    v = np.asarray(v)
    if v.dtype.kind == "f" and not np.all(v == np.floor(v)):
        return {"sha256": sha(v), "f64": fhex(v) if v.size <= 4096 else None, "shape": list(v.shape)}
    return {"sha256": sha(v.astype(np.int64)), "int": v.astype(np.int64).ravel().tolist() if v.size <= 4096 else None,
            "shape": list(v.shape)}


def build_common() -> dict:
    x = np.concatenate([-np.linspace(0, 90, 257), [0.0, -0.0, -1e-300, -5e-324, -80.0, -79.99999]])
    return {
        "prng": [{"seed": s, "stream": st, "start": 0,
                  "u32": prng.u32(s, st, 16).tolist(),
                  "uniform_f64": fhex(prng.uniform(s, st, 16)),
                  "permutation_37": prng.permutation(s, st, 37).tolist()}
                 for s, st in [(0, 0), (7, 3), (0xFFFFFFFF, prng.STREAM_SHUFFLE + 2)]],
        "dexp": {"x_f64": fhex(x), "y_f64": fhex(dexp(x))},
    }


def build(name: str) -> dict:
    task, hidden = TASKS[name]
    luts = load_luts()
    ds = GOLDEN_DATA[task]() if task in GOLDEN_DATA else prepare_task(task)
    hp = Hyper(seed=5)
    spec = model_for(ds, hidden)
    tr = Trainer(spec, hp, ds, luts)
    init = init_params(spec, hp.seed)
    out = {"task": task, "model": spec.to_json(), "hyper": hp.to_json(),
           "dataset_fingerprint": ds.fingerprint, "manifest_sha256": luts.manifest_sha256,
           "init_params_sha256": params_sha256(init),
           "init_params_f64_head": fhex(init[:32])}
    # one step in detail
    samples = [tr.schedule.samples(0, j).tolist() for j in range(hp.n_micro)]
    idx = np.array(samples[0])
    trace: list = []
    tr.engine.forward(tr.theta, ds.x_train[idx][None], trace)
    per_micro = [tr.contribute([j]) for j in range(hp.n_micro)]
    total = sum(r.grad for r in per_micro)
    g = tr.mean_grad(total)
    theta = tr.theta.copy()
    state = type(tr.state.adam).zeros(theta.size)
    adam_step(theta, state, g, hp)
    out["step0"] = {
        "micro_batch_samples": samples,
        "forward_micro0": [{"name": k, **_value(v)} for k, v in trace],
        "grad_fixed_per_micro_sha256": [sha(r.grad) for r in per_micro],
        "grad_fixed_micro0": per_micro[0].grad.tolist() if per_micro[0].grad.size <= 8192 else None,
        "grad_fixed_total_sha256": sha(total),
        "mean_grad_sha256": sha(g),
        "adam_m_sha256": sha(state.m), "adam_v_sha256": sha(state.v),
        "params_after_sha256": params_sha256(theta),
        "loss_micro": fhex(np.array([r.loss[0] for r in per_micro])),
    }
    hashes = []
    for step in range(RUN_STEPS):
        total = tr.contribute(list(range(hp.n_micro))).grad
        tr.apply(total)
        hashes.append(tr.params_sha256())
    assert hashes[0] == out["step0"]["params_after_sha256"]
    out["run"] = {"steps": RUN_STEPS, "params_sha256_per_step": hashes,
                  "params_sha256": hashes[-1], "test_accuracy": tr.accuracy()}
    return out


def dumps(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def files() -> dict[str, str]:
    out = {"engine_common.json": dumps(build_common())}
    for name in TASKS:
        out[f"step_{name}.json"] = dumps(build(name))
    return out


if __name__ == "__main__":
    for name, text in files().items():
        (DIR / name).write_text(text)
        print(f"wrote {DIR / name}")
