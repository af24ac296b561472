// The integer PRNG and the deterministic shuffle, line for line daisychain/engine/prng.py.
// All arithmetic mod 2^32 with Math.imul and >>> 0.

import { pow2 } from "./detmath.js";

export const STREAM_PARAM = 0;
export const STREAM_SPLIT = 1 << 20;
export const STREAM_SHUFFLE = 1 << 21;
const TWO_M32 = pow2(-32);

export function mix32(x) {
  x >>>= 0;
  x = (x ^ (x >>> 16)) >>> 0;
  x = Math.imul(x, 0x7feb352d) >>> 0;
  x = (x ^ (x >>> 15)) >>> 0;
  x = Math.imul(x, 0x846ca68b) >>> 0;
  x = (x ^ (x >>> 16)) >>> 0;
  return x;
}

export function checkSeed(seed) {
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw new RangeError(`seed must be an integer in [0, 4294967295], got ${seed}`);
  }
  return seed;
}

export function key(seed, stream) {
  return mix32((checkSeed(seed) ^ (Math.imul(stream, 0x85ebca6b) >>> 0)) >>> 0);
}

/** u32(seed, stream, i) for i in [start, start + count) -> Uint32Array */
export function u32(seed, stream, count, start = 0) {
  const k = key(seed, stream);
  const out = new Uint32Array(count);
  for (let j = 0; j < count; j++) out[j] = mix32((Math.imul(start + j, 0x9e3779b9) + k) >>> 0);
  return out;
}

/** Floats in [0, 1): u32 * 2^-32 (exact). */
export function uniform(seed, stream, count) {
  const u = u32(seed, stream, count);
  const out = new Float64Array(count);
  for (let i = 0; i < count; i++) out[i] = u[i] * TWO_M32;
  return out;
}

/** A permutation of 0..n-1: indices sorted by (u32(seed, stream, i), i). */
export function permutation(seed, stream, n) {
  const keys = u32(seed, stream, n);
  const idx = Array.from({ length: n }, (_, i) => i);
  idx.sort((a, b) => (keys[a] - keys[b]) || (a - b));
  return Int32Array.from(idx);
}
