"""The GPU kept fed, measured in CPU time (issue 33 item 3): a default-CNN micro-batch
(Engine.gradInto, micro-batch 16) on the JS units and on the resident WebGPU path with each
GEMM kernel, in headless Chromium, as the CPU seconds every process of the browser spent on it
(the renderer: JS; the GPU process: Dawn and SwiftShader's threads), read from /proc around N
micro-batches of one path, paths alternating for ROUNDS rounds; wall time beside it.

Why CPU time: on this shared 2-core machine the wall time of the same path swings 2-3x between
runs with the other engineers' load, while the CPU time a path needs barely moves; SwiftShader
spreads a dispatch over threads (up to the cores), the JS units use one. With the machine to
itself, the resident path's wall time would be its CPU time over the cores it keeps busy (at
best the GPU process's over 2, plus the renderer's).

Run: ``python -m bench.browser_gpu_cpu [--paths js,auto,lanes,direct,packed] [--rounds 3] [-n 6]
[--write]`` (``--write``: the "browser_gpu_cpu" section of docs/BENCHMARKS.md). ``auto`` is
what a tab runs: the kernel it measured fastest on this model.
"""

from __future__ import annotations

import argparse
import os
import time

import psutil

from bench._report import write_section
from bench.browser import ARGS, CHROMIUM, _serve, blank_page

B = 16

SETUP = """
async ([b]) => {
  const { loadLuts, sha256Hex } = await import('/webui/units/luts.js');
  const { openPaths } = await import('/webui/engine/paths.js');
  const S = await import('/webui/engine/spec.js');
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const opened = await openPaths(await loadLuts('/luts/'));
  const gpu = opened.gpu;
  if (!gpu) return { error: opened.gpuReason };
  let seed = 12345;
  const rnd = (lo, hi) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return lo + (seed >>> 8) % (hi - lo); };
  const spec = S.imageCnn(1, 28, 28, [...S.DEFAULT_CNN], 10);
  const theta = initParams(spec, 1);
  const x = Uint8Array.from({ length: b * 784 }, () => rnd(0, 256));
  const y = Int32Array.from({ length: b }, () => rnd(0, 10));
  window.__run = async (path, n) => {
    let units = opened.cpu;
    if (path !== 'js') {
      units = gpu;
      gpu.resident = true;
      gpu.residentGemm = path === 'auto' ? undefined : path;
    }
    let total;
    for (let i = 0; i < n; i++) {
      total = new Float64Array(theta.length);
      await new Engine(spec, units).gradInto(total, theta, x, y, b, 40, 2 ** 49);
    }
    return { sha: await sha256Hex(new Uint8Array(total.buffer)), info: gpu.residentInfo };
  };
  return { adapter: gpu.adapterInfo };
}
"""


def _cpu(procs, kind=None) -> float:
    """CPU seconds (user + system) of the browser's processes, or of those of one --type."""
    total = 0.0
    for p in procs:
        try:
            if kind and f"--type={kind}" not in " ".join(p.cmdline()):
                continue
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default="js,auto,lanes,direct,packed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=6, help="micro-batches a path computes per round")
    ap.add_argument("--write", action="store_true", help="write the section of docs/BENCHMARKS.md")
    args = ap.parse_args()
    paths = args.paths.split(",")
    url = _serve()
    load0 = os.getloadavg()[0]
    cpu = {p: [] for p in paths}
    gpu_cpu = {p: [] for p in paths}
    wall = {p: [] for p in paths}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = blank_page(browser, url)
        opened = page.evaluate(SETUP, [B])
        if "error" in opened:
            raise SystemExit(f"no WebGPU: {opened['error']}")
        me = psutil.Process()
        root = min((p for p in me.children(recursive=True) if "chrom" in p.name()), key=lambda p: p.create_time())
        procs = [root] + root.children(recursive=True)
        warm = {p: page.evaluate("([p]) => window.__run(p, 1)", [p]) for p in paths}  # plans, the kernel timing
        for r in range(args.rounds):
            for p in paths if r % 2 == 0 else paths[::-1]:
                c0, g0, t0 = _cpu(procs), _cpu(procs, "gpu-process"), time.perf_counter()
                page.evaluate("([p, n]) => window.__run(p, n)", [p, args.n])
                wall[p].append((time.perf_counter() - t0) * 1000 / args.n)
                cpu[p].append((_cpu(procs) - c0) * 1000 / args.n)
                gpu_cpu[p].append((_cpu(procs, "gpu-process") - g0) * 1000 / args.n)
        info = page.evaluate("() => window.__run('auto', 1)")["info"]
        browser.close()
    load1 = os.getloadavg()[0]
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    base = med(cpu["js"]) if "js" in cpu else None
    names = {"js": "JS units (baseline)", "auto": f"WebGPU resident, the tab's choice ({info['measured']})"}
    lines = [
        f"WebGPU adapter: {opened['adapter'].get('vendor', '?')} {opened['adapter'].get('architecture', '')}; "
        f"the kernel the tab measured fastest on this model: {info['measured']} (its plan's passes, ms: "
        f"{ {k: round(v, 1) for k, v in (info['gemm_ms'] or {}).items()} }). Default CNN, micro-batch {B}, "
        f"{args.rounds} alternating rounds of {args.n} micro-batches a path; the median round. 1-minute load "
        f"average {load0:.1f} at the start, {load1:.1f} at the end, on {os.cpu_count()} cores. CPU ms: every "
        "browser process (the GPU process's share beside it); ratio = the JS units' CPU ms / the path's.", "",
        "| path | CPU ms a micro-batch | of which the GPU process | CPU ratio | wall ms (at this run's load) | same contribution bits |",
        "|---|---|---|---|---|---|"]
    for p in paths:
        same = "yes" if warm[p]["sha"] == warm[paths[0]]["sha"] else "NO"
        ratio = f"{base / med(cpu[p]):.2f}x" if base else "-"
        lines.append(f"| {names.get(p, f'WebGPU resident, {p} GEMM')} | {med(cpu[p]):.1f} | {med(gpu_cpu[p]):.1f} | "
                     f"{ratio} | {med(wall[p]):.1f} | {same} |")
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section("browser_gpu_cpu", "## The GPU kept fed, in CPU time (Chromium, SwiftShader)\n\n" + body,
                      "python -m bench.browser_gpu_cpu --write")


if __name__ == "__main__":
    main()
