"""A tab's pool of compute workers (issue 33): the micro-batches of a step of the default
CNN (image task, batch 64 = 4 micro-batches of 16, and batch 256 = 16) and of digits, computed
by a tab with `?workers=1` and one with `?workers=2` (WorkerTrainer.contributeAt, the call a
run makes), in alternating rounds in one Chromium; the contributions must be the same bits.
The parameters change every step, as in a run (each worker quantizes them once per call).

Beside the micro-batches/s, the CPU time the tab's processes spent in the timed steps, read
from /proc (Linux): the workers' threads and the rest (the page, the browser). CPU time is
what the load of other processes disturbs least: a second worker that costs no more CPU per
micro-batch than one scales where it has a core of its own.

Run: ``python -m bench.browser_pool [--rounds R]`` (writes the "browser_pool" section of
docs/BENCHMARKS.md); ``--bare`` only prints the plan's CPU per micro-batch in 2 bare workers
against 1 (no pool, no messages: the pool's protocol left out); ``--timeline 64`` only prints
where a 2-worker call's wall time goes at batch 64 (the page's and the workers' spans, each
worker thread's CPU). On a machine whose cores other processes share, the ratio is what the
cores had left.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from tqdm import tqdm

from bench._proc import stat_cpu_s
from bench._report import write_section
from bench.browser import ARGS, CHROMIUM, _serve
from daisychain.engine.threads import cores

SETUP = """
async ([task, batch]) => {
  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const { loadDataset } = await import('/webui/engine/data.js');
  const { makeHyper, modelFor } = await import('/webui/engine/spec.js');
  const { initParams } = await import('/webui/engine/model.js');
  const { WorkerTrainer, computePool } = await import('/webui/shell/worker/trainer_proxy.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts, { tryGpu: false });
  const ds = await loadDataset(`/data/${task}.dcds`);
  const spec = modelFor(ds, null, 16);
  const hyper = makeHyper({ batch });
  const tr = await WorkerTrainer.create({ spec, hyper, dataset: ds, luts, units: opened.wasm || opened.cpu, kind: 'cpu' });
  const thetas = [initParams(spec, 1), initParams(spec, 2)]; // a new parameter vector every step
  const ids = Array.from({ length: hyper.batch / hyper.micro_batch }, (_, j) => j);
  for (let s = 0; s < 3; s++) await tr.contributeAt(thetas[s % 2].slice(), 0, ids); // warm-up (JIT, each worker's plan)
  window.__pool = { tr, thetas, ids, workers: computePool().size, units: tr.poolUnits };
  return true;
}
"""

STEPS = """
async ([steps, split]) => {
  const { sha256Hex } = await import('/webui/units/luts.js');
  const { tr, thetas, ids, workers, units } = window.__pool;
  tr.split = split;
  const t0 = performance.now();
  let last = null;
  for (let s = 1; s <= steps; s++) last = await tr.contributeAt(thetas[s % 2].slice(), s, ids); // a snapshot: it is handed over
  const ms = performance.now() - t0;
  return { workers, units, micro: steps * ids.length, ms, mbps: steps * ids.length / (ms / 1000),
    sha: await sha256Hex(new Float64Array(last.grad).buffer) };
}
"""


def _tree(root: int) -> list[Path]:
    """/proc directories of root's descendants (Playwright's driver, Chromium's processes)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        kids.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(Path(f"/proc/{c}"))
            todo.append(c)
    return out


def _task_stats():
    """(path, text) of every thread's /proc stat in this process's descendants."""
    for proc in _tree(os.getpid()):
        for task in proc.glob("task/*/stat"):
            try:
                yield task, task.read_text()
            except OSError:
                continue


def _cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's descendants' threads: the workers' threads
    ("DedicatedWorker") and all of them; and the workers' page faults (minor: a page's first
    touch)."""
    got = {"workers": 0.0, "all": 0.0, "faults": 0}
    for _task, text in _task_stats():
        name = text[text.index("(") + 1:text.rindex(")")]
        f = text[text.rindex(")") + 2:].split()
        s = stat_cpu_s(text)
        got["all"] += s
        if name.startswith("DedicatedWorker"):
            got["workers"] += s
            got["faults"] += int(f[7])
    return got


# `--bare`: the plan alone in 2 module workers of the page, no pool, no messages while it runs:
# what two concurrent micro-batch loops cost in CPU against one (the pool's protocol left out)
BARE_WORKER = """
const { loadLuts } = await import('/webui/units/luts.js');
const { openWasm } = await import('/webui/engine/paths.js');
const { DEFAULT_CNN, imageCnn } = await import('/webui/engine/spec.js');
const { Engine, initParams } = await import('/webui/engine/model.js');
const b = Number(new URL(self.location.href).searchParams.get('b'));
const { wasm } = await openWasm(await loadLuts('/luts/'));
const spec = imageCnn(1, 28, 28, DEFAULT_CNN, 10);
const theta = initParams(spec, 1);
let seed = 7;
const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
const x = Uint8Array.from({ length: b * 784 }, () => rnd(256));
const y = Int32Array.from({ length: b }, () => rnd(10));
const engine = new Engine(spec, wasm);
const total = new Float64Array(theta.length);
for (let i = 0; i < 20; i++) await engine.gradInto(total, theta, x, y, b, 40, 2 ** 49);
self.onmessage = async (ev) => {
  for (let i = 0; i < ev.data; i++) await engine.gradInto(total, theta, x, y, b, 40, 2 ** 49);
  self.postMessage('done');
};
self.postMessage('ready');
"""


def bare(url: str, rounds: int) -> None:
    """Print the workers' CPU ms per micro-batch of the plan alone: one worker computing n
    micro-batches, then two computing n/2 each at once; micro-batch 4 and 16."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for b, n in ((4, 240), (16, 60)):
            page = browser.new_page()
            page.route(f"{url}/__blank*", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
            page.route(f"{url}/__bare_worker.js*", lambda r: r.fulfill(body=BARE_WORKER, content_type="text/javascript"))
            page.goto(f"{url}/__blank")
            page.evaluate("""async (b) => {
              const start = () => new Promise((res) => {
                const w = new Worker(`/__bare_worker.js?b=${b}`, { type: 'module' });
                w.onmessage = (e) => { if (e.data === 'ready') res(w); };
              });
              window.bare = [await start(), await start()];
              window.loop = (w, n) => new Promise((res) => { w.onmessage = () => res(); w.postMessage(n); });
            }""", b)
            ratios = []
            for _ in range(rounds):
                c0 = _cpu()
                page.evaluate(f"() => loop(bare[0], {n})")
                c1 = _cpu()
                page.evaluate(f"() => Promise.all([loop(bare[0], {n // 2}), loop(bare[1], {n // 2})])")
                c2 = _cpu()
                one, two = (1000 * (c1["workers"] - c0["workers"]) / n, 1000 * (c2["workers"] - c1["workers"]) / n)
                ratios.append(two / one)
                print(f"micro-batch {b}: CPU ms per micro-batch, 1 worker {one:.2f}, 2 workers {two:.2f} "
                      f"({two / one:.2f}x), load {os.getloadavg()[0]:.1f}", flush=True)
            print(f"micro-batch {b}: median {statistics.median(ratios):.2f}x over {rounds} rounds")
            page.close()
        browser.close()


TIMELINE = """
async ([steps]) => {
  const { tr, thetas, ids } = window.__pool;
  tr.split = 'static';
  tr.trace = [];
  for (let s = 1; s <= steps; s++) await tr.contributeAt(thetas[s % 2].slice(), s, ids);
  const trace = tr.trace;
  tr.trace = null;
  return trace;
}
"""


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def timeline(url: str, rounds: int, batch: int, steps: int = 30) -> None:
    """Print where a 2-worker call's wall time goes (image task, `batch`): per call, the medians
    of the page's spans (WorkerTrainer.trace) and each worker thread's CPU (/proc), `rounds`
    pages of `steps` calls each. Spans are ms; the page's clock is coarsened to 0.1 ms without
    cross-origin isolation."""
    from playwright.sync_api import sync_playwright

    def threads() -> dict[str, float]:
        got = {}
        for task, text in _task_stats():
            if text[text.index("(") + 1:].startswith("DedicatedWorker"):
                got[task.parent.name] = stat_cpu_s(text)
        return got

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(rounds):
            page = browser.new_page()
            page.route(f"{url}/__blank*", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
            page.goto(f"{url}/__blank?workers=2")
            page.evaluate(SETUP, ["image", batch])
            c0 = threads()
            trace = page.evaluate(TIMELINE, [steps])
            c1 = threads()
            page.close()
            calls = {}
            for t in trace:
                calls.setdefault(t["step"], {})[t["w"]] = t
            rows = [c for _, c in sorted(calls.items()) if len(c) == 2]
            col = {k: [] for k in ("pre", "lat", "comp0", "comp1", "imb", "ret", "gap")}
            last1 = 0
            for i, c in enumerate(rows):
                a, b = c[0], c[1]
                col["pre"].append(b["post"] - a["post"])
                col["lat"].append(max(a["start"], b["start"]) - b["post"])
                col["comp0"].append(a["end"] - a["start"])
                col["comp1"].append(b["end"] - b["start"])
                col["imb"].append(abs(a["end"] - b["end"]))
                col["ret"].append(max(a["back"], b["back"]) - max(a["end"], b["end"]))
                last1 += b["end"] > a["end"]
                if i + 1 < len(rows):
                    col["gap"].append(min(t["post"] for t in rows[i + 1].values()) - max(a["back"], b["back"]))
            cpu = sorted((1000 * (c1[k] - c0.get(k, 0.0)) / len(rows) for k in c1 if c1[k] - c0.get(k, 0.0) > 0),
                         reverse=True)
            print(f"batch {batch}, 2 workers, {len(rows)} calls: " + ", ".join(f"{k} {_med(v):.2f}" for k, v in col.items())
                  + f" ms (medians); worker 1 ended last in {last1}/{len(rows)}; the workers' threads' CPU ms a call "
                  + " / ".join(f"{v:.1f}" for v in cpu) + f"; load {os.getloadavg()[0]:.1f}", flush=True)
        browser.close()


# (workers, WorkerTrainer.split): one worker; two pulling runs from one queue ("pull"); two
# with one fixed half each ("static": the default, faster on a quiet machine)
VARIANTS = [(1, "pull"), (2, "pull"), (2, "static")]


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bare", action="store_true", help="only print the plan's CPU in 2 bare workers against 1")
    ap.add_argument("--timeline", type=int, metavar="BATCH", help="only print where a 2-worker call's time goes (image task)")
    args = ap.parse_args()
    url = _serve()
    if args.bare:
        bare(url, args.rounds)
        return
    if args.timeline:
        timeline(url, args.rounds, args.timeline)
        return
    cases = [("image", 64, 20), ("image", 256, 5), ("digits", 64, 200)]  # (task, batch, timed steps)
    runs: dict[tuple, list[dict]] = {}
    load0 = os.getloadavg()[0]
    bar = tqdm(total=len(cases) * args.rounds * len(VARIANTS), desc="bench browser_pool", unit="run")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for task, batch, steps in cases:
            for _ in range(args.rounds):
                for n, split in VARIANTS:
                    page = browser.new_page()
                    page.route(f"{url}/__blank*", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
                    page.goto(f"{url}/__blank?workers={n}")
                    page.evaluate(SETUP, [task, batch])
                    c0 = _cpu()
                    got = page.evaluate(STEPS, [steps, split])
                    c1 = _cpu()
                    page.close()
                    assert got["workers"] == n, got
                    got["cpu_workers_ms"] = 1000 * (c1["workers"] - c0["workers"]) / got["micro"]
                    got["cpu_all_ms"] = 1000 * (c1["all"] - c0["all"]) / got["micro"]
                    got["faults"] = (c1["faults"] - c0["faults"]) / got["micro"]
                    runs.setdefault((task, batch, n, split), []).append(got)
                    bar.update(1)
        browser.close()
    bar.close()
    rows = []
    for task, batch, _ in cases:
        one, two, fixed = (runs[(task, batch, n, split)] for n, split in VARIANTS)
        b1, b2, b3 = (max(rs, key=lambda r: r["mbps"]) for rs in (one, two, fixed))
        paired = statistics.median(t["mbps"] / o["mbps"] for o, t in zip(one, two))
        paired3 = statistics.median(t["mbps"] / o["mbps"] for o, t in zip(one, fixed))
        cw1, cw2 = (statistics.median(r["cpu_workers_ms"] for r in rs) for rs in (one, two))
        ca1, ca2 = (statistics.median(r["cpu_all_ms"] for r in rs) for rs in (one, two))
        f1, f2 = (statistics.median(r["faults"] for r in rs) for rs in (one, two))
        same = all(r["sha"] == one[0]["sha"] for r in one + two + fixed)
        rows.append(f"| {task}, batch {batch} = {batch // 16} micro-batches, {b1['units'][0]} units | "
                    f"{b1['mbps']:.1f} (1.00x) | {b2['mbps']:.1f} ({b2['mbps'] / b1['mbps']:.2f}x) | {paired:.2f}x | "
                    f"{b3['mbps']:.1f} ({b3['mbps'] / b1['mbps']:.2f}x), {paired3:.2f}x | "
                    f"{cw1:.2f} / {ca1:.2f} | {cw2:.2f} / {ca2:.2f} ({cw2 / cw1:.2f}x) | {f1:.0f} / {f2:.0f} | "
                    f"{'yes' if same else 'NO'} |")
    body = "\n".join([
        f"This machine has {cores()} cores (1-minute load average {load0:.1f} at the start of the run, "
        f"{os.getloadavg()[0]:.1f} at the end). Micro-batches/s of `WorkerTrainer.contributeAt` (a step's "
        f"micro-batches split over the pool; a new parameter vector every step, as in a run), the best of "
        f"{args.rounds} alternating rounds, and the median of the rounds' ratios (each round runs one "
        f"worker, then two that pull runs of micro-batches from one queue, then two with one fixed half "
        f"each: `WorkerTrainer.split` \"static\", the default); baseline (1.00) one worker in the same run. CPU: ms of CPU time per "
        f"micro-batch in the timed steps (median of the rounds), the workers' threads / every process of "
        f"the browser (/proc); page faults: the workers' threads' minor faults per micro-batch (a page's first touch), 1 / 2 workers.",
        "",
        "| run | `?workers=1` micro-batches/s | `?workers=2`, pulling runs | median of the rounds' ratios | 2 workers, a fixed half each (the default): best, median ratio | CPU ms per micro-batch, 1 worker: workers / all | 2 workers | page faults | same contribution bytes |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows])
    print(body)
    write_section("browser_pool", "## A tab's pool of compute workers (Chromium)\n\n" + body,
                  f"python -m bench.browser_pool --rounds {args.rounds}")


if __name__ == "__main__":
    main()
