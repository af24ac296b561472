// The resident plan's sums over few workgroups split, and its packed GEMM operands
// (webui/units/gpu_plan.js calls these while it builds a pass's dispatches):
//
// - A GEMM (or a bias gradient) with fewer than SPLIT_GROUPS workgroups is split over K (rows)
//   into partials, `parts` of them `m * n` apart, that are added by whoever reads them: in
//   place (`inPlace`, the partials written into the destination's own room, that gemmParts /
//   colsumParts size) by the pass that reads the sum (res_bias_absmax.wgsl for a layer's
//   accumulator) or the host (sumSlots, for the gradient it reads back), else by
//   res_reduce.wgsl, one more pass, into the destination. Wrapping i32 adds are associative and
//   the whole sum fits in int32 (a plan splits rows by MAX_K first), so the bits are the
//   unsplit sum's.
// - The packed kernel (res_gemm_packed.wgsl) reads A's rows and B's columns as four int8 of K a
//   u32: packRows on the host (the weights), res_pack.wgsl or res_im2col_pack.wgsl on the GPU.
//   The lanes kernel (res_gemm_lanes.wgsl) reads the forward weights transposed (transpose).

/** A sum with fewer workgroups than this is split (over K for a GEMM, over rows for a bias
 *  gradient) until it has about this many, so that it spreads over every thread of a CPU-emulated
 *  adapter and more cores of a GPU; each part sums at least MIN_PART terms (words of four for
 *  the packed kernel). gpu.residentSplit: false (never split) or another target (bench, tests);
 *  else the tab times SPLIT_GROUPS and SPLIT_FEW on its model (gpu_resident.js _fastestFor). */
export const SPLIT_GROUPS = 64;
/** The other target a tab times: a CPU emulation's few threads are fed by fewer workgroups,
 *  and every split costs its partials' writes and reads. */
export const SPLIT_FEW = 16;
export const MIN_PART = 64;

/** How a sum of k terms over `groups` workgroups is split, aiming at `target` workgroups:
 *  {parts, kc} (kc terms a part, the last part the rest; parts 1: not split). */
export function splitOf(groups, k, target = SPLIT_GROUPS) {
  if (target === false || groups >= target || k < 2 * MIN_PART) return { parts: 1, kc: k };
  const want = Math.min(Math.ceil(target / groups), Math.floor(k / MIN_PART));
  const kc = Math.ceil(k / want);
  return { parts: Math.ceil(k / kc), kc };
}

/** Rows of int8 values packed four of K a u32 (res_pack.wgsl's layout): out[r * kw + j] has
 *  x[r * sr + kk * sk], kk = 4j + t, in byte t; zero past k. */
export function packRows(x, rows, k, sr, sk) {
  const kw = Math.ceil(k / 4);
  const out = new Uint32Array(rows * kw);
  for (let r = 0; r < rows; r++) {
    for (let kk = 0; kk < k; kk++) out[r * kw + (kk >> 2)] |= (x[r * sr + kk * sk] & 255) << (8 * (kk & 3));
  }
  return out;
}

/** A rows x cols int matrix transposed, as int32 (res_gemm_lanes.wgsl's forward weights). */
export function transpose(x, rows, cols) {
  const out = new Int32Array(rows * cols);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[c * rows + r] = x[r * cols + c];
  return out;
}

/** The dispatches of C[cOff + row * n + col] = op(A) op(B), opA[r, kk] = A[aOff + r*aSm +
 *  kk*aSk], opB[kk, c] = B[bOff + kk*bSk + c*bSn], on `plan`'s GEMM kernel (`kernel`: its
 *  pipeline, "gemm" or the narrow "gemm_narrow") over `grid`
 *  workgroups; split over K (inPlace: the partials at cOff + z * m * n, gemmParts of them), and
 *  for the packed kernel its operands packed unless pa / pb (A / B already packed) are given. */
export function gemmOps(plan, list, A, B, C, { m, k, n, aOff, aSm, aSk, bOff, bSk, bSn, cOff, grid, pa, pb, inPlace, kernel = "gemm" }) {
  const target = plan.splitTarget;
  if (!plan.packed) {
    const { parts, kc } = splitOf(grid[0] * grid[1], k, target);
    if (parts === 1) {
      plan._op(list, kernel, [m, k, n, k, aOff, aSm, aSk, 0, bOff, bSk, bSn, 0, cOff, n, 1, 0], [A, B, C], grid);
      return;
    }
    const part = inPlace ? C : plan._buf(parts * m * n, "GEMM partials");
    plan._op(list, kernel, [m, k, n, kc, aOff, aSm, aSk, 0, bOff, bSk, bSn, 0, inPlace ? cOff : 0, n, 1, m * n], [A, B, part], [...grid, parts]);
    if (!inPlace) plan._op(list, "reduce", [m * n, parts, m * n, cOff], [part, C], plan._grid(m * n));
    return;
  }
  const kw = Math.ceil(k / 4);
  if (!pa) {
    pa = plan._buf(m * kw, "packed A");
    plan._op(list, "pack", [m, k, kw, aOff, aSm, aSk, 0, 0], [A, pa], plan._grid(m * kw));
  }
  if (!pb) {
    pb = plan._buf(n * kw, "packed B");
    plan._op(list, "pack", [n, k, kw, bOff, bSn, bSk, 0, 0], [B, pb], plan._grid(n * kw));
  }
  const { parts, kc } = splitOf(grid[0] * grid[1], kw, target);
  if (parts === 1) {
    plan._op(list, "gemm", [m, kw, n, kw, cOff, n, 1, 0], [pa, pb, C], grid);
    return;
  }
  const part = inPlace ? C : plan._buf(parts * m * n, "GEMM partials");
  plan._op(list, "gemm", [m, kw, n, kc, inPlace ? cOff : 0, n, 1, m * n], [pa, pb, part], [...grid, parts]);
  if (!inPlace) plan._op(list, "reduce", [m * n, parts, m * n, cOff], [part, C], plan._grid(m * n));
}

/** How many partials an m x k x n GEMM of `plan` is split into (gemmOps): an `inPlace`
 *  destination has room for that many, m * n apart. */
export function gemmParts(plan, m, k, n) {
  const grid = plan._gemmGrid(m, n);
  return splitOf(grid[0] * grid[1], plan.packed ? Math.ceil(k / 4) : k, plan.splitTarget).parts;
}

/** How many partials a bias gradient of rows x nOut errors is split into (colsumOps). */
export function colsumParts(plan, rows, nOut) {
  return splitOf(Math.ceil(nOut / 64), rows, plan.splitTarget).parts;
}

/** The sum of `size` words at each of `slots` in `got` (the partials of a split sum that the
 *  host adds: exact, the whole sum fits in int32); null where a word was left unwritten. */
export function sumSlots(got, slots, size, poison) {
  for (const off of slots) for (let j = off; j < off + size; j++) if (got[j] === poison) return null;
  if (slots.length === 1) return got.subarray(slots[0], slots[0] + size);
  const out = Float64Array.from(got.subarray(slots[0], slots[0] + size));
  for (const off of slots.slice(1)) for (let j = 0; j < size; j++) out[j] += got[off + j];
  return out;
}

/** The dispatches of out[off + o] = the column sums of the rows x nOut errors G (the bias
 *  gradient), split over rows as gemmOps splits K (inPlace: the partials at off + z * nOut). */
export function colsumOps(plan, list, G, out, rows, nOut, off, inPlace = false) {
  const groups = Math.ceil(nOut / 64);
  const { parts, kc } = splitOf(groups, rows, plan.splitTarget);
  if (parts === 1) {
    plan._op(list, "colsum", [rows, nOut, off, rows], [G, out], [groups, 1]);
    return;
  }
  if (inPlace) {
    plan._op(list, "colsum", [rows, nOut, off, kc], [G, out], [groups, 1, parts]);
    return;
  }
  const part = plan._buf(parts * nOut, "bias gradient partials");
  plan._op(list, "colsum", [rows, nOut, 0, kc], [G, part], [groups, 1, parts]);
  plan._op(list, "reduce", [nOut, parts, nOut, off], [part, out], plan._grid(nOut));
}
