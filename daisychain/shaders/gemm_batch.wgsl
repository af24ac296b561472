// Batched unit GEMM: `batch` independent GEMMs C_z = op(A_z) · op(B_z) on int8-valued operands
// -> int32 accumulators, every product read from the verified multiply table (the per-head
// score, P·V and backward GEMMs of a transformer block, engine/transformer.js). The bytes of
// gemm.wgsl applied to each block z:
//   opA[z, m, k] = a[z * a_bs + m * a_sm + k * a_sk]     (m < M, k < K), int8 values in i32
//   opB[z, k, n] = b[z * b_bs + k * b_sk + n * b_sn]     (k < K, n < N), int8 values in i32
//   c[z * M * N + m * N + n] = sum_k mul_table[(opA[z, m, k] + 128) * 256 + (opB[z, k, n] + 128)]
// Buffers:
//   mul_table: array<i32, 65536>, mul_table[(a + 128) * 256 + (b + 128)] == a * b
//   status[0]: bit 0 set if an A operand lies outside [-128, 127], bit 1 for B (host throws);
//              such an operand is clamped so the table index stays in range
// The host refuses K * 16384 > 2^31 - 1, so no partial sum overflows.
// Dispatch: (ceil(N / 16), batch * ceil(M / 16), 1) workgroups of 16 x 16 invocations: the
// y index g = gid.y holds block z = g / (tiles_m * 16) and row g % (tiles_m * 16); invocation
// (x, g) owns C[z, row, x] and walks K itself, products summed in k order; invocations
// outside (M, N) return at once.

struct Params {
  m: u32, k: u32, n: u32, batch: u32,
  a_bs: u32, a_sm: u32, a_sk: u32, tiles_m: u32,
  b_bs: u32, b_sk: u32, b_sn: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> mul_table: array<i32>;
@group(0) @binding(2) var<storage, read> a: array<i32>;
@group(0) @binding(3) var<storage, read> b: array<i32>;
@group(0) @binding(4) var<storage, read_write> c: array<i32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let span = params.tiles_m * 16u;
  let z = gid.y / span;
  let row = gid.y % span;
  let col = gid.x;
  if (z >= params.batch || row >= params.m || col >= params.n) {
    return;
  }
  var acc: i32 = 0;
  var bad: u32 = 0u;
  var ia = z * params.a_bs + row * params.a_sm;
  var ib = z * params.b_bs + col * params.b_sn;
  for (var k: u32 = 0u; k < params.k; k = k + 1u) {
    let x = a[ia];
    let y = b[ib];
    if (x < -128 || x > 127) {
      bad = bad | 1u;
    }
    if (y < -128 || y > 127) {
      bad = bad | 2u;
    }
    acc = acc + mul_table[(clamp(x, -128, 127) + 128) * 256 + (clamp(y, -128, 127) + 128)];
    ia = ia + params.a_sk;
    ib = ib + params.b_sk;
  }
  if (bad != 0u) {
    atomicOr(&status[0], bad);
  }
  c[(z * params.m + row) * params.n + col] = acc;
}
