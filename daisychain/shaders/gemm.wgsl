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
//   status[0]: bit 0 set if an A operand lies outside [-128, 127], bit 1 for B (host throws);
//              such an operand is clamped so the table index stays in range
// Dispatch: (ceil(N / 16), ceil(M / 16), 1) workgroups of 16 x 16 invocations; invocation
// (x, y) of the grid owns C[y, x] and walks K itself, products summed in k order. Shapes need
// not be multiples of 16: invocations outside (M, N) return at once.
// (A version staging 16 x 16 tiles in workgroup memory was 1.5-3x slower on SwiftShader, whose
// barriers are costly; the engine's GEMMs are small, so the plain loop is the one kept.)

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

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row = gid.y;
  let col = gid.x;
  if (row >= params.m || col >= params.n) {
    return;
  }
  var acc: i32 = 0;
  var bad: u32 = 0u;
  var ia = params.a_off + row * params.a_sm;
  var ib = params.b_off + col * params.b_sn;
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
  c[params.c_off + row * params.c_sm + col * params.c_sn] = acc;
}
