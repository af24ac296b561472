"""The GPU kept fed (issue 33 item 3): one micro-batch (forward + backward + fixed-point
contribution, Engine.gradInto) of the default CNN (1x28x28, conv16,pool,conv32,pool,conv64,
pool, micro-batch 16) and of digits (64-128-10) in headless Chromium, on the JS units
(baseline), the WebAssembly SIMD kernels, the WebGPU units one call at a time (each call
uploads its inputs and reads its output back: the path before this issue) and the resident
WebGPU path (webui/units/gpu_resident.js) with each of its GEMM kernels (res_gemm.wgsl tiled with
workgroup memory and dot4I8Packed, res_gemm_direct.wgsl, res_gemm_packed.wgsl on packed
operands, res_gemm_lanes.wgsl laid out for an emulated SIMD routine's lanes), and the packed and
lanes ones without split sums (gpu_split.js splitOf), in alternating rounds
in one page; every path's contribution must be the same bits.

Run: ``python -m bench.browser_gpu`` (writes the "browser_gpu" section of docs/BENCHMARKS.md).
WebGPU here is whatever adapter Chromium finds: on a machine without a GPU, SwiftShader (a
CPU emulation on the machine's shared cores).
"""

from __future__ import annotations

import os

from tqdm import tqdm

from bench._report import write_section
from bench.browser import ARGS, CHROMIUM, _serve, blank_page

B = 16
ROUNDS = 3

RUN = """
async ([b, minMs, rounds]) => {
  const { loadLuts, sha256Hex } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const S = await import('/webui/engine/spec.js');
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const luts = await loadLuts('/luts/');
  const opened = await openPaths(luts);
  const gpu = opened.gpu;
  let seed = 12345;
  const rnd = (lo, hi) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return lo + (seed >>> 8) % (hi - lo); };
  const models = {
    cnn: [S.imageCnn(1, 28, 28, [...S.DEFAULT_CNN], 10), () => Uint8Array.from({ length: b * 784 }, () => rnd(0, 256))],
    digits: [S.mlp(64, 128, 10), () => Float64Array.from({ length: b * 64 }, () => rnd(0, 17))],
  };
  const paths = { js: [opened.cpu, null], wasm: [opened.wasm, null] };
  if (gpu) Object.assign(paths, { 'gpu-calls': [gpu, false], 'gpu-resident-direct': [gpu, 'direct'],
    'gpu-resident-tiled': [gpu, 'tiled'], 'gpu-resident-packed': [gpu, 'packed'],
    'gpu-resident-packed-unsplit': [gpu, 'packed', false], 'gpu-resident-lanes': [gpu, 'lanes'],
    'gpu-resident-lanes-unsplit': [gpu, 'lanes', false], 'gpu-resident-auto': [gpu, undefined] });
  const out = { adapter: gpu ? gpu.adapterInfo : null, reason: opened.gpuReason, rows: {} };
  for (const [model, [spec, makeX]] of Object.entries(models)) {
    const theta = initParams(spec, 1);
    const x = makeX();
    const y = Int32Array.from({ length: b }, () => rnd(0, 10));
    const run = async ([units, mode, split]) => {
      if (units === gpu) {
        gpu.resident = mode !== false;
        gpu.residentGemm = mode || undefined;
        gpu.residentSplit = split;
      }
      const total = new Float64Array(theta.length);
      await new Engine(spec, units).gradInto(total, theta, x, y, b, 40, 2 ** 49);
      return total;
    };
    const row = { ms: {}, sha: {} };
    for (const [name, p] of Object.entries(paths)) { // warm up: JIT, pipelines, plans
      if (!p[0]) continue;
      row.sha[name] = await sha256Hex(new Uint8Array((await run(p)).buffer));
    }
    for (let r = 0; r < rounds; r++) {
      const names = Object.keys(row.sha);
      for (const name of (r % 2 ? names.reverse() : names)) {
        let runs = 0;
        const t0 = performance.now();
        while (performance.now() - t0 < minMs || runs < 1) { await run(paths[name]); runs++; }
        row.ms[name] = Math.min(row.ms[name] ?? Infinity, (performance.now() - t0) / runs);
      }
    }
    out.rows[model] = row;
  }
  if (gpu) {
    gpu.resident = true;
    gpu.residentGemm = undefined; // as a tab runs it: the kernel measured fastest here
    gpu.residentSplit = undefined;
    await gpu.residentPlan(models.cnn[0], b);
    out.resident = gpu.residentInfo;
  }
  return out;
}
"""

NAMES = {"js": "JS units (baseline)", "wasm": "WASM SIMD", "gpu-calls": "WebGPU, one call at a time",
         "gpu-resident-direct": "WebGPU resident, direct GEMM", "gpu-resident-tiled": "WebGPU resident, tiled GEMM",
         "gpu-resident-packed": "WebGPU resident, packed GEMM",
         "gpu-resident-packed-unsplit": "WebGPU resident, packed GEMM, no split sums",
         "gpu-resident-lanes": "WebGPU resident, lanes GEMM",
         "gpu-resident-lanes-unsplit": "WebGPU resident, lanes GEMM, no split sums",
         "gpu-resident-auto": "WebGPU resident, the tab's choice (timed on the model)"}


def main() -> None:
    from playwright.sync_api import sync_playwright

    url = _serve()
    bar = tqdm(total=1, desc="bench browser_gpu", unit="page")
    load0 = os.getloadavg()[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        res = page.evaluate(RUN, [B, 1500, ROUNDS])
        browser.close()
    bar.update(1)
    bar.close()
    adapter = res["adapter"] or {}
    gpu_name = f"{adapter.get('vendor', '?')} {adapter.get('architecture', '')}".strip() if res["adapter"] else \
        f"none ({res['reason']})"
    cols = [k for k in NAMES if k in res["rows"]["cnn"]["ms"]]
    gemm_ms = {k: round(v, 1) for k, v in ((res.get("resident") or {}).get("gemm_ms") or {}).items()}
    lines = [
        f"WebGPU adapter: {gpu_name}; the resident path's dot product: {(res.get('resident') or {}).get('dot')}, "
        f"the GEMM kernel a tab measured fastest here: {(res.get('resident') or {}).get('measured')} "
        f"(the default CNN's forward and backward passes with each kernel, ms: {gemm_ms}). "
        f"1-minute load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
        f"{os.cpu_count()} cores: the machine is shared with other work and loaded, so absolute times are "
        "inflated and swing; the ratios are taken within one run. ms per micro-batch of 16 "
        f"(Engine.gradInto), the best of {ROUNDS} alternating rounds; ratio = JS units' time / the path's "
        "(above 1: faster than the JS units).", "",
        "| micro-batch | " + " | ".join(NAMES[c] for c in cols) + " | same contribution bits |",
        "|---|" + "---|" * (len(cols) + 1)]
    for model, label in (("cnn", "default CNN (image)"), ("digits", "digits 64-128-10")):
        row = res["rows"][model]
        base = row["ms"]["js"]
        cells = [f"{row['ms'][c]:.1f} ms ({base / row['ms'][c]:.3f}x)" for c in cols]
        same = "yes" if len(set(row["sha"].values())) == 1 else "NO"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {same} |")
    body = "\n".join(lines)
    print(body)
    write_section("browser_gpu", "## The GPU kept fed: a resident WebGPU micro-batch (Chromium)\n\n" + body,
                  "python -m bench.browser_gpu")


if __name__ == "__main__":
    main()
