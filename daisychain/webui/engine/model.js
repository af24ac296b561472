// Forward and backward through the units, line for line daisychain/engine/model.py (the
// sequence is written down in docs/ENGINE.md); what each layer type does is in layers.js.
// One micro-batch at a time: everything a micro-batch produces depends only on (parameters,
// its samples), and contributions are integer sums, so processing them one by one gives
// numpy's bits.
//
// Integer-valued arrays are Int32Array (int8 activations/errors, int32 accumulators) or
// Float64Array holding exact integers; `units` is a CpuUnits or GpuUnits (engine/paths.js):
// every product of the matrix work is a unit-GEMM product, every requantize and ReLU a unit.

import { absmax, dexp, exponent, pow2, quantExponent, quantize, quantize1, zeroSumErrors } from "./detmath.js";
import { accumulate, BIAS_LIMIT } from "./layers.js";
import { isSequence, kindOf } from "./registry.js";
import { STREAM_PARAM, uniform } from "./prng.js";
import { quantizeStochastic, rowKeys, sampleKeys } from "./sround.js";

/** Exponent of every image micro-batch: a = pixel >> 1 stands for a * 2^-7. */
export const IMAGE_EXPONENT = -7;

export class ParamLayout {
  constructor(spec) {
    this.spec = spec;
    this.names = [];
    this.shapes = [];
    this.offsets = [];
    let off = 0;
    for (const [name, shape] of spec.paramShapes()) {
      this.names.push(name);
      this.shapes.push(shape);
      this.offsets.push(off);
      off += shape.reduce((a, b) => a * b, 1);
    }
    this.size = off;
  }

  view(theta, k) {
    const n = this.shapes[k].reduce((a, b) => a * b, 1);
    return theta.subarray(this.offsets[k], this.offsets[k] + n);
  }
}

/** Uniform(-bound, bound) from the integer PRNG, one stream per canonical tensor index; the
 *  bound is the layer's (layers.js initBound: 1/sqrt(fan_in) for linear and conv2d, 1 for an
 *  embedding), the same for its weight and bias; a block has one per tensor (initBounds). */
export function initParams(spec, seed) {
  const layout = new ParamLayout(spec);
  const theta = new Float64Array(layout.size);
  let idx = 0;
  spec.layers.forEach((layer, li) => {
    const count = layer.paramShapes(li).length;
    const bounds = layer.initBounds ? layer.initBounds() : Array(count).fill(layer.initBound());
    for (let c = 0; c < count; c++) {
      const o = layout.offsets[idx];
      const f = uniform(seed, STREAM_PARAM + idx, layout.view(theta, idx).length);
      for (let i = 0; i < f.length; i++) theta[o + i] = (2.0 * f[i] - 1.0) * bounds[c];
      idx++;
    }
  });
  return theta;
}

/** Row softmax with the deterministic exp and a sequential sum over classes. */
export function softmaxRow(z, off, classes, out) {
  let zmax = z[off];
  for (let c = 1; c < classes; c++) if (z[off + c] > zmax) zmax = z[off + c];
  let total = 0;
  for (let c = 0; c < classes; c++) {
    const e = dexp(z[off + c] - zmax);
    out[off + c] = e;
    total = total + e;
  }
  for (let c = 0; c < classes; c++) out[off + c] = out[off + c] / total;
}

export class Engine {
  /** @param {ModelSpec} spec @param {object} units CpuUnits | GpuUnits */
  constructor(spec, units) {
    this.spec = spec;
    this.units = units;
    this.layout = new ParamLayout(spec);
    /** a sequence model (a transformer: it has a posembed): logits at every position */
    this.seq = isSequence(spec.layers);
  }

  /** Logits (rows, C) -> (b, C): a sequence model's last position of each sample. */
  lastLogits(z, b) {
    if (!this.seq) return z;
    const T = this.spec.inputDim;
    const C = this.spec.classes;
    const out = new Float64Array(b * C);
    for (let s = 0; s < b; s++) out.set(z.subarray(((s + 1) * T - 1) * C, (s + 1) * T * C), s * C);
    return out;
  }

  /**
   * Forward of one micro-batch of b samples: x is Float64Array (b*F, dense), Int32Array
   * (b*C, tokens) or Uint8Array (b*C*H*W pixels, image). Returns {logits: Float64Array
   * (b*classes), cache}. `trace(name, value)` if given receives every intermediate (numpy's
   * trace names).
   */
  async forward(theta, x, b, trace = null) {
    const tr = trace || (() => {});
    const spec = this.spec;
    const L = this.layout;
    const cache = [];
    let st;
    if (spec.inputKind === "dense") {
      const ex = quantExponent(absmax(x));
      st = { a: quantize(x, ex), ex };
      tr("input_exponent", [ex]);
      tr("input_q", st.a);
    } else if (spec.inputKind === "image") {
      const a = new Int32Array(x.length); // a = pixel >> 1 in [0, 127], exponent -7
      for (let i = 0; i < x.length; i++) a[i] = x[i] >> 1;
      st = { a, ex: IMAGE_EXPONENT };
      tr("input_exponent", [IMAGE_EXPONENT]);
      tr("input_q", a);
    } else {
      st = { tokens: x };
    }
    const layers = spec.layers;
    let pi = 0;
    for (let li = 0; li < layers.length; li++) {
      const layer = layers[li];
      const nParams = layer.paramShapes(li).length;
      const params = Array.from({ length: nParams }, (_, j) => L.view(theta, pi + j));
      const last = li === layers.length - 1;
      const fuseRelu = !trace && !last && kindOf(layers[li + 1]).folds === true;
      const ctx = { units: this.units, b, tr, li, pi, params, last, fuseRelu };
      const r = await layer.forward(ctx, st);
      pi += nParams;
      st = r.st;
      if (r.entry) cache.push(r.entry);
      else cache[cache.length - 1].reluOut = st.a; // a relu: its output masks the error below
      if (fuseRelu) {
        cache[cache.length - 1].reluOut = st.a;
        li += 1; // the relu layer is done (relu(requantize(.)) through both units)
      }
      if (last) {
        const scale = pow2(st.sexp);
        const logits = new Float64Array(st.logits.length);
        for (let i = 0; i < logits.length; i++) logits[i] = st.logits[i] * scale;
        tr("logits", logits);
        return { logits, cache };
      }
    }
    throw new Error("spec validation guarantees a final linear layer");
  }

  /**
   * Fixed-point gradient contribution of one micro-batch, added into `total` (Float64Array
   * of exact integers, length P). Returns {loss, correct} (loss for display only).
   */
  async gradInto(total, theta, x, y, b, fracBits, limit) {
    const plan = this.units.residentPlan ? await this.units.residentPlan(this.spec, b) : null;
    if (plan) return plan.gradInto(total, theta, x, y, fracBits, limit); // gpu_resident.js
    const { logits: z, cache } = await this.forward(theta, x, b);
    let keys = null;
    let skeys = null;
    if (this.seq && this.spec.loss !== "mse") { // every position predicts the next token: b*T rows (model.py seq_targets)
      skeys = sampleKeys(x, y, b, this.spec.inputDim); // its errors round stochastically (sround.js)
      keys = rowKeys(x, y, b, this.spec.inputDim, skeys);
      y = seqTargets(x, y, b, this.spec.inputDim);
      b = y.length;
    }
    const o = outputError(this.spec, z, y, b);
    return this.backwardFrom(total, cache, o.dz, o.labels, b, fracBits, limit, o.loss, o.correct, keys, skeys);
  }

  /** The backward pass from the output error dz (b, out); `y`: cross-entropy's labels (the
   *  quantized errors made zero-sum per sample), null for mse; `keys`, `skeys`: a sequence
   *  model's row and sample keys (stochastic rounding, sround.js), else null. Returns {loss, correct}. */
  async backwardFrom(total, cache, dz, y, b, fracBits, limit, loss, correct = 0, keys = null, skeys = null) {
    let { G, eg } = topErrors(dz, y, b, this.spec.classes, keys);
    const ctx = { units: this.units, b, total, offsets: this.layout.offsets, fracBits, limit, needInput: true, skeys };
    for (let k = cache.length - 1; k >= 0; k--) {
      const entry = cache[k];
      const below = k > 0 ? cache[k - 1] : null;
      // The first layer never computes an input error; an embedding below takes it raw.
      ctx.needInput = below !== null;
      const r = await entry.layer.backward(ctx, entry, G, eg);
      if (!r) break;
      if (below.raw) {
        await below.layer.backward(ctx, below, r.dX, r.e);
        break;
      }
      const { dX } = r;
      const reluOut = below.reluOut;
      if (reluOut) for (let j = 0; j < dX.length; j++) if (!(reluOut[j] > 0)) dX[j] = 0;
      if (r.int8 || r.wide) { // int8 errors, or a transformer's wide stream error
        G = dX;
        eg = r.e;
      } else if (skeys && below.layer.stochasticError) { // the final norm's error (transformer.js)
        ({ q: G, e: eg } = await below.layer.stochasticError(ctx, below, dX, r.e));
      } else {
        const s = Math.max(exponent(absmax(dX)) - 7, 0);
        G = await this.units.requantize(dX, s);
        eg = r.e + s;
      }
    }
    return { loss, correct };
  }

  /** Class predictions for x (N rows), evaluated in consecutive micro-batches. */
  async predict(theta, x, rowLen, n, microBatch) {
    const preds = new Int32Array(n);
    const C = this.spec.classes;
    for (let i = 0; i < n; i += microBatch) {
      const b = Math.min(microBatch, n - i);
      const xs = x.subarray(i * rowLen, (i + b) * rowLen);
      const plan = this.units.residentPlan ? await this.units.residentPlan(this.spec, b) : null;
      const logits = this.lastLogits((plan ? await plan.forward(theta, xs) : await this.forward(theta, xs, b)).logits, b);
      for (let r = 0; r < b; r++) {
        let best = 0;
        for (let c = 1; c < C; c++) if (logits[r * C + c] > logits[r * C + best]) best = c;
        preds[i + r] = best;
      }
    }
    return preds;
  }
}

/** model.py seq_targets: row (s, t) predicts x[s, t+1], the last position y[s]. x (b*T) token
 *  ids, y (b) -> Int32Array (b*T). */
export function seqTargets(x, y, b, T) {
  const out = new Int32Array(b * T);
  for (let s = 0; s < b; s++) {
    out.set(x.subarray(s * T + 1, (s + 1) * T), s * T);
    out[s * T + T - 1] = y[s];
  }
  return out;
}

/**
 * The output error of one micro-batch from its logits z (b, classes), as gradInto computes it:
 * {dz, labels (cross-entropy's y; null for mse), loss (display only), correct}.
 */
export function outputError(spec, z, y, b) {
  if (spec.loss === "mse") {
    const { dz, loss } = mseOutputError(z, y, b);
    return { dz, labels: null, loss, correct: 0 };
  }
  const C = spec.classes;
  const p = new Float64Array(z.length);
  let lossSum = 0;
  let correct = 0;
  for (let i = 0; i < b; i++) {
    softmaxRow(z, i * C, C, p);
    lossSum += -Math.log(Math.max(p[i * C + y[i]], 1e-300)); // display only
    let best = 0;
    for (let c = 1; c < C; c++) if (z[i * C + c] > z[i * C + best]) best = c;
    if (best === y[i]) correct++;
  }
  const dz = new Float64Array(z.length);
  for (let i = 0; i < b; i++) {
    for (let c = 0; c < C; c++) dz[i * C + c] = (p[i * C + c] - (c === y[i] ? 1.0 : 0.0)) / b;
  }
  return { dz, labels: y, loss: lossSum / b, correct };
}

/** The top layer's int8 errors G (b, classes) and their exponent: dz quantized (rounded
 *  stochastically with a sequence model's row `keys`, sround.js), zero-sum per sample when
 *  `labels` (cross-entropy). */
export function topErrors(dz, labels, b, classes, keys = null) {
  const eg = quantExponent(absmax(dz));
  let G = keys ? quantizeStochastic(dz, eg, keys, b, classes) : quantize(dz, eg);
  if (labels !== null) G = zeroSumErrors(G, labels, b, classes);
  return { G, eg };
}

/** detmath.py mse_output_error: dz = (z - y) / b (one subtraction, one division per element,
 *  the same bits as numpy); the display loss is the mean of (z - y)^2. z, y: (b, K). */
export function mseOutputError(z, y, b) {
  if (y.length !== z.length) throw new Error(`mse targets of ${y.length} values for ${z.length} outputs`);
  const dz = new Float64Array(z.length);
  let sq = 0;
  for (let i = 0; i < z.length; i++) {
    const d = z[i] - y[i];
    sq += d * d; // display only
    dz[i] = d / b;
  }
  return { dz, loss: z.length ? sq / z.length : 0 };
}

export { accumulate, BIAS_LIMIT, quantize1 };
