// The 2 x 2 max pool's backward on the resident path (webui/units/gpu_plan.js), with the ReLU
// mask of the layer below and its layout in one pass: each window's int8 error goes to the
// window's FIRST maximum in the order (0,0), (0,1), (1,0), (1,1) (maxpool_back.wgsl's bytes;
// a dropped odd last row / column gets 0), then, when mask != 0, is zeroed where the pool's
// input a is not > 0 (a is the ReLU's output: engine/model.js backwardFrom's mask), and is
// written channel-major (rows 0: out[(s*c + ch)*h*w + y*w + x]) or as the conv's rows
// (rows 1: out[(s*h*w + y*w + x)*c + ch], what res_permute.wgsl dir 1 would make of it).
//   g: the pool output's errors, g[(s*c + ch)*oh*ow + Y*ow + X];  a: a[(s*c + ch)*h*w + y*w + x]
// One invocation per channel and 2 x 2 window covering the map, the channel fastest:
// i = ((s * wy + Y) * wx + X) * c + ch, wy = ceil(h / 2), wx = ceil(w / 2), n = b * wy * wx * c.
// Dispatch: 64 invocations per workgroup, i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, c: u32, h: u32, w: u32,
  mask: u32, rows: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> g: array<i32>;
@group(0) @binding(2) var<storage, read> a: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let nc = params.c;
  let h = params.h;
  let w = params.w;
  let wx = (w + 1u) / 2u;
  let wy = (h + 1u) / 2u;
  let ch = i % nc;
  let win = i / nc;
  let X = win % wx;
  let sy = win / wx;
  let Y = sy % wy;
  let smp = sy / wy;
  let hw = h * w;
  let map = (smp * nc + ch) * hw;
  let oh = h / 2u;
  let ow = w / 2u;
  let full = Y < oh && X < ow;
  var best = 0u; // the position (dy * 2 + dx) of the window's first maximum
  var v = 0;
  if (full) {
    let base = map + 2u * Y * w + 2u * X;
    var m = a[base];
    if (a[base + 1u] > m) {
      m = a[base + 1u];
      best = 1u;
    }
    if (a[base + w] > m) {
      m = a[base + w];
      best = 2u;
    }
    if (a[base + w + 1u] > m) {
      m = a[base + w + 1u];
      best = 3u;
    }
    v = g[(smp * nc + ch) * oh * ow + Y * ow + X];
    if (params.mask != 0u && !(m > 0)) {
      v = 0;
    }
  }
  for (var dy = 0u; dy < 2u; dy++) {
    let y = 2u * Y + dy;
    if (y >= h) {
      break;
    }
    for (var dx = 0u; dx < 2u; dx++) {
      let x = 2u * X + dx;
      if (x >= w) {
        break;
      }
      let p = y * w + x;
      let e = select(0, v, full && best == dy * 2u + dx);
      if (params.rows != 0u) {
        out[(smp * hw + p) * nc + ch] = e;
      } else {
        out[map + p] = e;
      }
    }
  }
}
