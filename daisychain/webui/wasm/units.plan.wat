;; The kernels of a micro-batch kept in the module's memory (wasm_plan.js): a fragment of
;; units.wat's module (scripts/build_wasm.mjs assembles units.wat with every units.*.wat
;; inserted before its closing parenthesis, in name order), the same rules: exact integer
;; instructions only, byte addresses, counts in elements.

  ;; bias_rows(src, ld, rows, n, bias, dst) -> bad: dst (rows, n) = src (rows, ld) + bias (n)
  ;; per row, int32; bad = 1 when a sum leaves int32 (signed overflow: both operands' signs
  ;; differ from the sum's).
  (func (export "bias_rows") (param $src i32) (param $ld i32) (param $rows i32) (param $n i32)
    (param $bias i32) (param $dst i32) (result i32)
    (local $i i32) (local $j i32) (local $n4 i32) (local $p i32) (local $o i32)
    (local $v v128) (local $bv v128) (local $r v128) (local $ov v128)
    (local $x i32) (local $y i32) (local $z i32) (local $bad i32)
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (block $idone
      (loop $il
        (br_if $idone (i32.ge_u (local.get $i) (local.get $rows)))
        (local.set $p (i32.add (local.get $src) (i32.shl (i32.mul (local.get $i) (local.get $ld)) (i32.const 2))))
        (local.set $o (i32.add (local.get $dst) (i32.shl (i32.mul (local.get $i) (local.get $n)) (i32.const 2))))
        (local.set $j (i32.const 0))
        (block $vdone
          (loop $vl
            (br_if $vdone (i32.ge_u (local.get $j) (local.get $n4)))
            (local.set $v (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
            (local.set $bv (v128.load (i32.add (local.get $bias) (i32.shl (local.get $j) (i32.const 2)))))
            (local.set $r (i32x4.add (local.get $v) (local.get $bv)))
            (local.set $ov (v128.or (local.get $ov) (v128.and (v128.xor (local.get $v) (local.get $r))
              (v128.xor (local.get $bv) (local.get $r)))))
            (v128.store (i32.add (local.get $o) (i32.shl (local.get $j) (i32.const 2))) (local.get $r))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $vl)))
        (block $tdone
          (loop $tl
            (br_if $tdone (i32.ge_u (local.get $j) (local.get $n)))
            (local.set $x (i32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
            (local.set $y (i32.load (i32.add (local.get $bias) (i32.shl (local.get $j) (i32.const 2)))))
            (local.set $z (i32.add (local.get $x) (local.get $y)))
            (local.set $bad (i32.or (local.get $bad) (i32.lt_s (i32.and (i32.xor (local.get $x) (local.get $z))
              (i32.xor (local.get $y) (local.get $z))) (i32.const 0))))
            (i32.store (i32.add (local.get $o) (i32.shl (local.get $j) (i32.const 2))) (local.get $z))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $tl)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $il)))
    (i32.or (local.get $bad) (i32.ne (i32x4.bitmask (local.get $ov)) (i32.const 0))))

  ;; transpose(src, dst, b, r, c): b blocks, each src (r, c) int32 -> dst (c, r). 4 x 4 tiles
  ;; (four row loads, shuffles, four column stores) where r and c allow, the rest one value
  ;; at a time.
  (func (export "transpose") (param $src i32) (param $dst i32) (param $b i32) (param $r i32) (param $c i32)
    (local $s i32) (local $i i32) (local $j i32) (local $p i32) (local $o i32) (local $r4 i32) (local $c4 i32)
    (local $blk i32) (local $r44 i32) (local $c44 i32)
    (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128) (local $y0 v128) (local $y1 v128) (local $y2 v128) (local $y3 v128)
    (local.set $r4 (i32.shl (local.get $r) (i32.const 2)))
    (local.set $c4 (i32.shl (local.get $c) (i32.const 2)))
    (local.set $r44 (i32.and (local.get $r) (i32.const -4)))
    (local.set $c44 (i32.and (local.get $c) (i32.const -4)))
    (local.set $blk (i32.shl (i32.mul (local.get $r) (local.get $c)) (i32.const 2)))
    (block $sdone
      (loop $sl
        (br_if $sdone (i32.ge_u (local.get $s) (local.get $b)))
        ;; the 4 x 4 tiles: rows i..i+3, columns j..j+3 of src
        (local.set $i (i32.const 0))
        (block $tidone
          (loop $til
            (br_if $tidone (i32.ge_u (local.get $i) (local.get $r44)))
            (local.set $p (i32.add (local.get $src) (i32.mul (local.get $i) (local.get $c4))))
            (local.set $o (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2))))
            (local.set $j (i32.const 0))
            (block $tjdone
              (loop $tjl
                (br_if $tjdone (i32.ge_u (local.get $j) (local.get $c44)))
                (local.set $x0 (v128.load (local.get $p)))
                (local.set $x1 (v128.load (i32.add (local.get $p) (local.get $c4))))
                (local.set $x2 (v128.load (i32.add (local.get $p) (i32.shl (local.get $c4) (i32.const 1)))))
                (local.set $x3 (v128.load (i32.add (local.get $p) (i32.mul (local.get $c4) (i32.const 3)))))
                (local.set $y0 (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $x0) (local.get $x1)))
                (local.set $y1 (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $x0) (local.get $x1)))
                (local.set $y2 (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $x2) (local.get $x3)))
                (local.set $y3 (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $x2) (local.get $x3)))
                (v128.store (local.get $o) (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $y0) (local.get $y2)))
                (v128.store (i32.add (local.get $o) (local.get $r4))
                  (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $y0) (local.get $y2)))
                (v128.store (i32.add (local.get $o) (i32.shl (local.get $r4) (i32.const 1)))
                  (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $y1) (local.get $y3)))
                (v128.store (i32.add (local.get $o) (i32.mul (local.get $r4) (i32.const 3)))
                  (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $y1) (local.get $y3)))
                (local.set $p (i32.add (local.get $p) (i32.const 16)))
                (local.set $o (i32.add (local.get $o) (i32.shl (local.get $r4) (i32.const 2))))
                (local.set $j (i32.add (local.get $j) (i32.const 4)))
                (br $tjl)))
            (local.set $i (i32.add (local.get $i) (i32.const 4)))
            (br $til)))
        ;; what the tiles left: every row's columns from c44 on, and the rows from r44 on
        (local.set $i (i32.const 0))
        (block $idone
          (loop $il
            (br_if $idone (i32.ge_u (local.get $i) (local.get $r)))
            (local.set $j (select (local.get $c44) (i32.const 0) (i32.lt_u (local.get $i) (local.get $r44))))
            (local.set $p (i32.add (local.get $src) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $c)) (local.get $j)) (i32.const 2))))
            (local.set $o (i32.add (local.get $dst) (i32.shl (i32.add (i32.mul (local.get $j) (local.get $r)) (local.get $i)) (i32.const 2))))
            (block $jdone
              (loop $jl
                (br_if $jdone (i32.ge_u (local.get $j) (local.get $c)))
                (i32.store (local.get $o) (i32.load (local.get $p)))
                (local.set $p (i32.add (local.get $p) (i32.const 4)))
                (local.set $o (i32.add (local.get $o) (local.get $r4)))
                (local.set $j (i32.add (local.get $j) (i32.const 1)))
                (br $jl)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $il)))
        (local.set $src (i32.add (local.get $src) (local.get $blk)))
        (local.set $dst (i32.add (local.get $dst) (local.get $blk)))
        (local.set $s (i32.add (local.get $s) (i32.const 1)))
        (br $sl))))

  ;; mask(x, m, n): x[i] = 0 where m[i] <= 0 (the ReLU's output masks the error below it).
  (func (export "mask") (param $x i32) (param $m i32) (param $n i32)
    (local $i i32) (local $n4 i32) (local $p i32) (local $q i32)
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n4)))
        (local.set $p (i32.add (local.get $x) (i32.shl (local.get $i) (i32.const 2))))
        (v128.store (local.get $p) (v128.and (v128.load (local.get $p))
          (i32x4.gt_s (v128.load (i32.add (local.get $m) (i32.shl (local.get $i) (i32.const 2)))) (v128.const i32x4 0 0 0 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $l)))
    (block $tdone
      (loop $t
        (br_if $tdone (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $p (i32.add (local.get $x) (i32.shl (local.get $i) (i32.const 2))))
        (if (i32.le_s (i32.load (i32.add (local.get $m) (i32.shl (local.get $i) (i32.const 2)))) (i32.const 0))
          (then (i32.store (local.get $p) (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $t))))

  ;; narrow(src, dst, b, r, c, bs, is, js) -> bad: b blocks of src (r, c) int32, contiguous,
  ;; as int8 bytes at dst + s*bs + i*is + j*js (a block-wise pack or transpose: the errors
  ;; of a channel-major map into either GEMM operand); bad = 1 for a value outside int8.
  ;; Contiguous bytes (js == 1) go 16 a step (narrowed with saturation, the range judged on
  ;; the values: v + 128 or-ed), never past a row's c bytes; the rest one at a time.
  (func (export "narrow") (param $src i32) (param $dst i32) (param $b i32) (param $r i32) (param $c i32)
    (param $bs i32) (param $is i32) (param $js i32) (result i32)
    (local $s i32) (local $i i32) (local $j i32) (local $o i32) (local $v i32) (local $bad i32)
    (local $c16 i32) (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128) (local $acc v128) (local $k v128)
    (local.set $k (i32x4.splat (i32.const 128)))
    (local.set $c16 (select (i32.sub (local.get $c) (i32.const 15)) (i32.const 0)
      (i32.and (i32.eq (local.get $js) (i32.const 1)) (i32.ge_u (local.get $c) (i32.const 16)))))
    (block $sdone
      (loop $sl
        (br_if $sdone (i32.ge_u (local.get $s) (local.get $b)))
        (local.set $i (i32.const 0))
        (block $idone
          (loop $il
            (br_if $idone (i32.ge_u (local.get $i) (local.get $r)))
            (local.set $o (i32.add (i32.add (local.get $dst) (i32.mul (local.get $s) (local.get $bs)))
              (i32.mul (local.get $i) (local.get $is))))
            (local.set $j (i32.const 0))
            (block $vdone
              (loop $vl
                (br_if $vdone (i32.ge_u (local.get $j) (local.get $c16)))
                (local.set $x0 (v128.load offset=0 (local.get $src)))
                (local.set $x1 (v128.load offset=16 (local.get $src)))
                (local.set $x2 (v128.load offset=32 (local.get $src)))
                (local.set $x3 (v128.load offset=48 (local.get $src)))
                (local.set $acc (v128.or (local.get $acc) (v128.or
                  (v128.or (i32x4.add (local.get $x0) (local.get $k)) (i32x4.add (local.get $x1) (local.get $k)))
                  (v128.or (i32x4.add (local.get $x2) (local.get $k)) (i32x4.add (local.get $x3) (local.get $k))))))
                (v128.store (local.get $o) (i8x16.narrow_i16x8_s (i16x8.narrow_i32x4_s (local.get $x0) (local.get $x1))
                  (i16x8.narrow_i32x4_s (local.get $x2) (local.get $x3))))
                (local.set $src (i32.add (local.get $src) (i32.const 64)))
                (local.set $o (i32.add (local.get $o) (i32.const 16)))
                (local.set $j (i32.add (local.get $j) (i32.const 16)))
                (br $vl)))
            (block $jdone
              (loop $jl
                (br_if $jdone (i32.ge_u (local.get $j) (local.get $c)))
                (local.set $v (i32.load (local.get $src)))
                (local.set $bad (i32.or (local.get $bad)
                  (i32.gt_u (i32.add (local.get $v) (i32.const 128)) (i32.const 255))))
                (i32.store8 (local.get $o) (local.get $v))
                (local.set $src (i32.add (local.get $src) (i32.const 4)))
                (local.set $o (i32.add (local.get $o) (local.get $js)))
                (local.set $j (i32.add (local.get $j) (i32.const 1)))
                (br $jl)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $il)))
        (local.set $s (i32.add (local.get $s) (i32.const 1)))
        (br $sl)))
    (i32.or (local.get $bad) (v128.any_true (v128.and (local.get $acc) (i32x4.splat (i32.const -256))))))

  ;; sum_blocks(src, dst, b, r, c): dst[i] = sum over s < b, j < c of src[(s*r + i)*c + j],
  ;; int32 (a bias gradient: the caller keeps b*c*128 below 2^31). With c = 1 (a linear's
  ;; rows) the rows are added 4 values a step.
  (func (export "sum_blocks") (param $src i32) (param $dst i32) (param $b i32) (param $r i32) (param $c i32)
    (local $s i32) (local $i i32) (local $j i32) (local $c4 i32) (local $t i32) (local $v v128) (local $o i32)
    (local $r4 i32)
    (local.set $c4 (i32.and (local.get $c) (i32.const -4)))
    (memory.fill (local.get $dst) (i32.const 0) (i32.shl (local.get $r) (i32.const 2)))
    (if (i32.eq (local.get $c) (i32.const 1))
      (then
        (local.set $r4 (i32.and (local.get $r) (i32.const -4)))
        (block $rsdone
          (loop $rsl
            (br_if $rsdone (i32.ge_u (local.get $s) (local.get $b)))
            (local.set $i (i32.const 0))
            (block $rvdone
              (loop $rvl
                (br_if $rvdone (i32.ge_u (local.get $i) (local.get $r4)))
                (local.set $o (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2))))
                (v128.store (local.get $o) (i32x4.add (v128.load (local.get $o)) (v128.load (local.get $src))))
                (local.set $src (i32.add (local.get $src) (i32.const 16)))
                (local.set $i (i32.add (local.get $i) (i32.const 4)))
                (br $rvl)))
            (block $rtdone
              (loop $rtl
                (br_if $rtdone (i32.ge_u (local.get $i) (local.get $r)))
                (local.set $o (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2))))
                (i32.store (local.get $o) (i32.add (i32.load (local.get $o)) (i32.load (local.get $src))))
                (local.set $src (i32.add (local.get $src) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $rtl)))
            (local.set $s (i32.add (local.get $s) (i32.const 1)))
            (br $rsl)))
        (return)))
    (block $sdone
      (loop $sl
        (br_if $sdone (i32.ge_u (local.get $s) (local.get $b)))
        (local.set $i (i32.const 0))
        (block $idone
          (loop $il
            (br_if $idone (i32.ge_u (local.get $i) (local.get $r)))
            (local.set $v (v128.const i32x4 0 0 0 0))
            (local.set $j (i32.const 0))
            (block $vdone
              (loop $vl
                (br_if $vdone (i32.ge_u (local.get $j) (local.get $c4)))
                (local.set $v (i32x4.add (local.get $v) (v128.load (local.get $src))))
                (local.set $src (i32.add (local.get $src) (i32.const 16)))
                (local.set $j (i32.add (local.get $j) (i32.const 4)))
                (br $vl)))
            (local.set $t (call $hsum (local.get $v)))
            (block $tdone
              (loop $tl
                (br_if $tdone (i32.ge_u (local.get $j) (local.get $c)))
                (local.set $t (i32.add (local.get $t) (i32.load (local.get $src))))
                (local.set $src (i32.add (local.get $src) (i32.const 4)))
                (local.set $j (i32.add (local.get $j) (i32.const 1)))
                (br $tl)))
            (local.set $o (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 2))))
            (i32.store (local.get $o) (i32.add (i32.load (local.get $o)) (local.get $t)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $il)))
        (local.set $s (i32.add (local.get $s) (i32.const 1)))
        (br $sl))))

  ;; col2im8t(src, dst, b, ci, h, w, k, ld): col2im from the columns' transpose, src (ci*k*k
  ;; rows of ld int32, column s*h*w + y*w + x) into dst (b, ci*h*w) int32: each (channel, dy,
  ;; dx) row added into the maps shifted back by (dy - p, dx - p). Within a map the shift is
  ;; one constant offset, so the rows Y whose y = Y - dy + p lies in the map are added as one
  ;; run, 4 lanes at a time; the columns X whose x = X - dx + p falls outside it took a
  ;; neighbour's value (the row beside, or the next map's first: at most p values outside a
  ;; map's run, inside the src buffer), which is subtracted back. The sums wrap as int32 adds
  ;; (an add and its subtraction cancel exactly); a plan calls it only where spec validation
  ;; keeps every sum in int32 (co*k*k <= MAX_K: |sum| <= 131071 * 127 * 127 < 2^31), so they
  ;; are the exact sums.
  (func (export "col2im8t") (param $src i32) (param $dst i32) (param $b i32) (param $ci i32)
    (param $h i32) (param $w i32) (param $k i32) (param $ld i32)
    (local $c i32) (local $dy i32) (local $dx i32) (local $s i32) (local $Y i32) (local $X i32)
    (local $Y0 i32) (local $Y1 i32) (local $X0 i32) (local $X1 i32) (local $p i32) (local $hw i32)
    (local $row i32) (local $o i32) (local $q i32) (local $n i32) (local $n4 i32) (local $d i32)
    (local $i i32) (local $ro i32) (local $rq i32)
    (local.set $p (i32.shr_u (i32.sub (local.get $k) (i32.const 1)) (i32.const 1)))
    (local.set $hw (i32.mul (local.get $h) (local.get $w)))
    (memory.fill (local.get $dst) (i32.const 0)
      (i32.shl (i32.mul (i32.mul (local.get $b) (local.get $ci)) (local.get $hw)) (i32.const 2)))
    (local.set $row (local.get $src))
    (loop $lc
      (local.set $dy (i32.const 0))
      (loop $ldy
        ;; the rows Y whose y = Y - dy + p lies in [0, h)
        (local.set $Y0 (select (i32.sub (local.get $dy) (local.get $p)) (i32.const 0)
          (i32.gt_s (local.get $dy) (local.get $p))))
        (local.set $Y1 (select (i32.sub (i32.add (local.get $h) (local.get $dy)) (local.get $p)) (local.get $h)
          (i32.lt_s (local.get $dy) (local.get $p))))
        (local.set $n (i32.mul (i32.sub (local.get $Y1) (local.get $Y0)) (local.get $w)))
        (if (i32.lt_s (local.get $n) (i32.const 0)) (then (local.set $n (i32.const 0))))
        (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
        (local.set $dx (i32.const 0))
        (loop $ldx
          ;; the X whose x = X - dx + p lies in [0, w)
          (local.set $X0 (select (i32.sub (local.get $dx) (local.get $p)) (i32.const 0)
            (i32.gt_s (local.get $dx) (local.get $p))))
          (local.set $X1 (select (i32.sub (i32.add (local.get $w) (local.get $dx)) (local.get $p)) (local.get $w)
            (i32.lt_s (local.get $dx) (local.get $p))))
          (if (i32.gt_s (local.get $X0) (local.get $w)) (then (local.set $X0 (local.get $w)))) ;; a map narrower than p
          (if (i32.lt_s (local.get $X1) (local.get $X0)) (then (local.set $X1 (local.get $X0))))
          ;; src index = dst index (within the map) + d
          (local.set $d (i32.add (i32.mul (i32.sub (local.get $p) (local.get $dy)) (local.get $w))
            (i32.sub (local.get $p) (local.get $dx))))
          (local.set $s (i32.const 0))
          (loop $ls
            (local.set $o (i32.add (local.get $dst) (i32.shl (i32.add
              (i32.mul (i32.add (i32.mul (local.get $s) (local.get $ci)) (local.get $c)) (local.get $hw))
              (i32.mul (local.get $Y0) (local.get $w))) (i32.const 2))))
            (local.set $q (i32.add (local.get $row) (i32.shl (i32.add
              (i32.add (i32.mul (local.get $s) (local.get $hw)) (i32.mul (local.get $Y0) (local.get $w)))
              (local.get $d)) (i32.const 2))))
            ;; the run: every row Y0..Y1-1, whole
            (local.set $i (i32.const 0))
            (block $vdone
              (loop $lv
                (br_if $vdone (i32.ge_s (local.get $i) (local.get $n4)))
                (v128.store (i32.add (local.get $o) (i32.shl (local.get $i) (i32.const 2)))
                  (i32x4.add (v128.load (i32.add (local.get $o) (i32.shl (local.get $i) (i32.const 2))))
                    (v128.load (i32.add (local.get $q) (i32.shl (local.get $i) (i32.const 2))))))
                (local.set $i (i32.add (local.get $i) (i32.const 4)))
                (br $lv)))
            (block $tdone
              (loop $lt
                (br_if $tdone (i32.ge_s (local.get $i) (local.get $n)))
                (i32.store (i32.add (local.get $o) (i32.shl (local.get $i) (i32.const 2)))
                  (i32.add (i32.load (i32.add (local.get $o) (i32.shl (local.get $i) (i32.const 2))))
                    (i32.load (i32.add (local.get $q) (i32.shl (local.get $i) (i32.const 2))))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $lt)))
            ;; the columns outside [X0, X1) of each row took a neighbour's value: subtract it back
            (if (i32.or (i32.gt_s (local.get $X0) (i32.const 0)) (i32.lt_s (local.get $X1) (local.get $w)))
              (then
                (local.set $Y (local.get $Y0))
                (local.set $ro (local.get $o))
                (local.set $rq (local.get $q))
                (block $fdone
                  (loop $lf
                    (br_if $fdone (i32.ge_s (local.get $Y) (local.get $Y1)))
                    (local.set $X (i32.const 0)) ;; X < X0, then X >= X1
                    (block $x0done
                      (loop $lx0
                        (br_if $x0done (i32.ge_s (local.get $X) (local.get $X0)))
                        (i32.store (i32.add (local.get $ro) (i32.shl (local.get $X) (i32.const 2)))
                          (i32.sub (i32.load (i32.add (local.get $ro) (i32.shl (local.get $X) (i32.const 2))))
                            (i32.load (i32.add (local.get $rq) (i32.shl (local.get $X) (i32.const 2))))))
                        (local.set $X (i32.add (local.get $X) (i32.const 1)))
                        (br $lx0)))
                    (local.set $X (local.get $X1))
                    (block $x1done
                      (loop $lx1
                        (br_if $x1done (i32.ge_s (local.get $X) (local.get $w)))
                        (i32.store (i32.add (local.get $ro) (i32.shl (local.get $X) (i32.const 2)))
                          (i32.sub (i32.load (i32.add (local.get $ro) (i32.shl (local.get $X) (i32.const 2))))
                            (i32.load (i32.add (local.get $rq) (i32.shl (local.get $X) (i32.const 2))))))
                        (local.set $X (i32.add (local.get $X) (i32.const 1)))
                        (br $lx1)))
                    (local.set $ro (i32.add (local.get $ro) (i32.shl (local.get $w) (i32.const 2))))
                    (local.set $rq (i32.add (local.get $rq) (i32.shl (local.get $w) (i32.const 2))))
                    (local.set $Y (i32.add (local.get $Y) (i32.const 1)))
                    (br $lf)))))
            (local.set $s (i32.add (local.get $s) (i32.const 1)))
            (br_if $ls (i32.lt_u (local.get $s) (local.get $b))))
          (local.set $row (i32.add (local.get $row) (i32.shl (local.get $ld) (i32.const 2))))
          (local.set $dx (i32.add (local.get $dx) (i32.const 1)))
          (br_if $ldx (i32.lt_u (local.get $dx) (local.get $k))))
        (local.set $dy (i32.add (local.get $dy) (i32.const 1)))
        (br_if $ldy (i32.lt_u (local.get $dy) (local.get $k))))
      (local.set $c (i32.add (local.get $c) (i32.const 1)))
      (br_if $lc (i32.lt_u (local.get $c) (local.get $ci)))))

  ;; pad8(src, dst, bc, h, w, p) -> bad: bc maps (h, w) int32 holding int8 as int8 maps
  ;; (h + 2p, w + 2p) with the map at (p, p); the border is never written (a plan's buffer:
  ;; zero). bad = 1 for a value outside [-128, 127] (an or of v + 128).
  (func (export "pad8") (param $src i32) (param $dst i32) (param $bc i32) (param $h i32) (param $w i32)
    (param $p i32) (result i32)
    (local $i i32) (local $y i32) (local $x i32) (local $o i32) (local $v i32) (local $acc i32) (local $pw i32)
    (local.set $pw (i32.add (local.get $w) (i32.shl (local.get $p) (i32.const 1))))
    (local.set $o (i32.add (local.get $dst) (i32.add (i32.mul (local.get $p) (local.get $pw)) (local.get $p))))
    (loop $li
      (local.set $y (i32.const 0))
      (loop $ly
        (local.set $x (i32.const 0))
        (loop $lx
          (local.set $v (i32.load (local.get $src)))
          (local.set $acc (i32.or (local.get $acc) (i32.add (local.get $v) (i32.const 128))))
          (i32.store8 (i32.add (local.get $o) (local.get $x)) (local.get $v))
          (local.set $src (i32.add (local.get $src) (i32.const 4)))
          (local.set $x (i32.add (local.get $x) (i32.const 1)))
          (br_if $lx (i32.lt_u (local.get $x) (local.get $w))))
        (local.set $o (i32.add (local.get $o) (local.get $pw)))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br_if $ly (i32.lt_u (local.get $y) (local.get $h))))
      (local.set $o (i32.add (local.get $o) (i32.mul (i32.shl (local.get $p) (i32.const 1)) (local.get $pw)))) ;; the next map
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $li (i32.lt_u (local.get $i) (local.get $bc))))
    (i32.ne (i32.and (local.get $acc) (i32.const -256)) (i32.const 0)))

  ;; cols8(pad, dst, b, ci, h, w, k, kp): from maps padded by pad8 (b*ci maps (h + 2p,
  ;; w + 2p) int8), no bounds to test: im2col's columns (b*h*w, ci*k*k) as int8 rows of kp
  ;; bytes (the packed GEMM operand), each kernel row of k bytes copied as one 4-byte (k = 3)
  ;; or 8-byte (k = 5) word. A copy writes up to 3 bytes past its end: into positions written
  ;; after it (the next kernel row or column), or into a row's padding past K, whose products
  ;; meet the other operand's zero padding; the plan leaves 16 bytes after the buffer.
  (func (export "cols8") (param $pad i32) (param $dst i32) (param $b i32) (param $ci i32)
    (param $h i32) (param $w i32) (param $k i32) (param $kp i32)
    (local $s i32) (local $y i32) (local $x i32) (local $c i32) (local $dy i32) (local $o i32) (local $q i32)
    (local $ph i32) (local $pw i32) (local $row i32) (local $t i32) (local $p i32) (local $pw2 i32) (local $kk i32)
    (local $map i32) (local $t5 i32)
    (local.set $ph (i32.sub (i32.add (local.get $h) (local.get $k)) (i32.const 1)))
    (local.set $pw (i32.sub (i32.add (local.get $w) (local.get $k)) (i32.const 1)))
    (local.set $pw2 (i32.shl (local.get $pw) (i32.const 1)))
    (local.set $kk (i32.mul (local.get $k) (local.get $k)))
    (local.set $map (i32.mul (local.get $ph) (local.get $pw)))
    (local.set $row (local.get $dst))
    (loop $ls
      (local.set $y (i32.const 0))
      (loop $ly
        (local.set $x (i32.const 0))
        (loop $lx
          (local.set $o (local.get $row))
          (local.set $q (i32.add (local.get $pad) (i32.add (local.get $x) (i32.mul (local.get $pw)
            (i32.add (local.get $y) (i32.mul (local.get $ph) (i32.mul (local.get $s) (local.get $ci))))))))
          (local.set $c (i32.const 0))
          (loop $lc ;; q: channel c's padded map at (y, x); o: the row's k*k bytes of channel c
            (if (i32.eq (local.get $k) (i32.const 3))
              (then
                (i32.store offset=0 (local.get $o) (i32.load (local.get $q)))
                (i32.store offset=3 (local.get $o) (i32.load (i32.add (local.get $q) (local.get $pw))))
                (i32.store offset=6 (local.get $o) (i32.load (i32.add (local.get $q) (local.get $pw2)))))
              (else
                (local.set $p (local.get $q))
                (local.set $t5 (local.get $o))
                (local.set $dy (i32.const 0))
                (loop $ldy
                  (if (i32.eq (local.get $k) (i32.const 5))
                    (then (i64.store (local.get $t5) (i64.load (local.get $p))))
                    (else
                      (local.set $t (i32.const 0))
                      (loop $lt
                        (i32.store8 (i32.add (local.get $t5) (local.get $t)) (i32.load8_u (i32.add (local.get $p) (local.get $t))))
                        (local.set $t (i32.add (local.get $t) (i32.const 1)))
                        (br_if $lt (i32.lt_u (local.get $t) (local.get $k))))))
                  (local.set $t5 (i32.add (local.get $t5) (local.get $k)))
                  (local.set $p (i32.add (local.get $p) (local.get $pw)))
                  (local.set $dy (i32.add (local.get $dy) (i32.const 1)))
                  (br_if $ldy (i32.lt_u (local.get $dy) (local.get $k))))))
            (local.set $o (i32.add (local.get $o) (local.get $kk)))
            (local.set $q (i32.add (local.get $q) (local.get $map)))
            (local.set $c (i32.add (local.get $c) (i32.const 1)))
            (br_if $lc (i32.lt_u (local.get $c) (local.get $ci))))
          (local.set $row (i32.add (local.get $row) (local.get $kp)))
          (local.set $x (i32.add (local.get $x) (i32.const 1)))
          (br_if $lx (i32.lt_u (local.get $x) (local.get $w))))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br_if $ly (i32.lt_u (local.get $y) (local.get $h))))
      (local.set $s (i32.add (local.get $s) (i32.const 1)))
      (br_if $ls (i32.lt_u (local.get $s) (local.get $b)))))
