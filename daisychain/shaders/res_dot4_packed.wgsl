// dot4 for res_gemm.wgsl where the adapter has packed_4x8_integer_dot_product: the built-in
// dot4I8Packed sign-extends each byte and adds the four products with wrapping i32 adds, so
// it is the exact sum of four int8 products (|sum| <= 4 * 2^14).
requires packed_4x8_integer_dot_product;

fn dot4(a: u32, b: u32) -> i32 {
  return dot4I8Packed(a, b);
}
