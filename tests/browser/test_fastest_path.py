"""Each tab computes on its fastest passing path: the self-test measures the micro-batch rate
of every path that passes (WebGPU kernels and the CPU path: WebAssembly SIMD where Chromium has
it, as here), and the page computes on the faster one and says why. On this machine WebGPU
runs on SwiftShader (a CPU rasterizer), so the measured rates pick the CPU path; the tests assert that the choice follows the measured
rates (whichever they favour) and that the words carry the measured ratio."""

from __future__ import annotations

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser


def _times(ratio: float) -> str:  # gpu.js timesText
    return f"{round(ratio)}×" if ratio >= 10 else f"{ratio:.1f}×"


def _assert_follows_rates(choice: dict) -> None:
    gpu, cpu = choice["rates"]["gpu"], choice["rates"]["cpu"]
    assert gpu > 0 and cpu > 0, choice
    assert choice["path"] == ("gpu" if gpu >= cpu else "cpu"), choice
    if choice["path"] == "cpu":
        assert choice["reason"] == (f"WebGPU passed but is {_times(cpu / gpu)} slower than WebAssembly SIMD "
                                    "here: computing on WebAssembly SIMD")
    else:
        assert choice["reason"].startswith("WebGPU passed its self-test")
        assert choice["reason"].endswith(f"is {_times(gpu / cpu)} faster than WebAssembly SIMD here: computing on WebGPU")


def test_selftest_page_chooses_the_faster_measured_path(gpu_page, server_url):
    result = run_selftest(gpu_page, f"{server_url}/selftest?task=digits&steps=2&hidden=16")
    assert result["error"] is None, result["error"]
    assert result["usable_paths"][:3] == ["gpu", "wasm", "cpu"]
    choice = result["choice"]
    assert choice["rates"]["gpu"] == result["paths"]["gpu"]["micro_batch_rate"]
    assert choice["rates"]["cpu"] == result["paths"]["wasm"]["micro_batch_rate"]
    _assert_follows_rates(choice)
    assert choice["reason"] in gpu_page.inner_text("#status")
    # without ?path= the in-page training runs on the chosen path
    assert result["training"]["path_used"] == choice["path"]


def _open_page(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_function("window.__daisy && window.__daisy.device !== null", timeout=120_000)
    return page.evaluate("() => JSON.parse(JSON.stringify(window.__daisy.device))")


def test_page_computes_on_the_faster_path_and_says_why(gpu_page, server_url):
    d = _open_page(gpu_page, f"{server_url}/?name=fast")
    choice = d["choice"]
    _assert_follows_rates(choice)
    assert d["kind"] == {"gpu": "webgpu", "cpu": "cpu"}[choice["path"]]
    assert d["reason"] == choice["reason"]
    assert d["capacity"] == choice["rates"][choice["path"]]
    assert gpu_page.inner_text("#device-reason") == choice["reason"]
    # on SwiftShader the measured rates favour the CPU path by far (BENCHMARKS.md)
    if choice["rates"]["cpu"] > 3 * choice["rates"]["gpu"]:
        assert d["kind"] == "cpu" and "here: computing on WebAssembly SIMD" in d["reason"]
        assert d["cpuPath"] == "wasm" and gpu_page.inner_text("#device-kind").startswith("CPU (WebAssembly SIMD kernels), 1 worker")


def test_page_computes_on_webgpu_when_asked(gpu_page, server_url):
    d = _open_page(gpu_page, f"{server_url}/?name=asked&path=gpu")
    assert d["kind"] == "webgpu"
    assert d["reason"].endswith("computing on WebGPU, as asked (path=gpu)")
    assert d["capacity"] == d["rates"]["gpu"]
    gpu, cpu = d["rates"]["gpu"], d["rates"]["cpu"]
    assert (f"is {_times(cpu / gpu)} slower" if cpu > gpu else f"is {_times(gpu / cpu)} faster") in d["reason"]
