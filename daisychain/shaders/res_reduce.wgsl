// The partials of a split sum on the resident path (webui/units/gpu_plan.js): a GEMM split
// over K (res_gemm.wgsl, res_gemm_direct.wgsl) or a bias gradient split over rows
// (res_colsum.wgsl) left `parts` partial results, `stride` apart in `part`;
// out[off + i] = sum over z < parts of part[z * stride + i], for i < n. Wrapping i32 adds are
// associative, and the whole sum is the unsplit one's (it fits in int32): the same bits.
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, parts: u32, stride: u32, off: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> part: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  var s = 0;
  for (var z = 0u; z < params.parts; z++) {
    s += part[z * params.stride + i];
  }
  out[params.off + i] = s;
}
