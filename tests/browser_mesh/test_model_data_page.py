"""The page's model-size sliders, a Hub data set fetched by the server, and "← Back to
settings" (webui/page/panels/model_data.js, server/routes/hub.py): the parameter count the sliders
show is the spec's (Python's model_for on the same data); a Hub name typed by the host comes
back from ``serve --hub`` (a local parquet mirror: nothing downloads) as the room's data set
with ``daisychain train --stream``'s fingerprint; the run trains on it to train's hash; and
Back to settings keeps every setting for the next run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mesh_helpers import Tab, needs_netns

from daisychain.engine.data import load_digits, model_for, prepare_task
from daisychain.engine.hub import HubStream
from daisychain.engine.spec import MAX_PARAMS  # noqa: F401 (the count is the spec's param_count)
from daisychain.engine.layers import param_count
from peer_process import server_thread

pytestmark = [pytest.mark.browser, pytest.mark.mesh, needs_netns]

BIN = Path(sys.executable).parent


def write_set(root: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = root / "owner" / "stories" / "data"
    d.mkdir(parents=True)
    text = [f"story {i}: once upon a time a small robot counted {i * 3 % 11} sheep" for i in range(300)]
    pq.write_table(pa.table({"text": text}), d / "train-00000-of-00001.parquet")
    return root / "owner" / "stories"


def slide(tab: Tab, sel: str, value: int) -> None:
    tab.page.evaluate("([s, v]) => { const e = document.querySelector(s); e.value = String(v); "
                      "e.dispatchEvent(new Event('input', { bubbles: true })); }", [sel, value])


def shown_params(tab: Tab) -> int:
    return int(tab.page.get_attribute("#model-size", "data-params"))


def form_values(tab: Tab) -> dict:
    return tab.page.evaluate("() => Object.fromEntries([...document.getElementById('settings').elements]"
                             ".filter((e) => e.id && e.type !== 'file' && e.type !== 'button')"
                             ".map((e) => [e.id, e.value]))")


def test_sliders_hub_name_and_back_to_settings(browser_cpu, tmp_path):
    path = write_set(tmp_path)
    text = prepare_task("text", str(path), stream=HubStream(take=150))  # train --stream's data
    with server_thread(hub=True, hub_mirror=str(tmp_path)) as url:
        host = Tab(browser_cpu, url, "host").open()
        try:
            host.page.click("#create-room")
            host.wait("window.__daisy.room && window.__daisy.room.isHost")
            host.wait("document.getElementById('model-size').dataset.params")
            # the default digits model, then the sliders: two hidden layers of 64
            assert shown_params(host) == param_count(model_for(load_digits(), 128).layers)
            slide(host, "#f-depth", 2)
            slide(host, "#f-width", 3)  # WIDTHS[3] == 64
            assert host.page.input_value("#f-layers") == "64,64"
            want = param_count(model_for(load_digits(), (64, 64)).layers)
            assert shown_params(host) == want
            assert int(host.page.get_attribute("#model-size", "data-bytes")) == 24 * want
            assert f"{want:,}".replace(",", "") in host.page.inner_text("#model-size").replace(",", "").replace("\u202f", "")

            # a Hub name: the server reads its first 150 rows for this room
            host.page.select_option("#f-task", "text")
            host.page.fill("#hub-name", "owner/stories")
            host.page.fill("#hub-take", "150")
            host.page.click("#hub-fetch")
            host.wait(f"document.getElementById('f-dataset').value === '{text.fingerprint}'", 60_000)
            assert "owner/stories" in host.page.inner_text("#hub-hint")
            assert shown_params(host) == param_count(model_for(text, (64, 64)).layers)
            host.page.fill("#hub-name", "owner/none")
            host.page.click("#hub-fetch")
            host.wait("document.getElementById('hub-hint').textContent.includes('was not fetched')")
            assert "no such data set" in host.page.inner_text("#hub-hint")
            assert host.page.input_value("#f-dataset") == text.fingerprint  # nothing else changed

            # a run on it, then back to settings: every setting kept
            host.page.fill("#f-steps", "3")
            before = form_values(host)
            host.page.click("#start")
            host.wait("window.__daisy.end && window.__daisy.end.step === 3", 180_000)
            sha = host.state("window.__daisy.run.sha")
            host.page.click("#back-to-settings")
            assert not host.page.is_visible("#end-card")
            assert form_values(host) == before
            assert host.page.inner_text("#back-to-settings") == "← Back to settings"
        finally:
            host.close()
    ref = subprocess.run([str(BIN / "daisychain"), "train", "--task", "text", "--data", str(path), "--stream",
                          "--take", "150", "--layers", "64,64", "--steps", "3", "--json", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert json.loads(ref.stdout)["params_sha256"] == sha
