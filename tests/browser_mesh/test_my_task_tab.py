"""A task of your own reaches the room's tabs: a daisy-peer hosts examples/my_task.py
(regression with mse) and serves its data to the room; a Chromium tab on the CPU units fetches
it from the host over the data channel (the server has no copy), trains with the JS twin of
the mse loss and ends on ``daisychain train --task``'s hash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mesh_helpers import hosted_room, needs_netns

pytestmark = [pytest.mark.browser, pytest.mark.mesh, needs_netns]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUN = ["--task", "examples.my_task:MyTask", "--batch", "32", "--micro-batch", "8", "--steps", "20"]


def test_a_tab_joins_a_daisy_peer_hosted_task_of_its_own_and_ends_on_trains_hash(
        browser_cpu, tabs, server_url, tmp_path):
    ref = subprocess.run([str(BIN / "daisychain"), "train", *RUN, "--json"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert ref.returncode == 0, ref.stderr
    want = json.loads(ref.stdout)["params_sha256"]
    with hosted_room(server_url, RUN, tmp_path / "host.err", cwd=ROOT) as (host, code):
        tab = tabs(browser_cpu, "task-tab").open(f"room={code}")
        tab.wait("window.__daisy.run && window.__daisy.run.state === 'done'", 180_000)
        out, _ = host.communicate(timeout=120)
    res = json.loads(out.strip().splitlines()[-1])
    assert res["params_sha256"] == want and res["agreed"] and res["identity"]["model"]["loss"] == "mse"
    run = tab.state("window.__daisy.run")
    assert run["sha"] == want and run["agreed"] is True
    kinds = {p["kind"]: p["micro_batches"] for p in res["peers"]}
    assert kinds.get("cpu", 0) > 0, kinds  # the tab computed micro-batches with the JS mse


def test_a_tab_hosts_a_task_the_server_serves_and_ends_on_trains_hash(browser_cpu, tmp_path):
    """``serve --task module:Name``: the host tab finds the task's data set in the list, the
    task joins the task list, its layers fill the field, and the run is train's."""
    from mesh_helpers import Tab

    from daisychain.task import load_task, task_dataset
    from peer_process import server_thread

    ref = "examples.my_task:MyTask"
    ds = task_dataset(load_task(ref), ref)
    want = subprocess.run([str(BIN / "daisychain"), "train", *RUN, "--json", "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert want.returncode == 0, want.stderr
    with server_thread(datasets={ref: ds}) as url:
        host = Tab(browser_cpu, url, "host").open()
        try:
            host.page.click("#create-room")
            host.wait("window.__daisy.room && window.__daisy.room.isHost")
            host.wait(f"[...document.getElementById('f-dataset').options].some((o) => o.value === '{ds.fingerprint}')")
            host.page.select_option("#f-dataset", ds.fingerprint)
            assert host.page.input_value("#f-task") == "mytask"
            assert host.page.input_value("#f-layers") == "32,32"
            for name, value in (("steps", "20"), ("batch", "32"), ("micro_batch", "8")):
                host.page.fill(f"#settings [name={name}]", value)
            host.page.click("#start")
            host.wait("window.__daisy.end && window.__daisy.end.step === 20", 180_000)
            assert host.state("window.__daisy.run.sha") == json.loads(want.stdout)["params_sha256"]
        finally:
            host.close()
