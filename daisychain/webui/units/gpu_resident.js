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
// s = max(exponent(max |acc|) - 7, 0) (the max by res_bias_absmax.wgsl, res_absmax.wgsl or
// res_col2im.wgsl, the shift in the requantize that reads it), the ReLU mask of the backward
// pass, and the bias in accumulator units, which depends on the shifts below the layer: the
// host writes the bias of every exponent the accumulator can have (a table, one row per sum
// of shifts below, layers.js biasAcc in float64) and the GPU picks its row
// (res_bias_absmax.wgsl). The GEMM is the fastest here of res_gemm.wgsl (tiled with workgroup
// memory, four int8 per u32, dot4I8Packed where the adapter has
// packed_4x8_integer_dot_product, else the same sum by shifts), res_gemm_direct.wgsl
// (registers only), res_gemm_packed.wgsl (registers only, on operands packed four int8 a
// word, dot4 as the tiled one) and res_gemm_lanes.wgsl (registers only, int32 operands laid out
// so that an emulated SIMD routine's four lanes load one vector, the forward pass on the weights
// uploaded transposed); one with few workgroups is split over K (gpu_split.js).
// Native products and the arithmetic requantize are used only after the loaded tables checked
// equal to that arithmetic (wasm_units.js exactTablesFailure), as on the CPU.
//
// An embedding (the text task's first layer) is the host's: its quantized rows are gathered
// into the input, and its gradient is scattered on the host from the layer above's raw input
// error, read back with the rest. Not covered (the engine then calls the units one by one,
// same bits): a ReLU that is not fused into its layer (trace mode), a bias gradient that
// could leave int32, a buffer above this GPU's limits.

import { GpuError } from "./gpu_error.js";
import { PlanLimit, ResidentPlan, unsupported } from "./gpu_plan.js";
import { SPLIT_FEW } from "./gpu_split.js";
import { Engine, initParams } from "../engine/model.js";
import { CpuUnits } from "../engine/cpu_units.js";
import { u32, uniform } from "../engine/prng.js";
import { charMlp, imageCnn, mlp } from "../engine/spec.js";
import { exactTablesFailure } from "../wasm/wasm_units.js";

const RES_KERNELS = ["res_absmax", "res_requantize", "res_bias_absmax", "res_requantize_map", "res_pool_back",
  "res_permute", "res_colsum", "res_reduce", "res_im2col", "res_col2im", "res_pack", "res_im2col_pack"];
/** The kernels compiled behind res_shift.wgsl (shr_bits, shift_of). */
const SHIFT_USERS = ["res_requantize", "res_requantize_map", "res_pool_back"];
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
    this.gemm = null; // "tiled" | "direct" | "packed" | "lanes": the GEMM kernel in use (the fastest here)
    this.fastest = new Map(); // model and micro-batch size -> {choice: the kernel measured fastest on it, ms}
    this.measured = null; // the choice for the model of the last plan asked for, its times: gemmTimes
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
      packed: await gpu._compile("res_gemm_packed", `${prelude}\n${await text("res_gemm_packed")}`, `${gpu.shaderBase}res_gemm_packed.wgsl (${this.dot})`),
      lanes: await gpu._compile("res_gemm_lanes", await text("res_gemm_lanes"), `${gpu.shaderBase}res_gemm_lanes.wgsl`),
    };
    this.gemms = gemms;
    // the lanes kernel's smaller block, for GEMMs of few columns (gpu_plan.js gemm_narrow)
    this.narrow = { lanes: await gpu._compile("res_gemm_lanes_narrow", await text("res_gemm_lanes_narrow"), `${gpu.shaderBase}res_gemm_lanes_narrow.wgsl`) };
    this.pipelines = {};
    const shift = await text("res_shift"); // the requantize shift, in front of its users (no includes in WGSL)
    for (const name of RES_KERNELS) {
      const src = SHIFT_USERS.includes(name) ? `${shift}\n${await text(name)}` : await text(name);
      this.pipelines[name.slice(4)] = await gpu._compile(name, src, `${gpu.shaderBase}${name}.wgsl`);
    }
    this.pipelines.maxpool = gpu._pipelines.get("maxpool");
  }

  /** Which GEMM kernel is fastest on this adapter for micro-batches of b samples of `spec`:
   *  the plan's own forward and backward passes (every GEMM shape, split and packing pass it
   *  will run) with each kernel, alternately, four rounds; a kernel over three times the best
   *  after a round is dropped (the tiled kernel on a CPU emulation: 5-8x; a loaded machine's
   *  noise stays within that); the least time wins. The bytes are the same
   *  (the self-check); only the speed differs. The registers-only kernels are timed with the
   *  default split sums and with fewer (SPLIT_FEW workgroups: "lanes/16"). Returns {kernel (the
   *  winner, "kernel" or "kernel/16"), plan (its plan, kept), ms}. */
  async _fastestFor(spec, b) {
    const d = this.gpu.device;
    const probes = {};
    // each kernel with the default split sums, and (unless gpu.residentSplit fixes them) the
    // registers-only kernels with fewer: "lanes/16" aims at SPLIT_FEW workgroups
    const names = Object.keys(this.gemms);
    if (this.gpu.residentSplit === undefined) names.push(...names.filter((n) => n !== "tiled").map((n) => `${n}/${SPLIT_FEW}`));
    for (const name of names) {
      const [kernel, few] = name.split("/");
      try {
        probes[name] = new ResidentPlan(this, spec, b, kernel, few ? SPLIT_FEW : undefined);
      } catch (err) {
        if (!(err instanceof PlanLimit)) throw err;
      }
    }
    const best = {};
    const time = async (name) => {
      const enc = d.createCommandEncoder();
      for (const list of [probes[name].fwd, probes[name].bwd]) {
        const pass = enc.beginComputePass();
        for (const op of list) {
          pass.setPipeline(op.pipeline);
          pass.setBindGroup(0, op.group);
          pass.dispatchWorkgroups(op.grid[0], op.grid[1], op.grid[2] || 1);
        }
        pass.end();
      }
      const t0 = performance.now();
      d.queue.submit([enc.finish()]);
      await d.queue.onSubmittedWorkDone();
      best[name] = Math.min(best[name] ?? Infinity, performance.now() - t0);
    };
    let live = Object.keys(probes);
    if (!live.length) return { kernel: null, plan: null, ms: best };
    try {
      await this.gpu._scoped("timing the resident GEMM kernels", () => null);
      for (let r = 0; r < 4; r++) {
        for (const name of r % 2 ? [...live].reverse() : live) await time(name);
        const least = Math.min(...live.map((n) => best[n]));
        live = live.filter((n) => best[n] <= 3 * least);
      }
    } catch (err) {
      for (const plan of Object.values(probes)) plan.destroy();
      throw err;
    }
    const kernel = live.reduce((a, n) => (best[n] < best[a] ? n : a));
    for (const [name, plan] of Object.entries(probes)) if (name !== kernel) plan.destroy();
    return { kernel, plan: probes[kernel], ms: best };
  }

  /**
   * Before any plan is used: a micro-batch of three check models (a CNN with 3x3 and 5x5 convs
   * and pools on an odd map, a two-layer MLP, a character MLP with an embedding; odd
   * micro-batch sizes) through each GEMM
   * kernel's resident pass and through the JS units (the reference): the contributions and
   * correct counts must be the same bits. Returns null, or why the resident path is not used
   * (the engine then calls the GPU units one by one, which passed their golden vectors).
   */
  async _selfCheck() {
    const cpu = new CpuUnits(this.gpu.luts);
    const cases = [[imageCnn(2, 9, 7, ["conv3", "pool", "conv4k5", "pool", 6], 3), 3], [mlp(11, 13, 4, 2), 5],
      [charMlp(7, 3, 5, 9), 4]];
    for (const kernel of Object.keys(this.gemms)) {
      for (const [spec, b] of cases) {
        const theta = initParams(spec, 7);
        const n = b * spec.inputDim;
        const x = spec.inputKind === "image" ? Uint8Array.from(u32(7, 91, n), (v) => v & 255)
          : spec.inputKind === "tokens" ? Int32Array.from(u32(7, 94, n), (v) => v % spec.layers[0].nIn)
            : uniform(7, 92, n).map((v) => (v - 0.5) * 9);
        const y = Int32Array.from(u32(7, 93, b), (v) => v % spec.classes);
        const want = new Float64Array(theta.length);
        const wantR = await new Engine(spec, cpu).gradInto(want, theta, x, y, b, 40, 2 ** 49);
        const got = new Float64Array(theta.length);
        const plan = new ResidentPlan(this, spec, b, kernel);
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
    if (unsupported(spec)) return null;
    // the GEMM kernel: gpu.residentGemm (a key of this.gemms) when set, else the fastest here
    // on this model and micro-batch size (timed once: _fastestFor)
    const model = `${JSON.stringify(spec.toJson())}|${b}|${this.gpu.residentSplit ?? ""}|${this.gpu.residentIm2colPack !== false}`;
    let timed = null;
    let choice = this.gpu.residentGemm; // a kernel, or "kernel/16": fewer split sums
    if (!(choice in this.gemms)) {
      if (!this.fastest.has(model)) {
        timed = await this._fastestFor(spec, b);
        this.fastest.set(model, { choice: timed.kernel, ms: timed.ms });
      }
      ({ choice, ms: this.gemmTimes } = this.fastest.get(model));
      this.measured = choice; // with its times: the model of the last plan asked for
    }
    const [kernel, few] = choice ? choice.split("/") : [null, null];
    this.gemm = kernel;
    const key = `${model}|${choice}`;
    if (this.plans.has(key)) {
      if (timed && timed.plan) timed.plan.destroy();
      return this.plans.get(key);
    }
    let plan = timed ? timed.plan : null;
    if (!plan && kernel) {
      try {
        plan = new ResidentPlan(this, spec, b, kernel, few ? SPLIT_FEW : undefined);
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
