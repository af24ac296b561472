// The resident path's unit GEMM laid out for a CPU-emulated adapter (webui/units/gpu_resident.js
// times it beside res_gemm.wgsl, res_gemm_direct.wgsl and res_gemm_packed.wgsl and keeps the
// fastest). SwiftShader runs four invocations (consecutive local_invocation_index, here
// consecutive lid.x) as the four lanes of one SIMD routine, and a storage load is one vector
// load when the four lanes read the same word or four consecutive words, else a per-lane
// gather. So the four lanes take interleaved columns (lane x: columns col0 + 4j, col0 = 32 wid.x + x)
// and the same rows: a load of B (columns contiguous, b_sn = 1) is one vector load, a load of
// A one load replicated. Each invocation computes 16 rows x 8 columns of C in registers (24
// loads for 128 products per step of K: the emulation's loads cost more than the registers it
// spills; measured in GPU-process CPU time against 8 x 4, 8 x 8, 8 x 16 and 12 x 8 blocks);
// int32 operands, so no byte unpacking (a shift by a vector amount is emulated lane by lane
// there). On a GPU the same layout is coalesced.
// The descriptor and the bytes of res_gemm_direct.wgsl: C[c_off + row*c_sm + col*c_sn] =
// sum_k A[a_off + row*a_sm + k*a_sk] * B[b_off + k*b_sk + col*b_sn], K walked in order with
// exact i32 products (|a*b| <= 2^14, K <= 131071); split over K as there: workgroup z sums k in
// [z * kc, min(k, (z + 1) * kc)) into its partial C at c_off + z * c_split (kc 0: all of K).
// Dispatch: (ceil(n / 32), ceil(m / 256), ceil(k / kc)) workgroups of 4 x 16.

struct Params {
  m: u32, k: u32, n: u32, kc: u32,
  a_off: u32, a_sm: u32, a_sk: u32, _pad1: u32,
  b_off: u32, b_sk: u32, b_sn: u32, _pad2: u32,
  c_off: u32, c_sm: u32, c_sn: u32, c_split: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> A: array<i32>;
@group(0) @binding(2) var<storage, read> B: array<i32>;
@group(0) @binding(3) var<storage, read_write> C: array<i32>;

/** Row `row` of C from columns col0 + 4j: lo for j < 4, hi for j >= 4 (inside m x n only). */
fn store_row(c_off: u32, row: u32, col0: u32, lo: vec4<i32>, hi: vec4<i32>) {
  if (row >= params.m) {
    return;
  }
  let at = c_off + row * params.c_sm;
  let v = array<i32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
  for (var j = 0u; j < 8u; j++) {
    let col = col0 + 4u * j;
    if (col < params.n) {
      C[at + col * params.c_sn] = v[j];
    }
  }
}

@compute @workgroup_size(4, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let row0 = (wid.y * 16u + lid.y) * 16u; // the same for the four lanes
  if (row0 >= params.m) {
    return;
  }
  let col0 = wid.x * 32u + lid.x; // this lane's columns: col0 + 4j, j < 8
  // rows / columns past the edge repeat the last one (their results are not written)
  let m1 = params.m - 1u;
  let n1 = params.n - 1u;
  let ra0 = params.a_off + min(row0 + 0u, m1) * params.a_sm;
  let ra1 = params.a_off + min(row0 + 1u, m1) * params.a_sm;
  let ra2 = params.a_off + min(row0 + 2u, m1) * params.a_sm;
  let ra3 = params.a_off + min(row0 + 3u, m1) * params.a_sm;
  let ra4 = params.a_off + min(row0 + 4u, m1) * params.a_sm;
  let ra5 = params.a_off + min(row0 + 5u, m1) * params.a_sm;
  let ra6 = params.a_off + min(row0 + 6u, m1) * params.a_sm;
  let ra7 = params.a_off + min(row0 + 7u, m1) * params.a_sm;
  let ra8 = params.a_off + min(row0 + 8u, m1) * params.a_sm;
  let ra9 = params.a_off + min(row0 + 9u, m1) * params.a_sm;
  let ra10 = params.a_off + min(row0 + 10u, m1) * params.a_sm;
  let ra11 = params.a_off + min(row0 + 11u, m1) * params.a_sm;
  let ra12 = params.a_off + min(row0 + 12u, m1) * params.a_sm;
  let ra13 = params.a_off + min(row0 + 13u, m1) * params.a_sm;
  let ra14 = params.a_off + min(row0 + 14u, m1) * params.a_sm;
  let ra15 = params.a_off + min(row0 + 15u, m1) * params.a_sm;
  let cb0 = params.b_off + vec4<u32>(min(col0, n1), min(col0 + 4u, n1), min(col0 + 8u, n1), min(col0 + 12u, n1)) * params.b_sn;
  let cb1 = params.b_off + vec4<u32>(min(col0 + 16u, n1), min(col0 + 20u, n1), min(col0 + 24u, n1), min(col0 + 28u, n1)) * params.b_sn;
  var c0a = vec4<i32>(0);
  var c0b = vec4<i32>(0);
  var c1a = vec4<i32>(0);
  var c1b = vec4<i32>(0);
  var c2a = vec4<i32>(0);
  var c2b = vec4<i32>(0);
  var c3a = vec4<i32>(0);
  var c3b = vec4<i32>(0);
  var c4a = vec4<i32>(0);
  var c4b = vec4<i32>(0);
  var c5a = vec4<i32>(0);
  var c5b = vec4<i32>(0);
  var c6a = vec4<i32>(0);
  var c6b = vec4<i32>(0);
  var c7a = vec4<i32>(0);
  var c7b = vec4<i32>(0);
  var c8a = vec4<i32>(0);
  var c8b = vec4<i32>(0);
  var c9a = vec4<i32>(0);
  var c9b = vec4<i32>(0);
  var c10a = vec4<i32>(0);
  var c10b = vec4<i32>(0);
  var c11a = vec4<i32>(0);
  var c11b = vec4<i32>(0);
  var c12a = vec4<i32>(0);
  var c12b = vec4<i32>(0);
  var c13a = vec4<i32>(0);
  var c13b = vec4<i32>(0);
  var c14a = vec4<i32>(0);
  var c14b = vec4<i32>(0);
  var c15a = vec4<i32>(0);
  var c15b = vec4<i32>(0);
  let kc = select(params.kc, params.k, params.kc == 0u);
  let kb = wid.z * kc;
  let ke = min(params.k, kb + kc);
  for (var kk = kb; kk < ke; kk++) {
    let ak = kk * params.a_sk;
    let bk = kk * params.b_sk;
    let b0 = vec4<i32>(B[cb0.x + bk], B[cb0.y + bk], B[cb0.z + bk], B[cb0.w + bk]);
    let b1 = vec4<i32>(B[cb1.x + bk], B[cb1.y + bk], B[cb1.z + bk], B[cb1.w + bk]);
    let a0 = A[ra0 + ak];
    c0a += a0 * b0;
    c0b += a0 * b1;
    let a1 = A[ra1 + ak];
    c1a += a1 * b0;
    c1b += a1 * b1;
    let a2 = A[ra2 + ak];
    c2a += a2 * b0;
    c2b += a2 * b1;
    let a3 = A[ra3 + ak];
    c3a += a3 * b0;
    c3b += a3 * b1;
    let a4 = A[ra4 + ak];
    c4a += a4 * b0;
    c4b += a4 * b1;
    let a5 = A[ra5 + ak];
    c5a += a5 * b0;
    c5b += a5 * b1;
    let a6 = A[ra6 + ak];
    c6a += a6 * b0;
    c6b += a6 * b1;
    let a7 = A[ra7 + ak];
    c7a += a7 * b0;
    c7b += a7 * b1;
    let a8 = A[ra8 + ak];
    c8a += a8 * b0;
    c8b += a8 * b1;
    let a9 = A[ra9 + ak];
    c9a += a9 * b0;
    c9b += a9 * b1;
    let a10 = A[ra10 + ak];
    c10a += a10 * b0;
    c10b += a10 * b1;
    let a11 = A[ra11 + ak];
    c11a += a11 * b0;
    c11b += a11 * b1;
    let a12 = A[ra12 + ak];
    c12a += a12 * b0;
    c12b += a12 * b1;
    let a13 = A[ra13 + ak];
    c13a += a13 * b0;
    c13b += a13 * b1;
    let a14 = A[ra14 + ak];
    c14a += a14 * b0;
    c14b += a14 * b1;
    let a15 = A[ra15 + ak];
    c15a += a15 * b0;
    c15b += a15 * b1;
  }
  let c_off = params.c_off + wid.z * params.c_split;
  store_row(c_off, row0 + 0u, col0, c0a, c0b);
  store_row(c_off, row0 + 1u, col0, c1a, c1b);
  store_row(c_off, row0 + 2u, col0, c2a, c2b);
  store_row(c_off, row0 + 3u, col0, c3a, c3b);
  store_row(c_off, row0 + 4u, col0, c4a, c4b);
  store_row(c_off, row0 + 5u, col0, c5a, c5b);
  store_row(c_off, row0 + 6u, col0, c6a, c6b);
  store_row(c_off, row0 + 7u, col0, c7a, c7b);
  store_row(c_off, row0 + 8u, col0, c8a, c8b);
  store_row(c_off, row0 + 9u, col0, c9a, c9b);
  store_row(c_off, row0 + 10u, col0, c10a, c10b);
  store_row(c_off, row0 + 11u, col0, c11a, c11b);
  store_row(c_off, row0 + 12u, col0, c12a, c12b);
  store_row(c_off, row0 + 13u, col0, c13a, c13b);
  store_row(c_off, row0 + 14u, col0, c14a, c14b);
  store_row(c_off, row0 + 15u, col0, c15a, c15b);
}
