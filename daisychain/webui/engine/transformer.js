// The transformer's layer kinds, the twins of daisychain/engine/attention.py (docs/ENGINE.md,
// "The transformer"): PosEmbed (position embeddings align-added to the token embeddings),
// Block (pre-norm causal multi-head attention and a ReLU MLP, each with a residual align-add)
// and RmsNorm (the final norm). Registered in registry.js.
//
// After the posembed the activation of a micro-batch is b*T rows of D, row s*T + t; the
// residual stream is wide (|v| <= 2^15, one exponent; engine/norm.js). Every product is a
// unit GEMM (units.gemm, units.gemmBatch for the per-head ones), every int8 requantize the
// unit, every ReLU the unit, the softmax units.softmax (the exp unit); norms and residual
// adds are the exact integer rules of norm.js, on the host on every path (their
// intermediates pass 2^31).
//
// A block's backward returns the wide stream error {dX, e, wide: true}; so does the norm's.

import { absmax, pow2, quantExponent, quantize } from "./detmath.js";
import { accumulate, affine, denseBackward, int, SpecError } from "./layers.js";
import { alignAdd, bitlen, NORM_F, rmsBackward, rmsForward } from "./norm.js";
import { attnShift, fromHeads, softmaxBack, toHeads } from "./attention.js";
import { requantizeErrors, siteKey } from "./sround.js";

export const MAX_HEADS = 64;
export const MIN_WIDTH = 8;
export const MAX_WIDTH = 1024;
export const MAX_HEAD_DIM = 256;
export const MAX_MLP = 4096;
/** most attention scores (b * H * T^2) of one micro-batch (attention.py MAX_SCORES) */
export const MAX_SCORES = 2 ** 26;
const BLOCK_TENSORS = ["q", "k", "v", "o", "fc1", "fc2"];

/**
 * attention.py `_rq8`: requantize V to int8 with s = max(0, bitlen(max|V|) - 7) -> {q, e + s}.
 * For |V| >= 2^31 the values are first floored by 2^t1, t1 = max(0, s - 23), and the unit
 * runs with s - t1: the same result (nested floors), every operand in int32.
 */
export async function rq8(units, V, e) {
  const s = Math.max(bitlen(absmax(V)) - 7, 0);
  const t1 = Math.max(0, s - 23);
  let x = V;
  if (t1 > 0 || !(V instanceof Int32Array)) {
    const scale = pow2(-t1);
    x = new Int32Array(V.length);
    for (let i = 0; i < V.length; i++) x[i] = Math.floor(V[i] * scale);
  }
  return { q: await units.requantize(x, s - t1), e: e + s };
}

/** rms_forward, then the requantize unit: {q (int8 rows), e: s - F, cache}; traced. */
async function rmsnorm(ctx, X, R, D, name) {
  const cache = rmsForward(X, R, D);
  const { q, e } = await rq8(ctx.units, cache.y, 0);
  ctx.tr(`${name}.y`, cache.y);
  ctx.tr(`${name}.out_q`, q);
  return { q, e: e - NORM_F, cache };
}

export class PosEmbed {
  static type = "posembed";
  static sequence = true; // every layer after it sees b * context rows

  constructor(context, dim) {
    Object.assign(this, { type: "posembed", nIn: context, nOut: dim });
  }

  static fromJson(l) {
    return new PosEmbed(int(l.context), int(l.dim));
  }

  toJson() {
    return { type: "posembed", context: this.nIn, dim: this.nOut };
  }

  paramShapes(i) {
    return [[`layers.${i}.weight`, [this.nIn, this.nOut]]];
  }

  initBound() {
    return 1.0;
  }

  outShape(i, shape, spec) {
    const L = spec.layers;
    if (i !== 1 || L[0].type !== "embedding" || shape.seq !== undefined || shape.c !== undefined) {
      throw new SpecError("a posembed must come right after the model's embedding");
    }
    const T = this.nIn;
    const D = this.nOut;
    if (L[0].nOut !== D || shape.width !== T * D) {
      throw new SpecError(`layer ${i}: posembed(${T}, ${D}) does not match the embedding's ` +
        `${Math.floor(shape.width / Math.max(L[0].nOut, 1))} tokens of ${L[0].nOut}`);
    }
    return { width: D, seq: T };
  }

  units() {
    return [0, 0, 0];
  }

  /** st: the embedding's rows {a (b*T*D int8), ex}. */
  async forward(ctx, st) {
    const [Pos] = ctx.params;
    const T = this.nIn;
    const D = this.nOut;
    const ep = quantExponent(absmax(Pos));
    const Pq = quantize(Pos, ep);
    const tiled = new Int32Array(ctx.b * T * D);
    for (let s = 0; s < ctx.b; s++) tiled.set(Pq, s * T * D);
    const { V, e } = alignAdd([[st.a, st.ex], [tiled, ep]]);
    ctx.tr(`layers.${ctx.li}.weight_exponent`, [ep]);
    ctx.tr(`layers.${ctx.li}.out`, V);
    ctx.tr(`layers.${ctx.li}.out_exponent`, [e]);
    return { st: { a: V, ex: e }, entry: { layer: this, pi: ctx.pi, b: ctx.b, reluOut: null } };
  }

  /** dPos[t] = the sum over samples of the stream error's row (s, t) (exponent eg); the error
   *  passes on unchanged to the embedding (straight through the align-add). */
  async backward(ctx, e, E, eg) {
    const T = this.nIn;
    const D = this.nOut;
    const dP = new Float64Array(T * D);
    for (let s = 0; s < e.b; s++) for (let j = 0; j < T * D; j++) dP[j] += E[s * T * D + j];
    accumulate(ctx.total, ctx.offsets[e.pi], dP, eg, ctx.fracBits, ctx.limit);
    return { dX: E, e: eg, wide: true };
  }
}

/** The final norm (no parameters: the output layer absorbs a gain and a shift). */
export class RmsNorm {
  static type = "rmsnorm";

  constructor(dim, context) {
    Object.assign(this, { type: "rmsnorm", nIn: dim, nOut: dim, context });
  }

  static fromJson(l) {
    return new RmsNorm(int(l.dim), int(l.context));
  }

  toJson() {
    return { type: "rmsnorm", dim: this.nIn, context: this.context };
  }

  paramShapes() {
    return [];
  }

  initBound() {
    return null;
  }

  outShape(i, shape) {
    if (shape.seq !== this.context || shape.width !== this.nIn) {
      throw new SpecError(`layer ${i}: rmsnorm(${this.nIn}) needs the rows of a sequence model ` +
        `of context ${this.context} and width ${this.nIn}`);
    }
    return shape;
  }

  units(b) {
    return [0, b * this.nIn, 0]; // forward requantize (its error's is the linear's)
  }

  async forward(ctx, st) {
    const D = this.nIn;
    const R = st.a.length / D;
    const r = await rmsnorm(ctx, st.a, R, D, `layers.${ctx.li}`);
    return { st: { a: r.q, ex: r.e }, entry: { layer: this, pi: ctx.pi, li: ctx.li, cache: r.cache, ex: st.ex, R, reluOut: null } };
  }

  /** The output layer's input error dX (exponent e) as this norm's int8 errors, rounded
   *  stochastically at site (li, 0) (attention.py RMSNorm.backward): model.js backwardFrom
   *  asks for it in a sequence model (ctx.skeys). -> {q, e}. */
  stochasticError(ctx, entry, dX, e) {
    return requantizeErrors(ctx.units, dX, e, ctx.skeys, siteKey(entry.li, 0));
  }

  /** From int8 errors G (the output layer's, requantized: stochasticError): the wide stream error. */
  async backward(ctx, e, G, eg) {
    const { V, e: ed } = rmsBackward(G, eg, e.ex, e.cache, e.R, this.nIn);
    return { dX: V, e: ed, wide: true };
  }
}

/** Pre-norm transformer block: X + o(attn(rmsnorm X)), then + fc2(relu(fc1(rmsnorm X))). */
export class Block {
  static type = "block";
  static item = /^block([0-9]+)h([0-9]+)$/; // --layers blockWhH: width W, H heads
  static stack = "transformer";
  static looksLike(t) {
    return t.startsWith("block");
  }

  static checkItem() {}

  static describe(j) {
    return `block${j.dim}h${j.heads}`;
  }

  /** settings.py check_size: the attention scores of one micro-batch within MAX_SCORES. */
  checkSize(microBatch) {
    const n = microBatch * this.heads * this.context ** 2;
    if (n > MAX_SCORES) {
      throw new SpecError(`block${this.nIn}h${this.heads} at context ${this.context} with --micro-batch ${microBatch} ` +
        `makes ${n.toLocaleString("en-US")} attention scores a micro-batch, more than ` +
        `${MAX_SCORES.toLocaleString("en-US")}: use a smaller micro-batch, context or fewer heads`);
    }
  }

  constructor(dim, heads, context, mlp) {
    Object.assign(this, { type: "block", nIn: dim, nOut: dim, heads, context, mlp });
  }

  static fromJson(l) {
    return new Block(int(l.dim), int(l.heads), int(l.context), int(l.mlp));
  }

  toJson() {
    return { type: "block", dim: this.nIn, heads: this.heads, context: this.context, mlp: this.mlp };
  }

  paramShapes(i) {
    const D = this.nIn;
    const M = this.mlp;
    const shapes = { q: [D, D], k: [D, D], v: [D, D], o: [D, D], fc1: [M, D], fc2: [D, M] };
    return BLOCK_TENSORS.flatMap((t) => [[`layers.${i}.${t}.weight`, shapes[t]], [`layers.${i}.${t}.bias`, [shapes[t][0]]]]);
  }

  initBound() {
    return 1.0 / Math.sqrt(this.nIn);
  }

  /** One bound per tensor: 1/sqrt(fan_in) (D, or M for fc2). */
  initBounds() {
    return BLOCK_TENSORS.flatMap((t) => {
      const b = 1.0 / Math.sqrt(t === "fc2" ? this.mlp : this.nIn);
      return [b, b];
    });
  }

  outShape(i, shape) {
    const D = this.nIn;
    const H = this.heads;
    const T = this.context;
    const M = this.mlp;
    if (shape.seq === undefined) {
      throw new SpecError(`layer ${i}: a block needs token and position embeddings before it (the text task)`);
    }
    if (!(D >= MIN_WIDTH && D <= MAX_WIDTH)) throw new SpecError(`layer ${i}: a block's width must lie in [${MIN_WIDTH}, ${MAX_WIDTH}], not ${D}`);
    if (!(H >= 1 && H <= MAX_HEADS)) throw new SpecError(`layer ${i}: a block has 1 to ${MAX_HEADS} heads, not ${H}`);
    if (D % H) throw new SpecError(`layer ${i}: width ${D} is not divisible by ${H} heads`);
    if (Math.floor(D / H) > MAX_HEAD_DIM) throw new SpecError(`layer ${i}: ${Math.floor(D / H)} values per head is more than ${MAX_HEAD_DIM}`);
    if (!(M >= 1 && M <= MAX_MLP)) throw new SpecError(`layer ${i}: a block's MLP has 1 to ${MAX_MLP} units, not ${M}`);
    if (shape.seq !== T || shape.width !== D) {
      throw new SpecError(`layer ${i}: block${D}h${H} of context ${T} on rows of context ${shape.seq} and ` +
        `width ${shape.width}: every block has the embedding's width`);
    }
    return shape;
  }

  /** (multiply, requantize, relu) of R = b*T rows (attention.py Block.units). */
  units(R) {
    const D = this.nIn;
    const H = this.heads;
    const T = this.context;
    const M = this.mlp;
    const mul = 12 * R * D * D + 6 * R * D * M + 6 * R * T * D;
    const rq = 6 * R * D + R * M + 11 * R * D + R * M + R * H * T;
    return [mul, rq, R * M];
  }

  /** exp unit reads of one micro-batch of b samples. */
  expUnits(b) {
    return (b * this.heads * this.context * (this.context + 1)) / 2;
  }

  async forward(ctx, st) {
    const { units, tr, li } = ctx;
    const D = this.nIn;
    const H = this.heads;
    const T = this.context;
    const dh = D / H;
    const a = attnShift(dh);
    const name = `layers.${li}`;
    const P = ctx.params;
    const X = st.a;
    const ex = st.ex;
    const R = X.length / D;
    const b = R / T;
    const nb = b * H;
    const n1 = await rmsnorm(ctx, X, R, D, `${name}.norm1`);
    const qkv = [];
    for (const [j, t] of ["q", "k", "v"].entries()) {
      const f = await affine(ctx, `${name}.${t}`, n1.q, n1.e, P[2 * j], P[2 * j + 1], R, D, D);
      const r = await rq8(units, f.acc, f.sexp);
      tr(`${name}.${t}.out_q`, r.q);
      qkv.push({ q: r.q, e: r.e, Wq: f.Wq, ew: f.ew });
    }
    const [Qh, Kh, Vh] = qkv.map((m) => toHeads(m.q, b, T, H, dh));
    const Sc = await units.gemmBatch(Qh, Kh, { batch: nb, m: T, k: dh, n: T, transB: true });
    const Pm = await units.softmax(Sc, nb, T, qkv[0].e + qkv[1].e - a);
    tr(`${name}.scores`, Sc);
    tr(`${name}.probs`, Pm);
    const O = await units.gemmBatch(Pm, Vh, { batch: nb, m: T, k: T, n: dh });
    const oa = await rq8(units, fromHeads(O, b, T, H, dh), qkv[2].e - 7);
    tr(`${name}.attn.out_q`, oa.q);
    const fo = await affine(ctx, `${name}.o`, oa.q, oa.e, P[6], P[7], R, D, D);
    const x1 = alignAdd([[X, ex], [fo.acc, fo.sexp]]);
    tr(`${name}.resid1`, x1.V);
    const n2 = await rmsnorm(ctx, x1.V, R, D, `${name}.norm2`);
    const f1 = await affine(ctx, `${name}.fc1`, n2.q, n2.e, P[8], P[9], R, D, this.mlp);
    const s1 = Math.max(bitlen(absmax(f1.acc)) - 7, 0);
    const H1 = await units.requantize(f1.acc, s1, { relu: true }); // relu(requantize(.)): both units
    const eh = f1.sexp + s1;
    tr(`${name}.fc1.out_q`, H1);
    const f2 = await affine(ctx, `${name}.fc2`, H1, eh, P[10], P[11], R, this.mlp, D);
    const x2 = alignAdd([[x1.V, x1.e], [f2.acc, f2.sexp]]);
    tr(`${name}.out`, x2.V);
    tr(`${name}.out_exponent`, [x2.e]);
    const entry = { layer: this, pi: ctx.pi, li, ex, A1: n1.q, en1: n1.e, nc1: n1.cache, qkv, Qh, Kh, Vh, P: Pm,
      Oa: oa.q, eo: oa.e, Wo: fo.Wq, ewo: fo.ew, ex1: x1.e, A2: n2.q, en2: n2.e, nc2: n2.cache,
      W1: f1.Wq, ew1: f1.ew, H1, eh, W2: f2.Wq, ew2: f2.ew, a, dims: { b, T, H, dh, R }, reluOut: null };
    return { st: { a: x2.V, ex: x2.e }, entry };
  }

  /** From the wide stream error (E, eg): the parameters' gradients, and the stream error of
   *  the block's input (wide). */
  async backward(ctx, c, E, eg) {
    const { units } = ctx;
    const { b, T, H, dh, R } = c.dims;
    const D = this.nIn;
    const M = this.mlp;
    const nb = b * H;
    const pi = c.pi;
    const inner = { ...ctx, needInput: true };
    // site j's requantize of an error: stochastic in a sequence model (sround.js), else rq8
    const rqe = (j, V, e) => (ctx.skeys ? requantizeErrors(units, V, e, ctx.skeys, siteKey(c.li, j)) : rq8(units, V, e));
    // MLP branch
    const g3 = await rqe(0, E, eg);
    const r2 = await denseBackward(inner, g3.q, g3.e, c.H1, c.eh, c.W2, c.ew2, R, M, D, pi + 10);
    const dH = r2.dX;
    for (let j = 0; j < dH.length; j++) if (!(c.H1[j] > 0)) dH[j] = 0;
    const gh = await rqe(1, dH, r2.e);
    const r1 = await denseBackward(inner, gh.q, gh.e, c.A2, c.en2, c.W1, c.ew1, R, D, M, pi + 8);
    const g2 = await rqe(2, r1.dX, r1.e);
    const d2 = rmsBackward(g2.q, g2.e, c.ex1, c.nc2, R, D);
    let s = alignAdd([[E, eg], [d2.V, d2.e]]);
    // attention branch
    const go = await rqe(3, s.V, s.e);
    const ro = await denseBackward(inner, go.q, go.e, c.Oa, c.eo, c.Wo, c.ewo, R, D, D, pi + 6);
    const ga = await rqe(4, ro.dX, ro.e);
    const Gah = toHeads(ga.q, b, T, H, dh);
    const [eq, ek, ev] = c.qkv.map((m) => m.e);
    const dP = await units.gemmBatch(Gah, c.Vh, { batch: nb, m: T, k: dh, n: T, transB: true }); // ega + ev
    const dV = await units.gemmBatch(c.P, Gah, { batch: nb, m: T, k: T, n: dh, transA: true }); // ega - 7
    const dA = softmaxBack(c.P, dP, nb * T, T); // exponent ega + ev - 14
    const gs = await rqe(5, dA, ga.e + ev - 14);
    const dQ = await units.gemmBatch(gs.q, c.Kh, { batch: nb, m: T, k: T, n: dh }); // eS + ek - a
    const dK = await units.gemmBatch(gs.q, c.Qh, { batch: nb, m: T, k: T, n: dh, transA: true }); // eS + eq - a
    const errs = [];
    for (const [j, [dM, e]] of [[dQ, gs.e + ek - c.a], [dK, gs.e + eq - c.a], [dV, ga.e - 7]].entries()) {
      const g = await rqe(6 + j, fromHeads(dM, b, T, H, dh), e);
      const m = c.qkv[j];
      const r = await denseBackward(inner, g.q, g.e, c.A1, c.en1, m.Wq, m.ew, R, D, D, pi + 2 * j);
      const q = await rqe(9 + j, r.dX, r.e);
      errs.push([q.q, q.e]);
    }
    const sum = alignAdd(errs);
    const g1 = await rqe(12, sum.V, sum.e);
    const d1 = rmsBackward(g1.q, g1.e, c.ex, c.nc1, R, D);
    s = alignAdd([[s.V, s.e], [d1.V, d1.e]]);
    return { dX: s.V, e: s.e, wide: true };
  }
}
