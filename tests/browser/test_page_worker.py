"""The page computes in a Web Worker (webui/shell/worker/): a tab that trains alone hands every
micro-batch to the worker, computes none on its main thread, and ends on the same
params-sha256 as `daisychain train` (issue 23, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import open_page

pytestmark = pytest.mark.browser

CLI = Path(sys.executable).with_name("daisychain")
STEPS = 12

# Counts the unit calls made on the page's main thread (the self-test's are done by then).
COUNT_MAIN = """() => {
  const d = window.__daisy.mesh.device;
  window.__mainCalls = 0;
  for (const u of [d.units, d.cpu]) for (const k of ["gemm", "requantize", "mul", "relu"]) {
    const f = u[k].bind(u);
    u[k] = (...a) => { window.__mainCalls++; return f(...a); };
  }
  window.__longest = 0;
  new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__longest = Math.max(window.__longest, e.duration); })
    .observe({ type: "longtask", buffered: false });
}"""


def solo_run(page, base: str, steps: int, layers: str = "") -> None:
    """A tab alone in a private room runs `steps` steps of digits (the form's defaults)."""
    page.goto(f"{base}/?name=solo&path=cpu")
    page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id", timeout=120_000)
    page.click("#create-room")
    page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    page.fill("#f-steps", str(steps))
    page.fill("#f-layers", layers)
    page.evaluate(COUNT_MAIN)
    page.click("#start")


def test_a_solo_tab_computes_in_the_worker_with_the_cli_hash(cpu_page, server_url):
    cli = subprocess.run([str(CLI), "train", "--task", "digits", "--steps", str(STEPS), "--seed", "0",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)
    solo_run(cpu_page, server_url, STEPS)
    cpu_page.wait_for_function("window.__daisy.run.state === 'done'", timeout=180_000)
    run = cpu_page.evaluate("() => ({sha: window.__daisy.run.sha, step: window.__daisy.run.step})")
    assert run == {"sha": want["params_sha256"], "step": STEPS}
    counts = cpu_page.evaluate("""async () => {
      const { computePool } = await import('/webui/shell/worker/trainer_proxy.js');
      return computePool().counts();  // summed over the pool (one worker on a 2-core machine)
    }""")
    assert counts["micro"] == STEPS * 64 // 16, counts
    assert counts["accuracy"] >= 1, counts
    assert cpu_page.evaluate("window.__mainCalls") == 0
    assert cpu_page.evaluate("window.__daisy.mesh.peer.trainer.constructor.name") == "WorkerTrainer"


def test_a_webgpu_tab_computes_on_webgpu_in_the_worker_with_the_cli_hash(gpu_page, server_url):
    cli = subprocess.run([str(CLI), "train", "--task", "digits", "--steps", "3", "--seed", "0", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    gpu_page.goto(f"{server_url}/?name=gpu&path=gpu")
    gpu_page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id", timeout=120_000)
    assert gpu_page.evaluate("window.__daisy.device.kind") == "webgpu"
    gpu_page.click("#create-room")
    gpu_page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    gpu_page.fill("#f-steps", "3")
    gpu_page.click("#start")
    gpu_page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 3", timeout=300_000)
    tr = "window.__daisy.mesh.peer.trainer"
    assert gpu_page.evaluate(f"[{tr}.workerUnits, {tr}.workerGpuReason]") == ["gpu", None]
    assert gpu_page.evaluate("window.__daisy.run.sha") == json.loads(cli.stdout)["params_sha256"]
