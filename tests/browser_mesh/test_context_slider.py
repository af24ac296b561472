"""The text task's context on the page (issue 38 item 4; webui/page/panels/model_data.js): a tab
host moves the context slider, the parameter count shown is the spec's for that context, a
context outside --context's range is refused at its field, and the run it starts with one
daisy-peer and a guest tab trains what ``daisychain train --task text --context N`` trains:
the host fetches the text windowed with N (``/data/text.dcds?context=N``, server/routes/data.py),
the daisy-peer and the guest fetch the same data by its fingerprint, and all end on train's
params-sha256; the guest's form shows the run's context."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mesh_helpers import needs_netns

from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.layers import param_count

pytestmark = [pytest.mark.browser, pytest.mark.mesh, needs_netns]

BIN = Path(sys.executable).parent
CONTEXT = 16
RUN = {"steps": 4, "seed": 5, "batch": 16, "micro_batch": 4, "lr": 0.003, "hidden": 16}


def slide(tab, sel: str, value: int) -> None:
    tab.page.evaluate("([s, v]) => { const e = document.querySelector(s); e.value = String(v); "
                      "e.dispatchEvent(new Event('input', { bubbles: true })); }", [sel, value])


def shown_params(tab) -> int:
    return int(tab.page.get_attribute("#model-size", "data-params"))


def test_a_tab_host_moves_the_context_slider_and_trains_trains_run(browser_cpu, tabs, server_url):
    flags = [w for k, v in RUN.items() for w in (f"--{k.replace('_', '-')}", str(v))]
    ref = subprocess.run([str(BIN / "daisychain"), "train", "--task", "text", "--context", str(CONTEXT),
                          *flags, "--json", "--quiet"], capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    want = json.loads(ref.stdout)
    data = prepare_task("text", context=CONTEXT)

    host = tabs(browser_cpu, "ctx-host").open("create=1")
    host.wait("window.__daisy.room && window.__daisy.room.room === 'private' && window.__daisy.room.isHost")
    code = host.state("window.__daisy.room.code")
    guest = tabs(browser_cpu, "ctx-guest").open(f"room={code}")
    # the tabs measure ~1,400 micro-batches/s of this model on WASM SIMD, the daisy-peer ~60 on a
    # busy machine: measured, it would get no share of a step (the coordinator's 1/4 rule); it
    # claims the tabs' order so that it is given work (which a tab's backup may still answer first)
    peer = subprocess.Popen([str(BIN / "daisy-peer"), "--server", server_url, "--room", code, "--name", "py1",
                             "--capacity", "1500", "--json", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for name in ("ctx-guest", "py1"):
            sel = f"#approvals li[data-peer]:has-text('{name}') button.approve"
            host.page.wait_for_selector(sel, timeout=120_000)
            host.page.click(sel)
        host.wait("window.__daisy.room.members.length === 3")
        assert not host.page.is_visible("#context-field")  # digits has no context
        host.page.select_option("#settings select[name=task]", "text")
        for k, v in RUN.items():
            host.page.fill(f"#settings input[name={k}]", str(v))
        host.wait("document.getElementById('model-size').dataset.params")
        assert host.page.is_visible("#context-field")
        # the slider's range is --context's (engine/settings.py SETTINGS)
        assert [host.page.get_attribute("#f-context-slider", a) for a in ("min", "max")] == ["1", "256"]
        assert host.page.input_value("#f-context") == "8"
        assert shown_params(host) == param_count(model_for(prepare_task("text"), 16).layers)

        # a context outside the range: refused at its field, nothing else moves
        host.page.fill("#f-context", "300")
        host.wait("document.getElementById('err-context').textContent !== ''")
        assert host.page.inner_text("#err-context") == "the context must be a whole number in [1, 256], not '300'"
        assert host.page.input_value("#f-context-slider") == "8"
        assert host.page.get_attribute("#model-size", "data-params") == ""
        host.page.click("#start")
        host.wait("document.getElementById('run-error').textContent.includes('need a fix')")
        assert host.state("window.__daisy.run.state") in (None, "idle")

        # the slider: the field and the count follow it
        slide(host, "#f-context-slider", CONTEXT)
        assert host.page.input_value("#f-context") == str(CONTEXT)
        assert host.page.inner_text("#err-context") == ""
        want_params = param_count(model_for(data, 16).layers)
        assert shown_params(host) == want_params != param_count(model_for(prepare_task("text"), 16).layers)
        assert int(host.page.get_attribute("#model-size", "data-bytes")) == 24 * want_params

        host.page.click("#start")
        for t in (host, guest):
            t.wait("window.__daisy.run.state === 'done'", 180_000)
        out, err = peer.communicate(timeout=120)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait(10)
    assert peer.returncode == 0, err[-2000:]
    res = json.loads(out.strip().splitlines()[-1])
    run = host.state("window.__daisy.run")
    assert run["runId"] == want["run_id"] and run["sha"] == want["params_sha256"]
    assert res["params_sha256"] == want["params_sha256"] and res["agreed"]
    assert res["identity"]["dataset"] == data.fingerprint
    assert guest.state("window.__daisy.run.sha") == want["params_sha256"]
    assert guest.page.input_value("#f-context") == str(CONTEXT)  # the run's settings, read-only
    assert guest.page.input_value("#f-context-slider") == str(CONTEXT) and guest.page.is_visible("#context-field")
    done = host.state("window.__daisy.run.done")
    tabs = {m["id"] for m in host.state("window.__daisy.room.members") if m["kind"] == "cpu"}
    assert len(tabs) == 2 and all(done.get(t, 0) > 0 for t in tabs), done  # both tabs computed
