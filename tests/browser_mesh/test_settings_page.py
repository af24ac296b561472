"""The page checks its run settings with the commands' ranges (webui/engine/settings_check.js, the
same table as daisychain/engine/settings.py): issue 24, the page took any positive learning
rate (1e300 trained to NaN) and 0 steps. The reasons are tests/data/settings_values.json's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
REASONS = {(c["setting"], c["raw"]): c["reason"]
           for c in json.loads((ROOT / "tests" / "data" / "settings_values.json").read_text())["bad"]}


def test_out_of_range_settings_are_refused_next_to_their_fields(browser_cpu, tabs):
    host = tabs(browser_cpu, "host").open()
    host.page.click("#create-room")
    host.wait("window.__daisy.room && window.__daisy.room.isHost")
    for name, raw in (("lr", "1e300"), ("steps", "0"), ("seed", "4294967296"), ("hidden", "66573")):
        host.page.fill(f"#settings [name={name}]", raw)
    host.page.click("#start")
    label = {"lr": "the learning rate", "steps": "steps", "seed": "the seed", "hidden": "hidden"}
    for name, raw in (("lr", "1e300"), ("steps", "0"), ("seed", "4294967296"), ("hidden", "66573")):
        assert host.page.inner_text(f"#err-{name}") == f"{label[name]} {REASONS[(name, raw)]}"
    assert host.state("window.__daisy.run.state") == "idle"
    host.page.fill("#settings [name=lr]", "0.003")
    host.page.fill("#settings [name=steps]", "5")
    host.page.click("#start")
    assert host.page.inner_text("#err-lr") == "" and host.page.inner_text("#err-steps") == ""
