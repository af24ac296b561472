// dot4 for res_gemm.wgsl without packed_4x8_integer_dot_product: each byte sign-extended by
// shifting it to the top of an i32 and back (arithmetic shift), the four products summed:
// the value dot4I8Packed gives.

fn dot4(a: u32, b: u32) -> i32 {
  let x = vec4<i32>(bitcast<i32>(a << 24u), bitcast<i32>(a << 16u), bitcast<i32>(a << 8u), bitcast<i32>(a)) >> vec4<u32>(24u);
  let y = vec4<i32>(bitcast<i32>(b << 24u), bitcast<i32>(b << 16u), bitcast<i32>(b << 8u), bitcast<i32>(b)) >> vec4<u32>(24u);
  let p = x * y;
  return p.x + p.y + p.z + p.w;
}
