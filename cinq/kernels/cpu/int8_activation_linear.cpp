// y[M, N] = x[M, K] @ W^T for grouped integer weights with the activations quantized to int8 per block of 32
// channels (as llama.cpp's Q8_0 of the activations: x[m, k] ~ xs[m, b] * xq[m, k], xs = max |x| over the block /
// 127, codes rounded to nearest even), bf16 in and out, for the decode-sized calls (1-8 rows):
//   int4: W[n, k] = scale[n, g] * (q[n, k] - offset) + min[n, g]   q in 0..15, offset 8 (GGUF Q4_0) or 0
//   int8: W[n, k] = scale[n, g] * q[n, k] + min[n, g]                q in -128..127 (GGUF Q8_0)
// min optional; scales and mins float32 or float16 (GGUF's own: 18 bytes per 32 Q4_0 weights, as in the file, where
// float32 scale + min made it 24). g = k / group, group a multiple of 32. Codes laid out as grouped_int_linear.cpp's.
//
// Why a second kernel: grouped_int_linear.cpp keeps the activations at int16, so every 4-bit code is widened to
// int16 first (~8 vector ops per 16 bytes of weights: compute-bound on AVX2). Here codes stay bytes: per activation
// row one vpmaddubsw (unsigned codes x signed activations, pairs into int16: 2 * 15 * 127 and 2 * 128 * 127 fit)
// and one vpmaddwd by ones into int32 (4-bit codes: two blocks share one unpack and one vpmaddwd, see
// Int4Codes); eight blocks' int32 sums are reduced together and scaled in one FMA by scale * xs. Every row is
// computed the same way whatever the row count (batch-invariant). The cost is numeric: an activation carries up to
// 2^-8 of its block's largest |x| of rounding instead of 2^-16 (the quality cost on the real model is measured in
// benchmarks/int8_activations.py). The offset and min terms use the quantized blocks' sums, once per output row.
// Where the CPU has AVX512-VNNI (Zen 4, Ice Lake and later), one vpdpbusd takes the place of each vpmaddubsw +
// vpmaddwd pair (ad hoc A/B over a SmolLM2 step's weights from memory, 1 thread: M = 1 1.03-1.12x, M = 8 1.07-1.36x).
// A 512-bit variant was tried on Zen 4 (2026-12-07) and not kept: four int4 blocks per vector, each block's int32
// lanes converted and scaled by a widened factor vector (no horizontal adds). With the weights in L2, 1 thread, it
// ran M = 1 1.05-1.2x faster but M = 4 0.8-0.9x and M = 8 0.6-0.75x; Zen 4 splits each 512-bit op in two, and a
// block's convert / multiply / FMA per row costs what the horizontal adds saved. A row's result must not depend on
// the row count, so a faster M = 1 alone could not be taken. Moving the Codes structs below into a header of a
// named namespace made a SmolLM2 Q4_1 step ~15% slower at 1 thread (ad hoc A/B): they stay here.
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "bf16.h"
#include "int8_activations.h"
#include "int8_lane_rows.h"
#include "small_m.h"

namespace {

using cinq_bf16::bf16_to_float;
using cinq_bf16::float_to_bf16;
using cinq_small_m::split_outputs;
using namespace cinq_i8;

constexpr int kMaxRows = 8;
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
#if defined(CINQ_I8_VNNI)
  // rows kernels from 2 rows read the chunk in lane order (int8_lane_rows.h): a row's eight vpdpbusd then need no
  // horizontal adds (a step's linears at M = 2-8 1.1-1.6x, benchmarks/results/decode_kernels_lane_rows.md)
  static constexpr int64_t kLaneRowsFrom = 2;
  __attribute__((always_inline)) static inline void unpack_lanes(const uint8_t* w, int nb, LaneChunk& ch) {
    __m256i u[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) u[j] = j < nb ? load(w, j) : _mm256_setzero_si256();
    int8_lanes(u, ch);
  }
#else
  static constexpr int64_t kLaneRowsFrom = 0;  // none: the sign trick's codes and signs would both need the transpose
#endif
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
  // rows kernels from 3 rows read the chunk in lane order (int8_lane_rows.h): 1.03-1.12x at M = 3-8, where 8-bit
  // codes gained more (their per-row reduction took 9 ops, this one's 3); at 2 rows the transpose, once per chunk,
  // cost about what it saved (ad hoc)
  static constexpr int64_t kLaneRowsFrom = 3;
  __attribute__((always_inline)) static inline void unpack_lanes(const uint8_t* w, int nb, LaneChunk& ch) {
    prefetch(w);
    int4_lanes(w, nb, ch);
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

// Output row n for the one activation row m0 (a batch-1 decode step, the hottest call). Eight blocks at a time:
// each block's integer dot product stays in int32 lanes, the eight are reduced into one vector (lane j: block
// b8 + j) and scaled by their eight factors in one FMA. Per block that leaves the unpack and the multiply-adds; the
// earlier kernel's per-block conversion, broadcast and FMA (with its latency chain, and the factors' round trip
// through memory) measured ~1.15x slower at M = 1.
template <typename Codes, typename S>
void row_kernel_m1(const Call<S>& c, int64_t n) {
  const int64_t B = c.K / kBlock;
  const uint8_t* row = c.codes + n * (B * Codes::kBytes);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b8 = 0; b8 < B; b8 += 8) {
    __m256 sv, zv;
    block_factors(c, n, b8, sv, zv);
    const int nb = static_cast<int>(std::min<int64_t>(8, B - b8));
    const __m256i sums = Codes::chunk_sums(row + b8 * Codes::kBytes, Codes::x(c, 0, b8), nb);
    // xs and xsum are zero past the last block (Bp pads them), so the missing blocks add nothing
    acc = _mm256_fmadd_ps(zv, _mm256_loadu_ps(c.xsum + b8), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sv, _mm256_loadu_ps(c.xs + b8)), acc);
  }
  c.y[n] = float_to_bf16(cinq_small_m::hsum(acc));
}

// Output row n for activation rows m0 .. m0 + MB - 1, each computed exactly as row_kernel_m1 computes one row (the
// same integer sums, the same float operations in the same order), so a row's result does not depend on how many
// rows share the call: a sequence decodes the same tokens alone, beside others, or as a speculative verify of
// k + 1 rows. A chunk's codes are unpacked once for all rows: from a few rows (Codes::kLaneRowsFrom) in lane
// order (int8_lane_rows.h), each row's integer sums then taking no horizontal adds; the integers are the same.
template <typename Codes, typename S, int MB, bool Lanes>
void row_kernel_rows(const Call<S>& c, int64_t m0, int64_t n) {
  const int64_t B = c.K / kBlock;
  const uint8_t* row = c.codes + n * (B * Codes::kBytes);
  __m256 acc[MB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  alignas(32) std::conditional_t<Lanes, LaneChunk, typename Codes::Chunk> chunk;
  for (int64_t b8 = 0; b8 < B; b8 += 8) {
    __m256 sv, zv;
    block_factors(c, n, b8, sv, zv);
    const int nb = static_cast<int>(std::min<int64_t>(8, B - b8));
    if constexpr (Lanes) Codes::unpack_lanes(row + b8 * Codes::kBytes, nb, chunk);
    else Codes::unpack(row + b8 * Codes::kBytes, nb, chunk);
    // rows one at a time (not unrolled): a row's sums plus every row's accumulator would not fit in the sixteen
    // vector registers (unrolled, the spills made 8 rows 1.4x slower)
#pragma GCC unroll 1
    for (int m = 0; m < MB; ++m) {
      __m256i sums;
      if constexpr (Lanes) sums = lane_dots(chunk, lane_x(c, m0 + m, b8));
      else sums = Codes::sums(chunk, Codes::x(c, m0 + m, b8), nb);
      const int64_t xb = (m0 + m) * c.Bp + b8;
      acc[m] = _mm256_fmadd_ps(zv, _mm256_loadu_ps(c.xsum + xb), acc[m]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sv, _mm256_loadu_ps(c.xs + xb)), acc[m]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) c.y[(m0 + m) * c.ldy + n] = float_to_bf16(cinq_small_m::hsum(acc[m]));
}

// Rows m0 .. m0 + mb - 1 of output row n, the codes' chunks in lane order or not (the same integers either way).
template <typename Codes, typename S, bool Lanes>
void rows_block(const Call<S>& c, int64_t m0, int64_t mb, int64_t n) {
  switch (mb) {
    case 1: row_kernel_rows<Codes, S, 1, Lanes>(c, m0, n); break;
    case 2: row_kernel_rows<Codes, S, 2, Lanes>(c, m0, n); break;
    case 3: row_kernel_rows<Codes, S, 3, Lanes>(c, m0, n); break;
    case 4: row_kernel_rows<Codes, S, 4, Lanes>(c, m0, n); break;
    case 5: row_kernel_rows<Codes, S, 5, Lanes>(c, m0, n); break;
    case 6: row_kernel_rows<Codes, S, 6, Lanes>(c, m0, n); break;
    case 7: row_kernel_rows<Codes, S, 7, Lanes>(c, m0, n); break;
    default: row_kernel_rows<Codes, S, 8, Lanes>(c, m0, n); break;
  }
}

// The batch-1 loop compiled on its own: inlined into run(), its code changed with every edit to the rows kernels
template <typename Codes, typename S>
__attribute__((noinline)) void run_m1(const Call<S>& c, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) row_kernel_m1<Codes, S>(c, n);
}

template <typename Codes, typename S>
void run(const Call<S>& c, int64_t n0, int64_t n1) {
  if (c.M == 1) return run_m1<Codes, S>(c, n0, n1);
  // past kMaxRows rows (a prefill), 64 outputs at a time stay in cache across the row blocks
  const int64_t chunk = c.M <= kMaxRows ? n1 - n0 : 64;
  for (int64_t a = n0; a < n1; a += chunk) {
    const int64_t e = std::min(n1, a + chunk);
    for (int64_t m0 = 0; m0 < c.M; m0 += kMaxRows) {
      const int64_t mb = std::min<int64_t>(kMaxRows, c.M - m0);
      for (int64_t n = a; n < e; ++n) {
        if constexpr (Codes::kLaneRowsFrom > 0) {
          if (c.xlane != nullptr) {
            rows_block<Codes, S, true>(c, m0, mb, n);
            continue;
          }
        }
        rows_block<Codes, S, false>(c, m0, mb, n);
      }
    }
  }
}
#endif

template <typename Codes, typename S>
torch::Tensor linear_typed(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                           const torch::Tensor& mins, int64_t group, int64_t offset, const torch::Tensor* out) {
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0), G = K / group, Bp = (K / kBlock + 7) / 8 * 8;
  std::vector<int8_t> xq(static_cast<size_t>(M * K));
  std::vector<float> xs(static_cast<size_t>(M * Bp)), xsum(static_cast<size_t>(M * Bp));
  quantize_rows_int8(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K, Bp, xq.data(), xs.data(),
                     xsum.data());
  std::vector<int32_t> lanes;
  if (group > kBlock)
    for (int64_t b8 = 0; b8 < Bp; b8 += 8) {
      const int64_t g0 = b8 / (group / kBlock);
      lanes.push_back(static_cast<int32_t>(g0));
      for (int64_t j = 0; j < 8; ++j)
        lanes.push_back(static_cast<int32_t>(std::min<int64_t>((b8 + j) / (group / kBlock) - g0, 7)));
    }
  // the layouts the codes' kernels read: Int4's M = 1 kernel pairs, the rows kernels' lanes
  std::vector<int8_t> xpair, xlane;
  const bool in_lanes = Codes::kLaneRowsFrom > 0 && M >= Codes::kLaneRowsFrom;
  if (Codes::kBytes == Int4Codes::kBytes && !in_lanes) {
    xpair.resize(static_cast<size_t>(M * Bp * kBlock));
    for (int64_t m = 0; m < M; ++m) pair_chunks(xq.data() + m * K, K, Bp, xpair.data() + m * Bp * kBlock);
  } else if (in_lanes) {
    xlane.resize(static_cast<size_t>(M * Bp * kBlock));
    for (int64_t m = 0; m < M; ++m) lane_chunks(xq.data() + m * K, K, Bp, xlane.data() + m * Bp * kBlock);
  }
  auto y = out != nullptr ? *out : torch::empty({M, N}, x.options());
  const Call<S> c{xq.data(), xs.data(), xsum.data(), static_cast<const uint8_t*>(codes.data_ptr()),
                  scales.data_ptr<S>(), mins.numel() ? mins.data_ptr<S>() : nullptr,
                  reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N, K, group,
                  offset + Codes::kCodeOffset, Bp, lanes.data(), xpair.empty() ? nullptr : xpair.data(),
                  xlane.empty() ? nullptr : xlane.data(), y.stride(0)};
  const int64_t bytes = N * (K / kBlock * Codes::kBytes + G * static_cast<int64_t>(sizeof(S)) * (mins.numel() ? 2 : 1));
#if defined(CINQ_SMALL_M_AVX2)
  split_outputs(N, 4, bytes, [&](int64_t n0, int64_t n1) { run<Codes, S>(c, n0, n1); });
#else
  TORCH_CHECK(false, "int8_activation_linear: built without AVX2 + FMA (has_fast_path() is false)");
#endif
  return y;
}

template <typename Codes>
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                     const torch::Tensor& mins, int64_t group, int64_t offset, const char* name,
                     const torch::Tensor* out = nullptr) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), name, ": x bf16 [M, K]");
  const int64_t K = x.size(1), N = codes.size(0);
  TORCH_CHECK(out == nullptr || (out->dim() == 2 && out->scalar_type() == torch::kBFloat16 &&
                                 out->size(0) == x.size(0) && out->size(1) == N && out->stride(1) == 1),
              name, ": out bf16 [M, N] with unit column stride (rows may be further apart)");
  TORCH_CHECK(group >= 32 && group % 32 == 0 && K % group == 0, name, ": group a multiple of 32 dividing K");
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.element_size() == 1 &&
                  codes.size(1) == K / kBlock * Codes::kBytes,
              name, ": codes [N, K * bits / 8], one byte per element");
  const auto st = scales.scalar_type();
  TORCH_CHECK((st == torch::kFloat32 || st == torch::kFloat16) && scales.is_contiguous() &&
                  scales.numel() == N * (K / group),
              name, ": scales float32 or float16 [N, K / group]");
  TORCH_CHECK(mins.numel() == 0 || (mins.scalar_type() == st && mins.is_contiguous() && mins.numel() == scales.numel()),
              name, ": mins empty, or [N, K / group] of the scales' dtype");
  if (st == torch::kFloat16) return linear_typed<Codes, at::Half>(x, codes, scales, mins, group, offset, out);
  return linear_typed<Codes, float>(x, codes, scales, mins, group, offset, out);
}

#if !defined(CINQ_SMALL_M_AVX2)
struct Int4Codes { static constexpr int64_t kBytes = 16, kCodeOffset = 0, kLaneRowsFrom = 0; };
struct Int8Codes { static constexpr int64_t kBytes = 32, kCodeOffset = 0, kLaneRowsFrom = 0; };
#endif

}  // namespace

// q_offset: 8 for W = scale * (q - 8) (+ min), GGUF Q4_0 with an empty mins; else 0
torch::Tensor int4_affine_linear_i8(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor mins,
                                    int64_t group, int64_t q_offset) {
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8, "int4_affine_linear_i8: codes uint8");
  return linear<Int4Codes>(x, codes, scales, mins, group, q_offset, "int4_affine_linear_i8");
}

torch::Tensor int8_grouped_linear_i8(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor mins,
                                     int64_t group) {
  TORCH_CHECK(codes.scalar_type() == torch::kInt8, "int8_grouped_linear_i8: codes int8");
  return linear<Int8Codes>(x, codes, scales, mins, group, 0, "int8_grouped_linear_i8");
}

// The same into `out`, a [M, N] view whose rows may be further apart (a column range of a wider output): what the
// fused decode step's parts write, so that a split linear needs no concatenation afterwards.
void int4_affine_linear_i8_out(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor mins,
                               int64_t group, int64_t q_offset, torch::Tensor out) {
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8, "int4_affine_linear_i8_out: codes uint8");
  linear<Int4Codes>(x, codes, scales, mins, group, q_offset, "int4_affine_linear_i8_out", &out);
}

void int8_grouped_linear_i8_out(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor mins,
                                int64_t group, torch::Tensor out) {
  TORCH_CHECK(codes.scalar_type() == torch::kInt8, "int8_grouped_linear_i8_out: codes int8");
  linear<Int8Codes>(x, codes, scales, mins, group, 0, "int8_grouped_linear_i8_out", &out);
}

// The activations as this kernel quantizes them (codes int8 [M, K], scales float32 [M, K / 32]): what the tests'
// float reference of the same quantized math starts from.
std::vector<torch::Tensor> quantize_activations_i8(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.size(1) % kBlock == 0,
              "quantize_activations_i8: x bf16 [M, K], K a multiple of 32");
  const int64_t M = x.size(0), K = x.size(1);
  auto q = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto s = torch::empty({M, K / kBlock}, x.options().dtype(torch::kFloat32));
  std::vector<float> sum(static_cast<size_t>(M * (K / kBlock)));
  quantize_rows_int8(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K, K / kBlock, q.data_ptr<int8_t>(),
                     s.data_ptr<float>(), sum.data());
  return {q, s};
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.*_i8 in C++, as grouped_int_linear.cpp's
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  cinq_small_m::def_linear_op(
      m, "int4_affine_linear_i8(Tensor x, Tensor codes, Tensor scales, Tensor mins, int group, int q_offset) -> Tensor",
      &int4_affine_linear_i8);
  cinq_small_m::def_linear_op(
      m, "int8_grouped_linear_i8(Tensor x, Tensor codes, Tensor scales, Tensor mins, int group) -> Tensor",
      &int8_grouped_linear_i8);
  m.def("int4_affine_linear_i8_out(Tensor x, Tensor codes, Tensor scales, Tensor mins, int group, int q_offset, "
        "Tensor(a!) out) -> ()");
  m.impl("int4_affine_linear_i8_out", torch::dispatch(c10::DispatchKey::CPU, &int4_affine_linear_i8_out));
  m.impl("int4_affine_linear_i8_out",
         torch::dispatch(c10::DispatchKey::Meta, [](at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t,
                                                    at::Tensor) {}));
  m.def("int8_grouped_linear_i8_out(Tensor x, Tensor codes, Tensor scales, Tensor mins, int group, "
        "Tensor(a!) out) -> ()");
  m.impl("int8_grouped_linear_i8_out", torch::dispatch(c10::DispatchKey::CPU, &int8_grouped_linear_i8_out));
  m.impl("int8_grouped_linear_i8_out",
         torch::dispatch(c10::DispatchKey::Meta, [](at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t,
                                                    at::Tensor) {}));
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_affine_linear_i8", &int4_affine_linear_i8, "x @ (scale * (q - offset) + min)^T, int8 activations");
  m.def("int8_grouped_linear_i8", &int8_grouped_linear_i8, "x @ (scale * q + min)^T, int8 activations");
  m.def("int4_affine_linear_i8_out", &int4_affine_linear_i8_out, "int4_affine_linear_i8 into out (rows may be strided)");
  m.def("int8_grouped_linear_i8_out", &int8_grouped_linear_i8_out, "int8_grouped_linear_i8 into out");
  m.def("quantize_activations_i8", &quantize_activations_i8, "x to int8 per 32-block, as the kernels do");
  m.def("has_fast_path", [] { return cinq_small_m::kFastPath; });
#if defined(CINQ_I8_VNNI)
  m.def("has_vnni", [] { return true; });
#else
  m.def("has_vnni", [] { return false; });
#endif
}
