// The compute of a tab, off the page's main thread: a module Web Worker that holds real
// Trainers (engine/trainer.js) on its own units (the JS units, or its own WebGPU device when
// the tab computes on the GPU) and answers messages from trainer_proxy.js:
//
//   {id, op: "init", key, spec, hyper, dataset, luts, kind, cpuPath}  -> {units, gpuReason, wasmReason}
//     (cpuPath "wasm": the CPU units are this worker's own WebAssembly SIMD instance, checked
//     as the page's was; the JS units when it is "js" or the module fails here)
//   {id, op: "contribute", key, theta, grad, step, micro}     -> {grad, loss, correct, theta, span}
//     (grad: an array of the model's size to sum into, zeroed here; both arrays come back;
//     span: [start, end] of the compute, ms since the epoch (timeOrigin + now), for the pool's trace)
//   {id, op: "accuracy", key, theta, split, limit}            -> {accuracy, n}
//   {id, op: "probs", key, theta, x, n}                       -> {probs}  (softmax of the logits;
//     a transformer's at each window's last position)
//   {id, op: "predict", key, theta, split, index}             -> {pred}   (predictions.js)
//   {id, op: "confusion", key, theta, split}                  -> {classes, counts, n, correct}
//   {id, op: "setUnits", kind}                                -> {units}
//   {id, op: "rate", luts, cpuPath}                           -> {rate, units}  (the capacity
//     probe: micro-batches/s of this worker's CPU units, measured while the others measure)
//
// Every answer is {id, ok: true, result} or {id, ok: false, error}. The parameters travel with
// each call (the replica's state stays on the page, where the run protocol reads it), so what
// the worker computes is exactly what the page's own Trainer would: same code, same bits.

import { CpuUnits } from "../../engine/cpu_units.js";
import { openWasm } from "../../engine/paths.js";
import { makeHyper, ModelSpec } from "../../engine/spec.js";
import { Trainer } from "../../engine/trainer.js";
import { GpuUnits } from "../../units/gpu.js";
import { confusionOf, predictRows } from "./predictions.js";
import { microBatchRate } from "../../engine/conformance.js";

const trainers = new Map(); // key -> Trainer (the newest few)
const KEEP = 3;
let cpu = null;
let gpu = null;
let gpuReason = null;
let wasmReason = null;
let units = null;
let counts = { micro: 0, accuracy: 0 };

async function openUnits(luts, kind, cpuPath) {
  if (!cpu && cpuPath === "wasm") ({ wasm: cpu, wasmReason } = await openWasm(luts));
  if (!cpu) cpu = new CpuUnits(luts);
  if (kind !== "webgpu") return cpu;
  if (!gpu && !gpuReason) {
    try {
      gpu = await GpuUnits.create({ luts, shaderBase: "/shaders/" });
      gpu.name = "gpu";
    } catch (err) {
      gpuReason = err.message;
    }
  }
  return gpu && gpu.usable !== false ? gpu : cpu;
}

function get(key) {
  const tr = trainers.get(key);
  if (!tr) throw new Error(`the compute worker holds no trainer ${key}`);
  return tr;
}

function softmax(logits, n, C) {
  const out = new Float64Array(n * C);
  for (let r = 0; r < n; r++) {
    let max = -Infinity;
    for (let c = 0; c < C; c++) max = Math.max(max, logits[r * C + c]);
    let sum = 0;
    for (let c = 0; c < C; c++) sum += (out[r * C + c] = Math.exp(logits[r * C + c] - max));
    for (let c = 0; c < C; c++) out[r * C + c] /= sum;
  }
  return out;
}

const OPS = {
  async init({ key, spec, hyper, dataset, luts, kind, cpuPath }) {
    units = await openUnits(luts, kind, cpuPath);
    const tr = await Trainer.create({ spec: ModelSpec.fromJson(spec), hyper: makeHyper(hyper), dataset, luts, units });
    trainers.set(key, tr);
    while (trainers.size > KEEP) trainers.delete(trainers.keys().next().value);
    return { units: units.name, gpuReason: kind === "webgpu" && units === cpu ? gpuReason : null, wasmReason };
  },
  async contribute({ key, theta, grad, step, micro }) {
    const tr = get(key);
    tr.engine.units = units;
    const start = performance.timeOrigin + performance.now();
    const r = await tr.contribute(micro, step, theta, grad);
    r.span = [start, performance.timeOrigin + performance.now()];
    counts.micro += micro.length;
    // the snapshot goes back with the contribution: the page hands it out again (trainer_proxy.js _spare)
    return { result: { ...r, theta }, transfer: [r.grad.buffer, r.loss.buffer, r.correct.buffer, theta.buffer] };
  },
  async accuracy({ key, theta, split, limit }) {
    const tr = get(key);
    tr.engine.units = units;
    const x = split === "test" ? tr.ds.x_test : tr.ds.x_train;
    const y = split === "test" ? tr.ds.y_test : tr.ds.y_train;
    const n = Math.min(y.data.length, limit ?? Infinity);
    counts.accuracy += 1;
    if (!n) return { accuracy: 0, n };
    const pred = await tr.engine.predict(theta, x.data, tr.rowLen, n, tr.hp.micro_batch);
    let ok = 0;
    for (let i = 0; i < n; i++) if (pred[i] === y.data[i]) ok++;
    return { accuracy: ok / n, n };
  },
  async probs({ key, theta, x, n }) {
    const tr = get(key);
    tr.engine.units = units;
    const { logits } = await tr.engine.forward(theta, x, n);
    // a transformer's logits are every position's: the next token is the last position's
    return { probs: softmax(tr.engine.lastLogits(logits, n), n, tr.spec.classes) };
  },
  async predict({ key, theta, split, index }) {
    const tr = get(key);
    tr.engine.units = units;
    return { pred: await predictRows(tr, theta, split, Array.from(index)) };
  },
  async confusion({ key, theta, split }) {
    const tr = get(key);
    tr.engine.units = units;
    return confusionOf(tr, theta, split);
  },
  async setUnits({ kind }) {
    units = kind === "webgpu" && gpu ? gpu : cpu;
    return { units: units.name };
  },
  async rate({ luts, cpuPath }) {
    const u = await openUnits(luts, "cpu", cpuPath);
    return { rate: await microBatchRate(u), units: u.name };
  },
  async counts() {
    return { ...counts };
  },
};

// Messages are handled one at a time, in order (a trainer is initialised before it is used).
let chain = Promise.resolve();
self.onmessage = (ev) => {
  const msg = ev.data;
  chain = chain.then(async () => {
    try {
      const op = OPS[msg.op];
      if (!op) throw new Error(`unknown compute op ${msg.op}`);
      const out = await op(msg);
      if (out && out.transfer) self.postMessage({ id: msg.id, ok: true, result: out.result }, out.transfer);
      else self.postMessage({ id: msg.id, ok: true, result: out });
    } catch (err) {
      self.postMessage({ id: msg.id, ok: false, error: err && err.message ? err.message : String(err) });
    }
  });
};
