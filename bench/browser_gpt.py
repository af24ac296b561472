"""The text transformer in the browser (issue 37): one micro-batch (forward + backward +
fixed-point contribution) on the JS units, the WebAssembly SIMD path and WebGPU inside
headless Chromium, against the numpy engine's micro-batch of the same model in the same run;
plus the transformer's two kernels (the per-head batched GEMM and the integer softmax) on the
larger model's shapes, JS units against WASM and WGSL.

Models: the golden file's (``block16h2,block16h2``, context 8) and the issue's 2-block model
(``block64h4,block64h4``, context 32), micro-batch 16, on the text task's vocabulary.

Run: ``python -m bench.browser_gpt`` (writes the "browser_gpt" section of docs/BENCHMARKS.md).
WebGPU here is whatever adapter Chromium finds; without a GPU that is SwiftShader (a CPU
emulation), where every dispatch also pays an upload and a read-back of its buffers.
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
from daisychain.engine.data import prepare_task, with_context  # noqa: E402
from daisychain.engine.model import Engine, init_params  # noqa: E402
from daisychain.engine.spec import Hyper, gpt  # noqa: E402
from daisychain.engine.trainer import grad_limit  # noqa: E402
from daisychain.units import load_luts  # noqa: E402

B = 16  # micro-batch
MODELS = [("block16h2,block16h2", 8), ("block64h4,block64h4", 32)]

PAGE = """
async ([b, vocab, models, minMs]) => {
  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const S = await import('/webui/engine/spec.js');
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts);
  let seed = 12345;
  const rnd = (lo, hi) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return lo + (seed >>> 8) % (hi - lo); };
  const cases = [];
  for (const [text, T] of models) {
    const spec = S.gpt(vocab, T, text.split(','));
    const theta = initParams(spec, 1);
    const x = Int32Array.from({ length: b * T }, () => rnd(0, vocab));
    const y = Int32Array.from({ length: b }, () => rnd(0, vocab));
    cases.push([`micro-batch of ${text}, context ${T}`, async (u) => {
      const total = new Float64Array(theta.length);
      await new Engine(spec, u).gradInto(total, theta, x, y, b, 40, 2 ** 49);
      return total;
    }, models.length]);
  }
  const [text, T] = models[models.length - 1];
  const blk = S.gpt(vocab, T, text.split(',')).layers[2];
  const H = blk.heads, dh = blk.nIn / blk.heads, nb = b * H;
  const q = Int32Array.from({ length: nb * T * dh }, () => rnd(-128, 128));
  const k = Int32Array.from({ length: nb * T * dh }, () => rnd(-128, 128));
  const sc = Int32Array.from({ length: nb * T * T }, () => rnd(-200000, 200000));
  cases.push([`scores: ${nb} GEMMs ${T} x ${dh} x ${T} (gemmBatch)`, (u) => u.gemmBatch(q, k, { batch: nb, m: T, k: dh, n: T, transB: true })]);
  cases.push([`softmax: ${nb} x ${T} x ${T} scores (exp unit)`, (u) => u.softmax(sc, nb, T, -12)]);
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
        while (performance.now() - t0 < minMs / 3 || runs < 1) { await fn(opened[path]); runs++; }
        row.ms[path] = Math.min(row.ms[path] ?? Infinity, (performance.now() - t0) / runs);
      }
    }
    out.rows.push(row);
  }
  return out;
}
"""


def _numpy_ms(text: str, T: int, vocab: int, min_s: float = 1.5) -> float:
    """The numpy engine's micro-batch of the model (gradient contribution), one thread, ms."""
    spec = gpt(vocab, T, text.split(","))
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (1, B, T)).astype(np.int32)
    y = rng.integers(0, vocab, (1, B)).astype(np.int64)
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

    vocab = prepare_task("text").classes
    with_context(prepare_task("text"), 32)  # the larger model's windows exist on this text
    bar = tqdm(["numpy", "server", "page", "numpy"], desc="bench browser_gpt", unit="stage")
    np_before = [_numpy_ms(t, T, vocab) for t, T in MODELS]
    bar.update(1)
    url = _serve()
    bar.update(1)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        page.set_default_timeout(1_800_000)
        res = page.evaluate(PAGE, [B, vocab, [list(m) for m in MODELS], 1500])
        browser.close()
    bar.update(1)
    np_ms = [min(a, _numpy_ms(t, T, vocab)) for a, (t, T) in zip(np_before, MODELS)]
    bar.update(1)
    bar.close()

    adapter = res["adapter"] or {}
    gpu_name = f"{adapter.get('vendor', '?')} {adapter.get('architecture', '')}".strip() if res["adapter"] else \
        f"none ({res['reason']})"
    lines = [f"WebGPU adapter: {gpu_name}. WebAssembly SIMD: {'yes' if not res['wasmReason'] else res['wasmReason']}. "
             f"Micro-batch {B}, text vocabulary {vocab}. Baseline (1.00) is the numpy engine's micro-batch of the "
             "same model (one thread; the better of a run before and one after the browser's). A WebGPU call "
             "includes its upload and read-back; norms, residual adds and the softmax's backward run on the host "
             "(JS) on every path. Each browser figure: the best of 3 alternating rounds. 5 engineers shared "
             "2 cores while this ran: the figures are noisy, the ratios within one run less so.", "",
             "| one micro-batch (forward + backward) | numpy ms (1.00) | JS units ms | WASM SIMD ms | WebGPU ms | same bytes |",
             "|---|---|---|---|---|---|"]

    def rel(ms, base):
        return f"{ms:.1f} ({base / ms:.3f}x)" if ms else "n/a"

    for r, base in zip(res["rows"], np_ms):
        m = r["ms"]
        lines.append(f"| {r['name']} | {base:.1f} (1.00x) | {rel(m.get('cpu'), base)} | {rel(m.get('wasm'), base)} | "
                     f"{rel(m.get('gpu'), base)} | {'yes' if r['same'] else 'NO'} |")
    lines += ["", "| kernel (one call, the larger model's shapes) | JS units ms (1.00) | WASM SIMD ms | WebGPU ms | same bytes |",
              "|---|---|---|---|---|"]
    for r in res["rows"][len(MODELS):]:
        m = r["ms"]
        cpu = m["cpu"]
        lines.append(f"| {r['name']} | {cpu:.2f} (1.00x) | {rel(m.get('wasm'), cpu)} | {rel(m.get('gpu'), cpu)} | "
                     f"{'yes' if r['same'] else 'NO'} |")
    body = "\n".join(lines)
    print(body)
    write_section("browser_gpt", "## Browser engine: the text transformer (JS units, WASM SIMD, WebGPU vs numpy)\n\n"
                  + body, "python -m bench.browser_gpt")


if __name__ == "__main__":
    main()
