// The int8-activation rows kernels' lane order (int8_activation_linear.cpp's row_kernel_rows, from a few rows):
// a chunk of 8 blocks is transposed once, so that vector s holds channels 4s..4s+3 of blocks 0..7 (int32 lane j:
// block j), and each activation row, laid out the same way, meets it in eight multiply-adds whose int32 lanes are
// the eight blocks' dot products. The batch-1 kernel's layouts need horizontal adds per row instead (3 for 4-bit
// codes, 6 and two lane moves for 8-bit; `vphaddd` issues about once per 1.5 cycles on Zen 4, against ~2.4
// `vpdpbusd` per cycle, measured 2026-12-07). The integers are the same either way, and the float operations after
// them are the rows kernel's own, so a row's result does not depend on which layout or how many rows computed it.
#pragma once

#include <cstdint>

#include "int8_activations.h"
#include "small_m.h"

namespace cinq_i8 {

// One row of xq in lane order, per chunk of 8 blocks (the last one padded with zeros): for s = 0..7, channels
// 4s..4s+3 of blocks 0..7 (32 bytes). out: Bp * 32 bytes.
inline void lane_chunks(const int8_t* xq, int64_t K, int64_t Bp, int8_t* out) {
  const int64_t B = K / kBlock;
  for (int64_t c = 0; c < Bp / 8; ++c)
    for (int64_t s = 0; s < 8; ++s)
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t b = c * 8 + j;
        int8_t* to = out + c * 256 + s * 32 + j * 4;
        if (b < B) __builtin_memcpy(to, xq + b * kBlock + s * 4, 4);
        else __builtin_memset(to, 0, 4);
      }
}

#if defined(CINQ_SMALL_M_AVX2)
// A chunk's codes in lane order: t[s] lane j = block j's channels 4s..4s+3 (0 past the row's last block).
struct LaneChunk {
  __m256i t[8];
};

// Activation row m's chunk from b8 on, in lane order
template <typename S>
inline const int8_t* lane_x(const Call<S>& c, int64_t m, int64_t b8) {
  return c.xlane + m * c.Bp * kBlock + b8 * kBlock;
}

// One row's eight block sums (lane j: block j). Without VNNI only 4-bit codes come here: two vpmaddubsw pairs add
// as int16 within 4 * 15 * 127.
__attribute__((always_inline)) inline __m256i lane_dots(const LaneChunk& ch, const int8_t* x) {
  auto xs = [&](int s) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + s * 32)); };
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  // four chains of two: at 2 rows one chain of eight (~4 cycles each) held every row up
  __m256i v[4];
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s)
    v[s] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ch.t[s], xs(s)), ch.t[s + 4], xs(s + 4));
  return _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
#else
  __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int s = 0; s < 8; s += 2)
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(ch.t[s], xs(s)),
                                                               _mm256_maddubs_epi16(ch.t[s + 1], xs(s + 1))),
                                              _mm256_set1_epi16(1)));
  return a;
#endif
}

// The 4 x 4 transpose of dwords within each 128-bit lane: out[s] dword p of each half = q[p]'s dword s there.
__attribute__((always_inline)) inline void transpose4x4_epi32(const __m256i (&q)[4], __m256i (&out)[4]) {
  const __m256i a0 = _mm256_unpacklo_epi32(q[0], q[1]), a1 = _mm256_unpackhi_epi32(q[0], q[1]);
  const __m256i a2 = _mm256_unpacklo_epi32(q[2], q[3]), a3 = _mm256_unpackhi_epi32(q[2], q[3]);
  out[0] = _mm256_unpacklo_epi64(a0, a2);
  out[1] = _mm256_unpackhi_epi64(a0, a2);
  out[2] = _mm256_unpacklo_epi64(a1, a3);
  out[3] = _mm256_unpackhi_epi64(a1, a3);
}

// 4-bit codes, 16 bytes a block (low nibbles channels 0-15, high nibbles 16-31): blocks p and p + 4 load side by
// side, so one 4 x 4 transpose of the four pairs' dwords puts channels 4s..4s+3 (low nibbles) and 16 + 4s..
// (high) of block j in lane j, before the nibbles are split.
__attribute__((always_inline)) inline void int4_lanes(const uint8_t* w, int nb, LaneChunk& ch) {
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256i q[4], tq[4];
  for (int p = 0; p < 4; ++p) {
    const __m128i* a = reinterpret_cast<const __m128i*>(w + p * 16);
    q[p] = p >= nb ? _mm256_setzero_si256()
           : p + 4 < nb ? _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w + (p + 4) * 16), a)
                        : _mm256_zextsi128_si256(_mm_loadu_si128(a));
  }
  transpose4x4_epi32(q, tq);
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    ch.t[s] = _mm256_and_si256(tq[s], low4);
    ch.t[s + 4] = _mm256_and_si256(_mm256_srli_epi16(tq[s], 4), low4);
  }
}

// 8-bit codes, one block per vector (u[j] = block j, as the kernel reads it): the 8 x 8 transpose of dwords.
__attribute__((always_inline)) inline void int8_lanes(const __m256i (&u)[8], LaneChunk& ch) {
  __m256i lo[4], hi[4];
  transpose4x4_epi32({u[0], u[1], u[2], u[3]}, lo);  // lo[s]: dwords s (low half) and s + 4 (high) of u0..u3
  transpose4x4_epi32({u[4], u[5], u[6], u[7]}, hi);
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    ch.t[s] = _mm256_permute2x128_si256(lo[s], hi[s], 0x20);
    ch.t[s + 4] = _mm256_permute2x128_si256(lo[s], hi[s], 0x31);
  }
}
#endif

}  // namespace cinq_i8
