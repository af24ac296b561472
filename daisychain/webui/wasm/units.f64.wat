;; The float64 kernels of a micro-batch in the module (wasm_plan.js): the weights' quantize and
;; the fixed-point sum of the gradient. A fragment of units.wat's module (scripts/build_wasm.mjs
;; inserts every units.*.wat in name order). Their float64 operations are detmath.js's and
;; layers.js's, one IEEE operation for one, in their order (a float64 multiply, add, floor,
;; min and max are exactly defined in WebAssembly as in JS), so the results are the same bits.

  ;; same(a, b, n) -> 1 when the n bytes at a and at b are equal (n % 8 == 0), else 0: the
  ;; parameters against those last quantized (equal bits quantize alike).
  (func (export "same") (param $a i32) (param $b i32) (param $n i32) (result i32)
    (local $i i32) (local $n16 i32) (local $d v128) (local $t i64)
    (local.set $n16 (i32.and (local.get $n) (i32.const -16)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n16)))
        (local.set $d (v128.or (local.get $d) (v128.xor (v128.load (i32.add (local.get $a) (local.get $i)))
          (v128.load (i32.add (local.get $b) (local.get $i))))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $l)))
    (if (i32.lt_u (local.get $i) (local.get $n))
      (then (local.set $t (i64.xor (i64.load (i32.add (local.get $a) (local.get $i))) (i64.load (i32.add (local.get $b) (local.get $i)))))))
    (i32.and (i32.eqz (v128.any_true (local.get $d))) (i64.eqz (local.get $t))))

  ;; absmax64(src, n) -> max |src[i]| over n float64 values (detmath.js absmax: NaN when one
  ;; is NaN, f64.max propagates it; 0 for n = 0).
  (func (export "absmax64") (param $src i32) (param $n i32) (result f64)
    (local $i i32) (local $n2 i32) (local $m v128) (local $r f64)
    (local.set $n2 (i32.and (local.get $n) (i32.const -2)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n2)))
        (local.set $m (f64x2.max (local.get $m) (f64x2.abs (v128.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 3)))))))
        (local.set $i (i32.add (local.get $i) (i32.const 2)))
        (br $l)))
    (local.set $r (f64.max (f64x2.extract_lane 0 (local.get $m)) (f64x2.extract_lane 1 (local.get $m))))
    (if (i32.lt_u (local.get $i) (local.get $n))
      (then (local.set $r (f64.max (local.get $r) (f64.abs (f64.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 3)))))))))
    (local.get $r))

  ;; quant(src, dst, n, scale): dst[i] = clamp(floor(src[i] * scale + 1/2), -127, 127) as int32
  ;; (detmath.js quantize; a NaN gives 0, as JS's store of NaN into an Int32Array does, and the
;; caller's exponent refuses an infinite absmax64).
  (func (export "quant") (param $src i32) (param $dst i32) (param $n i32) (param $scale f64)
    (local $i i32) (local $n4 i32) (local $s v128) (local $half v128) (local $hi v128) (local $lo v128) (local $p i32)
    (local.set $s (f64x2.splat (local.get $scale)))
    (local.set $half (f64x2.splat (f64.const 0.5)))
    (local.set $hi (f64x2.splat (f64.const 127)))
    (local.set $lo (f64x2.splat (f64.const -127)))
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n4)))
        (local.set $p (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 3))))
        (v128.store (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2))) (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
          (i32x4.trunc_sat_f64x2_s_zero (f64x2.max (local.get $lo) (f64x2.min (local.get $hi)
            (f64x2.floor (f64x2.add (f64x2.mul (v128.load offset=0 (local.get $p)) (local.get $s)) (local.get $half))))))
          (i32x4.trunc_sat_f64x2_s_zero (f64x2.max (local.get $lo) (f64x2.min (local.get $hi)
            (f64x2.floor (f64x2.add (f64x2.mul (v128.load offset=16 (local.get $p)) (local.get $s)) (local.get $half))))))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $l)))
    (block $tdone
      (loop $t
        (br_if $tdone (i32.ge_u (local.get $i) (local.get $n)))
        (i32.store (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2)))
          (i32.trunc_sat_f64_s (f64.max (f64.const -127) (f64.min (f64.const 127)
            (f64.floor (f64.add (f64.mul (f64.load (i32.add (local.get $src) (i32.shl (local.get $i) (i32.const 3))))
              (local.get $scale)) (f64.const 0.5)))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $t))))

  ;; accum(src, ld, rows, cols, dst, scale, limit): for every r < rows, j < cols,
  ;;   v = src[r*ld + j] * scale (int32 -> float64, exact); v = clamp(v, -limit, limit);
  ;;   dst[r*cols + j] += floor(v + 1/2)
  ;; src int32, dst float64 (8-byte elements). Two values a step (f64x2), four per load.
  (func (export "accum") (param $src i32) (param $ld i32) (param $rows i32) (param $cols i32) (param $dst i32)
    (param $scale f64) (param $limit f64)
    (local $r i32) (local $j i32) (local $p i32) (local $o i32) (local $c4 i32) (local $x v128)
    (local $s v128) (local $hi v128) (local $lo v128) (local $half v128) (local $v f64)
    (local.set $s (f64x2.splat (local.get $scale)))
    (local.set $hi (f64x2.splat (local.get $limit)))
    (local.set $lo (f64x2.splat (f64.neg (local.get $limit))))
    (local.set $half (f64x2.splat (f64.const 0.5)))
    (local.set $c4 (i32.and (local.get $cols) (i32.const -4)))
    (local.set $o (local.get $dst))
    (block $rdone
      (loop $rl
        (br_if $rdone (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $p (i32.add (local.get $src) (i32.shl (i32.mul (local.get $r) (local.get $ld)) (i32.const 2))))
        (local.set $j (i32.const 0))
        (block $vdone
          (loop $vl
            (br_if $vdone (i32.ge_u (local.get $j) (local.get $c4)))
            (local.set $x (v128.load (local.get $p)))
            (v128.store offset=0 (local.get $o) (f64x2.add (v128.load offset=0 (local.get $o))
              (f64x2.floor (f64x2.add (f64x2.max (local.get $lo) (f64x2.min (local.get $hi)
                (f64x2.mul (f64x2.convert_low_i32x4_s (local.get $x)) (local.get $s)))) (local.get $half)))))
            (v128.store offset=16 (local.get $o) (f64x2.add (v128.load offset=16 (local.get $o))
              (f64x2.floor (f64x2.add (f64x2.max (local.get $lo) (f64x2.min (local.get $hi)
                (f64x2.mul (f64x2.convert_low_i32x4_s
                  (i8x16.shuffle 8 9 10 11 12 13 14 15 8 9 10 11 12 13 14 15 (local.get $x) (local.get $x)))
                  (local.get $s)))) (local.get $half)))))
            (local.set $p (i32.add (local.get $p) (i32.const 16)))
            (local.set $o (i32.add (local.get $o) (i32.const 32)))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $vl)))
        (block $tdone
          (loop $tl
            (br_if $tdone (i32.ge_u (local.get $j) (local.get $cols)))
            (local.set $v (f64.mul (f64.convert_i32_s (i32.load (local.get $p))) (local.get $scale)))
            (local.set $v (f64.max (f64.neg (local.get $limit)) (f64.min (local.get $limit) (local.get $v))))
            (f64.store (local.get $o) (f64.add (f64.load (local.get $o)) (f64.floor (f64.add (local.get $v) (f64.const 0.5)))))
            (local.set $p (i32.add (local.get $p) (i32.const 4)))
            (local.set $o (i32.add (local.get $o) (i32.const 8)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $tl)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $rl))))
