"""The GPU kept fed (issue 33 item 3): a micro-batch's forward and backward resident on the
GPU (webui/units/gpu_resident.js) train exactly the run `daisychain train` trains, in a WebGPU tab
(SwiftShader here): digits, the default CNN of the image task and the text task's character
MLP (its embedding gathered and scattered by the host), with each GEMM kernel
(res_gemm.wgsl tiled with workgroup memory, with dot4I8Packed and with its fallback by shifts;
res_gemm_direct.wgsl; res_gemm_packed.wgsl on operands packed four int8 a word;
res_gemm_lanes.wgsl, int32 operands laid out for an emulated SIMD routine's lanes) and with the
one the tab measured fastest; the GPU units one call at a
time (resident=0) still give the same hash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import open_harness, run_selftest

pytestmark = pytest.mark.browser

SEED = 3
STEPS = {"digits": 6, "image": 2, "text": 4}
CLI = Path(sys.executable).with_name("daisychain")


@pytest.fixture(scope="module")
def cli_runs():
    out = {}
    for task, steps in STEPS.items():
        proc = subprocess.run([str(CLI), "train", "--task", task, "--steps", str(steps), "--seed", str(SEED),
                               "--json"], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        out[task] = json.loads(proc.stdout)
    return out


def _train(page, server_url, task, extra=""):
    r = run_selftest(page, f"{server_url}/selftest?task={task}&steps={STEPS[task]}&seed={SEED}&path=gpu{extra}",
                     timeout_ms=400_000)
    assert r["error"] is None, r["error"]
    t = r["training"]
    assert t["path_used"] == "gpu" and t["fallback"] is None, t
    return t


@pytest.mark.parametrize("task", ["digits", "image", "text"])
@pytest.mark.parametrize("kernel", ["tiled", "tiled-shifts", "direct", "packed", "lanes", "measured"])
def test_resident_gpu_pass_trains_the_cli_run(gpu_page, server_url, cli_runs, task, kernel):
    extra = {"tiled": "&gpu-gemm=tiled", "tiled-shifts": "&gpu-gemm=tiled&gpu-dot=shifts",
             "direct": "&gpu-gemm=direct", "packed": "&gpu-gemm=packed", "lanes": "&gpu-gemm=lanes", "measured": ""}[kernel]
    t = _train(gpu_page, server_url, task, extra)
    cli = cli_runs[task]
    assert t["run_id"] == cli["run_id"]
    assert t["params_sha256"] == cli["params_sha256"]
    assert t["accuracy"] == cli["accuracy"]
    res = t["gpu_resident"]
    # every micro-batch of training and of the accuracy pass ran resident, with the kernel asked for
    assert res["calls"] >= STEPS[task] * 4, res
    assert res["reason"] is None
    if kernel != "measured":
        assert res["gemm"] == kernel.split("-")[0], res
    else:
        # every kernel timed on the run's model, the registers-only ones with fewer split sums too
        assert res["gemm"] in res["gemm_ms"] and res["measured"] in res["gemm_ms"], res
        assert set(res["gemm_ms"]) == {"tiled", "direct", "packed", "lanes", "direct/16", "packed/16", "lanes/16"}, res
        assert res["measured"].split("/")[0] == res["gemm"], res
    # SwiftShader has packed_4x8_integer_dot_product: the tiled kernel uses dot4I8Packed unless told not to
    assert res["dot"] == ("shifts" if kernel == "tiled-shifts" else "dot4I8Packed"), res


def test_gpu_units_one_call_at_a_time_still_train_the_cli_run(gpu_page, server_url, cli_runs):
    t = _train(gpu_page, server_url, "digits", "&resident=0")
    assert t["params_sha256"] == cli_runs["digits"]["params_sha256"]
    assert t["gpu_resident"] is None  # never asked for a plan


@pytest.mark.parametrize("kernel", ["measured", "packed"])
def test_resident_weight_gradient_split_over_max_k_rows(gpu_page, server_url, kernel):
    """A conv on 28x28 pictures with micro-batches of 256: 200,704 rows, more than MAX_K
    (131,071), so the weight-gradient GEMM runs in two parts summed on the host in float64
    (the packed kernel then packs the columns from their int32 matrix, not from the map)."""
    flags = ["--task", "image", "--layers", "conv4,pool", "--batch", "256", "--micro-batch", "256",
             "--steps", "1", "--seed", str(SEED)]
    proc = subprocess.run([str(CLI), "train", *flags, "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    r = run_selftest(gpu_page, f"{server_url}/selftest?task=image&layers=conv4,pool&batch=256&micro-batch=256"
                     f"&steps=1&seed={SEED}&path=gpu{'&gpu-gemm=packed' if kernel == 'packed' else ''}",
                     timeout_ms=400_000)
    assert r["error"] is None, r["error"]
    t = r["training"]
    assert t["path_used"] == "gpu" and t["fallback"] is None, t
    assert t["gpu_resident"]["calls"] >= 1
    if kernel == "packed":
        assert t["gpu_resident"]["gemm"] == "packed", t["gpu_resident"]
    assert t["params_sha256"] == cli["params_sha256"]
    assert t["accuracy"] == cli["accuracy"]


def test_resident_kernel_with_other_bits_is_never_used(gpu_page, server_url, cli_runs):
    """A res_gemm_direct.wgsl that drops the first product of every sum (of every split of K): the resident path's
    self-check against the JS units refuses it, says why, and the tab trains on the GPU units
    one call at a time, on train's hash."""
    def drop_first(route):
        body = route.fetch().body().decode()
        assert "for (var kk = kb;" in body
        route.fulfill(body=body.replace("for (var kk = kb;", "for (var kk = kb + 1u;"), content_type="text/plain")
    gpu_page.route("**/shaders/res_gemm_direct.wgsl", drop_first)
    t = _train(gpu_page, server_url, "digits", "&gpu-gemm=direct")
    assert t["params_sha256"] == cli_runs["digits"]["params_sha256"]
    res = t["gpu_resident"]
    assert res["calls"] == 0 and "direct GEMM" in res["reason"] and "JS units" in res["reason"], res


CONCURRENT = """
async () => {
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const S = await import('/webui/engine/spec.js');
  const { gpu, cpu } = window.__units.paths;
  const spec = S.imageCnn(1, 12, 12, ['conv4', 'pool', 'conv6', 'pool'], 5);
  const theta = initParams(spec, 4);
  const b = 6;
  const inputs = [1, 2, 3].map((s) => [Uint8Array.from({ length: b * 144 }, (_, i) => (i * 37 * s + s) & 255),
                                       Int32Array.from({ length: b }, (_, i) => (i + s) % 5)]);
  const run = async (units, [x, y]) => {
    const total = new Float64Array(theta.length);
    const r = await new Engine(spec, units).gradInto(total, theta, x, y, b, 40, 2 ** 49);
    return [Array.from(total), r.correct];
  };
  const first = await Promise.all(inputs.map((inp) => run(gpu, inp)));  // opening the plan together
  const together = await Promise.all(inputs.map((inp) => run(gpu, inp)));  // on the open plan
  const alone = [];
  for (const inp of inputs) alone.push(await run(cpu, inp));
  const text = JSON.stringify(alone);
  return { same: JSON.stringify(first) === text && JSON.stringify(together) === text, info: gpu.residentInfo };
}
"""


def test_resident_passes_started_together_on_one_plan_give_each_its_own_bits(browser_webgpu, server_url):
    """Three micro-batches started at once on one resident plan (one set of GPU buffers):
    each contribution equals the JS units' (the plan runs one pass at a time)."""
    page, info = open_harness(browser_webgpu, server_url, "concurrent")
    try:
        assert "gpu" in info["paths"], info
        got = page.evaluate(CONCURRENT)
    finally:
        page.close()
    assert got["info"]["calls"] >= 6 and got["info"]["reason"] is None, got
    assert got["same"]


SPLIT = """
async () => {
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const S = await import('/webui/engine/spec.js');
  const { sha256Hex } = await import('/webui/units/luts.js');
  const { gpu, cpu } = window.__units.paths;
  const cases = [
    ['default CNN', S.imageCnn(1, 28, 28, [...S.DEFAULT_CNN], 10), 16],
    ['odd CNN', S.imageCnn(3, 11, 9, ['conv5', 'pool', 'conv7k5', 12], 4), 5],
    ['CNN without pools', S.imageCnn(2, 6, 5, ['conv3', 'conv4'], 3), 7],
    ['CNN with two pools', S.imageCnn(1, 10, 11, ['conv3', 'pool', 'pool', 'conv2'], 3), 4],
    ['wide MLP', S.mlp(131, 7, 3), 3],
    ['deep MLP', S.mlp(200, 129, 5, 2), 2],
  ];
  const sum = async (units, spec, theta, x, y, b) => {
    const total = new Float64Array(theta.length);
    const r = await new Engine(spec, units).gradInto(total, theta, x, y, b, 40, 2 ** 49);
    return `${await sha256Hex(new Uint8Array(total.buffer))} ${r.correct}`;
  };
  const out = [];
  for (const gemm of ['direct', 'tiled', 'packed', 'lanes']) {
    for (const split of [64, false]) {
      gpu.residentGemm = gemm;
      gpu.residentSplit = split;
      for (const [name, spec, b] of cases) {
        const theta = initParams(spec, 5);
        const row = { name, gemm, split, same: [] };
        for (const seed of [1, 2]) { // the plan's first (cold) pass, then a warm one
          const n = b * spec.inputDim;
          const x = spec.inputKind === 'image' ? Uint8Array.from({ length: n }, (_, i) => (i * 131 + seed * 17) & 255)
            : Float64Array.from({ length: n }, (_, i) => ((i * 37 + seed) % 23) - 11);
          const y = Int32Array.from({ length: b }, (_, i) => (i + seed) % spec.classes);
          const want = await sum(cpu, spec, theta, x, y, b);
          const got = await sum(gpu, spec, theta, x, y, b);
          row.same.push(got === want);
        }
        const plan = await gpu.residentPlan(spec, b);
        const ops = [...plan.fwd, ...plan.bwd];
        // the split GEMMs and bias gradients: [k or rows, terms a part, parts]
        row.splits = ops.filter((op) => op.grid[2] > 1).map((op) => op.kernel.startsWith('gemm') ? [op.words[1], op.words[3], op.grid[2]]
          : [op.words[0], op.words[3], op.grid[2]]);
        row.reduces = ops.filter((op) => op.kernel === 'reduce').length;
        // a pool's backward that requantizes the raw errors it reads (res_pool_back.wgsl requant)
        row.poolRequant = ops.filter((op) => op.kernel === 'pool_back' && op.words[6] === 1).length;
        row.requants = ops.filter((op) => op.kernel === 'requantize').length;
        out.push(row);
      }
    }
  }
  gpu.residentGemm = undefined;
  gpu.residentSplit = undefined;
  return { rows: out, info: gpu.residentInfo };
}
"""


def test_split_sums_give_the_js_units_bits(browser_webgpu, server_url):
    """The GEMMs and bias gradients with few workgroups split over K (rows) into partials that
    res_reduce.wgsl, res_bias_absmax.wgsl (a layer's accumulator) or the host (the gradient)
    adds (gpu_split.js splitOf, sumSlots), and the fused passes (res_requantize_map.wgsl,
    res_pool_back.wgsl with and without the requantize of the errors it reads, res_col2im.wgsl
    with and without the ReLU mask, res_im2col.wgsl): on
    the default CNN, an odd CNN, a CNN without pools, one with a pool on a pool and two MLPs,
    with each GEMM kernel, split and not, the contribution of a plan's first
    (cold) pass and of a warm one is the JS units' to the bit; the splits include parts that
    do not divide K (a last, shorter part), so a part boundary off by one changes the hash."""
    page, info = open_harness(browser_webgpu, server_url, "split")
    try:
        assert "gpu" in info["paths"], info
        got = page.evaluate(SPLIT)
    finally:
        page.close()
    assert got["info"]["reason"] is None, got["info"]
    rows = got["rows"]
    bad = [(r["name"], r["gemm"], r["split"], r["same"]) for r in rows if r["same"] != [True, True]]
    assert not bad, bad
    split = [r for r in rows if r["split"]]
    assert all(not r["splits"] and not r["reduces"] for r in rows if not r["split"])
    # a split's partials are added by res_reduce.wgsl, or in place: a layer's accumulator by
    # res_bias_absmax.wgsl, the gradient by the host (gpu_split.js sumSlots)
    assert all(r["reduces"] <= len(r["splits"]) for r in split), split
    assert all(r["reduces"] < len(r["splits"]) for r in split if "CNN" in r["name"]), split
    # the packed kernel splits words of four values of K, so the small models' sums stay whole there
    assert all(r["splits"] for r in split if r["gemm"] != "packed" or "CNN" in r["name"]), split
    parts = [s for r in split for s in r["splits"]]
    assert any(k % kc for k, kc, _ in parts), parts  # a remainder part
    assert any(k % kc == 0 for k, kc, _ in parts), parts
    # the errors a pool's backward reads are requantized there, not by a pass of their own: the
    # default CNN's three pools (the one below a linear layer and the two below a conv's col2im),
    # the odd CNN's one pool (its 11x9 map: windows cut by the odd last row and column)
    fused = {r["name"]: (r["poolRequant"], r["requants"]) for r in rows}
    assert fused["default CNN"] == (3, 0), fused
    assert fused["odd CNN"][0] == 1, fused
    assert fused["CNN without pools"][0] == 0, fused
    for cnn in (r for r in split if r["name"] == "default CNN"):
        assert max(p for _, _, p in cnn["splits"]) >= 32, cnn  # conv1's weight gradient: one workgroup before
