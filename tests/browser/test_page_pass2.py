"""The page, second pass (issue 36), each item checked in Chromium on a tab of the real page:
a setting the run refuses is refused at its field before Start and never leaves the page
stuck (item 2); the task's defaults come from the one table every command reads (item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import run_selftest

pytestmark = pytest.mark.browser

CLI = Path(sys.executable).with_name("daisychain")
READY = "window.__daisy && window.__daisy.ready && window.__daisy.id && window.__daisy.datasetsLoaded"


def _host(page, base: str, name: str = "host") -> None:
    page.goto(f"{base}/?name={name}&path=cpu")
    page.wait_for_function(READY, timeout=120_000)
    page.click("#create-room")
    page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)


def _editable(page) -> bool:
    return page.evaluate("""() => [...document.querySelector('#settings').elements].every((e) => !e.disabled)
      && !document.querySelector('#start').disabled""")


def test_a_model_the_data_cannot_hold_is_refused_at_its_field_and_start_stays_usable(cpu_page, server_url):
    """Issue 36 item 2: digits with layers conv8 (and image with seven halvings of 28 px)
    showed no error at the field; Start left the page on "Preparing the run: model (1 of 4)"
    with every field disabled and Stop doing nothing."""
    _host(cpu_page, server_url)
    cpu_page.fill("#f-layers", "conv8")
    # at the field, before Start
    cpu_page.wait_for_function("document.querySelector('#err-layers').textContent.includes('image input')", timeout=30_000)
    cpu_page.click("#start")
    cpu_page.wait_for_timeout(1500)
    assert cpu_page.evaluate("window.__daisy.run.state") == "idle"
    assert _editable(cpu_page)
    assert "image input" in cpu_page.inner_text("#err-layers")
    # image: a model that pools the 28 px input away, refused at the field once the data is in
    cpu_page.select_option("#f-task", "image")
    cpu_page.fill("#f-layers", "conv8,pool,pool,pool,pool,pool,pool")
    cpu_page.click("#start")
    cpu_page.wait_for_function("document.querySelector('#err-layers').textContent.length > 0", timeout=180_000)
    cpu_page.wait_for_timeout(1000)
    assert cpu_page.evaluate("window.__daisy.run.state") == "idle"
    assert cpu_page.is_hidden("#preparing")
    assert _editable(cpu_page)
    # a right model then starts, and Stop stops it
    cpu_page.select_option("#f-task", "digits")
    cpu_page.fill("#f-layers", "")
    cpu_page.fill("#f-steps", "400")
    cpu_page.wait_for_function("document.querySelector('#err-layers').textContent === ''", timeout=30_000)
    cpu_page.click("#start")
    cpu_page.wait_for_function("window.__daisy.run.state === 'running' && window.__daisy.run.step > 2", timeout=120_000)
    cpu_page.click("#stop")
    cpu_page.wait_for_function("window.__daisy.run.state === 'done'", timeout=60_000)
    assert _editable(cpu_page)


def test_a_refusal_after_start_returns_to_editable_settings_with_the_reason_at_the_field(cpu_page, server_url):
    """Issue 36 item 2: whatever fails after Start (here the run's own model check, reached
    with the page's check before Start skipped) returns the page to editable settings."""
    _host(cpu_page, server_url)
    cpu_page.fill("#f-layers", "conv8")
    cpu_page.evaluate("""() => {
      const s = window.__daisy.mesh;  // the run's own checks only: the settings as Start sends them
      return s.start({ task: 'digits', steps: 5, layers: ['conv8'] }).catch((e) => e.message);
    }""")
    cpu_page.wait_for_function("window.__daisy.mesh.summary && window.__daisy.mesh.summary.state === 'idle'", timeout=30_000)
    assert cpu_page.evaluate("window.__daisy.run.state") == "idle"
    assert _editable(cpu_page)


def test_choosing_the_image_task_fills_its_defaults_from_the_table(cpu_page, server_url):
    """Issue 36 item 3: choosing image kept digits' lr 0.003 and 600 steps; the CLI trains
    0.006 and 3,000 with the image recipe. The page shows what the rate does in the run."""
    _host(cpu_page, server_url)
    cpu_page.select_option("#f-task", "image")
    assert cpu_page.input_value("#f-lr") == "0.006"
    assert cpu_page.input_value("#f-steps") == "3000"
    hint = cpu_page.inner_text("#hint-lr")
    assert "over the first 100 steps" in hint and "to 0 at step 3,000" in hint and "2 px" in hint, hint
    cpu_page.fill("#f-steps", "200")  # a value the host typed stays, and the schedule follows it
    cpu_page.select_option("#f-task", "digits")
    assert cpu_page.input_value("#f-lr") == "0.003" and cpu_page.input_value("#f-steps") == "200"
    assert cpu_page.inner_text("#hint-lr") == "constant through the run"


def test_selftest_of_the_image_task_trains_what_daisychain_train_trains(cpu_page, server_url):
    """Issue 33 item 1: /selftest?task=image ignored the image task's defaults (lr 0.006, the
    shifts, warm-up and decay): its hash was another run's than `daisychain train --task image`."""
    cli = subprocess.run([str(CLI), "train", "--task", "image", "--steps", "3", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)["params_sha256"]
    got = run_selftest(cpu_page, f"{server_url}/selftest?task=image&steps=3&path=cpu", 600_000)
    assert got["error"] is None, got["error"]
    assert got["training"]["params_sha256"] == want
