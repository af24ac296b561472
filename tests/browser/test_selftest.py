"""The conformance page: every golden unit and GEMM vector on the WebGPU, WebAssembly SIMD and
JS-unit paths."""

from __future__ import annotations

import pytest

from browser_helpers import run_selftest

pytestmark = pytest.mark.browser

SETS = ("mul", "relu", "requantize", "gemm")


def _assert_path_passes(result: dict, name: str) -> None:
    info = result["paths"][name]
    assert info["tried"], info
    assert info["pass"], info["failures"]
    assert info["disabled"] is None, info["disabled"]
    for s in SETS:
        assert info["sets"][s]["pass"], (s, info["sets"][s])
    assert info["gemm"]["gops"] > 0


def test_selftest_webgpu_and_cpu_paths_pass_all_golden_vectors(gpu_page, server_url):
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None, result["error"]
    assert result["webgpu"]["available"], result["webgpu"]["reason"]
    assert result["paths_tried"] == ["gpu", "wasm", "cpu", "cpu-lut"]
    for name in ("gpu", "wasm", "cpu", "cpu-lut"):
        _assert_path_passes(result, name)
    assert result["usable_paths"] == ["gpu", "wasm", "cpu", "cpu-lut"]
    cases = result["paths"]["gpu"]["sets"]["gemm"]["cases"]
    assert {"3x5x7", "65x130x63", "extreme-maxk"} <= set(cases)


def test_selftest_without_webgpu_flag_says_so_and_uses_cpu(cpu_page, server_url):
    """Launched without --enable-unsafe-webgpu, requestAdapter() gives null: the page says
    WebGPU is unavailable and the CPU paths still pass."""
    result = run_selftest(cpu_page, f"{server_url}/selftest")
    assert cpu_page.evaluate("navigator.gpu.requestAdapter().then(a => a === null)") is True
    assert result["error"] is None
    assert not result["webgpu"]["available"]
    assert "requestAdapter() returned null" in result["webgpu"]["reason"]
    assert not result["paths"]["gpu"]["tried"]
    assert "WebGPU is not available" in result["paths"]["gpu"]["disabled"]
    _assert_path_passes(result, "wasm")
    _assert_path_passes(result, "cpu")
    _assert_path_passes(result, "cpu-lut")
    assert result["usable_paths"] == ["wasm", "cpu", "cpu-lut"]
    assert "WebGPU is not available here" in cpu_page.inner_text("#status")
