"""Unit tier (node): the JS engine's image model pieces without a browser: the `--layers`
conv syntax and its refusals, the conv spec JSON round trip and parameter shapes, and a
conv layer's int32 accumulator checked against a direct convolution in numpy (the sum over
channels and kernel taps of input times quantized weight, plus the bias), which is what
im2col + the unit GEMM must compute."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess

import numpy as np
import pytest

from daisychain import package_path
from daisychain.engine.data import Dataset, model_for
from daisychain.engine.settings import parse_layers
from daisychain.engine.spec import SpecError

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

DRIVER = r"""
import { readFileSync } from "node:fs";
const [web, lutDir] = process.argv.slice(2);
const S = await import(web + "/engine/spec.js");
const { Engine, initParams } = await import(web + "/engine/model.js");
const { CpuUnits } = await import(web + "/engine/paths.js");
const rd = (n) => { const b = readFileSync(`${lutDir}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"),
  manifestSha256: JSON.parse(readFileSync(`${lutDir}/manifest.json`)).manifest_sha256 };
const job = JSON.parse(readFileSync(0, "utf8"));
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
try {
  S.modelFor({ kind: "dense", task: "digits", x_train: { shape: [1, 64] }, classes: 10 }, ["conv4", 10]);
} catch (e) { out.dense_error = e.message; }
const spec = S.imageCnn(job.c, job.h, job.w, S.parseLayers(job.layers), 10);
out.model = spec.toJson();
out.roundtrip = S.ModelSpec.fromJson(JSON.parse(JSON.stringify(out.model))).toJson();
out.shapes = spec.paramShapes();
const theta = initParams(spec, 3);
out.theta = Array.from(theta);
const x = Uint8Array.from(job.x);
const trace = {};
await new Engine(spec, new CpuUnits(luts)).forward(theta, x, job.b, (name, v) => { trace[name] = Array.from(v); });
out.trace = trace;
console.log(JSON.stringify(out));
"""


def run_driver(tmp_path, job):
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER)
    web = package_path("webui")
    luts = package_path("luts")
    r = subprocess.run([NODE, str(driver), web.as_uri(), str(luts)], input=json.dumps(job),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def quantize(v):
    m = np.abs(v).max()
    e = int(np.frexp(m)[1]) - 7 if m > 0 else 0
    return np.clip(np.floor(v * 2.0**-e + 0.5), -127, 127), e


def test_conv_layers_syntax_spec_and_accumulator(tmp_path):
    rng = np.random.default_rng(5)
    b, c, h, w = 2, 3, 7, 6
    texts = ["conv16,pool,conv32k5,pool,128", "conv8k3, pool ,10", "256,256", "conv16,10", "32,conv8",
             "pool,pool,pool", "conv8k4", "conv0", "conv8,x", "conv8,0", "conv5000", "conv8k", "pool",
             ",".join(["pool"] * 33), ",".join(["conv2"] * 17 + ["4"] * 17), "conv2,-3", "+4,conv2"]
    job = {
        "texts": texts, "image": [1, 4, 4],
        "layers": "conv5,conv4k5,pool,7", "c": c, "h": h, "w": w, "b": b,
        "x": rng.integers(0, 256, b * c * h * w).tolist(),
    }
    got = run_driver(tmp_path, job)
    # the same specs and the same refusals, word for word, as settings.parse_layers + model_for
    img = Dataset("img", np.zeros((1, 16), np.uint8), np.zeros(1, np.int32), np.zeros((1, 16), np.uint8),
                  np.zeros(1, np.int32), 10, meta={"image_shape": [1, 4, 4]})
    for text, have in zip(texts, got["results"]):
        try:
            want = model_for(img, parse_layers(text)).to_json()
        except (argparse.ArgumentTypeError, SpecError) as exc:
            want = str(exc)
        assert have == want, text
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
