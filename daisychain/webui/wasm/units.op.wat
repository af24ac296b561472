;; The outer-product GEMM, the one the unit GEMM (wasm_units.js) and every GEMM of a resident
;; plan (wasm_plan.js) run, and the kernels that lay out its B: a fragment of units.wat's module
;; (scripts/build_wasm.mjs inserts every units.*.wat in name order), the same rules: exact
;; integer instructions only, byte addresses, counts in elements.
;;
;; Each lane of an accumulator is its own output, so a block ends with plain stores, no
;; horizontal sums (units.wat gemm, the inner-product kernel the benches compare it with,
;; reduces each 2x4 block's eight vectors by shuffles, as costly as the products themselves
;; when K is 16-64; alone, gemm_op passes it on every shape, bench/js/ab_gemm.mjs). B is laid out interleaved by K pairs
;; as int16: for every 4 columns j0..j3, for every pair of K (k, k+1), the eight int16
;;   B[j0,k] B[j0,k+1] B[j1,k] B[j1,k+1] B[j2,k] B[j2,k+1] B[j3,k] B[j3,k+1]
;; (16 bytes; narrow_il writes it), and A's pair (A[i,k], A[i,k+1]) broadcast to every lane:
;; i32x4.dot_i16x8_s then gives lane t the pair's part of C[i, jt]. |a0*b0 + a1*b1| <= 2^15,
;; exact in i32.

  ;; gemm_op(a, lda, b, c, mp, np, kh): C (mp, np) int32 = A · Bᵀ over K = 2*kh, with
  ;; A (mp rows of lda bytes) int8, its K values first in each row; B interleaved (above),
  ;; the 4-column blocks kh*16 bytes apart. mp % 4 == 0, np % 8 == 0. 4 x 8 outputs per
  ;; block: eight accumulators, each K pair two 16-byte loads of B, four broadcasts of A, two
  ;; pairs a step (then the odd one).
  ;; The caller keeps 2*kh <= gemm.js MAX_K (padded with zeros), so no sum leaves int32.
  (func (export "gemm_op") (param $a i32) (param $lda i32) (param $b i32) (param $c i32)
    (param $mp i32) (param $np i32) (param $kh i32)
    (local $i i32) (local $j i32) (local $ka i32) (local $kb i32) (local $ke i32)
    (local $pa0 i32) (local $pa1 i32) (local $pa2 i32) (local $pa3 i32) (local $pb0 i32) (local $pb1 i32)
    (local $pc i32) (local $np4 i32) (local $bs i32)
    (local $x v128) (local $y0 v128) (local $y1 v128)
    (local $s00 v128) (local $s01 v128) (local $s10 v128) (local $s11 v128)
    (local $s20 v128) (local $s21 v128) (local $s30 v128) (local $s31 v128)
    (local.set $np4 (i32.shl (local.get $np) (i32.const 2)))
    (local.set $bs (i32.shl (local.get $kh) (i32.const 4)))
    (local.set $ke (i32.shl (local.get $kh) (i32.const 1)))
    (block $idone
      (loop $il
        (br_if $idone (i32.ge_u (local.get $i) (local.get $mp)))
        (local.set $pa0 (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $lda))))
        (local.set $pa1 (i32.add (local.get $pa0) (local.get $lda)))
        (local.set $pa2 (i32.add (local.get $pa1) (local.get $lda)))
        (local.set $pa3 (i32.add (local.get $pa2) (local.get $lda)))
        (local.set $pc (i32.add (local.get $c) (i32.mul (local.get $i) (local.get $np4))))
        (local.set $pb0 (local.get $b))
        (local.set $j (i32.const 0))
        (block $jdone
          (loop $jl
            (br_if $jdone (i32.ge_u (local.get $j) (local.get $np)))
            (local.set $pb1 (i32.add (local.get $pb0) (local.get $bs)))
            (local.set $s00 (v128.const i32x4 0 0 0 0)) (local.set $s01 (v128.const i32x4 0 0 0 0))
            (local.set $s10 (v128.const i32x4 0 0 0 0)) (local.set $s11 (v128.const i32x4 0 0 0 0))
            (local.set $s20 (v128.const i32x4 0 0 0 0)) (local.set $s21 (v128.const i32x4 0 0 0 0))
            (local.set $s30 (v128.const i32x4 0 0 0 0)) (local.set $s31 (v128.const i32x4 0 0 0 0))
            (local.set $ka (i32.const 0))
            (local.set $kb (i32.const 0))
            ;; two K pairs a step, then the odd pair left
            (block $kdone
              (loop $kl
                (br_if $kdone (i32.gt_u (i32.add (local.get $ka) (i32.const 4)) (local.get $ke)))
                (local.set $y0 (v128.load offset=0 (i32.add (local.get $pb0) (local.get $kb))))
                (local.set $y1 (v128.load offset=0 (i32.add (local.get $pb1) (local.get $kb))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa0) (local.get $ka)))))
                (local.set $s00 (i32x4.add (local.get $s00) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s01 (i32x4.add (local.get $s01) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa1) (local.get $ka)))))
                (local.set $s10 (i32x4.add (local.get $s10) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s11 (i32x4.add (local.get $s11) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa2) (local.get $ka)))))
                (local.set $s20 (i32x4.add (local.get $s20) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s21 (i32x4.add (local.get $s21) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa3) (local.get $ka)))))
                (local.set $s30 (i32x4.add (local.get $s30) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s31 (i32x4.add (local.get $s31) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $y0 (v128.load offset=16 (i32.add (local.get $pb0) (local.get $kb))))
                (local.set $y1 (v128.load offset=16 (i32.add (local.get $pb1) (local.get $kb))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=2 (i32.add (local.get $pa0) (local.get $ka)))))
                (local.set $s00 (i32x4.add (local.get $s00) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s01 (i32x4.add (local.get $s01) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=2 (i32.add (local.get $pa1) (local.get $ka)))))
                (local.set $s10 (i32x4.add (local.get $s10) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s11 (i32x4.add (local.get $s11) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=2 (i32.add (local.get $pa2) (local.get $ka)))))
                (local.set $s20 (i32x4.add (local.get $s20) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s21 (i32x4.add (local.get $s21) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=2 (i32.add (local.get $pa3) (local.get $ka)))))
                (local.set $s30 (i32x4.add (local.get $s30) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                (local.set $s31 (i32x4.add (local.get $s31) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                (local.set $ka (i32.add (local.get $ka) (i32.const 4)))
                (local.set $kb (i32.add (local.get $kb) (i32.const 32)))
                (br $kl)))
            (if (i32.lt_u (local.get $ka) (local.get $ke))
              (then
                  (local.set $y0 (v128.load offset=0 (i32.add (local.get $pb0) (local.get $kb))))
                  (local.set $y1 (v128.load offset=0 (i32.add (local.get $pb1) (local.get $kb))))
                  (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa0) (local.get $ka)))))
                  (local.set $s00 (i32x4.add (local.get $s00) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                  (local.set $s01 (i32x4.add (local.get $s01) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                  (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa1) (local.get $ka)))))
                  (local.set $s10 (i32x4.add (local.get $s10) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                  (local.set $s11 (i32x4.add (local.get $s11) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                  (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa2) (local.get $ka)))))
                  (local.set $s20 (i32x4.add (local.get $s20) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                  (local.set $s21 (i32x4.add (local.get $s21) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
                  (local.set $x (i16x8.extend_low_i8x16_s (v128.load16_splat offset=0 (i32.add (local.get $pa3) (local.get $ka)))))
                  (local.set $s30 (i32x4.add (local.get $s30) (i32x4.dot_i16x8_s (local.get $x) (local.get $y0))))
                  (local.set $s31 (i32x4.add (local.get $s31) (i32x4.dot_i16x8_s (local.get $x) (local.get $y1))))
              ))
            (v128.store offset=0 (local.get $pc) (local.get $s00))
            (v128.store offset=16 (local.get $pc) (local.get $s01))
            (v128.store offset=0 (i32.add (local.get $pc) (local.get $np4)) (local.get $s10))
            (v128.store offset=16 (i32.add (local.get $pc) (local.get $np4)) (local.get $s11))
            (v128.store offset=0 (i32.add (local.get $pc) (i32.shl (local.get $np4) (i32.const 1))) (local.get $s20))
            (v128.store offset=16 (i32.add (local.get $pc) (i32.shl (local.get $np4) (i32.const 1))) (local.get $s21))
            (v128.store offset=0 (i32.add (local.get $pc) (i32.mul (local.get $np4) (i32.const 3))) (local.get $s30))
            (v128.store offset=16 (i32.add (local.get $pc) (i32.mul (local.get $np4) (i32.const 3))) (local.get $s31))
            (local.set $pc (i32.add (local.get $pc) (i32.const 32)))
            (local.set $pb0 (i32.add (local.get $pb1) (local.get $bs)))
            (local.set $j (i32.add (local.get $j) (i32.const 8)))
            (br $jl)))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $il))))

  ;; narrow_il(src, dst, b, k, hw, kh) -> bad: b blocks of src (k, hw) int32, contiguous (a
  ;; channel-major map: sample s, channel o, position p; or, with hw = 1, a weight matrix
  ;; (rows b, k)), as gemm_op's interleaved B over the columns j = s*hw + p and K = o:
  ;; int16 at dst + (j >> 2)*kh*16 + (o >> 1)*16 + (j & 3)*4 + (o & 1)*2. Nothing else is
  ;; written but an odd k's zero partners (a plan's buffer keeps its zero padding). bad = 1
  ;; for a value outside int8. When hw % 4 == 0 a pair of channels goes 4 positions a step
  ;; (both rows narrowed to int16 and zipped into one 16-byte block entry); else one value
  ;; at a time.
  (func (export "narrow_il") (param $src i32) (param $dst i32) (param $b i32) (param $k i32)
    (param $hw i32) (param $kh i32) (result i32)
    (local $s i32) (local $o i32) (local $p i32) (local $j i32) (local $j0 i32) (local $bo i32)
    (local $v i32) (local $acc i32) (local $bs i32) (local $q i32) (local $hw4 i32)
    (local $x v128) (local $y v128) (local $vacc v128) (local $c128 v128)
    (local.set $bs (i32.shl (local.get $kh) (i32.const 4)))
    (local.set $hw4 (i32.shl (local.get $hw) (i32.const 2)))
    (local.set $c128 (i32x4.splat (i32.const 128)))
    (if (i32.eqz (i32.and (local.get $hw) (i32.const 3)))
      (then
        (block $vsdone
          (loop $vsl
            (br_if $vsdone (i32.ge_u (local.get $s) (local.get $b)))
            (local.set $o (i32.const 0))
            (block $vodone
              (loop $vol
                (br_if $vodone (i32.ge_u (local.get $o) (local.get $k)))
                ;; channels o and o + 1 (a zero row past k) at positions p..p+3
                (local.set $q (i32.add (local.get $src)
                  (i32.mul (i32.add (i32.mul (local.get $s) (local.get $k)) (local.get $o)) (local.get $hw4))))
                (local.set $bo (i32.add (i32.add (local.get $dst) (i32.shl (i32.shr_u (local.get $o) (i32.const 1)) (i32.const 4)))
                  (i32.mul (i32.shr_u (i32.mul (local.get $s) (local.get $hw)) (i32.const 2)) (local.get $bs))))
                (local.set $p (i32.const 0))
                (block $vpdone
                  (loop $vpl
                    (br_if $vpdone (i32.ge_u (local.get $p) (local.get $hw)))
                    (local.set $x (v128.load (local.get $q)))
                    (local.set $y (v128.const i32x4 0 0 0 0))
                    (if (i32.lt_u (i32.add (local.get $o) (i32.const 1)) (local.get $k))
                      (then (local.set $y (v128.load (i32.add (local.get $q) (local.get $hw4))))))
                    (local.set $vacc (v128.or (local.get $vacc) (v128.or (i32x4.add (local.get $x) (local.get $c128))
                      (i32x4.add (local.get $y) (local.get $c128)))))
                    (v128.store (local.get $bo) (i8x16.shuffle 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15
                      (i16x8.narrow_i32x4_s (local.get $x) (local.get $y)) (i16x8.narrow_i32x4_s (local.get $x) (local.get $y))))
                    (local.set $q (i32.add (local.get $q) (i32.const 16)))
                    (local.set $bo (i32.add (local.get $bo) (local.get $bs)))
                    (local.set $p (i32.add (local.get $p) (i32.const 4)))
                    (br $vpl)))
                (local.set $o (i32.add (local.get $o) (i32.const 2)))
                (br $vol)))
            (local.set $s (i32.add (local.get $s) (i32.const 1)))
            (br $vsl)))
        (return (v128.any_true (v128.and (local.get $vacc) (i32x4.splat (i32.const -256)))))))
    (block $sdone
      (loop $sl
        (br_if $sdone (i32.ge_u (local.get $s) (local.get $b)))
        (local.set $j0 (i32.mul (local.get $s) (local.get $hw)))
        (local.set $o (i32.const 0))
        (block $odone
          (loop $ol
            (br_if $odone (i32.ge_u (local.get $o) (local.get $k)))
            (local.set $bo (i32.add (local.get $dst) (i32.add
              (i32.shl (i32.shr_u (local.get $o) (i32.const 1)) (i32.const 4))
              (i32.shl (i32.and (local.get $o) (i32.const 1)) (i32.const 1)))))
            (local.set $p (i32.const 0))
            (block $pdone
              (loop $pl
                (br_if $pdone (i32.ge_u (local.get $p) (local.get $hw)))
                (local.set $j (i32.add (local.get $j0) (local.get $p)))
                (local.set $v (i32.load (local.get $src)))
                (local.set $acc (i32.or (local.get $acc) (i32.add (local.get $v) (i32.const 128))))
                (i32.store16 (i32.add (local.get $bo) (i32.add
                  (i32.mul (i32.shr_u (local.get $j) (i32.const 2)) (local.get $bs))
                  (i32.shl (i32.and (local.get $j) (i32.const 3)) (i32.const 2)))) (local.get $v))
                (local.set $src (i32.add (local.get $src) (i32.const 4)))
                (local.set $p (i32.add (local.get $p) (i32.const 1)))
                (br $pl)))
            (local.set $o (i32.add (local.get $o) (i32.const 1)))
            (br $ol)))
        (local.set $s (i32.add (local.get $s) (i32.const 1)))
        (br $sl)))
    (i32.ne (i32.and (local.get $acc) (i32.const -256)) (i32.const 0)))

  ;; il8(src, ld, dst, k, n, kh): gemm_op's interleaved B from int8 rows, B[j, r] = src[r*ld + j]
  ;; for r < k rows and j < n columns (a conv's columns as cols8 packs them, for its weight
  ;; gradient: K = the rows); an odd k's last pair has a zero second value. 16 columns a step
  ;; (two rows' bytes zipped, widened to int16, four 4-column blocks stored), so it reads up
  ;; to 15 bytes past a row's n and writes the blocks of up to 15 columns past n: columns of C
  ;; the caller does not read (its buffer has room for up(n, 16) columns).
  (func (export "il8") (param $src i32) (param $ld i32) (param $dst i32) (param $k i32) (param $n i32) (param $kh i32)
    (local $p i32) (local $j i32) (local $r0 i32) (local $r1 i32) (local $o i32) (local $bs i32) (local $b4 i32)
    (local $x v128) (local $y v128) (local $lo v128) (local $hi v128)
    (local.set $bs (i32.shl (local.get $kh) (i32.const 4)))
    (local.set $b4 (i32.shl (local.get $kh) (i32.const 6)))
    (block $pdone
      (loop $pl
        (br_if $pdone (i32.ge_u (local.get $p) (local.get $kh)))
        (local.set $r0 (i32.add (local.get $src) (i32.mul (i32.shl (local.get $p) (i32.const 1)) (local.get $ld))))
        (local.set $r1 (i32.add (local.get $r0) (local.get $ld)))
        (local.set $o (i32.add (local.get $dst) (i32.shl (local.get $p) (i32.const 4))))
        (local.set $j (i32.const 0))
        (block $jdone
          (loop $jl
            (br_if $jdone (i32.ge_u (local.get $j) (local.get $n)))
            (local.set $x (v128.load (i32.add (local.get $r0) (local.get $j))))
            (local.set $y (v128.const i32x4 0 0 0 0))
            (if (i32.lt_u (i32.add (i32.shl (local.get $p) (i32.const 1)) (i32.const 1)) (local.get $k))
              (then (local.set $y (v128.load (i32.add (local.get $r1) (local.get $j))))))
            (local.set $lo (i8x16.shuffle 0 16 1 17 2 18 3 19 4 20 5 21 6 22 7 23 (local.get $x) (local.get $y)))
            (local.set $hi (i8x16.shuffle 8 24 9 25 10 26 11 27 12 28 13 29 14 30 15 31 (local.get $x) (local.get $y)))
            (v128.store (local.get $o) (i16x8.extend_low_i8x16_s (local.get $lo)))
            (v128.store (i32.add (local.get $o) (local.get $bs)) (i16x8.extend_high_i8x16_s (local.get $lo)))
            (v128.store (i32.add (local.get $o) (i32.shl (local.get $bs) (i32.const 1))) (i16x8.extend_low_i8x16_s (local.get $hi)))
            (v128.store (i32.add (local.get $o) (i32.mul (local.get $bs) (i32.const 3))) (i16x8.extend_high_i8x16_s (local.get $hi)))
            (local.set $o (i32.add (local.get $o) (local.get $b4)))
            (local.set $j (i32.add (local.get $j) (i32.const 16)))
            (br $jl)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $pl))))
