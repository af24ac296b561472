;; The tab's CPU kernels in WebAssembly SIMD, the twins of the JS units (units.js, gemm.js,
;; conv.js) byte for byte. Assembled by scripts/build_wasm.mjs (npm wabt) into units.wasm;
;; wasm_units.js loads it, checks it and calls it. Exact integer instructions only: the
;; products come from i32x4.dot_i16x8_s on int8 values widened to int16 (each lane pair
;; a0*b0 + a1*b1, |.| <= 2 * 128 * 128, exact in i32); no relaxed SIMD, no floats.
;;
;; Every pointer is a byte address in the exported memory; every count is in elements.
;; A kernel that can meet a value outside its domain returns 1 (and the caller throws), 0
;; when every value was in range.
(module
  (memory (export "memory") 1)

  ;; pack(src, dst, rows, cols, sr, sc, rowsP, colsP) -> bad
  ;; src: int32 values, element (r, c) at src + 4 * (r * sr + c * sc);
  ;; dst: (rowsP, colsP) int8, row-major, zero outside rows x cols. bad = 1 when a value
  ;; lies outside [-128, 127]. Contiguous rows (sc == 1) go 16 values at a time.
  (func (export "pack") (param $src i32) (param $dst i32) (param $rows i32) (param $cols i32)
    (param $sr i32) (param $sc i32) (param $rowsP i32) (param $colsP i32) (result i32)
    (local $r i32) (local $c i32) (local $v i32) (local $bad i32) (local $p i32) (local $o i32)
    (local $sr4 i32) (local $sc4 i32) (local $c16 i32)
    (local $vmin v128) (local $vmax v128) (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128)
    (local.set $sr4 (i32.shl (local.get $sr) (i32.const 2)))
    (local.set $sc4 (i32.shl (local.get $sc) (i32.const 2)))
    ;; contiguous rows (sc == 1): 16 values a step, narrowed with saturation; the range is
    ;; judged on the values themselves (running min and max), not on the narrowed bytes
    (local.set $c16 (select (i32.and (local.get $cols) (i32.const -16)) (i32.const 0)
      (i32.eq (local.get $sc) (i32.const 1))))
    ;; zero the whole destination first (padding rows and columns)
    (memory.fill (local.get $dst) (i32.const 0) (i32.mul (local.get $rowsP) (local.get $colsP)))
    (block $rdone
      (loop $rl
        (br_if $rdone (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $p (i32.add (local.get $src) (i32.mul (local.get $r) (local.get $sr4))))
        (local.set $o (i32.add (local.get $dst) (i32.mul (local.get $r) (local.get $colsP))))
        (local.set $c (i32.const 0))
        (block $vdone
          (loop $vl
            (br_if $vdone (i32.ge_u (local.get $c) (local.get $c16)))
            (local.set $x0 (v128.load offset=0 (local.get $p)))
            (local.set $x1 (v128.load offset=16 (local.get $p)))
            (local.set $x2 (v128.load offset=32 (local.get $p)))
            (local.set $x3 (v128.load offset=48 (local.get $p)))
            (local.set $vmin (i32x4.min_s (local.get $vmin) (i32x4.min_s
              (i32x4.min_s (local.get $x0) (local.get $x1)) (i32x4.min_s (local.get $x2) (local.get $x3)))))
            (local.set $vmax (i32x4.max_s (local.get $vmax) (i32x4.max_s
              (i32x4.max_s (local.get $x0) (local.get $x1)) (i32x4.max_s (local.get $x2) (local.get $x3)))))
            (v128.store (i32.add (local.get $o) (local.get $c))
              (i8x16.narrow_i16x8_s (i16x8.narrow_i32x4_s (local.get $x0) (local.get $x1))
                (i16x8.narrow_i32x4_s (local.get $x2) (local.get $x3))))
            (local.set $p (i32.add (local.get $p) (i32.const 64)))
            (local.set $c (i32.add (local.get $c) (i32.const 16)))
            (br $vl)))
        (block $cdone
          (loop $cl
            (br_if $cdone (i32.ge_u (local.get $c) (local.get $cols)))
            (local.set $v (i32.load (local.get $p)))
            (local.set $bad (i32.or (local.get $bad)
              (i32.gt_u (i32.add (local.get $v) (i32.const 128)) (i32.const 255))))
            (i32.store8 (i32.add (local.get $o) (local.get $c)) (local.get $v))
            (local.set $p (i32.add (local.get $p) (local.get $sc4)))
            (local.set $c (i32.add (local.get $c) (i32.const 1)))
            (br $cl)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $rl)))
    (i32.or (local.get $bad) (v128.any_true (v128.or
      (i32x4.lt_s (local.get $vmin) (i32x4.splat (i32.const -128)))
      (i32x4.gt_s (local.get $vmax) (i32x4.splat (i32.const 127)))))))

  (func $hsum (param $v v128) (result i32)
    (i32.add
      (i32.add (i32x4.extract_lane 0 (local.get $v)) (i32x4.extract_lane 1 (local.get $v)))
      (i32.add (i32x4.extract_lane 2 (local.get $v)) (i32x4.extract_lane 3 (local.get $v)))))

  ;; gemm(a, b, c, mp, np, kp): C (mp, np) int32 = A (mp, kp) int8 · B (np, kp) int8 ᵀ,
  ;; C[i, j] = sum_k A[i, k] * B[j, k]. mp % 2 == 0, np % 4 == 0, kp % 8 == 0 (pack pads
  ;; with zeros). 2 x 4 outputs per block, their eight vector sums kept in locals across K,
  ;; 16 values of K per step (one 8-value step first when kp % 16 == 8); each block's sums
  ;; reduced by shuffles once, at its end, into two vector stores. The caller keeps
  ;; kp <= gemm.js MAX_K (rounded up to 8 with zeros), so no sum leaves int32.
  (func (export "gemm") (param $a i32) (param $b i32) (param $c i32)
    (param $mp i32) (param $np i32) (param $kp i32)
    (local $i i32) (local $j i32) (local $k i32) (local $k0 i32)
    (local $pa0 i32) (local $pa1 i32) (local $pb0 i32) (local $pb1 i32) (local $pb2 i32) (local $pb3 i32)
    (local $x0 v128) (local $x1 v128) (local $y0 v128) (local $y1 v128) (local $y2 v128) (local $y3 v128)
    (local $s00 v128) (local $s01 v128) (local $s02 v128) (local $s03 v128)
    (local $s10 v128) (local $s11 v128) (local $s12 v128) (local $s13 v128)
    (local $pc i32) (local $np4 i32) (local $kp4 i32)
    (local.set $np4 (i32.shl (local.get $np) (i32.const 2)))
    (local.set $kp4 (i32.shl (local.get $kp) (i32.const 2)))
    (local.set $k0 (i32.and (local.get $kp) (i32.const 8)))
    (local.set $pc (local.get $c))
    (block $idone
      (loop $il
        (br_if $idone (i32.ge_u (local.get $i) (local.get $mp)))
        (local.set $pa0 (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $kp))))
        (local.set $pa1 (i32.add (local.get $pa0) (local.get $kp)))
        (local.set $pb0 (local.get $b))
        (local.set $j (i32.const 0))
        (block $jdone
          (loop $jl
            (br_if $jdone (i32.ge_u (local.get $j) (local.get $np)))
            (local.set $pb1 (i32.add (local.get $pb0) (local.get $kp)))
            (local.set $pb2 (i32.add (local.get $pb1) (local.get $kp)))
            (local.set $pb3 (i32.add (local.get $pb2) (local.get $kp)))
            (local.set $s00 (v128.const i32x4 0 0 0 0)) (local.set $s01 (v128.const i32x4 0 0 0 0))
            (local.set $s02 (v128.const i32x4 0 0 0 0)) (local.set $s03 (v128.const i32x4 0 0 0 0))
            (local.set $s10 (v128.const i32x4 0 0 0 0)) (local.set $s11 (v128.const i32x4 0 0 0 0))
            (local.set $s12 (v128.const i32x4 0 0 0 0)) (local.set $s13 (v128.const i32x4 0 0 0 0))
            (local.set $k (i32.const 0))
            (if (local.get $k0)
              (then
                (local.set $x0 (v128.load8x8_s offset=0 (i32.add (local.get $pa0) (local.get $k))))
                (local.set $x1 (v128.load8x8_s offset=0 (i32.add (local.get $pa1) (local.get $k))))
                (local.set $y0 (v128.load8x8_s offset=0 (i32.add (local.get $pb0) (local.get $k))))
                (local.set $y1 (v128.load8x8_s offset=0 (i32.add (local.get $pb1) (local.get $k))))
                (local.set $y2 (v128.load8x8_s offset=0 (i32.add (local.get $pb2) (local.get $k))))
                (local.set $y3 (v128.load8x8_s offset=0 (i32.add (local.get $pb3) (local.get $k))))
                (local.set $s00 (i32x4.add (local.get $s00) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y0))))
                (local.set $s01 (i32x4.add (local.get $s01) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y1))))
                (local.set $s02 (i32x4.add (local.get $s02) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y2))))
                (local.set $s03 (i32x4.add (local.get $s03) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y3))))
                (local.set $s10 (i32x4.add (local.get $s10) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y0))))
                (local.set $s11 (i32x4.add (local.get $s11) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y1))))
                (local.set $s12 (i32x4.add (local.get $s12) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y2))))
                (local.set $s13 (i32x4.add (local.get $s13) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y3))))
                (local.set $k (i32.const 8))))
            (block $kdone
              (loop $kl
                (br_if $kdone (i32.ge_u (local.get $k) (local.get $kp)))
                (local.set $x0 (v128.load8x8_s offset=0 (i32.add (local.get $pa0) (local.get $k))))
                (local.set $x1 (v128.load8x8_s offset=0 (i32.add (local.get $pa1) (local.get $k))))
                (local.set $y0 (v128.load8x8_s offset=0 (i32.add (local.get $pb0) (local.get $k))))
                (local.set $y1 (v128.load8x8_s offset=0 (i32.add (local.get $pb1) (local.get $k))))
                (local.set $y2 (v128.load8x8_s offset=0 (i32.add (local.get $pb2) (local.get $k))))
                (local.set $y3 (v128.load8x8_s offset=0 (i32.add (local.get $pb3) (local.get $k))))
                (local.set $s00 (i32x4.add (local.get $s00) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y0))))
                (local.set $s01 (i32x4.add (local.get $s01) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y1))))
                (local.set $s02 (i32x4.add (local.get $s02) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y2))))
                (local.set $s03 (i32x4.add (local.get $s03) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y3))))
                (local.set $s10 (i32x4.add (local.get $s10) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y0))))
                (local.set $s11 (i32x4.add (local.get $s11) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y1))))
                (local.set $s12 (i32x4.add (local.get $s12) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y2))))
                (local.set $s13 (i32x4.add (local.get $s13) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y3))))
                (local.set $x0 (v128.load8x8_s offset=8 (i32.add (local.get $pa0) (local.get $k))))
                (local.set $x1 (v128.load8x8_s offset=8 (i32.add (local.get $pa1) (local.get $k))))
                (local.set $y0 (v128.load8x8_s offset=8 (i32.add (local.get $pb0) (local.get $k))))
                (local.set $y1 (v128.load8x8_s offset=8 (i32.add (local.get $pb1) (local.get $k))))
                (local.set $y2 (v128.load8x8_s offset=8 (i32.add (local.get $pb2) (local.get $k))))
                (local.set $y3 (v128.load8x8_s offset=8 (i32.add (local.get $pb3) (local.get $k))))
                (local.set $s00 (i32x4.add (local.get $s00) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y0))))
                (local.set $s01 (i32x4.add (local.get $s01) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y1))))
                (local.set $s02 (i32x4.add (local.get $s02) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y2))))
                (local.set $s03 (i32x4.add (local.get $s03) (i32x4.dot_i16x8_s (local.get $x0) (local.get $y3))))
                (local.set $s10 (i32x4.add (local.get $s10) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y0))))
                (local.set $s11 (i32x4.add (local.get $s11) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y1))))
                (local.set $s12 (i32x4.add (local.get $s12) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y2))))
                (local.set $s13 (i32x4.add (local.get $s13) (i32x4.dot_i16x8_s (local.get $x1) (local.get $y3))))
                (local.set $k (i32.add (local.get $k) (i32.const 16)))
                (br $kl)))
            ;; the four sums of ($s00, $s01, $s02, $s03) in one vector: two rounds of pairwise adds
            ;; (wrapping i32 adds are associative: any order gives the exact sum that fits int32)
            (local.set $x0 (i32x4.add
              (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s00) (local.get $s01))
              (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s00) (local.get $s01))))
            (local.set $y0 (i32x4.add
              (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s02) (local.get $s03))
              (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s02) (local.get $s03))))
            (v128.store (local.get $pc) (i32x4.add
              (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $x0) (local.get $y0))
              (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $x0) (local.get $y0))))
            ;; the four sums of ($s10, $s11, $s12, $s13) in one vector: two rounds of pairwise adds
            ;; (wrapping i32 adds are associative: any order gives the exact sum that fits int32)
            (local.set $x0 (i32x4.add
              (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s10) (local.get $s11))
              (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s10) (local.get $s11))))
            (local.set $y0 (i32x4.add
              (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s12) (local.get $s13))
              (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s12) (local.get $s13))))
            (v128.store (i32.add (local.get $pc) (local.get $np4)) (i32x4.add
              (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $x0) (local.get $y0))
              (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $x0) (local.get $y0))))
            (local.set $pc (i32.add (local.get $pc) (i32.const 16)))
            (local.set $pb0 (i32.add (local.get $pb0) (local.get $kp4)))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $jl)))
        (local.set $pc (i32.add (local.get $pc) (local.get $np4))) ;; past the block's second row
        (local.set $i (i32.add (local.get $i) (i32.const 2)))
        (br $il))))

  ;; requantize(src, dst, n, shift, relu): dst[i] = clamp(floor(src[i] / 2^shift + 1/2),
  ;; lo, 127), lo = 0 with relu (relu(requantize(.)), the ReLU unit is max(x, 0)) else -127.
  ;; floor(v / 2^s + 1/2) = (v >> s) + bit s-1 of v, for 1 <= s <= 31; v itself for s = 0.
  (func (export "requantize") (param $src i32) (param $dst i32) (param $n i32) (param $s i32) (param $relu i32)
    (local $i i32) (local $n4 i32) (local $v v128) (local $lo v128) (local $hi v128) (local $one v128)
    (local $x i32) (local $s1 i32) (local $lo1 i32)
    (local.set $lo1 (select (i32.const 0) (i32.const -127) (local.get $relu)))
    (local.set $lo (i32x4.splat (local.get $lo1)))
    (local.set $hi (i32x4.splat (i32.const 127)))
    (local.set $one (i32x4.splat (i32.const 1)))
    (local.set $s1 (i32.sub (local.get $s) (i32.const 1)))
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n4)))
        (local.set $v (v128.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 2)))))
        (if (local.get $s)
          (then
            (local.set $v (i32x4.add (i32x4.shr_s (local.get $v) (local.get $s))
              (v128.and (i32x4.shr_s (local.get $v) (local.get $s1)) (local.get $one))))))
        (v128.store (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2)))
          (i32x4.max_s (i32x4.min_s (local.get $v) (local.get $hi)) (local.get $lo)))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $l)))
    (block $tdone
      (loop $t
        (br_if $tdone (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 2)))))
        (if (local.get $s)
          (then
            (local.set $x (i32.add (i32.shr_s (local.get $x) (local.get $s))
              (i32.and (i32.shr_s (local.get $x) (local.get $s1)) (i32.const 1))))))
        (if (i32.gt_s (local.get $x) (i32.const 127)) (then (local.set $x (i32.const 127))))
        (if (i32.lt_s (local.get $x) (local.get $lo1)) (then (local.set $x (local.get $lo1))))
        (i32.store (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2))) (local.get $x))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $t))))

  ;; absmax(src, n) -> max |src[i]| as an unsigned 32-bit value (|-2^31| = 2^31).
  (func (export "absmax") (param $src i32) (param $n i32) (result i32)
    (local $i i32) (local $n4 i32) (local $m v128) (local $r i32) (local $x i32)
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n4)))
        (local.set $m (i32x4.max_u (local.get $m)
          (i32x4.abs (v128.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 2)))))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $l)))
    (local.set $m (i32x4.max_u (local.get $m) (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $m) (local.get $m))))
    (local.set $m (i32x4.max_u (local.get $m) (i8x16.shuffle 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 (local.get $m) (local.get $m))))
    (local.set $r (i32x4.extract_lane 0 (local.get $m)))
    (block $tdone
      (loop $t
        (br_if $tdone (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 2)))))
        (local.set $x (select (i32.sub (i32.const 0) (local.get $x)) (local.get $x) (i32.lt_s (local.get $x) (i32.const 0))))
        (if (i32.gt_u (local.get $x) (local.get $r)) (then (local.set $r (local.get $x))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $t)))
    (local.get $r))

  ;; im2col(src, dst, b, ci, h, w, k) -> bad: src (b, ci*h*w) int32 holding int8 values,
  ;; dst (b*h*w, ci*k*k) int32 as conv.js im2colArray (zero outside the map, p = (k-1)/2).
  (func (export "im2col") (param $src i32) (param $dst i32) (param $b i32) (param $ci i32)
    (param $h i32) (param $w i32) (param $k i32) (result i32)
    (local $s i32) (local $y i32) (local $x i32) (local $c i32) (local $dy i32) (local $dx i32)
    (local $yy i32) (local $xx i32) (local $p i32) (local $o i32) (local $base i32) (local $v i32)
    (local $bad i32) (local $hw i32)
    (local.set $p (i32.shr_u (i32.sub (local.get $k) (i32.const 1)) (i32.const 1)))
    (local.set $hw (i32.mul (local.get $h) (local.get $w)))
    (local.set $o (local.get $dst))
    (local.set $s (i32.const 0))
    (loop $ls
      (local.set $y (i32.const 0))
      (loop $ly
        (local.set $x (i32.const 0))
        (loop $lx
          (local.set $c (i32.const 0))
          (loop $lc
            (local.set $base (i32.add (local.get $src) (i32.shl
              (i32.mul (i32.add (i32.mul (local.get $s) (local.get $ci)) (local.get $c)) (local.get $hw))
              (i32.const 2))))
            (local.set $dy (i32.const 0))
            (loop $ldy
              (local.set $yy (i32.sub (i32.add (local.get $y) (local.get $dy)) (local.get $p)))
              (local.set $dx (i32.const 0))
              (loop $ldx
                (local.set $xx (i32.sub (i32.add (local.get $x) (local.get $dx)) (local.get $p)))
                (local.set $v (i32.const 0))
                (if (i32.and (i32.lt_u (local.get $yy) (local.get $h)) (i32.lt_u (local.get $xx) (local.get $w)))
                  (then
                    (local.set $v (i32.load (i32.add (local.get $base)
                      (i32.shl (i32.add (i32.mul (local.get $yy) (local.get $w)) (local.get $xx)) (i32.const 2)))))
                    (local.set $bad (i32.or (local.get $bad)
                      (i32.gt_u (i32.add (local.get $v) (i32.const 128)) (i32.const 255))))))
                (i32.store (local.get $o) (local.get $v))
                (local.set $o (i32.add (local.get $o) (i32.const 4)))
                (local.set $dx (i32.add (local.get $dx) (i32.const 1)))
                (br_if $ldx (i32.lt_u (local.get $dx) (local.get $k))))
              (local.set $dy (i32.add (local.get $dy) (i32.const 1)))
              (br_if $ldy (i32.lt_u (local.get $dy) (local.get $k))))
            (local.set $c (i32.add (local.get $c) (i32.const 1)))
            (br_if $lc (i32.lt_u (local.get $c) (local.get $ci))))
          (local.set $x (i32.add (local.get $x) (i32.const 1)))
          (br_if $lx (i32.lt_u (local.get $x) (local.get $w))))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br_if $ly (i32.lt_u (local.get $y) (local.get $h))))
      (local.set $s (i32.add (local.get $s) (i32.const 1)))
      (br_if $ls (i32.lt_u (local.get $s) (local.get $b))))
    (local.get $bad))

  ;; col2im(src, dst, b, ci, h, w, k) -> bad: the adjoint of im2col, src (b*h*w, ci*k*k)
  ;; int32, dst (b, ci*h*w) int32; sums taken in i64, bad = 1 when one leaves int32.
  (func (export "col2im") (param $src i32) (param $dst i32) (param $b i32) (param $ci i32)
    (param $h i32) (param $w i32) (param $k i32) (result i32)
    (local $s i32) (local $c i32) (local $yy i32) (local $xx i32) (local $dy i32) (local $dx i32)
    (local $y i32) (local $x i32) (local $p i32) (local $o i32) (local $hw i32) (local $cols i32)
    (local $kk i32) (local $sum i64) (local $bad i32)
    (local.set $p (i32.shr_u (i32.sub (local.get $k) (i32.const 1)) (i32.const 1)))
    (local.set $hw (i32.mul (local.get $h) (local.get $w)))
    (local.set $kk (i32.mul (local.get $k) (local.get $k)))
    (local.set $cols (i32.mul (local.get $ci) (local.get $kk)))
    (local.set $o (local.get $dst))
    (local.set $s (i32.const 0))
    (loop $ls
      (local.set $c (i32.const 0))
      (loop $lc
        (local.set $yy (i32.const 0))
        (loop $lyy
          (local.set $xx (i32.const 0))
          (loop $lxx
            (local.set $sum (i64.const 0))
            (local.set $dy (i32.const 0))
            (loop $ldy
              (local.set $y (i32.add (i32.sub (local.get $yy) (local.get $dy)) (local.get $p)))
              (if (i32.lt_u (local.get $y) (local.get $h))
                (then
                  (local.set $dx (i32.const 0))
                  (loop $ldx
                    (local.set $x (i32.add (i32.sub (local.get $xx) (local.get $dx)) (local.get $p)))
                    (if (i32.lt_u (local.get $x) (local.get $w))
                      (then
                        (local.set $sum (i64.add (local.get $sum) (i64.extend_i32_s (i32.load
                          (i32.add (local.get $src) (i32.shl
                            (i32.add
                              (i32.mul
                                (i32.add (i32.mul (local.get $s) (local.get $hw))
                                  (i32.add (i32.mul (local.get $y) (local.get $w)) (local.get $x)))
                                (local.get $cols))
                              (i32.add (i32.mul (local.get $c) (local.get $kk))
                                (i32.add (i32.mul (local.get $dy) (local.get $k)) (local.get $dx))))
                            (i32.const 2)))))))))
                    (local.set $dx (i32.add (local.get $dx) (i32.const 1)))
                    (br_if $ldx (i32.lt_u (local.get $dx) (local.get $k))))))
              (local.set $dy (i32.add (local.get $dy) (i32.const 1)))
              (br_if $ldy (i32.lt_u (local.get $dy) (local.get $k))))
            (local.set $bad (i32.or (local.get $bad)
              (i64.ne (local.get $sum) (i64.extend_i32_s (i32.wrap_i64 (local.get $sum))))))
            (i32.store (local.get $o) (i32.wrap_i64 (local.get $sum)))
            (local.set $o (i32.add (local.get $o) (i32.const 4)))
            (local.set $xx (i32.add (local.get $xx) (i32.const 1)))
            (br_if $lxx (i32.lt_u (local.get $xx) (local.get $w))))
          (local.set $yy (i32.add (local.get $yy) (i32.const 1)))
          (br_if $lyy (i32.lt_u (local.get $yy) (local.get $h))))
        (local.set $c (i32.add (local.get $c) (i32.const 1)))
        (br_if $lc (i32.lt_u (local.get $c) (local.get $ci))))
      (local.set $s (i32.add (local.get $s) (i32.const 1)))
      (br_if $ls (i32.lt_u (local.get $s) (local.get $b))))
    (local.get $bad))

  ;; maxpool(src, dst, bc, h, w) -> bad: 2x2 max pool of bc maps h x w (int8 values in
  ;; int32) into bc maps (h>>1) x (w>>1); bad = 1 for a value outside [-128, 127]. 4
  ;; windows a step (i32x4.max_s of their four positions), the ow % 4 left one at a time.
  ;; maxpool_back(g, a, dst, bc, h, w) -> bad: dst (bc, h*w) zero but for g of each window
  ;; at the window's first maximum in the order (0,0), (0,1), (1,0), (1,1).
  ;; Branch-free: each maximum is a `select`, each range check an or-ed unsigned compare.
  (func (export "maxpool") (param $src i32) (param $dst i32) (param $bc i32) (param $h i32) (param $w i32) (result i32)
    (local $sc i32) (local $Y i32) (local $X i32) (local $oh i32) (local $ow i32) (local $ow4 i32) (local $i i32)
    (local $m i32) (local $v0 i32) (local $v1 i32) (local $v2 i32) (local $v3 i32) (local $o i32)
    (local $bad i32) (local $w4 i32)
    (local $y0 v128) (local $y1 v128) (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128) (local $acc v128) (local $c128 v128)
    (local.set $c128 (i32x4.splat (i32.const 128)))
    (local.set $oh (i32.shr_u (local.get $h) (i32.const 1)))
    (local.set $ow (i32.shr_u (local.get $w) (i32.const 1)))
    (local.set $ow4 (i32.and (local.get $ow) (i32.const -4)))
    (local.set $w4 (i32.shl (local.get $w) (i32.const 2)))
    (local.set $o (local.get $dst))
    (block $scdone
      (loop $lsc
        (br_if $scdone (i32.ge_u (local.get $sc) (local.get $bc)))
        (local.set $Y (i32.const 0))
        (block $Ydone
          (loop $lY
            (br_if $Ydone (i32.ge_u (local.get $Y) (local.get $oh)))
            (local.set $i (i32.add (local.get $src) (i32.shl
              (i32.add (i32.mul (local.get $sc) (i32.mul (local.get $h) (local.get $w)))
                (i32.mul (i32.shl (local.get $Y) (i32.const 1)) (local.get $w))) (i32.const 2))))
            (local.set $X (i32.const 0))
            (block $vdone
              (loop $lv ;; 4 windows a step: their four positions split by shuffles
                (br_if $vdone (i32.ge_u (local.get $X) (local.get $ow4)))
                (local.set $y0 (v128.load offset=0 (local.get $i)))
                (local.set $y1 (v128.load offset=16 (local.get $i)))
                (local.set $x0 (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $y0) (local.get $y1)))
                (local.set $x1 (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $y0) (local.get $y1)))
                (local.set $y0 (v128.load offset=0 (i32.add (local.get $i) (local.get $w4))))
                (local.set $y1 (v128.load offset=16 (i32.add (local.get $i) (local.get $w4))))
                (local.set $x2 (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $y0) (local.get $y1)))
                (local.set $x3 (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $y0) (local.get $y1)))
                (local.set $acc (v128.or (local.get $acc) (v128.or
                  (v128.or (i32x4.add (local.get $x0) (local.get $c128)) (i32x4.add (local.get $x1) (local.get $c128)))
                  (v128.or (i32x4.add (local.get $x2) (local.get $c128)) (i32x4.add (local.get $x3) (local.get $c128))))))
                (v128.store (local.get $o) (i32x4.max_s (i32x4.max_s (local.get $x0) (local.get $x1))
                  (i32x4.max_s (local.get $x2) (local.get $x3))))
                (local.set $o (i32.add (local.get $o) (i32.const 16)))
                (local.set $i (i32.add (local.get $i) (i32.const 32)))
                (local.set $X (i32.add (local.get $X) (i32.const 4)))
                (br $lv)))
            (block $Xdone
              (loop $lX
                (br_if $Xdone (i32.ge_u (local.get $X) (local.get $ow)))
                (local.set $v0 (i32.load (local.get $i)))
                (local.set $v1 (i32.load offset=4 (local.get $i)))
                (local.set $v2 (i32.load (i32.add (local.get $i) (local.get $w4))))
                (local.set $v3 (i32.load offset=4 (i32.add (local.get $i) (local.get $w4))))
                (local.set $bad (i32.or (local.get $bad) (i32.or
                  (i32.or (i32.gt_u (i32.add (local.get $v0) (i32.const 128)) (i32.const 255))
                          (i32.gt_u (i32.add (local.get $v1) (i32.const 128)) (i32.const 255)))
                  (i32.or (i32.gt_u (i32.add (local.get $v2) (i32.const 128)) (i32.const 255))
                          (i32.gt_u (i32.add (local.get $v3) (i32.const 128)) (i32.const 255))))))
                (local.set $m (select (local.get $v1) (local.get $v0) (i32.gt_s (local.get $v1) (local.get $v0))))
                (local.set $m (select (local.get $v2) (local.get $m) (i32.gt_s (local.get $v2) (local.get $m))))
                (local.set $m (select (local.get $v3) (local.get $m) (i32.gt_s (local.get $v3) (local.get $m))))
                (i32.store (local.get $o) (local.get $m))
                (local.set $o (i32.add (local.get $o) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 8)))
                (local.set $X (i32.add (local.get $X) (i32.const 1)))
                (br $lX)))
            (local.set $Y (i32.add (local.get $Y) (i32.const 1)))
            (br $lY)))
        (local.set $sc (i32.add (local.get $sc) (i32.const 1)))
        (br $lsc)))
    (i32.or (local.get $bad) (v128.any_true (v128.and (local.get $acc) (i32x4.splat (i32.const -256))))))

  ;; maxpool_back: 4 windows a step (two rows of 8 values, split into the windows' four
  ;; positions by shuffles), every position of a window written, g or 0, so only a map with
  ;; a dropped odd row or column is zeroed first; the ow % 4 windows left, one at a time.
  (func (export "maxpool_back") (param $g i32) (param $a i32) (param $dst i32) (param $bc i32)
    (param $h i32) (param $w i32) (result i32)
    (local $sc i32) (local $Y i32) (local $X i32) (local $oh i32) (local $ow i32) (local $ow4 i32)
    (local $best i32) (local $bv i32) (local $v0 i32) (local $v1 i32) (local $v2 i32) (local $v3 i32)
    (local $bad i32) (local $w4 i32) (local $gv i32) (local $i i32) (local $o i32) (local $t i32)
    (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128) (local $gg v128) (local $acc v128)
    (local $t1 v128) (local $t2 v128) (local $t3 v128) (local $m v128) (local $y0 v128) (local $y1 v128) (local $c128 v128)
    (local.set $c128 (i32x4.splat (i32.const 128)))
    (local.set $oh (i32.shr_u (local.get $h) (i32.const 1)))
    (local.set $ow (i32.shr_u (local.get $w) (i32.const 1)))
    (local.set $ow4 (i32.and (local.get $ow) (i32.const -4)))
    (local.set $w4 (i32.shl (local.get $w) (i32.const 2)))
    (if (i32.and (i32.or (local.get $h) (local.get $w)) (i32.const 1))
      (then (memory.fill (local.get $dst) (i32.const 0)
        (i32.shl (i32.mul (local.get $bc) (i32.mul (local.get $h) (local.get $w))) (i32.const 2)))))
    (block $scdone
      (loop $lsc
        (br_if $scdone (i32.ge_u (local.get $sc) (local.get $bc)))
        (local.set $Y (i32.const 0))
        (block $Ydone
          (loop $lY
            (br_if $Ydone (i32.ge_u (local.get $Y) (local.get $oh)))
            (local.set $t (i32.shl
              (i32.add (i32.mul (local.get $sc) (i32.mul (local.get $h) (local.get $w)))
                (i32.mul (i32.shl (local.get $Y) (i32.const 1)) (local.get $w))) (i32.const 2)))
            (local.set $i (i32.add (local.get $a) (local.get $t)))
            (local.set $o (i32.add (local.get $dst) (local.get $t)))
            (local.set $X (i32.const 0))
            (block $vdone
              (loop $lv
                (br_if $vdone (i32.ge_u (local.get $X) (local.get $ow4)))
                ;; x0..x3: the four windows' (0,0), (0,1), (1,0), (1,1) values
                (local.set $y0 (v128.load offset=0 (local.get $i)))
                (local.set $y1 (v128.load offset=16 (local.get $i)))
                (local.set $x0 (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $y0) (local.get $y1)))
                (local.set $x1 (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $y0) (local.get $y1)))
                (local.set $y0 (v128.load offset=0 (i32.add (local.get $i) (local.get $w4))))
                (local.set $y1 (v128.load offset=16 (i32.add (local.get $i) (local.get $w4))))
                (local.set $x2 (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $y0) (local.get $y1)))
                (local.set $x3 (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $y0) (local.get $y1)))
                (local.set $gg (v128.load (local.get $g)))
                ;; the range: v + 128 of every value or-ed (in [0, 255] for int8, else a bit above)
                (local.set $acc (v128.or (local.get $acc) (v128.or (v128.or
                  (v128.or (i32x4.add (local.get $x0) (local.get $c128)) (i32x4.add (local.get $x1) (local.get $c128)))
                  (v128.or (i32x4.add (local.get $x2) (local.get $c128)) (i32x4.add (local.get $x3) (local.get $c128))))
                  (i32x4.add (local.get $gg) (local.get $c128)))))
                ;; the first maximum: a later position wins only when greater than the best so far
                (local.set $t1 (i32x4.gt_s (local.get $x1) (local.get $x0)))
                (local.set $m (v128.bitselect (local.get $x1) (local.get $x0) (local.get $t1)))
                (local.set $t2 (i32x4.gt_s (local.get $x2) (local.get $m)))
                (local.set $m (v128.bitselect (local.get $x2) (local.get $m) (local.get $t2)))
                (local.set $t3 (i32x4.gt_s (local.get $x3) (local.get $m)))
                (local.set $t2 (v128.andnot (local.get $t2) (local.get $t3)))          ;; (1,0) wins
                (local.set $t1 (v128.andnot (v128.andnot (local.get $t1) (local.get $t3)) (local.get $t2))) ;; (0,1)
                (local.set $m (v128.or (v128.or (local.get $t1) (local.get $t2)) (local.get $t3))) ;; not (0,0)
                (local.set $x0 (v128.andnot (local.get $gg) (local.get $m)))
                (local.set $x1 (v128.and (local.get $gg) (local.get $t1)))
                (local.set $x2 (v128.and (local.get $gg) (local.get $t2)))
                (local.set $x3 (v128.and (local.get $gg) (local.get $t3)))
                (v128.store offset=0 (local.get $o) (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $x0) (local.get $x1)))
                (v128.store offset=16 (local.get $o) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $x0) (local.get $x1)))
                (v128.store offset=0 (i32.add (local.get $o) (local.get $w4)) (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $x2) (local.get $x3)))
                (v128.store offset=16 (i32.add (local.get $o) (local.get $w4)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $x2) (local.get $x3)))
                (local.set $g (i32.add (local.get $g) (i32.const 16)))
                (local.set $i (i32.add (local.get $i) (i32.const 32)))
                (local.set $o (i32.add (local.get $o) (i32.const 32)))
                (local.set $X (i32.add (local.get $X) (i32.const 4)))
                (br $lv)))
            (block $Xdone
              (loop $lX
                (br_if $Xdone (i32.ge_u (local.get $X) (local.get $ow)))
                (local.set $v0 (i32.load (local.get $i)))
                (local.set $v1 (i32.load offset=4 (local.get $i)))
                (local.set $v2 (i32.load (i32.add (local.get $i) (local.get $w4))))
                (local.set $v3 (i32.load offset=4 (i32.add (local.get $i) (local.get $w4))))
                (local.set $gv (i32.load (local.get $g)))
                (local.set $bad (i32.or (i32.or (local.get $bad)
                  (i32.gt_u (i32.add (local.get $gv) (i32.const 128)) (i32.const 255))) (i32.or
                  (i32.or (i32.gt_u (i32.add (local.get $v0) (i32.const 128)) (i32.const 255))
                          (i32.gt_u (i32.add (local.get $v1) (i32.const 128)) (i32.const 255)))
                  (i32.or (i32.gt_u (i32.add (local.get $v2) (i32.const 128)) (i32.const 255))
                          (i32.gt_u (i32.add (local.get $v3) (i32.const 128)) (i32.const 255))))))
                ;; the first maximum in the order (0,0), (0,1), (1,0), (1,1): a later one wins only when greater
                (local.set $t (i32.gt_s (local.get $v1) (local.get $v0)))
                (local.set $best (select (i32.const 4) (i32.const 0) (local.get $t)))
                (local.set $bv (select (local.get $v1) (local.get $v0) (local.get $t)))
                (local.set $t (i32.gt_s (local.get $v2) (local.get $bv)))
                (local.set $best (select (local.get $w4) (local.get $best) (local.get $t)))
                (local.set $bv (select (local.get $v2) (local.get $bv) (local.get $t)))
                (local.set $best (select (i32.add (local.get $w4) (i32.const 4)) (local.get $best)
                  (i32.gt_s (local.get $v3) (local.get $bv))))
                (i32.store (local.get $o) (i32.const 0))
                (i32.store offset=4 (local.get $o) (i32.const 0))
                (i32.store (i32.add (local.get $o) (local.get $w4)) (i32.const 0))
                (i32.store offset=4 (i32.add (local.get $o) (local.get $w4)) (i32.const 0))
                (i32.store (i32.add (local.get $o) (local.get $best)) (local.get $gv))
                (local.set $g (i32.add (local.get $g) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 8)))
                (local.set $o (i32.add (local.get $o) (i32.const 8)))
                (local.set $X (i32.add (local.get $X) (i32.const 1)))
                (br $lX)))
            (local.set $Y (i32.add (local.get $Y) (i32.const 1)))
            (br $lY)))
        (local.set $sc (i32.add (local.get $sc) (i32.const 1)))
        (br $lsc)))
    (i32.or (local.get $bad) (v128.any_true (v128.and (local.get $acc) (i32x4.splat (i32.const -256))))))
)
