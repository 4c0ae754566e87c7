// How the int8-activation kernels (int8_activation_linear.cpp) read their weight codes: the unpack of a chunk of
// 8 blocks and one activation row's integer dot products with it, for 8-bit (GGUF Q8_0) and 4-bit codes.
#pragma once

#include <cstdint>

#include "int8_activations.h"
#include "small_m.h"

namespace cinq_i8 {

#if defined(CINQ_SMALL_M_AVX2)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
// vpdpbusd: the byte products summed four to a lane straight into int32, one instruction where AVX2 takes
// vpmaddubsw + vpmaddwd (the same integers: neither saturates on these codes)
#define CINQ_I8_VNNI 1
#endif
// What a kernel needs of its codes, per chunk of 8 blocks (nb <= 8 of them in the row), with lane j of a chunk's
// sums = block j's integer dot product (0 past nb):
//   Chunk, unpack(w, nb, chunk): the chunk's codes from w (prefetching ahead), as every activation row reads them;
//   x(c, m, b8): activation row m's int8 values for the chunk, in the layout sums() reads;
//   sums(chunk, x, nb), chunk_sums(w, x, nb): one row's sums from an unpacked chunk, or straight from the codes
//   (one row: the unpack stays in registers, where a round trip through L1 cost the M = 1 kernel ~1.15x).
// Both give the same integers, so a row's result never depends on how many rows share the call.

// 8-bit codes (GGUF Q8_0), a block's 32 codes one vector. vpmaddubsw / vpdpbusd multiply unsigned by signed bytes:
//   AVX2: `u` = |q| (-128 stays 0x80, read unsigned as 128) against the activations with q's signs (x is within
//     +-127: negating it cannot overflow);
//   VNNI: q + 128 (q xor 0x80), whose sums carry 128 * (the block's activation codes' sum) too much: the kernel takes
//     it off with the offset term (kCodeOffset, as Q4_0's 8), which the quantized blocks' sums already feed. One
//     xor per block where the sign trick took two vpsignb.
struct Int8Codes {
  static constexpr int64_t kBytes = 32;
#if defined(CINQ_I8_VNNI)
  static constexpr int64_t kCodeOffset = 128;
  struct Chunk {
    __m256i u[8];
  };
  static inline __m256i dot(__m256i u, const int8_t* x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  }
  static inline __m256i load(const uint8_t* w, int j) {
    if ((j & 1) == 0) cinq_small_m::prefetch_ahead(w + j * kBytes, kStreamAhead);
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * kBytes)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  __attribute__((always_inline)) static inline void unpack(const uint8_t* w, int nb, Chunk& ch) {
    for (int j = 0; j < nb; ++j) ch.u[j] = load(w, j);
  }
  __attribute__((always_inline)) static inline __m256i one(const Chunk& ch, const int8_t* x, int j) {
    return dot(ch.u[j], x + j * kBlock);
  }
  __attribute__((always_inline)) static inline __m256i one(const uint8_t* w, const int8_t* x, int j) {
    return dot(load(w, j), x + j * kBlock);
  }
#else
  static constexpr int64_t kCodeOffset = 0;
  struct Chunk {
    __m256i u[8], s[8];
  };
  static inline __m256i dot(__m256i u, __m256i s, const int8_t* x) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, s)), _mm256_set1_epi16(1));
  }
  static inline void load(const uint8_t* w, int j, __m256i& u, __m256i& s) {
    if ((j & 1) == 0) cinq_small_m::prefetch_ahead(w + j * kBytes, kStreamAhead);
    s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * kBytes));
    u = _mm256_sign_epi8(s, s);
  }
  __attribute__((always_inline)) static inline void unpack(const uint8_t* w, int nb, Chunk& ch) {
    for (int j = 0; j < nb; ++j) load(w, j, ch.u[j], ch.s[j]);
  }
  __attribute__((always_inline)) static inline __m256i one(const Chunk& ch, const int8_t* x, int j) {
    return dot(ch.u[j], ch.s[j], x + j * kBlock);
  }
  __attribute__((always_inline)) static inline __m256i one(const uint8_t* w, const int8_t* x, int j) {
    __m256i u, sg;
    load(w, j, u, sg);
    return dot(u, sg, x + j * kBlock);
  }
#endif
  template <typename S>
  static inline const int8_t* x(const Call<S>& c, int64_t m, int64_t b8) { return c.xq + m * c.K + b8 * kBlock; }
  // a row's sums from an unpacked chunk (`src` a Chunk) or straight from the codes (`src` the codes)
  template <typename Src>
  __attribute__((always_inline)) static inline __m256i block_sums(const Src& src, const int8_t* x, int nb) {
    __m256i s[8];
    if (nb == 8) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) s[j] = one(src, x, j);
    } else {
      for (int j = 0; j < 8; ++j) s[j] = j < nb ? one(src, x, j) : _mm256_setzero_si256();
    }
    return reduce8(s);
  }
  __attribute__((always_inline)) static inline __m256i sums(const Chunk& ch, const int8_t* x, int nb) {
    return block_sums(ch, x, nb);
  }
  __attribute__((always_inline)) static inline __m256i chunk_sums(const uint8_t* w, const int8_t* x, int nb) {
    return block_sums(w, x, nb);
  }
};

// 4-bit codes, two blocks per register: blocks p and p + 4 of a chunk load side by side (low 128 bits block p), so
// one shift and two ands unpack 64 codes, and their two vpmaddubsw products add as int16 (each a sum of 4 products
// within 4 * 15 * 127) before one vpmaddwd: lanes 0-3 of the int32 result sum block p, 4-7 block p + 4. Three
// horizontal adds then leave lane j = block j, where reduce8 took six and a permute (the one-block kernel this
// replaced: 1.3x slower at M = 1, 1.4x at M = 5, benchmarks/results/kernel_ab.md). The activations are in pair
// order (pair_chunks), zero past the row's last block, so a missing block's lane adds nothing whatever it holds.
struct Int4Codes {
  static constexpr int64_t kBytes = 16;
  static constexpr int64_t kCodeOffset = 0;
  struct Chunk {
    __m256i lo[4], hi[4];
  };
  static inline void pair(const uint8_t* w, int p, int nb, __m256i& lo, __m256i& hi) {
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m128i* a = reinterpret_cast<const __m128i*>(w + p * kBytes);
    const __m256i q = p >= nb ? _mm256_setzero_si256()
                      : p + 4 < nb ? _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w + (p + 4) * kBytes), a)
                                   : _mm256_zextsi128_si256(_mm_loadu_si128(a));
    lo = _mm256_and_si256(q, low4);
    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
  }
  static inline __m256i dot(__m256i lo, __m256i hi, const int8_t* x, int p) {
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + p * 64));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + p * 64 + 32));
#if defined(CINQ_I8_VNNI)
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xl), hi, xh);
#else
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)),
                             _mm256_set1_epi16(1));
#endif
  }
  static inline void prefetch(const uint8_t* w) {
    cinq_small_m::prefetch_ahead(w, kStreamAhead);
    cinq_small_m::prefetch_ahead(w + 64, kStreamAhead);
  }
  template <typename S>
  static inline const int8_t* x(const Call<S>& c, int64_t m, int64_t b8) {
    return c.xpair + m * c.Bp * kBlock + b8 * kBlock;
  }
  __attribute__((always_inline)) static inline void unpack(const uint8_t* w, int nb, Chunk& ch) {
    prefetch(w);
    for (int p = 0; p < 4; ++p) pair(w, p, nb, ch.lo[p], ch.hi[p]);
  }
  __attribute__((always_inline)) static inline __m256i sums(const Chunk& ch, const int8_t* x, int) {
    __m256i v[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) v[p] = dot(ch.lo[p], ch.hi[p], x, p);
    return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  }
  __attribute__((always_inline)) static inline __m256i chunk_sums(const uint8_t* w, const int8_t* x, int nb) {
    prefetch(w);
    __m256i v[4];
    auto one = [&](int p, int n) __attribute__((always_inline)) {
      __m256i lo, hi;
      pair(w, p, n, lo, hi);
      return dot(lo, hi, x, p);
    };
    if (nb == 8) {
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) v[p] = one(p, 8);
    } else {
      for (int p = 0; p < 4; ++p) v[p] = p < nb ? one(p, nb) : _mm256_setzero_si256();
    }
    return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  }
};
#else
struct Int4Codes { static constexpr int64_t kBytes = 16, kCodeOffset = 0; };
struct Int8Codes { static constexpr int64_t kBytes = 32, kCodeOffset = 0; };
#endif

}  // namespace cinq_i8
