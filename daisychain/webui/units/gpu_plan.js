// One resident plan (gpu_resident.js has what it is and how it is chosen and checked): the
// buffers, bind groups and dispatches of one micro-batch's forward and backward pass for one
// model, micro-batch size and GEMM kernel, made once; per micro-batch the host's part
// (quantized weights and bias tables on a parameter change, the input, the output error, the
// fixed-point sum of what the backward pass reads back) and the two submits.

import { MAX_K } from "./gemm.js";
import { SPLIT_GROUPS, colsumOps, colsumParts, gemmOps, gemmParts, packRows, sumSlots, transpose } from "./gpu_split.js";
import { POISON } from "./units.js";
import { absmax, pow2, quantExponent, quantize } from "../engine/detmath.js";
import { accumulate, biasAcc } from "../engine/layers.js";
import { IMAGE_EXPONENT, outputError, ParamLayout, topErrors } from "../engine/model.js";
import { LAYER_TYPES, kindOf } from "../engine/registry.js";

/** The largest requantize shift: max |acc| < 2^32 has at most 32 bits, s = bits - 7. */
const MAX_SHIFT = 25;
/** The columns x rows of C a workgroup of each GEMM kernel computes (its dispatch grid), and
 *  of its narrow variant (res_gemm_lanes_narrow.wgsl), used for n <= NARROW_N columns. */
const GEMM_BLOCK = { tiled: [32, 32], direct: [32, 32], packed: [32, 32], lanes: [32, 256] };
const NARROW_BLOCK = { lanes: [16, 128] };
const NARROW_N = 16;
/** A plan that would pass this GPU's limits: the units are called one by one instead. */
export class PlanLimit extends Error {}

/** The kinds a resident pass is planned for (engine/registry.js): those a compiled path lowers
 *  to an op (linear, conv, pool), the relu it folds into a linear or conv, and the embedding that
 *  reads the tokens (the host's gather); a transformer's kinds run the units one by one. */
const planned = (k) => !!(k && (k.op || k.folds || k.readsTokens));
const PLANNED = Object.values(LAYER_TYPES).filter(planned).map((k) => k.type);
/** A linear or conv: the ops a folded relu may follow. */
const affine = (k) => k?.op === "linear" || k?.op === "conv";

/** Why a spec has no resident plan, or null. */
export function unsupported(spec) {
  const L = spec.layers;
  for (let i = 0; i < L.length; i++) {
    const k = kindOf(L[i]);
    if (!planned(k)) return `a ${L[i].type} layer (the resident pass plans ${PLANNED.join(", ")})`;
    if (k.readsTokens && i !== 0) return "an embedding above the first layer";
    if (k.folds && !(i > 0 && affine(kindOf(L[i - 1])))) return "an unfused relu";
  }
  return null;
}

export class ResidentPlan {
  /** kernel: the GEMM kernel, a key of plans.gemms ("tiled" | "direct" | "packed" | "lanes");
   *  split: the workgroups a split sum aims at (gpu_split.js), false: none; by default
   *  gpu.residentSplit, else SPLIT_GROUPS. */
  constructor(plans, spec, b, kernel, split = undefined) {
    this.gpu = plans.gpu;
    this.device = plans.gpu.device;
    this.kernel = kernel;
    this.splitTarget = split !== undefined ? split : (plans.gpu.residentSplit ?? SPLIT_GROUPS);
    this.packed = kernel === "packed"; // res_gemm_packed.wgsl on operands packed four int8 a word
    this.block = GEMM_BLOCK[kernel] || GEMM_BLOCK.direct;
    this.narrowBlock = NARROW_BLOCK[kernel] || null;
    // res_gemm_lanes.wgsl reads B's columns contiguous: the forward pass on the weights transposed
    this.transposedWeights = kernel === "lanes";
    this.pipelines = { ...plans.pipelines, gemm: plans.gemms[kernel], gemm_narrow: plans.narrow[kernel] };
    this.spec = spec;
    this.b = b;
    this.layout = new ParamLayout(spec);
    this.buffers = [];
    this.fwd = [];
    this.bwd = [];
    this.params = []; // param layers: {layer, pi, wq, btab, rows, fpoint, nIn, nOut, ...}
    this.theta = null; // the parameters last uploaded (a copy)
    this.ex0 = null; // the input exponent the bias tables were made for
    this._busy = Promise.resolve();
    this._build();
  }

  destroy() {
    for (const buf of this.buffers) buf.destroy();
    this.buffers = [];
  }

  _buf(n, label) {
    const bytes = Math.max(4, n * 4);
    const lim = this.gpu.limits;
    if (bytes > lim.maxStorageBufferBindingSize || bytes > lim.maxBufferSize) throw new PlanLimit(label);
    const buf = this.device.createBuffer({
      label, size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
    });
    this.buffers.push(buf);
    return buf;
  }

  /** One dispatch of a pass: its uniforms, bind group and grid made now, once. */
  _op(list, kernel, words, bound, grid) {
    const d = this.device;
    const uni = d.createBuffer({ label: `${kernel} params`, size: Math.max(16, words.length * 4), usage: GPUBufferUsage.UNIFORM, mappedAtCreation: true });
    new Uint32Array(uni.getMappedRange()).set(words);
    uni.unmap();
    this.buffers.push(uni);
    const pipeline = this.pipelines[kernel];
    const group = d.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [uni, ...bound].map((buffer, binding) => ({ binding, resource: { buffer } })),
    });
    list.push({ pipeline, group, grid, kernel, words });
  }

  _grid(n) {
    return this.gpu._grid1d(n);
  }

  /** C[cOff + row * n + col] = op(A) op(B) (gpu_split.js gemmOps: split over K when the GEMM
   *  has few workgroups, into C's own room when inPlace; with the packed kernel, pa / pb: A / B
   *  already packed). */
  _gemm(list, A, B, C, { m, k, n, transA = false, transB = false, aOff = 0, bOff = 0, cOff = 0, pa = null, pb = null, inPlace = false }) {
    const grid = this._gemmGrid(m, n);
    const [aSm, aSk] = transA ? [1, m] : [k, 1];
    const [bSk, bSn] = transB ? [1, k] : [n, 1];
    const kernel = this._narrow(n) ? "gemm_narrow" : "gemm";
    gemmOps(this, list, A, B, C, { m, k, n, aOff, aSm, aSk, bOff, bSk, bSn, cOff, grid, pa, pb, inPlace, kernel });
  }

  _narrow(n) {
    return !!this.narrowBlock && n <= NARROW_N;
  }

  _gemmGrid(m, n) {
    const max = this.gpu.limits.maxComputeWorkgroupsPerDimension;
    const block = this._narrow(n) ? this.narrowBlock : this.block;
    const grid = [Math.ceil(n / block[0]), Math.ceil(m / block[1])];
    if (grid[0] > max || grid[1] > max) throw new PlanLimit("gemm grid");
    return grid;
  }

  /** max |x| into state slot, after the ReLU mask when `mask` (a buffer) is given. */
  _absmax(list, state, x, n, slot, mask) {
    this._op(list, "absmax", [n, slot, mask ? 1 : 0, 0], [x, mask || this.dummy, state], this._grid(Math.ceil(n / 32)));
  }

  /** relu?(requantize(x)) into out, the shift from max |x| in state[slot] (res_requantize.wgsl). */
  _requant(list, state, x, out, n, slot, tin, relu) {
    this._op(list, "requantize", [n, slot, relu ? 1 : 0, tin], [x, out, state], this._grid(n));
  }

  _build() {
    const { spec, b } = this;
    const L = spec.layers;
    this.dummy = this._buf(1, "no mask");
    // an embedding (the first layer, spec validation) is the host's: its rows are gathered
    // into the input, and its gradient scattered from the raw input error read back
    this.embed = kindOf(L[0]).readsTokens ? L[0] : null;
    this.input = this._buf(b * spec.inputDim * (this.embed ? this.embed.nOut : 1), "input");
    // forward: a point is a requantize, with 3 state words (max |acc|, shift, shifts so far);
    // ops are closures run once the state buffer exists
    const entries = [];
    const ops = [];
    let cur = this.input;
    let points = 0;
    let pi = this.embed ? 1 : 0;
    for (let li = this.embed ? 1 : 0; li < L.length; li++) {
      const layer = L[li];
      const last = li === L.length - 1;
      const fuse = !last && !!kindOf(L[li + 1]).folds;
      const op = kindOf(layer).op;
      if (op === "pool") { // a pool that does not follow a conv (those are fused into its requantize)
        const { c, h, w } = layer;
        const n = b * c * (h >> 1) * (w >> 1);
        const src = cur;
        const out = this._buf(n, `layer ${li} pool`);
        ops.push((list) => this._op(list, "maxpool", [n, h, w, 0], [src, out], this._grid(n)));
        entries.push({ kind: "pool", layer, a: src, n: b * c * h * w, reluOut: null });
        cur = out;
        continue;
      }
      // linear or conv2d: the conv is im2col, then the linear layer's arithmetic on the columns
      const conv = op === "conv";
      const rows = conv ? b * layer.h * layer.w : b;
      const nIn = layer.nIn;
      const nOut = conv ? layer.co : layer.nOut;
      if (rows * 127 >= 2 ** 31) throw new PlanLimit("bias gradient");
      const p = { layer, conv, li, pi, rows, nIn, nOut, point: last ? -1 : points, tin: points === 0 ? 2 : 3 * points + 2 };
      p.tableRows = MAX_SHIFT * points + 1;
      p.wq = this._buf(nOut * nIn, `layer ${li} weights`);
      p.btab = this._buf(p.tableRows * nOut, `layer ${li} bias table`);
      p.a = cur;
      if (this.packed) { // the weights packed on the host for the forward and input-error GEMMs
        p.wqP = this._buf(nOut * Math.ceil(nIn / 4), `layer ${li} weights, packed`);
        p.wqTP = this._buf(nIn * Math.ceil(nOut / 4), `layer ${li} weights transposed, packed`);
      }
      p.wqT = this.transposedWeights ? this._buf(nIn * nOut, `layer ${li} weights transposed`) : null;
      p.colsP = null; // the packed kernel's columns, made from the map (res_im2col_pack.wgsl)
      if (conv && this.packed && rows <= MAX_K && this.gpu.residentIm2colPack !== false) {
        const { ci, k, h, w } = layer;
        const src = cur;
        const colsP = this._buf(rows * Math.ceil(nIn / 4), `layer ${li} columns, packed`);
        ops.push((list) => this._op(list, "im2col_pack", [rows, ci, k, (k - 1) >> 1, h, w, rows, 0], [src, colsP], this._grid(rows)));
        p.colsP = colsP;
      } else if (conv) {
        const { ci, k, h, w } = layer;
        const n = rows * nIn;
        const src = cur;
        const cols = this._buf(n, `layer ${li} columns`);
        const inv = rows * ci; // res_im2col.wgsl: one invocation per row and channel
        ops.push((list) => this._op(list, "im2col", [inv, ci, k, (k - 1) >> 1, h, w, rows, 0], [src, cols], this._grid(inv)));
        p.a = cols;
      }
      const n = rows * nOut;
      // a split GEMM leaves its partials in the accumulator's room, summed by res_bias_absmax.wgsl
      const parts = gemmParts(this, rows, nIn, nOut);
      const acc = this._buf(parts * n, `layer ${li} accumulator`);
      const slot = 3 + 3 * points;
      const biasGrid = [Math.ceil(nOut / 4), Math.ceil(rows / 256)]; // res_bias_absmax.wgsl: 4 x 16 of 16 rows
      if (biasGrid[1] > this.gpu.limits.maxComputeWorkgroupsPerDimension) throw new PlanLimit("bias grid");
      ops.push((list, state) => {
        if (p.wqT) this._gemm(list, p.a, p.wqT, acc, { m: rows, k: nIn, n: nOut, inPlace: true });
        else this._gemm(list, p.a, p.wq, acc, { m: rows, k: nIn, n: nOut, transB: true, pa: p.colsP, pb: p.wqP, inPlace: true });
        // the partials' sum, the bias, and max |acc| for the requantize (the logits need none)
        this._op(list, "bias_absmax", [rows, nOut, p.tin, p.tableRows, last ? 0 : slot, last ? 0 : 1, parts, n],
          [p.btab, acc, state], biasGrid);
      });
      const entry = { kind: conv ? "conv" : "linear", layer, p, reluOut: null };
      entries.push(entry);
      this.params.push(p);
      pi += 2;
      if (last) {
        this.logits = acc;
        break;
      }
      points += 1;
      if (conv) { // requantize, ReLU, channel-major and the pool above, in one pass
        const at = li + (fuse ? 2 : 1);
        const pool = at < L.length && kindOf(L[at]).op === "pool" ? L[at] : null;
        const { h, w } = layer;
        const map = this._buf(n, `layer ${li} channel-major`);
        const pooled = pool ? this._buf(b * nOut * (h >> 1) * (w >> 1), `layer ${at} pool`) : this.dummy;
        const wins = b * ((h + 1) >> 1) * ((w + 1) >> 1) * nOut;
        ops.push((list, state) => this._op(list, "requantize_map", [wins, nOut, h, w, slot, p.tin, fuse ? 1 : 0, pool ? 1 : 0],
          [acc, map, pooled, state], this._grid(wins)));
        cur = map;
        if (fuse) entry.reluOut = map;
        if (pool) {
          entries.push({ kind: "pool", layer: pool, a: map, n, reluOut: null });
          cur = pooled;
          li = at;
          continue;
        }
      } else {
        const q = this._buf(n, `layer ${li} requantized`);
        ops.push((list, state) => this._requant(list, state, acc, q, n, slot, p.tin, fuse));
        cur = q;
        if (fuse) entry.reluOut = q;
      }
      if (fuse) li += 1;
    }
    this.points = points;
    this.fstate = this._buf(3 * points + 3, "forward state");
    for (const op of ops) op(this.fwd, this.fstate);
    this.entries = entries;
    this._buildBackward();
    const d = this.device;
    this.fStage = d.createBuffer({ label: "forward read-back", size: (b * spec.classes + 3 * points + 3) * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    this.embedLen = this.embed ? b * spec.inputDim * this.embed.nOut : 0;
    this.bStage = d.createBuffer({ label: "backward read-back", size: (this.gradLen + 3 * this.bpoints + 3 + this.embedLen) * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    this.buffers.push(this.fStage, this.bStage);
    this.gradPoison = new Int32Array(this.gradLen).fill(POISON);
    this.logitsPoison = new Int32Array(b * spec.classes).fill(POISON);
  }

  _buildBackward() {
    const { b, entries } = this;
    this.gTop = this._buf(b * this.spec.classes, "output errors");
    // the gradient: per param layer its weight parts (rows split by MAX_K, each split over K in
    // place: gpu_split.js), then its bias (split over rows in place); the host adds the slots
    let off = 0;
    for (const p of this.params) {
      p.parts = [];
      p.wSlots = [];
      for (let r0 = 0; r0 < p.rows; r0 += MAX_K) {
        const r1 = Math.min(p.rows, r0 + MAX_K);
        p.parts.push({ r0, r1, off });
        for (let z = gemmParts(this, p.nOut, r1 - r0, p.nIn); z > 0; z--) {
          p.wSlots.push(off);
          off += p.nOut * p.nIn;
        }
      }
      p.bOff = off;
      p.bSlots = [];
      for (let z = colsumParts(this, p.rows, p.nOut); z > 0; z--) {
        p.bSlots.push(off);
        off += p.nOut;
      }
    }
    this.gradLen = off;
    this.grad = this._buf(off, "gradient");
    const steps = []; // [entry, int8, point] top to bottom
    const ops = [];
    let G = this.gTop;
    let Gslot = null; // G's raw errors, requantized by the pool's backward that reads them (the shift from this state slot)
    let rowsLayout = true; // G as a conv's rows (b*h*w, c), not channel-major (b, c*h*w): the
    // output errors are the top layer's accumulator's layout, below only a pool's backward writes rows
    let bpoints = 0;
    for (let k = entries.length - 1; k >= 0; k--) {
      const e = entries[k];
      const below = k > 0 ? entries[k - 1] : null;
      let dX = null;
      let dXRows = false;
      let int8 = false;
      let col2im = null; // a conv's col2im, made with the requantize below it
      let mask = below ? below.reluOut : null;
      if (e.kind === "pool") {
        if (!below) break;
        // the errors to each window's first maximum, the ReLU mask below (its output is this
        // pool's input) and the conv's rows below, in one pass
        const { c, h, w } = e.layer;
        const d = this._buf(e.n, "pool errors");
        const g = G;
        const gslot = Gslot;
        const masked = !!mask && mask === e.a;
        dXRows = below.kind === "conv";
        const wins = b * ((h + 1) >> 1) * ((w + 1) >> 1) * c;
        ops.push((list, state) => this._op(list, "pool_back", [wins, c, h, w, masked ? 1 : 0, dXRows ? 1 : 0, gslot === null ? 0 : 1, gslot ?? 0],
          [g, e.a, d, gslot === null ? this.dummy : state], this._grid(wins)));
        if (masked) mask = null;
        Gslot = null;
        dX = d;
        int8 = true;
      } else {
        const p = e.p;
        let Gr = G;
        if (p.conv && !rowsLayout) {
          Gr = this._buf(p.rows * p.nOut, `layer ${p.li} errors by rows`);
          const g = G;
          const n = p.rows * p.nOut;
          ops.push((list) => this._op(list, "permute", [n, p.layer.h * p.layer.w, p.nOut, 1], [g, Gr], this._grid(n)));
        }
        let colsT = null; // the packed kernel's columns transposed, made from the map
        if (p.colsP) {
          const { ci, k: kk, h, w } = p.layer;
          const inv = Math.ceil(p.rows / 4) * ci;
          colsT = this._buf(p.nIn * Math.ceil(p.rows / 4), `layer ${p.li} columns transposed, packed`);
          ops.push((list) => this._op(list, "im2col_pack", [inv, ci, kk, (kk - 1) >> 1, h, w, p.rows, 1], [p.a, colsT], this._grid(inv)));
        }
        for (const part of p.parts) {
          ops.push((list) => this._gemm(list, Gr, p.a, this.grad, {
            m: p.nOut, k: part.r1 - part.r0, n: p.nIn, transA: true,
            aOff: part.r0 * p.nOut, bOff: part.r0 * p.nIn, cOff: part.off, pb: colsT, inPlace: true,
          }));
        }
        ops.push((list) => colsumOps(this, list, Gr, this.grad, p.rows, p.nOut, p.bOff, true));
        if (below) {
          const dXr = this._buf(p.rows * p.nIn, `layer ${p.li} input errors`);
          ops.push((list) => this._gemm(list, Gr, p.wq, dXr, { m: p.rows, k: p.nOut, n: p.nIn, pb: p.wqTP }));
          dX = dXr; // a linear layer's input errors in its input's layout: a map's channel-major
          if (p.conv) { // col2im, with the mask and max |x| of the requantize below (res_col2im.wgsl)
            const { ci, k: kk, h, w } = p.layer;
            dX = this._buf(b * ci * h * w, `layer ${p.li} input errors, channel-major`);
            const d = dX;
            const inv = b * ci * h * ((w + 3) >> 2);
            col2im = (list, state, slot, m) => this._op(list, "col2im", [inv, ci, kk, (kk - 1) >> 1, h, w, m ? 1 : 0, slot],
              [dXr, d, m || this.dummy, state], this._grid(inv));
          }
        }
      }
      if (!below && this.embed) { // the embedding's raw input error, read back
        this.embedDX = this._buf(e.p.rows * e.p.nIn, "embedding errors");
        ops.push((list) => this._gemm(list, G, e.p.wq, this.embedDX, { m: e.p.rows, k: e.p.nOut, n: e.p.nIn, pb: e.p.wqTP }));
      }
      if (!below) {
        steps.push({ e, int8, point: -1 });
        break;
      }
      const n = below.kind === "pool" ? below.layer.c * (below.layer.h >> 1) * (below.layer.w >> 1) * b
        : below.p.rows * below.p.nOut;
      const x = dX;
      const m = mask;
      if (int8) {
        if (m) ops.push((list, state) => this._absmax(list, state, x, n, 0, m)); // the mask only
        steps.push({ e, int8, point: -1 });
        G = dX;
      } else {
        const slot = 3 + 3 * bpoints;
        const moved = col2im;
        steps.push({ e, int8, point: bpoints });
        bpoints += 1;
        if (below.kind === "pool" && k > 1) { // the pool's backward requantizes the errors as it reads them
          ops.push((list, state) => {
            if (moved) moved(list, state, slot, m);
            else this._absmax(list, state, x, n, slot, m);
          });
          G = x;
          Gslot = slot;
          rowsLayout = dXRows;
          continue;
        }
        const q = this._buf(n, `errors below layer ${e.p.li}`);
        ops.push((list, state) => {
          if (moved) moved(list, state, slot, m);
          else this._absmax(list, state, x, n, slot, m);
          this._requant(list, state, x, q, n, slot, 2, false);
        });
        G = q;
      }
      rowsLayout = dXRows;
    }
    this.bpoints = bpoints;
    this.bstate = this._buf(3 * bpoints + 3, "backward state");
    for (const op of ops) op(this.bwd, this.bstate);
    this.steps = steps;
  }

  // -- per micro-batch ---------------------------------------------------------------------

  /** Quantized weights once per parameter change; bias tables per change or input exponent. */
  _weights(theta) {
    const q = this.device.queue;
    const same = this.theta && this.theta.length === theta.length && this.theta.every((v, i) => v === theta[i]);
    if (!same) {
      this.theta = Float64Array.from(theta);
      if (this.embed) {
        const E = this.layout.view(theta, 0);
        this.ee = quantExponent(absmax(E));
        this.Eq = quantize(E, this.ee);
      }
      for (const p of this.params) {
        const W = this.layout.view(theta, p.pi);
        p.ew = quantExponent(absmax(W));
        const wq = quantize(W, p.ew);
        q.writeBuffer(p.wq, 0, wq);
        if (p.wqP) {
          q.writeBuffer(p.wqP, 0, packRows(wq, p.nOut, p.nIn, p.nIn, 1));
          q.writeBuffer(p.wqTP, 0, packRows(wq, p.nIn, p.nOut, 1, p.nIn));
        }
        if (p.wqT) q.writeBuffer(p.wqT, 0, transpose(wq, p.nOut, p.nIn));
      }
      this.ex0 = null;
    }
  }

  _biasTables(theta, ex0) {
    const q = this.device.queue;
    if (this.ex0 === ex0) return;
    this.ex0 = ex0;
    let base = ex0;
    for (const p of this.params) {
      base += p.ew;
      const bias = this.layout.view(theta, p.pi + 1);
      const tab = new Int32Array(p.tableRows * p.nOut);
      for (let t = 0; t < p.tableRows; t++) tab.set(biasAcc(bias, base + t), t * p.nOut);
      q.writeBuffer(p.btab, 0, tab);
    }
  }

  _input(x) {
    if (this.embed) { // layers.js Embedding.forward: the quantized rows of the tokens
      const D = this.embed.nOut;
      const a = new Int32Array(x.length * D);
      for (let t = 0; t < x.length; t++) a.set(this.Eq.subarray(x[t] * D, x[t] * D + D), t * D);
      return { a, ex: this.ee };
    }
    if (this.spec.inputKind === "image") {
      const a = new Int32Array(x.length);
      for (let i = 0; i < x.length; i++) a[i] = x[i] >> 1;
      return { a, ex: IMAGE_EXPONENT };
    }
    const ex = quantExponent(absmax(x));
    return { a: quantize(x, ex), ex };
  }

  /** Encode a pass, submit it once, and read back `words` words of the buffers copied. The
   *  error scopes (validation, out-of-memory, internal: gpu.js _scoped's) are popped while
   *  the read-back is mapped, so the pass waits on the GPU once. */
  async _pass(what, list, clear, copies, stage, words) {
    const gpu = this.gpu;
    const d = this.device;
    gpu._assertUsable();
    for (const scope of ["internal", "out-of-memory", "validation"]) d.pushErrorScope(scope);
    let thrown = null;
    try {
      const enc = d.createCommandEncoder({ label: what });
      enc.clearBuffer(clear);
      const pass = enc.beginComputePass({ label: what });
      for (const op of list) {
        pass.setPipeline(op.pipeline);
        pass.setBindGroup(0, op.group);
        pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2] || 1);
      }
      pass.end();
      let at = 0;
      for (const [buf, n] of copies) {
        enc.copyBufferToBuffer(buf, 0, stage, at * 4, n * 4);
        at += n;
      }
      d.queue.submit([enc.finish()]);
    } catch (err) {
      thrown = err;
    }
    const scopes = [d.popErrorScope(), d.popErrorScope(), d.popErrorScope()];
    const mapped = thrown ? Promise.resolve(null) : stage.mapAsync(GPUMapMode.READ).then(() => null, (err) => err);
    const errors = (await Promise.all(scopes)).filter(Boolean).map((e) => e.message);
    const mapError = await mapped;
    const text = (err) => (err && err.message ? err.message : String(err));
    if (thrown) gpu._fail(`the resident ${what} pass failed: ${text(thrown)}`);
    if (errors.length) {
      if (!mapError) stage.unmap();
      gpu._fail(`the resident ${what} pass failed: ${errors.join("; ")}`);
    }
    if (mapError) gpu._fail(`reading back the resident ${what} pass failed: ${text(mapError)}`);
    const out = new Int32Array(stage.getMappedRange(0, words * 4).slice(0));
    stage.unmap();
    return out;
  }

  /** The forward pass: {logits (float64), sexp per param layer's input ex}. */
  async _forward(theta, x) {
    this._weights(theta);
    const { a, ex } = this._input(x);
    this._biasTables(theta, ex);
    const q = this.device.queue;
    q.writeBuffer(this.input, 0, a);
    q.writeBuffer(this.logits, 0, this.logitsPoison);
    const nl = this.b * this.spec.classes;
    const ns = 3 * this.points + 3;
    const got = await this._pass("forward", this.fwd, this.fstate, [[this.logits, nl], [this.fstate, ns]], this.fStage, nl + ns);
    let e = ex; // each param layer's input exponent, the shifts read back
    for (const p of this.params) {
      p.ex = e;
      if (p.point < 0) break;
      const s = got[nl + 3 + 3 * p.point + 1];
      if (!(s >= 0 && s <= MAX_SHIFT)) this.gpu._fail(`the resident forward pass gave the shift ${s}`);
      e += p.ew + s;
    }
    const top = this.params[this.params.length - 1];
    const scale = pow2(top.ex + top.ew);
    const logits = new Float64Array(nl);
    for (let i = 0; i < nl; i++) {
      if (got[i] === POISON) this.gpu._fail("the resident forward pass left a logit unwritten");
      logits[i] = got[i] * scale;
    }
    return logits;
  }

  /** Engine.forward's logits of one micro-batch (the accuracy op). */
  async forward(theta, x) {
    return this._serial(async () => ({ logits: await this._forward(theta, x) }));
  }

  /** Engine.gradInto on the GPU: the same contribution added into `total`. */
  async gradInto(total, theta, x, y, fracBits, limit) {
    return this._serial(() => this._gradInto(total, theta, x, y, fracBits, limit));
  }

  /** One pass at a time on this plan's buffers, whatever awaits interleave. */
  _serial(fn) {
    const run = this._busy.then(fn, fn);
    this._busy = run.catch(() => null);
    return run;
  }

  async _gradInto(total, theta, x, y, fracBits, limit) {
    const b = this.b;
    const z = await this._forward(theta, x);
    const o = outputError(this.spec, z, y, b);
    const { G, eg: egTop } = topErrors(o.dz, o.labels, b, this.spec.classes);
    const q = this.device.queue;
    q.writeBuffer(this.gTop, 0, G);
    q.writeBuffer(this.grad, 0, this.gradPoison);
    const nb = 3 * this.bpoints + 3;
    const copies = [[this.grad, this.gradLen], [this.bstate, nb]];
    if (this.embed) copies.push([this.embedDX, this.embedLen]);
    const got = await this._pass("backward", this.bwd, this.bstate, copies, this.bStage, this.gradLen + nb + this.embedLen);
    const offsets = this.layout.offsets;
    let eg = egTop;
    for (const { e, int8, point } of this.steps) {
      if (e.kind !== "pool") {
        const p = e.p;
        const dW = sumSlots(got, p.wSlots, p.nOut * p.nIn, POISON);
        const db = sumSlots(got, p.bSlots, p.nOut, POISON);
        if (!dW || !db) this.gpu._fail("the resident backward pass left a gradient unwritten");
        accumulate(total, offsets[p.pi], dW, eg + p.ex, fracBits, limit);
        accumulate(total, offsets[p.pi + 1], db, eg, fracBits, limit);
        eg += p.ew;
      }
      if (!int8 && point >= 0) {
        const s = got[this.gradLen + 3 + 3 * point + 1];
        if (!(s >= 0 && s <= MAX_SHIFT)) this.gpu._fail(`the resident backward pass gave the shift ${s}`);
        eg += s;
      }
    }
    if (this.embed) { // layers.js Embedding.backward: integer scatter-add of the raw errors
      const D = this.embed.nOut;
      const dX = got.subarray(this.gradLen + nb);
      const dE = new Float64Array(this.embed.nIn * D);
      for (let t = 0; t < x.length; t++) {
        const row = x[t] * D;
        for (let d = 0; d < D; d++) dE[row + d] += dX[t * D + d];
      }
      accumulate(total, offsets[0], dE, eg, fracBits, limit);
    }
    return { loss: o.loss, correct: o.correct };
  }
}
