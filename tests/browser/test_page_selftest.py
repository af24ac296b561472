"""/selftest for a person (issue 23, item 9): a verdict, the dark scheme, a way back, the
reason WebGPU is missing said once, no console error (the favicon), a training one click away."""

from __future__ import annotations

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser


def test_selftest_says_a_verdict_once_in_the_dark_with_a_way_back(cpu_page, server_url):
    errors = []
    cpu_page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    cpu_page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    cpu_page.emulate_media(color_scheme="dark")
    result = run_selftest(cpu_page, f"{server_url}/selftest")
    assert result["error"] is None
    assert cpu_page.inner_text("#verdict") == "This device is OK: it can train with DaisyChain (on WebAssembly SIMD)."
    bg = cpu_page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(20, 21, 23)", bg
    assert cpu_page.get_attribute("#back", "href") == "/"
    reason = result["webgpu"]["reason"]
    assert reason and cpu_page.inner_text("body").count(reason) == 1
    assert "steps=" in cpu_page.get_attribute("#train-offer a", "href")
    assert errors == [], errors
