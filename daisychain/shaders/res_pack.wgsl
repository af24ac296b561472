// A GEMM operand packed for res_gemm_packed.wgsl (webui/units/gpu_plan.js): four int8 values
// of K per u32 (k = 4j .. 4j+3 in bytes 0..3, zero past K), one row of `rows` per operand row
// (A's rows m, B's columns n): out[r * kw + j] = pack of x[off + r * sr + kk * sk], kk = 4j + t,
// kw = ceil(k / 4). Copies only: the bytes of the values, no arithmetic.
// Dispatch: 64 invocations per workgroup, word i = (wid.y * num_workgroups.x + wid.x) * 64 +
// lid.x < rows * kw.

struct Params {
  rows: u32, k: u32, kw: u32, off: u32,
  sr: u32, sk: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.rows * params.kw) {
    return;
  }
  let r = i / params.kw;
  let k0 = (i % params.kw) * 4u;
  let base = params.off + r * params.sr;
  var word = 0u;
  var place = 1u; // 256^t: a product, not a per-lane shift (SwiftShader emulates those lane by lane)
  for (var t = 0u; t < 4u; t++) {
    let kk = k0 + t;
    if (kk < params.k) {
      word += (u32(x[base + kk * params.sk]) & 0xffu) * place;
    }
    place *= 256u;
  }
  out[i] = word;
}
