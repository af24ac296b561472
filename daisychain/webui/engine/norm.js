// The transformer's integer rules besides the GEMMs, line for line daisychain/engine/norm.py
// (docs/ENGINE.md, "The transformer"): rounding shifts, rounded integer division, the integer
// square root, wide values and their align-add, and RMSNorm forward and backward.
//
// Every value is an integer held in a Number (Float64Array), every intermediate below 2^53,
// so the arithmetic is exact and gives numpy's int64 values. This engine computes one
// micro-batch at a time: "per micro-batch" is over the whole array. Never -0: a negated zero
// is written 0 - x.

import { absmax, exponent, pow2 } from "./detmath.js";

export const WIDE_BITS = 15; // wide values (the residual stream and its error): |v| <= 2^15
export const NORM_F = 10; // rmsnorm's y = x / rms(x) * 2^NORM_F

/** Bit length of an integer m >= 0 (0 for 0). */
export const bitlen = (m) => exponent(m);

/** floor(v / 2^k + 1/2) for an integer v and k (k <= 0: v; k above 40 acts as 40). */
export function rshift1(v, k) {
  if (k <= 0) return v;
  if (k > 40) k = 40;
  return Math.floor((v + pow2(k - 1)) * pow2(-k));
}

/** rshift1 of every element -> Float64Array. */
export function rshift(V, k) {
  const out = new Float64Array(V.length);
  if (k <= 0) {
    out.set(V);
    return out;
  }
  if (k > 40) k = 40;
  const half = pow2(k - 1);
  const scale = pow2(-k);
  for (let i = 0; i < V.length; i++) out[i] = Math.floor((V[i] + half) * scale);
  return out;
}

/** floor(p / q) for integers 0 <= p < 2^53, q > 0: the IEEE quotient floored, then corrected
 *  by one step each way (exact). */
export function idiv(p, q) {
  let t = Math.floor(p / q);
  if (t * q > p) t -= 1;
  else if ((t + 1) * q <= p) t += 1;
  return t;
}

/** sign(a) * floor((2|a| + m) / (2m)) for m > 0: a / m rounded half away from zero. */
export function sdiv(a, m) {
  if (a < 0) return 0 - idiv(2 * (0 - a) + m, 2 * m);
  return idiv(2 * a + m, 2 * m);
}

/** The largest q with q*q <= v, for an integer 0 <= v < 2^53. */
export function isqrt(v) {
  let q = Math.floor(Math.sqrt(v));
  if (q * q > v) q -= 1;
  if ((q + 1) * (q + 1) <= v) q += 1;
  return q;
}

/** A wide value: t = max(0, bitlen(max|V|) - 15), V = rshift(V, t), e + t -> {V, e}. */
export function norm15(V, e) {
  const t = Math.max(bitlen(absmax(V)) - WIDE_BITS, 0);
  return { V: rshift(V, t), e: e + t };
}

/** The sum of [[V_i, e_i], ...] (same length) as a wide value: each made wide (norm15); over
 *  the operands not all zero, e = max(lowest e_i, highest e_i - 16) (all zero: e_1); S = the
 *  sum in order of V_i * 2^(e_i - e) where e_i >= e (exact, below 2^32) and
 *  rshift(V_i, e - e_i) where e_i < e; norm15(S, e) -> {V, e}. Operands within 16 bits of
 *  each other are added exactly and rounded once. */
export function alignAdd(ops) {
  const wide = ops.map(([V, e]) => norm15(V, e));
  let hi = null;
  let lo = null;
  for (const w of wide) {
    if (!(absmax(w.V) > 0)) continue;
    hi = hi === null ? w.e : Math.max(hi, w.e);
    lo = lo === null ? w.e : Math.min(lo, w.e);
  }
  const e = hi === null ? wide[0].e : Math.max(lo, hi - 16);
  const S = new Float64Array(wide[0].V.length);
  for (const w of wide) {
    const d = w.e - e;
    if (d >= 0) {
      const up = pow2(Math.min(d, 16));
      for (let i = 0; i < S.length; i++) S[i] += w.V[i] * up;
    } else {
      const part = rshift(w.V, -d);
      for (let i = 0; i < S.length; i++) S[i] += part[i];
    }
  }
  return norm15(S, e);
}

/** C = isqrt(D * 2^(2F)) = floor(sqrt(D) * 2^F). */
export const normConstant = (D) => isqrt(D * 2 ** (2 * NORM_F));

/**
 * RMSNorm of the rows of x (R rows of D wide integers): y = sdiv(x' * C, q) per row with
 * x' = x * 2^j (max|x'| in [2^14, 2^15]), q = isqrt(sum x'^2); a zero row gives 0.
 * Returns {y: Float64Array (|y| <= C + 1, exponent -F), q: Float64Array (R), j: Int32Array (R)}.
 */
export function rmsForward(x, R, D) {
  const C = normConstant(D);
  const y = new Float64Array(R * D);
  const q = new Float64Array(R);
  const j = new Int32Array(R);
  const xs = new Float64Array(D);
  for (let r = 0; r < R; r++) {
    const o = r * D;
    const m = absmax(x, o, o + D);
    if (m === 0) continue;
    const jr = Math.max(WIDE_BITS - bitlen(m), 0);
    const up = pow2(jr);
    let ss = 0;
    for (let d = 0; d < D; d++) {
      xs[d] = x[o + d] * up;
      ss += xs[d] * xs[d];
    }
    const qr = isqrt(ss);
    j[r] = jr;
    q[r] = qr;
    if (qr > 0) for (let d = 0; d < D; d++) y[o + d] = sdiv(xs[d] * C, qr);
  }
  return { y, q, j };
}

/**
 * The input error of rmsForward from int8 errors g (R rows of D) with exponent eg, the
 * norm's input exponent ex and its cache {y, q, j}: dx = rshift(w * C, J - j) with
 * w = sdiv(g * N - y * Pr, D * q), Pr = sum y * g, N = D * 2^(2F), J = max j over the
 * non-zero rows; exponent eg - 3F - ex + J; then norm15 -> {V, e}.
 */
export function rmsBackward(g, eg, ex, cache, R, D) {
  const { y, q, j } = cache;
  const C = normConstant(D);
  const N = D * 2 ** (2 * NORM_F);
  let J = null;
  for (let r = 0; r < R; r++) if (q[r] > 0 && (J === null || j[r] > J)) J = j[r];
  if (J === null) J = 0;
  const dx = new Float64Array(R * D);
  for (let r = 0; r < R; r++) {
    if (!(q[r] > 0)) continue;
    const o = r * D;
    let Pr = 0;
    for (let d = 0; d < D; d++) Pr += y[o + d] * g[o + d];
    const den = D * q[r];
    const k = J - j[r];
    for (let d = 0; d < D; d++) {
      const w = sdiv(g[o + d] * N - y[o + d] * Pr, den);
      dx[o + d] = rshift1(w * C, k);
    }
  }
  return norm15(dx, eg - 3 * NORM_F - ex + J);
}
