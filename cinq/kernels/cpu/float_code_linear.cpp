// y[M, N] = x[M, K] @ W^T for weights stored as 4- or 8-bit codes of *float* values, decoded to float32 in
// registers (the weights stay in their 0.5 / 1 byte per value in memory), bf16 activations in and out, for the
// decode-sized calls (a few rows) where the weight stream is the cost:
//   nf4:  W[n, k] = level[q[n, k]] * absmax[(n * K + k) / blocksize]   (bitsandbytes NF4: 16 float levels)
//   fp8:  W[n, k] = e4m3(q[n, k]) * scale[n]                           (float8_e4m3fn codes, per-channel scale;
//                                                                       a per-tensor scale is repeated per row)
// Unlike the integer kernels (grouped_int_linear.cpp) the activations are not quantized: the codes become exact
// float32 values and multiply the float32 activations, so the result is the dequantized weight's own product (up
// to summation order) — what bitsandbytes' / vLLM's dequantize-then-matmul computes.
//
// How (AVX2 + FMA + F16C):
//   nf4: 8 codes -> 8 int32 lanes; the 16 levels sit in two registers and `vpermps` looks up the low 3 bits in
//        each, `vblendvps` picks by bit 3 (moved to the sign bit). Codes come two per byte, the first value in the
//        high nibble; the activations are de-interleaved once per call (per 16 channels: the 8 even ones, then the
//        8 odd ones) so the high nibbles multiply one vector and the low nibbles the next.
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

struct Call {
  const float* x;        // [M, K] float32 (nf4: de-interleaved)
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
  const __m256 lut_lo = _mm256_loadu_ps(c.levels), lut_hi = _mm256_loadu_ps(c.levels + 8);
  const __m256i nib = _mm256_set1_epi32(15);
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += c.blocksize) {
    const __m256 s = _mm256_set1_ps(am[k0 / c.blocksize]);
    for (int64_t k = k0; k < k0 + c.blocksize; k += 16) {
      if ((k & 127) == 0) cinq_small_m::prefetch_ahead(row + k / 2);
      int64_t eight;
      std::memcpy(&eight, row + k / 2, 8);
      const __m256i v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight));
      const __m256i hi = _mm256_srli_epi32(v, 4), lo = _mm256_and_si256(v, nib);
      const __m256 wh = _mm256_mul_ps(s, _mm256_blendv_ps(_mm256_permutevar8x32_ps(lut_lo, hi),
                                                           _mm256_permutevar8x32_ps(lut_hi, hi),
                                                           _mm256_castsi256_ps(_mm256_slli_epi32(hi, 28))));
      const __m256 wl = _mm256_mul_ps(s, _mm256_blendv_ps(_mm256_permutevar8x32_ps(lut_lo, lo),
                                                           _mm256_permutevar8x32_ps(lut_hi, lo),
                                                           _mm256_castsi256_ps(_mm256_slli_epi32(lo, 28))));
#pragma GCC unroll 4
      for (int m = 0; m < MB; ++m) {
        const float* xr = c.x + (m0 + m) * K + k;
        acc[m] = _mm256_fmadd_ps(wl, _mm256_loadu_ps(xr + 8), _mm256_fmadd_ps(wh, _mm256_loadu_ps(xr), acc[m]));
      }
    }
  }
  for (int m = 0; m < MB; ++m) out[m] = cinq_small_m::hsum(acc[m]);
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

// levels: float32 [16]; absmax: float32 [N * K / blocksize]; blocksize a multiple of 16 dividing K
torch::Tensor nf4_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor absmax, torch::Tensor levels,
                         int64_t blocksize) {
  check_x(x, "nf4_linear");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  TORCH_CHECK(blocksize >= 16 && blocksize % 16 == 0 && K % blocksize == 0,
              "nf4_linear: blocksize a multiple of 16 dividing K");
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8 && codes.dim() == 2 && codes.is_contiguous() &&
                  codes.size(1) == K / 2, "nf4_linear: codes uint8 [N, K / 2]");
  TORCH_CHECK(absmax.scalar_type() == torch::kFloat32 && absmax.is_contiguous() && absmax.numel() == N * K / blocksize,
              "nf4_linear: absmax float32 [N * K / blocksize]");
  TORCH_CHECK(levels.scalar_type() == torch::kFloat32 && levels.is_contiguous() && levels.numel() == 16,
              "nf4_linear: levels float32 [16]");
  const std::vector<float> xf = widen(x, true);
  auto y = torch::empty({M, N}, x.options());
  const Call c{xf.data(), codes.data_ptr<uint8_t>(), absmax.data_ptr<float>(), levels.data_ptr<float>(), nullptr,
               reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N, K, blocksize};
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
  const Call c{xf.data(), static_cast<const uint8_t*>(codes.data_ptr()), scale.data_ptr<float>(), nullptr,
               row_scale.numel() ? row_scale.data_ptr<float>() : nullptr,
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
