// col2im on the resident path (webui/units/gpu_plan.js), with what follows it in one pass:
// the ReLU mask of the layer below (mask != 0: an error is zeroed where m, that ReLU's output,
// is not > 0) and max |x| into state[slot] (res_absmax.wgsl's, for the requantize that
// follows). The sums are col2im.wgsl's (and webui/units/conv.js col2imArray's): exact i32 sums
// in the same order (the host bounds them below 2^31):
//   d:   the (b*h*w, ci*k*k) input-error accumulators, row r = s * h * w + y * w + x,
//        column j = c * k * k + dy * k + dx
//   out: out[(s * ci + c) * h * w + yy * w + xx] = sum over dy, dx (dy outer, dx inner) of
//        d[(s * h * w + y * w + x) * ci * k * k + c * k * k + dy * k + dx],
//        y = yy - dy + p, x = xx - dx + p, terms with (y, x) outside the map left out
// One invocation per four outputs of a map row (xx = 4 * q .. 4 * q + 3, those < w): the
// divisions and the atomic once per four. i = ((s * ci + c) * h + yy) * wq + q, wq = ceil(w / 4).
// Dispatch: 64 invocations per workgroup, i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, ci: u32, k: u32, p: u32,
  h: u32, w: u32, mask: u32, slot: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> d: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;
@group(0) @binding(3) var<storage, read> m: array<i32>;
@group(0) @binding(4) var<storage, read_write> state: array<atomic<u32>>;

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
  let h = params.h;
  let w = params.w;
  let hw = h * w;
  let wq = (w + 3u) / 4u;
  let q = i % wq;
  let t = i / wq;
  let yy = i32(t % h);
  let sc = t / h;
  let s = sc / params.ci;
  let c = sc % params.ci;
  let p = i32(params.p);
  var best = 0u;
  for (var e = 0u; e < 4u; e++) {
    let xu = 4u * q + e;
    if (xu >= w) {
      break;
    }
    let xx = i32(xu);
    var sum: i32 = 0;
    for (var dy: u32 = 0u; dy < k; dy = dy + 1u) {
      let y = yy - i32(dy) + p;
      let iny = y >= 0 && y < i32(h);
      let yr = s * hw + u32(clamp(y, 0, i32(h) - 1)) * w;
      for (var dx: u32 = 0u; dx < k; dx = dx + 1u) {
        let x = xx - i32(dx) + p;
        // every lane loads (a clamped address), the terms outside the map add 0: no masked load
        let r = yr + u32(clamp(x, 0, i32(w) - 1));
        sum = sum + select(0, d[r * ncol + c * kk + dy * k + dx], iny && x >= 0 && x < i32(w));
      }
    }
    let o = sc * hw + u32(yy) * w + xu;
    if (params.mask != 0u && !(m[o] > 0)) {
      sum = 0;
    }
    out[o] = sum;
    best = max(best, select(u32(sum), 0u - u32(sum), sum < 0));
  }
  if (best > 0u) {
    atomicMax(&state[params.slot], best);
  }
}
