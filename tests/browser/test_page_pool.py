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


# The modules, tables, units (WASM where it opens), digits and its model both snippets below use.
SETUP = """  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const { loadDataset } = await import('/webui/engine/data.js');
  const { makeHyper, modelFor } = await import('/webui/engine/spec.js');
  const { initParams } = await import('/webui/engine/model.js');
  const { Trainer } = await import('/webui/engine/trainer.js');
  const { WorkerTrainer, computePool } = await import('/webui/shell/worker/trainer_proxy.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts, { tryGpu: false });
  const units = opened.wasm || opened.cpu;
  const ds = await loadDataset('/data/digits.dcds');
  const spec = modelFor(ds, null, 16);
"""

# A WorkerTrainer on `?workers=2` against the page's own Trainer (same units) on several
# parameter snapshots and steps, each call twice: the arrays that come back from the workers
# (a parameter copy, a contribution still holding its sums) are handed out again.
REUSE = """async () => {
""" + SETUP + """  const hyper = makeHyper({});
  const tr = await WorkerTrainer.create({ spec, hyper, dataset: ds, luts, units, kind: 'cpu' });
  const ref = await Trainer.create({ spec, hyper, dataset: ds, luts, units });
  const ids = [0, 1, 2, 3];
  const bytes = (r) => [Array.from(new Uint8Array(r.grad.buffer, r.grad.byteOffset, r.grad.byteLength)).join(),
    Array.from(r.loss).join(), Array.from(r.correct).join()].join('|');
  const out = { same: [], spares: [], workers: computePool().size };
  for (const [seed, step] of [[1, 0], [2, 5], [3, 9]]) {
    const theta = initParams(spec, seed);
    const want = bytes(await ref.contribute(ids, step, theta));
    for (let k = 0; k < 2; k++) {
      out.same.push(bytes(await tr.contributeAt(theta.slice(), step, ids)) === want);
      out.spares.push((tr.spares || []).length);
    }
  }
  out.micro = (await computePool().counts()).perWorker;
  // a traced call (bench/browser_pool.py --timeline): one share a worker, each span in order
  tr.trace = [];
  await tr.contributeAt(initParams(spec, 1), 7, ids);
  out.trace = tr.trace.map((t) => [t.w, t.step, t.start <= t.end && t.post <= t.back]).sort();
  tr.trace = null;
  return out;
}"""


def test_the_pools_arrays_come_back_and_keep_the_bits(browser_nogpu, server_url):
    page = open_page(browser_nogpu, "reuse")
    page.route(f"{server_url}/__blank*", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
    page.goto(f"{server_url}/__blank?workers=2")
    got = page.evaluate(REUSE)
    page.close()
    assert got["workers"] == 2 and got["same"] == [True] * 6, got
    assert min(got["micro"]) > 0, got  # both workers computed
    assert got["trace"] == [[0, 7, True], [1, 7, True]], got
    # every call after the first finds the arrays of the one before: the count stays put
    assert got["spares"][0] > 0 and len(set(got["spares"][1:])) == 1, got


# Worker 0 busy with the capacity probe (>= 300 ms) while a call of 16 micro-batches comes:
# worker 1 pulls the runs that worker 0 cannot take yet (a static half each would leave it 8).
# It is the trainer's first call: the micro-batch's cost is unknown, the runs the finest (pullRun).
BUSY = """async () => {
""" + SETUP + """  const hyper = makeHyper({ batch: 256 });
  const tr = await WorkerTrainer.create({ spec, hyper, dataset: ds, luts, units, kind: 'cpu' });
  tr.split = 'pull'; // the default is 'static' (faster on a quiet machine)
  const ref = await Trainer.create({ spec, hyper, dataset: ds, luts, units });
  const ids = Array.from({ length: 16 }, (_, j) => j);
  const theta = initParams(spec, 4);
  const want = await ref.contribute(ids, 3, theta);
  const pool = computePool();
  const before = (await pool.counts()).perWorker;
  const busy = pool.workers[0].post('rate', { luts: { ...luts }, cpuPath: units.name === 'wasm' ? 'wasm' : 'js' });
  const got = await tr.contributeAt(theta.slice(), 3, ids);
  await busy;
  const after = (await pool.counts()).perWorker;
  const same = (a, b) => a.length === b.length && a.every((v, i) => Object.is(v, b[i]));
  return { perCall: after.map((v, w) => v - before[w]),
    same: same(got.grad, want.grad) && same(got.loss, want.loss) && same(got.correct, want.correct) };
}"""


def test_a_busy_worker_leaves_its_micro_batches_to_the_other(browser_nogpu, server_url):
    page = open_page(browser_nogpu, "busy")
    page.route(f"{server_url}/__blank*", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
    page.goto(f"{server_url}/__blank?workers=2")
    got = page.evaluate(BUSY)
    page.close()
    assert got["same"], got
    assert sum(got["perCall"]) == 16 and got["perCall"][1] > 8, got
