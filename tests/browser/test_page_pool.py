"""A tab computes on a pool of workers (issue 33, item 2): `?workers=2` starts two, the card
says so, the capacity probe measures both at once, a solo run's micro-batches are spread
over both (each computes some), and the run ends on `daisychain train`'s params-sha256; a bad
`?workers=` is refused in one line on the card and the default pool is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import open_page

pytestmark = pytest.mark.browser

CLI = Path(sys.executable).with_name("daisychain")
STEPS = 6


def test_a_two_worker_tab_ends_on_the_cli_hash(browser_nogpu, server_url):
    cli = subprocess.run([str(CLI), "train", "--task", "digits", "--steps", str(STEPS), "--seed", "0", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    page = open_page(browser_nogpu, "pool")
    page.goto(f"{server_url}/?name=pool&path=cpu&workers=2")
    page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id", timeout=120_000)
    d = page.evaluate("() => ({ workers: window.__daisy.device.workers, capacity: window.__daisy.device.capacity, "
                      "cpu: window.__daisy.device.rates.cpu })")
    assert d["workers"]["size"] == 2 and len(d["workers"]["rates"]) == 2, d
    assert d["capacity"] == sum(d["workers"]["rates"])
    assert ", 2 workers (workers=2 in the address" in page.inner_text("#device-kind")
    page.click("#create-room")
    page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    page.fill("#f-steps", str(STEPS))
    page.click("#start")
    page.wait_for_function("window.__daisy.run.state === 'done'", timeout=240_000)
    assert page.evaluate("window.__daisy.run.sha") == json.loads(cli.stdout)["params_sha256"]
    counts = page.evaluate("""async () => {
      const { computePool } = await import('/webui/shell/worker/trainer_proxy.js');
      return computePool().counts();
    }""")
    assert counts["micro"] == STEPS * 64 // 16, counts
    assert len(counts["perWorker"]) == 2 and min(counts["perWorker"]) > 0, counts
    page.close()


def test_a_bad_workers_setting_is_refused_in_one_line(browser_nogpu, server_url):
    page = open_page(browser_nogpu, "badpool")
    page.goto(f"{server_url}/?name=badpool&path=cpu&workers=abc")
    page.wait_for_function("window.__daisy && window.__daisy.device !== null", timeout=120_000)
    assert "workers=abc refused: it must be an integer from 1 to 8; using " in page.inner_text("#device-kind")
    page.close()
