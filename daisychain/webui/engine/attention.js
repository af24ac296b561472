// The attention arithmetic of a transformer block in plain JS, line for line the helpers of
// daisychain/engine/attention.py (docs/ENGINE.md, "The transformer"): the head layout, the
// score scale, the causal integer softmax through the exp unit (the JS units' softmax; the
// WGSL kernel shaders/softmax.wgsl computes the same bytes) and its exact backward.
//
// Rows of a micro-batch are (b*T, D), row s*T + t; a head's matrices are (T, dh), dh = D/H,
// column h*dh + i of row s*T + t being element (s, h, t, i). Head-major arrays are
// (b*H, T, dh), index ((s*H + h)*T + t)*dh + i.

import { checkIntArray, INT32_MAX, INT32_MIN, UnitError } from "../units/units.js";
import { pow2 } from "./detmath.js";
import { idiv } from "./norm.js";

/** a: the scores are scaled by 2^-a, a = floor(log2(dh) / 2). */
export function attnShift(dh) {
  return (31 - Math.clz32(dh)) >> 1; // (bit length of dh - 1) >> 1
}

/** Rows (b*T, H*dh) -> head-major (b*H, T, dh), as an Int32Array. */
export function toHeads(M, b, T, H, dh) {
  const out = new Int32Array(b * T * H * dh);
  for (let s = 0; s < b; s++) {
    for (let t = 0; t < T; t++) {
      const src = (s * T + t) * H * dh;
      for (let h = 0; h < H; h++) {
        out.set(M.subarray(src + h * dh, src + h * dh + dh), ((s * H + h) * T + t) * dh);
      }
    }
  }
  return out;
}

/** Head-major (b*H, T, dh) -> rows (b*T, H*dh) (the inverse of toHeads), same array type. */
export function fromHeads(M, b, T, H, dh) {
  const out = new M.constructor(b * T * H * dh);
  for (let s = 0; s < b; s++) {
    for (let h = 0; h < H; h++) {
      for (let t = 0; t < T; t++) {
        const src = ((s * H + h) * T + t) * dh;
        out.set(M.subarray(src, src + dh), (s * T + t) * H * dh + h * dh);
      }
    }
  }
  return out;
}

/** Check the softmax operands (as the GPU path does before a dispatch). */
export function softmaxLayout(sc, nb, T, E) {
  if (!Number.isInteger(nb) || nb < 1 || !Number.isInteger(T) || T < 1 || T > 65535) {
    throw new UnitError(`softmax: nb and T must be positive integers, got ${nb}, ${T}`);
  }
  if (sc.length !== nb * T * T) throw new UnitError(`softmax: scores have ${sc.length} elements, the shape needs ${nb * T * T}`);
  if (!Number.isInteger(E) || E < -1000 || E > 1000) throw new UnitError(`softmax: the exponent must be an integer, got ${E}`);
  checkIntArray("softmax", "scores", sc, INT32_MIN, INT32_MAX);
}

/**
 * Causal integer softmax of nb (T, T) score matrices with exponent E (the 2^-a scale
 * included), through the exp unit: per row t, over u <= t, z = max(-128, floor((Sc - max) *
 * 2^(E + 4) + 1/2)), e = exp[z + 128], S = sum e, P = min(127, floor((256 e + S) / (2 S)));
 * P = 0 for u > t. -> Int32Array (nb*T*T) of int8 probabilities with exponent -7.
 */
export function softmaxArray(sc, nb, T, E, luts, out = new Int32Array(nb * T * T)) {
  softmaxLayout(sc, nb, T, E);
  const scale = pow2(E + 4);
  const ex = luts.exp;
  const e = new Float64Array(T);
  for (let r = 0; r < nb * T; r++) {
    const t = r % T;
    const o = r * T;
    let m = sc[o];
    for (let u = 1; u <= t; u++) if (sc[o + u] > m) m = sc[o + u];
    let S = 0;
    for (let u = 0; u <= t; u++) {
      let z = Math.floor((sc[o + u] - m) * scale + 0.5);
      if (z < -128) z = -128;
      e[u] = ex[z + 128];
      S += e[u];
    }
    for (let u = 0; u <= t; u++) out[o + u] = Math.min(127, idiv(256 * e[u] + S, 2 * S));
    for (let u = t + 1; u < T; u++) out[o + u] = 0;
  }
  return out;
}

/** dA = P * (128 dP - rho), rho = sum_u P dP per row (exact integers below 2^49): the
 *  softmax's backward on nb*T rows of T. -> Float64Array. */
export function softmaxBack(P, dP, rows, T) {
  const out = new Float64Array(rows * T);
  for (let r = 0; r < rows; r++) {
    const o = r * T;
    let rho = 0;
    for (let u = 0; u < T; u++) rho += P[o + u] * dP[o + u];
    for (let u = 0; u < T; u++) out[o + u] = P[o + u] === 0 ? 0 : P[o + u] * (128 * dP[o + u] - rho);
  }
  return out;
}
