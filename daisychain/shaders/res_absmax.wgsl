// The resident path's max |x| (webui/gpu_resident.js): state[slot] = max(state[slot], |x[i]|)
// over i < n, as u32 (|-2^31| = 2^31 fits). With mask != 0 it first zeroes every x[i] whose
// m[i] is not > 0 (the ReLU mask of the backward pass, engine/model.js backwardFrom), in place.
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  n: u32, slot: u32, mask: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<i32>;
@group(0) @binding(2) var<storage, read> m: array<i32>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;

var<workgroup> best: atomic<u32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  if (lid.x == 0u) {
    atomicStore(&best, 0u);
  }
  workgroupBarrier();
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i < params.n) {
    var v = x[i];
    if (params.mask != 0u && !(m[i] > 0)) {
      v = 0;
      x[i] = 0;
    }
    atomicMax(&best, select(u32(v), 0u - u32(v), v < 0));
  }
  workgroupBarrier();
  if (lid.x == 0u) {
    atomicMax(&state[params.slot], atomicLoad(&best));
  }
}
