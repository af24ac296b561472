"""A tab's pool of compute workers (issue 33): the micro-batches of a step of the default
CNN (image task, batch 64 = 4 micro-batches of 16) and of digits, computed by a tab with
`?workers=1` and one with `?workers=2` (WorkerTrainer.contributeAt, the call a run makes), in
alternating rounds in one Chromium; the contributions must be the same bits.

Run: ``python -m bench.browser_pool`` (writes the "browser_pool" section of
docs/BENCHMARKS.md). On a machine whose cores other processes share, the ratio is what the
cores had left.
"""

from __future__ import annotations

import os
from tqdm import tqdm

from bench._report import write_section
from bench.browser import ARGS, CHROMIUM, _serve
from daisychain.engine.threads import cores

STEP = """
async ([task, steps]) => {
  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const { loadDataset } = await import('/webui/engine/data.js');
  const { makeHyper, modelFor } = await import('/webui/engine/spec.js');
  const { initParams } = await import('/webui/engine/model.js');
  const { WorkerTrainer, computePool } = await import('/webui/shell/worker/trainer_proxy.js');
  const { sha256Hex } = await import('/webui/units/luts.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts, { tryGpu: false });
  const ds = await loadDataset(`/data/${task}.dcds`);
  const spec = modelFor(ds, null, 16);
  const hyper = makeHyper({});
  const tr = await WorkerTrainer.create({ spec, hyper, dataset: ds, luts, units: opened.wasm || opened.cpu, kind: 'cpu' });
  const theta = initParams(spec, 1);
  const ids = Array.from({ length: hyper.batch / hyper.micro_batch }, (_, j) => j);
  for (let s = 0; s < 3; s++) await tr.contributeAt(theta.slice(), 0, ids); // warm-up (JIT, each worker's module)
  const t0 = performance.now();
  let last = null;
  for (let s = 1; s <= steps; s++) last = await tr.contributeAt(theta.slice(), s, ids); // a snapshot: it is handed over
  const ms = performance.now() - t0;
  return { workers: computePool().size, units: tr.poolUnits, mbps: steps * ids.length / (ms / 1000),
    sha: await sha256Hex(new Float64Array(last.grad).buffer) };
}
"""


def main() -> None:
    from playwright.sync_api import sync_playwright

    url = _serve()
    tasks = {"image": 20, "digits": 200}
    rounds = 3
    best = {}
    bar = tqdm(total=len(tasks) * rounds * 2, desc="bench browser_pool", unit="run")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for task, steps in tasks.items():
            for _ in range(rounds):
                for n in (1, 2):
                    page = browser.new_page()
                    page.route(f"{url}/__blank*", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
                    page.goto(f"{url}/__blank?workers={n}")
                    got = page.evaluate(STEP, [task, steps])
                    page.close()
                    assert got["workers"] == n, got
                    key = (task, n)
                    if key not in best or got["mbps"] > best[key]["mbps"]:
                        best[key] = got
                    bar.update(1)
        browser.close()
    bar.close()
    rows = []
    for task in tasks:
        one, two = best[(task, 1)], best[(task, 2)]
        rows.append(f"| {task} (default model, batch 64 = 4 micro-batches), {one['units'][0]} units | "
                    f"{one['mbps']:.1f} (1.00x) | {two['mbps']:.1f} ({two['mbps'] / one['mbps']:.2f}x) | "
                    f"{'yes' if one['sha'] == two['sha'] else 'NO'} |")
    body = "\n".join([
        f"This machine has {cores()} cores (load average {os.getloadavg()[0]:.1f} at the end of the run). "
        f"Micro-batches/s of `WorkerTrainer.contributeAt` (a step's "
        f"micro-batches, split over the pool, parameters and contributions by transfer), the best of "
        f"{rounds} alternating rounds; baseline (1.00) one worker in the same run.",
        "",
        "| task | `?workers=1` micro-batches/s | `?workers=2` | same contribution bytes |",
        "|---|---|---|---|",
        *rows])
    print(body)
    write_section("browser_pool", "## A tab's pool of compute workers (Chromium)\n\n" + body,
                  "python -m bench.browser_pool")


if __name__ == "__main__":
    main()
