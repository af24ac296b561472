"""Try the model for a text transformer (issue 37): a tab trains `--layers block16h2` from the
page's form, then samples a continuation of a prompt; the probabilities the panel samples
from are the ones after the window's LAST position (a transformer has logits at every
position), the numpy engine's softmax of them."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.model import Engine
from daisychain.units import load_luts

pytestmark = pytest.mark.browser

PROBS = """async (win) => {
  const tr = window.__daisy.mesh.peer.trainer;
  return { probs: Array.from(await tr.probs(Int32Array.from(win), 1)), theta: Array.from(tr.theta),
           model: tr.spec.toJson ? tr.spec.toJson() : tr.spec };
}"""


def test_try_a_transformer_samples_from_the_last_position(cpu_page, server_url):
    cpu_page.goto(f"{server_url}/?name=text&path=cpu")
    cpu_page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id && window.__daisy.datasetsLoaded",
                               timeout=120_000)
    cpu_page.click("#create-room")
    cpu_page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    cpu_page.select_option("#f-task", "text")
    cpu_page.fill("#f-steps", "4")
    cpu_page.fill("#settings [name=layers]", "block16h2")
    cpu_page.click("#start")
    cpu_page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 4", timeout=180_000)
    cpu_page.fill("#try-panel .try-prompt", "def main():")
    cpu_page.click("#try-panel .try-sample")
    cpu_page.wait_for_function("document.querySelector('#try-panel .try-continuation').textContent.length === 80",
                               timeout=120_000)
    text = prepare_task("text")
    assert set(cpu_page.inner_text("#try-panel .try-continuation")) <= set(text.meta["vocab"])
    win = text.x_test[3].tolist()
    got = cpu_page.evaluate(PROBS, win)
    spec = model_for(text, ("block16h2",))
    assert got["model"] == spec.to_json()
    z, _ = Engine(spec, load_luts()).forward(np.array(got["theta"]), np.array([[win]], np.int32))
    last = z[0].reshape(-1, 8, spec.classes)[:, -1][0]
    p = np.exp(last - last.max())
    p /= p.sum()
    assert len(got["probs"]) == spec.classes
    assert np.abs(np.array(got["probs"]) - p).max() < 1e-9
