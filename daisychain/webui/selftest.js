// The conformance page (/selftest): runs every golden unit vector (/golden/units.json) on
// every available path — WebGPU kernels, JS units with the fast GEMM, JS units with the
// literal table GEMM — measures each path's unit-GEMM rate, then (engine.js) an optional short
// training run. It shows the outcome to a person and writes it as JSON into #result, then
// sets window.__selftestDone = true.
//
// A path that fails any vector, or whose GPU errors, is disabled and the reason shown.

import { int32LeBytes, loadLuts, sha256Hex } from "/webui/luts.js";
import { CpuUnits, openPaths } from "/webui/engine/paths.js";

const $ = (id) => document.getElementById(id);

function log(line) {
  console.log(`[selftest] ${line}`);
  $("log").textContent += `${line}\n`;
}

async function fetchJson(url) {
  const resp = await fetch(url, { cache: "no-store" });
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

/** Compare got (Int32Array) with the golden: SHA-256 of the int32 LE bytes, and elements. */
async function compare(got, wantOut, wantSha) {
  const sha = await sha256Hex(int32LeBytes(got));
  const res = { pass: true, sha256: sha };
  if (wantSha && sha !== wantSha) {
    res.pass = false;
    res.detail = `SHA-256 ${sha} != golden ${wantSha}`;
  }
  if (wantOut) {
    if (wantOut.length !== got.length) {
      return { ...res, pass: false, detail: `length ${got.length} != golden ${wantOut.length}` };
    }
    for (let i = 0; i < got.length; i++) {
      if (got[i] !== wantOut[i]) {
        return { ...res, pass: false, detail: `element ${i}: got ${got[i]}, golden ${wantOut[i]}` };
      }
    }
  }
  return res;
}

function matrix(values, fill, len) {
  return values ? Int8Array.from(values) : new Int8Array(len).fill(fill);
}

/** Run every vector set through one path; returns {pass, sets, failures}. */
export async function runGolden(units, golden) {
  const sets = {};
  const failures = [];
  const record = (set, name, res) => {
    if (!res.pass) failures.push(`${set}${name ? ` ${name}` : ""}: ${res.detail}`);
  };
  const guarded = async (set, name, fn) => {
    try {
      return await fn();
    } catch (err) {
      return { pass: false, detail: `${err.name}: ${err.message}` };
    }
  };

  let r = await guarded("mul", "", async () => compare(
    await units.mul(Int8Array.from(golden.mul.a), Int8Array.from(golden.mul.b)), golden.mul.out));
  record("mul", "", r);
  sets.mul = { pass: r.pass, count: golden.mul.out.length, detail: r.detail || null };

  r = await guarded("relu", "", async () => compare(await units.relu(Int8Array.from(golden.relu.x)), golden.relu.out));
  record("relu", "", r);
  sets.relu = { pass: r.pass, count: golden.relu.out.length, detail: r.detail || null };

  r = await guarded("requantize", "", async () => {
    const { acc, shift, out } = golden.requantize;
    const got = new Int32Array(acc.length).fill(0x7fffffff);
    for (let s = 0; s <= 31; s++) {
      const idx = [];
      for (let i = 0; i < shift.length; i++) if (shift[i] === s) idx.push(i);
      if (!idx.length) continue;
      const res = await units.requantize(Int32Array.from(idx, (i) => acc[i]), s);
      idx.forEach((i, j) => { got[i] = res[j]; });
    }
    return compare(got, out);
  });
  record("requantize", "", r);
  sets.requantize = { pass: r.pass, count: golden.requantize.out.length, detail: r.detail || null };

  const cases = {};
  for (const g of golden.gemm) {
    r = await guarded("gemm", g.name, async () => {
      const a = matrix(g.a, g.a_fill, g.m * g.k);
      const b = matrix(g.b, g.b_fill, g.k * g.n);
      return compare(await units.gemm(a, b, { m: g.m, k: g.k, n: g.n }), g.out, g.out_sha256);
    });
    record("gemm", g.name, r);
    cases[g.name] = { pass: r.pass, detail: r.detail || null };
  }
  sets.gemm = { pass: Object.values(cases).every((c) => c.pass), cases };
  return { pass: failures.length === 0, sets, failures };
}

/** Unit-GEMM rate of one path: 2*M*K*N integer ops per GEMM, repeated for >= ~minMs. */
export async function gemmRate(units, { m = 64, k = 256, n = 64, minMs = 300 } = {}) {
  let seed = 12345;
  const rand = () => { seed = (Math.imul(seed, 1103515245) + 12345) | 0; return ((seed >>> 16) & 255) - 128; };
  const a = Int8Array.from({ length: m * k }, rand);
  const b = Int8Array.from({ length: k * n }, rand);
  await units.gemm(a, b, { m, k, n }); // warm up (pipeline, JIT)
  let runs = 0;
  const t0 = performance.now();
  let dt = 0;
  while (dt < minMs || runs < 2) {
    await units.gemm(a, b, { m, k, n });
    runs++;
    dt = performance.now() - t0;
  }
  return { shape: [m, k, n], runs, ms: dt, gops: (2 * m * k * n * runs) / (dt * 1e6) };
}

function showPath(name, info) {
  const li = document.createElement("li");
  const label = { gpu: "WebGPU kernels", cpu: "JS units (fast GEMM)", "cpu-lut": "JS units (table GEMM)" }[name] || name;
  if (info.disabled) {
    li.className = info.tried ? "fail" : "off";
    li.textContent = `${label}: disabled — ${info.disabled}`;
  } else {
    li.className = "pass";
    li.textContent = `${label}: all golden vectors pass; unit GEMM ${info.gemm.gops.toFixed(3)} GOP/s`;
  }
  $("paths").appendChild(li);
}

async function main() {
  const params = new URLSearchParams(location.search);
  const result = {
    ready: false, error: null, manifest_sha256: null, paths_tried: [], paths: {},
    usable_paths: [], webgpu: { available: false, reason: null, adapter: null },
  };
  try {
    const luts = await loadLuts("/luts/");
    result.manifest_sha256 = luts.manifestSha256;
    log(`tables verified, manifest ${luts.manifestSha256}`);
    const golden = await fetchJson("/golden/units.json");
    if (golden.manifest_sha256 !== luts.manifestSha256) {
      throw new Error(`the golden vectors are for manifest ${golden.manifest_sha256}, the tables are ${luts.manifestSha256}`);
    }
    const opened = await openPaths(luts, {
      onGpuFailure: (reason) => log(`GPU path failed: ${reason} — using the JS units`),
    });
    result.webgpu.available = !!opened.gpu;
    result.webgpu.reason = opened.gpuReason;
    if (opened.gpu) result.webgpu.adapter = opened.gpu.adapterInfo;
    else log(`WebGPU unavailable: ${opened.gpuReason}`);
    const candidates = [["gpu", opened.gpu], ["cpu", opened.cpu], ["cpu-lut", new CpuUnits(luts, { literal: true })]];
    for (const [name, units] of candidates) {
      if (!units) {
        result.paths[name] = { tried: false, pass: false, disabled: `WebGPU is not available: ${opened.gpuReason}` };
        continue;
      }
      result.paths_tried.push(name);
      log(`running the golden vectors on the ${name} path`);
      const t0 = performance.now();
      const g = await runGolden(units, golden);
      const info = { tried: true, pass: g.pass, sets: g.sets, failures: g.failures, disabled: null,
        golden_ms: performance.now() - t0 };
      if (!g.pass) {
        info.disabled = `failed golden vectors: ${g.failures.slice(0, 3).join("; ")}`;
      } else {
        try {
          info.gemm = await gemmRate(units);
        } catch (err) {
          info.pass = false;
          info.disabled = `failed while measuring: ${err.message}`;
        }
      }
      if (name === "gpu" && !units.usable && !info.disabled) info.disabled = units.failure;
      log(`${name}: ${info.disabled ? `disabled — ${info.disabled}` : "pass"}`);
      result.paths[name] = info;
      if (!info.disabled) result.usable_paths.push(name);
    }
    for (const [name, info] of Object.entries(result.paths)) showPath(name, info);
    const gpuOk = result.usable_paths.includes("gpu");
    $("status").textContent = gpuOk
      ? "This device is OK: the WebGPU kernels and the JS units give the golden results."
      : `This device can train on the JS units (CPU). ${result.webgpu.available ? "The WebGPU path failed its self-test"
        : "WebGPU is not available here"}: ${result.paths.gpu.disabled}`;
    if (window.__selftestTraining) await window.__selftestTraining(result, { params, luts, opened, log });
  } catch (err) {
    result.error = `${err.name}: ${err.message}`;
    $("status").textContent = `Self-test failed: ${result.error}`;
    $("status").className = "fail";
    console.error(err);
  }
  result.ready = true;
  $("result").textContent = JSON.stringify(result, null, 1);
  window.__selftest = result;
  window.__selftestDone = true;
}

main();
