// im2col on the resident path (webui/units/gpu_plan.js): one micro-batch's channel-major
// int8 maps -> the columns matrix of a k x k conv (stride 1, zero padding p = (k - 1) / 2);
// the bytes of im2col.wgsl (and webui/units/conv.js im2colArray):
//   a:   a[(s * ci + c) * h * w + y * w + x]
//   out: row r = s * h * w + y * w + x, column j = c * k * k + dy * k + dx:
//        out[r * ci * k * k + j] = a[s, c, y + dy - p, x + dx - p], or 0 outside the map
// One invocation per row and channel, writing its k * k columns (the divisions once per k * k
// values, not per value), the rows fastest: i = c * R + r, R = b * h * w, n = R * ci.
// Dispatch: 64 invocations per workgroup, i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, ci: u32, k: u32, p: u32,
  h: u32, w: u32, rows: u32, _pad0: u32,
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
  let k = params.k;
  let h = params.h;
  let w = params.w;
  let hw = h * w;
  let r = i % params.rows;
  let c = i / params.rows;
  let s = r / hw;
  let pos = r % hw;
  let y0 = i32(pos / w) - i32(params.p);
  let x0 = i32(pos % w) - i32(params.p);
  let src = (s * params.ci + c) * hw;
  var at = r * params.ci * k * k + c * k * k;
  let hi = i32(h) - 1;
  let wi = i32(w) - 1;
  for (var dy = 0u; dy < k; dy++) {
    let y = y0 + i32(dy);
    let inside = y >= 0 && y < i32(h);
    let row = src + u32(clamp(y, 0, hi)) * w;
    for (var dx = 0u; dx < k; dx++) {
      let x = x0 + i32(dx);
      // every lane loads (a clamped address), the outside ones keep 0: no masked load
      let v = a[row + u32(clamp(x, 0, wi))];
      out[at] = select(0, v, inside && x >= 0 && x <= wi);
      at++;
    }
  }
}
