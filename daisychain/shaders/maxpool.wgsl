// 2 x 2 max pool, stride 2, on channel-major int8 maps (an odd last row / column is
// dropped); the bytes of webui/conv.js maxpoolArray. A max of integers: exact.
//   a:   array<i32, b * c * h * w>, a[sc * h * w + y * w + x] (sc = s * c + channel)
//   out: array<i32, n>, n = b * c * oh * ow, oh = h / 2, ow = w / 2 (floor):
//        out[sc * oh * ow + Y * ow + X] = max of a[sc, 2Y + i, 2X + j], i, j in {0, 1}
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64
// + lid.x; invocation i writes out[i] (i >= n returns).

struct Params {
  n: u32, h: u32, w: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let oh = params.h / 2u;
  let ow = params.w / 2u;
  let sc = i / (oh * ow);
  let Y = (i % (oh * ow)) / ow;
  let X = (i % (oh * ow)) % ow;
  let base = sc * params.h * params.w + 2u * Y * params.w + 2u * X;
  let w = params.w;
  out[i] = max(max(a[base], a[base + 1u]), max(a[base + w], a[base + w + 1u]));
}
