// WebGPU for the units, with every GPU error in this one place.
//
// GpuUnits.create() finds an adapter, checks its limits, creates the device, uploads the
// verified tables and compiles the kernels (shaders/{gemm,requantize,mul,relu}.wgsl, the
// image kernels {im2col,col2im,maxpool,maxpool_back}.wgsl, layouts in conv.js, and the
// transformer's {gemm_batch,softmax,exp}.wgsl, layouts in engine/attention.js).
// Every creation and every dispatch runs inside error scopes (validation, out-of-memory,
// internal); `device.lost` and `uncapturederror` are handled here too. The first failure of
// any kind marks the object failed, tells every onFailure listener the reason in words, and
// makes every later call throw GpuError with that reason: the caller then falls back to the
// JS units (units.js, gemm.js), which compute the same bytes.
//
// Operands travel as int8 values held in i32 (4 bytes per element); outputs come back as
// Int32Array. Output buffers are poisoned with 0x7fffffff before each dispatch, so an element
// a kernel failed to write can never pass for a result.

import { convLayout, poolLayout } from "./conv.js";
import { gemmLayout, MAX_K } from "./gemm.js";
import { softmaxLayout } from "../engine/attention.js";
import { checkInt8Array, checkIntArray, checkShift, INT32_MAX, INT32_MIN, POISON, UnitError } from "./units.js";
import { GpuError } from "./gpu_error.js";

export const KERNELS = ["gemm", "requantize", "mul", "relu", "im2col", "col2im", "maxpool", "maxpool_back",
  "gemm_batch", "softmax", "exp"];
const TILE = 16; // gemm.wgsl workgroup is TILE x TILE invocations
const LANES = 64; // workgroup size of the elementwise kernels

/** What a kernel needs of the device, checked against the adapter before anything runs. */
const NEEDED_LIMITS = {
  maxStorageBuffersPerShaderStage: 5,
  maxComputeInvocationsPerWorkgroup: TILE * TILE,
  maxComputeWorkgroupSizeX: LANES,
  maxComputeWorkgroupSizeY: TILE,
  maxStorageBufferBindingSize: 65536 * 4,
  maxUniformBufferBindingSize: 64,
};


function errorText(err) {
  return err && err.message ? err.message : String(err);
}

export class GpuUnits {
  /**
   * @param {object} opts
   * @param {object} opts.luts         verified tables from luts.js loadLuts()
   * @param {string} [opts.shaderBase] URL prefix of the .wgsl files, default "/shaders/"
   * @param {(reason: string) => void} [opts.onFailure] told once, in words, when the GPU fails
   * @returns {Promise<GpuUnits>} or throws GpuError saying why WebGPU cannot be used
   */
  static async create({ luts, shaderBase = "/shaders/", onFailure } = {}) {
    if (typeof navigator === "undefined" || !navigator.gpu) {
      throw new GpuError("this browser has no WebGPU (navigator.gpu is missing)");
    }
    let adapter;
    try {
      adapter = await navigator.gpu.requestAdapter();
    } catch (err) {
      throw new GpuError(`WebGPU requestAdapter() failed: ${errorText(err)}`);
    }
    if (!adapter) {
      throw new GpuError("WebGPU is present but requestAdapter() returned null: no usable GPU " +
        "adapter (WebGPU is disabled in this browser or unsupported on this device)");
    }
    for (const [name, need] of Object.entries(NEEDED_LIMITS)) {
      if (!(adapter.limits[name] >= need)) {
        throw new GpuError(`the GPU adapter's ${name} is ${adapter.limits[name]}, the kernels need ${need}`);
      }
    }
    const requiredLimits = {
      maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
      maxBufferSize: adapter.limits.maxBufferSize,
      maxStorageBuffersPerShaderStage: NEEDED_LIMITS.maxStorageBuffersPerShaderStage,
    };
    let device;
    try {
      device = await adapter.requestDevice({ requiredLimits });
    } catch (err) {
      throw new GpuError(`WebGPU requestDevice() failed: ${errorText(err)}`);
    }
    const info = adapter.info || {};
    const gpu = new GpuUnits(device, {
      vendor: info.vendor || "", architecture: info.architecture || "", description: info.description || "",
    });
    if (onFailure) gpu.onFailure(onFailure);
    await gpu._init(luts, shaderBase);
    return gpu;
  }

  constructor(device, adapterInfo) {
    this.device = device;
    this.adapterInfo = adapterInfo;
    this.limits = device.limits;
    this.failure = null; // the reason in words, once failed
    this._listeners = [];
    this._pipelines = new Map();
    this._tables = {};
    this._destroyed = false;
    device.lost.then((info) => {
      if (!this._destroyed) this._fail(`the GPU device was lost (${info.reason || "unknown"}: ${info.message})`, false);
    });
    device.addEventListener("uncapturederror", (ev) => {
      this._fail(`uncaptured WebGPU error: ${errorText(ev.error)}`, false);
    });
  }

  /** Register a listener told once, with the reason in words, when this GPU path fails. */
  onFailure(fn) {
    this._listeners.push(fn);
    if (this.failure) fn(this.failure);
  }

  get usable() {
    return !this.failure && !this._destroyed;
  }

  destroy() {
    this._destroyed = true;
    for (const t of Object.values(this._tables)) t.destroy();
    this.device.destroy();
  }

  _fail(reason, raise = true) {
    if (!this.failure) {
      this.failure = reason;
      for (const fn of this._listeners) {
        try { fn(reason); } catch (err) { console.error("onFailure listener threw", err); }
      }
    }
    if (raise) throw new GpuError(reason);
  }

  _assertUsable() {
    if (this._destroyed) throw new GpuError("the GPU path was shut down");
    if (this.failure) throw new GpuError(this.failure);
  }

  /** Run fn() (synchronous WebGPU calls) inside validation, out-of-memory and internal scopes. */
  async _scoped(what, fn) {
    this._assertUsable();
    const d = this.device;
    d.pushErrorScope("internal");
    d.pushErrorScope("out-of-memory");
    d.pushErrorScope("validation");
    let value;
    let thrown = null;
    try {
      value = fn();
    } catch (err) {
      thrown = err;
    }
    const errors = [];
    for (let i = 0; i < 3; i++) {
      const e = await d.popErrorScope();
      if (e) errors.push(errorText(e));
    }
    if (thrown) this._fail(`${what} failed: ${errorText(thrown)}`);
    if (errors.length) this._fail(`${what} failed: ${errors.join("; ")}`);
    return value;
  }

  async _init(luts, shaderBase) {
    this.luts = luts;
    this.shaderBase = shaderBase;
    const upload = (name, data) => this._scoped(`uploading the ${name} table`, () => {
      const buf = this.device.createBuffer({
        label: `${name} table`, size: data.byteLength, usage: GPUBufferUsage.STORAGE, mappedAtCreation: true,
      });
      new Int32Array(buf.getMappedRange()).set(data);
      buf.unmap();
      return buf;
    });
    this._tables.mul = await upload("mul", luts.mul);
    this._tables.requantize = await upload("requantize", luts.requantize);
    this._tables.relu = await upload("relu", luts.relu);
    this._tables.exp = await upload("exp", luts.exp);
    for (const name of KERNELS) await this._pipeline(name, shaderBase);
  }

  async _pipeline(name, shaderBase) {
    if (this._pipelines.has(name)) return this._pipelines.get(name);
    const url = `${shaderBase}${name}.wgsl`;
    let code;
    try {
      const resp = await fetch(url, { cache: "no-store" });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      code = await resp.text();
    } catch (err) {
      this._fail(`could not load the kernel ${url}: ${errorText(err)}`);
    }
    const pipeline = await this._compile(name, code, url);
    this._pipelines.set(name, pipeline);
    return pipeline;
  }

  /** A compute pipeline (entry point main) from WGSL text; any error fails the GPU path. */
  async _compile(name, code, url) {
    const module = await this._scoped(`compiling ${url}`, () => this.device.createShaderModule({ label: name, code }));
    const info = await module.getCompilationInfo();
    const errs = info.messages.filter((m) => m.type === "error");
    if (errs.length) {
      this._fail(`compiling ${url} failed: ${errs.map((m) => `line ${m.lineNum}: ${m.message}`).join("; ")}`);
    }
    return this._scoped(`creating the ${name} pipeline`, () => this.device.createComputePipeline({
      label: name, layout: "auto", compute: { module, entryPoint: "main" },
    }));
  }

  /**
   * The resident plan (gpu_resident.js) that computes a whole micro-batch of b samples of
   * `spec` on this GPU, or null where it does not apply (then the engine calls the units one
   * by one). `this.resident = false` turns it off (bench, tests).
   */
  async residentPlan(spec, b) {
    if (this.resident === false) return null;
    this._assertUsable();
    if (!this._residentOpening) { // one ResidentPlans, however many calls wait for it
      this._residentOpening = import("./gpu_resident.js").then(({ ResidentPlans }) => {
        this._residentPlans = new ResidentPlans(this);
        return this._residentPlans;
      });
    }
    const plan = await (await this._residentOpening).plan(spec, b);
    if (plan) this.residentCalls = (this.residentCalls || 0) + 1;
    return plan;
  }

  /** What the resident path did: {calls (micro-batch passes it ran), dot, gemm (the kernel
   *  of the last plan), measured (the fastest on the last plan's model, timed on its passes
   *  with each kernel, "kernel/16" where fewer split sums won), gemm_ms (those times),
   *  reason (why it is not used: tables that are not the arithmetic, a failed self-check)}
   *  or null. */
  get residentInfo() {
    const r = this._residentPlans;
    return r ? { calls: this.residentCalls || 0, dot: r.dot, gemm: r.gemm, measured: r.measured, gemm_ms: r.gemmTimes || null, reason: r.reason } : null;
  }

  _checkSize(what, elements) {
    const bytes = elements * 4;
    if (bytes > this.limits.maxStorageBufferBindingSize || bytes > this.limits.maxBufferSize) {
      throw new GpuError(`${what}: ${elements} elements exceed this GPU's storage buffer limit ` +
        `(${this.limits.maxStorageBufferBindingSize} bytes)`);
    }
  }

  _grid1d(n) {
    const groups = Math.ceil(n / LANES);
    const max = this.limits.maxComputeWorkgroupsPerDimension;
    if (groups <= max) return [groups, 1];
    const y = Math.ceil(groups / max);
    if (y > max) throw new GpuError(`${n} elements need more workgroups than this GPU allows`);
    return [max, y];
  }

  /**
   * One dispatch: upload inputs, poison the output, run, read back the output (and status).
   * tables: table names bound after the uniforms; inputs: Int32Arrays bound next; then the
   * output (outLen elements) and, if withStatus, the status word.
   */
  async _dispatch(kernel, { uniforms, tables, inputs, outLen, withStatus, grid }) {
    this._assertUsable();
    const d = this.device;
    const pipeline = this._pipelines.get(kernel);
    const outBytes = outLen * 4;
    const stageBytes = outBytes + (withStatus ? 4 : 0);
    const made = [];
    const { staging } = await this._scoped(`running the ${kernel} kernel`, () => {
      const buffer = (label, size, usage, fill) => {
        const buf = d.createBuffer({ label, size: Math.max(size, 4), usage, mappedAtCreation: !!fill });
        if (fill) {
          fill(new Int32Array(buf.getMappedRange()));
          buf.unmap();
        }
        made.push(buf);
        return buf;
      };
      const uni = buffer(`${kernel} params`, uniforms.byteLength, GPUBufferUsage.UNIFORM,
        (m) => m.set(new Int32Array(uniforms.buffer)));
      const ins = inputs.map((x, i) => buffer(`${kernel} input ${i}`, x.byteLength, GPUBufferUsage.STORAGE,
        (m) => m.set(x)));
      const out = buffer(`${kernel} output`, outBytes, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
        (m) => m.fill(POISON));
      const status = withStatus ? buffer(`${kernel} status`, 4, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC) : null;
      const stage = d.createBuffer({ label: `${kernel} readback`, size: stageBytes,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      const bound = [uni, ...tables.map((t) => this._tables[t]), ...ins, out];
      if (status) bound.push(status);
      const group = d.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: bound.map((buf, binding) => ({ binding, resource: { buffer: buf } })),
      });
      const enc = d.createCommandEncoder({ label: kernel });
      const pass = enc.beginComputePass({ label: kernel });
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(grid[0], grid[1], 1);
      pass.end();
      enc.copyBufferToBuffer(out, 0, stage, 0, outBytes);
      if (status) enc.copyBufferToBuffer(status, 0, stage, outBytes, 4);
      d.queue.submit([enc.finish()]);
      return { staging: stage };
    });
    try {
      await staging.mapAsync(GPUMapMode.READ);
    } catch (err) {
      for (const b of made) b.destroy();
      this._fail(`reading back the ${kernel} result failed: ${errorText(err)}`);
    }
    const mapped = staging.getMappedRange();
    const result = new Int32Array(mapped.slice(0, outBytes));
    const flags = withStatus ? new Uint32Array(mapped, outBytes, 1)[0] : 0;
    staging.unmap();
    staging.destroy();
    for (const b of made) b.destroy();
    return { result, flags };
  }

  /** C = op(A) · op(B) through the multiply table (see gemm.js for the descriptor). */
  async gemm(a, b, desc) {
    const L = gemmLayout(desc);
    if (a.length !== L.m * L.k || b.length !== L.k * L.n) {
      throw new UnitError(`gemm: A has ${a.length}, B ${b.length} elements; shape needs ${L.m * L.k} and ${L.k * L.n}`);
    }
    checkInt8Array("gemm", "A", a);
    checkInt8Array("gemm", "B", b);
    const max = this.limits.maxComputeWorkgroupsPerDimension;
    const grid = [Math.ceil(L.n / TILE), Math.ceil(L.m / TILE)];
    if (grid[0] > max || grid[1] > max) throw new GpuError(`gemm: ${L.m} x ${L.n} exceeds this GPU's dispatch limit`);
    for (const [what, len] of [["A", a.length], ["B", b.length], ["C", L.m * L.n]]) this._checkSize(`gemm ${what}`, len);
    if (L.k > MAX_K) throw new UnitError(`gemm: K = ${L.k} could overflow the int32 accumulator`);
    const uniforms = new Uint32Array([
      L.m, L.k, L.n, 0,
      0, L.aSm, L.aSk, 0,
      0, L.bSk, L.bSn, 0,
      0, L.n, 1, 0,
    ]);
    const { result, flags } = await this._dispatch("gemm", {
      uniforms, tables: ["mul"], inputs: [Int32Array.from(a), Int32Array.from(b)],
      outLen: L.m * L.n, withStatus: true, grid,
    });
    if (flags) this._fail(`gemm kernel saw operands outside int8 (status ${flags}) after the host check passed`);
    return result;
  }

  /** relu?(requantize(acc, shift)) elementwise -> Int32Array of int8 values. */
  async requantize(acc, shift, { relu = false } = {}) {
    checkIntArray("requantize", "acc", acc, INT32_MIN, INT32_MAX);
    checkShift("requantize", shift);
    if (!acc.length) return new Int32Array(0);
    this._checkSize("requantize", acc.length);
    const { result } = await this._dispatch("requantize", {
      uniforms: new Uint32Array([acc.length, shift, relu ? 1 : 0, 0]),
      tables: ["requantize", "relu"], inputs: [Int32Array.from(acc)],
      outLen: acc.length, withStatus: false, grid: this._grid1d(acc.length),
    });
    return result;
  }

  /** Elementwise products through the multiply table. */
  async mul(a, b) {
    if (a.length !== b.length) throw new UnitError(`mul: lengths differ (a ${a.length}, b ${b.length})`);
    checkInt8Array("mul", "a", a);
    checkInt8Array("mul", "b", b);
    if (!a.length) return new Int32Array(0);
    this._checkSize("mul", a.length);
    const { result, flags } = await this._dispatch("mul", {
      uniforms: new Uint32Array([a.length, 0, 0, 0]), tables: ["mul"],
      inputs: [Int32Array.from(a), Int32Array.from(b)], outLen: a.length, withStatus: true,
      grid: this._grid1d(a.length),
    });
    if (flags) this._fail(`mul kernel saw operands outside int8 (status ${flags}) after the host check passed`);
    return result;
  }

  /** Elementwise ReLU through the ReLU table. */
  async relu(x) {
    checkInt8Array("relu", "x", x);
    if (!x.length) return new Int32Array(0);
    this._checkSize("relu", x.length);
    const { result, flags } = await this._dispatch("relu", {
      uniforms: new Uint32Array([x.length, 0, 0, 0]), tables: ["relu"], inputs: [Int32Array.from(x)],
      outLen: x.length, withStatus: true, grid: this._grid1d(x.length),
    });
    if (flags) this._fail(`relu kernel saw operands outside int8 (status ${flags}) after the host check passed`);
    return result;
  }

  /** Elementwise exp unit through the exp table (the self-test's golden vectors). */
  async exp(z) {
    checkInt8Array("exp", "z", z);
    if (!z.length) return new Int32Array(0);
    this._checkSize("exp", z.length);
    const { result, flags } = await this._dispatch("exp", {
      uniforms: new Uint32Array([z.length, 0, 0, 0]), tables: ["exp"], inputs: [Int32Array.from(z)],
      outLen: z.length, withStatus: true, grid: this._grid1d(z.length),
    });
    if (flags) this._fail(`exp kernel saw operands outside int8 (status ${flags}) after the host check passed`);
    return result;
  }

  /** `batch` GEMMs on consecutive blocks of A and B (engine/paths.js gemmBatch). */
  async gemmBatch(a, b, desc) {
    const { batch, ...one } = desc;
    const L = gemmLayout(one);
    if (!Number.isInteger(batch) || batch < 1) throw new UnitError(`gemmBatch: batch must be a positive integer, got ${batch}`);
    if (a.length !== batch * L.m * L.k || b.length !== batch * L.k * L.n) {
      throw new UnitError(`gemmBatch: A has ${a.length}, B ${b.length} elements; the shape needs ${batch * L.m * L.k} and ${batch * L.k * L.n}`);
    }
    checkInt8Array("gemmBatch", "A", a);
    checkInt8Array("gemmBatch", "B", b);
    const tilesM = Math.ceil(L.m / TILE);
    const grid = [Math.ceil(L.n / TILE), batch * tilesM];
    const max = this.limits.maxComputeWorkgroupsPerDimension;
    if (grid[0] > max || grid[1] > max) throw new GpuError(`gemmBatch: ${batch} x ${L.m} x ${L.n} exceeds this GPU's dispatch limit`);
    for (const [what, len] of [["A", a.length], ["B", b.length], ["C", batch * L.m * L.n]]) this._checkSize(`gemmBatch ${what}`, len);
    const uniforms = new Uint32Array([
      L.m, L.k, L.n, batch,
      L.m * L.k, L.aSm, L.aSk, tilesM,
      L.k * L.n, L.bSk, L.bSn, 0,
    ]);
    const { result, flags } = await this._dispatch("gemm_batch", {
      uniforms, tables: ["mul"], inputs: [Int32Array.from(a), Int32Array.from(b)],
      outLen: batch * L.m * L.n, withStatus: true, grid,
    });
    if (flags) this._fail(`gemm_batch kernel saw operands outside int8 (status ${flags}) after the host check passed`);
    return result;
  }

  /** Causal integer softmax through the exp unit (engine/attention.js softmaxArray). */
  async softmax(scores, nb, T, E) {
    softmaxLayout(scores, nb, T, E);
    let worst = 0;
    for (let i = 0; i < scores.length; i++) worst = Math.max(worst, Math.abs(scores[i]));
    if (worst >= 2 ** 30) throw new UnitError("softmax: a score of 2^30 or more could overflow the kernel's differences");
    const rows = nb * T;
    this._checkSize("softmax", rows * T);
    const { result } = await this._dispatch("softmax", {
      uniforms: new Int32Array([rows, T, E + 4, 0]), tables: ["exp"], inputs: [Int32Array.from(scores)],
      outLen: rows * T, withStatus: false, grid: this._grid1d(rows),
    });
    return result;
  }

  // -- the image kernels (conv.js holds the same bytes in JS) ---------------------------------

  async _elementwise(kernel, uniforms, inputs, outLen) {
    for (const [i, x] of inputs.entries()) this._checkSize(`${kernel} input ${i}`, x.length);
    this._checkSize(`${kernel} output`, outLen);
    const { result } = await this._dispatch(kernel, {
      uniforms, tables: [], inputs: inputs.map((x) => Int32Array.from(x)), outLen, withStatus: false,
      grid: this._grid1d(outLen),
    });
    return result;
  }

  /** The columns matrix (b*h*w, ci*k*k) of a conv's channel-major int8 input. */
  async im2col(a, b, geom) {
    const { hw, cols, p } = convLayout("im2col", b, geom);
    if (a.length !== b * geom.ci * hw) throw new UnitError(`im2col: a has ${a.length} elements, the shape needs ${b * geom.ci * hw}`);
    checkInt8Array("im2col", "a", a);
    const n = b * hw * cols;
    return this._elementwise("im2col", new Uint32Array([n, geom.ci, geom.k, p, geom.h, geom.w, 0, 0]), [a], n);
  }

  /** The adjoint of im2col: (b*h*w, ci*k*k) int32 -> (b, ci*h*w) int32 exact sums. */
  async col2im(d, b, geom) {
    const { hw, cols, p } = convLayout("col2im", b, geom);
    if (d.length !== b * hw * cols) throw new UnitError(`col2im: d has ${d.length} elements, the shape needs ${b * hw * cols}`);
    checkIntArray("col2im", "d", d, INT32_MIN, INT32_MAX);
    let worst = 0;
    for (let i = 0; i < d.length; i++) worst = Math.max(worst, Math.abs(d[i]));
    if (worst * geom.k * geom.k > INT32_MAX) throw new UnitError("col2im: a sum could leave int32");
    const n = b * geom.ci * hw;
    return this._elementwise("col2im", new Uint32Array([n, geom.ci, geom.k, p, geom.h, geom.w, 0, 0]), [d], n);
  }

  /** 2x2 max pool, stride 2: (b, c*h*w) int8 -> (b, c*(h>>1)*(w>>1)). */
  async maxpool(a, b, geom) {
    const { hw, oh, ow } = poolLayout("maxpool", b, geom);
    if (a.length !== b * geom.c * hw) throw new UnitError(`maxpool: a has ${a.length} elements, the shape needs ${b * geom.c * hw}`);
    checkInt8Array("maxpool", "a", a);
    const n = b * geom.c * oh * ow;
    return this._elementwise("maxpool", new Uint32Array([n, geom.h, geom.w, 0]), [a], n);
  }

  /** The pool's backward: each window's error at its first maximum, 0 elsewhere. */
  async maxpoolBack(g, a, b, geom) {
    const { hw, oh, ow } = poolLayout("maxpoolBack", b, geom);
    if (g.length !== b * geom.c * oh * ow || a.length !== b * geom.c * hw) {
      throw new UnitError(`maxpoolBack: g has ${g.length}, a ${a.length} elements; the shape needs ${b * geom.c * oh * ow} and ${b * geom.c * hw}`);
    }
    checkInt8Array("maxpoolBack", "g", g);
    checkInt8Array("maxpoolBack", "a", a);
    const n = b * geom.c * hw;
    return this._elementwise("maxpool_back", new Uint32Array([n, geom.h, geom.w, 0]), [g, a], n);
  }
}

// -- which path a tab computes on ------------------------------------------------------------

/** "36×" / "1.4×": how many times one rate is the other, in words. */
export function timesText(ratio) {
  return `${ratio >= 10 ? Math.round(ratio) : ratio.toFixed(1)}×`;
}

/**
 * Choose the path a tab computes on from the measured micro-batch rates of the paths that
 * passed their self-test, and say why in words.
 *   rates  {gpu: number|null, cpu: number|null}   null: that path did not pass (or was not tried)
 *   want   null (the faster one) | "gpu" | "cpu" (asked for, e.g. by ?path=)
 *   gpuWhy why WebGPU is not usable, when rates.gpu is null; cpuWhy the same for the JS units
 *   adapter a short adapter name for the words, or ""
 *   cpuName what the CPU path runs, in words: "the JS units" or "WebAssembly SIMD"
 * @returns {{path: "gpu"|"cpu", reason: string, rates, ratio: number|null}}
 *   ratio: gpu rate / cpu rate when both passed
 */
export function choosePath({ rates, want = null, gpuWhy = null, cpuWhy = null, adapter = "", cpuName = "the JS units" }) {
  const their = cpuName === "the JS units" ? "their" : "its";
  const ok = (r) => Number.isFinite(r) && r > 0;
  const gpuOk = ok(rates.gpu);
  const named = adapter ? ` (${adapter})` : "";
  if (!ok(rates.cpu)) {
    if (!gpuOk) throw new Error(`this device cannot train: ${cpuName} failed ${their} self-test (${cpuWhy})`);
    return { path: "gpu", rates, ratio: null,
      reason: `WebGPU passed its self-test${named}; ${cpuName} failed ${their === "their" ? "theirs" : "its"} (${cpuWhy}): computing on WebGPU` };
  }
  if (!gpuOk) {
    const why = want === "cpu" ? "the CPU path was chosen" : gpuWhy ? `no WebGPU: ${gpuWhy}` : "no WebGPU";
    return { path: "cpu", reason: `${why}; ${cpuName} passed ${their} self-test`, rates, ratio: null };
  }
  const ratio = rates.gpu / rates.cpu;
  const faster = ratio >= 1;
  const compare = faster ? `${timesText(ratio)} faster than ${cpuName} here`
    : `${timesText(1 / ratio)} slower than ${cpuName} here`;
  if (want === "gpu") {
    return { path: "gpu", rates, ratio,
      reason: `WebGPU passed its self-test${named} and is ${compare}: computing on WebGPU, as asked (path=gpu)` };
  }
  if (want === "cpu") {
    return { path: "cpu", rates, ratio,
      reason: `WebGPU passed its self-test${named} and is ${compare}: computing on ${cpuName}, as asked (path=cpu)` };
  }
  if (faster) {
    return { path: "gpu", rates, ratio, reason: `WebGPU passed its self-test${named} and is ${compare}: computing on WebGPU` };
  }
  return { path: "cpu", rates, ratio, reason: `WebGPU passed but is ${compare}: computing on ${cpuName}` };
}
