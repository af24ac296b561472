"""The page, second pass (issue 36), each item checked in Chromium on a tab of the real page:
a setting the run refuses is refused at its field before Start and never leaves the page
stuck (item 2); the task's defaults come from the one table every command reads (item 3)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

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
