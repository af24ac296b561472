// The requantize shift of the resident path (webui/gpu_resident.js), from the max |x| that
// res_absmax.wgsl left in state[slot]: s = max(exponent(max) - 7, 0), exponent = the bit
// length (detmath.js exponent of an integer, 0 for 0). Writes state[slot + 1] = s and
// state[slot + 2] = state[tin] + s (the shifts summed so far: the bias table's row).
// Dispatch: one workgroup of one invocation.

struct Params {
  slot: u32, tin: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;

@compute @workgroup_size(1, 1, 1)
fn main() {
  let e = 32u - countLeadingZeros(state[params.slot]);
  let s = select(0u, e - 7u, e > 7u);
  state[params.slot + 1u] = s;
  state[params.slot + 2u] = state[params.tin] + s;
}
