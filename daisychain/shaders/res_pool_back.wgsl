// The 2 x 2 max pool's backward on the resident path (webui/units/gpu_plan.js), with the ReLU
// mask of the layer below and its layout in one pass: each window's int8 error goes to the
// window's FIRST maximum in the order (0,0), (0,1), (1,0), (1,1) (maxpool_back.wgsl's bytes;
// a dropped odd last row / column gets 0), then, when mask != 0, is zeroed where the pool's
// input a is not > 0 (a is the ReLU's output: engine/model.js backwardFrom's mask), and is
// written channel-major (rows 0: out[(s*c + ch)*h*w + y*w + x]) or as the conv's rows
// (rows 1: out[(s*h*w + y*w + x)*c + ch], what res_permute.wgsl dir 1 would make of it).
//   g: the pool output's errors, g[(s*c + ch)*oh*ow + Y*ow + X];  a: a[(s*c + ch)*h*w + y*w + x]
// With requant != 0, g holds the raw (int32) errors and is requantized as it is read, as
// res_requantize.wgsl would have (the shift from max |g| in state[slot]; invocation 0 writes
// state[slot + 1] = s and state[slot + 2] = state[2] + s, the backward pass's requantize words).
// One invocation per channel and 2 x 2 window covering the map, the channel fastest:
// i = ((s * wy + Y) * wx + X) * c + ch, wy = ceil(h / 2), wx = ceil(w / 2), n = b * wy * wx * c.
// Dispatch: 64 invocations per workgroup, i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, c: u32, h: u32, w: u32,
  mask: u32, rows: u32, requant: u32, slot: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> g: array<i32>;
@group(0) @binding(2) var<storage, read> a: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  var s = 0u;
  if (params.requant != 0u) {
    s = shift_of(state[params.slot]);
    if (i == 0u) {
      state[params.slot + 1u] = s;
      state[params.slot + 2u] = state[2u] + s;
    }
  }
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
    if (params.requant != 0u) {
      let t = shr_bits(v, max(s, 1u) - 1u);
      v = clamp(select(v, (t >> 1u) + (t & 1), s > 0u), -127, 127);
    }
    if (params.mask != 0u && !(m > 0)) {
      v = 0;
    }
    // a whole window: its four errors by straight-line stores
    let p0 = 2u * Y * w + 2u * X;
    let e0 = select(0, v, best == 0u);
    let e1 = select(0, v, best == 1u);
    let e2 = select(0, v, best == 2u);
    let e3 = select(0, v, best == 3u);
    if (params.rows != 0u) {
      let r0 = (smp * hw + p0) * nc + ch;
      out[r0] = e0;
      out[r0 + nc] = e1;
      out[r0 + w * nc] = e2;
      out[r0 + (w + 1u) * nc] = e3;
    } else {
      out[map + p0] = e0;
      out[map + p0 + 1u] = e1;
      out[map + p0 + w] = e2;
      out[map + p0 + w + 1u] = e3;
    }
    return;
  }
  // a window cut by the map's odd last row or column: zeros
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
