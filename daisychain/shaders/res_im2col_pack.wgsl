// im2col straight into the packed operands of res_gemm_packed.wgsl (webui/units/gpu_plan.js),
// from one micro-batch's channel-major int8 maps a[(s * ci + c) * h * w + y * w + x]; the
// columns matrix is im2col.wgsl's (row r = s * h * w + y * w + x, column j = c * k * k + dy *
// k + dx, value a[s, c, y + dy - p, x + dx - p] or 0 outside the map), four int8 a u32
// (byte t the value of index 4q + t, zero past the end):
//   dir 0, the forward GEMM's A, rows packed along the columns:
//        out[r * kw + q] = cols[r, 4q .. 4q+3], kw = ceil(ci * k * k / 4);
//        one invocation per row r < rows (n = rows), its columns in order
//   dir 1, the weight gradient GEMM's B, columns packed along the rows:
//        out[j * rw + q] = cols[4q .. 4q+3, j], rw = ceil(rows / 4);
//        one invocation per (q, c), i = c * rw + q (n = rw * ci), its k * k columns
// Copies only, no arithmetic on values.
// Dispatch: 64 invocations per workgroup, i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, ci: u32, k: u32, p: u32,
  h: u32, w: u32, rows: u32, dir: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

/** The value of column (c, dy, dx) in row (s, y0 + p, x0 + p), as a byte. */
fn value(s: u32, c: u32, y: i32, x: i32) -> u32 {
  if (y < 0 || y >= i32(params.h) || x < 0 || x >= i32(params.w)) {
    return 0u;
  }
  return u32(a[((s * params.ci + c) * params.h + u32(y)) * params.w + u32(x)]) & 0xffu;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let k = params.k;
  let hw = params.h * params.w;
  let pad = i32(params.p);
  if (params.dir == 0u) {
    let s = i / hw;
    let pos = i % hw;
    let y0 = i32(pos / params.w) - pad;
    let x0 = i32(pos % params.w) - pad;
    let kw = (params.ci * k * k + 3u) / 4u;
    var at = i * kw;
    var word = 0u;
    var place = 1u; // 256^t for byte t: a product, not a shift by a per-lane amount (which
    // SwiftShader emulates lane by lane)
    for (var c = 0u; c < params.ci; c++) {
      for (var dy = 0u; dy < k; dy++) {
        for (var dx = 0u; dx < k; dx++) {
          word += value(s, c, y0 + i32(dy), x0 + i32(dx)) * place;
          place *= 256u;
          if (place == 0u) {
            out[at] = word;
            at++;
            word = 0u;
            place = 1u;
          }
        }
      }
    }
    if (place != 1u) {
      out[at] = word;
    }
    return;
  }
  let rw = (params.rows + 3u) / 4u;
  let q = i % rw;
  let c = i / rw;
  var ss: vec4<u32>;
  var ys: vec4<i32>;
  var xs: vec4<i32>;
  var live: vec4<bool>;
  for (var t = 0u; t < 4u; t++) {
    let r = 4u * q + t;
    live[t] = r < params.rows;
    let rr = min(r, params.rows - 1u);
    ss[t] = rr / hw;
    let pos = rr % hw;
    ys[t] = i32(pos / params.w) - pad;
    xs[t] = i32(pos % params.w) - pad;
  }
  var j = c * k * k;
  for (var dy = 0u; dy < k; dy++) {
    for (var dx = 0u; dx < k; dx++) {
      var word = 0u;
      var place = 1u;
      for (var t = 0u; t < 4u; t++) {
        if (live[t]) {
          word += value(ss[t], c, ys[t] + i32(dy), xs[t] + i32(dx)) * place;
        }
        place *= 256u;
      }
      out[j * rw + q] = word;
      j++;
    }
  }
}
