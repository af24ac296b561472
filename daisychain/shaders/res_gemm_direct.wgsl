// The resident path's unit GEMM without workgroup memory (webui/gpu_resident.js takes
// whichever of this and res_gemm.wgsl measures faster on the adapter: on a CPU-emulated
// adapter such as SwiftShader a workgroup barrier costs more than the loads it saves).
// The descriptor and the bytes of res_gemm.wgsl; each invocation computes a 4 x 4 block of C
// in registers, walking K in order with exact i32 products (|a*b| <= 2^14, K <= 131071).
// Split over K as in res_gemm.wgsl: workgroup z sums k in [z * kc, min(k, (z + 1) * kc)) into
// its partial C at c_off + z * c_split (kc 0: all of K).
// Dispatch: (ceil(n / 32), ceil(m / 32), ceil(k / kc)) workgroups of 8 x 8.

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

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row0 = gid.y * 4u;
  let col0 = gid.x * 4u;
  if (row0 >= params.m || col0 >= params.n) {
    return;
  }
  // rows / columns past the edge repeat the last one (their results are not written)
  var ra: vec4<u32>;
  var cb: vec4<u32>;
  for (var i = 0u; i < 4u; i++) {
    ra[i] = params.a_off + min(row0 + i, params.m - 1u) * params.a_sm;
    cb[i] = params.b_off + min(col0 + i, params.n - 1u) * params.b_sn;
  }
  var c0 = vec4<i32>(0);
  var c1 = vec4<i32>(0);
  var c2 = vec4<i32>(0);
  var c3 = vec4<i32>(0);
  let kc = select(params.kc, params.k, params.kc == 0u);
  let kb = gid.z * kc;
  let ke = min(params.k, kb + kc);
  for (var kk = kb; kk < ke; kk++) {
    let ak = kk * params.a_sk;
    let bk = kk * params.b_sk;
    let bv = vec4<i32>(B[cb.x + bk], B[cb.y + bk], B[cb.z + bk], B[cb.w + bk]);
    c0 += A[ra.x + ak] * bv;
    c1 += A[ra.y + ak] * bv;
    c2 += A[ra.z + ak] * bv;
    c3 += A[ra.w + ak] * bv;
  }
  let acc = array<vec4<i32>, 4>(c0, c1, c2, c3);
  let c_off = params.c_off + gid.z * params.c_split;
  for (var i = 0u; i < 4u; i++) {
    let row = row0 + i;
    for (var j = 0u; j < 4u; j++) {
      let col = col0 + j;
      if (row < params.m && col < params.n) {
        C[c_off + row * params.c_sm + col * params.c_sn] = acc[i][j];
      }
    }
  }
}
