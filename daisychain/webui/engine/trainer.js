// One replica in the browser, mirroring daisychain/engine/trainer.py: the step schedule, the
// fixed-point contribution of a set of micro-batches, the averaged gradient, the Adam step
// and the canonical parameter hash. This is what the mesh code drives:
//
//   const tr = await Trainer.create({ spec, hyper, dataset, luts, units });
//   const part = await tr.contribute([0, 2]);          // this peer's micro-batches of tr.step
//   ... all-reduce part.grad (exact integers; gradToBytes/gradFromBytes for the wire) ...
//   tr.apply(total);                                   // every replica, same total
//   await tr.paramsSha256();                           // the hash every replica prints

import { sha256Hex } from "../units/luts.js";
import { adamStep, AdamState } from "./adam.js";
import { augmentMicroBatch } from "./augment.js";
import { pow2 } from "./detmath.js";
import { Engine, initParams, ParamLayout } from "./model.js";
import { permutation, STREAM_SHUFFLE } from "./prng.js";
import { isSequence, readsExp } from "./registry.js";
import { checkSize, HYPER_FLOATS, hyperJson, imageShape, nMicro, SpecError } from "./spec.js";

export const ENGINE_VERSION = "2";

/** SHA-256 of the parameters as float64 little-endian bytes, in canonical order. */
export async function paramsSha256(theta) {
  const bytes = new Uint8Array(theta.length * 8);
  const dv = new DataView(bytes.buffer);
  for (let i = 0; i < theta.length; i++) {
    if (!Number.isFinite(theta[i])) throw new RangeError(`parameter ${i} is not finite (${theta[i]})`);
    dv.setFloat64(i * 8, theta[i], true);
  }
  return sha256Hex(bytes);
}

/** Per-micro-batch clamp L = floor(2^51 / n_micro). */
export function gradLimit(hp) {
  return Math.floor(2251799813685248 / nMicro(hp));
}

/** Which samples make up micro-batch j of step t (trainer.py Schedule). */
export class Schedule {
  constructor(nTrain, hp) {
    this.n = nTrain;
    this.hp = hp;
    this._perms = new Map();
  }

  _perm(epoch) {
    if (!this._perms.has(epoch)) {
      if (this._perms.size > 4) this._perms.delete(Math.min(...this._perms.keys()));
      this._perms.set(epoch, permutation(this.hp.seed, STREAM_SHUFFLE + epoch, this.n));
    }
    return this._perms.get(epoch);
  }

  samples(step, micro) {
    const mb = this.hp.micro_batch;
    const out = new Int32Array(mb);
    for (let i = 0; i < mb; i++) {
      const pos = step * this.hp.batch + micro * mb + i;
      out[i] = this._perm(Math.floor(pos / this.n))[pos % this.n];
    }
    return out;
  }
}

/** Gradient integers (|q| < 2^53) <-> int64 little-endian bytes for the wire. */
export function gradToBytes(grad) {
  const out = new BigInt64Array(grad.length);
  for (let i = 0; i < grad.length; i++) {
    if (!Number.isSafeInteger(grad[i])) throw new RangeError(`gradient ${i} is not a safe integer`);
    out[i] = BigInt(grad[i]);
  }
  const bytes = new Uint8Array(out.buffer);
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) { // big-endian host: swap
    for (let i = 0; i < bytes.length; i += 8) bytes.subarray(i, i + 8).reverse();
  }
  return bytes;
}

export function gradFromBytes(bytes) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float64Array(bytes.byteLength / 8);
  for (let i = 0; i < out.length; i++) {
    const v = dv.getBigInt64(i * 8, true);
    if (v > 9007199254740991n || v < -9007199254740991n) throw new RangeError(`gradient ${i} is out of range`);
    out[i] = Number(v);
  }
  return out;
}

/** rows [ids] of a (N, rowLen) typed array, concatenated */
function gather(arr, rowLen, ids) {
  const out = new arr.constructor(ids.length * rowLen);
  ids.forEach((r, i) => out.set(arr.subarray(r * rowLen, (r + 1) * rowLen), i * rowLen));
  return out;
}

export class Trainer {
  /**
   * @param {{spec: ModelSpec, hyper: object, dataset: object, luts: object, units: object}} o
   *   hyper from spec.js makeHyper(); dataset from data.js loadDataset(); units a CpuUnits or
   *   GpuUnits (engine/paths.js).
   */
  static async create(o) {
    return new Trainer(o);
  }

  constructor({ spec, hyper, dataset, luts, units }) {
    spec.validate();
    checkSize(spec, hyper);
    if (hyper.augment_shift && dataset.kind !== "image") throw new SpecError("--augment-shift applies to the image task");
    // the image recipe (engine/augment.py): shifted inputs in contribute, the learning-rate
    // schedule in adamStep (augment.js lrAt)
    this.imageShape = hyper.augment_shift ? imageShape(dataset) : null;
    this.spec = spec;
    this.hp = hyper;
    this.ds = dataset;
    this.luts = luts;
    this.engine = new Engine(spec, units);
    this.layout = new ParamLayout(spec);
    this.rowLen = dataset.x_train.shape.slice(1).reduce((a, b) => a * b, 1); // values per sample
    this.yLen = (dataset.y_train.shape || [])[1] || 1; // values per row: an mse y has K targets
    this.schedule = new Schedule(dataset.y_train.data.length / this.yLen, hyper);
    this.theta = initParams(spec, hyper.seed);
    // Adam in the WebAssembly module where the units are the checked module's (wasm_adam.js:
    // adamStep's bits, checked on its cold calls at open): the parameters and the moments then
    // live in the kernel's memory, stepped in place; otherwise adamStep on these arrays
    this.adamKernel = typeof units?.adamKernel === "function" ? units.adamKernel(this.theta.length) : null;
    if (this.adamKernel) {
      this.adamKernel.theta.set(this.theta);
      this.theta = this.adamKernel.theta;
      this.adam = this.adamKernel.state();
    } else this.adam = new AdamState(this.theta.length);
    this.step = 0;
    this.limit = gradLimit(hyper);
  }

  /** Tasks of a step the run protocol hands out: the micro-batches (trainer.py n_tasks). */
  get nTasks() {
    return nMicro(this.hp);
  }

  /** Entries of a contribution and of a step's total: one per parameter. */
  get totalSize() {
    return this.layout.size;
  }

  /** [values of the state's theta part, of each moment part] on the wire (STATE). */
  get stateSizes() {
    return [this.layout.size, this.layout.size];
  }

  /** Why a received contribution cannot be one beyond size and clamp bound: never here. */
  contributionError() {
    return null;
  }

  /** The state as the STATE frame carries it: a snapshot. */
  wireState() {
    return this.snapshot();
  }

  /** The state a checked STATE's fields stand for. */
  stateOf(st) {
    return { step: st.step, theta: st.theta, m: st.m, v: st.v, b1t: st.b1t, b2t: st.b2t };
  }

  /** Switch compute path (e.g. after a GPU failure); the bits do not change. */
  setUnits(units) {
    this.engine.units = units;
  }

  /** Samples (rows of the training set) of micro-batch j of a step. */
  samples(step, j) {
    return this.schedule.samples(step, j);
  }

  /** x (Uint8Array or Float64Array, micro_batch rows) and y of micro-batch j of a step, the
   *  pictures shifted when the run augments (trainer.py Trainer.inputs, augment.step_inputs). */
  inputs(step, j) {
    const idx = this.samples(step, j);
    const x = gather(this.ds.x_train.data, this.rowLen, idx);
    const y = gather(this.ds.y_train.data, this.yLen, idx);
    return { x: this.imageShape ? augmentMicroBatch(x, this.imageShape, this.hp, step, j) : x, y };
  }

  /**
   * Fixed-point gradient sum of the given micro-batches of a step (default: the current one),
   * on `theta` (default: the replica's; a snapshot lets a compute never see the replica change
   * under it), as Python's Trainer.contribute(micro_ids, step, theta); `into`: an array of the
   * model's size to sum into (zeroed first; a worker reuses the page's), else a new one.
   * @returns {Promise<{grad: Float64Array, loss: Float64Array, correct: Int32Array}>}
   *   grad holds exact integers (sum of floor(g * 2^S + 1/2) over the micro-batches).
   */
  async contribute(microIds, step = this.step, theta = this.theta, into = null) {
    const grad = into && into.length === this.layout.size ? into.fill(0) : new Float64Array(this.layout.size);
    const loss = new Float64Array(microIds.length);
    const correct = new Int32Array(microIds.length);
    const mb = this.hp.micro_batch;
    for (let i = 0; i < microIds.length; i++) {
      const { x, y } = this.inputs(step, microIds[i]);
      const r = await this.engine.gradInto(grad, theta, x, y, mb, this.hp.grad_frac_bits, this.limit);
      loss[i] = r.loss;
      correct[i] = r.correct;
    }
    return { grad, loss, correct };
  }

  /** [gscale, gdiv] with the averaged gradient = total * gscale / gdiv: total * 2^-S / n_micro,
   *  one exact scaling when n_micro is a power of two (trainer.py grad_scaling). */
  gradScaling() {
    const n = nMicro(this.hp);
    if ((n & (n - 1)) === 0) return [pow2(-this.hp.grad_frac_bits - (31 - Math.clz32(n))), 1];
    return [pow2(-this.hp.grad_frac_bits), n];
  }

  /** The averaged gradient: total * 2^-S / n_micro. */
  meanGrad(total) {
    const [s, n] = this.gradScaling();
    const g = new Float64Array(total.length);
    for (let i = 0; i < total.length; i++) g[i] = (total[i] * s) / n;
    return g;
  }

  /** Apply a step's integer total (same on every replica): deterministic Adam at the
   *  schedule's learning rate of this update, step += 1. */
  apply(total) {
    if (total.length !== this.theta.length) throw new RangeError(`gradient has ${total.length} values, model ${this.theta.length}`);
    if (this.adamKernel) this.adamKernel.step(this.theta, this.adam, total, this.hp, ...this.gradScaling());
    else adamStep(this.theta, this.adam, total, this.hp, ...this.gradScaling());
    this.step += 1;
  }

  /** A copy of the replica's state {step, theta, m, v, b1t, b2t}. */
  snapshot() {
    const a = this.adam;
    return { step: this.step, theta: this.theta.slice(), m: a.m.slice(), v: a.v.slice(), b1t: a.b1t, b2t: a.b2t };
  }

  /** Replace the replica's state with a copy of `st` (a snapshot or a checked STATE). */
  load(st) {
    if (st.theta.length !== this.theta.length) throw new RangeError(`the state holds ${st.theta.length} parameters, the model ${this.theta.length}`);
    this.theta.set(st.theta);
    this.adam.m.set(st.m);
    this.adam.v.set(st.v);
    this.adam.b1t = st.b1t;
    this.adam.b2t = st.b2t;
    this.adam.step = st.step;
    this.step = st.step;
  }

  async paramsSha256() {
    return paramsSha256(this.theta);
  }

  async accuracy(split = "test") {
    const x = split === "test" ? this.ds.x_test : this.ds.x_train;
    const y = split === "test" ? this.ds.y_test : this.ds.y_train;
    const n = y.data.length;
    if (!n || this.spec.loss === "mse") return 0; // an mse model has no classes (trainer.py)
    const pred = await this.engine.predict(this.theta, x.data, this.rowLen, n, this.hp.micro_batch);
    let ok = 0;
    for (let i = 0; i < n; i++) if (pred[i] === y.data[i]) ok++;
    return ok / n;
  }
}

/** Python's repr() of a float (shortest round-trip digits, Python's layout), for canonical JSON. */
export function pyFloatRepr(x) {
  if (!Number.isFinite(x)) throw new RangeError(`cannot write ${x} in canonical JSON`);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mant, expText] = x.toExponential().split("e");
  const exp = Number(expText);
  const neg = mant.startsWith("-");
  const digits = mant.replace("-", "").replace(".", "");
  let body;
  if (exp >= -5 + 1 && exp < 16) { // Python uses fixed notation for -4 <= exp < 16
    if (exp < 0) body = `0.${"0".repeat(-exp - 1)}${digits}`;
    else if (digits.length <= exp + 1) body = `${digits}${"0".repeat(exp + 1 - digits.length)}.0`;
    else body = `${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
  } else {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    body = `${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  return neg ? `-${body}` : body;
}

/** json.dumps(obj, sort_keys=True, separators=(",", ":")) with `floats` naming the keys
 *  whose values are Python floats. Strings here are ASCII identifiers and hex digests. */
export function canonicalJson(obj, floats = new Set()) {
  const enc = (v, k) => {
    if (v === null) return "null";
    if (typeof v === "boolean") return v ? "true" : "false";
    if (typeof v === "number") return floats.has(k) ? pyFloatRepr(v) : String(v);
    if (typeof v === "string") return JSON.stringify(v);
    if (Array.isArray(v)) return `[${v.map((x) => enc(x, k)).join(",")}]`;
    const keys = Object.keys(v).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${keys.map((kk) => `${JSON.stringify(kk)}:${enc(v[kk], kk)}`).join(",")}}`;
  };
  return enc(obj, null);
}

/** trainer.py run_identity / run_id: what fixes a run, and its 16-hex-digit id. */
export function runIdentity(spec, hp, ds, luts) {
  const out = { model: spec.toJson(), hyper: hyperJson(hp), dataset: ds.fingerprint, task: ds.task,
    luts: luts.manifestSha256, engine: ENGINE_VERSION, seed: hp.seed };
  // the exp unit is not in manifest_sha256: a model that reads it names its table
  if (readsExp(spec.layers)) out.exp_lut = luts.expSha256;
  // a sequence model's output error rounds stochastically (sround.js): a run id of its own
  // and so do its backward's requantizes of errors (sround.js requantizeErrors)
  if (isSequence(spec.layers)) Object.assign(out, { output_rounding: "stochastic", error_rounding: "stochastic" });
  return out;
}

export async function runId(identity) {
  const text = canonicalJson(identity, new Set(HYPER_FLOATS));
  return (await sha256Hex(new TextEncoder().encode(text))).slice(0, 16);
}
