// Requantize (+ optional ReLU) over an int32 buffer with one shift, through the tables:
//   out[i] = rq_table[route(acc[i], shift) + 32768]                 (apply_relu == 0)
//   out[i] = relu_table[rq_table[route(acc[i], shift) + 32768] + 128] (apply_relu == 1)
// which is clamp(floor(acc / 2^shift + 1/2), -127, 127), then max(., 0).
// route() is daisychain/units/reference.py `rq_route`, in i32 only (no i64):
//   shift >= 7: clamp(acc >> (shift - 7), -32768, 32767)
//   shift <  7: clamp(acc, -2^(8+shift), 2^(8+shift) - 1) << (7 - shift)
// Buffers:
//   rq_table:   array<i32, 65536>, indexed x + 32768 for the 16-bit routed x
//   relu_table: array<i32, 256>,   indexed x + 128
//   acc: array<i32, n> (any int32), out: array<i32, n> (int8 values in [-127, 127])
// The host checks 0 <= shift <= 31.
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x,
// so n may exceed 65535 * 64 by using a second dispatch dimension.

struct Params {
  n: u32, shift: u32, apply_relu: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> rq_table: array<i32>;
@group(0) @binding(2) var<storage, read> relu_table: array<i32>;
@group(0) @binding(3) var<storage, read> acc: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<i32>;

fn route(x: i32, s: u32) -> i32 {
  if (s >= 7u) {
    return clamp(x >> (s - 7u), -32768, 32767);
  }
  let lim = 1i << (8u + s);
  return clamp(x, -lim, lim - 1) << (7u - s);
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  var q = rq_table[route(acc[i], params.shift) + 32768];
  if (params.apply_relu != 0u) {
    q = relu_table[q + 128];
  }
  out[i] = q;
}
