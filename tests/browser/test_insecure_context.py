"""A page opened from a LAN address over plain http is not a secure context: the browser
hides crypto.subtle and WebGPU. The page must still verify the tables and train on the CPU
units, with the same hash as `daisychain train` (regression: every hash used crypto.subtle,
so such a page could not even load its tables)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser
CLI = Path(sys.executable).with_name("daisychain")


def test_insecure_context_page_trains_on_cpu_with_the_same_hash(gpu_page, lan_server_url):
    ref = json.loads(subprocess.run([str(CLI), "train", "--steps", "5", "--seed", "2", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    result = run_selftest(gpu_page, f"{lan_server_url}/selftest?task=digits&steps=5&seed=2&path=gpu")
    assert gpu_page.evaluate("window.isSecureContext") is False
    assert gpu_page.evaluate("!!(globalThis.crypto && crypto.subtle)") is False
    assert result["error"] is None, result["error"]
    t = result["training"]
    assert t["path_used"] == "cpu"
    assert t["params_sha256"] == ref["params_sha256"]
    assert t["dataset_fingerprint"] == ref["dataset_fingerprint"]
