"""Where a resident WebGPU micro-batch's time goes (issue 33 item 3): every dispatch of the
default CNN's resident plan (webui/units/gpu_plan.js, micro-batch 16) timed alone in headless
Chromium, one submit each and the best of ROUNDS, after one real micro-batch filled the plan's
buffers; then the whole forward and backward passes as the tab submits them, to show what the
per-dispatch cost adds. WebGPU here is whatever adapter Chromium finds (SwiftShader on a
machine without a GPU).

Run: ``python -m bench.browser_gpu_profile [--gemm direct|tiled|packed|lanes] [--model cnn|digits] [--no-split | --split N]
[--no-im2col-pack]``
(prints a table; it writes nothing: the numbers guide the kernels, bench.browser_gpu holds the
comparison).
"""

from __future__ import annotations

import argparse
import os

from bench.browser import ARGS, CHROMIUM, _serve, blank_page

B = 16
ROUNDS = 5

#: the page's opening of the WebGPU units and the engine, in an async function (`gpu`, `S`,
#: `Engine`, `initParams` in scope after it; it returns {error} without an adapter)
GPU_OPEN = """
  const { loadLuts } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const S = await import('/webui/engine/spec.js');
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const luts = await loadLuts('/luts/');
  const { gpu, gpuReason } = await openPaths(luts);
  if (!gpu) return { error: gpuReason };
"""

RUN = """
async ([b, gemm, model, rounds, split, im2colPack]) => {
""" + GPU_OPEN + """  gpu.resident = true;
  gpu.residentGemm = gemm;
  gpu.residentSplit = split;
  gpu.residentIm2colPack = im2colPack;
  const spec = model === 'cnn' ? S.imageCnn(1, 28, 28, [...S.DEFAULT_CNN], 10) : S.mlp(64, 128, 10);
  const theta = initParams(spec, 1);
  const n = b * spec.inputDim;
  const x = model === 'cnn' ? Uint8Array.from({ length: n }, (_, i) => (i * 7919) & 255)
    : Float64Array.from({ length: n }, (_, i) => (i * 13) % 17);
  const y = Int32Array.from({ length: b }, (_, i) => i % 10);
  const grad = async () => new Engine(spec, gpu).gradInto(new Float64Array(theta.length), theta, x, y, b, 40, 2 ** 49);
  await grad();
  const plan = await gpu.residentPlan(spec, b);
  const d = gpu.device;
  const submit = async (ops) => {
    const enc = d.createCommandEncoder();
    const pass = enc.beginComputePass();
    for (const op of ops) {
      pass.setPipeline(op.pipeline);
      pass.setBindGroup(0, op.group);
      pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2] || 1);
    }
    pass.end();
    const t0 = performance.now();
    d.queue.submit([enc.finish()]);
    await d.queue.onSubmittedWorkDone();
    return performance.now() - t0;
  };
  const rows = [];
  for (const [pass, list] of [['forward', plan.fwd], ['backward', plan.bwd]]) {
    for (const op of list) {
      let best = Infinity;
      for (let r = 0; r < rounds; r++) best = Math.min(best, await submit([op]));
      rows.push({ pass, kernel: op.kernel, words: Array.from(op.words).slice(0, 4), grid: op.grid, ms: best });
    }
  }
  const whole = {};
  for (const [pass, list] of [['forward', plan.fwd], ['backward', plan.bwd]]) {
    let best = Infinity;
    for (let r = 0; r < rounds; r++) best = Math.min(best, await submit(list));
    whole[pass] = best;
  }
  let step = Infinity;
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    await grad();
    step = Math.min(step, performance.now() - t0);
  }
  const empty = [plan.fwd.find((op) => op.grid[0] * op.grid[1] * (op.grid[2] || 1) === 1) || plan.fwd[0]];
  let one = Infinity;
  for (let r = 0; r < rounds; r++) one = Math.min(one, await submit(empty));
  return { rows, whole, step, one, gemm: gpu.residentInfo };
}
"""


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gemm", choices=["direct", "tiled", "packed", "lanes"], default="packed")
    ap.add_argument("--model", choices=["cnn", "digits"], default="cnn")
    ap.add_argument("--no-split", action="store_true", help="no split sums (gpu_split.js splitOf)")
    ap.add_argument("--split", type=int, default=None, help="split sums aiming at this many workgroups")
    ap.add_argument("--no-im2col-pack", action="store_true",
                    help="packed kernel: im2col to int32 columns, then packed (not res_im2col_pack.wgsl)")
    args = ap.parse_args()
    url = _serve()
    load0 = os.getloadavg()[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        res = page.evaluate(RUN, [B, args.gemm, args.model, ROUNDS, False if args.no_split else args.split,
                                  False if args.no_im2col_pack else None])
        browser.close()
    if "error" in res:
        raise SystemExit(f"no WebGPU: {res['error']}")
    total = {}
    print(f"{'pass':9} {'kernel':14} {'words[:4]':28} {'grid':14} ms")
    for r in res["rows"]:
        print(f"{r['pass']:9} {r['kernel']:14} {str(r['words']):28} {str(r['grid']):14} {r['ms']:.2f}")
        total[r["kernel"]] = total.get(r["kernel"], 0) + r["ms"]
    print("\nper kernel (sum of its dispatches, each alone):")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"  {k:14} {v:8.2f} ms")
    print(f"  {'sum':14} {sum(total.values()):8.2f} ms over {len(res['rows'])} dispatches")
    print(f"whole passes as submitted: forward {res['whole']['forward']:.2f} ms, backward "
          f"{res['whole']['backward']:.2f} ms; one gradInto {res['step']:.2f} ms; a 1-workgroup dispatch "
          f"alone {res['one']:.2f} ms")
    print(f"resident: {res['gemm']}; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
