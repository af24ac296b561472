// The INT8 units in plain JS, computed through the verified tables exactly as
// daisychain/units/ops.py does. Every value is an integer held with int32 semantics
// (`|0`, Int32Array); operands are range-checked and a bad one throws UnitError naming the
// unit and the range, never wraps silently.
//
//   mul(a, b)              int8 x int8 -> mul[(a + 128) * 256 + (b + 128)]   (== a * b)
//   relu(x)                int8 -> relu[x + 128]                             (== max(x, 0))
//   requantize(acc, shift) int32 -> requantize[rqRoute(acc, shift) + 32768]
//                          (== clamp(floor(acc / 2**shift + 1/2), -127, 127))
//   exp(z)                 int8 -> exp[z + 128]   (== floor(32768 * e**(min(z, 0) / 16) + 1/2),
//                          the transformer's softmax; an extra unit, docs/ENGINE.md)
//
// `luts` is what luts.js `loadLuts()` returns.

export const INT8_MIN = -128;
export const INT8_MAX = 127;
export const SAT = 127;
export const INT32_MIN = -2147483648;
export const INT32_MAX = 2147483647;
/** What an output buffer is filled with before a unit writes it: an element left unwritten fails
 *  the range checks (gpu.js, engine/cpu_units.js). */
export const POISON = 0x7fffffff;
export const MAX_SHIFT = 31;
export const RQ_TABLE_SHIFT = 7;

export class UnitError extends RangeError {
  constructor(message) {
    super(message);
    this.name = "UnitError";
  }
}

function fail(unit, name, lo, hi, got) {
  throw new UnitError(`${unit}: ${name} must be an integer in [${lo}, ${hi}], got ${got}`);
}

/** Throw unless x is an integer Number in [lo, hi]. */
export function checkInt(unit, name, x, lo, hi) {
  if (typeof x !== "number" || !Number.isInteger(x) || x < lo || x > hi) fail(unit, name, lo, hi, x);
  return x;
}

/** Throw unless every element of an array / typed array is an integer in [lo, hi]. */
export function checkIntArray(unit, name, xs, lo, hi) {
  if (xs instanceof Int8Array && lo <= -128 && hi >= 127) return xs;
  if (xs instanceof Int32Array && lo <= INT32_MIN && hi >= INT32_MAX) return xs;
  const integral = xs instanceof Int8Array || xs instanceof Int16Array || xs instanceof Int32Array ||
    xs instanceof Uint8Array || xs instanceof Uint16Array;
  for (let i = 0; i < xs.length; i++) {
    const v = xs[i];
    if (!(v >= lo && v <= hi) || (!integral && !Number.isInteger(v))) fail(unit, `${name}[${i}]`, lo, hi, v);
  }
  return xs;
}

export const checkInt8Array = (unit, name, xs) => checkIntArray(unit, name, xs, INT8_MIN, INT8_MAX);

export function checkShift(unit, shift) {
  return checkInt(unit, "shift", shift, 0, MAX_SHIFT);
}

/**
 * The int32-only part of requantize (reference.py `rq_route`): map an int32 accumulator and a
 * shift in [0, 31] to the 16-bit index x of the requantize table. No value leaves int32.
 */
export function rqRoute(acc, shift) {
  if (shift >= RQ_TABLE_SHIFT) {
    const x = acc >> (shift - RQ_TABLE_SHIFT);
    return x < -32768 ? -32768 : x > 32767 ? 32767 : x;
  }
  const lim = 1 << (8 + shift);
  const c = acc < -lim ? -lim : acc > lim - 1 ? lim - 1 : acc;
  return c << (RQ_TABLE_SHIFT - shift);
}

export function mul(a, b, luts) {
  checkInt("mul", "a", a, INT8_MIN, INT8_MAX);
  checkInt("mul", "b", b, INT8_MIN, INT8_MAX);
  return luts.mul[((a + 128) << 8) + (b + 128)];
}

export function relu(x, luts) {
  checkInt("relu", "x", x, INT8_MIN, INT8_MAX);
  return luts.relu[x + 128];
}

export function requantize(acc, shift, luts) {
  checkInt("requantize", "acc", acc, INT32_MIN, INT32_MAX);
  checkShift("requantize", shift);
  return luts.requantize[rqRoute(acc, shift) + 32768];
}

/** Elementwise products of two equal-length int8 arrays -> Int32Array (or `out`). */
export function mulArray(a, b, luts, out = new Int32Array(a.length)) {
  if (a.length !== b.length || out.length !== a.length) {
    throw new UnitError(`mul: lengths differ (a ${a.length}, b ${b.length}, out ${out.length})`);
  }
  checkInt8Array("mul", "a", a);
  checkInt8Array("mul", "b", b);
  const t = luts.mul;
  for (let i = 0; i < a.length; i++) out[i] = t[((a[i] + 128) << 8) + (b[i] + 128)];
  return out;
}

/** Elementwise ReLU of an int8 array -> Int32Array (or `out`). */
export function reluArray(x, luts, out = new Int32Array(x.length)) {
  if (out.length !== x.length) throw new UnitError(`relu: out has length ${out.length}, x ${x.length}`);
  checkInt8Array("relu", "x", x);
  const t = luts.relu;
  for (let i = 0; i < x.length; i++) out[i] = t[x[i] + 128];
  return out;
}

/** Elementwise exp unit of an int8 array -> Int32Array (or `out`). */
export function expArray(z, luts, out = new Int32Array(z.length)) {
  if (out.length !== z.length) throw new UnitError(`exp: out has length ${out.length}, z ${z.length}`);
  checkInt8Array("exp", "z", z);
  const t = luts.exp;
  for (let i = 0; i < z.length; i++) out[i] = t[z[i] + 128];
  return out;
}

/**
 * Requantize an int32 array by one shift, optionally followed by the ReLU unit
 * (relu(requantize(acc, shift))) -> Int32Array of int8 values (or `out`).
 */
export function requantizeArray(acc, shift, luts, { relu: withRelu = false, out } = {}) {
  out = out || new Int32Array(acc.length);
  if (out.length !== acc.length) throw new UnitError(`requantize: out has length ${out.length}, acc ${acc.length}`);
  checkIntArray("requantize", "acc", acc, INT32_MIN, INT32_MAX);
  checkShift("requantize", shift);
  const rq = luts.requantize;
  const rl = luts.relu;
  for (let i = 0; i < acc.length; i++) {
    const q = rq[rqRoute(acc[i], shift) + 32768];
    out[i] = withRelu ? rl[q + 128] : q;
  }
  return out;
}
