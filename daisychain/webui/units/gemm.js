// The unit GEMM in plain JS: int8 matrices -> int32 accumulators, as
// daisychain/units/gemm.py defines it, with the transposed layouts the engine needs.
//
//   C (M, N) = op(A) · op(B),  C[m, n] = sum_k mul(opA[m, k], opB[k, n])
//   A is stored row-major (M, K), or (K, M) when transA;
//   B is stored row-major (K, N), or (N, K) when transB;
//   C is row-major (M, N), int32 (Int32Array).
//
// Two implementations with the same bytes:
// * gemmLut:  every product read from the verified multiply table, accumulated with `|0`.
// * gemmFast: products taken with `*` on Numbers. Exact because (1) it runs only after the
//   loaded multiply table was checked equal to a * b on all 65,536 pairs, so it sums the
//   same values; (2) |a * b| <= 2**14 and K <= MAX_K keep every partial sum below 2**31 in
//   magnitude, so no sum ever rounds (Numbers are exact to 2**53) and no int32 store wraps.
//
// A shape whose worst-case accumulation K * 2**14 could exceed 2**31 - 1 is refused.

import { UnitError, checkInt8Array } from "./units.js";

/** the largest inner dimension whose int32 accumulator cannot overflow: 131071 */
export const MAX_K = Math.floor(2147483647 / (128 * 128));

function isDim(x) {
  return Number.isInteger(x) && x >= 1 && x <= 0x7fffffff;
}

/**
 * Validate a GEMM descriptor {m, k, n, transA, transB} and return the element strides:
 * {m, k, n, aSm, aSk, bSk, bSn} with A[m, k] at m*aSm + k*aSk and B[k, n] at k*bSk + n*bSn.
 */
export function gemmLayout(desc) {
  const { m, k, n, transA = false, transB = false } = desc;
  if (!isDim(m) || !isDim(k) || !isDim(n)) {
    throw new UnitError(`gemm: m, k, n must be positive integers, got ${m}, ${k}, ${n}`);
  }
  if (k > MAX_K) {
    throw new UnitError(`gemm: K = ${k} could overflow the int32 accumulator ` +
      `(K * 16384 > 2**31 - 1; max K ${MAX_K})`);
  }
  return {
    m, k, n,
    aSm: transA ? 1 : k, aSk: transA ? m : 1,
    bSk: transB ? 1 : n, bSn: transB ? k : 1,
  };
}

function checkOperands(a, b, L) {
  if (a.length !== L.m * L.k) throw new UnitError(`gemm: A has ${a.length} elements, shape needs ${L.m * L.k}`);
  if (b.length !== L.k * L.n) throw new UnitError(`gemm: B has ${b.length} elements, shape needs ${L.k * L.n}`);
  checkInt8Array("gemm", "A", a);
  checkInt8Array("gemm", "B", b);
}

function outBuffer(out, L) {
  if (!out) return new Int32Array(L.m * L.n);
  if (!(out instanceof Int32Array) || out.length !== L.m * L.n) {
    throw new UnitError(`gemm: out must be an Int32Array of ${L.m * L.n} elements`);
  }
  return out;
}

/** C = op(A) · op(B) with every product taken from the multiply table. */
export function gemmLut(a, b, desc, luts, out) {
  const L = gemmLayout(desc);
  checkOperands(a, b, L);
  const c = outBuffer(out, L);
  const { m, k, n, aSm, aSk, bSk, bSn } = L;
  // B as table column offsets (b + 128), laid out (K, N) row-major.
  const cols = new Int32Array(k * n);
  for (let kk = 0; kk < k; kk++) for (let j = 0; j < n; j++) cols[kk * n + j] = b[kk * bSk + j * bSn] + 128;
  const t = luts.mul;
  const acc = new Int32Array(n);
  for (let i = 0; i < m; i++) {
    acc.fill(0);
    for (let kk = 0; kk < k; kk++) {
      const row = (a[i * aSm + kk * aSk] + 128) << 8;
      const base = kk * n;
      for (let j = 0; j < n; j++) acc[j] = (acc[j] + t[row + cols[base + j]]) | 0;
    }
    c.set(acc, i * n);
  }
  return c;
}

const exactChecked = new Set();

/** The fast path is valid only for a multiply table equal to a*b: check it once per set. */
export function requireExactMul(luts) {
  if (exactChecked.has(luts.manifestSha256)) return;
  const t = luts.mul;
  for (let a = -128; a < 128; a++) {
    for (let b = -128; b < 128; b++) {
      if (t[((a + 128) << 8) + (b + 128)] !== a * b) {
        throw new UnitError("gemmFast: the loaded multiply table is not the exact product table");
      }
    }
  }
  exactChecked.add(luts.manifestSha256);
}

/** Same bytes as gemmLut, by exact integer arithmetic on Numbers (see the header). */
export function gemmFast(a, b, desc, luts, out) {
  requireExactMul(luts);
  const L = gemmLayout(desc);
  checkOperands(a, b, L);
  const c = outBuffer(out, L);
  const { m, k, n, aSm, aSk, bSk, bSn } = L;
  const bb = new Int32Array(k * n);
  for (let kk = 0; kk < k; kk++) for (let j = 0; j < n; j++) bb[kk * n + j] = b[kk * bSk + j * bSn];
  const acc = new Int32Array(n);
  for (let i = 0; i < m; i++) {
    acc.fill(0);
    for (let kk = 0; kk < k; kk++) {
      const av = a[i * aSm + kk * aSk];
      if (av === 0) continue;
      const base = kk * n;
      for (let j = 0; j < n; j++) acc[j] += av * bb[base + j];
    }
    c.set(acc, i * n);
  }
  return c;
}
