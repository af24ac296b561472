// Requantize (+ optional ReLU) with the shift s the resident path computed on the GPU
// (state[slot + 1], res_shift.wgsl): out[i] = clamp(floor(acc[i] / 2^s + 1/2), -127, 127),
// in i32 as (acc >> s) + bit s-1 of acc (no overflow), then max(., 0) when apply_relu. The
// bytes of the requantize and ReLU tables (webui/gpu_resident.js uses it only after the
// loaded tables checked equal to this arithmetic: wasm_units.js exactTablesFailure).
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, slot: u32, apply_relu: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> acc: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;
@group(0) @binding(3) var<storage, read> state: array<u32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let s = state[params.slot + 1u];
  let v = acc[i];
  var q = v;
  if (s > 0u) {
    q = (v >> s) + ((v >> (s - 1u)) & 1);
  }
  q = clamp(q, -127, 127);
  if (params.apply_relu != 0u) {
    q = max(q, 0);
  }
  out[i] = q;
}
