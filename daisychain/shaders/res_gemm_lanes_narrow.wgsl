// res_gemm_lanes.wgsl with a smaller block, for GEMMs with few columns (n <= 16: a conv's
// first layer, its weight gradient, a small classifier), where that kernel's 32 columns a
// workgroup would leave most lanes computing repeats of the last column
// (webui/units/gpu_split.js picks it by n). The four lanes of an emulated SIMD routine take
// interleaved columns (lane x: columns col0 + 4j, col0 = 16 wid.x + x) and the same rows, as
// there; each invocation computes 8 rows x 4 columns of C in registers.
// The descriptor and the bytes of res_gemm_direct.wgsl: C[c_off + row*c_sm + col*c_sn] =
// sum_k A[a_off + row*a_sm + k*a_sk] * B[b_off + k*b_sk + col*b_sn], K walked in order with
// exact i32 products (|a*b| <= 2^14, K <= 131071); split over K as there: workgroup z sums k in
// [z * kc, min(k, (z + 1) * kc)) into its partial C at c_off + z * c_split (kc 0: all of K).
// Dispatch: (ceil(n / 16), ceil(m / 128), ceil(k / kc)) workgroups of 4 x 16.

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

@compute @workgroup_size(4, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let row0 = (wid.y * 16u + lid.y) * 8u; // the same for the four lanes
  if (row0 >= params.m) {
    return;
  }
  let col0 = wid.x * 16u + lid.x; // this lane's columns: col0, col0 + 4, col0 + 8, col0 + 12
  // rows / columns past the edge repeat the last one (their results are not written)
  let m1 = params.m - 1u;
  let n1 = params.n - 1u;
  let ra0 = params.a_off + min(row0, m1) * params.a_sm;
  let ra1 = params.a_off + min(row0 + 1u, m1) * params.a_sm;
  let ra2 = params.a_off + min(row0 + 2u, m1) * params.a_sm;
  let ra3 = params.a_off + min(row0 + 3u, m1) * params.a_sm;
  let ra4 = params.a_off + min(row0 + 4u, m1) * params.a_sm;
  let ra5 = params.a_off + min(row0 + 5u, m1) * params.a_sm;
  let ra6 = params.a_off + min(row0 + 6u, m1) * params.a_sm;
  let ra7 = params.a_off + min(row0 + 7u, m1) * params.a_sm;
  let cb = params.b_off + vec4<u32>(min(col0, n1), min(col0 + 4u, n1), min(col0 + 8u, n1), min(col0 + 12u, n1)) * params.b_sn;
  var c0 = vec4<i32>(0);
  var c1 = vec4<i32>(0);
  var c2 = vec4<i32>(0);
  var c3 = vec4<i32>(0);
  var c4 = vec4<i32>(0);
  var c5 = vec4<i32>(0);
  var c6 = vec4<i32>(0);
  var c7 = vec4<i32>(0);
  let kc = select(params.kc, params.k, params.kc == 0u);
  let kb = wid.z * kc;
  let ke = min(params.k, kb + kc);
  for (var kk = kb; kk < ke; kk++) {
    let ak = kk * params.a_sk;
    let bk = kk * params.b_sk;
    let bv = vec4<i32>(B[cb.x + bk], B[cb.y + bk], B[cb.z + bk], B[cb.w + bk]);
    c0 += A[ra0 + ak] * bv;
    c1 += A[ra1 + ak] * bv;
    c2 += A[ra2 + ak] * bv;
    c3 += A[ra3 + ak] * bv;
    c4 += A[ra4 + ak] * bv;
    c5 += A[ra5 + ak] * bv;
    c6 += A[ra6 + ak] * bv;
    c7 += A[ra7 + ak] * bv;
  }
  let acc = array<vec4<i32>, 8>(c0, c1, c2, c3, c4, c5, c6, c7);
  let c_off = params.c_off + wid.z * params.c_split;
  for (var i = 0u; i < 8u; i++) {
    let row = row0 + i;
    for (var j = 0u; j < 4u; j++) {
      let col = col0 + 4u * j;
      if (row < params.m && col < params.n) {
        C[c_off + row * params.c_sm + col * params.c_sn] = acc[i][j];
      }
    }
  }
}
