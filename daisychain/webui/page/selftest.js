// The conformance page (/selftest): runs every golden unit vector (/golden/units.json) on
// every available path — WebGPU kernels, WebAssembly SIMD kernels, JS units with the fast
// GEMM, JS units with the literal table GEMM — measures each path's unit-GEMM rate and micro-batch rate, chooses
// the faster passing path as a tab does (gpu.js choosePath -> result.choice), then, when
// the query names `task` or `steps`, trains in the page exactly as `daisychain train` does:
//   /selftest?task=digits|text|image&steps=N&seed=S&path=gpu|cpu|wasm|js   (path: default the
//   chosen one; cpu is the tab's CPU path: WebAssembly SIMD when it passed, else the JS units)
//   (also batch, micro-batch, lr, weight-decay, hidden, layers=256,256, embed-dim, and the
//   image recipe's augment-shift, lr-warmup, lr-decay-steps; every default is the CLI's, from
//   the one table of task defaults (engine/task_defaults.js), and as there
//   `layers` and `hidden` do not go together; an image task's
//   layers name convolutions and pools too: layers=conv16,pool,conv32k5,pool,64). It shows the
//   outcome to a person and writes it as JSON into #result, then
// sets window.__selftestDone = true.
//
// A path that fails any vector, or whose GPU errors, is disabled and the reason shown.

import { loadLuts } from "/webui/units/luts.js";
import { CpuUnits } from "/webui/engine/cpu_units.js";
import { openPaths } from "/webui/engine/paths.js";
import { loadDataset } from "/webui/engine/data.js";
import { gemmRate, microBatchRate, runGolden } from "/webui/engine/conformance.js";
import { makeHyper, modelFor, parseLayers, RECIPE_FIELDS, recipeSettings } from "/webui/engine/spec.js";
import { TASK_DEFAULTS } from "/webui/engine/task_defaults.js";
import { runId, runIdentity, Trainer } from "/webui/engine/trainer.js";
import { choosePath } from "/webui/units/gpu.js";
import { GpuError } from "/webui/units/gpu_error.js";

const $ = (id) => document.getElementById(id);
/** Steps left out of the training rate `micro_batches_per_s_after_warm` (bench.browser's numpy
 *  rate leaves out as many). */
const WARM_STEPS = 5;

function log(line) {
  console.log(`[selftest] ${line}`);
  $("log").textContent += `${line}\n`;
}

async function fetchJson(url) {
  const resp = await fetch(url, { cache: "no-store" });
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

const CLI_FLAGS = { // query parameter -> [Hyper field or setting, parser]
  seed: ["seed", "int"], batch: ["batch", "int"], "micro-batch": ["micro_batch", "int"],
  lr: ["lr", "float"], "weight-decay": ["weight_decay", "float"],
  "augment-shift": ["augment_shift", "int"], "lr-warmup": ["lr_warmup", "int"],
  "lr-decay-steps": ["lr_decay_steps", "int"],
};

function parseNumber(name, text, kind) {
  const v = Number(text);
  if (text === "" || !Number.isFinite(v) || (kind === "int" && !Number.isInteger(v))) {
    throw new Error(`query parameter ${name}=${text} is not ${kind === "int" ? "an integer" : "a number"}`);
  }
  return v;
}

/** The in-page training run (same settings and bits as `daisychain train`). */
async function runTraining(result, { params, luts, opened }) {
  const task = params.get("task") || "digits";
  const steps = params.has("steps") ? parseNumber("steps", params.get("steps"), "int")
    : (TASK_DEFAULTS[task] || TASK_DEFAULTS.digits).steps; // the task's default, as `daisychain train`'s
  if (steps < 0) throw new Error("steps must be >= 0");
  const overrides = {};
  for (const [flag, [field, kind]] of Object.entries(CLI_FLAGS)) {
    if (params.has(flag)) overrides[field] = parseNumber(flag, params.get(flag), kind);
  }
  if (params.has("hidden") && params.has("layers")) throw new Error("give layers or hidden, not both (hidden=N is layers=N)");
  const hidden = params.has("layers") ? parseLayers(params.get("layers"))
    : params.has("hidden") ? parseNumber("hidden", params.get("hidden"), "int") : null; // null: the task's default model
  const dim = params.has("embed-dim") ? parseNumber("embed-dim", params.get("embed-dim"), "int") : 16;
  const want = params.get("path") || result.choice.path || "cpu"; // default: the faster passing path
  if (!["gpu", "cpu", "wasm", "js"].includes(want)) throw new Error(`path must be gpu, cpu, wasm or js, not ${want}`);
  const t = { task, steps, seed: overrides.seed ?? 0, path_requested: want, path_used: null,
    fallback: null, params_sha256: null };
  result.training = t;
  const wasmOk = result.usable_paths.includes("wasm");
  let units = wasmOk && want !== "js" ? opened.wasm : opened.cpu;
  if (want === "wasm" && !wasmOk) t.fallback = `the WebAssembly SIMD path is disabled (${result.paths.wasm.disabled}); training on the JS units`;
  if (want === "gpu") {
    if (result.usable_paths.includes("gpu")) units = opened.gpu;
    else t.fallback = `the GPU path is disabled (${result.paths.gpu.disabled}); training on the JS units`;
  }
  t.path_used = units === opened.gpu ? "gpu" : "cpu";
  t.cpu_units = units === opened.wasm ? "wasm" : units === opened.gpu ? null : "js";
  const ds = await loadDataset(`/data/${encodeURIComponent(task)}.dcds`);
  const spec = modelFor(ds, hidden, dim);
  const given = Object.fromEntries(RECIPE_FIELDS.map((k) => [k, overrides[k] ?? null]));
  const hyper = makeHyper({ lr: (TASK_DEFAULTS[task] || TASK_DEFAULTS.digits).lr, ...overrides, ...recipeSettings(task, steps, given) });
  const tr = await Trainer.create({ spec, hyper, dataset: ds, luts, units });
  const identity = runIdentity(spec, hyper, ds, luts);
  Object.assign(t, { dataset_fingerprint: ds.fingerprint, run_id: await runId(identity), model: spec.toJson() });
  log(`training ${task} for ${steps} steps (seed ${t.seed}) on the ${t.path_used} path`);
  const ids = Array.from({ length: hyper.batch / hyper.micro_batch }, (_, j) => j);
  // the rate is taken twice: over every step, and over the steps after the first WARM_STEPS
  // (the plan's first calls, the engine's JS compiled on first use), as bench.browser's numpy
  // rate is taken after its own warm-up steps
  // (`warm=N` sets how many: a small model's JS reaches its optimizing tier only after tens of steps)
  const warmWanted = params.has("warm") ? parseNumber("warm", params.get("warm"), "int") : WARM_STEPS;
  if (warmWanted < 0) throw new Error("warm must be >= 0");
  const warm = Math.min(warmWanted, Math.max(steps - 1, 0));
  const t0 = performance.now();
  let tWarm = t0;
  let loss = NaN;
  for (let step = 0; step < steps; step++) {
    if (step === warm) tWarm = performance.now();
    let part;
    try {
      part = await tr.contribute(ids);
    } catch (err) {
      if (!(err instanceof GpuError) || t.path_used !== "gpu") throw err;
      t.fallback = `the GPU failed during training (${err.message}); step ${step} redone on the JS units`;
      log(t.fallback);
      t.path_used = "cpu";
      tr.setUnits(wasmOk ? opened.wasm : opened.cpu);
      part = await tr.contribute(ids);
    }
    tr.apply(part.grad);
    loss = part.loss.reduce((a, b) => a + b, 0) / part.loss.length;
    if (step % 5 === 0 || step === steps - 1) {
      $("training").textContent = `Training ${task}: step ${step + 1}/${steps}, loss ${loss.toFixed(4)}`;
    }
  }
  const ms = performance.now() - t0;
  t.loss = loss;
  t.ms = ms;
  t.micro_batches_per_s = ms > 0 ? (steps * ids.length) / (ms / 1000) : 0;
  const msWarm = t0 + ms - tWarm;
  t.warm_steps = warm;
  t.micro_batches_per_s_after_warm = msWarm > 0 ? ((steps - warm) * ids.length) / (msWarm / 1000) : 0;
  t.params_sha256 = await tr.paramsSha256();
  t.accuracy = await tr.accuracy("test");
  t.gpu_resident = opened.gpu ? opened.gpu.residentInfo : null; // gpu_resident.js: passes run, dot product
  $("training").textContent = `Trained ${task} for ${steps} steps on the ${t.path_used} path: ` +
    `test accuracy ${(t.accuracy * 100).toFixed(2)}%, params-sha256 ${t.params_sha256}` +
    (t.fallback ? ` (${t.fallback})` : "");
  log(`params-sha256: ${t.params_sha256}`);
}

function showPath(name, info) {
  const li = document.createElement("li");
  const label = { gpu: "WebGPU kernels", wasm: "WebAssembly SIMD kernels", cpu: "JS units (fast GEMM)",
    "cpu-lut": "JS units (table GEMM)" }[name] || name;
  if (info.disabled) {
    li.className = info.tried ? "fail" : "off";
    // the reason WebGPU is missing is said once, in the status above
    li.textContent = info.tried ? `${label}: disabled — ${info.disabled}` : `${label}: not available on this device (why: above)`;
  } else {
    li.className = "pass";
    li.textContent = `${label}: all golden vectors pass; unit GEMM ${info.gemm.gops.toFixed(3)} GOP/s, ` +
      `${info.micro_batch_rate.toFixed(1)} micro-batches/s`;
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
    if (opened.gpu) {
      // resident=0: the GPU units one call at a time; gpu-gemm=tiled|direct: that GEMM kernel
      // of the resident path (gpu_resident.js), not the one measured faster here;
      // gpu-dot=shifts: its tiled GEMM without dot4I8Packed
      if (params.get("resident") === "0") opened.gpu.resident = false;
      if (params.has("gpu-gemm")) opened.gpu.residentGemm = params.get("gpu-gemm");
      if (params.get("gpu-dot") === "shifts") opened.gpu.residentDot = "shifts"; // not dot4I8Packed
    }
    result.webgpu.available = !!opened.gpu;
    result.webgpu.reason = opened.gpuReason;
    if (opened.gpu) result.webgpu.adapter = opened.gpu.adapterInfo;
    else log(`WebGPU unavailable: ${opened.gpuReason}`);
    result.wasm = { available: !!opened.wasm, reason: opened.wasmReason };
    const candidates = [["gpu", opened.gpu], ["wasm", opened.wasm], ["cpu", opened.cpu],
      ["cpu-lut", new CpuUnits(luts, { literal: true })]];
    for (const [name, units] of candidates) {
      if (!units) {
        result.paths[name] = { tried: name === "wasm", pass: false, disabled: name === "wasm" ? opened.wasmReason
          : `WebGPU is not available: ${opened.gpuReason}` };
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
          info.micro_batch_rate = await microBatchRate(units);
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
      ? "The WebGPU kernels and the JS units give the golden results."
      : `${result.webgpu.available ? "The WebGPU path failed its self-test" : "WebGPU is not available here"}.`;
    result.micro_batch_rate = Math.max(0, ...result.usable_paths.map((p) => result.paths[p].micro_batch_rate));
    // The path a tab computes on: the faster of the two that passed (as the page chooses).
    const rate = (p) => (result.usable_paths.includes(p) ? result.paths[p].micro_batch_rate : null);
    const cpuName = rate("wasm") ? "WebAssembly SIMD" : "the JS units"; // the tab's CPU path
    const adapter = opened.gpu?.adapterInfo?.vendor
      ? `${opened.gpu.adapterInfo.vendor} ${opened.gpu.adapterInfo.architecture || ""}`.trim() : "";
    result.choice = rate("gpu") || rate("cpu")
      ? choosePath({ rates: { gpu: rate("gpu"), cpu: rate("wasm") || rate("cpu") }, adapter, cpuName,
        gpuWhy: result.paths.gpu.disabled, cpuWhy: result.paths.cpu.disabled })
      : { path: null, reason: "neither path passed its self-test", rates: { gpu: null, cpu: null }, ratio: null };
    $("status").textContent += ` A tab computes on the faster path: ${result.choice.reason}.`;
    const on = { gpu: "WebGPU", cpu: cpuName }[result.choice.path];
    $("verdict").textContent = on ? `This device is OK: it can train with DaisyChain (on ${on}).`
      : "This device cannot train: neither compute path passed its self-test.";
    $("verdict").className = on ? "pass" : "fail";
    log(`choice: ${result.choice.reason}`);
    if (params.has("task") || params.has("steps")) await runTraining(result, { params, luts, opened });
  } catch (err) {
    result.error = `${err.name}: ${err.message}`;
    if (result.training && !result.training.params_sha256) result.training.error = result.error;
    $("status").textContent = `Self-test failed: ${result.error}`;
    $("status").className = "fail";
    $("verdict").textContent = "This device cannot train with DaisyChain: the self-test failed (below).";
    $("verdict").className = "fail";
    console.error(err);
  }
  result.ready = true;
  $("result").textContent = JSON.stringify(result, null, 1);
  window.__selftest = result;
  window.__selftestDone = true;
}

main();
