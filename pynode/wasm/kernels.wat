;; The step's hot non-GEMM kernels in WebAssembly SIMD (128-bit), for the page.
;;
;; Built into kernels.wasm (checked in beside this file) by `python -m server.wasm_build
;; build`; tests/server/test_wasm_build.py rebuilds it and compares the bytes. Loaded like
;; gemm_i8.wasm: it imports Pyodide's own linear memory (env.memory) and works in place on
;; numpy's buffers (pynode/browser_kernels.py passes their addresses).
;;
;; Each kernel performs, element by element, the IEEE operations of the numpy reference in
;; pynode/core (quant.py, fastmath.py, detmath.psum) in the reference's order (the product
;; check excepted: its arithmetic is exact in any order; see its section), so it gives
;; the reference's bits: wasm float arithmetic is IEEE-754 binary32/binary64 with
;; round-to-nearest-even and never fuses a multiply and an add (relaxed SIMD, which may, is
;; not used); f32x4.nearest is rint (ties to even), 2**k is built from its exponent bits as
;; the reference does, and every float constant is the reference's own, written in hex
;; (each named in a comment; tests/server/test_wasm_build.py checks them against fastmath).
;; A kernel that meets a NaN or an Inf in its input (or a NaN it would have to return)
;; returns 0 and the caller runs the reference instead, so special values and refusals stay
;; the reference's own; the row sums alone take every input (their adds are the reference's
;; and a NaN sum is written as its canonical NaN). Every output element is written; no
;; state is kept between calls.
;;
;; All arrays are contiguous and row-major. Legend: R rows, C columns, B batch, n elements
;; of a row; f32/f64 float32/float64, i8 int8, u16 random lanes, u8 bool mask bytes.
(module
  ;; Emscripten dylink.0: memory size, memory alignment, table size, table alignment, all 0.
  (@custom "dylink.0" "\01\04\00\00\00\00")
  (import "env" "memory" (memory 0))

  ;; ------------------------------------------------------------- lanes and tails

  ;; The first `count` 32-bit values at p (all four when count >= 4), zeros after them; never
  ;; reads past them.
  (func $load32_n (param $p i32) (param $count i32) (result v128)
    (local $v v128)
    (if (i32.ge_u (local.get $count) (i32.const 4))
      (then (return (v128.load (local.get $p)))))
    (if (i32.gt_u (local.get $count) (i32.const 0))
      (then (local.set $v (v128.load32_lane 0 (local.get $p) (local.get $v)))))
    (if (i32.gt_u (local.get $count) (i32.const 1))
      (then (local.set $v (v128.load32_lane offset=4 1 (local.get $p) (local.get $v)))))
    (if (i32.gt_u (local.get $count) (i32.const 2))
      (then (local.set $v (v128.load32_lane offset=8 2 (local.get $p) (local.get $v)))))
    (local.get $v))

  ;; Store the first `count` (all four when count >= 4) 32-bit lanes of v at p.
  (func $store32_n (param $p i32) (param $v v128) (param $count i32)
    (if (i32.ge_u (local.get $count) (i32.const 4))
      (then (v128.store (local.get $p) (local.get $v)) (return)))
    (if (i32.gt_u (local.get $count) (i32.const 0))
      (then (v128.store32_lane 0 (local.get $p) (local.get $v))))
    (if (i32.gt_u (local.get $count) (i32.const 1))
      (then (v128.store32_lane offset=4 1 (local.get $p) (local.get $v))))
    (if (i32.gt_u (local.get $count) (i32.const 2))
      (then (v128.store32_lane offset=8 2 (local.get $p) (local.get $v)))))

  ;; The first `count` u16 at p (all four when count >= 4) as i32x4, zeros after them.
  (func $load_u16_n (param $p i32) (param $count i32) (result v128)
    (local $v v128)
    (if (i32.ge_u (local.get $count) (i32.const 4))
      (then (return (i32x4.extend_low_i16x8_u (v128.load64_zero (local.get $p))))))
    (if (i32.gt_u (local.get $count) (i32.const 0))
      (then (local.set $v (v128.load16_lane 0 (local.get $p) (local.get $v)))))
    (if (i32.gt_u (local.get $count) (i32.const 1))
      (then (local.set $v (v128.load16_lane offset=2 1 (local.get $p) (local.get $v)))))
    (if (i32.gt_u (local.get $count) (i32.const 2))
      (then (local.set $v (v128.load16_lane offset=4 2 (local.get $p) (local.get $v)))))
    (i32x4.extend_low_i16x8_u (local.get $v)))

  ;; The first `count` mask bytes at p (all four when count >= 4) as i32x4 lanes: all ones
  ;; where the byte is nonzero; lanes past count are clear.
  (func $load_mask_n (param $p i32) (param $count i32) (result v128)
    (local $v v128)
    (if (i32.ge_u (local.get $count) (i32.const 4))
      (then (local.set $v (v128.load32_zero (local.get $p))))
      (else
        (if (i32.gt_u (local.get $count) (i32.const 0))
          (then (local.set $v (v128.load8_lane 0 (local.get $p) (local.get $v)))))
        (if (i32.gt_u (local.get $count) (i32.const 1))
          (then (local.set $v (v128.load8_lane offset=1 1 (local.get $p) (local.get $v)))))
        (if (i32.gt_u (local.get $count) (i32.const 2))
          (then (local.set $v (v128.load8_lane offset=2 2 (local.get $p) (local.get $v)))))))
    (i32x4.ne (i32x4.extend_low_i16x8_u (i16x8.extend_low_i8x16_u (local.get $v)))
              (v128.const i32x4 0 0 0 0)))

  ;; Lanes below `count` all ones, the rest clear.
  (func $lanes_below (param $count i32) (result v128)
    (i32x4.gt_s (i32x4.splat (local.get $count)) (v128.const i32x4 0 1 2 3)))

  ;; Store the first `count` (all four when count >= 4) i32 lanes of v, each in -127..127,
  ;; as int8 at p.
  (func $store_i8_n (param $p i32) (param $v v128) (param $count i32)
    (local.set $v (i16x8.narrow_i32x4_s (local.get $v) (local.get $v)))
    (local.set $v (i8x16.narrow_i16x8_s (local.get $v) (local.get $v)))
    (if (i32.ge_u (local.get $count) (i32.const 4))
      (then (v128.store32_lane 0 (local.get $p) (local.get $v)) (return)))
    (if (i32.gt_u (local.get $count) (i32.const 0))
      (then (v128.store8_lane 0 (local.get $p) (local.get $v))))
    (if (i32.gt_u (local.get $count) (i32.const 1))
      (then (v128.store8_lane offset=1 1 (local.get $p) (local.get $v))))
    (if (i32.gt_u (local.get $count) (i32.const 2))
      (then (v128.store8_lane offset=2 2 (local.get $p) (local.get $v)))))

  ;; The largest of the four unsigned i32 lanes of v.
  (func $hmax_u (param $v v128) (result i32)
    (local.set $v (i32x4.max_u (local.get $v)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $v) (local.get $v))))
    (local.set $v (i32x4.max_u (local.get $v)
      (i8x16.shuffle 4 5 6 7 0 1 2 3 12 13 14 15 8 9 10 11 (local.get $v) (local.get $v))))
    (i32x4.extract_lane 0 (local.get $v)))

  ;; The largest of the four f32 lanes of v (no NaN in v; which zero is kept does not matter).
  (func $hmax_f32 (param $v v128) (result f32)
    (local.set $v (f32x4.max (local.get $v)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $v) (local.get $v))))
    (local.set $v (f32x4.max (local.get $v)
      (i8x16.shuffle 4 5 6 7 0 1 2 3 12 13 14 15 8 9 10 11 (local.get $v) (local.get $v))))
    (f32x4.extract_lane 0 (local.get $v)))

  ;; max over count f32 at p of their bit patterns with the sign cleared: monotone in |x| for
  ;; finite values and at least 0x7F800000 exactly when one is an Inf or a NaN.
  (func $absmax_bits (param $p i32) (param $count i32) (result i32)
    (local $m v128) (local $j i32)
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $count)))
        (local.set $m (i32x4.max_u (local.get $m) (v128.and
          (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))))
          (v128.const i32x4 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF))))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $each)))
    (local.set $m (i32x4.max_u (local.get $m) (v128.and
      (call $load32_n (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))
                      (i32.sub (local.get $count) (local.get $j)))
      (v128.const i32x4 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF))))
    (call $hmax_u (local.get $m)))

  ;; ------------------------------------------------------------- quantize (quant.py)

  ;; quant._scales of one finite absmax: amax / 127, 1 for an all-zero row, the smallest
  ;; subnormal where the quotient underflows to 0.
  (func $scale_of (param $amax f32) (result f32)
    (local $s f32)
    (local.set $s (f32.div (local.get $amax) (f32.const 127)))
    (if (f32.eq (local.get $amax) (f32.const 0)) (then (return (f32.const 1))))
    (if (f32.eq (local.get $s) (f32.const 0)) (then (return (f32.const 0x1p-149))))
    (local.get $s))

  ;; Clips use pmin/pmax (`b < a ? b : a`, one instruction each on x64; V8 emulates the
  ;; NaN and signed-zero rules of min/max): t is never a NaN, and a bound is never a zero, so
  ;; both give the same values.
  ;; Four int8 values (as i32x4) of t = x / s: clip to [-127, 127], then rint (stochastic = 0)
  ;; or floor(t + u) with u = lane * 2**-16 for the u16 lanes in `u` (as i32x4). A lane is
  ;; below 2**16, so the signed conversion (one instruction; V8 emulates the unsigned one)
  ;; gives its exact value too.
  (func $round4 (param $t v128) (param $u v128) (param $stochastic i32) (result v128)
    (local.set $t (f32x4.pmin (f32x4.pmax (local.get $t) (v128.const f32x4 -127 -127 -127 -127))
                             (v128.const f32x4 127 127 127 127)))
    (if (local.get $stochastic)
      (then (local.set $t (f32x4.floor (f32x4.add (local.get $t)
              (f32x4.mul (f32x4.convert_i32x4_s (local.get $u))
                         (v128.const f32x4 0x1p-16 0x1p-16 0x1p-16 0x1p-16))))))
      (else (local.set $t (f32x4.nearest (local.get $t)))))
    (i32x4.trunc_sat_f32x4_s (local.get $t)))

  ;; $round_span's round-to-nearest groups of eight: the same operations on two vectors a
  ;; step, stored as eight int8 at once. Returns how many elements it rounded.
  (func $round_span_rint8 (param $x i32) (param $q i32) (param $s i32) (param $per_col i32)
                          (param $count i32) (result i32)
    (local $j i32) (local $d0 v128) (local $d1 v128) (local $t0 v128) (local $t1 v128)
    (local $at i32)
    (local.set $d0 (v128.load32_splat (local.get $s)))
    (local.set $d1 (local.get $d0))
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $count)))
        (local.set $at (i32.shl (local.get $j) (i32.const 2)))
        (if (local.get $per_col)
          (then (local.set $d0 (v128.load (i32.add (local.get $s) (local.get $at))))
                (local.set $d1 (v128.load offset=16 (i32.add (local.get $s) (local.get $at))))))
        (local.set $t0 (f32x4.div (v128.load (i32.add (local.get $x) (local.get $at))) (local.get $d0)))
        (local.set $t1 (f32x4.div (v128.load offset=16 (i32.add (local.get $x) (local.get $at)))
                                  (local.get $d1)))
        (local.set $t0 (f32x4.nearest (f32x4.pmin (f32x4.pmax (local.get $t0)
          (v128.const f32x4 -127 -127 -127 -127)) (v128.const f32x4 127 127 127 127))))
        (local.set $t1 (f32x4.nearest (f32x4.pmin (f32x4.pmax (local.get $t1)
          (v128.const f32x4 -127 -127 -127 -127)) (v128.const f32x4 127 127 127 127))))
        (local.set $t0 (i16x8.narrow_i32x4_s (i32x4.trunc_sat_f32x4_s (local.get $t0))
                                             (i32x4.trunc_sat_f32x4_s (local.get $t1))))
        (v128.store64_lane 0 (i32.add (local.get $q) (local.get $j))
          (i8x16.narrow_i16x8_s (local.get $t0) (local.get $t0)))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (local.get $j))

  ;; $round_span's stochastic groups of eight: floor(clip(x / s) + lane * 2**-16), two
  ;; vectors a step (eight u16 lanes in one load). Returns how many elements it rounded.
  (func $round_span_sto8 (param $x i32) (param $q i32) (param $lanes i32) (param $s i32)
                         (param $per_col i32) (param $count i32) (result i32)
    (local $j i32) (local $d0 v128) (local $d1 v128) (local $t0 v128) (local $t1 v128)
    (local $u v128) (local $at i32)
    (local.set $d0 (v128.load32_splat (local.get $s)))
    (local.set $d1 (local.get $d0))
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $count)))
        (local.set $at (i32.shl (local.get $j) (i32.const 2)))
        (if (local.get $per_col)
          (then (local.set $d0 (v128.load (i32.add (local.get $s) (local.get $at))))
                (local.set $d1 (v128.load offset=16 (i32.add (local.get $s) (local.get $at))))))
        (local.set $t0 (f32x4.div (v128.load (i32.add (local.get $x) (local.get $at))) (local.get $d0)))
        (local.set $t1 (f32x4.div (v128.load offset=16 (i32.add (local.get $x) (local.get $at)))
                                  (local.get $d1)))
        (local.set $u (v128.load (i32.add (local.get $lanes) (i32.shl (local.get $j) (i32.const 1)))))
        (local.set $t0 (f32x4.floor (f32x4.add
          (f32x4.pmin (f32x4.pmax (local.get $t0) (v128.const f32x4 -127 -127 -127 -127))
                     (v128.const f32x4 127 127 127 127))
          (f32x4.mul (f32x4.convert_i32x4_s (i32x4.extend_low_i16x8_u (local.get $u)))
                     (v128.const f32x4 0x1p-16 0x1p-16 0x1p-16 0x1p-16)))))
        (local.set $t1 (f32x4.floor (f32x4.add
          (f32x4.pmin (f32x4.pmax (local.get $t1) (v128.const f32x4 -127 -127 -127 -127))
                     (v128.const f32x4 127 127 127 127))
          (f32x4.mul (f32x4.convert_i32x4_s (i32x4.extend_high_i16x8_u (local.get $u)))
                     (v128.const f32x4 0x1p-16 0x1p-16 0x1p-16 0x1p-16)))))
        (local.set $t0 (i16x8.narrow_i32x4_s (i32x4.trunc_sat_f32x4_s (local.get $t0))
                                             (i32x4.trunc_sat_f32x4_s (local.get $t1))))
        (v128.store64_lane 0 (i32.add (local.get $q) (local.get $j))
          (i8x16.narrow_i16x8_s (local.get $t0) (local.get $t0)))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (local.get $j))

  ;; q (count,) i8 of x (count,) f32 divided by the scales at s: one scale splat (per_col = 0)
  ;; or one per element (per_col = 1); lanes: the u16 lanes (count,), or 0 for rint. Whole
  ;; groups of four inline; the last partial group through $round4.
  (func $round_span (param $x i32) (param $q i32) (param $lanes i32) (param $s i32)
                    (param $per_col i32) (param $count i32)
    (local $j i32) (local $left i32) (local $d v128) (local $u v128) (local $t v128)
    (local $sto i32)
    (local.set $sto (i32.ne (local.get $lanes) (i32.const 0)))
    (local.set $d (v128.load32_splat (local.get $s)))
    (if (i32.eqz (local.get $sto))
      (then (local.set $j (call $round_span_rint8 (local.get $x) (local.get $q) (local.get $s)
                                                   (local.get $per_col) (local.get $count))))
      (else (local.set $j (call $round_span_sto8 (local.get $x) (local.get $q) (local.get $lanes)
                                                 (local.get $s) (local.get $per_col)
                                                 (local.get $count)))))
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $count)))
        (if (local.get $per_col)
          (then (local.set $d (v128.load (i32.add (local.get $s) (i32.shl (local.get $j) (i32.const 2)))))))
        (local.set $t (f32x4.div (v128.load (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2))))
                                 (local.get $d)))
        (local.set $t (f32x4.pmin (f32x4.pmax (local.get $t) (v128.const f32x4 -127 -127 -127 -127))
                                 (v128.const f32x4 127 127 127 127)))
        (if (local.get $sto)
          (then (local.set $t (f32x4.floor (f32x4.add (local.get $t)
                  (f32x4.mul (f32x4.convert_i32x4_s (i32x4.extend_low_i16x8_u (v128.load64_zero
                               (i32.add (local.get $lanes) (i32.shl (local.get $j) (i32.const 1))))))
                             (v128.const f32x4 0x1p-16 0x1p-16 0x1p-16 0x1p-16))))))
          (else (local.set $t (f32x4.nearest (local.get $t)))))
        (local.set $t (i32x4.trunc_sat_f32x4_s (local.get $t)))
        (local.set $t (i16x8.narrow_i32x4_s (local.get $t) (local.get $t)))
        (v128.store32_lane 0 (i32.add (local.get $q) (local.get $j))
          (i8x16.narrow_i16x8_s (local.get $t) (local.get $t)))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $each)))
    (local.set $left (i32.sub (local.get $count) (local.get $j)))
    (if (i32.eqz (local.get $left)) (then (return)))
    (if (local.get $per_col)
      (then (local.set $d (call $load32_n
        (i32.add (local.get $s) (i32.shl (local.get $j) (i32.const 2))) (local.get $left)))))
    (if (local.get $sto)
      (then (local.set $u (call $load_u16_n
        (i32.add (local.get $lanes) (i32.shl (local.get $j) (i32.const 1))) (local.get $left)))))
    (call $store_i8_n (i32.add (local.get $q) (local.get $j))
      (call $round4
        (f32x4.div (call $load32_n (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2)))
                                   (local.get $left))
                   (local.get $d))
        (local.get $u) (local.get $sto))
      (local.get $left)))

  ;; quant.quantize_rows / quantize_rows_stochastic: x (R, C) f32 -> q (R, C) i8, scale (R,)
  ;; f32; lanes: (R, C) u16 random lanes, or 0 for round-to-nearest. 0 if x holds a NaN or
  ;; an Inf.
  (func (export "daisychain_quantize_rows")
        (param $x i32) (param $q i32) (param $scale i32) (param $lanes i32)
        (param $rows i32) (param $cols i32) (result i32)
    (local $i i32) (local $m i32)
    (block $done
      (loop $row
        (br_if $done (i32.ge_u (local.get $i) (local.get $rows)))
        (local.set $m (call $absmax_bits (local.get $x) (local.get $cols)))
        (if (i32.ge_u (local.get $m) (i32.const 0x7F800000)) (then (return (i32.const 0))))
        (f32.store (local.get $scale) (call $scale_of (f32.reinterpret_i32 (local.get $m))))
        (call $round_span (local.get $x) (local.get $q) (local.get $lanes) (local.get $scale)
          (i32.const 0) (local.get $cols))
        (local.set $x (i32.add (local.get $x) (i32.shl (local.get $cols) (i32.const 2))))
        (local.set $q (i32.add (local.get $q) (local.get $cols)))
        (if (local.get $lanes)
          (then (local.set $lanes (i32.add (local.get $lanes) (i32.shl (local.get $cols) (i32.const 1))))))
        (local.set $scale (i32.add (local.get $scale) (i32.const 4)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $row)))
    (i32.const 1))

  ;; quant.quantize_cols / quantize_cols_stochastic: x (B, R, C) f32 -> q (B, R, C) i8,
  ;; scale (B, C) f32 (first used for the absmax bit patterns); lanes as above, (B, R, C).
  (func (export "daisychain_quantize_cols")
        (param $x i32) (param $q i32) (param $scale i32) (param $lanes i32)
        (param $batch i32) (param $rows i32) (param $cols i32) (result i32)
    (local $b i32) (local $i i32) (local $j i32) (local $p i32) (local $at i32) (local $left i32)
    (local $m i32) (local $row_bytes i32)
    (local.set $row_bytes (i32.shl (local.get $cols) (i32.const 2)))
    (block $batches_done
      (loop $batch_loop
        (br_if $batches_done (i32.ge_u (local.get $b) (local.get $batch)))
        ;; column absmax bit patterns, accumulated in scale
        (memory.fill (local.get $scale) (i32.const 0) (local.get $row_bytes))
        (local.set $p (local.get $x))
        (local.set $i (i32.const 0))
        (block $rows_done
          (loop $row
            (br_if $rows_done (i32.ge_u (local.get $i) (local.get $rows)))
            (local.set $j (i32.const 0))
            (block $cols_done
              (loop $col
                (br_if $cols_done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $cols)))
                (local.set $at (i32.add (local.get $scale) (i32.shl (local.get $j) (i32.const 2))))
                (v128.store (local.get $at)
                  (i32x4.max_u (v128.load (local.get $at))
                    (v128.and (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))))
                              (v128.const i32x4 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF))))
                (local.set $j (i32.add (local.get $j) (i32.const 4)))
                (br $col)))
            (local.set $left (i32.sub (local.get $cols) (local.get $j)))
            (if (local.get $left)
              (then
                (local.set $at (i32.add (local.get $scale) (i32.shl (local.get $j) (i32.const 2))))
                (call $store32_n (local.get $at)
                  (i32x4.max_u (call $load32_n (local.get $at) (local.get $left))
                    (v128.and
                      (call $load32_n (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))
                                      (local.get $left))
                      (v128.const i32x4 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF)))
                  (local.get $left))))
            (local.set $p (i32.add (local.get $p) (local.get $row_bytes)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $row)))
        ;; absmax -> scale, refusing non-finite columns
        (local.set $j (i32.const 0))
        (block $scales_done
          (loop $each
            (br_if $scales_done (i32.ge_u (local.get $j) (local.get $cols)))
            (local.set $at (i32.add (local.get $scale) (i32.shl (local.get $j) (i32.const 2))))
            (local.set $m (i32.load (local.get $at)))
            (if (i32.ge_u (local.get $m) (i32.const 0x7F800000)) (then (return (i32.const 0))))
            (f32.store (local.get $at) (call $scale_of (f32.reinterpret_i32 (local.get $m))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $each)))
        ;; round each row by the column scales
        (local.set $i (i32.const 0))
        (block $rounded
          (loop $row
            (br_if $rounded (i32.ge_u (local.get $i) (local.get $rows)))
            (call $round_span (local.get $x) (local.get $q) (local.get $lanes) (local.get $scale)
              (i32.const 1) (local.get $cols))
            (local.set $x (i32.add (local.get $x) (local.get $row_bytes)))
            (local.set $q (i32.add (local.get $q) (local.get $cols)))
            (if (local.get $lanes)
              (then (local.set $lanes (i32.add (local.get $lanes) (i32.shl (local.get $cols) (i32.const 1))))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $row)))
        (local.set $scale (i32.add (local.get $scale) (local.get $row_bytes)))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br $batch_loop)))
    (i32.const 1))

  ;; ------------------------------------------------------------- epilogue (quant.py)

  ;; quant.epilogue: out (B, R, C) f32 = (float32(acc) * sa[b, r]) * sb[b, c], acc (B, R, C)
  ;; i32, sa (B, R) f32, sb (B, C) f32. 0 if a scale is NaN or Inf or a result is NaN.
  (func (export "daisychain_epilogue")
        (param $acc i32) (param $sa i32) (param $sb i32) (param $out i32)
        (param $batch i32) (param $rows i32) (param $cols i32) (result i32)
    (local $b i32) (local $i i32) (local $j i32) (local $left i32) (local $off i32)
    (local $a v128) (local $y v128) (local $nan v128)
    (block $batches_done
      (loop $batch_loop
        (br_if $batches_done (i32.ge_u (local.get $b) (local.get $batch)))
        (if (i32.ge_u (call $absmax_bits (local.get $sb) (local.get $cols)) (i32.const 0x7F800000))
          (then (return (i32.const 0))))
        (local.set $i (i32.const 0))
        (block $rows_done
          (loop $row
            (br_if $rows_done (i32.ge_u (local.get $i) (local.get $rows)))
            (if (i32.ge_u (i32.and (i32.load (local.get $sa)) (i32.const 0x7FFFFFFF)) (i32.const 0x7F800000))
              (then (return (i32.const 0))))
            (local.set $a (v128.load32_splat (local.get $sa)))
            (local.set $j (i32.const 0))
            (block $cols_done
              (loop $col
                (br_if $cols_done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $cols)))
                (local.set $off (i32.shl (local.get $j) (i32.const 2)))
                (local.set $y (f32x4.mul
                  (f32x4.mul (f32x4.convert_i32x4_s (v128.load (i32.add (local.get $acc) (local.get $off))))
                             (local.get $a))
                  (v128.load (i32.add (local.get $sb) (local.get $off)))))
                (local.set $nan (v128.or (local.get $nan) (f32x4.ne (local.get $y) (local.get $y))))
                (v128.store (i32.add (local.get $out) (local.get $off)) (local.get $y))
                (local.set $j (i32.add (local.get $j) (i32.const 4)))
                (br $col)))
            (local.set $left (i32.sub (local.get $cols) (local.get $j)))
            (if (local.get $left)
              (then
                (local.set $off (i32.shl (local.get $j) (i32.const 2)))
                (local.set $y (f32x4.mul
                  (f32x4.mul (f32x4.convert_i32x4_s
                               (call $load32_n (i32.add (local.get $acc) (local.get $off)) (local.get $left)))
                             (local.get $a))
                  (call $load32_n (i32.add (local.get $sb) (local.get $off)) (local.get $left))))
                (local.set $nan (v128.or (local.get $nan) (f32x4.ne (local.get $y) (local.get $y))))
                (call $store32_n (i32.add (local.get $out) (local.get $off)) (local.get $y) (local.get $left))))
            (local.set $off (i32.shl (local.get $cols) (i32.const 2)))
            (local.set $acc (i32.add (local.get $acc) (local.get $off)))
            (local.set $out (i32.add (local.get $out) (local.get $off)))
            (local.set $sa (i32.add (local.get $sa) (i32.const 4)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $row)))
        (local.set $sb (i32.add (local.get $sb) (i32.shl (local.get $cols) (i32.const 2))))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br $batch_loop)))
    (i32.eqz (v128.any_true (local.get $nan))))

  ;; ------------------------------------------------------------- exp, GELU (fastmath.py)

  ;; fastmath._exp_neg of four f64 y, two per vector (finite, y <= 0 where the result is used):
  ;; y floored at _EXP_FLOOR, k = rint(y / ln 2), r = y - k ln2_hi - k ln2_lo, Taylor to
  ;; r**8 / 8! (Horner, innermost first), times 2**k from its exponent bits. The two vectors
  ;; go through each step side by side, so their dependency chains overlap.
  (func $exp_neg4 (param $y0 v128) (param $y1 v128) (result v128 v128)
    (local $k0 v128) (local $k1 v128) (local $r0 v128) (local $r1 v128)
    (local $a0 v128) (local $a1 v128)
    ;; pmax (one instruction): y is never a NaN here (-inf at worst) and the floor not a zero
    (local.set $y0 (f64x2.pmax (local.get $y0) (v128.const f64x2 -0x1.b8p+6 -0x1.b8p+6)))  ;; _EXP_FLOOR
    (local.set $y1 (f64x2.pmax (local.get $y1) (v128.const f64x2 -0x1.b8p+6 -0x1.b8p+6)))  ;; _EXP_FLOOR
    (local.set $k0 (f64x2.nearest (f64x2.mul (local.get $y0)
      (v128.const f64x2 0x1.71547652b82fep+0 0x1.71547652b82fep+0))))  ;; _INV_LN2
    (local.set $k1 (f64x2.nearest (f64x2.mul (local.get $y1)
      (v128.const f64x2 0x1.71547652b82fep+0 0x1.71547652b82fep+0))))  ;; _INV_LN2
    (local.set $r0 (f64x2.sub (local.get $y0) (f64x2.mul (local.get $k0)
      (v128.const f64x2 0x1.62e42feep-1 0x1.62e42feep-1))))  ;; _LN2_HI
    (local.set $r1 (f64x2.sub (local.get $y1) (f64x2.mul (local.get $k1)
      (v128.const f64x2 0x1.62e42feep-1 0x1.62e42feep-1))))  ;; _LN2_HI
    (local.set $r0 (f64x2.sub (local.get $r0) (f64x2.mul (local.get $k0)
      (v128.const f64x2 0x1.a39ef35793c76p-33 0x1.a39ef35793c76p-33))))  ;; _LN2_LO
    (local.set $r1 (f64x2.sub (local.get $r1) (f64x2.mul (local.get $k1)
      (v128.const f64x2 0x1.a39ef35793c76p-33 0x1.a39ef35793c76p-33))))  ;; _LN2_LO
    (local.set $a0 (f64x2.mul (local.get $r0) (v128.const f64x2 0x1.a01a01a01a01ap-16 0x1.a01a01a01a01ap-16)))  ;; _EXP_TAYLOR[8]
    (local.set $a1 (f64x2.mul (local.get $r1) (v128.const f64x2 0x1.a01a01a01a01ap-16 0x1.a01a01a01a01ap-16)))  ;; _EXP_TAYLOR[8]
    (local.set $a0 (f64x2.add (local.get $a0) (v128.const f64x2 0x1.a01a01a01a01ap-13 0x1.a01a01a01a01ap-13)))  ;; _EXP_TAYLOR[7]
    (local.set $a1 (f64x2.add (local.get $a1) (v128.const f64x2 0x1.a01a01a01a01ap-13 0x1.a01a01a01a01ap-13)))  ;; _EXP_TAYLOR[7]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1.6c16c16c16c17p-10 0x1.6c16c16c16c17p-10)))  ;; _EXP_TAYLOR[6]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1.6c16c16c16c17p-10 0x1.6c16c16c16c17p-10)))  ;; _EXP_TAYLOR[6]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1.1111111111111p-7 0x1.1111111111111p-7)))  ;; _EXP_TAYLOR[5]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1.1111111111111p-7 0x1.1111111111111p-7)))  ;; _EXP_TAYLOR[5]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1.5555555555555p-5 0x1.5555555555555p-5)))  ;; _EXP_TAYLOR[4]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1.5555555555555p-5 0x1.5555555555555p-5)))  ;; _EXP_TAYLOR[4]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1.5555555555555p-3 0x1.5555555555555p-3)))  ;; _EXP_TAYLOR[3]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1.5555555555555p-3 0x1.5555555555555p-3)))  ;; _EXP_TAYLOR[3]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1p-1 0x1p-1)))  ;; _EXP_TAYLOR[2]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1p-1 0x1p-1)))  ;; _EXP_TAYLOR[2]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1p+0 0x1p+0)))  ;; _EXP_TAYLOR[1]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1p+0 0x1p+0)))  ;; _EXP_TAYLOR[1]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $r0))
      (v128.const f64x2 0x1p+0 0x1p+0)))  ;; _EXP_TAYLOR[0]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $r1))
      (v128.const f64x2 0x1p+0 0x1p+0)))  ;; _EXP_TAYLOR[0]
    ;; 2**k = (k + 1023) << 52 as f64 bits; k >= -159 here, a normal number
    (f64x2.mul (local.get $a0)
      (i64x2.shl (i64x2.add (i64x2.extend_low_i32x4_s (i32x4.trunc_sat_f64x2_s_zero (local.get $k0)))
                            (v128.const i64x2 1023 1023))
                 (i32.const 52)))
    (f64x2.mul (local.get $a1)
      (i64x2.shl (i64x2.add (i64x2.extend_low_i32x4_s (i32x4.trunc_sat_f64x2_s_zero (local.get $k1)))
                            (v128.const i64x2 1023 1023))
                 (i32.const 52))))

  ;; fastmath._gelu_chunk of four finite f64 v, two per vector: gelu(v0), gelu'(v0), gelu(v1),
  ;; gelu'(v1), the two vectors side by side.
  (func $gelu4 (param $v0 v128) (param $v1 v128) (result v128 v128 v128 v128)
    (local $e0 v128) (local $e1 v128) (local $t0 v128) (local $t1 v128)
    (local $a0 v128) (local $a1 v128) (local $c0 v128) (local $c1 v128)
    (call $exp_neg4
      (f64x2.mul (f64x2.mul (local.get $v0) (local.get $v0)) (v128.const f64x2 -0.5 -0.5))
      (f64x2.mul (f64x2.mul (local.get $v1) (local.get $v1)) (v128.const f64x2 -0.5 -0.5)))
    (local.set $e1)
    (local.set $e0)
    (local.set $t0 (f64x2.mul (f64x2.mul (f64x2.abs (local.get $v0))
      (v128.const f64x2 0x1.6a09e667f3bcdp-1 0x1.6a09e667f3bcdp-1))  ;; _SQRT1_2
      (v128.const f64x2 0x1.999999999999ap-2 0x1.999999999999ap-2)))  ;; _ERFCX_P
    (local.set $t1 (f64x2.mul (f64x2.mul (f64x2.abs (local.get $v1))
      (v128.const f64x2 0x1.6a09e667f3bcdp-1 0x1.6a09e667f3bcdp-1))  ;; _SQRT1_2
      (v128.const f64x2 0x1.999999999999ap-2 0x1.999999999999ap-2)))  ;; _ERFCX_P
    (local.set $t0 (f64x2.add (local.get $t0) (v128.const f64x2 1 1)))
    (local.set $t1 (f64x2.add (local.get $t1) (v128.const f64x2 1 1)))
    (local.set $t0 (f64x2.div (v128.const f64x2 1 1) (local.get $t0)))
    (local.set $t1 (f64x2.div (v128.const f64x2 1 1) (local.get $t1)))
    (local.set $t0 (f64x2.sub (local.get $t0)
      (v128.const f64x2 0x1.26c9b26c9b26cp-1 0x1.26c9b26c9b26cp-1)))  ;; _ERFCX_T0
    (local.set $t1 (f64x2.sub (local.get $t1)
      (v128.const f64x2 0x1.26c9b26c9b26cp-1 0x1.26c9b26c9b26cp-1)))  ;; _ERFCX_T0
    (local.set $a0 (f64x2.mul (local.get $t0) (v128.const f64x2 -0x1.0d27a9538a79p-5 -0x1.0d27a9538a79p-5)))  ;; _ERFCX[10]
    (local.set $a1 (f64x2.mul (local.get $t1) (v128.const f64x2 -0x1.0d27a9538a79p-5 -0x1.0d27a9538a79p-5)))  ;; _ERFCX[10]
    (local.set $a0 (f64x2.add (local.get $a0) (v128.const f64x2 0x1.c7d4044e35f15p-6 0x1.c7d4044e35f15p-6)))  ;; _ERFCX[9]
    (local.set $a1 (f64x2.add (local.get $a1) (v128.const f64x2 0x1.c7d4044e35f15p-6 0x1.c7d4044e35f15p-6)))  ;; _ERFCX[9]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.6484330280439p-4 0x1.6484330280439p-4)))  ;; _ERFCX[8]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.6484330280439p-4 0x1.6484330280439p-4)))  ;; _ERFCX[8]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 -0x1.09d168266b6adp-4 -0x1.09d168266b6adp-4)))  ;; _ERFCX[7]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 -0x1.09d168266b6adp-4 -0x1.09d168266b6adp-4)))  ;; _ERFCX[7]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 -0x1.bb498b3faad23p-3 -0x1.bb498b3faad23p-3)))  ;; _ERFCX[6]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 -0x1.bb498b3faad23p-3 -0x1.bb498b3faad23p-3)))  ;; _ERFCX[6]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.402c5a9bb3143p-5 0x1.402c5a9bb3143p-5)))  ;; _ERFCX[5]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.402c5a9bb3143p-5 0x1.402c5a9bb3143p-5)))  ;; _ERFCX[5]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.57910c10b588ep-1 0x1.57910c10b588ep-1)))  ;; _ERFCX[4]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.57910c10b588ep-1 0x1.57910c10b588ep-1)))  ;; _ERFCX[4]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.33171f83ca933p+0 0x1.33171f83ca933p+0)))  ;; _ERFCX[3]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.33171f83ca933p+0 0x1.33171f83ca933p+0)))  ;; _ERFCX[3]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.41b3b8b69a9fep+0 0x1.41b3b8b69a9fep+0)))  ;; _ERFCX[2]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.41b3b8b69a9fep+0 0x1.41b3b8b69a9fep+0)))  ;; _ERFCX[2]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.d42967a6e0ff5p-1 0x1.d42967a6e0ff5p-1)))  ;; _ERFCX[1]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.d42967a6e0ff5p-1 0x1.d42967a6e0ff5p-1)))  ;; _ERFCX[1]
    (local.set $a0 (f64x2.add (f64x2.mul (local.get $a0) (local.get $t0))
      (v128.const f64x2 0x1.17ecf679fabffp-2 0x1.17ecf679fabffp-2)))  ;; _ERFCX[0]
    (local.set $a1 (f64x2.add (f64x2.mul (local.get $a1) (local.get $t1))
      (v128.const f64x2 0x1.17ecf679fabffp-2 0x1.17ecf679fabffp-2)))  ;; _ERFCX[0]
    ;; Phi(-|v|) = erfcx(|v| / sqrt 2) exp(-v*v/2) / 2; Phi(v) by the sign of v
    (local.set $a0 (f64x2.mul (f64x2.mul (local.get $a0) (local.get $e0)) (v128.const f64x2 0.5 0.5)))
    (local.set $a1 (f64x2.mul (f64x2.mul (local.get $a1) (local.get $e1)) (v128.const f64x2 0.5 0.5)))
    (local.set $c0 (v128.bitselect
      (f64x2.sub (v128.const f64x2 1 1) (local.get $a0)) (local.get $a0)
      (f64x2.gt (local.get $v0) (v128.const f64x2 0 0))))
    (local.set $c1 (v128.bitselect
      (f64x2.sub (v128.const f64x2 1 1) (local.get $a1)) (local.get $a1)
      (f64x2.gt (local.get $v1) (v128.const f64x2 0 0))))
    ;; gelu = Phi(v) v; gelu' = Phi(v) + v phi(v)
    (f64x2.mul (local.get $c0) (local.get $v0))
    (f64x2.add (f64x2.mul (f64x2.mul (local.get $e0)
      (v128.const f64x2 0x1.9884533d43651p-2 0x1.9884533d43651p-2))  ;; _INV_SQRT_2PI
      (local.get $v0)) (local.get $c0))
    (f64x2.mul (local.get $c1) (local.get $v1))
    (f64x2.add (f64x2.mul (f64x2.mul (local.get $e1)
      (v128.const f64x2 0x1.9884533d43651p-2 0x1.9884533d43651p-2))  ;; _INV_SQRT_2PI
      (local.get $v1)) (local.get $c1)))

  ;; fastmath.gelu_with_grad: x (n,) f32 -> y, dy (n,) f32, each rounded once from f64.
  ;; 0 if x holds a NaN or an Inf.
  (func (export "daisychain_gelu")
        (param $x i32) (param $y i32) (param $dy i32) (param $n i32) (result i32)
    (local $j i32) (local $left i32) (local $off i32) (local $v v128) (local $bits v128)
    (local $y0 v128) (local $d0 v128) (local $y1 v128) (local $d1 v128)
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $left (i32.sub (local.get $n) (local.get $j)))
        (local.set $off (i32.shl (local.get $j) (i32.const 2)))
        (local.set $v (call $load32_n (i32.add (local.get $x) (local.get $off)) (local.get $left)))
        (local.set $bits (i32x4.max_u (local.get $bits)
          (v128.and (local.get $v) (v128.const i32x4 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF))))
        (call $gelu4 (f64x2.promote_low_f32x4 (local.get $v))
          (f64x2.promote_low_f32x4
            (i8x16.shuffle 8 9 10 11 12 13 14 15 8 9 10 11 12 13 14 15 (local.get $v) (local.get $v))))
        (local.set $d1)
        (local.set $y1)
        (local.set $d0)
        (local.set $y0)
        (call $store32_n (i32.add (local.get $y) (local.get $off))
          (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
            (f32x4.demote_f64x2_zero (local.get $y0)) (f32x4.demote_f64x2_zero (local.get $y1)))
          (local.get $left))
        (call $store32_n (i32.add (local.get $dy) (local.get $off))
          (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
            (f32x4.demote_f64x2_zero (local.get $d0)) (f32x4.demote_f64x2_zero (local.get $d1)))
          (local.get $left))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $each)))
    (i32.lt_u (call $hmax_u (local.get $bits)) (i32.const 0x7F800000)))

  ;; ------------------------------------------------------------- pinned sums (detmath.psum)

  ;; detmath.psum's tree over buf (n,) f64 in place: each level adds element i + ceil(n/2) to
  ;; element i; returns the sum. n >= 1.
  (func $tree_f64 (param $buf i32) (param $n i32) (result f64)
    (local $half i32) (local $m i32) (local $i i32) (local $p i32) (local $gap i32)
    (block $done
      (loop $level
        (br_if $done (i32.le_u (local.get $n) (i32.const 1)))
        (local.set $half (i32.shr_u (i32.add (local.get $n) (i32.const 1)) (i32.const 1)))
        (local.set $m (i32.sub (local.get $n) (local.get $half)))
        (local.set $gap (i32.shl (local.get $half) (i32.const 3)))
        (local.set $i (i32.const 0))
        (block $pairs_done
          (loop $pairs
            (br_if $pairs_done (i32.gt_u (i32.add (local.get $i) (i32.const 2)) (local.get $m)))
            (local.set $p (i32.add (local.get $buf) (i32.shl (local.get $i) (i32.const 3))))
            (v128.store (local.get $p) (f64x2.add (v128.load (local.get $p))
                                                  (v128.load (i32.add (local.get $p) (local.get $gap)))))
            (local.set $i (i32.add (local.get $i) (i32.const 2)))
            (br $pairs)))
        (if (i32.lt_u (local.get $i) (local.get $m))
          (then
            (local.set $p (i32.add (local.get $buf) (i32.shl (local.get $i) (i32.const 3))))
            (f64.store (local.get $p) (f64.add (f64.load (local.get $p))
                                               (f64.load (i32.add (local.get $p) (local.get $gap)))))))
        (local.set $n (local.get $half))
        (br $level)))
    (f64.load (local.get $buf)))

  ;; The same tree over buf (n,) f32.
  (func $tree_f32 (param $buf i32) (param $n i32) (result f32)
    (local $half i32) (local $m i32) (local $i i32) (local $p i32) (local $gap i32)
    (block $done
      (loop $level
        (br_if $done (i32.le_u (local.get $n) (i32.const 1)))
        (local.set $half (i32.shr_u (i32.add (local.get $n) (i32.const 1)) (i32.const 1)))
        (local.set $m (i32.sub (local.get $n) (local.get $half)))
        (local.set $gap (i32.shl (local.get $half) (i32.const 2)))
        (local.set $i (i32.const 0))
        (block $quads_done
          (loop $quads
            (br_if $quads_done (i32.gt_u (i32.add (local.get $i) (i32.const 4)) (local.get $m)))
            (local.set $p (i32.add (local.get $buf) (i32.shl (local.get $i) (i32.const 2))))
            (v128.store (local.get $p) (f32x4.add (v128.load (local.get $p))
                                                  (v128.load (i32.add (local.get $p) (local.get $gap)))))
            (local.set $i (i32.add (local.get $i) (i32.const 4)))
            (br $quads)))
        (block $rest_done
          (loop $rest
            (br_if $rest_done (i32.ge_u (local.get $i) (local.get $m)))
            (local.set $p (i32.add (local.get $buf) (i32.shl (local.get $i) (i32.const 2))))
            (f32.store (local.get $p) (f32.add (f32.load (local.get $p))
                                               (f32.load (i32.add (local.get $p) (local.get $gap)))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $rest)))
        (local.set $n (local.get $half))
        (br $level)))
    (f32.load (local.get $buf)))

  ;; detmath.psum over the last axis: x (R, n) f32 -> out (R,) f32; scratch holds n f32. Every
  ;; input is taken (Inf arithmetic is deterministic); a NaN sum is written as the reference's
  ;; canonical NaN, so the bits are the reference's for any input.
  (func (export "daisychain_psum_rows_f32")
        (param $x i32) (param $out i32) (param $scratch i32) (param $rows i32) (param $n i32)
    (local $i i32) (local $s f32) (local $bytes i32)
    (local.set $bytes (i32.shl (local.get $n) (i32.const 2)))
    (block $done
      (loop $row
        (br_if $done (i32.ge_u (local.get $i) (local.get $rows)))
        (memory.copy (local.get $scratch) (local.get $x) (local.get $bytes))
        (local.set $s (call $tree_f32 (local.get $scratch) (local.get $n)))
        (if (f32.ne (local.get $s) (local.get $s))
          (then (local.set $s (f32.reinterpret_i32 (i32.const 0x7FC00000)))))
        (f32.store (local.get $out) (local.get $s))
        (local.set $x (i32.add (local.get $x) (local.get $bytes)))
        (local.set $out (i32.add (local.get $out) (i32.const 4)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $row))))

  ;; The same for x (R, n) f64 -> out (R,) f64; scratch holds n f64.
  (func (export "daisychain_psum_rows_f64")
        (param $x i32) (param $out i32) (param $scratch i32) (param $rows i32) (param $n i32)
    (local $i i32) (local $s f64) (local $bytes i32)
    (local.set $bytes (i32.shl (local.get $n) (i32.const 3)))
    (block $done
      (loop $row
        (br_if $done (i32.ge_u (local.get $i) (local.get $rows)))
        (memory.copy (local.get $scratch) (local.get $x) (local.get $bytes))
        (local.set $s (call $tree_f64 (local.get $scratch) (local.get $n)))
        (if (f64.ne (local.get $s) (local.get $s))
          (then (local.set $s (f64.reinterpret_i64 (i64.const 0x7FF8000000000000)))))
        (f64.store (local.get $out) (local.get $s))
        (local.set $x (i32.add (local.get $x) (local.get $bytes)))
        (local.set $out (i32.add (local.get $out) (i32.const 8)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $row))))

  ;; ------------------------------------------------------------- softmax (fastmath.py)

  ;; fastmath.softmax_rows (and the parts of log_softmax_parts) over x (R, n) f32:
  ;;   top = max of the row's kept entries (f32), e = exp(f64(x) - top) where kept, else 0,
  ;;   total = the psum tree of e (f64), out = f32(e / total).
  ;; mask: 0 (every entry kept) or the address of (period, n) u8, row r using mask row
  ;; r % period. totals (R,) f64 and tops (R,) f32 are written unless totals is 0. scratch
  ;; holds 2n f64. 0 if x holds a NaN or an Inf anywhere, or a row keeps no entry.
  (func (export "daisychain_softmax")
        (param $x i32) (param $mask i32) (param $period i32) (param $out i32)
        (param $totals i32) (param $tops i32) (param $scratch i32)
        (param $rows i32) (param $n i32) (result i32)
    (local $i i32) (local $j i32) (local $left i32) (local $mrow i32) (local $buf i32)
    (local $v v128) (local $bits v128) (local $tv v128) (local $keep v128) (local $e v128)
    (local $e1 v128) (local $at i32) (local $top f32) (local $top64 v128) (local $total f64) (local $tot v128)
    (local.set $buf (i32.add (local.get $scratch) (i32.shl (local.get $n) (i32.const 3))))
    (block $rows_done
      (loop $row
        (br_if $rows_done (i32.ge_u (local.get $i) (local.get $rows)))
        (if (local.get $mask)
          (then (local.set $mrow (i32.add (local.get $mask)
            (i32.mul (i32.rem_u (local.get $i) (local.get $period)) (local.get $n))))))
        ;; top of the kept entries; every entry must be finite
        (local.set $tv (v128.const f32x4 -inf -inf -inf -inf))
        (local.set $bits (v128.const i32x4 0 0 0 0))
        (local.set $j (i32.const 0))
        (block $top_done
          (loop $top_loop
            (br_if $top_done (i32.ge_u (local.get $j) (local.get $n)))
            (local.set $left (i32.sub (local.get $n) (local.get $j)))
            (local.set $v (call $load32_n (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2)))
                                          (local.get $left)))
            (local.set $bits (i32x4.max_u (local.get $bits)
              (v128.and (local.get $v) (v128.const i32x4 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF 0x7FFFFFFF))))
            (if (local.get $mask)
              (then (local.set $keep (call $load_mask_n (i32.add (local.get $mrow) (local.get $j))
                                                         (local.get $left))))
              (else (local.set $keep (call $lanes_below (local.get $left)))))
            (local.set $tv (f32x4.max (local.get $tv)
              (v128.bitselect (local.get $v) (v128.const f32x4 -inf -inf -inf -inf) (local.get $keep))))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $top_loop)))
        (if (i32.ge_u (call $hmax_u (local.get $bits)) (i32.const 0x7F800000))
          (then (return (i32.const 0))))
        (local.set $top (call $hmax_f32 (local.get $tv)))
        (if (f32.eq (local.get $top) (f32.const -inf)) (then (return (i32.const 0))))
        (local.set $top64 (f64x2.splat (f64.promote_f32 (local.get $top))))
        ;; e into scratch and buf: four at a time (none computed where all four are masked),
        ;; then two, then the last one alone
        (local.set $j (i32.const 0))
        (block $quads_done
          (loop $quads
            (br_if $quads_done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
            (local.set $v (v128.load (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2)))))
            (local.set $keep (v128.const i32x4 -1 -1 -1 -1))
            (if (local.get $mask)
              (then (local.set $keep (call $load_mask_n (i32.add (local.get $mrow) (local.get $j))
                                                        (i32.const 4)))))
            (if (v128.any_true (local.get $keep))
              (then
                (call $exp_neg4
                  (f64x2.sub (f64x2.promote_low_f32x4 (local.get $v)) (local.get $top64))
                  (f64x2.sub (f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 8 9 10 11 12 13 14 15
                                                        (local.get $v) (local.get $v)))
                             (local.get $top64)))
                (local.set $e1)
                (local.set $e)
                (local.set $e (v128.and (local.get $e) (i64x2.extend_low_i32x4_s (local.get $keep))))
                (local.set $e1 (v128.and (local.get $e1) (i64x2.extend_high_i32x4_s (local.get $keep)))))
              (else
                (local.set $e (v128.const i64x2 0 0))
                (local.set $e1 (v128.const i64x2 0 0))))
            (local.set $at (i32.add (local.get $scratch) (i32.shl (local.get $j) (i32.const 3))))
            (v128.store (local.get $at) (local.get $e))
            (v128.store offset=16 (local.get $at) (local.get $e1))
            (local.set $at (i32.add (local.get $buf) (i32.shl (local.get $j) (i32.const 3))))
            (v128.store (local.get $at) (local.get $e))
            (v128.store offset=16 (local.get $at) (local.get $e1))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $quads)))
        (block $exp_done
          (loop $exp_loop
            (br_if $exp_done (i32.ge_u (local.get $j) (local.get $n)))
            (local.set $left (i32.sub (local.get $n) (local.get $j)))
            (if (i32.ge_u (local.get $left) (i32.const 2))
              (then
                (local.set $v (f64x2.promote_low_f32x4
                  (v128.load64_zero (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2))))))
                (local.set $keep (v128.const i64x2 -1 -1))
                (if (local.get $mask)
                  (then (local.set $keep (i64x2.ne
                    (i64x2.extend_low_i32x4_u (i32x4.extend_low_i16x8_u (i16x8.extend_low_i8x16_u
                      (v128.load16_splat (i32.add (local.get $mrow) (local.get $j))))))
                    (v128.const i64x2 0 0))))))
              (else
                (local.set $v (f64x2.splat (f64.promote_f32
                  (f32.load (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2)))))))
                (local.set $keep (v128.const i64x2 -1 -1))
                (if (local.get $mask)
                  (then (if (i32.eqz (i32.load8_u (i32.add (local.get $mrow) (local.get $j))))
                    (then (local.set $keep (v128.const i64x2 0 0))))))))
            (local.set $v (f64x2.sub (local.get $v) (local.get $top64)))
            (call $exp_neg4 (local.get $v) (local.get $v))
            (drop)
            (local.set $e)
            (local.set $e (v128.and (local.get $keep) (local.get $e)))
            (if (i32.ge_u (local.get $left) (i32.const 2))
              (then
                (v128.store (i32.add (local.get $scratch) (i32.shl (local.get $j) (i32.const 3))) (local.get $e))
                (v128.store (i32.add (local.get $buf) (i32.shl (local.get $j) (i32.const 3))) (local.get $e)))
              (else
                (v128.store64_lane 0 (i32.add (local.get $scratch) (i32.shl (local.get $j) (i32.const 3))) (local.get $e))
                (v128.store64_lane 0 (i32.add (local.get $buf) (i32.shl (local.get $j) (i32.const 3))) (local.get $e))))
            (local.set $j (i32.add (local.get $j) (i32.const 2)))
            (br $exp_loop)))
        (local.set $total (call $tree_f64 (local.get $buf) (local.get $n)))
        (local.set $tot (f64x2.splat (local.get $total)))
        ;; out = f32(e / total)
        (local.set $j (i32.const 0))
        (block $div_done
          (loop $div_loop
            (br_if $div_done (i32.ge_u (local.get $j) (local.get $n)))
            (local.set $v (f32x4.demote_f64x2_zero (f64x2.div
              (v128.load (i32.add (local.get $scratch) (i32.shl (local.get $j) (i32.const 3))))
              (local.get $tot))))
            (if (i32.ge_u (i32.sub (local.get $n) (local.get $j)) (i32.const 2))
              (then (v128.store64_lane 0 (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2))) (local.get $v)))
              (else (v128.store32_lane 0 (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2))) (local.get $v))))
            (local.set $j (i32.add (local.get $j) (i32.const 2)))
            (br $div_loop)))
        (if (local.get $totals)
          (then
            (f64.store (i32.add (local.get $totals) (i32.shl (local.get $i) (i32.const 3))) (local.get $total))
            (f32.store (i32.add (local.get $tops) (i32.shl (local.get $i) (i32.const 2))) (local.get $top))))
        (local.set $x (i32.add (local.get $x) (i32.shl (local.get $n) (i32.const 2))))
        (local.set $out (i32.add (local.get $out) (i32.shl (local.get $n) (i32.const 2))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $row)))
    (i32.const 1))

  ;; ------------------------------------------------------------- product check (kernels.py)

  ;; Kernels.product_holds, Freivalds' identity for out == a @ b: every |out| <= bound, then
  ;; a @ (b @ r_q) == out @ r_q for each of the V vectors r_q. Every product and partial sum
  ;; is an integer below 2**53 (the caller, pynode.core.gemm.check, picks r's entries for
  ;; that), so each f64 operation is exact and any order of summation, f64x2 lanes included,
  ;; gives the reference's values: the answer is the reference's for every input.

  ;; sum over j < n of i8[p + j] * f64[vec + 8j] (four chains of adds, as $dot_i32).
  (func $dot_i8 (param $p i32) (param $n i32) (param $vec i32) (result f64)
    (local $j i32) (local $w v128) (local $lo v128) (local $hi v128) (local $v i32)
    (local $acc0 v128) (local $acc1 v128) (local $acc2 v128) (local $acc3 v128) (local $s f64)
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $n)))
        (local.set $w (i16x8.extend_low_i8x16_s
          (v128.load64_zero (i32.add (local.get $p) (local.get $j)))))
        (local.set $lo (i32x4.extend_low_i16x8_s (local.get $w)))
        (local.set $hi (i32x4.extend_high_i16x8_s (local.get $w)))
        (local.set $v (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3))))
        (local.set $acc0 (f64x2.add (local.get $acc0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $lo)) (v128.load (local.get $v)))))
        (local.set $acc1 (f64x2.add (local.get $acc1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $lo) (local.get $lo)))
          (v128.load offset=16 (local.get $v)))))
        (local.set $acc2 (f64x2.add (local.get $acc2) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $hi)) (v128.load offset=32 (local.get $v)))))
        (local.set $acc3 (f64x2.add (local.get $acc3) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $hi) (local.get $hi)))
          (v128.load offset=48 (local.get $v)))))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (local.set $acc0 (f64x2.add (f64x2.add (local.get $acc0) (local.get $acc1))
                                (f64x2.add (local.get $acc2) (local.get $acc3))))
    (local.set $s (f64.add (f64x2.extract_lane 0 (local.get $acc0))
                           (f64x2.extract_lane 1 (local.get $acc0))))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $s (f64.add (local.get $s) (f64.mul
          (f64.convert_i32_s (i32.load8_s (i32.add (local.get $p) (local.get $j))))
          (f64.load (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3)))))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail)))
    (local.get $s))

  ;; f64[dst + 8i] += i8[p + i] * s for i < n.
  (func $axpy_i8 (param $dst i32) (param $p i32) (param $n i32) (param $s f64)
    (local $j i32) (local $w v128) (local $lo v128) (local $hi v128) (local $d i32)
    (local $sv v128)
    (local.set $sv (f64x2.splat (local.get $s)))
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $n)))
        (local.set $w (i16x8.extend_low_i8x16_s
          (v128.load64_zero (i32.add (local.get $p) (local.get $j)))))
        (local.set $lo (i32x4.extend_low_i16x8_s (local.get $w)))
        (local.set $hi (i32x4.extend_high_i16x8_s (local.get $w)))
        (local.set $d (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 3))))
        (v128.store (local.get $d) (f64x2.add (v128.load (local.get $d)) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $lo)) (local.get $sv))))
        (v128.store offset=16 (local.get $d) (f64x2.add (v128.load offset=16 (local.get $d))
          (f64x2.mul (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $lo) (local.get $lo)))
                     (local.get $sv))))
        (v128.store offset=32 (local.get $d) (f64x2.add (v128.load offset=32 (local.get $d))
          (f64x2.mul (f64x2.convert_low_i32x4_s (local.get $hi)) (local.get $sv))))
        (v128.store offset=48 (local.get $d) (f64x2.add (v128.load offset=48 (local.get $d))
          (f64x2.mul (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $hi) (local.get $hi)))
                     (local.get $sv))))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $d (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 3))))
        (f64.store (local.get $d) (f64.add (f64.load (local.get $d)) (f64.mul
          (f64.convert_i32_s (i32.load8_s (i32.add (local.get $p) (local.get $j))))
          (local.get $s))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail))))

  ;; sum over j < n of i32[p + 4j] * f64[vec + 8j]; four chains of adds, so that the adds'
  ;; latency does not set the pace.
  (func $dot_i32 (param $p i32) (param $n i32) (param $vec i32) (result f64)
    (local $j i32) (local $x v128) (local $y v128) (local $v i32) (local $s f64)
    (local $acc0 v128) (local $acc1 v128) (local $acc2 v128) (local $acc3 v128)
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $n)))
        (local.set $x (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
        (local.set $y (v128.load offset=16
          (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
        (local.set $v (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3))))
        (local.set $acc0 (f64x2.add (local.get $acc0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $x)) (v128.load (local.get $v)))))
        (local.set $acc1 (f64x2.add (local.get $acc1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $x) (local.get $x)))
          (v128.load offset=16 (local.get $v)))))
        (local.set $acc2 (f64x2.add (local.get $acc2) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $y)) (v128.load offset=32 (local.get $v)))))
        (local.set $acc3 (f64x2.add (local.get $acc3) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $y) (local.get $y)))
          (v128.load offset=48 (local.get $v)))))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (local.set $acc0 (f64x2.add (f64x2.add (local.get $acc0) (local.get $acc1))
                                (f64x2.add (local.get $acc2) (local.get $acc3))))
    (local.set $s (f64.add (f64x2.extract_lane 0 (local.get $acc0))
                           (f64x2.extract_lane 1 (local.get $acc0))))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $s (f64.add (local.get $s) (f64.mul
          (f64.convert_i32_s (i32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
          (f64.load (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3)))))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail)))
    (local.get $s))

  ;; f64[dst + 8i] += i32[p + 4i] * s for i < n.
  (func $axpy_i32 (param $dst i32) (param $p i32) (param $n i32) (param $s f64)
    (local $j i32) (local $x v128) (local $d i32) (local $sv v128)
    (local.set $sv (f64x2.splat (local.get $s)))
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
        (local.set $x (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
        (local.set $d (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 3))))
        (v128.store (local.get $d) (f64x2.add (v128.load (local.get $d)) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $x)) (local.get $sv))))
        (v128.store offset=16 (local.get $d) (f64x2.add (v128.load offset=16 (local.get $d))
          (f64x2.mul (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7
                                                    (local.get $x) (local.get $x)))
                     (local.get $sv))))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $each)))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $d (i32.add (local.get $dst) (i32.shl (local.get $j) (i32.const 3))))
        (f64.store (local.get $d) (f64.add (f64.load (local.get $d)) (f64.mul
          (f64.convert_i32_s (i32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
          (local.get $s))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail))))

  ;; Row i of x (rows of i8 `stride` bytes apart from p) dotted with f64[vec + 8j], j < n,
  ;; for rows 0 and 1 at once: [dot 0, dot 1] as f64x2. Sharing vec's loads and the final
  ;; reduction halves what a short row costs.
  (func $dot2_i8 (param $p i32) (param $stride i32) (param $n i32) (param $vec i32)
                    (result v128)
    (local $j i32) (local $w v128) (local $at i32) (local $v i32) (local $t0 f64) (local $t1 f64)
    (local $x0 v128) (local $y0 v128) (local $x1 v128) (local $y1 v128)
    (local $a0 v128) (local $b0 v128) (local $a1 v128) (local $b1 v128)
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $n)))
        (local.set $w (i16x8.extend_low_i8x16_s (v128.load64_zero (i32.add (local.get $p) (local.get $j)))))
        (local.set $x0 (i32x4.extend_low_i16x8_s (local.get $w)))
        (local.set $y0 (i32x4.extend_high_i16x8_s (local.get $w)))
        (local.set $w (i16x8.extend_low_i8x16_s (v128.load64_zero
          (i32.add (i32.add (local.get $p) (local.get $stride)) (local.get $j)))))
        (local.set $x1 (i32x4.extend_low_i16x8_s (local.get $w)))
        (local.set $y1 (i32x4.extend_high_i16x8_s (local.get $w)))
        (local.set $v (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3))))
        (local.set $a0 (f64x2.add (local.get $a0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $x0)) (v128.load (local.get $v)))))
        (local.set $b0 (f64x2.add (local.get $b0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x0) (local.get $x0))) (v128.load offset=16 (local.get $v)))))
        (local.set $a0 (f64x2.add (local.get $a0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $y0)) (v128.load offset=32 (local.get $v)))))
        (local.set $b0 (f64x2.add (local.get $b0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $y0) (local.get $y0))) (v128.load offset=48 (local.get $v)))))
        (local.set $a1 (f64x2.add (local.get $a1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $x1)) (v128.load (local.get $v)))))
        (local.set $b1 (f64x2.add (local.get $b1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x1) (local.get $x1))) (v128.load offset=16 (local.get $v)))))
        (local.set $a1 (f64x2.add (local.get $a1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $y1)) (v128.load offset=32 (local.get $v)))))
        (local.set $b1 (f64x2.add (local.get $b1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $y1) (local.get $y1))) (v128.load offset=48 (local.get $v)))))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $v (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3))))
        (local.set $t0 (f64.add (local.get $t0)
          (f64.mul (f64.convert_i32_s (i32.load8_s (i32.add (local.get $p) (local.get $j)))) (f64.load (local.get $v)))))
        (local.set $t1 (f64.add (local.get $t1)
          (f64.mul (f64.convert_i32_s (i32.load8_s (i32.add (i32.add (local.get $p) (local.get $stride)) (local.get $j)))) (f64.load (local.get $v)))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail)))
    (local.set $a0 (f64x2.add (local.get $a0) (local.get $b0)))  ;; row 0's two lanes
    (local.set $a1 (f64x2.add (local.get $a1) (local.get $b1)))  ;; row 1's
    (f64x2.add
      (f64x2.add
        (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $a0) (local.get $a1))
        (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $a0) (local.get $a1)))
      (f64x2.replace_lane 1 (f64x2.splat (local.get $t0)) (local.get $t1))))

  ;; The same for rows of i32 (`stride` bytes apart).
  (func $dot2_i32 (param $p i32) (param $stride i32) (param $n i32) (param $vec i32)
                    (result v128)
    (local $j i32) (local $w v128) (local $at i32) (local $v i32) (local $t0 f64) (local $t1 f64)
    (local $x0 v128) (local $y0 v128) (local $x1 v128) (local $y1 v128)
    (local $a0 v128) (local $b0 v128) (local $a1 v128) (local $b1 v128)
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $n)))
        (local.set $at (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))))
        (local.set $x0 (v128.load (local.get $at)))
        (local.set $y0 (v128.load offset=16 (local.get $at)))
        (local.set $at (i32.add (local.get $at) (local.get $stride)))
        (local.set $x1 (v128.load (local.get $at)))
        (local.set $y1 (v128.load offset=16 (local.get $at)))
        (local.set $v (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3))))
        (local.set $a0 (f64x2.add (local.get $a0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $x0)) (v128.load (local.get $v)))))
        (local.set $b0 (f64x2.add (local.get $b0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x0) (local.get $x0))) (v128.load offset=16 (local.get $v)))))
        (local.set $a0 (f64x2.add (local.get $a0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $y0)) (v128.load offset=32 (local.get $v)))))
        (local.set $b0 (f64x2.add (local.get $b0) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $y0) (local.get $y0))) (v128.load offset=48 (local.get $v)))))
        (local.set $a1 (f64x2.add (local.get $a1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $x1)) (v128.load (local.get $v)))))
        (local.set $b1 (f64x2.add (local.get $b1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x1) (local.get $x1))) (v128.load offset=16 (local.get $v)))))
        (local.set $a1 (f64x2.add (local.get $a1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (local.get $y1)) (v128.load offset=32 (local.get $v)))))
        (local.set $b1 (f64x2.add (local.get $b1) (f64x2.mul
          (f64x2.convert_low_i32x4_s (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $y1) (local.get $y1))) (v128.load offset=48 (local.get $v)))))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $each)))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $v (i32.add (local.get $vec) (i32.shl (local.get $j) (i32.const 3))))
        (local.set $t0 (f64.add (local.get $t0)
          (f64.mul (f64.convert_i32_s (i32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))))) (f64.load (local.get $v)))))
        (local.set $t1 (f64.add (local.get $t1)
          (f64.mul (f64.convert_i32_s (i32.load (i32.add (i32.add (local.get $p) (local.get $stride)) (i32.shl (local.get $j) (i32.const 2))))) (f64.load (local.get $v)))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail)))
    (local.set $a0 (f64x2.add (local.get $a0) (local.get $b0)))  ;; row 0's two lanes
    (local.set $a1 (f64x2.add (local.get $a1) (local.get $b1)))  ;; row 1's
    (f64x2.add
      (f64x2.add
        (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $a0) (local.get $a1))
        (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $a0) (local.get $a1)))
      (f64x2.replace_lane 1 (f64x2.splat (local.get $t0)) (local.get $t1))))

  ;; dst (R,) f64 = x @ vec for x (R, C) of int8 (wide = 0) or int32 (wide = 1) and vec (C,)
  ;; f64; x is stored row-major (t = 0: rows dotted two at a time, then an odd last one), or
  ;; as its transpose (C, R) row-major (t = 1), where its columns are contiguous and dst is
  ;; summed a column at a time.
  (func $matvec (param $x i32) (param $wide i32) (param $t i32) (param $rows i32)
                (param $cols i32) (param $vec i32) (param $dst i32)
    (local $i i32) (local $line i32)
    (if (local.get $t)
      (then
        (memory.fill (local.get $dst) (i32.const 0) (i32.shl (local.get $rows) (i32.const 3)))
        (local.set $line (i32.shl (local.get $rows) (i32.shl (local.get $wide) (i32.const 1))))
        (block $done
          (loop $col
            (br_if $done (i32.ge_u (local.get $i) (local.get $cols)))
            (if (local.get $wide)
              (then (call $axpy_i32 (local.get $dst) (local.get $x) (local.get $rows)
                      (f64.load (i32.add (local.get $vec) (i32.shl (local.get $i) (i32.const 3))))))
              (else (call $axpy_i8 (local.get $dst) (local.get $x) (local.get $rows)
                      (f64.load (i32.add (local.get $vec) (i32.shl (local.get $i) (i32.const 3)))))))
            (local.set $x (i32.add (local.get $x) (local.get $line)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $col))))
      (else
        (local.set $line (i32.shl (local.get $cols) (i32.shl (local.get $wide) (i32.const 1))))
        (block $done
          (loop $pair
            (br_if $done (i32.gt_u (i32.add (local.get $i) (i32.const 2)) (local.get $rows)))
            (v128.store (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 3)))
              (if (result v128) (local.get $wide)
                (then (call $dot2_i32 (local.get $x) (local.get $line) (local.get $cols)
                                      (local.get $vec)))
                (else (call $dot2_i8 (local.get $x) (local.get $line) (local.get $cols)
                                     (local.get $vec)))))
            (local.set $x (i32.add (local.get $x) (i32.shl (local.get $line) (i32.const 1))))
            (local.set $i (i32.add (local.get $i) (i32.const 2)))
            (br $pair)))
        (block $done
          (loop $row
            (br_if $done (i32.ge_u (local.get $i) (local.get $rows)))
            (f64.store (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 3)))
              (if (result f64) (local.get $wide)
                (then (call $dot_i32 (local.get $x) (local.get $cols) (local.get $vec)))
                (else (call $dot_i8 (local.get $x) (local.get $cols) (local.get $vec)))))
            (local.set $x (i32.add (local.get $x) (local.get $line)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $row))))))

  ;; 1 if every |x| <= bound (unsigned; |-2**31| is 2**31) for the n i32 at p, else 0.
  (func $within (param $p i32) (param $n i32) (param $bound i32) (result i32)
    (local $j i32) (local $top v128) (local $x i32) (local $m i32)
    (block $done
      (loop $each
        (br_if $done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
        (local.set $top (i32x4.max_u (local.get $top) (i32x4.abs
          (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $each)))
    (local.set $m (call $hmax_u (local.get $top)))
    (block $end
      (loop $tail
        (br_if $end (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $x (i32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))))
        (local.set $x (i32.sub (i32.xor (local.get $x) (i32.shr_s (local.get $x) (i32.const 31)))
                               (i32.shr_s (local.get $x) (i32.const 31))))
        (if (i32.gt_u (local.get $x) (local.get $m)) (then (local.set $m (local.get $x))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $tail)))
    (i32.le_u (local.get $m) (local.get $bound)))

  ;; a (B, M, K) i8, b (B, K, N) i8, out (B, M, N) i32, each stored row-major (its *_t = 0)
  ;; or with its last two axes swapped (*_t = 1: each batch's transpose row-major); r (V, N)
  ;; f64 row-major; scratch holds K + 2M f64. bound: 2**14 * K, at most 2**31 (as unsigned).
  ;; 1 if the product holds for every batch and vector, else 0.
  (func (export "daisychain_product_holds")
        (param $a i32) (param $a_t i32) (param $b i32) (param $b_t i32) (param $out i32)
        (param $out_t i32) (param $r i32) (param $v i32) (param $scratch i32)
        (param $batch i32) (param $m i32) (param $k i32) (param $n i32) (param $bound i32)
        (result i32)
    (local $t i32) (local $q i32) (local $i i32) (local $br i32) (local $lhs i32)
    (local $rhs i32) (local $rq i32)
    (if (i32.eqz (call $within (local.get $out)
                   (i32.mul (local.get $batch) (i32.mul (local.get $m) (local.get $n)))
                   (local.get $bound)))
      (then (return (i32.const 0))))
    (local.set $br (local.get $scratch))
    (local.set $lhs (i32.add (local.get $br) (i32.shl (local.get $k) (i32.const 3))))
    (local.set $rhs (i32.add (local.get $lhs) (i32.shl (local.get $m) (i32.const 3))))
    (block $done
      (loop $each_batch
        (br_if $done (i32.ge_u (local.get $t) (local.get $batch)))
        (local.set $q (i32.const 0))
        (local.set $rq (local.get $r))
        (block $vectors_done
          (loop $each_vector
            (br_if $vectors_done (i32.ge_u (local.get $q) (local.get $v)))
            (call $matvec (local.get $b) (i32.const 0) (local.get $b_t) (local.get $k)
                          (local.get $n) (local.get $rq) (local.get $br))
            (call $matvec (local.get $a) (i32.const 0) (local.get $a_t) (local.get $m)
                          (local.get $k) (local.get $br) (local.get $lhs))
            (call $matvec (local.get $out) (i32.const 1) (local.get $out_t) (local.get $m)
                          (local.get $n) (local.get $rq) (local.get $rhs))
            (local.set $i (i32.const 0))
            (block $rows_done
              (loop $each_row
                (br_if $rows_done (i32.ge_u (local.get $i) (local.get $m)))
                (if (f64.ne (f64.load (i32.add (local.get $lhs) (i32.shl (local.get $i) (i32.const 3))))
                            (f64.load (i32.add (local.get $rhs) (i32.shl (local.get $i) (i32.const 3)))))
                  (then (return (i32.const 0))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $each_row)))
            (local.set $rq (i32.add (local.get $rq) (i32.shl (local.get $n) (i32.const 3))))
            (local.set $q (i32.add (local.get $q) (i32.const 1)))
            (br $each_vector)))
        (local.set $a (i32.add (local.get $a) (i32.mul (local.get $m) (local.get $k))))
        (local.set $b (i32.add (local.get $b) (i32.mul (local.get $k) (local.get $n))))
        (local.set $out (i32.add (local.get $out)
                                 (i32.shl (i32.mul (local.get $m) (local.get $n)) (i32.const 2))))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        (br $each_batch)))
    (i32.const 1))
)
