"""Unit tier (node): the JS engine's image model pieces without a browser: the `--layers`
conv syntax and its refusals, the conv spec JSON round trip and parameter shapes, and a
conv layer's int32 accumulator checked against a direct convolution in numpy (the sum over
channels and kernel taps of input times quantized weight, plus the bias), which is what
im2col + the unit GEMM must compute."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from daisychain import package_path
from daisychain.engine.data import Dataset, model_for
from daisychain.engine.settings import parse_layers
from daisychain.engine.counters import unit_counts_per_micro_batch
from daisychain.engine.spec import SpecError, char_mlp, cnn, layers_text, mlp
from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

# the committed LUTs, in the JS engine's form (the lut folder is the snippet's first argument)
LUTS = r"""
const lutDir = process.argv[2];
const rd = (n) => { const b = readFileSync(`${lutDir}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"),
  manifestSha256: JSON.parse(readFileSync(`${lutDir}/manifest.json`)).manifest_sha256 };
"""
ENGINE = {"S": "engine/spec.js", "{ Engine, initParams }": "engine/model.js", "{ CpuUnits }": "engine/cpu_units.js"}


def run_luts(body: str, imports: dict, data=None, timeout: float = 120):
    """run_js with ``luts`` (the committed tables) defined before ``body``."""
    return run_js(LUTS + body, imports=imports, data=data, timeout=timeout, args=[str(package_path("luts"))])


DRIVER = r"""
const job = DATA;
const out = { results: [] };
const img = { kind: "image", task: "img", x_train: { shape: [1, 16] }, classes: 10, meta: { image_shape: job.image } };
for (const text of job.texts) {
  try {
    out.results.push(S.modelFor(img, S.parseLayers(text)).toJson());
  } catch (e) {
    if (e.name !== "SpecError") throw e;
    out.results.push(e.message);
  }
}
out.big = job.big.map((t) => {
  try { S.modelFor({ ...img, meta: { image_shape: [1, 64, 64] } }, ["conv600", t]); return null; } catch (e) { return e.message; }
});
try {
  S.modelFor({ kind: "dense", task: "digits", x_train: { shape: [1, 64] }, classes: 10 }, ["conv4", 10]);
} catch (e) { out.dense_error = e.message; }
const spec = S.imageCnn(job.c, job.h, job.w, S.parseLayers(job.layers), 10);
out.model = spec.toJson();
out.roundtrip = S.ModelSpec.fromJson(JSON.parse(JSON.stringify(out.model))).toJson();
out.shapes = spec.paramShapes();
out.counts = job.count_specs.map((m) => S.layerUnitCounts(S.ModelSpec.fromJson(m), 16));
out.texts = job.texts.map((t) => { try { const m = S.modelFor(img, S.parseLayers(t)); return [S.layersText(m), S.layersText(m.toJson())]; } catch (e) { return null; } });
const theta = initParams(spec, 3);
out.theta = Array.from(theta);
const x = Uint8Array.from(job.x);
const trace = {};
await new Engine(spec, new CpuUnits(luts)).forward(theta, x, job.b, (name, v) => { trace[name] = Array.from(v); });
out.trace = trace;
console.log(JSON.stringify(out));
"""


def run_driver(job):
    return run_luts(DRIVER, ENGINE, data=job)


def quantize(v):
    m = np.abs(v).max()
    e = int(np.frexp(m)[1]) - 7 if m > 0 else 0
    return np.clip(np.floor(v * 2.0**-e + 0.5), -127, 127), e


def test_conv_layers_syntax_spec_and_accumulator():
    rng = np.random.default_rng(5)
    b, c, h, w = 2, 3, 7, 6
    texts = ["conv16,pool,conv32k5,pool,128", "conv8k3, pool ,10", "256,256", "conv16,10", "32,conv8",
             "pool,pool,pool", "conv8k4", "conv0", "conv8,x", "conv8,0", "conv5000", "conv8k", "pool",
             ",".join(["pool"] * 33), ",".join(["conv2"] * 17 + ["4"] * 17), "conv2,-3", "+4,conv2"]
    big = ["conv4096", "conv600k5"]
    count_specs = [cnn((3, 9, 7), ("conv4", "pool", "conv6k5", 12), 10), cnn((1, 8, 8), ("pool", "conv3", 5), 10),
                   cnn((1, 6, 6), (7,), 10), mlp(64, (24, 16), 10), char_mlp(30, 4, 8, 16)]  # on 64x64: 64*64*4096 outputs, 64*64*600*25 im2col values
    job = {
        "texts": texts, "image": [1, 4, 4], "big": big, "count_specs": [s.to_json() for s in count_specs],
        "layers": "conv5,conv4k5,pool,7", "c": c, "h": h, "w": w, "b": b,
        "x": rng.integers(0, 256, b * c * h * w).tolist(),
    }
    got = run_driver(job)
    # unit counts through the registry: counters.py's numbers
    assert got["counts"] == [unit_counts_per_micro_batch(s, 16) for s in count_specs]
    # the same specs and the same refusals, word for word, as settings.parse_layers + model_for
    img = Dataset("img", np.zeros((1, 16), np.uint8), np.zeros(1, np.int32), np.zeros((1, 16), np.uint8),
                  np.zeros(1, np.int32), 10, meta={"image_shape": [1, 4, 4]})
    for text, have in zip(texts, got["results"]):
        try:
            want = model_for(img, parse_layers(text)).to_json()
        except (argparse.ArgumentTypeError, SpecError) as exc:
            want = str(exc)
        assert have == want, text
    img64 = Dataset("img", np.zeros((1, 4096), np.uint8), np.zeros(1, np.int32), np.zeros((1, 4096), np.uint8),
                    np.zeros(1, np.int32), 10, meta={"image_shape": [1, 64, 64]})
    for t, have in zip(big, got["big"]):  # the per-sample value cap, in Python's words
        with pytest.raises(SpecError) as exc:
            model_for(img64, ("conv600", t))
        assert have == str(exc.value) and "values per sample" in have
    assert sum(h is not None for h in got["texts"]) >= 4
    for text, have in zip(texts, got["texts"]):  # layers_text of the spec, from the spec and its JSON
        if have is not None:
            want = layers_text(model_for(img, parse_layers(text)))
            assert have == [want, want], text
    assert got["dense_error"] == "conv and pool layers need an image input (--task image); the digits task takes dense widths only"

    model = got["model"]
    assert got["roundtrip"] == model
    assert model["input"] == {"kind": "image", "dim": c * h * w, "channels": c, "height": h, "width": w}
    assert model["layers"] == [
        {"type": "conv2d", "in_channels": 3, "out_channels": 5, "kernel": 3, "height": h, "width": w}, {"type": "relu"},
        {"type": "conv2d", "in_channels": 5, "out_channels": 4, "kernel": 5, "height": h, "width": w}, {"type": "relu"},
        {"type": "maxpool2d", "channels": 4, "height": h, "width": w},
        {"type": "linear", "in": 4 * 3 * 3, "out": 7}, {"type": "relu"}, {"type": "linear", "in": 7, "out": 10}]
    assert got["shapes"] == [["layers.0.weight", [5, 3, 3, 3]], ["layers.0.bias", [5]],
                             ["layers.2.weight", [4, 5, 5, 5]], ["layers.2.bias", [4]],
                             ["layers.5.weight", [7, 36]], ["layers.5.bias", [7]],
                             ["layers.7.weight", [10, 7]], ["layers.7.bias", [10]]]
    theta = np.array(got["theta"])
    W0 = theta[:135].reshape(5, 3, 3, 3)
    assert np.abs(W0).max() <= 1 / np.sqrt(27) and np.abs(W0).max() > 0.8 / np.sqrt(27)

    # layer 0's accumulator, by a direct convolution: acc[s, y, x, o] = sum a * Wq + bias
    tr = got["trace"]
    x = np.array(job["x"]).reshape(b, c, h, w)
    a = x >> 1
    assert tr["input_exponent"] == [-7] and tr["input_q"] == a.ravel().tolist()
    Wq, ew = quantize(W0)
    assert tr["layers.0.weight_exponent"] == [ew]
    bias = theta[135:140]
    bacc = np.clip(np.floor(bias * 2.0 ** -(-7 + ew) + 0.5), -2**30, 2**30)
    assert tr["layers.0.bias_acc"] == bacc.tolist()
    ap = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((b, h, w, 5), np.int64)
    for dy in range(3):
        for dx in range(3):
            acc += np.einsum("schw,oc->shwo", ap[:, :, dy:dy + h, dx:dx + w], Wq[:, :, dy, dx].astype(np.int64))
    acc += bacc.astype(np.int64)
    assert tr["layers.0.acc"] == acc.ravel().tolist()
    # out_q is channel-major: (b, 5, h, w)
    s = tr["layers.0.shift"][0]
    assert s == max(int(np.abs(acc).max()).bit_length() - 7, 0)
    q = np.clip(np.floor(acc / 2.0**s + 0.5), -127, 127).astype(np.int64)
    assert tr["layers.0.out_q"] == q.transpose(0, 3, 1, 2).ravel().tolist()


RECIPE = r"""
const out = {};
out.plain = S.hyperJson(S.makeHyper({ seed: 3 }));
out.recipe = S.hyperJson(S.makeHyper({ augment_shift: 2, lr_warmup: 10, lr_decay_steps: 100 }));
out.errors = [];
for (const o of [{ augment_shift: 9 }, { lr_warmup: 5, lr_decay_steps: 5 }, { lr_warmup: 1.5 }, { augment: 1 }]) {
  try { S.makeHyper(o); out.errors.push(null); } catch (e) { out.errors.push(e.message); }
}
const ds = { kind: "image", task: "img", x_train: { shape: [1, 16], data: new Uint8Array(16) }, y_train: { data: new Int32Array(1) },
             classes: 10, meta: { image_shape: [1, 4, 4] } };
const spec = S.modelFor(ds, ["conv2", "pool", 4]);
for (const o of [{ augment_shift: 2 }, { lr_warmup: 3 }]) {
  try { await T.Trainer.create({ spec, hyper: S.makeHyper(o), dataset: ds, luts: {}, units: {} }); out.errors.push(null); }
  catch (e) { out.errors.push(`${e.name}: ${e.message}`); }
}
const dense = { ...ds, kind: "dense", x_train: { shape: [1, 64], data: new Float64Array(64) } };
try { await T.Trainer.create({ spec: S.mlp(64, 8, 10), hyper: S.makeHyper({ augment_shift: 1 }), dataset: dense, luts: {}, units: {} }); }
catch (e) { out.errors.push(e.message); }
out.identity_hyper = T.runIdentity(spec, S.makeHyper({ seed: 3 }), { fingerprint: "f", task: "img" }, { manifestSha256: "m" }).hyper;
console.log(JSON.stringify(out));
"""


def test_hyper_image_recipe_fields_and_the_trainer_takes_them():
    """The image recipe's hyperparameters (spec.py Hyper: augment_shift, lr_warmup,
    lr_decay_steps) are taken and checked, left out of the JSON when 0 (a run without them
    keeps its identity), and the JS trainer takes a run that sets them (it applies them:
    tests/engine/test_image_recipe_js.py) but refuses augmentation of a task that is not images."""
    got = run_js(RECIPE, imports={"S": "engine/spec.js", "T": "engine/trainer.js"})
    plain = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "batch": 64,
             "micro_batch": 16, "grad_frac_bits": 40, "seed": 3}
    assert got["plain"] == plain == got["identity_hyper"]
    assert got["recipe"] == {**plain, "seed": 0, "augment_shift": 2, "lr_warmup": 10, "lr_decay_steps": 100}
    e = got["errors"]
    assert e[0] == "--augment-shift must lie in [0, 8] pixels"
    assert e[1] == "--lr-warmup (5) must be below --lr-decay-steps (5)"
    assert e[2] == "lr_warmup must be an integer, got 1.5"
    assert e[3] == "unknown hyperparameter augment"
    assert e[4] is None and e[5] is None
    assert e[6] == "--augment-shift applies to the image task"


RATE = r"""
const cpu = new CpuUnits(luts);
const calls = {};
const units = new Proxy(cpu, { get: (t, k) => typeof t[k] === "function"
  ? (...a) => { calls[k] = (calls[k] || 0) + 1; return t[k](...a); } : t[k] });
const out = {};
out.image = await microBatchRate(units, { minMs: 20, spec: S.imageCnn(3, 8, 8, ["conv4", "pool", 8], 10) });
out.image_calls = { ...calls };
out.dense = await microBatchRate(units, { minMs: 20 });
console.log(JSON.stringify(out));
"""


def test_capacity_figure_runs_the_model_it_is_given():
    """conformance.microBatchRate measures an image model on a synthetic micro-batch of
    pixels (its im2col and pool units run; the first conv computes no input error), not
    only the digits MLP."""
    got = run_luts(RATE, {"S": "engine/spec.js", "{ microBatchRate }": "engine/conformance.js",
                          "{ CpuUnits }": "engine/cpu_units.js"})
    assert got["image"] > 0 and got["dense"] > 0, got
    calls = got["image_calls"]
    assert calls["im2col"] >= 2 and "col2im" not in calls and calls["maxpool"] == calls["maxpoolBack"] == calls["im2col"], calls


SPLIT = r"""
const job = DATA;
const spec = S.ModelSpec.fromJson(job.model);
const theta = initParams(spec, 4);
const total = new Float64Array(theta.length);
await new Engine(spec, new CpuUnits(luts)).gradInto(total, theta, Uint8Array.from(Buffer.from(job.x, "hex")),
  Int32Array.from(job.y), job.b, 40, 2 ** 51);
console.log(JSON.stringify(Array.from(total)));
"""


def test_conv_weight_gradient_over_more_rows_than_one_gemm_takes_matches_numpy():
    """A conv whose weight-gradient GEMM has K = b*H*W = 16*96*96 = 147,456 rows, above the
    unit GEMM's 131,071: the JS engine splits K and sums the int32 parts exactly; the
    micro-batch's fixed-point gradient equals numpy's (which sums in float64)."""
    from daisychain.engine.model import Engine, init_params
    from daisychain.engine.spec import cnn
    from daisychain.units import load_luts

    b = 16
    spec = cnn((1, 96, 96), ("conv2", "pool", "pool", "pool", "pool"), 10)
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, (1, b, 96 * 96)).astype(np.uint8)
    y = rng.integers(0, 10, (1, b))
    want = Engine(spec, load_luts()).grad(init_params(spec, 4), x, y, 40, float(2**51)).grad
    job = {"model": spec.to_json(), "x": x.tobytes().hex(), "y": y.ravel().tolist(), "b": b}
    got = run_luts(SPLIT, ENGINE, data=job, timeout=300)
    assert np.any(want[:18] != 0)
    assert got == want.tolist()
