// Backward of the 2 x 2 max pool: each window's int8 error goes to the window's FIRST
// maximum in the order (0,0), (0,1), (1,0), (1,1); every other position (and a dropped odd
// last row / column) gets 0. The bytes of webui/conv.js maxpoolBackArray.
//   g:   array<i32, b * c * oh * ow>, the pool output's errors (oh = h / 2, ow = w / 2)
//   a:   array<i32, b * c * h * w>, the pool's input (int8), a[sc * h * w + y * w + x]
//   out: array<i32, n>, n = b * c * h * w, the pool input's errors, same layout as a
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64
// + lid.x; invocation i writes out[i] (i >= n returns), so no two invocations write one element.

struct Params {
  n: u32, h: u32, w: u32, _pad0: u32,
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
  let w = params.w;
  let hw = params.h * w;
  let oh = params.h / 2u;
  let ow = w / 2u;
  let sc = i / hw;
  let y = (i % hw) / w;
  let x = (i % hw) % w;
  if (y >= 2u * oh || x >= 2u * ow) {
    out[i] = 0;
    return;
  }
  let base = sc * hw + (y - y % 2u) * w + (x - x % 2u);
  var best = base;
  if (a[base + 1u] > a[best]) {
    best = base + 1u;
  }
  if (a[base + w] > a[best]) {
    best = base + w;
  }
  if (a[base + w + 1u] > a[best]) {
    best = base + w + 1u;
  }
  var v: i32 = 0;
  if (best == i) {
    v = g[sc * oh * ow + (y / 2u) * ow + x / 2u];
  }
  out[i] = v;
}
