// Elementwise exp unit (the transformer's softmax; an extra unit): out[i] = exp_table[z[i] + 128]
// (== floor(32768 * e^(min(z, 0) / 16) + 1/2)); softmax.wgsl reads the same table per row.
// Buffers:
//   exp_table: array<i32, 256>
//   z: array<i32, n>, int8 values (x below); out: array<i32, n>
//   status[0]: bit 0 set if an x[i] lies outside [-128, 127] (host throws)
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> exp_table: array<i32>;
@group(0) @binding(2) var<storage, read> x: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  var v = x[i];
  if (v < -128 || v > 127) {
    atomicOr(&status[0], 1u);
    v = clamp(v, -128, 127);
  }
  out[i] = exp_table[v + 128];
}
