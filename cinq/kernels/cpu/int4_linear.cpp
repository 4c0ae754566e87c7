// y[M, N] = x[M, K] @ dequant(W)^T for 4-bit grouped weights, bf16 activations in and out, float32 accumulation.
//
// Why: at decode a linear streams its weights once per step; 4-bit weights are a quarter of bf16's bytes, but
// PyTorch's CPU int4 kernel spends more time unpacking than it saves in reading. Here the unpacking is three
// integer ops per 32 weights: a 16-bit lane holds four codes, and OR-ing a code into the bits of bf16 128.0
// (0x4300) gives exactly bf16(128 + q). AVX512-BF16 dot products then accumulate (128 + q) x in float32, and
// the zero point, the 128 offset and the scale leave the inner loop through
//     y[m, n] = sum_g s[n, g] * sum_{k in g} (128 + q[n, k]) x[m, k] - sum_g s[n, g] (z[n, g] + 128) xsum[m, g].
//
// Layout (cinq.quant.native.pack_int4): packed [N, K / 2] uint8; every 128 consecutive input channels of a row
// are 32 little-endian uint16 lanes, lane j holding channels j, 32 + j, 64 + j, 96 + j in its four nibbles
// (lowest first). scales, sz128: [N, K / group] float32 (sz128 = scale * (zero + 128)). group % 128 == 0.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define CINQ_INT4_AVX512 1
#endif

#include "bf16.h"

namespace {

using cinq_bf16::bf16_to_float;

constexpr int kMaxRows = 4;  // activation rows sharing one pass over the weights

// sum_g s[n, g] * sum_{k in g} (128 + q[n, k]) x[m, k] for rows [m0, m0 + MB) and output channels [n0, n1),
// into sums[m][n - n0].
template <int MB>
void rows_block(const uint16_t* x, const uint8_t* packed, const float* scales, float* sums, int64_t K, int64_t G,
                int64_t group, int64_t m0, int64_t n0, int64_t n1) {
  const int64_t chunks_per_group = group / 128;
#if defined(CINQ_INT4_AVX512)
  const __m512i nibble = _mm512_set1_epi16(0x000F);
  const __m512i bf16_128 = _mm512_set1_epi16(0x4300);
#endif
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = packed + n * (K / 2);
    const float* sr = scales + n * G;
    float out[MB];
#if defined(CINQ_INT4_AVX512)
    __m512 total[MB];
    for (int m = 0; m < MB; ++m) total[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      __m512 acc[MB];
      for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks_per_group; ++c) {
        const int64_t k0 = (g * chunks_per_group + c) * 128;
        const __m512i lanes = _mm512_loadu_si512(wr + k0 / 2);
        for (int p = 0; p < 4; ++p) {
          // 0xEA: (a & b) | c  ->  (lanes >> 4p) & 0xF | 0x4300  =  bf16(128 + q)
          const __m512i shifted = p ? _mm512_srli_epi16(lanes, 4 * p) : lanes;
          const __m512bh w = (__m512bh)_mm512_ternarylogic_epi32(shifted, nibble, bf16_128, 0xEA);
          for (int m = 0; m < MB; ++m) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + m) * K + k0 + 32 * p);
            acc[m] = _mm512_dpbf16_ps(acc[m], xv, w);
          }
        }
      }
      const __m512 s = _mm512_set1_ps(sr[g]);
      for (int m = 0; m < MB; ++m) total[m] = _mm512_fmadd_ps(s, acc[m], total[m]);
    }
    for (int m = 0; m < MB; ++m) out[m] = _mm512_reduce_add_ps(total[m]);
#else
    for (int m = 0; m < MB; ++m) out[m] = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      float part[MB] = {0.f};
      for (int64_t k = g * group; k < (g + 1) * group; ++k) {
        const int64_t chunk = k / 128, j = k % 32, p = (k % 128) / 32;
        uint16_t lane;
        std::memcpy(&lane, wr + chunk * 64 + 2 * j, sizeof(lane));
        const float q = static_cast<float>(128 + ((lane >> (4 * p)) & 15));
        for (int m = 0; m < MB; ++m) part[m] += q * bf16_to_float(x[(m0 + m) * K + k]);
      }
      for (int m = 0; m < MB; ++m) out[m] += sr[g] * part[m];
    }
#endif
    for (int m = 0; m < MB; ++m) sums[(m0 + m) * (n1 - n0) + (n - n0)] = out[m];
  }
}

}  // namespace

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, torch::Tensor sz128,
                          int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), "int4_linear: x");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == torch::kUInt8 && packed.is_contiguous(),
              "int4_linear: packed");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  TORCH_CHECK(packed.size(1) * 2 == K, "int4_linear: packed is [N, K/2]");
  TORCH_CHECK(group % 128 == 0 && K % group == 0, "int4_linear: group must be a multiple of 128 dividing K");
  const int64_t G = K / group;
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && sz128.scalar_type() == torch::kFloat32 &&
                  scales.is_contiguous() && sz128.is_contiguous() && scales.numel() == N * G &&
                  sz128.numel() == N * G,
              "int4_linear: scales [N, K/group] and sz128 [K/group, N] float32");
  // Per-group activation sums (float32) for the zero-point and offset term.
  std::vector<float> xsum(static_cast<size_t>(M * G));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) s += bf16_to_float(xp[m * K + k]);
      xsum[m * G + g] = s;
    }
  auto y = torch::empty({M, N}, x.options());
  auto* yp = y.data_ptr<at::BFloat16>();
  const auto* wp = packed.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = sz128.data_ptr<float>();
  const float* xs = xsum.data();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    const int64_t width = n1 - n0;
    std::vector<float> sums(static_cast<size_t>(M * width));
    // Activation rows in blocks of kMaxRows; the weight tile [n0, n1) stays in cache across the blocks.
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      switch (std::min<int64_t>(kMaxRows, M - m0)) {
        case 1: rows_block<1>(xp, wp, sp, sums.data(), K, G, group, m0, n0, n1); break;
        case 2: rows_block<2>(xp, wp, sp, sums.data(), K, G, group, m0, n0, n1); break;
        case 3: rows_block<3>(xp, wp, sp, sums.data(), K, G, group, m0, n0, n1); break;
        default: rows_block<4>(xp, wp, sp, sums.data(), K, G, group, m0, n0, n1); break;
      }
    }
    // Epilogue, vectorizable along n: subtract sum_g s (z + 128) xsum (sz128 is stored [G, N]).
    for (int64_t m = 0; m < M; ++m) {
      float* row = sums.data() + m * width;
      for (int64_t g = 0; g < G; ++g) {
        const float xs_g = xs[m * G + g];
        const float* zg = zp + g * N + n0;
        for (int64_t j = 0; j < width; ++j) row[j] -= zg[j] * xs_g;
      }
      c10::BFloat16* yr = yp + m * N + n0;
      for (int64_t j = 0; j < width; ++j) yr[j] = c10::BFloat16(row[j]);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &int4_linear, "grouped 4-bit weight x bf16 activation linear (CPU)");
  // Without AVX512-BF16 the portable loop is far slower than PyTorch's int4 kernel: the loader skips it then.
#if defined(CINQ_INT4_AVX512)
  m.def("has_fast_path", [] { return true; });
#else
  m.def("has_fast_path", [] { return false; });
#endif
}
