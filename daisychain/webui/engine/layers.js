// The dense and image layer types of the JS engine, the twin of daisychain/engine/layers.py
// (registry.js lists every type; the transformer's are in transformer.js): one class per
// layer type, each knowing its spec JSON, its parameter shapes and init bound, the shape it
// maps, and its forward and backward through the units (the arithmetic is docs/ENGINE.md and
// CONV_SPEC: a conv is im2col, then the linear layer's arithmetic on the columns matrix).
//
// Shapes between layers: {width} for a flat vector per sample, plus {c, h, w} for an image
// map (channel-major: index c*h*w + y*w + x, as torch's NCHW flattened), or {width, seq: T}
// for the b*T rows of a sequence model (after a posembed; a linear there is applied to every
// row).
//
// forward(ctx, st) gets the activation st = {a: Int32Array (b * width) of int8, ex} of one
// micro-batch and returns {st, entry}: the next activation (or {logits} for the last layer)
// and what the backward pass needs (null for relu, whose output is kept on the entry of the
// layer before it as reluOut).
// backward(ctx, entry, G, eg) adds this layer's gradient into the fixed-point total and,
// when ctx.needInput, returns the error of its input: {dX, e, int8}, int8 = true when dX is
// already int8 (maxpool) and false for an int32 accumulator the engine requantizes.
//
// units(b, li, layers) -> [multiply, requantize, relu] unit invocations of one micro-batch of b
// samples (engine/counters.py: each layer type's count is its class's `units`).
//
// Units each layer calls (the `units` interface of engine/paths.js):
//   linear:    gemm, requantize (+ relu fused)        embedding: none (a table gather)
//   conv2d:    im2col, gemm, requantize, col2im        maxpool2d: maxpool, maxpoolBack
//   relu:      relu

import { MAX_K } from "../units/gemm.js";
import { absmax, exponent, pow2, quantExponent, quantize } from "./detmath.js";

export const BIAS_LIMIT = 1073741824; // 2^30
export const MAX_FEATURES = Math.floor((2147483647 - 1073741824) / (127 * 127));
export const KERNELS = [3, 5]; // conv2d kernel sizes
/** Most im2col values (h*w*ci*k*k) or output values (co*h*w) of one conv per sample: bounds
 *  the memory a spec from elsewhere can make the engine allocate (layers.py MAX_CONV_VALUES). */
export const MAX_CONV_VALUES = 2 ** 23;

export class SpecError extends Error {
  constructor(message) {
    super(message);
    this.name = "SpecError";
  }
}

export function int(x) {
  const v = Number(x);
  if (x === null || x === "" || typeof x === "boolean" || !Number.isInteger(v)) {
    throw new SpecError(`expected an integer, got ${JSON.stringify(x)}`);
  }
  return v;
}

function clampBias(x) {
  return x < -BIAS_LIMIT ? -BIAS_LIMIT : x > BIAS_LIMIT ? BIAS_LIMIT : x;
}

/** Accumulator exponent sexp = ex + ew; bias in accumulator units per output. */
export function biasAcc(bias, sexp) {
  const scale = pow2(-sexp);
  const bacc = new Float64Array(bias.length);
  for (let o = 0; o < bias.length; o++) bacc[o] = clampBias(Math.floor(bias[o] * scale + 0.5));
  return bacc;
}

/**
 * The affine part of a linear layer on a rows x nIn int8 matrix (attention.py `_affine`):
 * acc = a · Wqᵀ + bias (int32), traced under `name` (a block's sub-layers have their own).
 * Returns {acc, Wq, ew, sexp}.
 */
export async function affine(ctx, name, a, ex, W, bias, rows, nIn, nOut) {
  const { units, tr, li } = ctx;
  const ew = quantExponent(absmax(W));
  const Wq = quantize(W, ew); // (out, in)
  const prod = await units.gemm(a, Wq, { m: rows, k: nIn, n: nOut, transB: true });
  const sexp = ex + ew;
  const bacc = biasAcc(bias, sexp);
  const acc = new Int32Array(rows * nOut);
  for (let i = 0; i < rows; i++) {
    for (let o = 0; o < nOut; o++) {
      const v = prod[i * nOut + o] + bacc[o];
      if (v > 2147483647 || v < -2147483648) throw new RangeError(`layer ${li}: accumulator left int32`);
      acc[i * nOut + o] = v;
    }
  }
  tr(`${name}.weight_exponent`, [ew]);
  tr(`${name}.bias_acc`, bacc);
  tr(`${name}.acc`, acc);
  return { acc, Wq, ew, sexp };
}

/**
 * The linear layer's forward on a rows x nIn int8 matrix: acc = a · Wqᵀ + bias (int32), then
 * (unless last) requantize (+ ReLU when fused). Returns {acc, Wq, ew, sexp, q?, s?}.
 */
async function denseForward(ctx, a, ex, W, bias, rows, nIn, nOut) {
  const { units, tr, li } = ctx;
  const { acc, Wq, ew, sexp } = await affine(ctx, `layers.${li}`, a, ex, W, bias, rows, nIn, nOut);
  if (ctx.last) return { acc, Wq, ew, sexp };
  const s = Math.max(exponent(absmax(acc)) - 7, 0);
  const q = await units.requantize(acc, s, { relu: ctx.fuseRelu });
  tr(`layers.${li}.shift`, [s]);
  return { acc, Wq, ew, sexp, q, s };
}

/** Add clamp-then-round(ints * 2^(e + S)) into total[off..] (the fixed-point sum). */
export function accumulate(total, off, ints, e, fracBits, limit) {
  const scale = pow2(e + fracBits);
  for (let j = 0; j < ints.length; j++) {
    let v = ints[j] * scale;
    v = v < -limit ? -limit : v > limit ? limit : v;
    total[off + j] += Math.floor(v + 0.5);
  }
}

/**
 * The linear layer's backward on rows x nOut int8 errors G (exponent eg) and its rows x nIn
 * input a (exponent ex): dW = Gᵀ·a (split over rows so every GEMM keeps K <= MAX_K; the
 * int32 parts are summed exactly in float64), db = column sums of G, and (if needInput)
 * the input-error accumulator dX = G·Wq (rows x nIn, exponent eg + ew).
 */
export async function denseBackward(ctx, G, eg, a, ex, Wq, ew, rows, nIn, nOut, pi) {
  const { units, total, offsets, fracBits, limit } = ctx;
  let dW = null;
  for (let r0 = 0; r0 < rows; r0 += MAX_K) {
    const r1 = Math.min(rows, r0 + MAX_K);
    const part = await units.gemm(G.subarray(r0 * nOut, r1 * nOut), a.subarray(r0 * nIn, r1 * nIn),
      { m: nOut, k: r1 - r0, n: nIn, transA: true }); // (out, in)
    if (!dW) dW = r1 === rows ? part : Float64Array.from(part);
    else for (let j = 0; j < part.length; j++) dW[j] += part[j];
  }
  accumulate(total, offsets[pi], dW, eg + ex, fracBits, limit);
  const db = new Float64Array(nOut);
  for (let i = 0; i < rows; i++) for (let o = 0; o < nOut; o++) db[o] += G[i * nOut + o];
  accumulate(total, offsets[pi + 1], db, eg, fracBits, limit);
  if (!ctx.needInput) return null;
  return { dX: await units.gemm(G, Wq, { m: rows, k: nOut, n: nIn }), e: eg + ew };
}

// -- the layer types --------------------------------------------------------------------------

export class Linear {
  static type = "linear";
  static head = true; // may be the last layer: its dequantized outputs are the logits
  static op = "linear"; // the op a compiled path (units/gpu_plan.js) lowers it to

  /** Its --layers item (spec JSON `j`): a hidden width; the output layer is implicit. */
  static describe(j, i, layers) {
    const last = layers.map((l) => l.type === "linear").lastIndexOf(true);
    return i === last ? null : String(j.out);
  }

  constructor(nIn, nOut) {
    Object.assign(this, { type: "linear", nIn, nOut });
  }

  static fromJson(l) {
    return new Linear(int(l.in), int(l.out));
  }

  toJson() {
    return { type: "linear", in: this.nIn, out: this.nOut };
  }

  paramShapes(i) {
    return [[`layers.${i}.weight`, [this.nOut, this.nIn]], [`layers.${i}.bias`, [this.nOut]]];
  }

  initBound() {
    return 1.0 / Math.sqrt(this.nIn);
  }

  outShape(i, shape) {
    if (shape.seq !== undefined) { // a sequence model's output layer: applied to every position
      if (this.nIn !== shape.width) throw new SpecError(`layer ${i}: linear expects ${this.nIn} inputs, gets ${shape.width} per position`);
      if (this.nOut > MAX_K) throw new SpecError(`layer ${i}: out-features above ${MAX_K} would overflow the error GEMM`);
      return { width: this.nOut, seq: shape.seq };
    }
    if (this.nIn !== shape.width) throw new SpecError(`layer ${i}: linear expects ${this.nIn} inputs, gets ${shape.width}`);
    if (!(this.nIn >= 1 && this.nIn <= MAX_FEATURES) || this.nOut < 1) {
      throw new SpecError(`layer ${i}: linear in-features must lie in [1, ${MAX_FEATURES}] so its int32 accumulator cannot overflow`);
    }
    if (this.nOut > MAX_K) throw new SpecError(`layer ${i}: out-features above ${MAX_K} would overflow the error GEMM`);
    return { width: this.nOut };
  }

  units(b, li, layers) {
    let mul = 2 * b * this.nIn * this.nOut; // forward + weight gradient
    let rq = 0;
    if (li > 0) {
      mul += b * this.nIn * this.nOut; // error into the layer below
      if (layers[li - 1].type !== "embedding") rq += b * this.nIn; // requantized before it is used
    }
    if (li !== layers.length - 1) rq += b * this.nOut;
    return [mul, rq, 0];
  }

  async forward(ctx, st) {
    const [W, bias] = ctx.params;
    const rows = st.a.length / this.nIn; // b, or b*T rows of a sequence model
    const r = await denseForward(ctx, st.a, st.ex, W, bias, rows, this.nIn, this.nOut);
    const entry = { layer: this, pi: ctx.pi, a: st.a, ex: st.ex, Wq: r.Wq, ew: r.ew, rows, reluOut: null };
    if (ctx.last) return { st: { logits: r.acc, sexp: r.sexp }, entry };
    ctx.tr(`layers.${ctx.li}.out_q`, r.q);
    return { st: { a: r.q, ex: r.sexp + r.s }, entry };
  }

  async backward(ctx, e, G, eg) {
    return denseBackward(ctx, G, eg, e.a, e.ex, e.Wq, e.ew, e.rows, this.nIn, this.nOut, e.pi);
  }
}

export class Embedding {
  static type = "embedding";
  static readsTokens = true; // it starts a 'tokens' model

  constructor(vocab, dim) {
    Object.assign(this, { type: "embedding", nIn: vocab, nOut: dim });
  }

  static fromJson(l) {
    return new Embedding(int(l.vocab), int(l.dim));
  }

  toJson() {
    return { type: "embedding", vocab: this.nIn, dim: this.nOut };
  }

  paramShapes(i) {
    return [[`layers.${i}.weight`, [this.nIn, this.nOut]]];
  }

  initBound() {
    return 1.0;
  }

  outShape(i, shape, spec) {
    if (i !== 0 || spec.inputKind !== "tokens") throw new SpecError("an embedding must be the first layer of a 'tokens' model");
    if (this.nIn < 1 || this.nOut < 1) throw new SpecError("embedding vocab and dim must be >= 1");
    return { width: spec.inputDim * this.nOut };
  }

  units() {
    return [0, 0, 0];
  }

  /** st.tokens: Int32Array (b * context) token ids. */
  async forward(ctx, st) {
    const [E] = ctx.params;
    const D = this.nOut;
    const ee = quantExponent(absmax(E));
    const Eq = quantize(E, ee);
    const x = st.tokens;
    const a = new Int32Array(x.length * D);
    for (let t = 0; t < x.length; t++) a.set(Eq.subarray(x[t] * D, x[t] * D + D), t * D);
    ctx.tr(`layers.${ctx.li}.weight_exponent`, [ee]);
    ctx.tr(`layers.${ctx.li}.out_q`, a);
    return { st: { a, ex: ee }, entry: { layer: this, pi: ctx.pi, tokens: x, reluOut: null, raw: true } };
  }

  /** The raw input-error accumulator dX of the layer above (exponent e): integer scatter-add. */
  async backward(ctx, e, dX, eX) {
    const D = this.nOut;
    const dE = new Float64Array(this.nIn * D);
    for (let t = 0; t < e.tokens.length; t++) {
      const row = e.tokens[t] * D;
      for (let d = 0; d < D; d++) dE[row + d] += dX[t * D + d];
    }
    accumulate(ctx.total, ctx.offsets[e.pi], dE, eX, ctx.fracBits, ctx.limit);
    return null;
  }
}

export class Relu {
  static type = "relu";
  static folds = true; // a path folds it into the layer before it (relu(requantize))

  constructor() {
    Object.assign(this, { type: "relu", nIn: 0, nOut: 0 });
  }

  static fromJson() {
    return new Relu();
  }

  toJson() {
    return { type: "relu" };
  }

  paramShapes() {
    return [];
  }

  initBound() {
    return null;
  }

  outShape(i, shape, spec) {
    const L = spec.layers;
    if (i === 0 || !(L[i - 1].type === "linear" || L[i - 1].type === "conv2d") || i === L.length - 1) {
      throw new SpecError(`layer ${i}: relu must follow a hidden linear or conv2d layer`);
    }
    return shape;
  }

  units(b, li, layers) {
    const l = layers[li - 1]; // the linear or conv whose output this reads
    return [0, 0, b * (l.type === "conv2d" ? l.co * l.h * l.w : l.nOut)];
  }

  async forward(ctx, st) {
    const a = await ctx.units.relu(st.a);
    ctx.tr(`layers.${ctx.li}.out_q`, a);
    return { st: { a, ex: st.ex }, entry: null };
  }
}

/** Geometry of a conv: Ci x H x W in, Co x H x W out, k x k kernel, padding (k - 1) / 2. */
export class Conv2d {
  static type = "conv2d";
  static op = "conv";
  static item = /^conv([0-9]+)(?:k([0-9]+))?$/; // --layers convN (3x3) or convNkK
  static stack = "image";
  static looksLike(t) {
    return t.startsWith("conv");
  }

  static checkItem(t, m) {
    if (m[2] !== undefined && !KERNELS.includes(+m[2])) throw new SpecError(`${t}: the kernel size must be 3 or 5`);
    if (!(+m[1] >= 1 && +m[1] <= 4096)) throw new SpecError(`${t}: a conv has 1 to 4096 filters`);
  }

  /** The layers its item makes on the map {c, h, w}, and the map after. */
  static itemLayers(m, map) {
    const co = +m[1];
    return { layers: [new Conv2d(map.c, co, m[2] === undefined ? 3 : +m[2], map.h, map.w), new Relu()],
      map: { c: co, h: map.h, w: map.w } };
  }

  static describe(j) {
    return `conv${j.out_channels}${j.kernel !== 3 ? `k${j.kernel}` : ""}`;
  }

  constructor(ci, co, k, h, w) {
    Object.assign(this, { type: "conv2d", ci, co, k, h, w, nIn: ci * k * k, nOut: co });
  }

  static fromJson(l) {
    return new Conv2d(int(l.in_channels), int(l.out_channels), int(l.kernel), int(l.height), int(l.width));
  }

  toJson() {
    return { type: "conv2d", in_channels: this.ci, out_channels: this.co, kernel: this.k, height: this.h, width: this.w };
  }

  get geom() {
    return { ci: this.ci, co: this.co, k: this.k, h: this.h, w: this.w };
  }

  paramShapes(i) {
    return [[`layers.${i}.weight`, [this.co, this.ci, this.k, this.k]], [`layers.${i}.bias`, [this.co]]];
  }

  initBound() {
    return 1.0 / Math.sqrt(this.ci * this.k * this.k);
  }

  outShape(i, shape) {
    const { ci, co, k, h, w } = this;
    if (shape.c === undefined) {
      throw new SpecError(`layer ${i}: conv2d needs an image-shaped input (an image or the output of a ` +
        "conv2d/maxpool2d), not a dense one: put every conv before the first dense layer");
    }
    if (shape.c !== ci || shape.h !== h || shape.w !== w) {
      throw new SpecError(`layer ${i}: conv2d expects a ${ci}x${h}x${w} input, gets ${shape.c}x${shape.h}x${shape.w}`);
    }
    if (!KERNELS.includes(k)) throw new SpecError(`layer ${i}: conv2d kernel must be one of (3, 5), not ${k}`);
    if (co < 1) throw new SpecError(`layer ${i}: conv2d needs at least one output channel`);
    if (ci * k * k > MAX_FEATURES) {
      throw new SpecError(`layer ${i}: conv2d in_channels * kernel^2 must be at most ${MAX_FEATURES} so its int32 accumulator cannot overflow`);
    }
    if (co * k * k > MAX_K) throw new SpecError(`layer ${i}: conv2d out_channels * kernel^2 above ${MAX_K} would overflow the input error`);
    if (h * w * ci * k * k > MAX_CONV_VALUES || h * w * co > MAX_CONV_VALUES) {
      throw new SpecError(`layer ${i}: conv2d on a ${h}x${w} map with ${ci} -> ${co} channels needs more than ` +
        `${MAX_CONV_VALUES.toLocaleString("en-US")} values per sample; pool first or use fewer channels`);
    }
    return { width: co * h * w, c: co, h, w };
  }

  units(b, li) {
    const per = b * this.h * this.w * this.ci * this.k * this.k * this.co;
    let mul = 2 * per;
    let rq = b * this.h * this.w * this.co;
    if (li > 0) {
      mul += per;
      rq += b * this.ci * this.h * this.w;
    }
    return [mul, rq, 0];
  }

  async forward(ctx, st) {
    const [W, bias] = ctx.params;
    const { co, h, w } = this;
    const hw = h * w;
    const rows = ctx.b * hw;
    const cols = await ctx.units.im2col(st.a, ctx.b, this.geom); // (b*h*w, ci*k*k)
    const r = await denseForward(ctx, cols, st.ex, W, bias, rows, this.nIn, co);
    const entry = { layer: this, pi: ctx.pi, a: cols, ex: st.ex, Wq: r.Wq, ew: r.ew, reluOut: null };
    if (ctx.last) throw new SpecError("a conv2d cannot be the last layer");
    const out = new Int32Array(rows * co); // (b*h*w, co) -> channel-major (b, co*h*w)
    for (let s = 0; s < ctx.b; s++) {
      for (let p = 0; p < hw; p++) {
        const src = (s * hw + p) * co;
        const dst = s * co * hw + p;
        for (let c = 0; c < co; c++) out[dst + c * hw] = r.q[src + c];
      }
    }
    ctx.tr(`layers.${ctx.li}.out_q`, out);
    return { st: { a: out, ex: r.sexp + r.s }, entry };
  }

  async backward(ctx, e, G, eg) {
    const { co, h, w } = this;
    const hw = h * w;
    const rows = ctx.b * hw;
    const Gc = new Int32Array(rows * co); // channel-major (b, co*h*w) -> (b*h*w, co)
    for (let s = 0; s < ctx.b; s++) {
      for (let c = 0; c < co; c++) {
        const src = (s * co + c) * hw;
        for (let p = 0; p < hw; p++) Gc[(s * hw + p) * co + c] = G[src + p];
      }
    }
    const r = await denseBackward(ctx, Gc, eg, e.a, e.ex, e.Wq, e.ew, rows, this.nIn, co, e.pi);
    if (!r) return null;
    return { dX: await ctx.units.col2im(r.dX, ctx.b, this.geom), e: r.e };
  }
}

/** 2 x 2 max pool, stride 2; an odd last row / column is dropped. */
export class MaxPool2d {
  static type = "maxpool2d";
  static op = "pool";
  static item = /^pool$/;
  static stack = "image";
  static looksLike(t) {
    return t === "pool";
  }

  static checkItem() {}

  static itemLayers(m, map) {
    return { layers: [new MaxPool2d(map.c, map.h, map.w)], map: { c: map.c, h: map.h >> 1, w: map.w >> 1 } };
  }

  static describe() {
    return "pool";
  }

  constructor(c, h, w) {
    Object.assign(this, { type: "maxpool2d", c, h, w, nIn: 0, nOut: 0 });
  }

  static fromJson(l) {
    return new MaxPool2d(int(l.channels), int(l.height), int(l.width));
  }

  toJson() {
    return { type: "maxpool2d", channels: this.c, height: this.h, width: this.w };
  }

  get geom() {
    return { c: this.c, h: this.h, w: this.w };
  }

  paramShapes() {
    return [];
  }

  initBound() {
    return null;
  }

  outShape(i, shape) {
    const { c, h, w } = this;
    if (shape.c === undefined) throw new SpecError(`layer ${i}: maxpool2d needs an image-shaped input, not a dense one`);
    if (shape.c !== c || shape.h !== h || shape.w !== w) {
      throw new SpecError(`layer ${i}: maxpool2d expects a ${c}x${h}x${w} input, gets ${shape.c}x${shape.h}x${shape.w}`);
    }
    if (h < 2 || w < 2) {
      throw new SpecError(`layer ${i}: maxpool2d on a ${h}x${w} map: a 2x2 pool needs a map of at least 2x2 ` +
        "(too many pools for this image size)");
    }
    return { width: c * (h >> 1) * (w >> 1), c, h: h >> 1, w: w >> 1 };
  }

  units() {
    return [0, 0, 0]; // a max of int8 values runs no unit
  }

  async forward(ctx, st) {
    if (ctx.last) throw new SpecError("a maxpool2d cannot be the last layer");
    const out = await ctx.units.maxpool(st.a, ctx.b, this.geom);
    ctx.tr(`layers.${ctx.li}.out_q`, out);
    return { st: { a: out, ex: st.ex }, entry: { layer: this, pi: ctx.pi, a: st.a, reluOut: null } };
  }

  async backward(ctx, e, G, eg) {
    if (!ctx.needInput) return null;
    return { dX: await ctx.units.maxpoolBack(G, e.a, ctx.b, this.geom), e: eg, int8: true };
  }
}

