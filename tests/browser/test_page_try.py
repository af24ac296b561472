"""Try the model (issue 23, "What to build" 5): draw a digit and see every class's probability,
type a prompt and sample a continuation, and the same from a downloaded checkpoint; trying
never changes the run's parameters."""

from __future__ import annotations

import pytest
from test_page_worker import solo_run

pytestmark = pytest.mark.browser

SHA_NOW = """async () => {
  const { paramsSha256 } = await import('/webui/engine/trainer.js');
  return paramsSha256(window.__daisy.mesh.peer.trainer.theta);
}"""


def _draw_one(page) -> None:
    box = page.locator("#try-panel canvas.try-draw").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.15
    page.mouse.move(x, y)
    page.mouse.down()
    for k in range(1, 11):
        page.mouse.move(x, y + k * box["height"] * 0.07)
    page.mouse.up()


def test_draw_a_digit_then_try_a_downloaded_checkpoint(cpu_page, server_url):
    solo_run(cpu_page, server_url, 40)
    cpu_page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 40", timeout=180_000)
    sha = cpu_page.evaluate("window.__daisy.run.sha")
    cpu_page.click("#try-it")
    _draw_one(cpu_page)
    cpu_page.wait_for_function("document.querySelectorAll('#try-panel .try-probs li').length === 10", timeout=60_000)
    probs = cpu_page.evaluate("window.__tryPanel.lastProbs")
    assert len(probs) == 10 and abs(sum(probs) - 1) < 1e-9 and min(probs) >= 0
    assert cpu_page.inner_text("#try-panel .try-answer").startswith("It reads ")
    assert cpu_page.evaluate(SHA_NOW) == sha  # trying the model read the parameters only
    # the same panel on a downloaded checkpoint of the run
    with cpu_page.expect_download() as dl:
        cpu_page.click("#end-download")
    path = dl.value.path()
    cpu_page.set_input_files("#try-checkpoint", path)
    cpu_page.wait_for_function("document.querySelector('#try-panel .try-which').textContent.includes('step 40')", timeout=60_000)
    cpu_page.click("#try-panel .try-clear")
    _draw_one(cpu_page)
    cpu_page.wait_for_function("document.querySelectorAll('#try-panel .try-probs li').length === 10", timeout=60_000)
    assert cpu_page.evaluate("window.__tryPanel.lastProbs") == probs  # same parameters, same answer


def test_type_a_prompt_and_sample_a_continuation(cpu_page, server_url):
    cpu_page.goto(f"{server_url}/?name=text&path=cpu")
    cpu_page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id && window.__daisy.datasetsLoaded",
                               timeout=120_000)
    cpu_page.click("#create-room")
    cpu_page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    cpu_page.select_option("#f-task", "text")
    cpu_page.fill("#f-steps", "10")
    cpu_page.click("#start")
    cpu_page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 10", timeout=180_000)
    cpu_page.fill("#try-panel .try-prompt", "Simple is bétter")
    cpu_page.click("#try-panel .try-sample")
    cpu_page.wait_for_function("document.querySelector('#try-panel .try-continuation').textContent.length === 80",
                               timeout=120_000)
    vocab = cpu_page.evaluate("window.__daisy.mesh.peer.trainer.ds.meta.vocab")
    text = cpu_page.inner_text("#try-panel .try-continuation")
    assert set(text) <= set(vocab)
    assert "é" in cpu_page.inner_text("#try-panel .try-note")  # said, not silently dropped
