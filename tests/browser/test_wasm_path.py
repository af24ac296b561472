"""The tab's WebAssembly SIMD path as a person sees it (issue 33): Chromium computes on the
WASM kernels and the device card says so; a browser without WebAssembly SIMD (emulated: the
SIMD probe refused, as an engine without SIMD refuses it) computes on the JS units and the
card says why; a module that fails its check (a pin that does not match the served bytes) is
never used and the card says why. /selftest trains on the WASM path to the CLI's hash."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from browser_helpers import open_page, run_selftest

pytestmark = pytest.mark.browser

NO_SIMD = """
(() => {
  const validate = WebAssembly.validate;
  // engines without fixed-width SIMD reject any module that uses a v128: so does this one
  WebAssembly.validate = (bytes) => {
    const b = new Uint8Array(bytes.buffer ? bytes.buffer : bytes);
    return b.includes(0x7b) && b.includes(0xfd) ? false : validate(bytes);
  };
})();
"""


def _device(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_function("window.__daisy && window.__daisy.device !== null", timeout=120_000)
    d = page.evaluate("() => { const d = window.__daisy.device; return { kind: d.kind, cpuPath: d.cpuPath, "
                      "cpuNote: d.cpuNote, units: d.units && d.units.name } }")
    d["card"] = page.inner_text("#device-kind")
    d["why"] = page.inner_text("#device-reason")
    return d


def test_page_computes_on_wasm_simd_and_the_card_says_so(browser_nogpu, server_url):
    page = open_page(browser_nogpu, "wasm")
    d = _device(page, f"{server_url}/?name=simd")
    assert d == {**d, "kind": "cpu", "cpuPath": "wasm", "cpuNote": None, "units": "wasm"}
    cores = page.evaluate("navigator.hardwareConcurrency")
    n = min(8, max(1, cores - 1))
    assert d["card"] == (f"CPU (WebAssembly SIMD kernels), {n} worker{'' if n == 1 else 's'} "
                         f"({cores} cores, one left for the page)"), d["card"]
    assert "WebAssembly SIMD passed its self-test" in d["why"]
    page.close()


def test_without_wasm_simd_the_tab_uses_the_js_units_and_says_so(browser_nogpu, server_url):
    page = open_page(browser_nogpu, "nosimd")
    page.add_init_script(NO_SIMD)
    d = _device(page, f"{server_url}/?name=nosimd")
    assert d["cpuPath"] == "js" and d["units"] == "cpu"
    assert d["card"].startswith("CPU (the JS units), 1 worker"), d["card"]
    assert "this browser has no WebAssembly SIMD: the tab computes on the JS units" in d["why"]
    page.close()


def test_a_module_that_fails_its_check_is_never_used(browser_nogpu, server_url):
    page = open_page(browser_nogpu, "badpin")
    page.route("**/webui/wasm/units.wasm.sha256", lambda route: route.fulfill(body="0" * 64 + "\n"))
    d = _device(page, f"{server_url}/?name=badpin")
    assert d["cpuPath"] == "js" and d["units"] == "cpu"
    assert d["card"].startswith("CPU (the JS units), 1 worker"), d["card"]
    assert "the WebAssembly module hashes to" in d["why"] and "not its pinned 000000000000" in d["why"]
    page.close()


def test_selftest_trains_on_wasm_to_the_cli_hash(cpu_page, server_url):
    argv = ["--task", "digits", "--layers", "24,16", "--steps", "3", "--seed", "2"]
    want = json.loads(subprocess.run([sys.executable, "-m", "daisychain.cli", "train", *argv, "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    for path in ("wasm", "js"):
        result = run_selftest(cpu_page, f"{server_url}/selftest?task=digits&layers=24,16&steps=3&seed=2&path={path}")
        t = result["training"]
        assert result["error"] is None, result["error"]
        assert t["cpu_units"] == path and t["fallback"] is None
        assert t["params_sha256"] == want["params_sha256"], path
        # the rate after the warm-up steps (bench.browser's): all but the last of 3 steps left out
        assert t["warm_steps"] == 2 and t["micro_batches_per_s_after_warm"] > 0 and t["micro_batches_per_s"] > 0
    # warm=N sets the steps left out (bench.browser's steady-state rate); a bad one is refused
    t = run_selftest(cpu_page, f"{server_url}/selftest?task=digits&layers=24,16&steps=3&seed=2&warm=1")["training"]
    assert t["warm_steps"] == 1 and t["params_sha256"] == want["params_sha256"]
    for bad in ("-1", "abc"):
        result = run_selftest(cpu_page, f"{server_url}/selftest?task=digits&layers=24,16&steps=3&warm={bad}")
        assert "warm" in (result["error"] or ""), result["error"]
