"""Refusals and fallbacks of the conformance page: corrupted tables are refused with the file
named; a GPU kernel that leaves an element unwritten is caught by the poisoned output and the
GPU path is disabled with the reason; a kernel that does not compile demotes to the CPU units."""

from __future__ import annotations

import json

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser


def _replace(page, url_glob, edit):
    def handler(route):
        resp = route.fetch()
        route.fulfill(response=resp, body=edit(resp.body()))
    page.route(url_glob, handler)


def test_corrupted_table_is_refused_naming_the_file(gpu_page, server_url):
    def flip(body: bytes) -> bytes:
        b = bytearray(body)
        b[4 * 1000] ^= 1
        return bytes(b)
    _replace(gpu_page, "**/luts/mul.bin", flip)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert "LutError" in result["error"] and "/luts/mul.bin" in result["error"], result["error"]
    assert "does not match the manifest" in result["error"]
    assert result["usable_paths"] == []
    assert "mul.bin" in gpu_page.inner_text("#status")


def test_manifest_whose_hash_does_not_match_its_entries_is_refused(gpu_page, server_url):
    def edit(body: bytes) -> bytes:
        m = json.loads(body)
        m["units"]["relu"]["sha256"] = "0" * 64
        return json.dumps(m).encode()
    _replace(gpu_page, "**/luts/manifest.json", edit)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert "manifest_sha256 does not match its entries" in result["error"], result["error"]


def test_kernel_that_skips_an_element_fails_on_the_poison_and_gpu_is_disabled(gpu_page, server_url):
    """Regression guard for the poisoning: a GEMM kernel that never writes C's last element
    must fail its golden vectors (the element stays 0x7fffffff), not pass on a zeroed buffer."""
    def skip_last(body: bytes) -> bytes:
        src = body.decode()
        old = "  c[params.c_off + row * params.c_sm + col * params.c_sn] = acc;"
        assert old in src
        return src.replace(old, "  if (row == params.m - 1u && col == params.n - 1u) { return; }\n" + old).encode()
    _replace(gpu_page, "**/shaders/gemm.wgsl", skip_last)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None
    gpu = result["paths"]["gpu"]
    assert gpu["tried"] and not gpu["pass"]
    assert "failed golden vectors: gemm 1x1x1" in gpu["disabled"]
    assert "got 2147483647" in gpu["disabled"]
    assert result["usable_paths"] == ["wasm", "cpu", "cpu-lut"]
    assert "The WebGPU path failed its self-test" in gpu_page.inner_text("#status")


def test_kernel_that_does_not_compile_demotes_to_cpu_with_the_reason(gpu_page, server_url):
    _replace(gpu_page, "**/shaders/requantize.wgsl", lambda body: body + b"\nfn broken( {\n")
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None
    assert not result["webgpu"]["available"]
    assert "requantize.wgsl" in result["webgpu"]["reason"], result["webgpu"]["reason"]
    assert result["usable_paths"] == ["wasm", "cpu", "cpu-lut"]
