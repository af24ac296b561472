// Unit GEMM: C = op(A) · op(B) on int8-valued operands -> int32 accumulators.
// Every product is read from the verified multiply table; accumulation is i32 and cannot
// overflow because the host refuses K * 16384 > 2^31 - 1 (K > 131071).
//
// One strided kernel serves C = A·B, C = A·Bᵀ and C = Aᵀ·B: element strides come in params.
//   opA[m, k] = a[a_off + m * a_sm + k * a_sk]     (m < M, k < K), int8 values held as i32
//   opB[k, n] = b[b_off + k * b_sk + n * b_sn]     (k < K, n < N), int8 values held as i32
//   c[c_off + m * c_sm + n * c_sn] = sum_k mul_table[(opA[m, k] + 128) * 256 + (opB[k, n] + 128)]
// Buffers:
//   mul_table: array<i32, 65536>, mul_table[(a + 128) * 256 + (b + 128)] == a * b
//   status[0]: bit 0 set if an A operand lies outside [-128, 127], bit 1 for B (host throws)
// Dispatch: (ceil(N / 16), ceil(M / 16), 1) workgroups of 16 x 16 invocations; each invocation
// owns one C element; K is walked in tiles of 16 staged in workgroup memory. Shapes need not be
// multiples of 16: out-of-range loads are skipped and the inner loop stops at K.

const TILE: u32 = 16u;

struct Params {
  m: u32, k: u32, n: u32, _pad0: u32,
  a_off: u32, a_sm: u32, a_sk: u32, _pad1: u32,
  b_off: u32, b_sk: u32, b_sn: u32, _pad2: u32,
  c_off: u32, c_sm: u32, c_sn: u32, _pad3: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> mul_table: array<i32>;
@group(0) @binding(2) var<storage, read> a: array<i32>;
@group(0) @binding(3) var<storage, read> b: array<i32>;
@group(0) @binding(4) var<storage, read_write> c: array<i32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;

// ta[r][kk] = (opA[row0 + r, k0 + kk] + 128) * 256; tb[kk][col] = opB[k0 + kk, col0 + col] + 128
var<workgroup> ta: array<array<i32, TILE>, TILE>;
var<workgroup> tb: array<array<i32, TILE>, TILE>;

fn int8_or_flag(v: i32, bit: u32) -> i32 {
  if (v < -128 || v > 127) {
    atomicOr(&status[0], bit);
    return clamp(v, -128, 127);
  }
  return v;
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let row = wid.y * TILE + lid.y;
  let col = wid.x * TILE + lid.x;
  var acc: i32 = 0;
  let tiles = (params.k + TILE - 1u) / TILE;
  for (var t: u32 = 0u; t < tiles; t = t + 1u) {
    let k0 = t * TILE;
    let ka = k0 + lid.x;
    var ia: i32 = 0;
    if (row < params.m && ka < params.k) {
      let v = int8_or_flag(a[params.a_off + row * params.a_sm + ka * params.a_sk], 1u);
      ia = (v + 128) * 256;
    }
    ta[lid.y][lid.x] = ia;
    let kb = k0 + lid.y;
    var ib: i32 = 0;
    if (col < params.n && kb < params.k) {
      let v = int8_or_flag(b[params.b_off + kb * params.b_sk + col * params.b_sn], 2u);
      ib = v + 128;
    }
    tb[lid.y][lid.x] = ib;
    workgroupBarrier();
    let kmax = min(TILE, params.k - k0);
    for (var kk: u32 = 0u; kk < kmax; kk = kk + 1u) {
      acc = acc + mul_table[ta[lid.y][kk] + tb[kk][lid.x]];
    }
    workgroupBarrier();
  }
  if (row < params.m && col < params.n) {
    c[params.c_off + row * params.c_sm + col * params.c_sn] = acc;
  }
}
