"""How close is a tab's capacity on the run's model (webui/shell/run_speed.js: forward passes
timed in the compute worker, a micro-batch's forward and backward counted as three) to a
full micro-batch's rate on the same model (engine/conformance.js microBatchRate: forward,
backward and contribution, on the page's thread)? And how far off was the self-test's
digits probe, which the split used before (issue 36 item 5)? One tab of the page (JS units)
hosts a 2-step image run per model, then measures microBatchRate on the run's spec.

Run: ``scripts/in-netns.sh .venv/bin/python -m bench.run_capacity`` (writes the
"run_capacity" section of docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse

from playwright.sync_api import sync_playwright

from bench._chromium import BASE_ARGS, CHROMIUM
from bench._report import write_section
from bench.browser import _serve

ARGS = BASE_ARGS
MEASURE = """async () => {
  const { microBatchRate } = await import('/webui/engine/conformance.js');
  const tr = window.__daisy.mesh.peer.trainer;
  const full = await microBatchRate(window.__daisy.mesh.device.units, { spec: tr.spec, minMs: 2000 });
  return { estimate: window.__daisy.device.runCapacity, full, probe: window.__daisy.device.capacity };
}"""


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    models = ["", "conv4,pool,16", "conv8,pool,conv16,pool"]
    base = _serve()
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for layers in models:
            page = browser.new_page()
            page.goto(f"{base}/?name=bench&path=cpu")
            page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id && "
                                   "window.__daisy.datasetsLoaded", timeout=180_000)
            page.click("#create-room")
            page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
            page.select_option("#f-task", "image")
            page.fill("#f-steps", "2")
            page.fill("#f-layers", layers)
            page.click("#start")
            page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 2", timeout=600_000)
            r = page.evaluate(MEASURE)
            rows.append((layers or "the default CNN (conv16,pool,conv32,pool,conv64,pool)", r))
            print(rows[-1], flush=True)
            page.close()
        browser.close()
    body = ["One tab (JS units, no WebGPU), the embedded MNIST (28 x 28), micro-batches of 16. "
            "The estimate is what the tab sends as its capacity when the run starts; the full rate is "
            "microBatchRate on the same spec and units (2 s of forward + backward + contribution); the "
            "probe is the self-test's digits MLP, the capacity the split used before. A shared 2-core "
            "machine: the numbers are noisy, the ratios within one run are the point.", "",
            "| model | estimate (micro-batches/s) | full rate | estimate / full | probe | probe / full |",
            "|---|---|---|---|---|---|"]
    for name, r in rows:
        body.append(f"| {name} | {r['estimate']:.1f} | {r['full']:.1f} | {r['estimate'] / r['full']:.2f}x | "
                    f"{r['probe']:.1f} | {r['probe'] / r['full']:.0f}x |")
    write_section("run_capacity", "## A tab's capacity on the run's model (bench/run_capacity.py)\n\n" + "\n".join(body),
                  "scripts/in-netns.sh .venv/bin/python -m bench.run_capacity")


if __name__ == "__main__":
    main()
