// y[M, N] = x[M, K] @ W^T for grouped integer weights with the activations quantized to int8 per block of 32
// channels (as llama.cpp's Q8_0 of the activations: x[m, k] ~ xs[m, b] * xq[m, k], xs = max |x| over the block /
// 127, codes rounded to nearest even), bf16 in and out, for the decode-sized calls (1-8 rows):
//   int4: W[n, k] = scale[n, g] * (q[n, k] - offset) + min[n, g]   q in 0..15, offset 8 (GGUF Q4_0) or 0
//   int8: W[n, k] = scale[n, g] * q[n, k] + min[n, g]                q in -128..127 (GGUF Q8_0)
// min optional; scales and mins float32 or float16 (GGUF's own: 18 bytes per 32 Q4_0 weights, as in the file, where
// float32 scale + min made it 24). g = k / group, group a multiple of 32. Codes laid out as grouped_int_linear.cpp's.
//
// Why a second kernel: grouped_int_linear.cpp keeps the activations at int16, so every 4-bit code is widened to
// int16 first (~8 vector ops per 16 bytes of weights: compute-bound on AVX2). Here a block's 32 codes stay bytes:
// one 16-byte broadcast load, one variable shift and one and unpack them; per activation row one vpmaddubsw
// (unsigned codes x signed activations, pairs into int16: 2 * 15 * 127 and 2 * 128 * 127 fit) and one vpmaddwd by
// ones into int32; eight blocks' int32 sums are reduced together and scaled in one FMA by scale * xs. Every row is
// computed the same way whatever the row count (batch-invariant). The cost is numeric: an activation carries up to
// 2^-8 of its block's largest |x| of rounding instead of 2^-16 (the quality cost on the real model is measured in
// benchmarks/int8_activations.py). The offset and min terms use the quantized blocks' sums, once per output row.
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "bf16.h"
#include "small_m.h"

namespace {

using cinq_bf16::bf16_to_float;
using cinq_bf16::float_to_bf16;
using cinq_small_m::split_outputs;

constexpr int kMaxRows = 8;
constexpr int64_t kBlock = 32;

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
  uint16_t* y;           // [M, N] bf16 bits
  int64_t M, N, K, group, offset;
  int64_t Bp;            // K / 32 rounded up to whole vectors of 8: the row length of xs and xsum
  const int32_t* lanes;  // group > 32: [Bp / 8 chunks][9], a chunk's first group, then lane j's group after it
};

#if defined(CINQ_SMALL_M_AVX2)
// A block's 32 codes as bytes: `u` what vpmaddubsw takes unsigned, `s` whose signs the activations take (int8).
struct Int4Codes {
  static constexpr int64_t kBytes = 16;  // per 32 channels
  static inline void load(const uint8_t* p, __m256i& u, __m256i&) {
    // both halves get the 16 bytes; the upper 128 bits shift right by 4 (its 64-bit lanes: the bits that cross
    // from the next byte land in the high nibble, which the and drops): low nibbles = channels 0-15, high = 16-31
    const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    u = _mm256_and_si256(_mm256_srlv_epi64(w, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
  }
  static inline __m256i dot16(__m256i u, __m256i, __m256i x) { return _mm256_maddubs_epi16(u, x); }
};

struct Int8Codes {
  static constexpr int64_t kBytes = 32;
  static inline void load(const uint8_t* p, __m256i& u, __m256i& s) {
    s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    u = _mm256_sign_epi8(s, s);  // |q|; -128 stays 0x80, read unsigned as 128
  }
  // x takes the sign of q (x is within +-127, so negating it cannot overflow)
  static inline __m256i dot16(__m256i u, __m256i s, __m256i x) {
    return _mm256_maddubs_epi16(u, _mm256_sign_epi8(x, s));
  }
};

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

// Output row n for the one activation row m0 (a batch-1 decode step, the hottest call). Eight blocks at a time:
// each block's integer dot product stays in int32 lanes, the eight are reduced into one vector (lane j: block
// b8 + j) and scaled by their eight factors in one FMA. Per block that leaves the unpack and two multiply-adds; the
// earlier kernel's per-block conversion, broadcast and FMA (with its latency chain, and the factors' round trip
// through memory) measured ~1.15x slower at M = 1.
template <typename Codes, typename S>
void row_kernel_m1(const Call<S>& c, int64_t m0, int64_t n) {
  const int64_t K = c.K, B = K / kBlock;
  const uint8_t* row = c.codes + n * (B * Codes::kBytes);
  const int8_t* xq = c.xq + m0 * K;
  const float* xs = c.xs + m0 * c.Bp;
  const float* xsum = c.xsum + m0 * c.Bp;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  auto dot = [&](int64_t b) __attribute__((always_inline)) {
    const int64_t at = b * Codes::kBytes;
    if ((at & 63) == 0) cinq_small_m::prefetch_ahead(row + at);
    __m256i u, s;
    Codes::load(row + at, u, s);
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
    return _mm256_madd_epi16(Codes::dot16(u, s, xv), ones);
  };
  for (int64_t b8 = 0; b8 < B; b8 += 8) {
    __m256 sv, zv;
    block_factors(c, n, b8, sv, zv);
    __m256i s[8];
    if (b8 + 8 <= B) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) s[j] = dot(b8 + j);
    } else {
      for (int j = 0; j < 8; ++j) s[j] = b8 + j < B ? dot(b8 + j) : _mm256_setzero_si256();
    }
    // xs and xsum are zero past the last block (Bp pads them), so the missing blocks add nothing
    acc = _mm256_fmadd_ps(zv, _mm256_loadu_ps(xsum + b8), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(s)), _mm256_mul_ps(sv, _mm256_loadu_ps(xs + b8)), acc);
  }
  c.y[m0 * c.N + n] = float_to_bf16(cinq_small_m::hsum(acc));
}

// Output row n for activation rows m0 .. m0 + MB - 1, each computed exactly as row_kernel_m1 computes one row (the
// same integer sums, the same reduction, the same float operations in the same order), so a row's result does not
// depend on how many rows share the call: a sequence decodes the same tokens alone, beside others, or as a
// speculative verify of k + 1 rows. Eight blocks' codes are unpacked once into L1 and reread per row (one load
// where the unpack took three operations).
template <typename Codes, typename S, int MB>
void row_kernel_rows(const Call<S>& c, int64_t m0, int64_t n) {
  const int64_t K = c.K, B = K / kBlock;
  const uint8_t* row = c.codes + n * (B * Codes::kBytes);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  alignas(32) __m256i ub[8], sb[8];
  for (int64_t b8 = 0; b8 < B; b8 += 8) {
    __m256 sv, zv;
    block_factors(c, n, b8, sv, zv);
    const int nb = static_cast<int>(std::min<int64_t>(8, B - b8));
    for (int j = 0; j < nb; ++j) {
      const int64_t at = (b8 + j) * Codes::kBytes;
      if ((at & 63) == 0) cinq_small_m::prefetch_ahead(row + at);
      Codes::load(row + at, ub[j], sb[j]);
    }
    // rows one at a time (not unrolled): eight int32 sums per row plus every row's accumulator would not fit in
    // the sixteen vector registers (unrolled, the spills made 8 rows 1.4x slower)
#pragma GCC unroll 1
    for (int m = 0; m < MB; ++m) {
      const int8_t* xq = c.xq + (m0 + m) * K + b8 * kBlock;
      auto dot = [&](int j) __attribute__((always_inline)) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + j * kBlock));
        return _mm256_madd_epi16(Codes::dot16(ub[j], sb[j], xv), ones);
      };
      __m256i s[8];
      if (nb == 8) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) s[j] = dot(j);
      } else {
        for (int j = 0; j < 8; ++j) s[j] = j < nb ? dot(j) : _mm256_setzero_si256();
      }
      const int64_t xb = (m0 + m) * c.Bp + b8;
      acc[m] = _mm256_fmadd_ps(zv, _mm256_loadu_ps(c.xsum + xb), acc[m]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(s)), _mm256_mul_ps(sv, _mm256_loadu_ps(c.xs + xb)), acc[m]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) c.y[(m0 + m) * c.N + n] = float_to_bf16(cinq_small_m::hsum(acc[m]));
}

template <typename Codes, typename S>
void run(const Call<S>& c, int64_t n0, int64_t n1) {
  if (c.M == 1) {
    for (int64_t n = n0; n < n1; ++n) row_kernel_m1<Codes, S>(c, 0, n);
    return;
  }
  // past kMaxRows rows (a prefill), 64 outputs at a time stay in cache across the row blocks
  const int64_t chunk = c.M <= kMaxRows ? n1 - n0 : 64;
  for (int64_t a = n0; a < n1; a += chunk) {
    const int64_t e = std::min(n1, a + chunk);
    for (int64_t m0 = 0; m0 < c.M; m0 += kMaxRows) {
      const int64_t mb = std::min<int64_t>(kMaxRows, c.M - m0);
      for (int64_t n = a; n < e; ++n) {
        switch (mb) {
          case 1: row_kernel_rows<Codes, S, 1>(c, m0, n); break;
          case 2: row_kernel_rows<Codes, S, 2>(c, m0, n); break;
          case 3: row_kernel_rows<Codes, S, 3>(c, m0, n); break;
          case 4: row_kernel_rows<Codes, S, 4>(c, m0, n); break;
          case 5: row_kernel_rows<Codes, S, 5>(c, m0, n); break;
          case 6: row_kernel_rows<Codes, S, 6>(c, m0, n); break;
          case 7: row_kernel_rows<Codes, S, 7>(c, m0, n); break;
          default: row_kernel_rows<Codes, S, 8>(c, m0, n); break;
        }
      }
    }
  }
}
#endif

template <typename Codes, typename S>
torch::Tensor linear_typed(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                           const torch::Tensor& mins, int64_t group, int64_t offset) {
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
  auto y = torch::empty({M, N}, x.options());
  const Call<S> c{xq.data(), xs.data(), xsum.data(), static_cast<const uint8_t*>(codes.data_ptr()),
                  scales.data_ptr<S>(), mins.numel() ? mins.data_ptr<S>() : nullptr,
                  reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N, K, group, offset, Bp, lanes.data()};
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
                     const torch::Tensor& mins, int64_t group, int64_t offset, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), name, ": x bf16 [M, K]");
  const int64_t K = x.size(1), N = codes.size(0);
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
  if (st == torch::kFloat16) return linear_typed<Codes, at::Half>(x, codes, scales, mins, group, offset);
  return linear_typed<Codes, float>(x, codes, scales, mins, group, offset);
}

#if !defined(CINQ_SMALL_M_AVX2)
struct Int4Codes { static constexpr int64_t kBytes = 16; };
struct Int8Codes { static constexpr int64_t kBytes = 32; };
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
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_affine_linear_i8", &int4_affine_linear_i8, "x @ (scale * (q - offset) + min)^T, int8 activations");
  m.def("int8_grouped_linear_i8", &int8_grouped_linear_i8, "x @ (scale * q + min)^T, int8 activations");
  m.def("quantize_activations_i8", &quantize_activations_i8, "x to int8 per 32-block, as the kernels do");
  m.def("has_fast_path", [] { return cinq_small_m::kFastPath; });
}
