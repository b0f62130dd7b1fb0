;; numpy's Philox4x64-10 raw stream with WebAssembly SIMD (128-bit), for the page.
;;
;; Built into philox4x64.wasm (checked in beside this file) by `python -m server.wasm_build
;; build`; tests/server/test_wasm_build.py rebuilds it and compares the bytes. Like
;; gemm_i8.wat it imports Pyodide's own linear memory (env.memory) and carries an empty
;; "dylink.0" section, so Pyodide's loader links it and it writes straight into a numpy
;; array (pynode/browser_philox.py).
;;
;; The stream is `pynode.core.rng.raw64`'s: key words k0, k1; block b (from 0) is the
;; Philox4x64-10 bijection of the counter (b + 1, 0, c2, c3) (numpy increments its counter
;; before its first block), and its four 64-bit outputs are words 4b .. 4b+3, in order.
;; A round is Random123's: (hi0, lo0) = M0 * x0 and (hi1, lo1) = M1 * x2 as 128-bit
;; products, then x = (hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0); the key gains the Weyl
;; increments (W0, W1) between rounds.
;;
;; Speed. Two blocks travel side by side, one per i64x2 lane, and each iteration runs two
;; such pairs (a, b): their rounds are independent, so their products overlap (1.5x the
;; speed of one pair per iteration under Node).
;;
;; Exactness. Only integer instructions (no relaxed SIMD). WebAssembly has no
;; 64x64->128-bit product, so each is built from 32x32->64-bit ones: with x = xh 2^32 + xl,
;; M = mh 2^32 + ml, and ll, hl, lh, hh the products xl ml, xh ml, xl mh, xh mh
;; (i64x2.extmul_*_i32x4_u, exact),
;;   t  = hl + (ll >> 32)          <= (2^32 - 1)^2 + 2^32 - 1 < 2^64, no carry lost
;;   u  = lh + (t & (2^32 - 1))    the same bound
;;   hi = hh + (t >> 32) + (u >> 32)
;;   lo = (u << 32) | (ll & (2^32 - 1))
;; which is x M = hi 2^64 + lo exactly (the same limbs as `rng._mulhi64`).
;;
;; Layout. `words` points at four uint64 (k0, k1, c2, c3); `out` at n uint64, all written.
;; Words past the last whole group of four blocks are computed as one more group, of which
;; only the first n % 16 words are stored: nothing past out + 8 n is touched.
(module
  ;; Emscripten dylink.0: subsection 1 (memory info), 4 bytes: memory size, memory alignment,
  ;; table size, table alignment, all 0.
  (@custom "dylink.0" "\01\04\00\00\00\00")
  (import "env" "memory" (memory 0))

  ;; out[0 .. n) = words 0 .. n-1 of the stream of (k0, k1, c2, c3) at `words`.
  (func (export "daisychain_philox4x64") (param $out i32) (param $n i32) (param $words i32)
    (local $left i32) (local $round i32)
    (local $ml0 v128) (local $mh0 v128) (local $ml1 v128) (local $mh1 v128) (local $low v128)
    (local $ctr v128) (local $c2 v128) (local $c3 v128) (local $k0 v128) (local $k1 v128)
    (local $ka v128) (local $kb v128)
    ;; pair a: blocks 4i, 4i+1; pair b: blocks 4i+2, 4i+3
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $b0 v128) (local $b1 v128) (local $b2 v128) (local $b3 v128)
    (local $s v128) (local $ll v128) (local $t v128) (local $u v128)
    (local $hi0 v128) (local $lo0 v128) (local $hi1 v128) (local $lo1 v128)
    (local $hi2 v128) (local $lo2 v128) (local $hi3 v128) (local $lo3 v128)
    ;; 32-bit halves of M0 = 0xD2E7470EE14C6C93 and M1 = 0xCA5A826395121157
    (local.set $ml0 (v128.const i32x4 0xE14C6C93 0xE14C6C93 0xE14C6C93 0xE14C6C93))
    (local.set $mh0 (v128.const i32x4 0xD2E7470E 0xD2E7470E 0xD2E7470E 0xD2E7470E))
    (local.set $ml1 (v128.const i32x4 0x95121157 0x95121157 0x95121157 0x95121157))
    (local.set $mh1 (v128.const i32x4 0xCA5A8263 0xCA5A8263 0xCA5A8263 0xCA5A8263))
    (local.set $low (v128.const i64x2 0xFFFFFFFF 0xFFFFFFFF))
    (local.set $k0 (v128.load64_splat (local.get $words)))
    (local.set $k1 (v128.load64_splat offset=8 (local.get $words)))
    (local.set $c2 (v128.load64_splat offset=16 (local.get $words)))
    (local.set $c3 (v128.load64_splat offset=24 (local.get $words)))
    (local.set $ctr (v128.const i64x2 1 2))  ;; counters of blocks 0 and 1
    (local.set $left (local.get $n))
    (block $done
      (loop $group
        (br_if $done (i32.eqz (local.get $left)))
        (local.set $a0 (local.get $ctr))
        (local.set $a1 (v128.const i64x2 0 0))
        (local.set $a2 (local.get $c2))
        (local.set $a3 (local.get $c3))
        (local.set $b0 (i64x2.add (local.get $ctr) (v128.const i64x2 2 2)))
        (local.set $b1 (v128.const i64x2 0 0))
        (local.set $b2 (local.get $c2))
        (local.set $b3 (local.get $c3))
        (local.set $ka (local.get $k0))
        (local.set $kb (local.get $k1))
        (local.set $round (i32.const 10))
        (loop $rounds
          ;; (hi0, lo0) = M0 * a0. $s: the low halves of the two words, then their high halves
          (local.set $s (i8x16.shuffle 0 1 2 3 8 9 10 11 4 5 6 7 12 13 14 15
            (local.get $a0) (local.get $a0)))
          (local.set $ll (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $ml0)))
          (local.set $t (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $ml0))
            (i64x2.shr_u (local.get $ll) (i32.const 32))))
          (local.set $u (i64x2.add (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $mh0))
            (v128.and (local.get $t) (local.get $low))))
          (local.set $hi0 (i64x2.add
            (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $mh0))
              (i64x2.shr_u (local.get $t) (i32.const 32)))
            (i64x2.shr_u (local.get $u) (i32.const 32))))
          (local.set $lo0 (v128.or (i64x2.shl (local.get $u) (i32.const 32))
            (v128.and (local.get $ll) (local.get $low))))
          ;; (hi1, lo1) = M1 * a2
          (local.set $s (i8x16.shuffle 0 1 2 3 8 9 10 11 4 5 6 7 12 13 14 15
            (local.get $a2) (local.get $a2)))
          (local.set $ll (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $ml1)))
          (local.set $t (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $ml1))
            (i64x2.shr_u (local.get $ll) (i32.const 32))))
          (local.set $u (i64x2.add (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $mh1))
            (v128.and (local.get $t) (local.get $low))))
          (local.set $hi1 (i64x2.add
            (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $mh1))
              (i64x2.shr_u (local.get $t) (i32.const 32)))
            (i64x2.shr_u (local.get $u) (i32.const 32))))
          (local.set $lo1 (v128.or (i64x2.shl (local.get $u) (i32.const 32))
            (v128.and (local.get $ll) (local.get $low))))
          ;; (hi2, lo2) = M0 * b0
          (local.set $s (i8x16.shuffle 0 1 2 3 8 9 10 11 4 5 6 7 12 13 14 15
            (local.get $b0) (local.get $b0)))
          (local.set $ll (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $ml0)))
          (local.set $t (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $ml0))
            (i64x2.shr_u (local.get $ll) (i32.const 32))))
          (local.set $u (i64x2.add (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $mh0))
            (v128.and (local.get $t) (local.get $low))))
          (local.set $hi2 (i64x2.add
            (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $mh0))
              (i64x2.shr_u (local.get $t) (i32.const 32)))
            (i64x2.shr_u (local.get $u) (i32.const 32))))
          (local.set $lo2 (v128.or (i64x2.shl (local.get $u) (i32.const 32))
            (v128.and (local.get $ll) (local.get $low))))
          ;; (hi3, lo3) = M1 * b2
          (local.set $s (i8x16.shuffle 0 1 2 3 8 9 10 11 4 5 6 7 12 13 14 15
            (local.get $b2) (local.get $b2)))
          (local.set $ll (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $ml1)))
          (local.set $t (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $ml1))
            (i64x2.shr_u (local.get $ll) (i32.const 32))))
          (local.set $u (i64x2.add (i64x2.extmul_low_i32x4_u (local.get $s) (local.get $mh1))
            (v128.and (local.get $t) (local.get $low))))
          (local.set $hi3 (i64x2.add
            (i64x2.add (i64x2.extmul_high_i32x4_u (local.get $s) (local.get $mh1))
              (i64x2.shr_u (local.get $t) (i32.const 32)))
            (i64x2.shr_u (local.get $u) (i32.const 32))))
          (local.set $lo3 (v128.or (i64x2.shl (local.get $u) (i32.const 32))
            (v128.and (local.get $ll) (local.get $low))))
          (local.set $a0 (v128.xor (v128.xor (local.get $hi1) (local.get $a1)) (local.get $ka)))
          (local.set $a1 (local.get $lo1))
          (local.set $a2 (v128.xor (v128.xor (local.get $hi0) (local.get $a3)) (local.get $kb)))
          (local.set $a3 (local.get $lo0))
          (local.set $b0 (v128.xor (v128.xor (local.get $hi3) (local.get $b1)) (local.get $ka)))
          (local.set $b1 (local.get $lo3))
          (local.set $b2 (v128.xor (v128.xor (local.get $hi2) (local.get $b3)) (local.get $kb)))
          (local.set $b3 (local.get $lo2))
          ;; the next round's key: + (W0, W1) = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
          (local.set $ka (i64x2.add (local.get $ka)
            (v128.const i64x2 0x9E3779B97F4A7C15 0x9E3779B97F4A7C15)))
          (local.set $kb (i64x2.add (local.get $kb)
            (v128.const i64x2 0xBB67AE8584CAA73B 0xBB67AE8584CAA73B)))
          (br_if $rounds (local.tee $round (i32.sub (local.get $round) (i32.const 1)))))
        (if (i32.ge_u (local.get $left) (i32.const 16))
          (then
            ;; stream order: words 0-3 of a's first block, of its second, then b's two
            (v128.store (local.get $out)
              (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
                (local.get $a0) (local.get $a1)))
            (v128.store offset=16 (local.get $out)
              (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
                (local.get $a2) (local.get $a3)))
            (v128.store offset=32 (local.get $out)
              (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
                (local.get $a0) (local.get $a1)))
            (v128.store offset=48 (local.get $out)
              (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
                (local.get $a2) (local.get $a3)))
            (v128.store offset=64 (local.get $out)
              (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
                (local.get $b0) (local.get $b1)))
            (v128.store offset=80 (local.get $out)
              (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
                (local.get $b2) (local.get $b3)))
            (v128.store offset=96 (local.get $out)
              (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
                (local.get $b0) (local.get $b1)))
            (v128.store offset=112 (local.get $out)
              (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
                (local.get $b2) (local.get $b3)))
            (local.set $out (i32.add (local.get $out) (i32.const 128)))
            (local.set $left (i32.sub (local.get $left) (i32.const 16)))
            (local.set $ctr (i64x2.add (local.get $ctr) (v128.const i64x2 4 4)))
            (br $group)))
        ;; the last 1..15 words
        (call $store_pair (local.get $out) (local.get $a0) (local.get $a1) (local.get $a2)
          (local.get $a3) (local.get $left))
        (call $store_pair (i32.add (local.get $out) (i32.const 64)) (local.get $b0)
          (local.get $b1) (local.get $b2) (local.get $b3)
          (i32.sub (local.get $left) (i32.const 8)))))
  )

  ;; Store the first `count` (clamped to 0..8) words of a pair of blocks in stream order:
  ;; x0..x3 of the block in lane 0, then of the block in lane 1.
  (func $store_pair (param $ptr i32) (param $x0 v128) (param $x1 v128) (param $x2 v128)
                    (param $x3 v128) (param $count i32)
    (call $store_words (local.get $ptr) (local.get $count)
      (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $x0) (local.get $x1)))
    (call $store_words (i32.add (local.get $ptr) (i32.const 16))
      (i32.sub (local.get $count) (i32.const 2))
      (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $x2) (local.get $x3)))
    (call $store_words (i32.add (local.get $ptr) (i32.const 32))
      (i32.sub (local.get $count) (i32.const 4))
      (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
        (local.get $x0) (local.get $x1)))
    (call $store_words (i32.add (local.get $ptr) (i32.const 48))
      (i32.sub (local.get $count) (i32.const 6))
      (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31
        (local.get $x2) (local.get $x3))))

  ;; Store the first `count` (clamped to 0..2) words of v at ptr.
  (func $store_words (param $ptr i32) (param $count i32) (param $v v128)
    (if (i32.ge_s (local.get $count) (i32.const 2))
      (then (v128.store (local.get $ptr) (local.get $v)))
      (else
        (if (i32.eq (local.get $count) (i32.const 1))
          (then (v128.store64_lane 0 (local.get $ptr) (local.get $v)))))))
)
