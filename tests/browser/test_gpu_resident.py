"""The GPU kept fed (issue 33 item 3): a micro-batch's forward and backward resident on the
GPU (webui/units/gpu_resident.js) train exactly the run `daisychain train` trains, in a WebGPU tab
(SwiftShader here): digits, the default CNN of the image task and the text task's character
MLP (its embedding gathered and scattered by the host), with each GEMM kernel
(res_gemm.wgsl tiled with workgroup memory, with dot4I8Packed and with its fallback by shifts;
res_gemm_direct.wgsl) and with the one the tab measured faster; the GPU units one call at a
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
@pytest.mark.parametrize("kernel", ["tiled", "tiled-shifts", "direct", "measured"])
def test_resident_gpu_pass_trains_the_cli_run(gpu_page, server_url, cli_runs, task, kernel):
    extra = {"tiled": "&gpu-gemm=tiled", "tiled-shifts": "&gpu-gemm=tiled&gpu-dot=shifts",
             "direct": "&gpu-gemm=direct", "measured": ""}[kernel]
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
        assert res["gemm"] in ("tiled", "direct") and set(res["gemm_ms"]) == {"tiled", "direct"}, res
    # SwiftShader has packed_4x8_integer_dot_product: the tiled kernel uses dot4I8Packed unless told not to
    assert res["dot"] == ("shifts" if kernel == "tiled-shifts" else "dot4I8Packed"), res


def test_gpu_units_one_call_at_a_time_still_train_the_cli_run(gpu_page, server_url, cli_runs):
    t = _train(gpu_page, server_url, "digits", "&resident=0")
    assert t["params_sha256"] == cli_runs["digits"]["params_sha256"]
    assert t["gpu_resident"] is None  # never asked for a plan


def test_resident_weight_gradient_split_over_max_k_rows(gpu_page, server_url):
    """A conv on 28x28 pictures with micro-batches of 256: 200,704 rows, more than MAX_K
    (131,071), so the weight-gradient GEMM runs in two parts summed on the host in float64."""
    flags = ["--task", "image", "--layers", "conv4,pool", "--batch", "256", "--micro-batch", "256",
             "--steps", "1", "--seed", str(SEED)]
    proc = subprocess.run([str(CLI), "train", *flags, "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    r = run_selftest(gpu_page, f"{server_url}/selftest?task=image&layers=conv4,pool&batch=256&micro-batch=256"
                     f"&steps=1&seed={SEED}&path=gpu", timeout_ms=400_000)
    assert r["error"] is None, r["error"]
    t = r["training"]
    assert t["path_used"] == "gpu" and t["fallback"] is None, t
    assert t["gpu_resident"]["calls"] >= 1
    assert t["params_sha256"] == cli["params_sha256"]
    assert t["accuracy"] == cli["accuracy"]


def test_resident_kernel_with_other_bits_is_never_used(gpu_page, server_url, cli_runs):
    """A res_gemm_direct.wgsl that drops the first product of every sum: the resident path's
    self-check against the JS units refuses it, says why, and the tab trains on the GPU units
    one call at a time, on train's hash."""
    def drop_first(route):
        body = route.fetch().body().decode()
        assert "for (var kk = 0u;" in body
        route.fulfill(body=body.replace("for (var kk = 0u;", "for (var kk = 1u;"), content_type="text/plain")
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
