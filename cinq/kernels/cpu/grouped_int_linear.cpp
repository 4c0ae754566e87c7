// y[M, N] = x[M, K] @ W^T for integer weight codes with float32 scales per (output row, group of input channels),
// bf16 activations in and out, for the decode-sized calls (a few rows) where the weight stream is the whole cost:
//   int4 affine:  W[n, k] = scale[n, g] * q[n, k] + min[n, g],  q in 0..15   (GGUF Q4_1; Q4_0 with min = -8 scale;
//                                                                            GPTQ / AWQ with min = -scale * zero)
//   int8 grouped: W[n, k] = scale[n, g] * q[n, k] (+ min[n, g]), q in -128..127 (GGUF Q8_0; per channel:
//                                                                            group = K; the min: 8-bit GPTQ)
// g = k / group, group a multiple of 32.
//
// How (AVX2): the activations are quantized once per call to int16 in blocks of xb channels (xb = 64 where it
// divides the group, else 32; see small_m.h for why int16), so the codes need only a widening to int16 and
// `vpmaddwd` multiplies 16 code/activation pairs into int32 sums: no float conversion per weight. Per x block and
// output, one int32 -> float conversion and one fused multiply-add by scale * x_scale; the min term is
// sum_g min[n, g] * (sum of x over group g), once per output. Each thread reads one contiguous range of output
// rows front to back (small_m.h), one row at a time, prefetching ahead.
//
// Layout (cinq.layers.quantization.native.pack_int4_affine / pack_int8_grouped):
//   int4: codes [N, K / 2] uint8; channels 32j .. 32j + 31 of a row are 16 bytes, byte i holding channel 32j + i
//         in its low nibble and 32j + 16 + i in its high one (GGUF's Q4_0 / Q4_1 order, so its blocks copy in).
//   int8: codes [N, K] int8.   scales, mins: [N, K / group] float32, row-major (they stream beside the codes).
#include <torch/extension.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "small_m.h"

namespace {

using cinq_bf16::float_to_bf16;
using cinq_small_m::split_outputs;

constexpr int kMaxRows = 8;  // activation rows sharing one pass over a weight row

// Weight codes of one row: bytes per 32 channels, and (AVX2) the 32 codes of channels k0 .. k0 + 31 as two int16
// vectors (channels k0 .. k0 + 15, k0 + 16 .. k0 + 31).
struct Int4Codes {
  static constexpr int64_t kBytesPer32 = 16;
  static int code(const uint8_t* row, int64_t k) {
    const uint8_t b = row[k / 32 * 16 + k % 16];
    return (k % 32) < 16 ? (b & 15) : (b >> 4);
  }
#if defined(CINQ_SMALL_M_AVX2)
  static inline void load(const uint8_t* row, int64_t k0, __m256i& lo, __m256i& hi) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0 / 2)));
    lo = _mm256_and_si256(w, _mm256_set1_epi16(15));
    hi = _mm256_srli_epi16(w, 4);  // the byte's high nibble; the word's high byte is zero
  }
#endif
};

struct Int8Codes {
  static constexpr int64_t kBytesPer32 = 32;
  static int code(const uint8_t* row, int64_t k) { return static_cast<int8_t>(row[k]); }
#if defined(CINQ_SMALL_M_AVX2)
  static inline void load(const uint8_t* row, int64_t k0, __m256i& lo, __m256i& hi) {
    lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0)));
    hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0 + 16)));
  }
#endif
};

// What every call shares: the quantized activations, the weights, the output.
struct Call {
  const int16_t* xq;     // [M, K]
  const float* xs;       // [M, K / xb] activation scale per x block
  const float* xsum_g;   // [M, G] sum of the quantized activations over each weight group
  const uint8_t* codes;  // [N, K * bytes per 32 / 32]
  const float* scales;   // [N, G]
  const float* mins;     // [N, G] or null
  uint16_t* y;           // [M, N] bf16 bits
  int64_t M, N, K, group, xb;
};

// Outputs n .. n + R - 1 of rows m0 .. m0 + MB - 1. Per x block (xb <= 64 channels) each weight row's codes are
// widened once into registers and serve all MB activation rows; the int32 sums of a block go to float once.
// Every loop over r and m is unrolled so that the accumulators stay in registers (R * MB <= 8).
#if defined(CINQ_SMALL_M_AVX2)
// x block b of outputs n .. n + R - 1, rows m0 .. m0 + MB - 1, into the accumulators t (cb: rows_kernel's).
template <typename Codes, int MB, int R>
__attribute__((always_inline)) inline void block(const Call& c, int64_t m0, int64_t n, int64_t b, const float* cb,
                                                 __m256 (&t)[R][MB]) {
  const int64_t K = c.K, B = K / c.xb, row_bytes = K / 32 * Codes::kBytesPer32, k0 = b * c.xb;
  const bool two = c.xb == 64;  // two 32-channel chunks per block
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m256i w[4];
    const uint8_t* row = c.codes + (n + r) * row_bytes;
    const int64_t at = k0 / 32 * Codes::kBytesPer32;
    if ((at & 63) == 0) cinq_small_m::prefetch_ahead(row + at);
    Codes::load(row, k0, w[0], w[1]);
    if (two) Codes::load(row, k0 + 32, w[2], w[3]);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256i* xr = reinterpret_cast<const __m256i*>(c.xq + (m0 + m) * K + k0);
      __m256i acc = _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256(xr)),
                                     _mm256_madd_epi16(w[1], _mm256_loadu_si256(xr + 1)));
      if (two)
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(w[2], _mm256_loadu_si256(xr + 2)),
                                                     _mm256_madd_epi16(w[3], _mm256_loadu_si256(xr + 3))));
      t[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_broadcast_ss(cb + m * B + b), t[r][m]);
    }
  }
}
#endif

// cb [MB, B]: scratch for the block factors scale * x_scale of one output row.
template <typename Codes, int MB, int R>
void rows_kernel(const Call& c, int64_t m0, int64_t n, float* cb) {
  const int64_t K = c.K, G = K / c.group, B = K / c.xb, row_bytes = K / 32 * Codes::kBytesPer32;
  float out[R][MB];
#if defined(CINQ_SMALL_M_AVX2)
  static_assert(R == 1, "the block factors cb are one output row's");
  {  // scale[n, g(b)] * x_scale[m, b] for every block, vectorised here so the inner loop only loads one
    const float* srow = c.scales + n * G;
    const int64_t per = c.group / c.xb;
    for (int m = 0; m < MB; ++m) {
      const float* xs = c.xs + (m0 + m) * B;
      float* cm = cb + m * B;
      if (per == 1)
        for (int64_t b = 0; b < B; ++b) cm[b] = srow[b] * xs[b];
      else
        for (int64_t b = 0; b < B; ++b) cm[b] = srow[b / per] * xs[b];
    }
  }
  // A = 2: even and odd x blocks add into their own accumulators (two FMA chains), where few outputs are in flight
  constexpr int A = R * MB <= 2 ? 2 : 1;
  __m256 tot[A][R][MB] = {};
  // Blocks in pairs into tot[0] / tot[1], named literally: indexing tot by a runtime b & 1 kept it in memory, a
  // store-to-load round trip per block (int8 ran ~3x slower).
  int64_t b = 0;
  if (A == 2)
    for (; b + 2 <= B; b += 2) {
      block<Codes, MB, R>(c, m0, n, b, cb, tot[0]);
      block<Codes, MB, R>(c, m0, n, b + 1, cb, tot[A - 1]);
    }
  for (; b < B; ++b) block<Codes, MB, R>(c, m0, n, b, cb, tot[0]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m)
      out[r][m] = cinq_small_m::hsum(A == 2 ? _mm256_add_ps(tot[0][r][m], tot[A - 1][r][m]) : tot[0][r][m]);
#else
  for (int r = 0; r < R; ++r) {
    const uint8_t* row = c.codes + (n + r) * row_bytes;
    for (int m = 0; m < MB; ++m) {
      float total = 0.f;
      for (int64_t b = 0; b < B; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * c.xb; k < (b + 1) * c.xb; ++k) dot += Codes::code(row, k) * c.xq[(m0 + m) * K + k];
        total += static_cast<float>(dot) * (c.scales[(n + r) * G + b * c.xb / c.group] * c.xs[(m0 + m) * B + b]);
      }
      out[r][m] = total;
    }
  }
#endif
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) {
      float v = out[r][m];
      if (c.mins) {
        const float* mn = c.mins + (n + r) * G;
        const float* xg = c.xsum_g + (m0 + m) * G;
        for (int64_t g = 0; g < G; ++g) v += mn[g] * xg[g];
      }
      c.y[(m0 + m) * c.N + n + r] = float_to_bf16(v);
    }
}

// Outputs [n0, n1) of rows m0 .. m0 + MB - 1, one weight row at a time: a single stream per core (interleaving two
// or four rows read 10-40% slower from memory on Zen 3).
template <typename Codes, int MB>
void rows_range(const Call& c, int64_t m0, int64_t n0, int64_t n1, float* cb) {
  for (int64_t n = n0; n < n1; ++n) rows_kernel<Codes, MB, 1>(c, m0, n, cb);
}

template <typename Codes>
void run(const Call& c, int64_t n0, int64_t n1) {
  // With more than kMaxRows activation rows (a prefill), blocks of 64 outputs stay in cache across the row blocks.
  const int64_t chunk = c.M <= kMaxRows ? n1 - n0 : 64;
  std::vector<float> cb(static_cast<size_t>(kMaxRows * (c.K / c.xb)));
  for (int64_t a = n0; a < n1; a += chunk) {
    const int64_t b = std::min(n1, a + chunk);
    for (int64_t m0 = 0; m0 < c.M; m0 += kMaxRows) {
      switch (std::min<int64_t>(kMaxRows, c.M - m0)) {
        case 1: rows_range<Codes, 1>(c, m0, a, b, cb.data()); break;
        case 2: rows_range<Codes, 2>(c, m0, a, b, cb.data()); break;
        case 3: rows_range<Codes, 3>(c, m0, a, b, cb.data()); break;
        case 4: rows_range<Codes, 4>(c, m0, a, b, cb.data()); break;
        case 5: rows_range<Codes, 5>(c, m0, a, b, cb.data()); break;
        case 6: rows_range<Codes, 6>(c, m0, a, b, cb.data()); break;
        case 7: rows_range<Codes, 7>(c, m0, a, b, cb.data()); break;
        default: rows_range<Codes, 8>(c, m0, a, b, cb.data()); break;
      }
    }
  }
}

// Channels per activation scale: 64 where the group allows (two 32-channel chunks of codes in registers per block;
// 128 would spill them on AVX2's 16 registers), else 32.
int64_t x_block(int64_t group) {
  for (int64_t xb : {64, 32})
    if (group % xb == 0) return xb;
  return 32;
}

template <typename Codes>
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                     const torch::Tensor* mins, int64_t group, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), name, ": x bf16 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  TORCH_CHECK(group >= 32 && group % 32 == 0 && K % group == 0, name, ": group a multiple of 32 dividing K");
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.element_size() == 1 &&
                  codes.size(1) == K / 32 * Codes::kBytesPer32,
              name, ": codes [N, K * bits / 8], one byte per element");
  const int64_t G = K / group;
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() && scales.numel() == N * G, name,
              ": scales float32 [N, K / group]");
  if (mins)
    TORCH_CHECK(mins->scalar_type() == torch::kFloat32 && mins->is_contiguous() && mins->numel() == N * G, name,
                ": mins float32 [N, K / group]");
  const int64_t xb = x_block(group), B = K / xb;
  std::vector<int16_t> xq(static_cast<size_t>(M * K));
  std::vector<float> xs(static_cast<size_t>(M * B)), xsum(static_cast<size_t>(M * B));
  std::vector<float> xsum_g(static_cast<size_t>(M * G), 0.f);
  cinq_small_m::quantize_rows_int16(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K, xb,
                                    xq.data(), xs.data(), xsum.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < B; ++b) xsum_g[m * G + b * xb / group] += xsum[m * B + b];
  auto y = torch::empty({M, N}, x.options());
  const Call c{xq.data(), xs.data(), xsum_g.data(), static_cast<const uint8_t*>(codes.data_ptr()),
               scales.data_ptr<float>(), mins ? mins->data_ptr<float>() : nullptr,
               reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, N, K, group, xb};
  const int64_t bytes = N * (K / 32 * Codes::kBytesPer32 + G * 4 * (mins ? 2 : 1));
  split_outputs(N, 4, bytes, [&](int64_t n0, int64_t n1) { run<Codes>(c, n0, n1); });
  return y;
}

}  // namespace

torch::Tensor int4_affine_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor mins,
                                 int64_t group) {
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8, "int4_affine_linear: codes uint8");
  return linear<Int4Codes>(x, codes, scales, &mins, group, "int4_affine_linear");
}

// mins: empty, or float32 [N, K / group] added as for int4 (an unsigned 8-bit grid's zero point other than 128)
torch::Tensor int8_grouped_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor mins,
                                  int64_t group) {
  TORCH_CHECK(codes.scalar_type() == torch::kInt8, "int8_grouped_linear: codes int8");
  return linear<Int8Codes>(x, codes, scales, mins.numel() ? &mins : nullptr, group, "int8_grouped_linear");
}

// Mean microseconds of one empty parallel region over torch's threads (what a kernel pays to wake its workers),
// for benchmarks/decode_kernels.py.
double parallel_region_us(int64_t iters) {
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> sink(static_cast<size_t>(threads) * 16, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i)
    at::parallel_for(0, threads, 1, [&](int64_t a, int64_t b) {
      for (int64_t p = a; p < b; ++p) sink[p * 16] += 1;
    });
  const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
  return dt.count() / static_cast<double>(iters);
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.int4_affine_linear / int8_grouped_linear, registered in C++ (see small_m_gemm.cpp for why)
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  cinq_small_m::def_linear_op(
      m, "int4_affine_linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int group) -> Tensor",
      &int4_affine_linear);
  cinq_small_m::def_linear_op(
      m, "int8_grouped_linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int group) -> Tensor",
      &int8_grouped_linear);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_affine_linear", &int4_affine_linear, "x @ (scale * q + min)^T, 4-bit codes (CPU)");
  m.def("int8_grouped_linear", &int8_grouped_linear, "x @ (scale * q [+ min])^T, int8 codes (CPU)");
  m.def("parallel_region_us", &parallel_region_us, "mean us of one empty parallel region", py::arg("iters"));
  m.def("has_fast_path", [] { return cinq_small_m::kFastPath; });
}
