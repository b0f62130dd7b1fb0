;; Exact int8 x int8 -> int32 GEMM with WebAssembly SIMD (128-bit), for the page.
;;
;; Built into gemm_i8.wasm (checked in beside this file) by `python -m server.wasm_build
;; build`; tests/server/test_wasm_build.py rebuilds it and compares the bytes.
;;
;; The module imports Pyodide's own linear memory (env.memory): it reads the int8 operands
;; straight out of numpy's buffers and writes the int32 result into numpy's output array,
;; so nothing is copied between Python and the kernel. The custom section "dylink.0" (an
;; Emscripten side module with no data and no table) is what lets Pyodide's loader hand it
;; that memory (pynode/browser_gemm.py).
;;
;; Exactness: every product of two int8 values fits in int16, and i32x4.dot_i16x8_s adds two
;; such products exactly into an int32 lane; the lanes then accumulate in int32, exact while
;; K * 2**14 < 2**31 (K <= 131,071, checked before any call). Only integer instructions are
;; used; relaxed-SIMD dot products (whose results may differ between machines) are not.
;;
;; Layout. A (M, K) and C (M, N) are row-major and contiguous; B (K, N) row-major and
;; contiguous is first packed into `scratch`: panels of 8 columns, each panel a run of
;; k-pairs, each k-pair 32 bytes holding (B[2j, c], B[2j+1, c]) as two int16 for the 8
;; columns c of the panel (zeros past column N-1 and past row K-1). A is packed too, after B
;; in `scratch`: each row as KP int32, each the k-pair (A[r, 2j], A[r, 2j+1]) as two int16
;; (zero past column K-1). The kernel computes a 4 x 8 tile of C per step: for each k-pair
;; it splats the packed pair of each of the 4 rows (one v128.load32_splat, where unpacked
;; bytes took a splat and a widening) and takes their dot products with the panel's two
;; vectors.
;; Legend: B batch, M rows, K reduction length, N columns, KP = ceil(K / 2) k-pairs,
;; NP = ceil(N / 8) panels; `scratch` must hold NP * KP * 32 + M * KP * 4 bytes.
(module
  ;; Emscripten dylink.0: subsection 1 (memory info), 4 bytes: memory size, memory alignment,
  ;; table size, table alignment, all 0.
  (@custom "dylink.0" "\01\04\00\00\00\00")
  (import "env" "memory" (memory 0))

  ;; Pack B (k, n) int8 into panels at dst (layout above).
  (func $pack_b (param $b i32) (param $k i32) (param $n i32) (param $dst i32)
    (local $kp i32) (local $pairs i32) (local $panel i32) (local $full i32)
    (local $src i32) (local $out i32) (local $j i32) (local $c i32) (local $w i32)
    (local $z v128)
    (local.set $pairs (i32.shr_u (local.get $k) (i32.const 1)))
    (local.set $kp (i32.shr_u (i32.add (local.get $k) (i32.const 1)) (i32.const 1)))
    (local.set $full (i32.shr_u (local.get $n) (i32.const 3)))
    ;; full panels: 8 bytes of row 2j and of row 2j+1, interleaved, widened to int16
    (local.set $panel (i32.const 0))
    (block $panels_done
      (loop $panels
        (br_if $panels_done (i32.ge_u (local.get $panel) (local.get $full)))
        (local.set $src (i32.add (local.get $b) (i32.shl (local.get $panel) (i32.const 3))))
        (local.set $out (i32.add (local.get $dst)
          (i32.shl (i32.mul (local.get $panel) (local.get $kp)) (i32.const 5))))
        (local.set $j (i32.const 0))
        (block $pairs_done
          (loop $pair
            (br_if $pairs_done (i32.ge_u (local.get $j) (local.get $pairs)))
            (local.set $z
              (i8x16.shuffle 0 16 1 17 2 18 3 19 4 20 5 21 6 22 7 23
                (v128.load64_zero (local.get $src))
                (v128.load64_zero (i32.add (local.get $src) (local.get $n)))))
            (v128.store (local.get $out) (i16x8.extend_low_i8x16_s (local.get $z)))
            (v128.store offset=16 (local.get $out) (i16x8.extend_high_i8x16_s (local.get $z)))
            (local.set $src (i32.add (local.get $src) (i32.shl (local.get $n) (i32.const 1))))
            (local.set $out (i32.add (local.get $out) (i32.const 32)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $pair)))
        ;; odd K: the last row pairs with a row of zeros
        (if (i32.and (local.get $k) (i32.const 1))
          (then
            (local.set $z
              (i8x16.shuffle 0 16 1 17 2 18 3 19 4 20 5 21 6 22 7 23
                (v128.load64_zero (local.get $src)) (v128.const i32x4 0 0 0 0)))
            (v128.store (local.get $out) (i16x8.extend_low_i8x16_s (local.get $z)))
            (v128.store offset=16 (local.get $out) (i16x8.extend_high_i8x16_s (local.get $z)))))
        (local.set $panel (i32.add (local.get $panel) (i32.const 1)))
        (br $panels)))
    ;; a last panel of w < 8 columns: zeros, then the w columns one value at a time
    (local.set $w (i32.and (local.get $n) (i32.const 7)))
    (if (local.get $w)
      (then
        (local.set $out (i32.add (local.get $dst)
          (i32.shl (i32.mul (local.get $full) (local.get $kp)) (i32.const 5))))
        (memory.fill (local.get $out) (i32.const 0) (i32.shl (local.get $kp) (i32.const 5)))
        (local.set $j (i32.const 0))
        (block $rows_done
          (loop $row
            (br_if $rows_done (i32.ge_u (local.get $j) (local.get $k)))
            ;; row j of B, columns 8 * full .. n - 1, into k-pair j / 2, slot j % 2
            (local.set $src (i32.add (local.get $b)
              (i32.add (i32.mul (local.get $j) (local.get $n))
                       (i32.shl (local.get $full) (i32.const 3)))))
            (local.set $c (i32.const 0))
            (block $cols_done
              (loop $col
                (br_if $cols_done (i32.ge_u (local.get $c) (local.get $w)))
                (i32.store16
                  (i32.add (local.get $out)
                    (i32.add (i32.shl (i32.shr_u (local.get $j) (i32.const 1)) (i32.const 5))
                      (i32.add (i32.shl (local.get $c) (i32.const 2))
                               (i32.shl (i32.and (local.get $j) (i32.const 1)) (i32.const 1)))))
                  (i32.load8_s (i32.add (local.get $src) (local.get $c))))
                (local.set $c (i32.add (local.get $c) (i32.const 1)))
                (br $col)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $row)))))
  )

  ;; Pack A (m, k) int8 at dst: row r as KP int32, k-pair j holding (A[r, 2j], A[r, 2j+1]) as
  ;; two int16 (the second 0 past column K-1), so one v128.load32_splat gives the kernel
  ;; the pair in every lane. Sixteen bytes a step, the row's tail one byte at a time.
  (func $pack_a (param $a i32) (param $m i32) (param $k i32) (param $dst i32)
    (local $r i32) (local $j i32) (local $z v128) (local $row_bytes i32)
    (local.set $row_bytes (i32.shl (i32.shr_u (i32.add (local.get $k) (i32.const 1)) (i32.const 1))
                                   (i32.const 2)))
    (block $rows_done
      (loop $row
        (br_if $rows_done (i32.ge_u (local.get $r) (local.get $m)))
        (local.set $j (i32.const 0))
        (block $chunks_done
          (loop $chunk
            (br_if $chunks_done (i32.gt_u (i32.add (local.get $j) (i32.const 16)) (local.get $k)))
            (local.set $z (v128.load (i32.add (local.get $a) (local.get $j))))
            (v128.store (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 1)))
              (i16x8.extend_low_i8x16_s (local.get $z)))
            (v128.store offset=16 (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 1)))
              (i16x8.extend_high_i8x16_s (local.get $z)))
            (local.set $j (i32.add (local.get $j) (i32.const 16)))
            (br $chunk)))
        (block $tail_done
          (loop $tail
            (br_if $tail_done (i32.ge_u (local.get $j) (local.get $k)))
            (i32.store16 (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 1)))
              (i32.load8_s (i32.add (local.get $a) (local.get $j))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $tail)))
        (if (i32.and (local.get $k) (i32.const 1))
          (then (i32.store16 (i32.add (local.get $dst) (i32.shl (local.get $k) (i32.const 1)))
                             (i32.const 0))))
        (local.set $a (i32.add (local.get $a) (local.get $k)))
        (local.set $dst (i32.add (local.get $dst) (local.get $row_bytes)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $row)))
  )

  ;; Store the first `count` (0..4) lanes of v at ptr.
  (func $store_lanes (param $ptr i32) (param $v v128) (param $count i32)
    (if (i32.gt_s (local.get $count) (i32.const 0))
      (then (i32.store (local.get $ptr) (i32x4.extract_lane 0 (local.get $v)))))
    (if (i32.gt_s (local.get $count) (i32.const 1))
      (then (i32.store offset=4 (local.get $ptr) (i32x4.extract_lane 1 (local.get $v)))))
    (if (i32.gt_s (local.get $count) (i32.const 2))
      (then (i32.store offset=8 (local.get $ptr) (i32x4.extract_lane 2 (local.get $v)))))
    (if (i32.gt_s (local.get $count) (i32.const 3))
      (then (i32.store offset=12 (local.get $ptr) (i32x4.extract_lane 3 (local.get $v))))))

  ;; Store one row of a tile: 8 lanes (lo, hi) at ptr, of which the first w are inside C.
  (func $store_row (param $ptr i32) (param $lo v128) (param $hi v128) (param $w i32)
    (if (i32.ge_u (local.get $w) (i32.const 8))
      (then
        (v128.store (local.get $ptr) (local.get $lo))
        (v128.store offset=16 (local.get $ptr) (local.get $hi)))
      (else
        (call $store_lanes (local.get $ptr) (local.get $lo) (local.get $w))
        (call $store_lanes (i32.add (local.get $ptr) (i32.const 16)) (local.get $hi)
          (i32.sub (local.get $w) (i32.const 4))))))

  ;; C (m, n) int32 = A (m, k) int8 @ B (k, n) int8, with A packed by $pack_a at a and B by
  ;; $pack_b at bp (an odd K's last pair is (A[r, K-1], 0) against (B[K-1, c], 0)).
  (func $gemm_packed (param $a i32) (param $bp i32) (param $c i32)
                     (param $m i32) (param $k i32) (param $n i32)
    (local $kp i32) (local $rowb i32) (local $panel i32) (local $panels i32)
    (local $m0 i32) (local $last i32) (local $w i32) (local $j i32) (local $bptr i32)
    (local $a0 i32) (local $a1 i32) (local $a2 i32) (local $a3 i32) (local $cptr i32)
    (local $b0 v128) (local $b1 v128) (local $x v128)
    (local $c00 v128) (local $c01 v128) (local $c10 v128) (local $c11 v128)
    (local $c20 v128) (local $c21 v128) (local $c30 v128) (local $c31 v128)
    (local.set $kp (i32.shr_u (i32.add (local.get $k) (i32.const 1)) (i32.const 1)))
    (local.set $rowb (i32.shl (local.get $kp) (i32.const 2)))
    (local.set $panels (i32.shr_u (i32.add (local.get $n) (i32.const 7)) (i32.const 3)))
    (local.set $last (i32.sub (local.get $m) (i32.const 1)))
    (local.set $panel (i32.const 0))
    (block $panels_done
      (loop $panel_loop
        (br_if $panels_done (i32.ge_u (local.get $panel) (local.get $panels)))
        (local.set $w (i32.sub (local.get $n) (i32.shl (local.get $panel) (i32.const 3))))
        (local.set $m0 (i32.const 0))
        (block $rows_done
          (loop $row_loop
            (br_if $rows_done (i32.ge_u (local.get $m0) (local.get $m)))
            ;; rows past the last one repeat it (computed, never stored): no read past A
            (local.set $a0 (i32.add (local.get $a) (i32.mul (local.get $m0) (local.get $rowb))))
            (local.set $a1 (i32.add (local.get $a) (i32.mul (local.get $rowb)
              (select (i32.add (local.get $m0) (i32.const 1)) (local.get $last)
                (i32.lt_u (i32.add (local.get $m0) (i32.const 1)) (local.get $m))))))
            (local.set $a2 (i32.add (local.get $a) (i32.mul (local.get $rowb)
              (select (i32.add (local.get $m0) (i32.const 2)) (local.get $last)
                (i32.lt_u (i32.add (local.get $m0) (i32.const 2)) (local.get $m))))))
            (local.set $a3 (i32.add (local.get $a) (i32.mul (local.get $rowb)
              (select (i32.add (local.get $m0) (i32.const 3)) (local.get $last)
                (i32.lt_u (i32.add (local.get $m0) (i32.const 3)) (local.get $m))))))
            (local.set $c00 (v128.const i32x4 0 0 0 0)) (local.set $c01 (v128.const i32x4 0 0 0 0))
            (local.set $c10 (v128.const i32x4 0 0 0 0)) (local.set $c11 (v128.const i32x4 0 0 0 0))
            (local.set $c20 (v128.const i32x4 0 0 0 0)) (local.set $c21 (v128.const i32x4 0 0 0 0))
            (local.set $c30 (v128.const i32x4 0 0 0 0)) (local.set $c31 (v128.const i32x4 0 0 0 0))
            (local.set $bptr (i32.add (local.get $bp)
              (i32.shl (i32.mul (local.get $panel) (local.get $kp)) (i32.const 5))))
            (local.set $j (i32.const 0))
            (block $k_done
              (loop $k_loop
                (br_if $k_done (i32.ge_u (local.get $j) (local.get $kp)))
                (local.set $b0 (v128.load (local.get $bptr)))
                (local.set $b1 (v128.load offset=16 (local.get $bptr)))
                ;; (A[r, 2j], A[r, 2j+1]) as int16, repeated in all four int32 lanes (packed A)
                (local.set $x (v128.load32_splat (local.get $a0)))
                (local.set $c00 (i32x4.add (local.get $c00) (i32x4.dot_i16x8_s (local.get $x) (local.get $b0))))
                (local.set $c01 (i32x4.add (local.get $c01) (i32x4.dot_i16x8_s (local.get $x) (local.get $b1))))
                (local.set $x (v128.load32_splat (local.get $a1)))
                (local.set $c10 (i32x4.add (local.get $c10) (i32x4.dot_i16x8_s (local.get $x) (local.get $b0))))
                (local.set $c11 (i32x4.add (local.get $c11) (i32x4.dot_i16x8_s (local.get $x) (local.get $b1))))
                (local.set $x (v128.load32_splat (local.get $a2)))
                (local.set $c20 (i32x4.add (local.get $c20) (i32x4.dot_i16x8_s (local.get $x) (local.get $b0))))
                (local.set $c21 (i32x4.add (local.get $c21) (i32x4.dot_i16x8_s (local.get $x) (local.get $b1))))
                (local.set $x (v128.load32_splat (local.get $a3)))
                (local.set $c30 (i32x4.add (local.get $c30) (i32x4.dot_i16x8_s (local.get $x) (local.get $b0))))
                (local.set $c31 (i32x4.add (local.get $c31) (i32x4.dot_i16x8_s (local.get $x) (local.get $b1))))
                (local.set $a0 (i32.add (local.get $a0) (i32.const 4)))
                (local.set $a1 (i32.add (local.get $a1) (i32.const 4)))
                (local.set $a2 (i32.add (local.get $a2) (i32.const 4)))
                (local.set $a3 (i32.add (local.get $a3) (i32.const 4)))
                (local.set $bptr (i32.add (local.get $bptr) (i32.const 32)))
                (local.set $j (i32.add (local.get $j) (i32.const 1)))
                (br $k_loop)))
            ;; C[m0 + r, 8 panel ..], rows that exist only
            (local.set $cptr (i32.add (local.get $c) (i32.shl
              (i32.add (i32.mul (local.get $m0) (local.get $n)) (i32.shl (local.get $panel) (i32.const 3)))
              (i32.const 2))))
            (call $store_row (local.get $cptr) (local.get $c00) (local.get $c01) (local.get $w))
            (if (i32.lt_u (i32.add (local.get $m0) (i32.const 1)) (local.get $m))
              (then
                (local.set $cptr (i32.add (local.get $cptr) (i32.shl (local.get $n) (i32.const 2))))
                (call $store_row (local.get $cptr) (local.get $c10) (local.get $c11) (local.get $w))))
            (if (i32.lt_u (i32.add (local.get $m0) (i32.const 2)) (local.get $m))
              (then
                (local.set $cptr (i32.add (local.get $cptr) (i32.shl (local.get $n) (i32.const 2))))
                (call $store_row (local.get $cptr) (local.get $c20) (local.get $c21) (local.get $w))))
            (if (i32.lt_u (i32.add (local.get $m0) (i32.const 3)) (local.get $m))
              (then
                (local.set $cptr (i32.add (local.get $cptr) (i32.shl (local.get $n) (i32.const 2))))
                (call $store_row (local.get $cptr) (local.get $c30) (local.get $c31) (local.get $w))))
            (local.set $m0 (i32.add (local.get $m0) (i32.const 4)))
            (br $row_loop)))
        (local.set $panel (i32.add (local.get $panel) (i32.const 1)))
        (br $panel_loop)))
  )

  ;; C[i] (m, n) int32 = A[i] (m, k) int8 @ B[i] (k, n) int8 for i < batch, all contiguous;
  ;; scratch holds one packed B (NP * KP * 32 bytes) then one packed A (M * KP * 4 bytes),
  ;; reused for every i. m, k, n >= 1.
  (func (export "daisychain_gemm_i8")
        (param $a i32) (param $b i32) (param $c i32) (param $scratch i32)
        (param $batch i32) (param $m i32) (param $k i32) (param $n i32)
    (local $i i32) (local $ap i32)
    (local.set $ap (i32.add (local.get $scratch) (i32.shl
      (i32.mul (i32.shr_u (i32.add (local.get $n) (i32.const 7)) (i32.const 3))
               (i32.shr_u (i32.add (local.get $k) (i32.const 1)) (i32.const 1)))
      (i32.const 5))))
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $batch)))
        (call $pack_b (local.get $b) (local.get $k) (local.get $n) (local.get $scratch))
        (call $pack_a (local.get $a) (local.get $m) (local.get $k) (local.get $ap))
        (call $gemm_packed (local.get $ap) (local.get $scratch) (local.get $c)
          (local.get $m) (local.get $k) (local.get $n))
        (local.set $a (i32.add (local.get $a) (i32.mul (local.get $m) (local.get $k))))
        (local.set $b (i32.add (local.get $b) (i32.mul (local.get $k) (local.get $n))))
        (local.set $c (i32.add (local.get $c) (i32.shl (i32.mul (local.get $m) (local.get $n))
          (i32.const 2))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))
  )
)
