// The device's side of a tab before any run: its self-test (which path it computes on, and
// why) and the training data fetched from the server, checked against its fingerprint.
// mesh.js re-exports both (app.js imports them from there).

import { loadLuts, sha256Hex } from "../units/luts.js";
import { floatFailures, goldenFailure, microBatchRate } from "../engine/conformance.js";
import { parseDataset } from "../engine/data.js";
import { withCredential } from "./uploads.js";
import { openPaths } from "../engine/paths.js";
import { choosePath } from "../units/gpu.js";
import { poolRate, poolSetting, workersAvailable } from "./worker/trainer_proxy.js";

// -- self-test -----------------------------------------------------------------------------

async function fetchGolden(name) {
  const resp = await fetch(`/golden/${name}`, { cache: "no-store" });
  if (!resp.ok) throw new Error(`/golden/${name}: HTTP ${resp.status}`);
  return resp.json();
}

/**
 * Test this device: tables through the manifest, golden vectors on the WebGPU path, the
 * WebAssembly SIMD kernels and the JS units, one Adam step on the golden Adam vectors and the golden subnormal operations
 * (float64 in JS, the same for every path), the micro-batch rate of each path that passes;
 * the tab computes on the faster one, and `reason` says why in words (gpu.js choosePath;
 * `choice` holds the rates too).
 * @param {{want?: "gpu"|"cpu"|null}} o  want "cpu" skips the GPU; "gpu" computes on it if it passes
 * The capacity is the micro-batch rate of the chosen path; on the CPU with a pool of more
 * than one worker (worker/trainer_proxy.js poolSetting), the pool's, measured at once.
 * @returns {Promise<{kind, reason, capacity, rates, choice, units, workers, cpu, cpuPath, cpuNote, luts, manifestSha256, paths}>}
 */
export async function selfTestDevice({ want = null } = {}) {
  const luts = await loadLuts("/luts/");
  const golden = await fetchGolden("units.json");
  const floats = await floatFailures(await fetchGolden("selftest.json"));
  if (floats.length) {
    throw new Error(`this device cannot train: its float64 arithmetic failed the self-test (${floats.slice(0, 3).join("; ")})`);
  }
  if (golden.manifest_sha256 !== luts.manifestSha256) {
    throw new Error(`refused: LUT manifest differs (golden vectors for ${golden.manifest_sha256.slice(0, 12)}…, tables ${luts.manifestSha256.slice(0, 12)}…)`);
  }
  const opened = await openPaths(luts, { tryGpu: want !== "cpu" });
  const paths = { gpu: null, cpu: null, float64: "pass" };
  let gpu = opened.gpu;
  let gpuWhy = opened.gpuReason;
  if (gpu) {
    const f = await goldenFailure(gpu, golden);
    if (f || !gpu.usable) {
      gpuWhy = `the WebGPU path failed its self-test (${f || gpu.failure})`;
      gpu = null;
    }
  }
  // The CPU path: WebAssembly SIMD when its module passed its own checks (wasm_units.js)
  // and the golden vectors here, else the JS units, saying why.
  let cpu = opened.cpu;
  let cpuNote = opened.wasmReason;
  if (opened.wasm) {
    const f = await goldenFailure(opened.wasm, golden);
    if (f) cpuNote = `the WebAssembly SIMD module failed the golden vectors (${f}): not used`;
    else cpu = opened.wasm;
  }
  const cpuName = cpu === opened.wasm ? "WebAssembly SIMD" : "the JS units";
  const cpuFail = await goldenFailure(cpu, golden);
  if (!gpu && cpuFail) throw new Error(`this device cannot train: ${cpuName} failed the self-test (${cpuFail})`);
  // Both paths that pass are measured; the tab computes on the faster (gpu.js choosePath).
  const rates = { gpu: null, cpu: cpuFail ? null : await microBatchRate(cpu) };
  if (gpu) {
    try {
      rates.gpu = await microBatchRate(gpu);
      if (!gpu.usable) throw new Error(gpu.failure);
    } catch (err) {
      gpuWhy = `the WebGPU path failed while measuring (${err.message})`;
      gpu = null;
      rates.gpu = null;
      if (cpuFail) throw new Error(`this device cannot train: ${gpuWhy}; the JS units failed their self-test (${cpuFail})`);
    }
  }
  paths.gpu = gpu ? "pass" : gpuWhy;
  paths.cpu = cpuFail ? `failed: ${cpuFail}` : "pass";
  const adapter = gpu?.adapterInfo?.vendor ? `${gpu.adapterInfo.vendor} ${gpu.adapterInfo.architecture || ""}`.trim() : "";
  paths.wasm = cpu === opened.wasm ? "pass" : cpuNote;
  const choice = choosePath({ rates, want, gpuWhy, cpuWhy: cpuFail, adapter, cpuName });
  const units = choice.path === "gpu" ? gpu : cpu;
  // The CPU path computes on a pool of workers: the capacity probe measures the whole pool,
  // every worker at once (one worker: the rate measured here stands).
  const pool = { ...poolSetting(), rates: null };
  if (!workersAvailable()) Object.assign(pool, { size: 0, why: "this browser has no module workers: computing on the page" });
  let capacity = rates[choice.path];
  if (choice.path === "cpu" && pool.size > 1) {
    try {
      const r = await poolRate(luts, cpu === opened.wasm ? "wasm" : "js");
      pool.rates = r.each;
      capacity = r.total;
    } catch (err) { // the run's own compute says so again if the workers cannot start
      pool.why += `; the pool's capacity probe failed (${err.message}): the rate measured here stands`;
    }
  }
  // cpuPath / cpuNote: what the CPU path runs and, on the JS units, why not WebAssembly SIMD
  return { kind: choice.path === "gpu" ? "webgpu" : "cpu", reason: choice.reason, capacity,
    rates, choice, units, workers: choice.path === "gpu" ? { ...pool, size: 1, why: "WebGPU: one device" } : pool, cpu, cpuPath: cpu === opened.wasm ? "wasm" : "js", cpuNote: cpu === opened.wasm ? null : cpuNote,
    luts, manifestSha256: luts.manifestSha256, paths };
}

/**
 * Fetch a DCDS, check its SHA-256 against `fingerprint` (when given) and parse it; the bytes
 * stay with it (`ds.bytes`) so this replica can hand the data to a member that asks. Throws
 * an Error that says what is wrong, in words.
 */
export async function fetchDataset(task, fingerprint = null, label = null, context = null) {
  const what = label || `the ${task} data`;
  const q = new URLSearchParams();
  if (fingerprint) q.set("fingerprint", fingerprint);
  if (context !== null) q.set("context", String(context)); // the text windowed with it (server/routes/data.py)
  const url = `/data/${encodeURIComponent(task)}.dcds` + (q.size ? `?${q}` : "");
  const resp = await fetch(url, { cache: "no-store", headers: withCredential() }); // an upload: its room's only
  if (!resp.ok) {
    const why = resp.status === 404 ? "the server has no copy of it"
      : resp.status === 400 ? (await resp.text()).trim().slice(0, 300) || "HTTP 400" : `HTTP ${resp.status}`;
    throw new Error(`${what}${fingerprint ? ` (fingerprint ${fingerprint.slice(0, 12)}…)` : ""}: ${why}`);
  }
  const buffer = await resp.arrayBuffer();
  const got = await sha256Hex(buffer);
  if (context === null && fingerprint && got !== fingerprint) {
    throw new Error(`${what}: the server's copy hashes to ${got.slice(0, 12)}…, not the fingerprint ${fingerprint.slice(0, 12)}… the run names`);
  }
  const ds = parseDataset(buffer);
  ds.fingerprint = got;
  ds.bytes = new Uint8Array(buffer);
  return ds;
}
