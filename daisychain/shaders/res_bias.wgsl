// The bias of a linear or conv layer on the resident path (webui/gpu_resident.js), added to
// its GEMM accumulator in place: acc[i] += bias[t * n_out + i % n_out], t = state[slot] the
// shifts summed below this layer, i.e. the row of the bias table the host computed for every
// exponent the accumulator can have (layers.js biasAcc: |bias| <= 2^30, and the layer's
// in-features bound keeps the sum in int32). t beyond the table is clamped to its last row
// (the host checks the shifts it reads back).
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, n_out: u32, slot: u32, rows: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> bias: array<i32>;
@group(0) @binding(2) var<storage, read_write> acc: array<i32>;
@group(0) @binding(3) var<storage, read> state: array<u32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let t = min(state[params.slot], params.rows - 1u);
  acc[i] = acc[i] + bias[t * params.n_out + i % params.n_out];
}
