// The resident path's max |x| (webui/gpu_resident.js): state[slot] = max(state[slot], |x[i]|)
// over i < n, as u32 (|-2^31| = 2^31 fits). With mask != 0 it first zeroes every x[i] whose
// m[i] is not > 0 (the ReLU mask of the backward pass, engine/model.js backwardFrom), in place.
// Each invocation takes 32 elements, i = ((wid.y * num_workgroups.x + wid.x) * 32 + t) * 64 +
// lid.x for t < 32, and does one atomicMax (no workgroup memory, no barrier: cheap on a
// CPU-emulated adapter too). Dispatch: ceil(n / 2048) workgroups of 64 (a second dimension
// beyond 65535).

struct Params {
  n: u32, slot: u32, mask: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<i32>;
@group(0) @binding(2) var<storage, read> m: array<i32>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let base = (wid.y * nwg.x + wid.x) * 2048u + lid.x;
  var best = 0u;
  for (var t = 0u; t < 32u; t++) {
    let i = base + t * 64u;
    if (i < params.n) {
      var v = x[i];
      if (params.mask != 0u && !(m[i] > 0)) {
        v = 0;
        x[i] = 0;
      }
      best = max(best, select(u32(v), 0u - u32(v), v < 0));
    }
  }
  if (best > 0u) {
    atomicMax(&state[params.slot], best);
  }
}
