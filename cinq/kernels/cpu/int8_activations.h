// What the int8-activation kernels (int8_activation_linear.cpp) share: activation rows quantized to int8 per block
// of 32 channels (llama.cpp's Q8_0 of the activations), a call's operands, and the float factors of eight blocks.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bf16.h"
#include "small_m.h"

namespace cinq_i8 {

using cinq_bf16::bf16_to_float;

constexpr int64_t kBlock = 32;
// How far ahead of its read position a weight stream asks for lines. These kernels consume their stream at about
// half the bf16 kernel's rate per core, so small_m.h's 512 bytes ask too late to hide the memory's latency: over a
// decode step's weights, cycled from memory, 2-6 KB ahead read 1.10-1.17x faster at one thread (q4_0, q8_0), and
// the bf16 kernel gained nothing from more than 512.
constexpr int64_t kStreamAhead = 4096;

// One block of 32 activations to int8: q = round(x * 127 / amax) (nearest even), s = amax / 127, sum = s * sum(q).
inline void quantize_block(const uint16_t* xb, int8_t* qb, float* s, float* sum) {
#if defined(CINQ_SMALL_M_AVX2)
  // at batch 1 this runs once per linear on K values: scalar, it was a few percent of a decode step
  __m256 v[4];
  __m256 mx = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 8 * i)));
    v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    mx = _mm256_max_ps(mx, _mm256_andnot_ps(_mm256_set1_ps(-0.f), v[i]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // MXCSR: nearest even
  // packs work within 128-bit lanes: the dwords come out as (0-3 of r0, r1, r2, r3, then 4-7 of each)
  const __m256i p = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), p);
  const __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
  const __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  const __m128i t2 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
  const int32_t total = _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 1)));
#else
  float amax = 0.f;
  for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(bf16_to_float(xb[j])));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  int32_t total = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    const int32_t c = static_cast<int32_t>(std::nearbyint(bf16_to_float(xb[j]) * inv));
    qb[j] = static_cast<int8_t>(std::max(-127, std::min(127, c)));
    total += qb[j];
  }
#endif
  *s = amax / 127.f;
  *sum = *s * static_cast<float>(total);
}

// Activation rows to int8 blocks: q [M, K], s [M, ld] (the scale of block b at [m, b]), sum [M, ld] = s * (sum of
// the block's q); ld >= K / 32, the entries past K / 32 set to 0.
void quantize_rows_int8(const uint16_t* x, int64_t M, int64_t K, int64_t ld, int8_t* q, float* s, float* sum) {
  const int64_t B = K / kBlock;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < B; ++b)
      quantize_block(x + (m * B + b) * kBlock, q + (m * B + b) * kBlock, s + m * ld + b, sum + m * ld + b);
    for (int64_t b = B; b < ld; ++b) s[m * ld + b] = sum[m * ld + b] = 0.f;
  }
}

inline float to_float(float v) { return v; }
inline float to_float(at::Half v) { return static_cast<float>(v); }

// What every call shares.
template <typename S>
struct Call {
  const int8_t* xq;      // [M, K]
  const float* xs;       // [M, B]
  const float* xsum;     // [M, B]
  const uint8_t* codes;  // [N, row_bytes]
  const S* scales;       // [N, G]
  const S* mins;         // [N, G] or null
  uint16_t* y;           // [M, N] bf16 bits, rows ldy apart
  int64_t M, N, K, group, offset;
  int64_t Bp;            // K / 32 rounded up to whole vectors of 8: the row length of xs and xsum
  const int32_t* lanes;  // group > 32: [Bp / 8 chunks][9], a chunk's first group, then lane j's group after it
  const int8_t* xpair;   // int4, M = 1: xq in pair order (pair_chunks), else null
  const int8_t* xlane;   // a rows call in lane order (int8_lane_rows.h's lane_chunks), else null
  int64_t ldy;           // y's row stride: N, or wider where y is a column range of a larger output
};

// One row of xq rearranged for Int4Codes (two blocks per register), per chunk of 8 blocks (the last one padded
// with zeros): for p = 0..3, channels 0-15 of block p, 0-15 of block p + 4, 16-31 of block p, 16-31 of block
// p + 4 (64 bytes), so that each 32 bytes are what one vpmaddubsw meets against the low or high nibbles of blocks p
// and p + 4 loaded side by side. out: Bp * 32 bytes.
void pair_chunks(const int8_t* xq, int64_t K, int64_t Bp, int8_t* out) {
  const int64_t B = K / kBlock;
  for (int64_t c = 0; c < Bp / 8; ++c)
    for (int64_t p = 0; p < 4; ++p)
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t side = 0; side < 2; ++side) {
          const int64_t b = c * 8 + p + 4 * side;
          int8_t* to = out + c * 256 + p * 64 + half * 32 + side * 16;
          if (b < B) __builtin_memcpy(to, xq + b * kBlock + half * 16, 16);
          else __builtin_memset(to, 0, 16);
        }
}

#if defined(CINQ_SMALL_M_AVX2)
// 8 consecutive scales as floats
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 factors from p, of which `avail` (>= 1) may be read: fewer only at the tensor's end, where a copy pads them
template <typename S>
__attribute__((always_inline)) inline __m256 load8_within(const S* p, int64_t avail) {
  if (avail >= 8) return load8(p);
  S tmp[8] = {};
  for (int64_t i = 0; i < avail; ++i) tmp[i] = p[i];
  return load8(tmp);
}

// The factors of blocks b8 .. b8 + 7 of output row n as float lanes: `sv` the scales, `zv` = min - offset * scale
// (what multiplies a block's activation sum); lanes past the row's last block are 0 (the loads may reach into the
// next row's factors, which must add nothing). Forced inline: GCC called it out of line, with a vzeroupper and the
// two vectors spilled to the stack on every call, which cost the M = 1 kernel ~1.5x.
template <typename S>
__attribute__((always_inline)) inline void block_factors(const Call<S>& c, int64_t n, int64_t b8, __m256& sv, __m256& zv) {
  const int64_t B = c.K / kBlock, G = c.K / c.group, per = c.group / kBlock;
  // block b8 + j has group (b8 + j) / per: lane j of the groups loaded from g0 (from the call's table: a division
  // per block here cost more than the blocks' dot products)
  const int32_t* lanes = per > 1 ? c.lanes + b8 / 8 * 9 : nullptr;
  const int64_t g0 = per > 1 ? lanes[0] : b8, at = n * G + g0, avail = c.N * G - at;
  sv = load8_within(c.scales + at, avail);
  __m256 mv = c.mins ? load8_within(c.mins + at, avail) : _mm256_setzero_ps();
  if (per > 1) {
    const __m256i iv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 1));
    sv = _mm256_permutevar8x32_ps(sv, iv);
    mv = _mm256_permutevar8x32_ps(mv, iv);
  }
  if (b8 + 8 > B) {
    const __m256 keep = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(B - b8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    sv = _mm256_and_ps(sv, keep);
    mv = _mm256_and_ps(mv, keep);
  }
  zv = _mm256_fmadd_ps(_mm256_set1_ps(-static_cast<float>(c.offset)), sv, mv);
}

// Lane j of the result: the sum of the 8 int32 lanes of s[j] (6 horizontal adds, 2 lane moves, 1 add).
inline __m256i reduce8(const __m256i (&s)[8]) {
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
  // h0's low 128 bits: s0..s3 over their low halves, high 128 bits: over their high halves (h1 likewise: s4..s7)
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

#endif

}  // namespace cinq_i8
