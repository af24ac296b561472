// Requantize (+ optional ReLU) on the resident path (webui/units/gpu_plan.js), with the shift
// computed here from the max |x| that res_absmax.wgsl or res_bias_absmax.wgsl left in
// state[slot]: s = max(exponent(max) - 7, 0), exponent = the bit length (detmath.js exponent
// of an integer, 0 for 0); out[i] = clamp(floor(acc[i] / 2^s + 1/2), -127, 127), in i32 as
// (acc >> s) + bit s-1 of acc (no overflow), then max(., 0) when apply_relu. The bytes of the
// requantize and ReLU tables (gpu_resident.js uses it only after the loaded tables checked
// equal to this arithmetic: wasm_units.js exactTablesFailure). Invocation 0 writes
// state[slot + 1] = s and state[slot + 2] = state[tin] + s (the shifts summed so far: the
// bias table's row of the layers above; the host reads the shifts back); no invocation of
// this dispatch reads those words.
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, slot: u32, apply_relu: u32, tin: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> acc: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;
@group(0) @binding(3) var<storage, read_write> state: array<u32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  let s = shift_of(state[params.slot]);
  if (i == 0u) {
    state[params.slot + 1u] = s;
    state[params.slot + 2u] = state[params.tin] + s;
  }
  if (i >= params.n) {
    return;
  }
  let v = acc[i];
  var q = v;
  if (s > 0u) {
    let t = shr_bits(v, s - 1u);
    q = (t >> 1u) + (t & 1);
  }
  q = clamp(q, -127, 127);
  if (params.apply_relu != 0u) {
    q = max(q, 0);
  }
  out[i] = q;
}
