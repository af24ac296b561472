"""The transformer in Chromium (issue 37): the exp unit's golden vectors and the transformer's
units (gemmBatch, the integer softmax) pass on every path of /selftest (WebGPU through
SwiftShader, WebAssembly SIMD, the JS units); a flipped byte in exp.bin is refused naming the
file; a softmax kernel that leaves a row unwritten is caught by the poison and the GPU path
is disabled; and ``/selftest?task=text&layers=block16h2,block16h2`` trains in the page, on
WebGPU and on the JS units, to the hash and run id of ``daisychain train``. (The golden step
file step_text_gpt.json on every path: tests/browser/test_engine_golden.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser

PATHS = ["gpu", "wasm", "cpu", "cpu-lut"]


def _replace(page, url_glob, edit):
    def handler(route):
        resp = route.fetch()
        route.fulfill(response=resp, body=edit(resp.body()))
    page.route(url_glob, handler)


def test_exp_and_attention_units_pass_on_every_path(gpu_page, server_url):
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None, result["error"]
    assert result["usable_paths"] == PATHS
    for path in PATHS:
        sets = result["paths"][path]["sets"]
        assert sets["exp"] == {"pass": True, "count": 256, "detail": None}, path
        cases = sets["attention"]["cases"]
        assert sets["attention"]["pass"] and len(cases) == 9, (path, cases)
        assert any(name.startswith("softmax") for name in cases) and any("Aᵀ" in name for name in cases)


def test_flipped_byte_in_the_exp_table_is_refused_naming_the_file(gpu_page, server_url):
    def flip(body: bytes) -> bytes:
        b = bytearray(body)
        b[4 * 60] ^= 1
        return bytes(b)
    _replace(gpu_page, "**/luts/exp.bin", flip)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert "LutError" in result["error"] and "/luts/exp.bin" in result["error"], result["error"]
    assert "does not match the manifest" in result["error"]
    assert result["usable_paths"] == []


def test_manifest_without_the_exp_unit_is_refused(gpu_page, server_url):
    def edit(body: bytes) -> bytes:
        m = json.loads(body)
        del m["extra_units"]
        return json.dumps(m).encode()
    _replace(gpu_page, "**/luts/manifest.json", edit)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert "must describe exactly the extra units exp" in result["error"], result["error"]


def test_softmax_kernel_that_skips_a_row_fails_on_the_poison(gpu_page, server_url):
    """A softmax kernel that never writes its last row must fail the self-test's attention
    cases (the row stays 0x7fffffff), and the GPU path is disabled with the reason."""
    def skip_last(body: bytes) -> bytes:
        src = body.decode()
        old = "  if (r >= params.rows) {"
        assert old in src
        return src.replace(old, "  if (r + 1u >= params.rows) {").encode()
    _replace(gpu_page, "**/shaders/softmax.wgsl", skip_last)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None
    gpu = result["paths"]["gpu"]
    assert gpu["tried"] and not gpu["pass"]
    assert "failed golden vectors: attention softmax" in gpu["disabled"], gpu["disabled"]
    assert "got 2147483647" in gpu["disabled"]
    assert result["usable_paths"] == ["wasm", "cpu", "cpu-lut"]


@pytest.fixture(scope="module")
def cli_run():
    argv = ["--task", "text", "--layers", "block16h2,block16h2", "--steps", "3", "--seed", "2"]
    return json.loads(subprocess.run([sys.executable, "-m", "daisychain.cli", "train", *argv, "--json"],
                                     capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("path", ["gpu", "cpu", "js"])
def test_selftest_trains_a_transformer_to_the_cli_hash(gpu_page, server_url, cli_run, path):
    """/selftest?task=text&layers=block16h2,block16h2 trains the run `daisychain train` does
    (path cpu: WebAssembly SIMD; js: the JS units)."""
    result = run_selftest(gpu_page, f"{server_url}/selftest?task=text&layers=block16h2,block16h2"
                                    f"&steps=3&seed=2&path={path}", timeout_ms=300_000)
    t = result["training"]
    assert result["error"] is None, result["error"]
    assert t["fallback"] is None
    assert t["path_used"] == ("gpu" if path == "gpu" else "cpu")
    assert t["model"] == cli_run["identity"]["model"]
    assert t["run_id"] == cli_run["run_id"]
    assert t["params_sha256"] == cli_run["params_sha256"]
