"""A whole training run inside the page equals `daisychain train`: same params-sha256 and
run id on the WebGPU path, on the CPU path, and without WebGPU at all, for both tasks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser

STEPS = 20
SEED = 3
CLI = Path(sys.executable).with_name("daisychain")


@pytest.fixture(scope="module")
def cli_runs():
    """`daisychain train --task T --steps 20 --seed 3 --json` for both tasks, once."""
    out = {}
    for task in ("digits", "text"):
        proc = subprocess.run([str(CLI), "train", "--task", task, "--steps", str(STEPS), "--seed",
                               str(SEED), "--json"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out[task] = json.loads(proc.stdout)
    return out


def _check(result: dict, cli: dict, path_used: str) -> None:
    assert result["error"] is None, result["error"]
    t = result["training"]
    assert t["steps"] == STEPS and t["seed"] == SEED
    assert t["path_used"] == path_used, t["fallback"]
    assert t["dataset_fingerprint"] == cli["dataset_fingerprint"]
    assert t["run_id"] == cli["run_id"]
    assert t["params_sha256"] == cli["params_sha256"]
    assert t["accuracy"] == cli["accuracy"]


@pytest.mark.parametrize("task", ["digits", "text"])
@pytest.mark.parametrize("path", ["gpu", "cpu"])
def test_page_training_equals_cli(gpu_page, server_url, cli_runs, task, path):
    result = run_selftest(gpu_page, f"{server_url}/selftest?task={task}&steps={STEPS}&seed={SEED}&path={path}")
    _check(result, cli_runs[task], path)
    assert cli_runs[task]["params_sha256"] in gpu_page.inner_text("#training")


def test_without_webgpu_page_trains_on_cpu_with_the_same_hash(cpu_page, server_url, cli_runs):
    result = run_selftest(cpu_page, f"{server_url}/selftest?task=digits&steps={STEPS}&seed={SEED}&path=gpu")
    _check(result, cli_runs["digits"], "cpu")
    assert "GPU path is disabled" in result["training"]["fallback"]
    assert "WebGPU is not available" in result["training"]["fallback"]
