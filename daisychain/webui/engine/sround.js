// Stochastic rounding of a sequence model's output error, line for line
// daisychain/engine/sround.py (docs/ENGINE.md, "Loss (sequence models)"). All hashing is
// prng.js's mix32 (Math.imul, >>> 0): the same u for an entry in every language and split.

import { pow2 } from "./detmath.js";
import { mix32 } from "./prng.js";

const GOLDEN = 0x9e3779b9;
const ROW = 0x85ebca6b;
const TWO_M32 = pow2(-32);

/** r(s, t) of one micro-batch: x (b*T) token ids, y (b) labels -> Uint32Array (b*T), row s*T + t. */
export function rowKeys(x, y, b, T) {
  const out = new Uint32Array(b * T);
  for (let s = 0; s < b; s++) {
    let h = 0;
    for (let t = 0; t <= T; t++) {
      const v = t < T ? x[s * T + t] : y[s];
      h = mix32(((h + GOLDEN) >>> 0) ^ v);
    }
    for (let t = 0; t < T; t++) out[s * T + t] = mix32((h ^ (Math.imul(t, ROW) >>> 0)) >>> 0);
  }
  return out;
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
