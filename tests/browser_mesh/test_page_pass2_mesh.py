"""The page, second pass (issue 36), the items that need a room of two tabs: a guest shows
the run's own settings, read-only (item 4), and the host every device's capacity on the
run's model (item 5)."""

from __future__ import annotations

import pytest
from mesh_helpers import needs_netns
from test_mixed_room import _approve_all

pytestmark = [pytest.mark.browser, pytest.mark.mesh]

ROOM_OF = "window.__daisy.room"


@needs_netns
def test_a_guest_shows_the_runs_own_settings_read_only(browser_cpu, tabs):
    """Issue 36 item 4: during an image run the guest's settings showed digits (8x8), 600 steps
    and seed 0 (its own form's defaults)."""
    host = tabs(browser_cpu, "set-host").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost && window.__daisy.datasetsLoaded")
    code = host.state(f"{ROOM_OF}.code")
    guest = tabs(browser_cpu, "set-guest").open(f"room={code}")
    try:
        _approve_all(host, ["set-guest"])
        host.wait(f"{ROOM_OF}.members.length === 2")
        host.wait("Object.values(window.__daisy.links).filter((s) => s === 'open').length === 1", 60_000)
        p = host.page
        p.select_option("#f-task", "image")
        p.fill("#f-steps", "6")
        p.fill("#f-seed", "9")
        p.fill("#f-batch", "32")
        p.fill("#f-micro", "8")
        p.fill("#f-layers", "conv4,pool,16")
        p.click("#start")
        guest.wait("window.__daisy.run.state === 'running' || window.__daisy.run.state === 'done'", 300_000)
        g = guest.page
        g.wait_for_function("document.querySelector('#f-task').value === 'image'", timeout=30_000)
        got = {k: g.input_value(f"#settings [name={k}]") for k in ("task", "steps", "seed", "batch", "micro_batch", "lr", "layers")}
        assert got == {"task": "image", "steps": "6", "seed": "9", "batch": "32", "micro_batch": "8", "lr": "0.006",
                       "layers": "conv4,pool,16"}, got
        assert "MNIST" in g.inner_text("#dataset-info") or "image task" in g.inner_text("#dataset-info")
        assert "read-only" in g.inner_text("#settings-hint")
        assert g.evaluate("[...document.querySelector('#settings').elements].every((e) => e.disabled)")
        assert "to 0 at step 6" in g.inner_text("#hint-lr")  # the run's own schedule
        for t in (host, guest):
            t.wait("window.__daisy.run.state === 'done'", 300_000)
        # item 5: the host shows every device's capacity on the run's model, not the probe's
        rows = host.page.eval_on_selector_all("#peers tr", "(trs) => trs.map((t) => t.innerText)")
        assert len(rows) == 2 and all("on the run's model" in r for r in rows), rows
        assert guest.state("window.__daisy.device.runCapacity") > 0
    finally:
        guest.close()
