// The requantize shift, shared by res_requantize.wgsl, res_requantize_map.wgsl and
// res_pool_back.wgsl (gpu_resident.js compiles it in front of each: WGSL has no includes).

// v >> t for t < 32 by constant shifts (t's bits): the same bits as v >> t; a CPU emulation
// (SwiftShader) runs a shift by a per-lane amount lane by lane, a constant one as one vector op.
fn shr_bits(v: i32, t: u32) -> i32 {
  var x = v;
  x = select(x, x >> 16u, (t & 16u) != 0u);
  x = select(x, x >> 8u, (t & 8u) != 0u);
  x = select(x, x >> 4u, (t & 4u) != 0u);
  x = select(x, x >> 2u, (t & 2u) != 0u);
  x = select(x, x >> 1u, (t & 1u) != 0u);
  return x;
}

fn shift_of(m: u32) -> u32 {
  let e = 32u - countLeadingZeros(m);
  return select(0u, e - 7u, e > 7u);
}
