"""The in-page engine against the numpy engine's golden vectors (daisychain/golden/): the
PRNG, the shuffle, the deterministic exp, and for each task one step in detail (every
forward intermediate, the fixed-point contribution of each micro-batch, the averaged
gradient, Adam's moments) and a 20-step run, on the WebGPU path and on the CPU path; each
task with one hidden layer and with two (``--layers 32,24``), and the conv models' steps
(``step_image_conv*.json``: uint8 image sets served by a server of their own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_helpers import open_harness, run_selftest
from conv_server import serving
from step_js import assert_step

from daisychain.engine.golden import GOLDEN_DATA

pytestmark = pytest.mark.browser

GOLDEN = Path(__file__).resolve().parents[2] / "daisychain" / "golden"

COMMON = """
async (common) => {
  const prng = await import('/webui/engine/prng.js');
  const { dexp } = await import('/webui/engine/detmath.js');
  const hex = (x) => { const d = new DataView(new ArrayBuffer(8)); d.setFloat64(0, x); return d.getBigUint64(0).toString(16).padStart(16, '0'); };
  const unhex = (h) => { const d = new DataView(new ArrayBuffer(8)); d.setBigUint64(0, BigInt('0x' + h)); return d.getFloat64(0); };
  return {
    prng: common.prng.map((c) => ({ u32: Array.from(prng.u32(c.seed, c.stream, 16, c.start)),
      uniform_f64: Array.from(prng.uniform(c.seed, c.stream, 16), hex),
      permutation_37: Array.from(prng.permutation(c.seed, c.stream, 37)) })),
    dexp: common.dexp.x_f64.map((h) => hex(dexp(unhex(h)))),
  };
}
"""

STEP = """
async ([path, g]) => {
  const { sha256Hex } = await import('/webui/units/luts.js');
  const { loadDataset } = await import('/webui/engine/data.js');
  const { ModelSpec, makeHyper } = await import('/webui/engine/spec.js');
  const { Trainer, paramsSha256 } = await import('/webui/engine/trainer.js');
  const { initParams } = await import('/webui/engine/model.js');
  const { AdamState, adamStep } = await import('/webui/engine/adam.js');
  const { luts, paths } = window.__units;
  const sha = async (values) => {   // golden.py sha(): int64 LE if all integers, else float64 LE
    const a = Array.from(values);
    const ints = a.every(Number.isInteger);
    const dv = new DataView(new ArrayBuffer(a.length * 8));
    a.forEach((v, i) => ints ? dv.setBigInt64(i * 8, BigInt(v), true) : dv.setFloat64(i * 8, v, true));
    return sha256Hex(new Uint8Array(dv.buffer));
  };
  const hex = (x) => { const d = new DataView(new ArrayBuffer(8)); d.setFloat64(0, x); return d.getBigUint64(0).toString(16).padStart(16, '0'); };
  const ds = await loadDataset(`/data/${g.task}.dcds`);
  const spec = ModelSpec.fromJson(g.model);
  const hyper = makeHyper(g.hyper);
  const tr = await Trainer.create({ spec, hyper, dataset: ds, luts, units: paths[path] });
  const out = { fingerprint: ds.fingerprint, init: await paramsSha256(initParams(spec, hyper.seed)),
    init_head: Array.from(tr.theta.subarray(0, 32), hex), samples: [], trace: [] };
  const n = hyper.batch / hyper.micro_batch;
  for (let j = 0; j < n; j++) out.samples.push(Array.from(tr.samples(0, j)));
  const idx = tr.samples(0, 0);
  const rowLen = ds.x_train.shape[1];
  const x = new ds.x_train.data.constructor(idx.length * rowLen);
  idx.forEach((r, i) => x.set(ds.x_train.data.subarray(r * rowLen, (r + 1) * rowLen), i * rowLen));
  const trace = [];
  await tr.engine.forward(tr.theta, x, idx.length, (name, v) => trace.push([name, Array.from(v)]));
  for (const [name, v] of trace) out.trace.push({ name, sha256: await sha(v) });
  const per = [];
  for (let j = 0; j < n; j++) per.push(await tr.contribute([j]));
  out.per_micro = await Promise.all(per.map((r) => sha(r.grad)));
  out.micro0 = Array.from(per[0].grad);
  const total = new Float64Array(tr.theta.length);
  per.forEach((r) => r.grad.forEach((v, i) => { total[i] += v; }));
  out.total = await sha(total);
  const gm = tr.meanGrad(total);
  const dv = new DataView(new ArrayBuffer(gm.length * 8));
  gm.forEach((v, i) => dv.setFloat64(i * 8, v, true));
  out.mean_grad = await sha256Hex(new Uint8Array(dv.buffer));
  const theta = tr.theta.slice();
  const st = new AdamState(theta.length);
  adamStep(theta, st, gm, hyper);
  out.adam_m = await paramsSha256(st.m);
  out.adam_v = await paramsSha256(st.v);
  out.after = await paramsSha256(theta);
  out.loss_micro = per.map((r) => hex(r.loss[0]));
  out.run = [];
  for (let s = 0; s < g.run.steps; s++) {
    tr.apply((await tr.contribute(Array.from({ length: n }, (_, j) => j))).grad);
    out.run.push(await tr.paramsSha256());
  }
  out.accuracy = await tr.accuracy();
  return out;
}
"""


@pytest.fixture(scope="module")
def harness(browser_webgpu, server_url):
    page, info = open_harness(browser_webgpu, server_url)
    assert "gpu" in info["paths"], info["gpuReason"]
    yield page
    page.close()


@pytest.fixture(scope="module")
def image_harness(browser_webgpu):
    """The harness on a server that also serves the conv goldens' image sets."""
    with serving({task: make() for task, make in GOLDEN_DATA.items()}) as url:
        page, info = open_harness(browser_webgpu, url)
        assert "gpu" in info["paths"], info["gpuReason"]
        yield page
        page.close()


def test_prng_shuffle_and_exp_match_numpy(harness):
    common = json.loads((GOLDEN / "engine_common.json").read_text())
    got = harness.evaluate(COMMON, common)
    for want, have in zip(common["prng"], got["prng"]):
        assert have["u32"] == want["u32"]
        assert have["uniform_f64"] == want["uniform_f64"]
        assert have["permutation_37"] == want["permutation_37"]
    assert got["dexp"] == common["dexp"]["y_f64"]


@pytest.mark.parametrize("name", ["digits", "text", "digits_2layers", "text_2layers", "image_conv", "image_conv_rgb",
                                  "text_gpt"])
@pytest.mark.parametrize("path", ["gpu", "cpu", "wasm"])
def test_step_golden_vectors(request, name, path):
    """Conv models (image_conv: 1x8x8 conv4, pool, conv8k5, pool; image_conv_rgb: 3x8x8) too;
    path wasm: the WebAssembly SIMD kernels (webui/wasm), which Chromium must run."""
    g = json.loads((GOLDEN / f"step_{name}.json").read_text())
    harness = request.getfixturevalue("image_harness" if name.startswith("image") else "harness")
    if path == "wasm":
        assert harness.evaluate("() => Object.keys(window.__units.paths)").count("wasm"), \
            harness.evaluate("() => window.__units.wasmReason")
    got = harness.evaluate(STEP, [path, g])
    assert_step(got, g)  # every field of the golden file (step_js.py)


@pytest.mark.parametrize("task, path", [("digits", "gpu"), ("text", "cpu")])
def test_selftest_trains_a_two_hidden_layer_run_to_the_cli_hash(gpu_page, server_url, task, path):
    """/selftest?layers=24,16 trains the same run as `daisychain train --layers 24,16`."""
    import subprocess
    import sys

    argv = ["--task", task, "--layers", "24,16", "--steps", "3", "--seed", "2"]
    want = json.loads(subprocess.run([sys.executable, "-m", "daisychain.cli", "train", *argv, "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    result = run_selftest(gpu_page, f"{server_url}/selftest?task={task}&layers=24,16&steps=3&seed=2&path={path}")
    t = result["training"]
    assert result["error"] is None, result["error"]
    assert t["path_used"] == path and t["fallback"] is None
    assert t["model"] == want["identity"]["model"]
    assert t["run_id"] == want["run_id"]
    assert t["params_sha256"] == want["params_sha256"]


def test_selftest_refuses_layers_with_hidden(gpu_page, server_url):
    result = run_selftest(gpu_page, f"{server_url}/selftest?steps=1&layers=24&hidden=24")
    assert "give layers or hidden, not both" in result["error"]
    assert not (result.get("training") or {}).get("params_sha256")
