// Forward and backward through the units, line for line daisychain/engine/model.py (the
// sequence is written down in docs/ENGINE.md). One micro-batch at a time: everything a
// micro-batch produces depends only on (parameters, its samples), and contributions are
// integer sums, so processing them one by one gives numpy's bits.
//
// Integer-valued arrays are Int32Array (int8 activations/errors, int32 accumulators) or
// Float64Array holding exact integers; `units` is a CpuUnits or GpuUnits (engine/paths.js):
// every product of the matrix work is a unit-GEMM product, every requantize and ReLU a unit.

import { absmax, dexp, exponent, pow2, quantExponent, quantize, quantize1 } from "./detmath.js";
import { STREAM_PARAM, uniform } from "./prng.js";

export const BIAS_LIMIT = 1073741824; // 2^30

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

/** Uniform(-bound, bound) from the integer PRNG; bound = 1/sqrt(fan_in) (linear), 1 (embedding). */
export function initParams(spec, seed) {
  const layout = new ParamLayout(spec);
  const theta = new Float64Array(layout.size);
  let idx = 0;
  for (const layer of spec.layers) {
    if (layer.type === "relu") continue;
    const count = layer.type === "linear" ? 2 : 1;
    const bound = layer.type === "linear" ? 1.0 / Math.sqrt(layer.nIn) : 1.0;
    for (let c = 0; c < count; c++) {
      const o = layout.offsets[idx];
      const f = uniform(seed, STREAM_PARAM + idx, layout.view(theta, idx).length);
      for (let i = 0; i < f.length; i++) theta[o + i] = (2.0 * f[i] - 1.0) * bound;
      idx++;
    }
  }
  return theta;
}

function clampBias(x) {
  return x < -BIAS_LIMIT ? -BIAS_LIMIT : x > BIAS_LIMIT ? BIAS_LIMIT : x;
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
  }

  /**
   * Forward of one micro-batch of b samples: x is Float64Array (b*F) or Int32Array (b*C).
   * Returns {logits: Float64Array (b*classes), cache, emb}. `trace(name, value)` if given
   * receives every intermediate (numpy's trace names).
   */
  async forward(theta, x, b, trace = null) {
    const tr = trace || (() => {});
    const spec = this.spec;
    const L = this.layout;
    const cache = [];
    let pi = 0;
    let emb = null;
    let a;
    let ex;
    if (spec.inputKind === "dense") {
      ex = quantExponent(absmax(x));
      a = quantize(x, ex);
      tr("input_exponent", [ex]);
      tr("input_q", a);
    }
    const layers = spec.layers;
    for (let li = 0; li < layers.length; li++) {
      const layer = layers[li];
      if (layer.type === "embedding") {
        const E = L.view(theta, pi);
        const D = layer.nOut;
        const ee = quantExponent(absmax(E));
        const Eq = quantize(E, ee);
        const ctx = spec.inputDim;
        a = new Int32Array(b * ctx * D);
        for (let t = 0; t < b * ctx; t++) a.set(Eq.subarray(x[t] * D, x[t] * D + D), t * D);
        ex = ee;
        tr(`layers.${li}.weight_exponent`, [ee]);
        tr(`layers.${li}.out_q`, a);
        emb = { pi, tokens: x, V: layer.nIn, D };
        pi += 1;
      } else if (layer.type === "linear") {
        const W = L.view(theta, pi);
        const bias = L.view(theta, pi + 1);
        const nIn = layer.nIn;
        const nOut = layer.nOut;
        const ew = quantExponent(absmax(W));
        const Wq = quantize(W, ew); // (out, in)
        const prod = await this.units.gemm(a, Wq, { m: b, k: nIn, n: nOut, transB: true }); // (b, out)
        const sexp = ex + ew;
        const bscale = pow2(-sexp);
        const bacc = new Float64Array(nOut);
        for (let o = 0; o < nOut; o++) bacc[o] = clampBias(Math.floor(bias[o] * bscale + 0.5));
        const acc = new Int32Array(b * nOut);
        for (let i = 0; i < b; i++) {
          for (let o = 0; o < nOut; o++) {
            const v = prod[i * nOut + o] + bacc[o];
            if (v > 2147483647 || v < -2147483648) throw new RangeError("linear accumulator left int32");
            acc[i * nOut + o] = v;
          }
        }
        tr(`layers.${li}.weight_exponent`, [ew]);
        tr(`layers.${li}.bias_acc`, bacc);
        tr(`layers.${li}.acc`, acc);
        const entry = { pi, a, ex, Wq, ew, reluOut: null, nIn, nOut };
        cache.push(entry);
        pi += 2;
        if (li === layers.length - 1) {
          const scale = pow2(sexp);
          const logits = new Float64Array(acc.length);
          for (let i = 0; i < acc.length; i++) logits[i] = acc[i] * scale;
          tr("logits", logits);
          return { logits, cache, emb };
        }
        const s = Math.max(exponent(absmax(acc)) - 7, 0);
        const fuseRelu = !trace && layers[li + 1].type === "relu";
        a = await this.units.requantize(acc, s, { relu: fuseRelu });
        ex = sexp + s;
        tr(`layers.${li}.shift`, [s]);
        tr(`layers.${li}.out_q`, a);
        if (fuseRelu) {
          entry.reluOut = a;
          li += 1; // the relu layer is done (relu(requantize(.)) through both units)
        }
      } else if (layer.type === "relu") {
        a = await this.units.relu(a);
        cache[cache.length - 1].reluOut = a;
        tr(`layers.${li}.out_q`, a);
      }
    }
    throw new Error("spec validation guarantees a final linear layer");
  }

  /**
   * Fixed-point gradient contribution of one micro-batch, added into `total` (Float64Array
   * of exact integers, length P). Returns {loss, correct} (loss for display only).
   */
  async gradInto(total, theta, x, y, b, fracBits, limit) {
    const { logits: z, cache, emb } = await this.forward(theta, x, b);
    const C = this.spec.classes;
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
    let eg = quantExponent(absmax(dz));
    let G = quantize(dz, eg); // (b, out) int8 errors
    const L = this.layout;
    for (let k = cache.length - 1; k >= 0; k--) {
      const { pi, a, ex, Wq, ew, nIn, nOut } = cache[k];
      const dW = await this.units.gemm(G, a, { m: nOut, k: b, n: nIn, transA: true }); // (out, in)
      accumulate(total, L.offsets[pi], dW, eg + ex, fracBits, limit);
      const db = new Float64Array(nOut);
      for (let i = 0; i < b; i++) for (let o = 0; o < nOut; o++) db[o] += G[i * nOut + o];
      accumulate(total, L.offsets[pi + 1], db, eg, fracBits, limit);
      if (k === 0 && emb === null) break;
      const dX = await this.units.gemm(G, Wq, { m: b, k: nOut, n: nIn }); // (b, in)
      const dexpX = eg + ew;
      if (k === 0) { // into the embedding: integer scatter-add of dX's rows
        const { pi: epi, tokens, V, D } = emb;
        const dE = new Float64Array(V * D);
        for (let t = 0; t < tokens.length; t++) {
          const row = tokens[t] * D;
          for (let d = 0; d < D; d++) dE[row + d] += dX[t * D + d];
        }
        accumulate(total, L.offsets[epi], dE, dexpX, fracBits, limit);
        break;
      }
      const reluOut = cache[k - 1].reluOut;
      if (reluOut) for (let j = 0; j < dX.length; j++) if (!(reluOut[j] > 0)) dX[j] = 0;
      const s = Math.max(exponent(absmax(dX)) - 7, 0);
      G = await this.units.requantize(dX, s);
      eg = dexpX + s;
    }
    return { loss: lossSum / b, correct };
  }

  /** Class predictions for x (N rows), evaluated in consecutive micro-batches. */
  async predict(theta, x, rowLen, n, microBatch) {
    const preds = new Int32Array(n);
    const C = this.spec.classes;
    for (let i = 0; i < n; i += microBatch) {
      const b = Math.min(microBatch, n - i);
      const { logits } = await this.forward(theta, x.subarray(i * rowLen, (i + b) * rowLen), b);
      for (let r = 0; r < b; r++) {
        let best = 0;
        for (let c = 1; c < C; c++) if (logits[r * C + c] > logits[r * C + best]) best = c;
        preds[i + r] = best;
      }
    }
    return preds;
  }
}

/** total[off + j] += floor(clamp(ints[j] * 2^(e + S), -L, L) + 1/2) */
export function accumulate(total, off, ints, e, fracBits, limit) {
  const scale = pow2(e + fracBits);
  for (let j = 0; j < ints.length; j++) {
    let v = ints[j] * scale;
    v = v < -limit ? -limit : v > limit ? limit : v;
    total[off + j] += Math.floor(v + 0.5);
  }
}

export { quantize1 };
