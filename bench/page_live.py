"""Does a tab that trains alone stay live? One tab of the page (JS units) in a private room of
its own runs `--steps` steps of digits with `--layers`; Playwright asks the page for its step
every 0.25 s and times each answer, and a PerformanceObserver records the main thread's long
tasks (over 50 ms). The baseline, in the same run: the same tab with the compute on the main
thread (the page without module workers: `Worker` removed before Start), for
`--baseline-steps` steps.

Run: ``scripts/in-netns.sh .venv/bin/python -m bench.page_live --steps 6000 --layers 256,256``
(writes the "page_live" section of docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import time

from playwright.sync_api import sync_playwright

from bench._chromium import BASE_ARGS, CHROMIUM
from bench._report import write_section
from bench.browser import _serve

ARGS = BASE_ARGS

OBSERVE = """(noWorker) => {
  window.__long = [];
  new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__long.push([e.startTime, e.duration, window.__daisy.run.step, window.__daisy.run.state]); })
    .observe({ type: "longtask", buffered: false });
  if (noWorker) window.Worker = undefined;
}"""


def one_run(browser, base: str, steps: int, layers: str, worker: bool, verbose: bool = False) -> dict:
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(f"{base}/?name=bench&path=cpu")
    page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id", timeout=180_000)
    page.click("#create-room")
    page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    page.fill("#f-steps", str(steps))
    page.fill("#f-layers", layers)
    page.evaluate(OBSERVE, not worker)
    t0 = time.perf_counter()
    page.click("#start")  # Playwright's click returns once the page has handled it
    answers = [time.perf_counter() - t0]
    while True:
        t = time.perf_counter()
        st = page.evaluate("() => [window.__daisy.run.state, window.__daisy.run.step]")
        answers.append(time.perf_counter() - t)
        if st[0] == "done" and st[1] == steps:
            break
        time.sleep(0.25)
    wall = time.perf_counter() - t0
    long = page.evaluate("window.__long")
    sha = page.evaluate("window.__daisy.run.sha")
    ctx.close()
    if verbose:
        print(long)
    long = [d for _, d, _, _ in long]
    return {"steps": steps, "wall": wall, "answers": answers, "long": long, "sha": sha}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--baseline-steps", type=int, default=300)
    ap.add_argument("--layers", default="256,256")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print every long task [start ms, ms, step, state]")
    a = ap.parse_args(argv)
    base = _serve()
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for label, steps, worker in (("compute in the worker (this page)", a.steps, True),
                                         ("compute on the main thread (baseline)", a.baseline_steps, False)):
                r = one_run(browser, base, steps, a.layers, worker, a.verbose)
                print(label, {k: v for k, v in r.items() if k not in ("answers", "long")},
                      "max answer", max(r["answers"]), "longest task", max(r["long"], default=0))
                rows.append((label, r))
        finally:
            browser.close()
    lines = [f"One tab alone, digits, `--layers {a.layers}`, JS units, in a private room of its own. "
             "Playwright asks the page for its step every 0.25 s from the click on Start to the end card and times each answer; "
             "a PerformanceObserver records the main thread's long tasks (over 50 ms).", "",
             "| compute | steps | run s | steps/s | answers | slowest answer s | long tasks | longest task ms |",
             "|---|---|---|---|---|---|---|---|"]
    for label, r in rows:
        lines.append(f"| {label} | {r['steps']} | {r['wall']:.1f} | {r['steps'] / r['wall']:.1f} | "
                     f"{len(r['answers'])} | {max(r['answers']):.3f} | {len(r['long'])} | "
                     f"{max(r['long'], default=0):.0f} |")
    (_, w), (_, m) = rows
    lines += ["", f"Steps/s of the worker run: {w['steps'] / w['wall'] / (m['steps'] / m['wall']):.2f}x the baseline's "
              "(each step is a round trip of messages to the worker, and the page draws while it trains). "
              "What stays on the page's main thread each step: the run protocol (webui/run/), the Adam step and the "
              "parameter hash (webui/run/ reads the replica's state synchronously), the messages to and from the "
              "worker (a snapshot of the parameters goes with each compute), and drawing. Long tasks are wall time on a shared "
              "machine: a task waiting for a core counts."]
    if not a.no_write:
        write_section("page_live", "## A tab that trains alone stays live (bench/page_live.py)\n\n" + "\n".join(lines),
                      f"scripts/in-netns.sh .venv/bin/python -m bench.page_live --steps {a.steps} "
                      f"--baseline-steps {a.baseline_steps} --layers {a.layers}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
