// y[M, N] = x[M, K] @ w[N, K]^T (+ bias) for a handful of rows M, bf16 in and out, float32 accumulation.
//
// Why: decoding a few sequences multiplies a few activation rows by every weight matrix, so the step is a
// stream over the weights and should run at memory bandwidth. PyTorch's bf16 path for such skinny shapes reaches
// about half of it on AVX512-BF16 CPUs. Here each weight row is read once for all M activation rows, with the
// dot products done by AVX512-BF16 (`vdpbf16ps`) where the compiler targets it, and plain float code elsewhere.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <int MB>
void rows_block(const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t K, int64_t N,
                int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* wr = w + n * K;
    float sums[MB];
    int64_t k = 0;
#if defined(__AVX512BF16__)
    __m512 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
      const __m512bh b = (__m512bh)_mm512_loadu_si512(wr + k);
      for (int m = 0; m < MB; ++m)
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512(x + m * K + k), b);
    }
    for (int m = 0; m < MB; ++m) sums[m] = _mm512_reduce_add_ps(acc[m]);
#else
    for (int m = 0; m < MB; ++m) sums[m] = 0.f;
#endif
    for (; k < K; ++k) {
      const float wk = bf16_to_float(wr[k]);
      for (int m = 0; m < MB; ++m) sums[m] += bf16_to_float(x[m * K + k]) * wk;
    }
    for (int m = 0; m < MB; ++m) y[m * N + n] = c10::BFloat16(sums[m] + (bias ? bias[n] : 0.f));
  }
}

}  // namespace

// x [M, K] bf16 contiguous (M <= 4), w [N, K] bf16 contiguous, bias [N] float32 or empty. Returns [M, N] bf16.
torch::Tensor small_m_linear(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_m_linear: shapes");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && w.scalar_type() == torch::kBFloat16, "small_m_linear: bf16");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "small_m_linear: contiguous inputs");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= 4, "small_m_linear: 1 <= M <= 4");
  const float* b = nullptr;
  if (bias.numel()) {
    TORCH_CHECK(bias.scalar_type() == torch::kFloat32 && bias.numel() == N, "small_m_linear: bias");
    b = bias.data_ptr<float>();
  }
  auto y = torch::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    switch (M) {
      case 1: rows_block<1>(xp, wp, b, yp, K, N, n0, n1); break;
      case 2: rows_block<2>(xp, wp, b, yp, K, N, n0, n1); break;
      case 3: rows_block<3>(xp, wp, b, yp, K, N, n0, n1); break;
      default: rows_block<4>(xp, wp, b, yp, K, N, n0, n1); break;
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_m_linear", &small_m_linear, "skinny bf16 linear (CPU)");
  // Without AVX512-BF16 the portable loop does not beat oneDNN: the loader skips it then.
#if defined(__AVX512BF16__)
  m.def("has_fast_path", [] { return true; });
#else
  m.def("has_fast_path", [] { return false; });
#endif
}
