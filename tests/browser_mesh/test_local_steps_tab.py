"""Local steps in a tab (engine/local.js, the tab's run protocol): a Chromium tab on the CPU
units joins a `daisy-peer`-hosted run with `--replicas 4 --sync-every 2`, computes replica
rounds on the page, loads the round state it is sent, and ends on `daisychain train`'s
hash like the daisy-peer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mesh_helpers import needs_netns

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
    err = (tmp_path / "host.err").open("w+")
    host = subprocess.Popen([str(BIN / "daisy-peer"), "--server", server_url, "--create-room", "--approve",
                             "all", "--wait-peers", "1", "--name", "py-host", "--json", *RUN],
                            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        code, t0 = None, time.monotonic()
        while code is None and time.monotonic() - t0 < 60 and host.poll() is None:
            err.seek(0)
            m = re.search(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})", err.read())
            code = m.group(1) if m else None
            time.sleep(0.2)
        assert code, (tmp_path / "host.err").read_text()[-2000:]
        tab = tabs(browser_cpu, "local-tab").open(f"room={code}")
        tab.wait("window.__daisy.run && window.__daisy.run.state === 'done'", 180_000)
        out, _ = host.communicate(timeout=120)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(10)
        err.close()
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
