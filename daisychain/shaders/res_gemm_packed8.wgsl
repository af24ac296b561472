// The resident path's unit GEMM on packed operands (webui/units/gpu_plan.js packs them with
// res_pack.wgsl): C[c_off + row*c_sm + col*c_sn] = sum_k opA[row,k] * opB[k,col], A as
// ap[row * kw + j], B as bp[col * kw + j], four int8 values of K a u32 (k = 4j + t in byte t,
// zero past K). A load brings four values of K, which matters where every load is a gather
// (a CPU-emulated adapter such as SwiftShader) and halves the memory read on a GPU. Each
// invocation computes an 8 x 4 block of C in registers (8 rows), sign-extending each byte by shifts
// (the value dot4I8Packed gives) with exact i32 products (|a*b| <= 2^14, K <= 131071): the
// bytes of res_gemm_direct.wgsl.
// Split over K as res_gemm_direct.wgsl: workgroup z sums the words [z * kcw, min(kw, (z + 1) *
// kcw)) into its partial C at c_off + z * c_split (kcw 0: all of K).
// Dispatch: (ceil(n / 32), ceil(m / 64), ceil(kw / kcw)) workgroups of 8 x 8.

struct Params {
  m: u32, kw: u32, n: u32, kcw: u32,
  c_off: u32, c_sm: u32, c_sn: u32, c_split: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ap: array<u32>;
@group(0) @binding(2) var<storage, read> bp: array<u32>;
@group(0) @binding(3) var<storage, read_write> C: array<i32>;

const SHIFTS = vec4<u32>(24u, 16u, 8u, 0u);

/** The four int8 of a word, sign-extended: byte t in component t. */
fn bytes4(w: u32) -> vec4<i32> {
  return bitcast<vec4<i32>>(vec4<u32>(w) << SHIFTS) >> vec4<u32>(24u);
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row0 = gid.y * 8u;
  let col0 = gid.x * 4u;
  if (row0 >= params.m || col0 >= params.n) {
    return;
  }
  // rows / columns past the edge repeat the last one (their results are not written)
  var ra: array<u32, 8>;
  var cb: vec4<u32>;
  for (var i = 0u; i < 8u; i++) {
    ra[i] = min(row0 + i, params.m - 1u) * params.kw;
  }
  for (var i = 0u; i < 4u; i++) {
    cb[i] = min(col0 + i, params.n - 1u) * params.kw;
  }
  let kcw = select(params.kcw, params.kw, params.kcw == 0u);
  let jb = gid.z * kcw;
  let je = min(params.kw, jb + kcw);
  var acc: array<vec4<i32>, 8>;
  for (var i = 0u; i < 8u; i++) {
    acc[i] = vec4<i32>(0);
  }
  for (var j = jb; j < je; j++) {
    // bt: byte t (k = 4j + t) of the four columns' words
    let bw = vec4<u32>(bp[cb.x + j], bp[cb.y + j], bp[cb.z + j], bp[cb.w + j]);
    let b0 = bitcast<vec4<i32>>(bw << vec4<u32>(24u)) >> vec4<u32>(24u);
    let b1 = bitcast<vec4<i32>>(bw << vec4<u32>(16u)) >> vec4<u32>(24u);
    let b2 = bitcast<vec4<i32>>(bw << vec4<u32>(8u)) >> vec4<u32>(24u);
    let b3 = bitcast<vec4<i32>>(bw) >> vec4<u32>(24u);
    for (var i = 0u; i < 8u; i++) {
      let a = bytes4(ap[ra[i] + j]);
      acc[i] += a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
    }
  }
  let c_off = params.c_off + gid.z * params.c_split;
  for (var i = 0u; i < 8u; i++) {
    let row = row0 + i;
    for (var j = 0u; j < 4u; j++) {
      let col = col0 + j;
      if (row < params.m && col < params.n) {
        C[c_off + row * params.c_sm + col * params.c_sn] = acc[i][j];
      }
    }
  }
}
