// y[M, N] = x[M, K] @ W^T for weights stored as 4- or 8-bit codes of *float* values, decoded to float32 in
// registers (the weights stay in their 0.5 / 1 byte per value in memory), bf16 activations in and out, for the
// decode-sized calls (a few rows) where the weight stream is the cost:
//   nf4:  W[n, k] = level[q[n, k]] * absmax[(n * K + k) / blocksize]   (bitsandbytes NF4: 16 float levels)
//   fp8:  W[n, k] = e4m3(q[n, k]) * scale[n]                           (float8_e4m3fn codes, per-channel scale;
//                                                                       a per-tensor scale is repeated per row)
// How (AVX2 + FMA + F16C):
//   nf4: integer arithmetic, as grouped_int_linear.cpp: the activations are quantized once per call to int16 per
//        64 channels (small_m.h), the 16 levels are held as int16 (level * 4096, rounded: within 2^-13 of the
//        block's absmax, far below the bf16 rounding of the activations) in two byte tables that `vpshufb` looks
//        up 32 codes at a time (low and high bytes, interleaved back into words), and `vpmaddwd` multiplies them
//        with the activations into int32 sums (at most 8 products of < 2^27 per lane and block: no overflow);
//        per block one conversion and one fused multiply-add by absmax * x_scale / 4096. Codes come two per
//        byte, the first value in the high nibble; the unpacking yields channels 0-7 | 16-23 and 8-15 | 24-31
//        of each 32 in the two halves of the registers, so the activations are permuted once per call to match.
//        (A float version, levels by `vpermps` + `vblendvps`, ran ~2x slower: compute-bound on AVX2.)
//   The activations of fp8 are not quantized: the codes become exact float32 values and multiply the float32
//   activations, so the result is the dequantized weight's own product (up to summation order), what vLLM's
//   dequantize-then-matmul computes.
//   fp8: e4m3 has no hardware conversion before AVX512-FP16; its bits moved into an IEEE half are exact:
//        sign-extend the byte to 16 bits, shift left 7 (exponent and mantissa land in the half's fields, the
//        sign in bit 15) and clear bit 14 (the half's top exponent bit); `vcvtph2ps` widens that half to float32,
//        subnormals included. The half equals the e4m3 value times 2^-8 (exponent bias 15 vs 7), which the
//        per-row scale absorbs. NaN codes (0x7f / 0xff) become finite (480): checkpoints hold none.
// Each thread reads one contiguous range of output rows (small_m.h), one row at a time, prefetching ahead.
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "small_m.h"

namespace {

using cinq_bf16::bf16_to_float;
using cinq_bf16::float_to_bf16;
using cinq_small_m::split_outputs;

constexpr int kRowBlock = 4;  // activation rows sharing one decode of a weight row's codes

// x [M, K] bf16 -> float32, optionally de-interleaved per 16 channels (nf4's nibble order).
std::vector<float> widen(const at::Tensor& x, bool deinterleave) {
  const int64_t M = x.size(0), K = x.size(1);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  std::vector<float> out(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      int64_t at = k;
      if (deinterleave) {
        const int64_t base = k & ~int64_t{15}, i = k & 15;
        at = base + (i & 1) * 8 + (i >> 1);
      }
      out[m * K + at] = bf16_to_float(src[m * K + k]);
    }
  return out;
}

// e4m3fn byte -> float (portable path and tail; the same half-precision route as the vector path, times 2^8).
inline float e4m3_to_float(uint8_t b) {
  const int e = (b >> 3) & 15, mant = b & 7;
  const float mag = e ? std::ldexp(1.f + mant / 8.f, e - 7) : std::ldexp(mant / 8.f, -6);
  return (b & 0x80) ? -mag : mag;
}

constexpr float kLevelScale = 4096.f;  // nf4 levels as int16: level * 4096

struct Call {
  const float* x;        // [M, K] float32 (portable nf4: de-interleaved; AVX2 nf4: unused)
  const int16_t* xq;     // AVX2 nf4: [M, K] int16 activations, permuted per 32 channels
  const float* xs;       // AVX2 nf4: [M, K / 64] their scales
  const uint8_t* lut;    // AVX2 nf4: [32] low bytes then high bytes of the int16 levels
  const uint8_t* codes;  // nf4: [N, K / 2]; fp8: [N, K]
  const float* scale;    // nf4: absmax [N * K / blocksize]; fp8: [N]
  const float* levels;   // nf4: [16]
  const float* row_scale;  // fp8: [M] or null (dynamic activation scales)
  uint16_t* y;           // [M, N] bf16 bits
  int64_t M, N, K, blocksize;
};

template <int MB>
void nf4_row(const Call& c, int64_t m0, int64_t n) {
  const int64_t K = c.K;
  const uint8_t* row = c.codes + n * (K / 2);
  const float* am = c.scale + n * K / c.blocksize;
  float out[MB];
#if defined(CINQ_SMALL_M_AVX2)
  const int64_t B = K / 64;
  const __m256i tlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.lut)));
  const __m256i thi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.lut + 16)));
  const __m128i nib = _mm_set1_epi8(15);
  __m256 t[MB];
  for (int m = 0; m < MB; ++m) t[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* at = row + b * 32;
    if ((b & 1) == 0) cinq_small_m::prefetch_ahead(at);
    __m256i w[4];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + h * 16));
      const __m128i lo = _mm_and_si128(v, nib), hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
      // channel order: byte j holds channels 2j (high nibble) and 2j + 1 (low)
      const __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(hi, lo), _mm_unpacklo_epi8(hi, lo));
      const __m256i L = _mm256_shuffle_epi8(tlo, idx), H = _mm256_shuffle_epi8(thi, idx);
      w[2 * h] = _mm256_unpacklo_epi8(L, H);      // channels 0-7 | 16-23 of these 32
      w[2 * h + 1] = _mm256_unpackhi_epi8(L, H);  // channels 8-15 | 24-31
    }
    const float s = am[b * 64 / c.blocksize] * (1.f / kLevelScale);
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      const __m256i* xr = reinterpret_cast<const __m256i*>(c.xq + (m0 + m) * K + b * 64);
      const __m256i acc = _mm256_add_epi32(
          _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256(xr)),
                           _mm256_madd_epi16(w[1], _mm256_loadu_si256(xr + 1))),
          _mm256_add_epi32(_mm256_madd_epi16(w[2], _mm256_loadu_si256(xr + 2)),
                           _mm256_madd_epi16(w[3], _mm256_loadu_si256(xr + 3))));
      t[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(s * c.xs[(m0 + m) * B + b]), t[m]);
    }
  }
  for (int m = 0; m < MB; ++m) out[m] = cinq_small_m::hsum(t[m]);
#else
  for (int m = 0; m < MB; ++m) {
    float total = 0.f;
    for (int64_t k = 0; k < K; k += 2) {
      const uint8_t b = row[k / 2];
      const float s = am[k / c.blocksize];
      const int64_t base = k & ~int64_t{15}, i = (k & 15) / 2;  // de-interleaved positions of k and k + 1
      total += c.levels[b >> 4] * s * c.x[(m0 + m) * K + base + i] +
               c.levels[b & 15] * s * c.x[(m0 + m) * K + base + 8 + i];
    }
    out[m] = total;
  }
#endif
  for (int m = 0; m < MB; ++m) c.y[(m0 + m) * c.N + n] = float_to_bf16(out[m]);
}

template <int MB>
void fp8_row(const Call& c, int64_t m0, int64_t n) {
  const int64_t K = c.K;
  const uint8_t* row = c.codes + n * K;
  float out[MB];
#if defined(CINQ_SMALL_M_AVX2)
  const __m256i keep = _mm256_set1_epi16(static_cast<int16_t>(0xBFFF));
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    if ((k & 63) == 0) cinq_small_m::prefetch_ahead(row + k);
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(v, 7), keep);
    const __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    const __m256 w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      const float* xr = c.x + (m0 + m) * K + k;
      acc[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), acc[m]));
    }
  }
  const float s = c.scale[n] * 256.f;  // the halves are the e4m3 values times 2^-8
  for (int m = 0; m < MB; ++m) out[m] = cinq_small_m::hsum(acc[m]) * s;
#else
  for (int m = 0; m < MB; ++m) {
    float total = 0.f;
    for (int64_t k = 0; k < K; ++k) total += e4m3_to_float(row[k]) * c.x[(m0 + m) * K + k];
    out[m] = total * c.scale[n];
  }
#endif
  for (int m = 0; m < MB; ++m) {
    const float v = c.row_scale ? out[m] * c.row_scale[m0 + m] : out[m];
    c.y[(m0 + m) * c.N + n] = float_to_bf16(v);
  }
}

template <bool NF4>
void run(const Call& c, int64_t n0, int64_t n1) {
  for (int64_t m0 = 0; m0 < c.M; m0 += kRowBlock) {
    const int64_t mb = std::min<int64_t>(kRowBlock, c.M - m0);
    for (int64_t n = n0; n < n1; ++n) {
      switch (mb) {
        case 1: NF4 ? nf4_row<1>(c, m0, n) : fp8_row<1>(c, m0, n); break;
        case 2: NF4 ? nf4_row<2>(c, m0, n) : fp8_row<2>(c, m0, n); break;
        case 3: NF4 ? nf4_row<3>(c, m0, n) : fp8_row<3>(c, m0, n); break;
        default: NF4 ? nf4_row<4>(c, m0, n) : fp8_row<4>(c, m0, n); break;
      }
    }
  }
}

void check_x(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), name, ": x bf16 [M, K]");
  TORCH_CHECK(x.size(1) % 16 == 0, name, ": K must be a multiple of 16");
}

}  // namespace

// levels: float32 [16] in [-1, 1]; absmax: float32 [N * K / blocksize]; blocksize a multiple of 64 dividing K
torch::Tensor nf4_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor absmax, torch::Tensor levels,
                         int64_t blocksize) {
  check_x(x, "nf4_linear");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  TORCH_CHECK(blocksize >= 64 && blocksize % 64 == 0 && K % blocksize == 0,
              "nf4_linear: blocksize a multiple of 64 dividing K");
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8 && codes.dim() == 2 && codes.is_contiguous() &&
                  codes.size(1) == K / 2, "nf4_linear: codes uint8 [N, K / 2]");
  TORCH_CHECK(absmax.scalar_type() == torch::kFloat32 && absmax.is_contiguous() && absmax.numel() == N * K / blocksize,
              "nf4_linear: absmax float32 [N * K / blocksize]");
  TORCH_CHECK(levels.scalar_type() == torch::kFloat32 && levels.is_contiguous() && levels.numel() == 16,
              "nf4_linear: levels float32 [16]");
#if defined(CINQ_SMALL_M_AVX2)
  const std::vector<float> xf;
  std::vector<int16_t> xq(static_cast<size_t>(M * K)), tmp(static_cast<size_t>(M * K));
  std::vector<float> xs(static_cast<size_t>(M * K / 64)), xsum(static_cast<size_t>(M * K / 64));
  cinq_small_m::quantize_rows_int16(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K, 64,
                                    tmp.data(), xs.data(), xsum.data());
  for (int64_t i = 0; i < M * K; i += 32)  // per 32 channels: 0-7, 16-23, 8-15, 24-31 (the weights' word order)
    for (int64_t j = 0; j < 32; ++j) xq[i + j] = tmp[i + ((j >> 3) == 1 ? j + 8 : (j >> 3) == 2 ? j - 8 : j)];
  uint8_t lut[32];
  const float* lv = levels.data_ptr<float>();
  for (int j = 0; j < 16; ++j) {
    const int32_t q = std::max(-32767, std::min(32767, static_cast<int32_t>(std::lrint(lv[j] * kLevelScale))));
    lut[j] = static_cast<uint8_t>(q & 0xff);
    lut[16 + j] = static_cast<uint8_t>((q >> 8) & 0xff);
  }
#else
  const std::vector<float> xf = widen(x, true);
  std::vector<int16_t> xq;
  std::vector<float> xs;
  uint8_t lut[32] = {};
#endif
  auto y = torch::empty({M, N}, x.options());
  const Call c{xf.data(), xq.data(), xs.data(), lut, codes.data_ptr<uint8_t>(), absmax.data_ptr<float>(),
               levels.data_ptr<float>(), nullptr, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N,
               K, blocksize};
  split_outputs(N, 4, N * (K / 2 + K / blocksize * 4), [&](int64_t n0, int64_t n1) { run<true>(c, n0, n1); });
  return y;
}

// codes: float8_e4m3fn bits as uint8 [N, K]; scale: float32 [N]; row_scale: empty or float32 [M]
torch::Tensor fp8_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scale, torch::Tensor row_scale) {
  check_x(x, "fp8_linear");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  TORCH_CHECK(codes.element_size() == 1 && codes.dim() == 2 && codes.is_contiguous() && codes.size(1) == K,
              "fp8_linear: codes one byte each [N, K]");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() && scale.numel() == N,
              "fp8_linear: scale float32 [N]");
  TORCH_CHECK(row_scale.numel() == 0 || (row_scale.scalar_type() == torch::kFloat32 && row_scale.numel() == M &&
                                         row_scale.is_contiguous()), "fp8_linear: row_scale float32 [M]");
  const std::vector<float> xf = widen(x, false);
  auto y = torch::empty({M, N}, x.options());
  const Call c{xf.data(), nullptr, nullptr, nullptr, static_cast<const uint8_t*>(codes.data_ptr()),
               scale.data_ptr<float>(), nullptr, row_scale.numel() ? row_scale.data_ptr<float>() : nullptr,
               reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N, K, 0};
  split_outputs(N, 4, N * K, [&](int64_t n0, int64_t n1) { run<false>(c, n0, n1); });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("nf4_linear", &nf4_linear, "x @ (level[q] * absmax)^T, NF4 codes (CPU)");
  m.def("fp8_linear", &fp8_linear, "x @ (e4m3(q) * scale)^T, float8_e4m3fn codes (CPU)");
#if defined(CINQ_SMALL_M_AVX2) && defined(__F16C__)
  m.def("has_fast_path", [] { return true; });
#else
  m.def("has_fast_path", [] { return false; });  // the portable loop is slower than dequantize-then-matmul
#endif
}
