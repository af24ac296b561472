// Elementwise multiply unit: out[i] = mul_table[(a[i] + 128) * 256 + (b[i] + 128)] (== a[i] * b[i]).
// Buffers:
//   mul_table: array<i32, 65536>
//   a, b: array<i32, n>, int8 values; out: array<i32, n>
//   status[0]: bit 0 set if an a[i] lies outside [-128, 127], bit 1 for b[i] (host throws)
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> mul_table: array<i32>;
@group(0) @binding(2) var<storage, read> a: array<i32>;
@group(0) @binding(3) var<storage, read> b: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<i32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;

fn int8_or_flag(v: i32, bit: u32) -> i32 {
  if (v < -128 || v > 127) {
    atomicOr(&status[0], bit);
    return clamp(v, -128, 127);
  }
  return v;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let x = int8_or_flag(a[i], 1u);
  let y = int8_or_flag(b[i], 2u);
  out[i] = mul_table[(x + 128) * 256 + (y + 128)];
}
