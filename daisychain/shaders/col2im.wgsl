// col2im: the adjoint of im2col, for the input error of a conv. Exact i32 sums (the host
// bounds out_channels * k * k * 127 * 127 below 2^31); the bytes of webui/conv.js col2imArray.
//   d:   array<i32, b * h * w * ci * k * k>, the (b*h*w, ci*k*k) input-error accumulators
//        dCols = Gc · Wq, row r = s * h * w + y * w + x, column j = c * k * k + dy * k + dx
//   out: array<i32, n>, n = b * ci * h * w, channel-major:
//        out[(s * ci + c) * h * w + yy * w + xx] = sum over dy, dx (dy outer, dx inner) of
//        d[(s * h * w + y * w + x) * ci * k * k + c * k * k + dy * k + dx],
//        y = yy - dy + p, x = xx - dx + p, terms with (y, x) outside the map left out
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64
// + lid.x; invocation i writes out[i] (i >= n returns).

struct Params {
  n: u32, ci: u32, k: u32, p: u32,
  h: u32, w: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> d: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let k = params.k;
  let kk = k * k;
  let ncol = params.ci * kk;
  let hw = params.h * params.w;
  let sc = i / hw;
  let s = sc / params.ci;
  let c = sc % params.ci;
  let yy = i32((i % hw) / params.w);
  let xx = i32((i % hw) % params.w);
  let p = i32(params.p);
  var sum: i32 = 0;
  for (var dy: u32 = 0u; dy < k; dy = dy + 1u) {
    let y = yy - i32(dy) + p;
    if (y < 0 || y >= i32(params.h)) {
      continue;
    }
    for (var dx: u32 = 0u; dx < k; dx = dx + 1u) {
      let x = xx - i32(dx) + p;
      if (x < 0 || x >= i32(params.w)) {
        continue;
      }
      let r = s * hw + u32(y) * params.w + u32(x);
      sum = sum + d[r * ncol + c * kk + dy * k + dx];
    }
  }
  out[i] = sum;
}
