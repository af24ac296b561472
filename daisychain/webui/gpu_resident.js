// A micro-batch's forward and backward kept on the GPU: the resident path beside GpuUnits'
// one-call-one-dispatch units (gpu.js, whose API stays as it is).
//
// A plan is made once per (model, micro-batch size): every buffer a pass needs stays on the
// GPU (activations, im2col columns, accumulators, errors, the gradient), with its bind groups
// and uniforms made once. Per micro-batch the host writes the input (int8 rows, the pixels >> 1
// of an image) and, when the parameters changed (once per step), the quantized weights and the
// bias tables; then the forward pass is one submit and one read-back (the logits and the
// forward shifts), the output error is computed on the host in float64 (engine/model.js
// outputError, topErrors), and the backward pass is one submit and one read-back (every
// layer's int32 weight and bias gradient sums and the backward shifts). The host then adds
// them into the fixed-point contribution exactly as the engine does (layers.js accumulate),
// so the bits are engine/model.js's.
//
// What needs the data on the GPU is computed there, in integers: a requantize's shift
// s = max(exponent(max |acc|) - 7, 0) (res_absmax.wgsl, res_shift.wgsl), the ReLU mask of the
// backward pass, and the bias in accumulator units, which depends on the shifts below the
// layer: the host writes the bias of every exponent the accumulator can have (a table, one
// row per sum of shifts below, layers.js biasAcc in float64) and the GPU picks its row
// (res_bias.wgsl). The GEMM is res_gemm.wgsl: tiled with workgroup memory, four int8 per u32,
// dot4I8Packed where the adapter has packed_4x8_integer_dot_product, else the same sum by
// shifts. Native products and the arithmetic requantize are used only after the loaded
// tables checked equal to that arithmetic (wasm_units.js exactTablesFailure), as on the CPU.
//
// Not covered (the engine then calls the units one by one, same bits): an embedding (the
// text task), a ReLU that is not fused into its layer (trace mode), a bias gradient that could
// leave int32, a buffer above this GPU's limits.

import { MAX_K } from "./gemm.js";
import { GpuError } from "./gpu.js";
import { absmax, pow2, quantExponent, quantize } from "./engine/detmath.js";
import { accumulate, biasAcc } from "./engine/layers.js";
import { Engine, IMAGE_EXPONENT, initParams, outputError, ParamLayout, topErrors } from "./engine/model.js";
import { CpuUnits } from "./engine/paths.js";
import { u32, uniform } from "./engine/prng.js";
import { imageCnn, mlp } from "./engine/spec.js";
import { exactTablesFailure } from "./wasm/wasm_units.js";

/** The largest requantize shift: max |acc| < 2^32 has at most 32 bits, s = bits - 7. */
const MAX_SHIFT = 25;
const POISON = 0x7fffffff;
const RES_KERNELS = ["res_absmax", "res_shift", "res_requantize", "res_bias", "res_permute", "res_colsum"];
const MAX_PLANS = 6;

/** Whether this adapter's WGSL has the packed 4x8 integer dot product. */
export function hasPackedDot() {
  const f = typeof navigator !== "undefined" && navigator.gpu && navigator.gpu.wgslLanguageFeatures;
  return !!(f && f.has("packed_4x8_integer_dot_product"));
}

export class ResidentPlans {
  constructor(gpu) {
    Object.defineProperty(this, "gpu", { value: gpu, enumerable: false }); // no cycle in JSON
    this.plans = new Map();
    this.reason = exactTablesFailure(gpu.luts); // why not used; null: usable (so far)
    this.dot = null; // "dot4I8Packed" | "shifts", once compiled
    this.gemm = null; // "tiled" | "direct": the GEMM kernel in use (the faster one here)
    this._ready = null;
  }

  async _compile() {
    const gpu = this.gpu;
    const text = async (name) => {
      const url = `${gpu.shaderBase}${name}.wgsl`;
      const resp = await fetch(url, { cache: "no-store" });
      if (!resp.ok) throw new GpuError(`could not load the kernel ${url}: HTTP ${resp.status}`);
      return resp.text();
    };
    const body = await text("res_gemm");
    this.dot = hasPackedDot() && gpu.residentDot !== "shifts" ? "dot4I8Packed" : "shifts";
    const prelude = await text(this.dot === "dot4I8Packed" ? "res_dot4_packed" : "res_dot4_plain");
    const gemms = {
      tiled: await gpu._compile("res_gemm", `${prelude}\n${body}`, `${gpu.shaderBase}res_gemm.wgsl (${this.dot})`),
      direct: await gpu._compile("res_gemm_direct", await text("res_gemm_direct"), `${gpu.shaderBase}res_gemm_direct.wgsl`),
    };
    this.gemms = gemms;
    this.measured = gpu.residentGemm in gemms ? null : await this._fasterGemm(gemms);
    this.pipelines = {};
    for (const name of RES_KERNELS) this.pipelines[name.slice(4)] = await gpu._compile(name, await text(name), `${gpu.shaderBase}${name}.wgsl`);
    for (const name of ["im2col", "col2im", "maxpool", "maxpool_back"]) this.pipelines[name] = gpu._pipelines.get(name);
  }

  /** Which GEMM kernel is faster on this adapter: both timed on a conv-sized GEMM (1024 x 144
   *  x 32), alternately, best of 3 each. The bytes are the same; only the speed differs. */
  async _fasterGemm(gemms) {
    const d = this.gpu.device;
    const [m, k, n] = [1024, 144, 32];
    const make = (size) => d.createBuffer({ size: size * 4, usage: GPUBufferUsage.STORAGE });
    const bufs = [make(m * k), make(n * k), make(m * n)];
    const uni = d.createBuffer({ size: 64, usage: GPUBufferUsage.UNIFORM, mappedAtCreation: true });
    new Uint32Array(uni.getMappedRange()).set([m, k, n, 0, 0, k, 1, 0, 0, 1, k, 0, 0, n, 1, 0]);
    uni.unmap();
    const best = {};
    const time = async (name) => {
      const p = gemms[name];
      const group = d.createBindGroup({ layout: p.getBindGroupLayout(0),
        entries: [uni, ...bufs].map((buffer, binding) => ({ binding, resource: { buffer } })) });
      const enc = d.createCommandEncoder();
      const pass = enc.beginComputePass();
      pass.setPipeline(p);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(n / 32, m / 32, 1);
      pass.end();
      const t0 = performance.now();
      d.queue.submit([enc.finish()]);
      await d.queue.onSubmittedWorkDone();
      best[name] = Math.min(best[name] ?? Infinity, performance.now() - t0);
    };
    await this.gpu._scoped("timing the resident GEMM kernels", () => null);
    for (let r = 0; r < 3; r++) for (const name of r % 2 ? ["direct", "tiled"] : ["tiled", "direct"]) await time(name);
    for (const b of [...bufs, uni]) b.destroy();
    this.gemmTimes = best;
    return best.tiled <= best.direct ? "tiled" : "direct";
  }

  /**
   * Before any plan is used: a micro-batch of two check models (a CNN with 3x3 and 5x5 convs
   * and pools on an odd map, a two-layer MLP; odd micro-batch sizes) through each GEMM
   * kernel's resident pass and through the JS units (the reference): the contributions and
   * correct counts must be the same bits. Returns null, or why the resident path is not used
   * (the engine then calls the GPU units one by one, which passed their golden vectors).
   */
  async _selfCheck() {
    const cpu = new CpuUnits(this.gpu.luts);
    const cases = [[imageCnn(2, 9, 7, ["conv3", "pool", "conv4k5", "pool", 6], 3), 3], [mlp(11, 13, 4, 2), 5]];
    for (const kernel of Object.keys(this.gemms)) {
      for (const [spec, b] of cases) {
        const theta = initParams(spec, 7);
        const n = b * spec.inputDim;
        const x = spec.inputKind === "image" ? Uint8Array.from(u32(7, 91, n), (v) => v & 255)
          : uniform(7, 92, n).map((v) => (v - 0.5) * 9);
        const y = Int32Array.from(u32(7, 93, b), (v) => v % spec.classes);
        const want = new Float64Array(theta.length);
        const wantR = await new Engine(spec, cpu).gradInto(want, theta, x, y, b, 40, 2 ** 49);
        const got = new Float64Array(theta.length);
        const plan = new ResidentPlan(this, spec, b, this.gemms[kernel]);
        let gotR;
        try {
          gotR = await plan.gradInto(got, theta, x, y, 40, 2 ** 49);
        } finally {
          plan.destroy();
        }
        const i = want.findIndex((v, j) => v !== got[j]);
        if (i >= 0 || gotR.correct !== wantR.correct) {
          return `the resident GPU pass (${kernel} GEMM) gave other bits than the JS units on a check model ` +
            (i >= 0 ? `(gradient ${i}: ${got[i]}, not ${want[i]})` : "(the correct count)") + ": not used";
        }
      }
    }
    return null;
  }

  /** The plan for micro-batches of b samples of `spec`, or null where it does not apply. */
  async plan(spec, b) {
    if (this.reason) return null;
    if (!this._ready) this._ready = this._compile().then(async () => { this.reason = await this._selfCheck(); });
    await this._ready;
    if (this.reason) return null;
    // the GEMM kernel: gpu.residentGemm ("tiled" | "direct") when set, else the faster one here
    const want = this.gpu.residentGemm;
    if (!(want in this.gemms) && !this.measured) this.measured = await this._fasterGemm(this.gemms);
    this.gemm = want in this.gemms ? want : this.measured;
    const key = `${JSON.stringify(spec.toJson())}|${b}|${this.gemm}`;
    if (this.plans.has(key)) return this.plans.get(key);
    let plan = null;
    if (!unsupported(spec)) {
      try {
        plan = new ResidentPlan(this, spec, b, this.gemms[this.gemm]);
      } catch (err) {
        if (!(err instanceof PlanLimit)) throw err;
      }
    }
    if (this.plans.size >= MAX_PLANS) {
      const [oldKey, old] = this.plans.entries().next().value;
      if (old) old.destroy();
      this.plans.delete(oldKey);
    }
    this.plans.set(key, plan);
    return plan;
  }
}

class PlanLimit extends Error {}

/** Why a spec has no resident plan, or null. */
function unsupported(spec) {
  const L = spec.layers;
  for (let i = 0; i < L.length; i++) {
    const t = L[i].type;
    if (t === "embedding") return "an embedding layer";
    if (t === "relu" && !(i > 0 && (L[i - 1].type === "linear" || L[i - 1].type === "conv2d"))) return "an unfused relu";
  }
  return null;
}

class ResidentPlan {
  constructor(plans, spec, b, gemm) {
    this.gpu = plans.gpu;
    this.device = plans.gpu.device;
    this.pipelines = { ...plans.pipelines, gemm };
    this.spec = spec;
    this.b = b;
    this.layout = new ParamLayout(spec);
    this.buffers = [];
    this.fwd = [];
    this.bwd = [];
    this.params = []; // param layers: {layer, pi, wq, btab, rows, fpoint, nIn, nOut, ...}
    this.theta = null; // the parameters last uploaded (a copy)
    this.ex0 = null; // the input exponent the bias tables were made for
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

  _gemm(list, A, B, C, { m, k, n, transA = false, transB = false, aOff = 0, bOff = 0, cOff = 0 }) {
    const max = this.gpu.limits.maxComputeWorkgroupsPerDimension;
    const grid = [Math.ceil(n / 32), Math.ceil(m / 32)];
    if (grid[0] > max || grid[1] > max) throw new PlanLimit("gemm grid");
    const [aSm, aSk] = transA ? [1, m] : [k, 1];
    const [bSk, bSn] = transB ? [1, k] : [n, 1];
    this._op(list, "gemm", [m, k, n, 0, aOff, aSm, aSk, 0, bOff, bSk, bSn, 0, cOff, n, 1, 0], [A, B, C], grid);
  }

  /** max |x| into state slot, after the ReLU mask when `mask` (a buffer) is given. */
  _absmax(list, state, x, n, slot, mask) {
    this._op(list, "absmax", [n, slot, mask ? 1 : 0, 0], [x, mask || this.dummy, state], this._grid(Math.ceil(n / 32)));
  }

  _requant(list, state, acc, out, n, slot, tin, relu) {
    this._op(list, "shift", [slot, tin, 0, 0], [state], [1, 1]);
    this._op(list, "requantize", [n, slot, relu ? 1 : 0, 0], [acc, out, state], this._grid(n));
  }

  _build() {
    const { spec, b } = this;
    const L = spec.layers;
    this.dummy = this._buf(1, "no mask");
    this.input = this._buf(b * spec.inputDim, "input");
    // forward: a point is a requantize, with 3 state words (max |acc|, shift, shifts so far);
    // ops are closures run once the state buffer exists
    const entries = [];
    const ops = [];
    let cur = this.input;
    let points = 0;
    let pi = 0;
    for (let li = 0; li < L.length; li++) {
      const layer = L[li];
      const last = li === L.length - 1;
      const fuse = !last && L[li + 1].type === "relu";
      if (layer.type === "maxpool2d") {
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
      const conv = layer.type === "conv2d";
      const rows = conv ? b * layer.h * layer.w : b;
      const nIn = layer.nIn;
      const nOut = conv ? layer.co : layer.nOut;
      if (rows * 127 >= 2 ** 31) throw new PlanLimit("bias gradient");
      const p = { layer, conv, li, pi, rows, nIn, nOut, point: last ? -1 : points, tin: points === 0 ? 2 : 3 * points + 2 };
      p.tableRows = MAX_SHIFT * points + 1;
      p.wq = this._buf(nOut * nIn, `layer ${li} weights`);
      p.btab = this._buf(p.tableRows * nOut, `layer ${li} bias table`);
      p.a = cur;
      if (conv) {
        const { ci, k, h, w } = layer;
        const n = rows * nIn;
        const src = cur;
        const cols = this._buf(n, `layer ${li} columns`);
        ops.push((list) => this._op(list, "im2col", [n, ci, k, (k - 1) >> 1, h, w, 0, 0], [src, cols], this._grid(n)));
        p.a = cols;
      }
      const n = rows * nOut;
      const acc = this._buf(n, `layer ${li} accumulator`);
      ops.push((list, state) => {
        this._gemm(list, p.a, p.wq, acc, { m: rows, k: nIn, n: nOut, transB: true });
        this._op(list, "bias", [n, nOut, p.tin, p.tableRows], [p.btab, acc, state], this._grid(n));
      });
      const entry = { kind: conv ? "conv" : "linear", layer, p, reluOut: null };
      entries.push(entry);
      this.params.push(p);
      pi += 2;
      if (last) {
        this.logits = acc;
        break;
      }
      const q = this._buf(n, `layer ${li} requantized`);
      const slot = 3 + 3 * points;
      ops.push((list, state) => {
        this._absmax(list, state, acc, n, slot, null);
        this._requant(list, state, acc, q, n, slot, p.tin, fuse);
      });
      points += 1;
      cur = q;
      if (conv) {
        const out = this._buf(n, `layer ${li} channel-major`);
        ops.push((list) => this._op(list, "permute", [n, layer.h * layer.w, nOut, 0], [q, out], this._grid(n)));
        cur = out;
      }
      if (fuse) {
        entry.reluOut = cur;
        li += 1;
      }
    }
    this.points = points;
    this.fstate = this._buf(3 * points + 3, "forward state");
    for (const op of ops) op(this.fwd, this.fstate);
    this.entries = entries;
    this._buildBackward();
    const d = this.device;
    this.fStage = d.createBuffer({ label: "forward read-back", size: (b * spec.classes + 3 * points + 3) * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    this.bStage = d.createBuffer({ label: "backward read-back", size: (this.gradLen + 3 * this.bpoints + 3) * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    this.buffers.push(this.fStage, this.bStage);
    this.gradPoison = new Int32Array(this.gradLen).fill(POISON);
    this.logitsPoison = new Int32Array(b * spec.classes).fill(POISON);
  }

  _buildBackward() {
    const { b, entries } = this;
    this.gTop = this._buf(b * this.spec.classes, "output errors");
    // the gradient: per param layer its weight parts (rows split by MAX_K), then its bias
    let off = 0;
    for (const p of this.params) {
      p.parts = [];
      for (let r0 = 0; r0 < p.rows; r0 += MAX_K) {
        p.parts.push({ r0, r1: Math.min(p.rows, r0 + MAX_K), off });
        off += p.nOut * p.nIn;
      }
      p.bOff = off;
      off += p.nOut;
    }
    this.gradLen = off;
    this.grad = this._buf(off, "gradient");
    const steps = []; // [entry, int8, point] top to bottom
    const ops = [];
    let G = this.gTop;
    let bpoints = 0;
    for (let k = entries.length - 1; k >= 0; k--) {
      const e = entries[k];
      const below = k > 0 ? entries[k - 1] : null;
      let dX = null;
      let int8 = false;
      if (e.kind === "pool") {
        if (!below) break;
        const { h, w } = e.layer;
        const d = this._buf(e.n, "pool errors");
        const g = G;
        ops.push((list) => this._op(list, "maxpool_back", [e.n, h, w, 0], [g, e.a, d], this._grid(e.n)));
        dX = d;
        int8 = true;
      } else {
        const p = e.p;
        let Gr = G;
        if (p.conv) {
          Gr = this._buf(p.rows * p.nOut, `layer ${p.li} errors by rows`);
          const g = G;
          const n = p.rows * p.nOut;
          ops.push((list) => this._op(list, "permute", [n, p.layer.h * p.layer.w, p.nOut, 1], [g, Gr], this._grid(n)));
        }
        for (const part of p.parts) {
          ops.push((list) => this._gemm(list, Gr, p.a, this.grad, {
            m: p.nOut, k: part.r1 - part.r0, n: p.nIn, transA: true,
            aOff: part.r0 * p.nOut, bOff: part.r0 * p.nIn, cOff: part.off,
          }));
        }
        ops.push((list) => this._op(list, "colsum", [p.rows, p.nOut, p.bOff, 0], [Gr, this.grad], [Math.ceil(p.nOut / 64), 1]));
        if (below) {
          const dXr = this._buf(p.rows * p.nIn, `layer ${p.li} input errors`);
          ops.push((list) => this._gemm(list, Gr, p.wq, dXr, { m: p.rows, k: p.nOut, n: p.nIn }));
          dX = dXr;
          if (p.conv) {
            const { ci, k: kk, h, w } = p.layer;
            const n = b * ci * h * w;
            dX = this._buf(n, `layer ${p.li} input errors, channel-major`);
            const d = dX;
            ops.push((list) => this._op(list, "col2im", [n, ci, kk, (kk - 1) >> 1, h, w, 0, 0], [dXr, d], this._grid(n)));
          }
        }
      }
      if (!below) {
        steps.push({ e, int8, point: -1 });
        break;
      }
      const n = below.kind === "pool" ? below.layer.c * (below.layer.h >> 1) * (below.layer.w >> 1) * b
        : below.p.rows * below.p.nOut;
      const mask = below.reluOut;
      const x = dX;
      if (int8) {
        if (mask) ops.push((list, state) => this._absmax(list, state, x, n, 0, mask)); // the mask only
        steps.push({ e, int8, point: -1 });
        G = dX;
      } else {
        const slot = 3 + 3 * bpoints;
        const q = this._buf(n, `errors below layer ${e.p.li}`);
        ops.push((list, state) => {
          this._absmax(list, state, x, n, slot, mask);
          this._requant(list, state, x, q, n, slot, 2, false);
        });
        steps.push({ e, int8, point: bpoints });
        bpoints += 1;
        G = q;
      }
    }
    this.bpoints = bpoints;
    this.bstate = this._buf(3 * bpoints + 3, "backward state");
    for (const op of ops) op(this.bwd, this.bstate);
    this.steps = steps;
  }

  // -- per micro-batch ---------------------------------------------------------------------

  /** Quantized weights once per parameter change; bias tables per change or input exponent. */
  _upload(theta, ex0) {
    const q = this.device.queue;
    const same = this.theta && this.theta.length === theta.length && this.theta.every((v, i) => v === theta[i]);
    if (!same) {
      this.theta = Float64Array.from(theta);
      for (const p of this.params) {
        const W = this.layout.view(theta, p.pi);
        p.ew = quantExponent(absmax(W));
        q.writeBuffer(p.wq, 0, quantize(W, p.ew));
      }
      this.ex0 = null;
    }
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
        pass.dispatchWorkgroups(op.grid[0], op.grid[1], 1);
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
    const { a, ex } = this._input(x);
    this._upload(theta, ex);
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
    return { logits: await this._forward(theta, x) };
  }

  /** Engine.gradInto on the GPU: the same contribution added into `total`. */
  async gradInto(total, theta, x, y, fracBits, limit) {
    const b = this.b;
    const z = await this._forward(theta, x);
    const o = outputError(this.spec, z, y, b);
    const { G, eg: egTop } = topErrors(o.dz, o.labels, b, this.spec.classes);
    const q = this.device.queue;
    q.writeBuffer(this.gTop, 0, G);
    q.writeBuffer(this.grad, 0, this.gradPoison);
    const nb = 3 * this.bpoints + 3;
    const got = await this._pass("backward", this.bwd, this.bstate, [[this.grad, this.gradLen], [this.bstate, nb]], this.bStage, this.gradLen + nb);
    const offsets = this.layout.offsets;
    let eg = egTop;
    for (const { e, int8, point } of this.steps) {
      if (e.kind !== "pool") {
        const p = e.p;
        const size = p.nOut * p.nIn;
        let dW = got.subarray(p.parts[0].off, p.parts[0].off + size);
        if (p.parts.length > 1) {
          dW = Float64Array.from(dW);
          for (const part of p.parts.slice(1)) for (let j = 0; j < size; j++) dW[j] += got[part.off + j];
        }
        const db = got.subarray(p.bOff, p.bOff + p.nOut);
        for (const arr of [dW, db]) for (let j = 0; j < arr.length; j++) if (arr[j] === POISON) this.gpu._fail("the resident backward pass left a gradient unwritten");
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
    return { loss: o.loss, correct: o.correct };
  }
}
