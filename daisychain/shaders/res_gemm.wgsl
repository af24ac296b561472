// The resident path's unit GEMM (webui/gpu_resident.js): C[c_off + m*c_sm + n*c_sn] =
// sum_k opA[m,k] * opB[k,n], opA[m,k] = A[a_off + m*a_sm + k*a_sk], opB[k,n] =
// B[b_off + k*b_sk + n*b_sn], the descriptor of gemm.wgsl. Operands are int8 values held in
// i32; products and sums are exact (|a*b| <= 2^14, K <= 131071: no partial sum leaves
// int32), so every order of the sum gives gemm.wgsl's bytes.
// Tiled with workgroup memory: a workgroup of 8 x 8 invocations computes a 32 x 32 tile of C,
// each invocation a 4 x 4 block in registers; per 16 values of K it packs the A and B tiles
// as four int8 per u32 (k, k+1, k+2, k+3 in bytes 0..3; zero outside the matrices) into
// workgroup memory, and every product of four is `dot4(a, b)`, defined by the module put in
// front of this one: res_dot4_packed.wgsl (the WGSL built-in dot4I8Packed, where the adapter
// has packed_4x8_integer_dot_product) or res_dot4_plain.wgsl (the same sum, sign-extended by
// shifts, where it has not).
// Split over K: workgroup z sums k in [z * kc, min(k, (z + 1) * kc)) and writes its partial C
// at c_off + z * c_split (kc 0: all of K); res_reduce.wgsl adds the partials (wrapping i32
// adds: any order, the same bits).
// Dispatch: (ceil(n / 32), ceil(m / 32), ceil(k / kc)) workgroups.

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

const KW: u32 = 4u; // u32 words of four k values per tile row: 16 values of K per tile
var<workgroup> As: array<u32, 128>; // [row * KW + word], 32 rows of A
var<workgroup> Bs: array<u32, 128>; // [col * KW + word], 32 columns of B

fn pack_a(row: u32, k0: u32, k1: u32) -> u32 {
  var word = 0u;
  for (var t = 0u; t < 4u; t++) {
    let kk = k0 + t;
    if (row < params.m && kk < k1) {
      word |= (u32(A[params.a_off + row * params.a_sm + kk * params.a_sk]) & 0xffu) << (8u * t);
    }
  }
  return word;
}

fn pack_b(col: u32, k0: u32, k1: u32) -> u32 {
  var word = 0u;
  for (var t = 0u; t < 4u; t++) {
    let kk = k0 + t;
    if (col < params.n && kk < k1) {
      word |= (u32(B[params.b_off + kk * params.b_sk + col * params.b_sn]) & 0xffu) << (8u * t);
    }
  }
  return word;
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let li = lid.y * 8u + lid.x;
  let row0 = wid.y * 32u;
  let col0 = wid.x * 32u;
  var acc: array<i32, 16>;
  for (var i = 0u; i < 16u; i++) {
    acc[i] = 0;
  }
  let kc = select(params.kc, params.k, params.kc == 0u);
  let kb = wid.z * kc;
  let ke = min(params.k, kb + kc);
  for (var k0 = kb; k0 < ke; k0 += 16u) {
    for (var t = 0u; t < 2u; t++) {
      let idx = li + t * 64u;
      let r = idx / KW;
      let kw = k0 + (idx % KW) * 4u;
      As[idx] = pack_a(row0 + r, kw, ke);
      Bs[idx] = pack_b(col0 + r, kw, ke);
    }
    workgroupBarrier();
    for (var w = 0u; w < KW; w++) {
      var av: array<u32, 4>;
      var bv: array<u32, 4>;
      for (var i = 0u; i < 4u; i++) {
        av[i] = As[(lid.y * 4u + i) * KW + w];
        bv[i] = Bs[(lid.x * 4u + i) * KW + w];
      }
      for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
          acc[i * 4u + j] += dot4(av[i], bv[j]);
        }
      }
    }
    workgroupBarrier();
  }
  let c_off = params.c_off + wid.z * params.c_split;
  for (var i = 0u; i < 4u; i++) {
    let row = row0 + lid.y * 4u + i;
    for (var j = 0u; j < 4u; j++) {
      let col = col0 + lid.x * 4u + j;
      if (row < params.m && col < params.n) {
        C[c_off + row * params.c_sm + col * params.c_sn] = acc[i * 4u + j];
      }
    }
  }
}
