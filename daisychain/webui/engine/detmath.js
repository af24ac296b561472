// Portable float arithmetic, line for line daisychain/engine/detmath.py: only IEEE
// + - * / sqrt, floor and comparisons, in the order written there. Never Math.pow/exp/log.

const DV = new DataView(new ArrayBuffer(8));
const TWO64 = 18446744073709551616; // 2^64, an exact literal

/** frexp exponent: m = f * 2^e with f in [0.5, 1); 0 for m == 0 (bit length for integers). */
export function exponent(m) {
  if (m === 0) return 0;
  if (!Number.isFinite(m)) throw new RangeError(`exponent: non-finite value ${m}`);
  let x = Math.abs(m);
  let bias = 0;
  DV.setFloat64(0, x);
  if (((DV.getUint32(0) >>> 20) & 0x7ff) === 0) { // subnormal: scale up exactly first
    x *= TWO64;
    bias = 64;
    DV.setFloat64(0, x);
  }
  return ((DV.getUint32(0) >>> 20) & 0x7ff) - 1022 - bias;
}

/** 2^k exactly, from the float64 bits (np.ldexp(1.0, k)). */
export function pow2(k) {
  if (!Number.isInteger(k)) throw new RangeError(`pow2: non-integer exponent ${k}`);
  if (k > 1023) return Infinity;
  if (k < -1022) return k < -1074 ? 0 : pow2(k + 64) / TWO64;
  DV.setUint32(0, (k + 1023) << 20);
  DV.setUint32(4, 0);
  return DV.getFloat64(0);
}

/** e = exponent(m) - 7 so that m * 2^-e lies in [64, 128); 0 when m == 0. */
export function quantExponent(m) {
  return m > 0 ? exponent(m) - 7 : 0;
}

/** clamp(floor(v * 2^-e + 1/2), -127, 127) */
export function quantize1(v, scale) {
  const q = Math.floor(v * scale + 0.5);
  return q < -127 ? -127 : q > 127 ? 127 : q;
}

/** Quantize a whole array with one exponent into an Int32Array of int8 values. */
export function quantize(values, e, out = new Int32Array(values.length)) {
  const scale = pow2(-e);
  for (let i = 0; i < values.length; i++) out[i] = quantize1(values[i], scale);
  return out;
}

/** detmath.zero_sum_errors: per sample i of G (rows x C int8 errors), s = the sum of the
 *  row's other entries: G[y_i] = 0 - s when s <= 127, else -127 with the excess s - 127
 *  taken off the others one unit at a time, each time from the largest (lowest class on a
 *  tie). The quantized error then sums to zero over the classes (engine version 2). In
 *  place; returns G. The excess is at most 128 (see the Python docstring), so the trim
 *  loop is bounded whatever C; below C with a sequence model's stochastic rounding. */
export function zeroSumErrors(G, y, rows, C) {
  for (let i = 0; i < rows; i++) {
    const o = i * C;
    const t = o + y[i];
    let s = 0;
    for (let c = o; c < o + C; c++) if (c !== t) s += G[c];
    if (s <= 127) {
      G[t] = 0 - s;
      continue;
    }
    G[t] = -127;
    for (let k = s - 127; k > 0; k--) {
      let best = -1;
      for (let c = o; c < o + C; c++) if (c !== t && (best < 0 || G[c] > G[best])) best = c;
      G[best] -= 1;
    }
  }
  return G;
}

/** max |x| (exact, order-free) */
export function absmax(xs, start = 0, end = xs.length) {
  let m = 0;
  for (let i = start; i < end; i++) {
    const v = Math.abs(xs[i]);
    if (v > m || v !== v) m = v;
  }
  return m;
}

export const LN2_HI = 0.6931471803691238;
export const LN2_LO = 1.9082149292705877e-10;
export const INV_LN2 = 1.4426950408889634;
export const EXP_MIN = -80.0;
export const EXP_COEFFS = [
  1.0, 1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
  0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05,
  2.7557319223985893e-06, 2.755731922398589e-07, 2.505210838544172e-08,
];

/** exp(x) for x <= 0 (below -80 clamped to -80), bit-identical to detmath.dexp. */
export function dexp(x) {
  x = Math.max(x, EXP_MIN);
  const k = Math.floor(x * INV_LN2 + 0.5);
  const r = (x - k * LN2_HI) - k * LN2_LO;
  let p = EXP_COEFFS[11];
  for (let i = 10; i >= 0; i--) p = p * r + EXP_COEFFS[i];
  return p * pow2(k);
}
