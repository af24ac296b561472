"""The image kernels in the browser: the WebAssembly SIMD kernels (webui/wasm) and the WGSL
kernels (im2col, col2im, maxpool, maxpool_back) against the JS units (webui/units/conv.js) inside headless Chromium, per call on the shapes of the
default CNN (1x28x28, conv16,pool,conv32,pool,conv64,pool, micro-batch 16), plus the whole
micro-batch (forward + backward + fixed-point contribution) of that CNN on both paths and in
the numpy engine. Ratios are against the JS units measured in the same run.

Run: ``python -m bench.browser_conv`` (writes the "browser_conv" section of
docs/BENCHMARKS.md). WebGPU here is whatever adapter Chromium finds; on a machine without a
GPU that is SwiftShader (a CPU emulation), where every dispatch also pays an upload and a
read-back of its buffers.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # numpy / torch: one thread
    os.environ.setdefault(_var, "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._report import write_section  # noqa: E402
from bench.browser import ARGS, CHROMIUM, blank_page  # noqa: E402
from daisychain.engine.model import Engine, init_params  # noqa: E402
from daisychain.engine.spec import DEFAULT_CNN, Hyper, cnn  # noqa: E402
from daisychain.engine.trainer import grad_limit  # noqa: E402
from daisychain.units import load_luts  # noqa: E402

B = 16  # micro-batch
ROUNDS = 5  # numpy's and the page's WASM micro-batch in turn, ROUND_S each
ROUND_S = 0.5
IMAGE = (1, 28, 28)

KERNELS = """
async ([b, image, items, minMs]) => {
  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const S = await import('/webui/engine/spec.js');
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts);
  let seed = 12345;
  const rnd = (lo, hi) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return lo + (seed >>> 8) % (hi - lo); };
  const spec = S.imageCnn(image[0], image[1], image[2], items, 10);
  const cases = [];
  for (const l of spec.layers) {
    if (l.type === 'conv2d') {
      const g = l.geom;
      const a = Int32Array.from({ length: b * g.ci * g.h * g.w }, () => rnd(0, 128));
      const d = Int32Array.from({ length: b * g.h * g.w * g.ci * g.k * g.k }, () => rnd(-2000000, 2000000));
      const name = `${g.ci}x${g.h}x${g.w} k${g.k}`;
      cases.push([`im2col ${name} -> ${b * g.h * g.w} x ${g.ci * g.k * g.k}`, (u) => u.im2col(a, b, g)]);
      cases.push([`col2im ${b * g.h * g.w} x ${g.ci * g.k * g.k} -> ${name}`, (u) => u.col2im(d, b, g)]);
    } else if (l.type === 'maxpool2d') {
      const g = l.geom;
      const a = Int32Array.from({ length: b * g.c * g.h * g.w }, () => rnd(-3, 4));
      const e = Int32Array.from({ length: b * g.c * (g.h >> 1) * (g.w >> 1) }, () => rnd(-127, 128));
      cases.push([`maxpool ${g.c}x${g.h}x${g.w}`, (u) => u.maxpool(a, b, g)]);
      cases.push([`maxpool backward ${g.c}x${g.h}x${g.w}`, (u) => u.maxpoolBack(e, a, b, g)]);
    }
  }
  const theta = initParams(spec, 1);
  const x = Uint8Array.from({ length: b * image[0] * image[1] * image[2] }, () => rnd(0, 256));
  const y = Int32Array.from({ length: b }, () => rnd(0, 10));
  cases.push(['micro-batch of the CNN (forward + backward)', async (u) => {
    const total = new Float64Array(theta.length);
    await new Engine(spec, u).gradInto(total, theta, x, y, b, 40, 2 ** 49);
    return total;
  }]);
  if (opened.wasm) { // the WASM micro-batch again, for rounds interleaved with numpy's (main below)
    const mb = cases[cases.length - 1][1];
    window.__wasmMicroBatchMs = async (minMs) => {
      let runs = 0;
      const t0 = performance.now();
      while (performance.now() - t0 < minMs || runs < 2) { await mb(opened.wasm); runs++; }
      return (performance.now() - t0) / runs;
    };
  }
  const out = { adapter: opened.gpu ? opened.gpu.adapterInfo : null, reason: opened.gpuReason,
    wasmReason: opened.wasmReason, rows: [] };
  for (const [name, fn] of cases) {
    const row = { name, ms: {}, same: true };
    let ref = null;
    const paths = ['cpu', 'wasm', 'gpu'].filter((p) => opened[p]);
    for (const path of paths) { // warm up (pipeline, JIT); the outputs' bytes are compared
      const first = await fn(opened[path]);
      if (ref === null) ref = first;
      else row.same = row.same && first.length === ref.length && first.every((v, i) => v === ref[i]);
    }
    for (let round = 0; round < 3; round++) { // alternating rounds, best of each path
      for (const path of paths) {
        let runs = 0;
        const t0 = performance.now();
        while (performance.now() - t0 < minMs / 3 || runs < 2) { await fn(opened[path]); runs++; }
        row.ms[path] = Math.min(row.ms[path] ?? Infinity, (performance.now() - t0) / runs);
      }
    }
    out.rows.push(row);
  }
  return out;
}
"""


def _numpy_micro_batch_ms(min_s: float = 1.5) -> float:
    """The numpy engine's micro-batch of the same CNN (gradient contribution, its compiled
    image path where numba and torch are there), one thread, ms per call."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    spec = cnn(IMAGE, DEFAULT_CNN, 10)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, B, int(np.prod(IMAGE)))).astype(np.uint8)
    y = rng.integers(0, 10, (1, B)).astype(np.int64)
    eng = Engine(spec, load_luts())
    theta = init_params(spec, 1)
    hp = Hyper()
    eng.grad(theta, x, y, hp.grad_frac_bits, grad_limit(hp))
    runs, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s or runs < 2:
        eng.grad(theta, x, y, hp.grad_frac_bits, grad_limit(hp))
        runs += 1
    return (time.perf_counter() - t0) / runs * 1000


def main() -> None:
    from playwright.sync_api import sync_playwright

    from bench.browser import _serve

    bar = tqdm(["numpy", "server", "page", "numpy"], desc="bench browser_conv", unit="stage")
    np_before = _numpy_micro_batch_ms()
    bar.update(1)
    url = _serve()
    bar.update(1)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        res = page.evaluate(KERNELS, [B, list(IMAGE), list(DEFAULT_CNN), 800])
        turns = []  # (numpy ms, WASM ms) per round, measured back to back under about the same load
        for _ in range(ROUNDS if not res["wasmReason"] else 0):
            turns.append((_numpy_micro_batch_ms(ROUND_S), page.evaluate("(m) => window.__wasmMicroBatchMs(m)", ROUND_S * 1000)))
        browser.close()
    bar.update(1)
    np_ms = min(np_before, _numpy_micro_batch_ms())
    bar.update(1)
    bar.close()

    adapter = res["adapter"] or {}
    gpu_name = f"{adapter.get('vendor', '?')} {adapter.get('architecture', '')}".strip() if res["adapter"] else \
        f"none ({res['reason']})"
    lines = [f"WebGPU adapter: {gpu_name}. WebAssembly SIMD: {'yes' if not res['wasmReason'] else res['wasmReason']}. "
             f"Shapes of the default CNN ({'x'.join(map(str, IMAGE))}, "
             f"{','.join(DEFAULT_CNN)}), micro-batch {B}. Baseline (1.00) is the JS units in the same run; "
             "a WebGPU call includes its upload and read-back, a WASM call its copies in and out of the "
             "module's memory; the micro-batch row runs each path's resident plan where it has one (WASM: "
             "the micro-batch kept in the module's memory; WebGPU: on the GPU). Each figure: the best of 3 "
             "alternating rounds.", "",
             "| kernel (one call) | JS units ms (baseline) | WASM SIMD ms | WASM vs JS | WebGPU ms | WebGPU vs JS | same bytes |",
             "|---|---|---|---|---|---|---|"]

    def cell(ms, base):
        return f"{ms:.2f} | {base / ms:.2f}x" if ms else "n/a | n/a"

    for r in res["rows"]:
        cpu = r["ms"].get("cpu")
        lines.append(f"| {r['name']} | {cpu:.2f} (1.00x) | {cell(r['ms'].get('wasm'), cpu)} | "
                     f"{cell(r['ms'].get('gpu'), cpu)} | {'yes' if r['same'] else 'NO'} |")
    mb = res["rows"][-1]["ms"]
    lines.append(f"\nThe numpy engine's micro-batch of the same CNN (one thread, its compiled image path; the "
                 f"best of a run before and one after the browser's): {np_ms:.2f} ms. Against it the tab's CPU "
                 f"path computes at {np_ms / mb['cpu']:.3f}x on the JS units"
                 + (f" and {np_ms / mb['wasm']:.3f}x on WebAssembly SIMD." if mb.get("wasm") else "."))
    if turns:
        ratios = sorted(n / w for n, w in turns)
        lines.append(f"\nInterleaved ({ROUNDS} rounds, {ROUND_S} s of each in turn, so both meet about the same load; "
                     f"load average {os.getloadavg()[0]:.1f} at the end): numpy "
                     f"{', '.join(f'{n:.2f}' for n, _ in turns)} ms, WASM SIMD {', '.join(f'{w:.2f}' for _, w in turns)} ms; "
                     f"the tab's CPU path at {ratios[len(ratios) // 2]:.3f}x numpy (median of the rounds' ratios), "
                     f"{min(n for n, _ in turns) / min(w for _, w in turns):.3f}x (best against best).")
    body = "\n".join(lines)
    print(body)
    write_section("browser_conv", "## Browser engine: image kernels (WASM SIMD and WGSL vs JS units in Chromium)\n\n" + body,
                  "python -m bench.browser_conv")


if __name__ == "__main__":
    main()
