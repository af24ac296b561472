// im2col: one micro-batch's channel-major int8 maps -> the columns matrix of a k x k conv
// (stride 1, zero padding p = (k - 1) / 2), for the unit GEMM. Copies only, no arithmetic
// on values; the bytes of webui/conv.js im2colArray.
//   a:   array<i32, b * ci * h * w>, a[(s * ci + c) * h * w + y * w + x], int8 values
//   out: array<i32, n>, n = b * h * w * ci * k * k, row r = s * h * w + y * w + x,
//        column j = c * k * k + dy * k + dx:
//        out[r * ci * k * k + j] = a[s, c, y + dy - p, x + dx - p], or 0 outside the map
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64
// + lid.x; invocation i writes out[i] (i >= n returns).

struct Params {
  n: u32, ci: u32, k: u32, p: u32,
  h: u32, w: u32, _pad0: u32, _pad1: u32,
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
  let kk = params.k * params.k;
  let ncol = params.ci * kk;
  let hw = params.h * params.w;
  let r = i / ncol;
  let j = i % ncol;
  let s = r / hw;
  let pos = r % hw;
  let c = j / kk;
  let rem = j % kk;
  let yy = i32(pos / params.w + rem / params.k) - i32(params.p);
  let xx = i32(pos % params.w + rem % params.k) - i32(params.p);
  var v: i32 = 0;
  if (yy >= 0 && yy < i32(params.h) && xx >= 0 && xx < i32(params.w)) {
    v = a[(s * params.ci + c) * hw + u32(yy) * params.w + u32(xx)];
  }
  out[i] = v;
}
