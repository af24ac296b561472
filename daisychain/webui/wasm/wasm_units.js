// The tab's CPU path on WebAssembly SIMD: WasmUnits has the `units` interface of
// engine/paths.js (gemm, requantize, im2col, col2im, maxpool, maxpoolBack; mul and relu stay
// the JS units) and gives the bytes of the JS units, which remain the reference and the
// fallback. The kernels are units.wat, assembled by scripts/build_wasm.mjs.
//
// A module is used only when (openWasmUnits):
//   1. the engine has WebAssembly with fixed-width SIMD (a one-instruction probe validates);
//   2. its bytes hash to the pinned SHA-256 (wasm/units.wasm.sha256, committed with the .wat);
//   3. the loaded tables are the exact ones the kernels compute arithmetically: mul == a*b on
//      all 65,536 pairs, relu == max(x, 0), requantize == clamp(floor(x/128 + 1/2), ±127);
//   4. its first, cold calls give the JS units' bytes on every kernel (selfCheck: every GEMM
//      layout, odd shapes, -128 * -128, every shift with and without ReLU, 3x3 and 5x5 convs,
//      odd maps). V8 compiles a function first with its baseline compiler, so these are the
//      calls a wrong baseline code generator would spoil (DETERMINISM.md rule 13);
//   5. whole micro-batches through fresh resident plans give the JS units' contribution
//      (wasm_plan.js planSelfCheck: a small CNN and an MLP, the plan kernels' cold calls);
//   6. the Adam kernel's first, cold calls give engine/adam.js adamStep's bits (wasm_adam.js
//      adamSelfCheck).
// Otherwise it returns {units: null, reason} and the tab computes on the JS units, saying why.
//
// Operands are copied into the module's memory (int32); A is packed to int8 rows with K
// contiguous and zero padding (pack, which also range-checks), B interleaved by K pairs as
// int16 (narrow_il); the outer-product kernel (units.op.wat gemm_op) multiplies 4x8 outputs
// at a time, and C is copied out. A value out of range throws the JS units' own UnitError.
//
// The image and dense models do not call the units one by one: residentPlan (wasm_plan.js)
// keeps a whole micro-batch in a module instance's memory, layer by layer, and the engine
// (model.js gradInto, predict) runs it instead. Its kernels are checked at open too (5.).

import { CpuUnits } from "../engine/cpu_units.js";
import { checkInt8Array, checkIntArray, checkShift, INT32_MAX, INT32_MIN, UnitError } from "../units/units.js";
import { gemmLayout, requireExactMul } from "../units/gemm.js";
import { checkLength, convLayout, poolLayout } from "../units/conv.js";
import { sha256Hex } from "../units/luts.js";
import { planFor, planSelfCheck } from "./wasm_plan.js";
import { adamSelfCheck, WasmAdam } from "./wasm_adam.js";

/** A module with one function `(func (result v128) v128.const i32x4 0 0 0 0)`: valid only
 *  where the engine has fixed-width SIMD. */
const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0,
  10, 22, 1, 20, 0, 253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11]);

export function hasWasmSimd() {
  try {
    return typeof WebAssembly === "object" && WebAssembly.validate(SIMD_PROBE);
  } catch {
    return false;
  }
}

/** The most memory one call may use in the module (wasm32 allows 4 GiB; browsers less). */
const MAX_MEMORY = 1024 * 1024 * 1024;

const INTEGRAL = [Int8Array, Int16Array, Int32Array, Uint8Array, Uint16Array];
const integral = (x) => INTEGRAL.some((T) => x instanceof T);
const up = (x, m) => Math.ceil(x / m) * m;

/** The requantize and relu tables equal the arithmetic the kernels compute (check 3). */
export function exactTablesFailure(luts) {
  try {
    requireExactMul(luts);
  } catch (err) {
    return err.message;
  }
  for (let x = -128; x < 128; x++) {
    if (luts.relu[x + 128] !== Math.max(x, 0)) return `the loaded relu table is not max(x, 0) at ${x}`;
  }
  for (let x = -32768; x < 32768; x++) {
    const q = Math.min(127, Math.max(-127, (x >> 7) + ((x >> 6) & 1)));
    if (luts.requantize[x + 32768] !== q) return `the loaded requantize table is not the rounding shift at ${x}`;
  }
  return null;
}

export class WasmUnits extends CpuUnits {
  constructor(luts, instance, module = null) {
    super(luts);
    this.name = "wasm";
    this.module = module; // a resident plan (wasm_plan.js) instantiates it again, its own memory
    this.k = instance.exports;
    this.mem = instance.exports.memory;
    this.top = 0;
  }

  // -- memory: a bump allocator reset by every call ------------------------------------------
  _reset() {
    this.top = 0;
  }

  _alloc(bytes) {
    const p = this.top;
    this.top = up(p + bytes, 16);
    const need = this.top - this.mem.buffer.byteLength;
    if (need > 0) this.mem.grow(Math.ceil(need / 65536));
    return p;
  }

  /** Whether one call's operands (bytes in all) fit the module's memory: it grows up to
   *  MAX_MEMORY; a call that needs more runs on the JS units (same bytes). */
  _fits(bytes) {
    if (bytes > MAX_MEMORY) return false;
    try {
      this._reset();
      this._alloc(bytes + 16 * 8);
      return true;
    } catch {
      return false; // the browser refused to grow the memory
    }
  }

  _put(x) {
    const p = this._alloc(x.length * 4);
    new Int32Array(this.mem.buffer, p, x.length).set(x);
    return p;
  }

  _get(p, n) {
    return new Int32Array(this.mem.buffer, p, n).slice();
  }

  /** A whole micro-batch of b samples of `spec` in the module's memory (wasm_plan.js), or
   *  null where none applies (the engine then calls the units one by one, same bits).
   *  `this.resident = false` turns it off (bench, tests). */
  async residentPlan(spec, b) {
    if (this.resident === false || !this.module) return null;
    return planFor(this, spec, b);
  }

  /** Adam for `size` parameters in its own instance of the module (wasm_adam.js), or null
   *  where none applies (the trainer then steps with engine/adam.js adamStep, same bits). */
  adamKernel(size) {
    if (this.adamOff || !this.module) return null;
    try {
      return new WasmAdam(this.module, size);
    } catch (err) {
      if (err instanceof RangeError) return null; // the browser would not give it the memory
      throw err;
    }
  }

  // -- the units interface -------------------------------------------------------------------
  async gemm(a, b, desc) {
    if (!integral(a) || !integral(b)) return super.gemm(a, b, desc);
    const L = gemmLayout(desc);
    const { m, k, n } = L;
    if (a.length !== m * k) throw new UnitError(`gemm: A has ${a.length} elements, shape needs ${m * k}`);
    if (b.length !== k * n) throw new UnitError(`gemm: B has ${b.length} elements, shape needs ${k * n}`);
    // the outer-product kernel (units.op.wat gemm_op): A packed as int8 rows, B interleaved
    // by K pairs as int16 (narrow_il reads B (k, n) as one (K, hw = n) map, Bᵀ as n rows)
    const mp = up(m, 4);
    const np = up(n, 8);
    const kp = up(k, 8);
    const kh = Math.ceil(k / 2);
    if (!this._fits(4 * (m * k + k * n + mp * np + np * kh) + mp * kp)) return super.gemm(a, b, desc);
    this._reset();
    const pa = this._put(a);
    const pb = this._put(b);
    const qa = this._alloc(mp * kp);
    const qb = this._alloc(np * kh * 4);
    const pc = this._alloc(mp * np * 4);
    if (this.k.pack(pa, qa, m, k, L.aSm, L.aSk, mp, kp)) checkInt8Array("gemm", "A", a);
    new Uint8Array(this.mem.buffer, qb, np * kh * 4).fill(0); // the padding narrow_il does not write
    if (desc.transB ? this.k.narrow_il(pb, qb, n, k, 1, kh) : this.k.narrow_il(pb, qb, 1, k, n, kh)) checkInt8Array("gemm", "B", b);
    this.k.gemm_op(qa, kp, qb, pc, mp, np, kh);
    if (np === n) return this._get(pc, m * n);
    const c = new Int32Array(m * n);
    const all = new Int32Array(this.mem.buffer, pc, mp * np);
    for (let i = 0; i < m; i++) c.set(all.subarray(i * np, i * np + n), i * n);
    return c;
  }

  async requantize(acc, shift, { relu = false } = {}) {
    if (!(acc instanceof Int32Array)) return super.requantize(acc, shift, { relu });
    checkShift("requantize", shift);
    if (!this._fits(8 * acc.length)) return super.requantize(acc, shift, { relu });
    this._reset();
    const p = this._put(acc);
    const q = this._alloc(acc.length * 4);
    this.k.requantize(p, q, acc.length, shift, relu ? 1 : 0);
    return this._get(q, acc.length);
  }

  /** max |x| of an int32 array, as detmath.absmax gives it (|-2^31| = 2^31). */
  absmax(x) {
    this._reset();
    return this.k.absmax(this._put(x), x.length) >>> 0;
  }

  async im2col(a, b, geom) {
    if (!integral(a)) return super.im2col(a, b, geom);
    const { hw, cols } = convLayout("im2col", b, geom);
    checkLength("im2col", "a", a, b * geom.ci * hw);
    if (!this._fits(4 * (a.length + b * hw * cols))) return super.im2col(a, b, geom);
    this._reset();
    const p = this._put(a);
    const q = this._alloc(b * hw * cols * 4);
    if (this.k.im2col(p, q, b, geom.ci, geom.h, geom.w, geom.k)) checkInt8Array("im2col", "a", a);
    return this._get(q, b * hw * cols);
  }

  async col2im(d, b, geom) {
    if (!integral(d)) return super.col2im(d, b, geom);
    const { hw, cols } = convLayout("col2im", b, geom);
    checkLength("col2im", "d", d, b * hw * cols);
    checkIntArray("col2im", "d", d, INT32_MIN, INT32_MAX);
    if (!this._fits(4 * (d.length + b * geom.ci * hw))) return super.col2im(d, b, geom);
    this._reset();
    const p = this._put(d);
    const q = this._alloc(b * geom.ci * hw * 4);
    if (this.k.col2im(p, q, b, geom.ci, geom.h, geom.w, geom.k)) throw new UnitError("col2im: a sum left int32");
    return this._get(q, b * geom.ci * hw);
  }

  async maxpool(a, b, geom) {
    if (!integral(a)) return super.maxpool(a, b, geom);
    const { hw, oh, ow } = poolLayout("maxpool", b, geom);
    checkLength("maxpool", "a", a, b * geom.c * hw);
    if (geom.h % 2 || geom.w % 2) checkInt8Array("maxpool", "a", a); // the dropped row / column
    if (!this._fits(8 * a.length)) return super.maxpool(a, b, geom);
    this._reset();
    const p = this._put(a);
    const q = this._alloc(b * geom.c * oh * ow * 4);
    if (this.k.maxpool(p, q, b * geom.c, geom.h, geom.w)) checkInt8Array("maxpool", "a", a);
    return this._get(q, b * geom.c * oh * ow);
  }

  async maxpoolBack(g, a, b, geom) {
    if (!integral(a) || !integral(g)) return super.maxpoolBack(g, a, b, geom);
    const { hw, oh, ow } = poolLayout("maxpoolBack", b, geom);
    checkLength("maxpoolBack", "g", g, b * geom.c * oh * ow);
    checkLength("maxpoolBack", "a", a, b * geom.c * hw);
    if (geom.h % 2 || geom.w % 2) checkInt8Array("maxpoolBack", "a", a);
    if (!this._fits(4 * (g.length + 2 * a.length))) return super.maxpoolBack(g, a, b, geom);
    this._reset();
    const pg = this._put(g);
    const pa = this._put(a);
    const q = this._alloc(b * geom.c * hw * 4);
    if (this.k.maxpool_back(pg, pa, q, b * geom.c, geom.h, geom.w)) {
      checkInt8Array("maxpoolBack", "g", g);
      checkInt8Array("maxpoolBack", "a", a);
    }
    return this._get(q, b * geom.c * hw);
  }
}

// -- the self-check on cold calls ------------------------------------------------------------

function cases() {
  let seed = 0x2545f491;
  const rnd = (lo, hi) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return lo + (seed >>> 7) % (hi - lo + 1); };
  const int8 = (n) => Int32Array.from({ length: n }, () => rnd(-128, 127));
  const out = [];
  for (const [m, k, n] of [[1, 1, 1], [3, 7, 5], [2, 8, 4], [5, 17, 9], [16, 33, 10], [13, 144, 6]]) {
    for (const transA of [false, true]) {
      for (const transB of [false, true]) {
        const a = int8(m * k);
        const b = int8(k * n);
        out.push([`gemm ${m}x${k}x${n}${transA ? " tA" : ""}${transB ? " tB" : ""}`, (u) => u.gemm(a, b, { m, k, n, transA, transB })]);
      }
    }
  }
  const lo = new Int32Array(64 * 9).fill(-128); // the extreme product, K large enough to matter
  out.push(["gemm -128 * -128", (u) => u.gemm(lo, lo, { m: 64, k: 9, n: 64, transB: true })]);
  const edges = [INT32_MIN, INT32_MIN + 1, INT32_MAX, INT32_MAX - 1, -1, 0, 1, 63, 64, 65, -63, -64, -65, 127, 128, -127, -128, -129];
  for (let s = 0; s <= 31; s++) {
    const acc = Int32Array.from([...edges, 2 ** s, -(2 ** s), (2 ** s) - 1, ...Array.from({ length: 13 }, () => rnd(-(2 ** 30), 2 ** 30))]);
    for (const relu of [false, true]) out.push([`requantize shift ${s}${relu ? " relu" : ""}`, (u) => u.requantize(acc, s, { relu })]);
  }
  for (const g of [{ ci: 2, k: 3, h: 5, w: 4 }, { ci: 3, k: 5, h: 6, w: 7 }, { ci: 1, k: 3, h: 1, w: 1 }]) {
    const b = 2;
    const a = int8(b * g.ci * g.h * g.w);
    const d = Int32Array.from({ length: b * g.h * g.w * g.ci * g.k * g.k }, () => rnd(-(2 ** 26), 2 ** 26));
    out.push([`im2col ${JSON.stringify(g)}`, (u) => u.im2col(a, b, g)]);
    out.push([`col2im ${JSON.stringify(g)}`, (u) => u.col2im(d, b, g)]);
  }
  for (const g of [{ c: 3, h: 4, w: 6 }, { c: 2, h: 5, w: 7 }]) {
    const b = 2;
    const a = Int32Array.from({ length: b * g.c * g.h * g.w }, () => rnd(-3, 3)); // ties
    const e = int8(b * g.c * (g.h >> 1) * (g.w >> 1));
    out.push([`maxpool ${JSON.stringify(g)}`, (u) => u.maxpool(a, b, g)]);
    out.push([`maxpoolBack ${JSON.stringify(g)}`, (u) => u.maxpoolBack(e, a, b, g)]);
  }
  const big = Int32Array.from([5, -7, INT32_MIN, 3, 9, 1]);
  out.push(["absmax", (u) => Int32Array.of(u instanceof WasmUnits ? u.absmax(big) : 2 ** 31)]);
  return out;
}

/** null when every kernel's first calls give the JS units' bytes, else the first difference. */
export async function selfCheck(wasm, cpu) {
  for (const [name, fn] of cases()) {
    let got;
    let want;
    try {
      got = await fn(wasm);
    } catch (err) {
      return `${name}: ${err.message}`;
    }
    want = await fn(cpu);
    if (got.length !== want.length) return `${name}: ${got.length} values, the JS units give ${want.length}`;
    for (let i = 0; i < got.length; i++) {
      if (got[i] !== want[i]) return `${name}: element ${i} is ${got[i]}, the JS units give ${want[i]}`;
    }
  }
  return null;
}

async function fetchBytes(base) {
  const [wasm, pin] = await Promise.all([fetch(`${base}units.wasm`, { cache: "no-store" }),
    fetch(`${base}units.wasm.sha256`, { cache: "no-store" })]);
  if (!wasm.ok) throw new Error(`${base}units.wasm: HTTP ${wasm.status} (the module was not built: scripts/setup.sh builds it)`);
  if (!pin.ok) throw new Error(`${base}units.wasm.sha256: HTTP ${pin.status}`);
  return { bytes: new Uint8Array(await wasm.arrayBuffer()), pinned: (await pin.text()).trim() };
}

/**
 * Open the WebAssembly SIMD path, or say in words why the tab computes on the JS units.
 * @param {object} luts verified tables (luts.js loadLuts)
 * @param {{base?: string, bytes?: Uint8Array, pinned?: string}} o  bytes/pinned given (node,
 *   tests) or fetched from `base` (default /webui/wasm/)
 * @returns {Promise<{units: WasmUnits|null, reason: string|null}>}
 */
export async function openWasmUnits(luts, { base = "/webui/wasm/", bytes = null, pinned = null } = {}) {
  if (!hasWasmSimd()) return { units: null, reason: "this browser has no WebAssembly SIMD: the tab computes on the JS units" };
  try {
    if (!bytes) ({ bytes, pinned } = await fetchBytes(base));
    const sha = await sha256Hex(bytes);
    if (pinned && sha !== pinned) {
      return { units: null, reason: `the WebAssembly module hashes to ${sha.slice(0, 12)}…, not its pinned ${pinned.slice(0, 12)}…: not used` };
    }
    const tables = exactTablesFailure(luts);
    if (tables) return { units: null, reason: `the WebAssembly kernels compute the exact units, but ${tables}: not used` };
    const { module, instance } = await WebAssembly.instantiate(bytes, {});
    const units = new WasmUnits(luts, instance, module);
    const bad = await selfCheck(units, new CpuUnits(luts)) || await planSelfCheck(units, new CpuUnits(luts)) ||
      adamSelfCheck(module);
    if (bad) return { units: null, reason: `the WebAssembly SIMD module failed its self-check (${bad}): not used` };
    return { units, reason: null };
  } catch (err) {
    return { units: null, reason: `the WebAssembly SIMD module could not be used (${err.message})` };
  }
}
