// The resident path's unit GEMM on packed operands (webui/units/gpu_plan.js packs them with
// res_pack.wgsl or res_im2col_pack.wgsl, the weights on the host): C[c_off + row*c_sm +
// col*c_sn] = sum_k opA[row,k] * opB[k,col], A as ap[row * kw + j], B as bp[col * kw + j],
// four int8 values of K a u32 (k = 4j + t in byte t, zero past K). A load brings four values
// of K, which matters where every load is a per-lane gather (a CPU-emulated adapter such as
// SwiftShader) and quarters the memory read on a GPU; every product of four is `dot4(a, b)`,
// defined by the module put in front of this one: res_dot4_packed.wgsl (the WGSL built-in
// dot4I8Packed, where the adapter has packed_4x8_integer_dot_product: sign-extended bytes,
// wrapping adds) or res_dot4_plain.wgsl (the same sum by shifts). Exact i32 sums (|a*b| <=
// 2^14, K <= 131071): the bytes of res_gemm_direct.wgsl. Each invocation computes a 4 x 4
// block of C in registers.
// Split over K as res_gemm_direct.wgsl: workgroup z sums the words [z * kcw, min(kw, (z + 1) *
// kcw)) into its partial C at c_off + z * c_split (kcw 0: all of K).
// Dispatch: (ceil(n / 32), ceil(m / 32), ceil(kw / kcw)) workgroups of 8 x 8.

struct Params {
  m: u32, kw: u32, n: u32, kcw: u32,
  c_off: u32, c_sm: u32, c_sn: u32, c_split: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ap: array<u32>;
@group(0) @binding(2) var<storage, read> bp: array<u32>;
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
    ra[i] = min(row0 + i, params.m - 1u) * params.kw;
    cb[i] = min(col0 + i, params.n - 1u) * params.kw;
  }
  let kcw = select(params.kcw, params.kw, params.kcw == 0u);
  let jb = gid.z * kcw;
  let je = min(params.kw, jb + kcw);
  var c0 = vec4<i32>(0);
  var c1 = vec4<i32>(0);
  var c2 = vec4<i32>(0);
  var c3 = vec4<i32>(0);
  for (var j = jb; j < je; j++) {
    let b0 = bp[cb.x + j];
    let b1 = bp[cb.y + j];
    let b2 = bp[cb.z + j];
    let b3 = bp[cb.w + j];
    let a0 = ap[ra.x + j];
    let a1 = ap[ra.y + j];
    let a2 = ap[ra.z + j];
    let a3 = ap[ra.w + j];
    c0 += vec4<i32>(dot4(a0, b0), dot4(a0, b1), dot4(a0, b2), dot4(a0, b3));
    c1 += vec4<i32>(dot4(a1, b0), dot4(a1, b1), dot4(a1, b2), dot4(a1, b3));
    c2 += vec4<i32>(dot4(a2, b0), dot4(a2, b1), dot4(a2, b2), dot4(a2, b3));
    c3 += vec4<i32>(dot4(a3, b0), dot4(a3, b1), dot4(a3, b2), dot4(a3, b3));
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
