"""A/B of the resident WebGPU micro-batch (issue 33 item 3) against another revision, in one
page: the default CNN's Engine.gradInto (micro-batch 16) on the JS units (the baseline), on
this tree's resident path and on REV's (its webui/ modules and shaders served from git under
/old/), each path's rounds alternating, so both see the same load. Every path's contribution
must be the same bits (the JS units'). WebGPU here is whatever adapter Chromium finds
(SwiftShader on a machine without a GPU).

Run: ``python -m bench.browser_gpu_ab [--rev main] [--gemm lanes/16] [--gemm-old lanes/16] [--rounds 6] [-n 6]``
(prints the times; it writes nothing: bench.browser_gpu holds the comparison).
"""

from __future__ import annotations

import argparse
import mimetypes
import os
import statistics
import subprocess
import time
from pathlib import Path

import psutil

from bench.browser import ARGS, CHROMIUM, _serve, blank_page
from bench.browser_gpu_cpu import _cpu  # the browser processes' CPU seconds

B = 16
ROOT = Path(__file__).resolve().parent.parent

SETUP = """
async ([b, gemmNew, gemmOld]) => {
  const { loadLuts, sha256Hex } = await import('/webui/units/luts.js');
  const S = await import('/webui/engine/spec.js');
  const luts = await loadLuts('/luts/');
  const sides = {};
  for (const [name, base] of [['new', '/'], ['old', '/old/']]) {
    const { openPaths } = await import(`${base}webui/engine/paths.js`);
    const { Engine, initParams } = await import(`${base}webui/engine/model.js`);
    const opened = await openPaths(luts, { shaderBase: `${base}shaders/`, tryWasm: false });
    if (!opened.gpu) return { error: opened.gpuReason };
    const [kernel, few] = (name === 'new' ? gemmNew : gemmOld).split('/');
    opened.gpu.resident = true;
    opened.gpu.residentGemm = kernel;
    opened.gpu.residentSplit = few ? Number(few) : undefined;
    sides[name] = { units: opened.gpu, Engine, initParams };
    if (name === 'new') sides.js = { units: opened.cpu, Engine, initParams };
  }
  let seed = 12345;
  const rnd = (lo, hi) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return lo + (seed >>> 8) % (hi - lo); };
  const spec = S.imageCnn(1, 28, 28, [...S.DEFAULT_CNN], 10);
  const theta = sides.js.initParams(spec, 1);
  const x = Uint8Array.from({ length: b * 784 }, () => rnd(0, 256));
  const y = Int32Array.from({ length: b }, () => rnd(0, 10));
  window.__run = async (name, n) => {
    const s = sides[name];
    let total;
    for (let i = 0; i < n; i++) {
      total = new Float64Array(theta.length);
      await new s.Engine(spec, s.units).gradInto(total, theta, x, y, b, 40, 2 ** 49);
    }
    return sha256Hex(new Uint8Array(total.buffer));
  };
  // the GPU passes alone (forward then backward, one submit, as _fastestFor times them), on
  // the buffers the last micro-batch left
  window.__passes = async (name, n, skip = '') => {
    const s = sides[name];
    const plan = await s.units.residentPlan(spec, b);
    const d = s.units.device;
    const t0 = performance.now();
    for (let i = 0; i < n; i++) {
      const enc = d.createCommandEncoder();
      for (const list of [plan.fwd, plan.bwd]) {
        const pass = enc.beginComputePass();
        for (const op of list) {
          if (skip && op.kernel.startsWith(skip)) continue;
          pass.setPipeline(op.pipeline);
          pass.setBindGroup(0, op.group);
          pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2] || 1);
        }
        pass.end();
      }
      d.queue.submit([enc.finish()]);
      await d.queue.onSubmittedWorkDone();
    }
    return (performance.now() - t0) / n;
  };
  return {};
}
"""

SIDES = ("js", "old", "new")


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="main", help="the revision to compare against (git)")
    ap.add_argument("--gemm", default="lanes/16", help="the GEMM kernel of both sides, 'kernel' or 'kernel/split'")
    ap.add_argument("--gemm-old", default=None, help="REV's GEMM kernel, if not --gemm's (a kernel REV does not have)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("-n", type=int, default=6, help="micro-batches a path a round")
    ap.add_argument("--passes", type=int, default=0, help="then rounds of the GPU passes alone (CPU time)")
    ap.add_argument("--skip", default="", help="--passes: leave out the dispatches whose kernel starts so (their share)")
    args = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()

    def old(route):
        path = route.request.url.split("/old/", 1)[1].split("?")[0]
        proc = subprocess.run(["git", "show", f"{rev}:daisychain/{path}"], cwd=ROOT, capture_output=True)
        if proc.returncode:
            route.fulfill(status=404, body="")
            return
        kind = "text/javascript" if path.endswith(".js") else (mimetypes.guess_type(path)[0] or "text/plain")
        route.fulfill(status=200, body=proc.stdout, content_type=kind)

    url = _serve()
    load0 = os.getloadavg()[0]
    wall = {k: [] for k in SIDES}
    cpu = {k: [] for k in SIDES}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        page.route("**/old/**", old)
        res = page.evaluate(SETUP, [B, args.gemm, args.gemm_old or args.gemm])
        if "error" in res:
            raise SystemExit(f"no WebGPU: {res['error']}")
        me = psutil.Process()
        root = min((c for c in me.children(recursive=True) if "chrom" in c.name()), key=lambda c: c.create_time())
        procs = [root] + root.children(recursive=True)
        sha = {k: page.evaluate("([k]) => window.__run(k, 2)", [k]) for k in SIDES}  # warm: plans, JIT
        for r in range(args.rounds):
            for k in SIDES if r % 2 == 0 else SIDES[::-1]:
                c0, t0 = _cpu(procs), time.perf_counter()
                page.evaluate("([k, n]) => window.__run(k, n)", [k, args.n])
                wall[k].append((time.perf_counter() - t0) * 1000 / args.n)
                cpu[k].append((_cpu(procs) - c0) * 1000 / args.n)
        passes = {k: [] for k in SIDES[1:]}
        passes_wall = {k: [] for k in SIDES[1:]}
        if args.passes:
            for r in range(args.passes):
                for k in SIDES[1:] if r % 2 == 0 else SIDES[:0:-1]:
                    c0 = _cpu(procs)
                    passes_wall[k].append(page.evaluate("([k, n, skip]) => window.__passes(k, n, skip)", [k, args.n, args.skip]))
                    passes[k].append((_cpu(procs) - c0) * 1000 / args.n)
        browser.close()
    load1 = os.getloadavg()[0]
    same = len(set(sha.values())) == 1
    med = statistics.median
    print(f"default CNN, micro-batch {B}, {args.rounds} alternating rounds of {args.n}, GEMM {args.gemm} (old: {args.gemm_old or args.gemm}); old = {rev}; "
          f"load {load0:.1f} -> {load1:.1f} on {os.cpu_count()} cores; same bits: {'yes' if same else 'NO'}")
    for k, label in (("js", "JS units"), ("old", f"resident {rev}"), ("new", "resident this tree")):
        print(f"  {label:24} wall median {med(wall[k]):6.1f} ms best {min(wall[k]):6.1f} (JS/this {med(wall['js']) / med(wall[k]):.3f}x)"
              f"  CPU median {med(cpu[k]):6.1f} ms (JS/this {med(cpu['js']) / med(cpu[k]):.3f}x)"
              f"  wall rounds {' '.join(f'{v:.0f}' for v in wall[k])}")
    if args.passes:
        for k in SIDES[1:]:
            print(f"  GPU passes alone, {k}: wall ms median {med(passes_wall[k]):.1f} min {min(passes_wall[k]):.1f}; "
                  f"CPU ms median {med(passes[k]):.1f} min {min(passes[k]):.1f} "
                  f"(rounds {' '.join(f'{v:.0f}' for v in passes[k])})")


if __name__ == "__main__":
    main()
