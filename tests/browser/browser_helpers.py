"""Helpers for browser-tier tests: pages that log, and the self-test's ready marker."""

from __future__ import annotations

import json
import logging

log = logging.getLogger("browser")


def open_page(browser, name: str = "page"):
    """A new page whose console messages and page errors go into the test log."""
    page = browser.new_page()
    page.on("console", lambda m: log.info("[%s console.%s] %s", name, m.type, m.text))
    page.on("pageerror", lambda e: log.error("[%s pageerror] %s", name, e))
    return page


def run_selftest(page, url: str, timeout_ms: int = 180_000) -> dict:
    """Load the self-test page, wait for its ready marker, and return the #result JSON."""
    page.goto(url)
    page.wait_for_function("window.__selftestDone === true", timeout=timeout_ms)
    return json.loads(page.text_content("#result"))


HARNESS = """
async () => {
  if (!window.__units) {
    const { loadLuts } = await import('/webui/units/luts.js');
    const { openPaths } = await import('/webui/engine/paths.js');
    const { CpuUnits } = await import('/webui/engine/cpu_units.js');
    const luts = await loadLuts('/luts/');
    const opened = await openPaths(luts);
    window.__units = { luts, paths: { cpu: opened.cpu, 'cpu-lut': new CpuUnits(luts, { literal: true }) },
                       gpuReason: opened.gpuReason, wasmReason: opened.wasmReason };
    if (opened.gpu) window.__units.paths.gpu = opened.gpu;
    if (opened.wasm) window.__units.paths.wasm = opened.wasm;
  }
  return { paths: Object.keys(window.__units.paths), gpuReason: window.__units.gpuReason,
           wasmReason: window.__units.wasmReason };
}
"""


def open_harness(browser, base_url: str, name: str = "harness"):
    """A blank page on the server's origin with the unit paths opened as window.__units."""
    page = open_page(browser, name)
    page.route(f"{base_url}/__blank", lambda route: route.fulfill(body="<!doctype html><title>t</title>",
                                                                   content_type="text/html"))
    page.goto(f"{base_url}/__blank")
    info = page.evaluate(HARNESS)
    return page, info
