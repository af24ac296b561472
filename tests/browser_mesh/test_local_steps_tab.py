"""Local steps in a tab (engine/local.js, the tab's run protocol): a Chromium tab on the CPU
units joins a `daisy-peer`-hosted run with `--replicas 4 --sync-every 2`, computes replica
rounds on the page, loads the round state it is sent, and ends on `daisychain train`'s
hash like the daisy-peer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mesh_helpers import hosted_room, needs_netns

pytestmark = [pytest.mark.browser, pytest.mark.mesh, needs_netns]

BIN = Path(sys.executable).parent
RUN = ["--task", "text", "--hidden", "16", "--embed-dim", "4", "--context", "4", "--batch", "16",
       "--micro-batch", "4", "--seed", "3", "--replicas", "4", "--sync-every", "2", "--steps", "12"]


def test_a_tab_joins_a_daisy_peer_hosted_local_steps_run_and_ends_on_trains_hash(
        browser_cpu, tabs, server_url, tmp_path):
    ref = subprocess.run([str(BIN / "daisychain"), "train", *RUN, "--json"], capture_output=True,
                         text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    want = json.loads(ref.stdout)["params_sha256"]
    with hosted_room(server_url, RUN, tmp_path / "host.err") as (host, code):
        tab = tabs(browser_cpu, "local-tab").open(f"room={code}")
        tab.wait("window.__daisy.run && window.__daisy.run.state === 'done'", 180_000)
        out, _ = host.communicate(timeout=120)
    res = json.loads(out.strip().splitlines()[-1])
    assert res["params_sha256"] == want and res["agreed"] and res["steps"] == 12
    run = tab.state("window.__daisy.run")
    assert run["sha"] == want and run["agreed"] is True
    assert tab.page.inner_text("#params-sha256") == want
    kinds = {p["kind"]: p["micro_batches"] for p in res["peers"]}
    assert kinds.get("cpu", 0) > 0, kinds  # the tab computed replica rounds
    # the run panel says it: the round, the inner steps, the replicas this device computed
    line = tab.page.inner_text("#local-steps")
    assert tab.page.is_visible("#local-steps") and "4 replicas × 2 inner steps (inner step" in line, line
    assert re.search(r"this device computed replicas? [0-3](, [0-3])* of round \d+", line), line


def test_a_tab_hosts_a_local_steps_run_from_its_settings_and_ends_on_trains_hash(
        browser_cpu, tabs, server_url):
    """The page's settings panel takes replicas, sync every, the outer rate and momentum;
    the tab host and a daisy-peer end on `daisychain train`'s hash for the same flags."""
    s = {"steps": 6, "seed": 3, "batch": 16, "micro_batch": 4, "lr": 0.003, "hidden": 16,
         "replicas": 4, "sync_every": 2, "outer_lr": 0.7, "outer_momentum": 0.9}
    flags = [w for k, v in s.items() for w in (f"--{k.replace('_', '-')}", str(v))]
    ref = subprocess.run([str(BIN / "daisychain"), "train", "--task", "text", *flags, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    want = json.loads(ref.stdout)
    host = tabs(browser_cpu, "local-host").open("create=1")
    host.wait("window.__daisy.room && window.__daisy.room.room === 'private' && window.__daisy.room.isHost")
    code = host.state("window.__daisy.room.code")
    peer = subprocess.Popen([str(BIN / "daisy-peer"), "--server", server_url, "--room", code, "--name", "py1",
                             "--json", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sel = "#approvals li[data-peer]:has-text('py1') button.approve"
        host.page.wait_for_selector(sel, timeout=120_000)
        host.page.click(sel)
        host.wait("window.__daisy.room.members.length === 2")
        host.page.select_option("#settings select[name=task]", "text")
        for k, v in s.items():
            host.page.fill(f"#settings input[name={k}]", str(v))
        host.page.click("#start")
        host.wait("window.__daisy.run.state === 'done'", 180_000)
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
    # every capacity on the run's model is in the run's tasks, a replica's rounds a second,
    # the tab's as the daisy-peer's (run_speed.js taskRate; engine/capacity.py)
    # (the daisy-peer left at the end: the tab's own row says it)
    rows = host.page.inner_text("#peers").splitlines()
    assert any("local-host" in r and "replica rounds/s (2 inner steps each) on the run's model" in r
               for r in rows), rows
    assert "replica rounds/s on the run's model" in host.page.inner_text("#pooled")
    # 2 inner steps of 4 micro-batches a round: the ready's capacity is an eighth of the rate
    tasks, micro = host.state("[window.__daisy.mesh.peer.capacity, window.__daisy.mesh.runCapacity.capacity]")
    assert tasks == pytest.approx(micro / 8), (tasks, micro)
