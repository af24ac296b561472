// A conv's output on the resident path (webui/units/gpu_plan.js) in one pass: requantize
// (+ ReLU) its accumulator as res_requantize.wgsl does (the shift from state[slot], written to
// state[slot + 1] and state[slot + 2] = state[tin] + s by invocation 0), move it from rows
// (b*h*w, co) to channel-major (b, co*h*w), and, when pool != 0, the 2 x 2 max pool of that
// map (maxpool.wgsl's bytes: an odd last row / column is dropped):
//   acc:    acc[(s*h*w + y*w + x)*co + c]
//   out:    out[(s*co + c)*h*w + y*w + x] = q(acc[...])    (every y < h, x < w)
//   pooled: pooled[(s*co + c)*oh*ow + Y*ow + X] = max of out[s, c, 2Y + i, 2X + j], i, j in {0, 1}
// One invocation per channel and 2 x 2 window of the map, windows covering it (the last ones
// partial on an odd map), the channel fastest: i = ((s * wy + Y) * wx + X) * co + c,
// wy = ceil(h / 2), wx = ceil(w / 2), n = b * wy * wx * co.
// Dispatch: 64 invocations per workgroup, i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, co: u32, h: u32, w: u32,
  slot: u32, tin: u32, apply_relu: u32, pool: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> acc: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;
@group(0) @binding(3) var<storage, read_write> pooled: array<i32>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;

/** requantize (+ ReLU when relu) of v by the shift s: clamp((v >> s) + bit s-1 of v, -127, 127). */
fn requant(v: i32, s: u32, relu: bool) -> i32 {
  let t = shr_bits(v, max(s, 1u) - 1u);
  let q = clamp(select(v, (t >> 1u) + (t & 1), s > 0u), -127, 127);
  return select(q, max(q, 0), relu);
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  let s = shift_of(state[params.slot]);
  if (i == 0u) {
    state[params.slot + 1u] = s;
    state[params.slot + 2u] = state[params.tin] + s;
  }
  if (i >= params.n) {
    return;
  }
  let co = params.co;
  let h = params.h;
  let w = params.w;
  let wx = (w + 1u) / 2u;
  let wy = (h + 1u) / 2u;
  let c = i % co;
  let win = i / co;
  let X = win % wx;
  let sy = win / wx;
  let Y = sy % wy;
  let smp = sy / wy;
  let hw = h * w;
  let map = (smp * co + c) * hw;
  let rows = smp * hw;
  let relu = params.apply_relu != 0u;
  let y0 = 2u * Y;
  let x0 = 2u * X;
  if (y0 + 1u < h && x0 + 1u < w) { // a whole window: straight-line loads and stores
    let p0 = y0 * w + x0;
    let i0 = (rows + p0) * co + c;
    let q0 = requant(acc[i0], s, relu);
    let q1 = requant(acc[i0 + co], s, relu);
    let q2 = requant(acc[i0 + w * co], s, relu);
    let q3 = requant(acc[i0 + (w + 1u) * co], s, relu);
    out[map + p0] = q0;
    out[map + p0 + 1u] = q1;
    out[map + p0 + w] = q2;
    out[map + p0 + w + 1u] = q3;
    if (params.pool != 0u) {
      pooled[(smp * co + c) * (h / 2u) * (w / 2u) + Y * (w / 2u) + X] = max(max(q0, q1), max(q2, q3));
    }
    return;
  }
  // a window cut by the map's odd last row or column (no pooled value)
  var best = -128;
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
      let q = requant(acc[(rows + p) * co + c], s, relu);
      out[map + p] = q;
      best = max(best, q);
    }
  }
  let oh = h / 2u;
  let ow = w / 2u;
  if (params.pool != 0u && Y < oh && X < ow) {
    pooled[(smp * co + c) * oh * ow + Y * ow + X] = best;
  }
}
