// Stochastic rounding of a sequence model's errors, line for line daisychain/engine/sround.py
// (docs/ENGINE.md, "Loss (sequence models)" and "The transformer"): the output error's, and
// every requantize of an error in the backward pass (requantizeErrors). All hashing is
// prng.js's mix32 (Math.imul, >>> 0): the same bits for an entry in every language and split.

import { absmax, pow2 } from "./detmath.js";
import { bitlen } from "./norm.js";
import { mix32 } from "./prng.js";

const GOLDEN = 0x9e3779b9;
const ROW = 0x85ebca6b;
const SITE = 0x27d4eb2f;
const SITES = 16; // requantize sites per layer in the site key (a block has 13)
const TWO_M32 = pow2(-32);

/** h(s) of one micro-batch: x (b*T) token ids, y (b) labels -> Uint32Array (b). */
export function sampleKeys(x, y, b, T) {
  const out = new Uint32Array(b);
  for (let s = 0; s < b; s++) {
    let h = 0;
    for (let t = 0; t <= T; t++) {
      const v = t < T ? x[s * T + t] : y[s];
      h = mix32(((h + GOLDEN) >>> 0) ^ v);
    }
    out[s] = h;
  }
  return out;
}

/** r(s, t) of one micro-batch -> Uint32Array (b*T), row s*T + t; `h`: sampleKeys' if at hand. */
export function rowKeys(x, y, b, T, h = sampleKeys(x, y, b, T)) {
  const out = new Uint32Array(b * T);
  for (let s = 0; s < b; s++) {
    for (let t = 0; t < T; t++) out[s * T + t] = mix32((h[s] ^ (Math.imul(t, ROW) >>> 0)) >>> 0);
  }
  return out;
}

/** sigma(li, j) = mix32((li * 16 + j) ^ 0x27D4EB2F): requantize site j of layer li. */
export function siteKey(li, j) {
  return mix32(((li * SITES + j) ^ SITE) >>> 0);
}

/** A backward requantize of an error, rounded stochastically (sround.py requantize_errors):
 *  sh = max(0, bitlen(max|V|) - 7), q = clamp(floor((V + r) / 2^sh), -127, 127), r = the top
 *  sh bits of u = mix32(mix32(h(s) ^ site) + i * 0x9E3779B9) (u * 2^(sh - 32), floored), i
 *  the element's index in its sample's run of V (b equal runs, one per sample of `skeys`).
 *  The offsets on the host, then the path's requantize unit (round half up) of V + r - 2^sh / 2
 *  (every value an integer below 2^53: exact in Numbers), first floored by 2^t1, t1 = max(0,
 *  sh - 23), as transformer.js rq8 (the same result). -> {q: Int32Array, e: e + sh}. */
export async function requantizeErrors(units, V, e, skeys, site) {
  const b = skeys.length;
  const L = V.length / b;
  const sh = Math.max(bitlen(absmax(V)) - 7, 0);
  const t1 = Math.max(0, sh - 23);
  const up = pow2(sh - 32);
  const half = sh > 0 ? pow2(sh - 1) : 0;
  const scale = pow2(-t1);
  const x = new Int32Array(V.length);
  for (let s = 0; s < b; s++) {
    const k = mix32((skeys[s] ^ site) >>> 0);
    for (let l = 0, i = s * L; l < L; l++, i++) {
      const r = Math.floor(mix32((k + Math.imul(l, GOLDEN)) >>> 0) * up);
      x[i] = Math.floor((V[i] + r - half) * scale);
    }
  }
  return { q: await units.requantize(x, sh - t1), e: e + sh };
}

/** q = clamp(floor(dz * 2^-e + u), -127, 127), u = mix32(r + c * 0x9E3779B9) * 2^-32: dz
 *  (rows x C), one exponent e, keys (rows) -> Int32Array of int8 values (before zero-sum). */
export function quantizeStochastic(dz, e, keys, rows, C, out = new Int32Array(dz.length)) {
  const scale = pow2(-e);
  for (let r = 0; r < rows; r++) {
    const k = keys[r];
    for (let c = 0; c < C; c++) {
      const i = r * C + c;
      const u = mix32((k + Math.imul(c, GOLDEN)) >>> 0) * TWO_M32;
      const q = Math.floor(dz[i] * scale + u);
      out[i] = q < -127 ? -127 : q > 127 ? 127 : q;
    }
  }
  return out;
}
