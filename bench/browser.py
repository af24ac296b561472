"""Browser engine speed: unit-GEMM GOP/s and micro-batch rate of the WebGPU kernels, the
WebAssembly SIMD kernels and the JS units inside headless Chromium, against the numpy engine, as ratios from one run.

Run: ``python -m bench.browser`` (writes the "browser" section of docs/BENCHMARKS.md).
WebGPU here is whatever adapter Chromium finds; on a machine without a GPU that is
SwiftShader (a CPU emulation), so the JS units may well beat it.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # numpy / torch: one thread
    os.environ.setdefault(_var, "1")

import asyncio  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from aiohttp import web  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._report import write_section  # noqa: E402
from daisychain.engine.data import TASKS, model_for, prepare_task  # noqa: E402
from daisychain.engine.spec import Hyper  # noqa: E402
from daisychain.engine.trainer import Trainer  # noqa: E402
from bench._chromium import BASE_ARGS, CHROMIUM, WEBGPU_ARGS  # noqa: E402
from daisychain.server.app import create_app  # noqa: E402
from daisychain.server.config import ServerConfig  # noqa: E402
from daisychain.units import gemm_fast, gemm_lut, load_luts  # noqa: E402

ARGS = BASE_ARGS + WEBGPU_ARGS
SHAPES = [(64, 256, 64), (256, 256, 256)]
#: per task: (warm-up steps, timed steps), the same on both sides (the page's `warm=`, numpy's
#: warm-up). A digits or text step is ~1 ms: its JS reaches V8's optimizing tier only after tens
#: of steps, so 5 warm-up steps timed the page's cold code (a run is 600 steps); an image step
#: is ~25 ms and warm after a few.
RUNS = {"digits": (40, 60), "text": (40, 60), "image": (5, 20)}
PAGE_PATHS = ("gpu", "wasm", "js")  # /selftest?path=: WebGPU, the WASM kernels, the JS units

RATES = """
async ([shapes]) => {
  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const { gemmRate, microBatchRate } = await import('/webui/engine/conformance.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts);
  const out = { adapter: opened.gpu ? opened.gpu.adapterInfo : null, reason: opened.gpuReason, paths: {} };
  out.wasmReason = opened.wasmReason;
  for (const [name, units] of [['gpu', opened.gpu], ['wasm', opened.wasm], ['cpu', opened.cpu]]) {
    if (!units) continue;
    const r = { gemm: [] };
    for (const [m, k, n] of shapes) r.gemm.push(await gemmRate(units, { m, k, n, minMs: 1000 }));
    r.micro_batch_rate = await microBatchRate(units, { minMs: 1500 });
    out.paths[name] = r;
  }
  return out;
}
"""


def blank_page(browser, url: str):
    """A new page of ``browser`` on an empty document of the server at ``url`` (the page's
    origin, so its modules import from /webui/)."""
    page = browser.new_page()
    page.route(f"{url}/__blank", lambda r: r.fulfill(body="<!doctype html>", content_type="text/html"))
    page.goto(f"{url}/__blank")
    return page


def _serve():
    """The real server app (it serves /data/<task>.dcds), on 127.0.0.1:<random> in a thread."""
    app = create_app(ServerConfig(port=0))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    return asyncio.run_coroutine_threadsafe(start(), loop).result(60)


def _numpy_gemm_gops(shape, fn, luts, min_s=1.0) -> float:
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    fn(a, b, luts)
    runs, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s or runs < 2:
        fn(a, b, luts)
        runs += 1
    return 2 * m * k * n * runs / (time.perf_counter() - t0) / 1e9


def _numpy_train_rate(task: str) -> float:
    ds = prepare_task(task)
    hp = Hyper(seed=3)
    tr = Trainer(model_for(ds), hp, ds, load_luts())
    ids = list(range(hp.n_micro))
    warm, steps = RUNS[task]
    for _ in range(warm):  # warm-up: the compiled kernels' caches load on the first steps
        tr.apply(tr.contribute(ids).grad)
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.apply(tr.contribute(ids).grad)
    return steps * hp.n_micro / (time.perf_counter() - t0)


def main() -> None:
    from playwright.sync_api import sync_playwright

    luts = load_luts()
    stages = ["server", "page rates", *[f"page train {t} {p}" for t in TASKS for p in PAGE_PATHS],
              "numpy GEMM", *[f"numpy train {t}" for t in TASKS]]
    bar = tqdm(stages, desc="bench browser", unit="stage")
    bar.set_postfix_str("server")
    url = _serve()
    bar.update(1)
    train = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        bar.set_postfix_str("page rates")
        rates = page.evaluate(RATES, [SHAPES])
        bar.update(1)
        for task in TASKS:
            for path in PAGE_PATHS:
                bar.set_postfix_str(f"{task} {path}")
                warm, steps = RUNS[task]
                page.goto(f"{url}/selftest?task={task}&steps={warm + steps}&warm={warm}&seed=3&path={path}")
                page.wait_for_function("window.__selftestDone === true", timeout=600_000)
                train[(task, path)] = page.evaluate("window.__selftest.training")
                bar.update(1)
        browser.close()
    bar.set_postfix_str("numpy GEMM")
    np_gemm = {s: (_numpy_gemm_gops(s, gemm_fast, luts), _numpy_gemm_gops(s, gemm_lut, luts)) for s in SHAPES}
    bar.update(1)
    np_train = {}
    for task in TASKS:
        bar.set_postfix_str(f"numpy {task}")
        np_train[task] = _numpy_train_rate(task)
        bar.update(1)
    bar.close()

    adapter = rates["adapter"] or {}
    gpu_name = f"{adapter.get('vendor', '?')} {adapter.get('architecture', '')}".strip() if rates["adapter"] else \
        f"none ({rates['reason']})"
    lines = [f"WebGPU adapter: {gpu_name}. WebAssembly SIMD: {rates['wasmReason'] or 'yes'}. Baseline (1.00) is "
             f"the numpy engine in the same run (`gemm_fast`: exact float BLAS; `gemm_lut`: every product "
             f"from the table); one thread everywhere.", "",
             "| unit GEMM (M x K x N) | numpy fast GOP/s | numpy lut | JS units (page) | WASM SIMD (page) | WebGPU (page) |",
             "|---|---|---|---|---|---|"]
    for i, s in enumerate(SHAPES):
        fast, lut = np_gemm[s]
        cells = []
        for path in ("cpu", "wasm", "gpu"):
            r = rates["paths"].get(path)
            cells.append(f"{r['gemm'][i]['gops']:.3f} ({r['gemm'][i]['gops'] / fast:.3f}x)" if r else "n/a")
        lines.append(f"| {s[0]} x {s[1]} x {s[2]} | {fast:.3f} (1.00x) | {lut:.3f} ({lut / fast:.3f}x) | "
                     f"{' | '.join(cells)} |")
    lines += ["", "| micro-batches/s (batch 64 = 4 micro-batches of 16, default model) | numpy engine | JS units (page) | WASM SIMD (page) | WebGPU (page) |",
              "|---|---|---|---|---|"]
    for task in TASKS:
        base = np_train[task]
        cells = []
        for path in ("js", "wasm", "gpu"):
            t = train[(task, path)]
            ok = t and (t.get("path_used") == "gpu" if path == "gpu" else t.get("cpu_units") == path)
            rate = t["micro_batches_per_s_after_warm"] if ok else 0
            cells.append(f"{rate:.1f} ({rate / base:.3f}x)" if ok else "n/a")
        warm, steps = RUNS[task]
        lines.append(f"| {task}, {steps} training steps in /selftest after {warm} | {base:.1f} (1.00x) | {' | '.join(cells)} |")
    lines += ["", "Every rate above leaves out the first steps named in its row (numpy's warm-up; the page's "
              "first steps make the resident plan, run the engine's code for the first time and wait for "
              "V8 to optimize it). Over all steps, the warm-up included, the page's rates were: " + "; ".join(
                  f"{task} " + ", ".join(f"{path} {train[(task, path)]['micro_batches_per_s']:.1f}"
                                          for path in ("js", "wasm", "gpu") if train[(task, path)])
                  for task in TASKS) + "."]
    for path in ("cpu", "wasm", "gpu"):
        r = rates["paths"].get(path)
        if r:
            lines.append(f"\nSelf-test capacity figure ({path}, synthetic digits micro-batch): "
                         f"{r['micro_batch_rate']:.1f} micro-batches/s.")
    same = all(train[(t, p)]["params_sha256"] == train[(t, "js")]["params_sha256"] for t in TASKS for p in PAGE_PATHS)
    lines.append(f"\nThe WebGPU, WASM and JS runs ended with {'the same' if same else 'DIFFERENT'} params-sha256 per task.")
    body = "\n".join(lines)
    print(body)
    write_section("browser", "## Browser engine (WebGPU, WASM SIMD and JS units in Chromium)\n\n" + body,
                  "python -m bench.browser")


if __name__ == "__main__":
    main()
