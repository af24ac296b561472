"""WGSL variants of one resident GEMM kernel on the default CNN's own GEMM dispatches (issue 33
item 3): the shapes, strides, splits and grids of the dispatches of one kernel (--which gemm or
gemm_narrow) in the resident plan of --gemm (default lanes/16; webui/units/gpu_plan.js,
micro-batch 16), each variant compiled from a WGSL file of the same bindings and descriptor, on
the same random int8 operands; every dispatch timed alone (best of the rounds) and all of them in
one submit (--reps times), the variants in alternating rounds. Prints whether each variant's C
bytes equal the first's, dispatch by dispatch. A tool to measure what a kernel's loads, products
and stores cost on the adapter (SwiftShader here): a probe variant that drops a part of the
kernel has other bits, by design.

Run: ``python -m bench.browser_gpu_variants NAME=FILE.wgsl [NAME=FILE.wgsl ...] [--which gemm]
[--gemm lanes/16] [--rounds 6] [--reps 2]`` (the first variant is the baseline, e.g.
base=daisychain/shaders/res_gemm_lanes.wgsl; it writes nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.browser import ARGS, CHROMIUM, _serve, blank_page
from bench.browser_gpu_profile import GPU_OPEN

B = 16

RUN = """
async ([variants, rounds, reps, which, gemm, split]) => {
""" + GPU_OPEN + """  gpu.resident = true; gpu.residentGemm = gemm; gpu.residentSplit = split;
  const spec = S.imageCnn(1, 28, 28, [...S.DEFAULT_CNN], 10);
  const b = 16;
  const theta = initParams(spec, 1);
  const x = Uint8Array.from({ length: b * 784 }, (_, i) => (i * 7919) & 255);
  const y = Int32Array.from({ length: b }, (_, i) => i % 10);
  await new Engine(spec, gpu).gradInto(new Float64Array(theta.length), theta, x, y, b, 40, 2 ** 49);
  const plan = await gpu.residentPlan(spec, b);
  const ops = [...plan.fwd, ...plan.bwd].filter((op) => op.kernel === which);
  const d = gpu.device;
  let asz = 0, bsz = 0, csz = 0;
  for (const op of ops) {
    const w = op.words; const [m, k, n, kc] = w;
    const parts = kc ? Math.ceil(k / kc) : 1;
    asz = Math.max(asz, w[4] + (m - 1) * w[5] + (k - 1) * w[6] + 1);
    bsz = Math.max(bsz, w[8] + (k - 1) * w[9] + (n - 1) * w[10] + 1);
    csz = Math.max(csz, w[12] + (m - 1) * w[13] + (n - 1) * w[14] + (parts - 1) * w[15] + 1);
  }
  let seed = 7;
  const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return ((seed >>> 8) % 255) - 127; };
  const mk = (size, fill) => {
    const buf = d.createBuffer({ size: size * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
    if (fill) d.queue.writeBuffer(buf, 0, Int32Array.from({ length: size }, rnd));
    return buf;
  };
  const A = mk(asz, true), B = mk(bsz, true), C = mk(csz, false);
  const stage = d.createBuffer({ size: csz * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const vs = {};
  for (const [name, code] of variants) {
    const module = d.createShaderModule({ code });
    const info = await module.getCompilationInfo();
    const errs = info.messages.filter((m) => m.type === 'error');
    if (errs.length) return { error: name + ': ' + errs.map((m) => `${m.lineNum}: ${m.message}`).join('; ') };
    const pipeline = d.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' } });
    const groups = ops.map((op) => {
      const uni = d.createBuffer({ size: 64, usage: GPUBufferUsage.UNIFORM, mappedAtCreation: true });
      new Uint32Array(uni.getMappedRange()).set(op.words); uni.unmap();
      return d.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: [uni, A, B, C].map((buffer, binding) => ({ binding, resource: { buffer } })) });
    });
    vs[name] = { pipeline, groups };
  }
  const run = (name, list, reps) => {
    const v = vs[name];
    const enc = d.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(v.pipeline);
    for (let r = 0; r < reps; r++) for (const i of list) { pass.setBindGroup(0, v.groups[i]); const g = ops[i].grid; pass.dispatchWorkgroups(g[0], g[1], g[2] || 1); }
    pass.end();
    return enc;
  };
  // bits: each op alone, C read back
  const hashes = {};
  for (const name of Object.keys(vs)) {
    const hs = [];
    for (let i = 0; i < ops.length; i++) {
      const enc0 = d.createCommandEncoder(); enc0.clearBuffer(C); d.queue.submit([enc0.finish()]);
      const enc = run(name, [i], 1);
      enc.copyBufferToBuffer(C, 0, stage, 0, csz * 4);
      d.queue.submit([enc.finish()]);
      await stage.mapAsync(GPUMapMode.READ);
      const bytes = new Uint8Array(stage.getMappedRange().slice(0)); stage.unmap();
      hs.push(Array.from(new Uint8Array(await crypto.subtle.digest('SHA-256', bytes))).slice(0, 6).map((v) => v.toString(16).padStart(2, '0')).join(''));
    }
    hashes[name] = hs;
  }
  const all = ops.map((_, i) => i);
  const times = {}; const per = {};
  for (const name of Object.keys(vs)) { times[name] = []; per[name] = ops.map(() => Infinity); }
  for (let r = 0; r < rounds; r++) {
    const names = Object.keys(vs); if (r % 2) names.reverse();
    for (const name of names) {
      const enc = run(name, all, reps);
      const t0 = performance.now(); d.queue.submit([enc.finish()]); await d.queue.onSubmittedWorkDone();
      times[name].push((performance.now() - t0) / reps);
      for (let i = 0; i < ops.length; i++) {
        const e = run(name, [i], 1);
        const t1 = performance.now(); d.queue.submit([e.finish()]); await d.queue.onSubmittedWorkDone();
        per[name][i] = Math.min(per[name][i], performance.now() - t1);
      }
    }
  }
  return { times, per, hashes, shapes: ops.map((op) => [...op.words, ...op.grid]) };
}
"""


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=FILE.wgsl; the first is the baseline")
    ap.add_argument("--which", default="gemm", help="the plan's dispatches of this kernel (gemm, gemm_narrow)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2, help="the dispatches in one submit, this many times")
    ap.add_argument("--gemm", default="lanes/16", help="the plan's GEMM kernel, 'kernel' or 'kernel/split'")
    args = ap.parse_args()
    variants = []
    for arg in args.variants:
        name, path = arg.split("=", 1)
        with open(path) as f:
            variants.append([name, f.read()])
    url = _serve()
    load0 = os.getloadavg()[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        kernel, _, split = args.gemm.partition("/")
        res = page.evaluate(RUN, [variants, args.rounds, args.reps, args.which, kernel, int(split) if split else None])
        browser.close()
    if "error" in res:
        raise SystemExit(res["error"])
    base = variants[0][0]
    print(f"load {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; dispatches "
          f"[m, k, n, kc, descriptor..., grid]: {res['shapes']}")
    for name, t in res["times"].items():
        same = res["hashes"][name] == res["hashes"][base]
        print(f"{name:12} all {args.which} dispatches: median {statistics.median(t):7.2f} min {min(t):7.2f} ms; "
              f"same bytes as {base}: {'yes' if same else 'NO'}; each alone, best ms: "
              f"{' '.join(f'{v:.1f}' for v in res['per'][name])}")


if __name__ == "__main__":
    main()
