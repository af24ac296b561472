// A micro-batch kept in the WebAssembly module's memory: the CPU twin of the GPU's resident
// pass (units/gpu_resident.js), for the image and dense stacks (conv2d, maxpool2d, linear,
// each relu folded into the layer below it).
//
// A plan is made once per (model, micro-batch size) with its own instance of the checked
// module and its own memory, every buffer of the pass laid out once: the input, each conv's
// padded int8 maps, packed int8 operands, accumulators, requantized outputs, errors and
// gradient sums. Per micro-batch the host writes the input and, when the parameters changed,
// the parameters, which the module quantizes (units.f64.wat absmax64, quant: detmath.js's
// float64 operations) and packs both ways (forward and input error); the bias in accumulator
// units per layer (layers.js biasAcc, float64) once the shifts below it are known. Then each
// layer is a few kernel calls on that memory (units.wat, units.op.wat, units.plan.wat), every
// GEMM on the outer-product kernel (units.op.wat gemm_op: A int8 rows, B interleaved by K
// pairs as int16, each lane its own output):
//   forward:  pad8 -> cols8 (the columns as packed int8 rows; a linear: pack) -> gemm_op
//             (B: the weights, interleaved by narrow_il) -> bias_rows (with the int32 range
//             check) -> absmax -> requantize (+ReLU) -> transpose (a conv: to channel-major)
//             -> maxpool;
//   backward: maxpool_back -> mask (the ReLU) -> narrow (the errors as Gᵀ) and il8 (the
//             forward's columns interleaved; a linear: narrow_il of its input) -> gemm_op (the
//             weight gradient) -> accum (the fixed-point sum) -> sum_blocks (the bias
//             gradient) -> accum -> narrow_il (a conv's G) or narrow (a linear's G rows) ->
//             gemm_op (a conv: Wqᵀ·Gᵀ, then col2im8t; a linear: G·Wq) -> absmax -> requantize.
// What leaves the module is the logits and the contribution: the caller's fixed-point total
// is copied into the module's memory, each layer's int32 weight-gradient and bias sums are
// added into it there (units.f64.wat accum: layers.js accumulate's float64 operations, one
// for one), and it is copied back. The host computes the shifts (detmath exponent) and the
// output error (model.js outputError, topErrors), so the bits are engine/model.js's, line
// for line. Every integer sum is exact: a product sum fits int32 for K <= MAX_K (gemm.js), a
// col2im sum for co*k*k <= MAX_K.
//
// A plan is used only after the module's self-check (wasm_units.js), which ends with whole
// micro-batches through fresh plans (planSelfCheck: their kernels' first, cold calls) against
// the JS units.
//
// Not planned (the engine then calls the units one by one, same bits): tokens models (an
// embedding, a transformer), a layer whose weight-gradient GEMM would need K above MAX_K
// (more than 131,071 rows), a pass above MAX_MEMORY.

import { MAX_K } from "../units/gemm.js";
import { UnitError } from "../units/units.js";
import { exponent, pow2, quantExponent } from "../engine/detmath.js";
import { biasAcc } from "../engine/layers.js";
import { Engine, IMAGE_EXPONENT, initParams, outputError, ParamLayout, topErrors } from "../engine/model.js";
import { kindOf } from "../engine/registry.js";
import { imageCnn, mlp } from "../engine/spec.js";

const MAX_MEMORY = 1024 * 1024 * 1024;
const MAX_PLANS = 4;
const up = (x, m) => Math.ceil(x / m) * m;

/** Why `spec` at micro-batch b has no plan here, or null. */
export function planUnsupported(spec, b) {
  if (spec.inputKind !== "image" && spec.inputKind !== "dense") return `a ${spec.inputKind} model`;
  const L = spec.layers;
  for (let i = 0; i < L.length; i++) {
    const k = kindOf(L[i]);
    if (k?.folds) {
      const op = kindOf(L[i - 1])?.op;
      if (i === L.length - 1 || !(op === "linear" || op === "conv")) return "an unfused relu";
    } else if (!(k && (k.op === "linear" || k.op === "conv" || k.op === "pool"))) return `a ${L[i].type} layer`;
    if (k?.op === "conv" && b * L[i].h * L[i].w > MAX_K) return "a weight gradient over more than MAX_K rows";
    if (k?.op === "conv" && L[i].co * L[i].k * L[i].k > MAX_K) return "an input error whose col2im sums could leave int32";
    if (k?.op === "linear" && b > MAX_K) return "a weight gradient over more than MAX_K rows";
  }
  return null;
}

/** The plan for (spec, b) made with units' module, or null where none applies; kept per spec
 *  object (a WeakMap: gone with the spec) and micro-batch size, the last MAX_PLANS sizes. */
export function planFor(units, spec, b) {
  const bySpec = units._plans || (units._plans = new WeakMap());
  let plans = bySpec.get(spec);
  if (!plans) bySpec.set(spec, plans = new Map());
  if (plans.has(b)) return plans.get(b);
  let plan = null;
  if (!planUnsupported(spec, b)) {
    try {
      plan = new WasmPlan(units, spec, b);
    } catch (err) {
      if (!(err instanceof RangeError)) throw err; // the browser would not grow the memory: the units one by one
    }
  }
  if (plans.size >= MAX_PLANS) plans.delete(plans.keys().next().value);
  plans.set(b, plan);
  return plan;
}

export class WasmPlan {
  constructor(units, spec, b) {
    this.spec = spec;
    this.b = b;
    this.layout = new ParamLayout(spec);
    this.top = 16;
    this.entries = [];
    this.params = [];
    this._layout();
    if (this.top > MAX_MEMORY) throw new RangeError("the pass needs more than MAX_MEMORY");
    const instance = new WebAssembly.Instance(units.module, {});
    this.k = instance.exports;
    this.mem = instance.exports.memory;
    const need = this.top - this.mem.buffer.byteLength;
    if (need > 0) this.mem.grow(Math.ceil(need / 65536));
    this.quantized = false;
  }

  _alloc(words) {
    const p = this.top;
    this.top = up(p + 4 * words, 16);
    return p;
  }

  /** Every buffer of the pass, once. */
  _layout() {
    const { spec, b } = this;
    const L = spec.layers;
    const A = (n) => this._alloc(n);
    this.inLen = b * spec.inputDim; // an image: pixels >> 1; dense: quantized features
    let cur = A(this.inLen);
    this.xf = spec.inputKind === "image" ? 0 : A(2 * this.inLen); // dense: the features as float64
    let curLen = this.inLen;
    let pi = 0;
    for (let li = 0; li < L.length; li++) {
      const layer = L[li];
      const op = kindOf(layer).op;
      const last = li === L.length - 1;
      if (op === "pool") {
        const { c, h, w } = layer;
        const n = b * c * (h >> 1) * (w >> 1);
        const e = { kind: "pool", layer, inp: cur, inLen: curLen, out: A(n), dX: A(curLen), reluOut: 0 };
        this.entries.push(e);
        cur = e.out;
        curLen = n;
        continue;
      }
      const conv = op === "conv";
      const rows = conv ? b * layer.h * layer.w : b;
      const nIn = layer.nIn;
      const nOut = conv ? layer.co : layer.nOut;
      // every GEMM on the outer-product kernel (gemm_op): A int8 rows, B interleaved by K
      // pairs as int16 (narrow_il, il8), C (mp % 4 == 0, np % 8 == 0)
      const [rp, np, kp] = [up(rows, 4), up(nOut, 8), up(nIn, 8)];
      const fuse = !last && !!kindOf(L[li + 1]).folds;
      const e = {
        kind: conv ? "conv" : "linear", layer, li, pi, rows, nIn, nOut, last, fuse, inp: cur, inLen: curLen,
        w: A(nOut * nIn), wP: A(np * Math.ceil(nIn / 2)), bias: A(nOut), // Wq interleaved over (nOut, K = nIn)
        aP: A(rp * kp / 4 + 4), c: A(rp * np), ld: np, acc: A(rows * nOut), reluOut: 0, // + 4: cols8's and il8's slack
      };
      if (conv) { // the input maps as int8 with a zero border of p (pad8), + 16 bytes of slack
        const { ci, h, w, k: kk } = layer;
        e.pad = A(Math.ceil((b * ci * (h + kk - 1) * (w + kk - 1)) / 4) + 4);
      }
      if (!last) {
        e.q = A(rows * nOut);
        e.out = conv ? A(rows * nOut) : e.q; // channel-major for a conv
        if (fuse) e.reluOut = e.out;
      }
      // backward
      const rk = up(rows, 8);
      e.gT = A(up(nOut, 4) * rk / 4); // Gᵀ (nOut, rows) int8
      e.aT = A(up(nIn, 16) * Math.ceil(rows / 2)); // the input (K = rows, nIn) interleaved (il8: up to 16 columns)
      e.dW = A(up(nOut, 4) * up(nIn, 8));
      e.db = A(nOut);
      if (conv) { // Wqᵀ as int8 rows, G interleaved; the input error's transpose (nIn, rows), then col2im8t
        e.wT = A(up(nIn, 4) * up(nOut, 8) / 4);
        e.ldX = up(rows, 8); // its row length
        e.gP = A(e.ldX * Math.ceil(nOut / 2));
        e.dXr = A(up(nIn, 4) * e.ldX);
        e.dXcm = A(curLen);
      } else { // G as int8 rows, Wq interleaved over (nIn, K = nOut); the input error (rows, nIn) in rows of ldX
        e.wI = A(up(nIn, 8) * Math.ceil(nOut / 2));
        e.ldX = up(nIn, 8);
        e.gP = A(up(rows, 4) * up(nOut, 8) / 4);
        e.dXr = A(up(rows, 4) * e.ldX);
        e.dX = e.ldX === nIn ? e.dXr : A(rows * nIn);
        e.dXcm = e.dX;
      }
      e.eq = A(curLen); // the requantized error below
      this.entries.push(e);
      this.params.push(e);
      pi += 2;
      if (last) break;
      if (fuse) li += 1;
      cur = e.out;
      curLen = rows * nOut;
    }
    this.zero = A(Math.max(...this.params.map((p) => p.nIn)));
    this.gTop = A(b * spec.classes);
    this.total = A(2 * this.layout.size); // the fixed-point total, float64
    this.thetas = [A(2 * this.layout.size), A(2 * this.layout.size)]; // float64: those last quantized (cur), the next
    this.cur = 0;
  }

  _i32(p, n) {
    return new Int32Array(this.mem.buffer, p, n);
  }

  _pack(src, dst, rows, cols, sr, sc, rowsP, colsP) {
    if (this.k.pack(src, dst, rows, cols, sr, sc, rowsP, colsP)) throw new UnitError("gemm: an operand left int8");
  }

  /** Quantized weights, packed both ways, once per parameter change. */
  _weights(theta) {
    const n = this.layout.size;
    if (theta.length < n) throw new RangeError(`${theta.length} parameters, the model has ${n}`);
    const next = this.thetas[1 - this.cur]; // the parameters copied in beside those last quantized
    new Float64Array(this.mem.buffer, next, n).set(theta.length === n ? theta : theta.subarray(0, n));
    if (this.quantized && this.k.same(this.thetas[this.cur], next, 8 * n)) return; // the same bits
    this.quantized = false;
    this.cur = 1 - this.cur;
    for (const p of this.params) { // detmath.js absmax, quantExponent and quantize, in the module
      const W = next + 8 * this.layout.offsets[p.pi];
      p.ew = quantExponent(this.k.absmax64(W, p.nOut * p.nIn));
      this.k.quant(W, p.w, p.nOut * p.nIn, pow2(-p.ew));
      this.k.narrow_il(p.w, p.wP, p.nOut, p.nIn, 1, Math.ceil(p.nIn / 2)); // the forward's B (|q| <= 127)
      if (p.wI) this.k.narrow_il(p.w, p.wI, 1, p.nOut, p.nIn, Math.ceil(p.nOut / 2)); // a linear's input error's B
      else this._pack(p.w, p.wT, p.nIn, p.nOut, 1, p.nIn, up(p.nIn, 4), up(p.nOut, 8)); // a conv's: its A, Wqᵀ
    }
    this.quantized = true;
  }

  _input(x) {
    const a = this._i32(this.entries[0].inp, this.inLen);
    if (x.length !== this.inLen) throw new RangeError(`a micro-batch of ${x.length} inputs, the plan takes ${this.inLen}`);
    if (this.spec.inputKind === "image") {
      for (let i = 0; i < x.length; i++) a[i] = x[i] >> 1;
      return IMAGE_EXPONENT;
    }
    // detmath.js absmax, quantExponent and quantize, the float64 operations in the module
    new Float64Array(this.mem.buffer, this.xf, x.length).set(x);
    const ex = quantExponent(this.k.absmax64(this.xf, x.length));
    this.k.quant(this.xf, this.entries[0].inp, x.length, pow2(-ex));
    return ex;
  }

  /** The shift of a requantize: max(exponent(max |v|) - 7, 0). */
  _shift(p, n) {
    return Math.max(exponent(this.k.absmax(p, n) >>> 0) - 7, 0);
  }

  /** The forward pass (engine/model.js forward, fused relus): {logits}. */
  _forward(theta, x) {
    const k = this.k;
    const b = this.b;
    this._weights(theta);
    let ex = this._input(x);
    for (const e of this.entries) {
      if (e.kind === "pool") {
        const { c, h, w } = e.layer;
        k.maxpool(e.inp, e.out, b * c, h, w);
        continue;
      }
      const { rows, nIn, nOut } = e;
      e.ex = ex;
      if (e.kind === "conv") { // the maps padded as int8, then the columns straight into the packed rows
        const { ci, h, w, k: kk } = e.layer;
        if (k.pad8(e.inp, e.pad, b * ci, h, w, (kk - 1) >> 1)) throw new UnitError("im2col: an input left int8");
        k.cols8(e.pad, e.aP, b, ci, h, w, kk, up(nIn, 8));
      } else this._pack(e.inp, e.aP, rows, nIn, nIn, 1, up(rows, 4), up(nIn, 8));
      k.gemm_op(e.aP, up(nIn, 8), e.wP, e.c, up(rows, 4), e.ld, Math.ceil(nIn / 2));
      const sexp = ex + e.ew;
      this._i32(e.bias, nOut).set(biasAcc(this.layout.view(theta, e.pi + 1), sexp));
      if (k.bias_rows(e.c, e.ld, rows, nOut, e.bias, e.acc)) throw new RangeError(`layer ${e.li}: accumulator left int32`);
      if (e.last) {
        const acc = this._i32(e.acc, rows * nOut);
        const scale = pow2(sexp);
        const logits = new Float64Array(acc.length);
        for (let i = 0; i < logits.length; i++) logits[i] = acc[i] * scale;
        return { logits };
      }
      const s = this._shift(e.acc, rows * nOut);
      k.requantize(e.acc, e.q, rows * nOut, s, e.fuse ? 1 : 0);
      if (e.kind === "conv") k.transpose(e.q, e.out, b, e.layer.h * e.layer.w, nOut);
      ex = sexp + s;
    }
    throw new Error("spec validation guarantees a final linear layer");
  }

  async forward(theta, x) {
    return this._forward(theta, x);
  }

  /** engine/model.js gradInto on this memory (no await inside: one pass at a time). */
  async gradInto(total, theta, x, y, fracBits, limit) {
    const { b, spec } = this;
    const { logits } = this._forward(theta, x);
    const o = outputError(spec, logits, y, b);
    const { G, eg } = topErrors(o.dz, o.labels, b, spec.classes);
    this._i32(this.gTop, G.length).set(G);
    const n = this.layout.size; // the total's first n values are the model's (as layers.js accumulate writes them)
    if (total.length < n) throw new RangeError(`a total of ${total.length} values, the model has ${n}`);
    const t = new Float64Array(this.mem.buffer, this.total, n);
    t.set(total.length === n ? total : total.subarray(0, n));
    this._backward(this.total, this.gTop, eg, fracBits, limit);
    total.set(t);
    return { loss: o.loss, correct: o.correct };
  }

  /** engine/model.js backwardFrom, layer by layer on this memory; `total`: the address of
   *  the float64 total in it. */
  _backward(total, G, eg, fracBits, limit) {
    const k = this.k;
    const b = this.b;
    const offsets = this.layout.offsets;
    const E = this.entries;
    for (let j = E.length - 1; j >= 0; j--) {
      const e = E[j];
      const below = j > 0 ? E[j - 1] : null;
      let dX;
      let ed;
      let int8 = false;
      if (e.kind === "pool") {
        if (!below) break;
        const { c, h, w } = e.layer;
        k.maxpool_back(G, e.inp, e.dX, b * c, h, w);
        [dX, ed, int8] = [e.dX, eg, true];
      } else {
        const { rows, nIn, nOut } = e;
        const hw = e.kind === "conv" ? e.layer.h * e.layer.w : 1; // G: (b, nOut, hw) channel-major
        const rk = up(rows, 8);
        let bad = k.narrow(G, e.gT, b, nOut, hw, hw, rk, 1); // Gᵀ (nOut, rows)
        const kh = Math.ceil(rows / 2); // the weight gradient's K pairs: the rows
        if (e.kind === "conv") k.il8(e.aP, up(nIn, 8), e.aT, rows, nIn, kh); // the forward's columns, interleaved
        else bad |= k.narrow_il(e.inp, e.aT, 1, rows, nIn, kh); // the input (K = rows, nIn), interleaved
        if (bad) throw new UnitError("gemm: an operand left int8");
        k.gemm_op(e.gT, rk, e.aT, e.dW, up(nOut, 4), up(nIn, 8), kh);
        // dW (nOut, nIn) read in place from the GEMM's rows of up(nIn, 8)
        k.accum(e.dW, up(nIn, 8), nOut, nIn, total + 8 * offsets[e.pi], pow2(eg + e.ex + fracBits), limit);
        k.sum_blocks(G, e.db, b, nOut, hw);
        k.accum(e.db, nOut, 1, nOut, total + 8 * offsets[e.pi + 1], pow2(eg + fracBits), limit);
        if (!below) break;
        if (e.kind === "conv" ? k.narrow_il(G, e.gP, b, nOut, hw, Math.ceil(nOut / 2)) // G interleaved
          : hw === 1 ? k.narrow(G, e.gP, 1, b, nOut, 0, up(nOut, 8), 1) // a linear's G: its rows, 16 bytes a step
            : k.narrow(G, e.gP, b, nOut, hw, hw * up(nOut, 8), 1, up(nOut, 8))) throw new UnitError("gemm: an operand left int8"); // G (rows, nOut)
        if (e.kind === "conv") {
          const { ci, h, w, k: kk } = e.layer;
          k.gemm_op(e.wT, up(nOut, 8), e.gP, e.dXr, up(nIn, 4), e.ldX, Math.ceil(nOut / 2)); // (Wqᵀ · Gᵀ): (nIn, rows)
          k.col2im8t(e.dXr, e.dXcm, b, ci, h, w, kk, e.ldX);
        } else {
          k.gemm_op(e.gP, up(nOut, 8), e.wI, e.dXr, up(rows, 4), e.ldX, Math.ceil(nOut / 2)); // G · Wq: (rows, nIn)
          if (e.dX !== e.dXr) k.bias_rows(e.dXr, e.ldX, rows, nIn, this.zero, e.dX); // compact the rows
        }
        [dX, ed] = [e.dXcm, eg + e.ew];
      }
      if (below.reluOut) k.mask(dX, below.reluOut, e.inLen);
      if (int8) {
        [G, eg] = [dX, ed];
      } else {
        const s = this._shift(dX, e.inLen);
        k.requantize(dX, e.eq, e.inLen, s, 0);
        [G, eg] = [e.eq, ed + s];
      }
    }
  }
}

/** null when whole micro-batches through fresh plans (their kernels' first, cold calls) give
 *  the JS units' contribution, else the first difference: a small CNN (a conv on a conv, 3x3
 *  and 5x5, an odd map's pool, a hidden linear with its relu, 3 samples) and an MLP. */
export async function planSelfCheck(wasm, cpu) {
  const cases = [["a small CNN", imageCnn(1, 10, 8, ["conv3", "conv4k5", "pool", "conv5", "pool", 6], 3), 3],
    ["an MLP", mlp(7, 9, 4), 5]];
  for (const [name, spec, b] of cases) {
    const theta = initParams(spec, 5);
    let seed = 0x9e3779b9;
    const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
    const x = spec.inputKind === "image" ? Uint8Array.from({ length: b * spec.inputDim }, () => rnd(256))
      : Float64Array.from({ length: b * spec.inputDim }, () => rnd(41) - 20);
    const y = Int32Array.from({ length: b }, () => rnd(spec.classes));
    const got = new Float64Array(theta.length);
    const want = new Float64Array(theta.length);
    try {
      await new WasmPlan(wasm, spec, b).gradInto(got, theta, x, y, 40, 2 ** 49);
    } catch (err) {
      return `the micro-batch of ${name}: ${err.message}`;
    }
    await new Engine(spec, cpu).gradInto(want, theta, x, y, b, 40, 2 ** 49);
    const i = got.findIndex((v, j) => v !== want[j]);
    if (i >= 0) return `the micro-batch of ${name}: parameter ${i} gets ${got[i]}, the JS units give ${want[i]}`;
  }
  return null;
}
