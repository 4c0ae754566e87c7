// GGUF-layout integer blocks dequantized to bf16, for the GEMM that inputs of many rows take instead of the
// int8-activation kernels (cinq/kernels/prefill_gemm.py, cinq/layers/quantization/gguf_linear.py). The tensors are
// int8_activation_linear.cpp's: int4 codes two to a byte (in each 16-byte block, byte j holds value j in its low
// nibble and value j + 16 in its high one) or int8 codes, with a float16 scale d (and Q4_1's float16 minimum m) per
// 32 weights. Each weight is q * d + m in float32 (Q4_0: m = -8 d; Q8_0: q * d), multiplied then added, without a
// fused multiply-add, so that the bits equal gguf_linear.dequantize_i8_int4's torch ops, and rounded once to bf16.
// Why: those torch ops (a float32 copy and four passes over it) took ~0.7 ms for one 3,072 x 576 weight on 2
// threads, as long as the bf16 GEMM they feed at 64 rows; this is one pass.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kBlock = 32;

// float -> bf16 as cinq_bf16::float_to_bf16 (round to nearest even, NaN to 0x7fc0), branch-free so that a block's
// 32 conversions vectorize
inline uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

inline void store_block(const float* w, uint16_t* o) {
#pragma GCC ivdep
  for (int j = 0; j < kBlock; ++j) o[j] = to_bf16(w[j]);
}

__attribute__((optimize("fp-contract=off"))) void int4_rows(const uint8_t* codes, const at::Half* d,
                                                            const at::Half* m, int64_t K, uint16_t* out, int64_t n0,
                                                            int64_t n1) {
  const int64_t B = K / kBlock;
  alignas(64) float w[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < B; ++b) {
      const float s = static_cast<float>(d[n * B + b]);
      const float mn = m != nullptr ? static_cast<float>(m[n * B + b]) : s * -8.0f;
      const uint8_t* c = codes + (n * B + b) * (kBlock / 2);
      for (int j = 0; j < kBlock / 2; ++j) {
        w[j] = static_cast<float>(c[j] & 15) * s;
        w[j + kBlock / 2] = static_cast<float>(c[j] >> 4) * s;
      }
      for (int j = 0; j < kBlock; ++j) w[j] += mn;  // a second statement: multiplied, then added (as torch)
      store_block(w, out + n * K + b * kBlock);
    }
  }
}

void int8_rows(const int8_t* codes, const at::Half* d, int64_t K, uint16_t* out, int64_t n0, int64_t n1) {
  const int64_t B = K / kBlock;
  alignas(64) float w[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < B; ++b) {
      const float s = static_cast<float>(d[n * B + b]);
      const int8_t* c = codes + n * K + b * kBlock;
      for (int j = 0; j < kBlock; ++j) w[j] = static_cast<float>(c[j]) * s;
      store_block(w, out + n * K + b * kBlock);
    }
  }
}

void check_scales(const torch::Tensor& t, int64_t N, int64_t K, const char* what) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat16 && t.is_contiguous() && t.numel() == N * (K / kBlock),
              "gguf_dequant: ", what, " float16 [N, K / 32]");
}

}  // namespace

// W bf16 [N, K] of Q4_0 (mins empty) / Q4_1 blocks: codes uint8 [N, K / 2], scales (and mins) float16 [N, K / 32]
torch::Tensor dequantize_int4_bf16(torch::Tensor codes, torch::Tensor scales, torch::Tensor mins) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kUInt8 && codes.is_contiguous(),
              "dequantize_int4_bf16: codes uint8 [N, K / 2]");
  const int64_t N = codes.size(0), K = codes.size(1) * 2;
  TORCH_CHECK(K % kBlock == 0, "dequantize_int4_bf16: K a multiple of 32");
  check_scales(scales, N, K, "scales");
  if (mins.numel()) check_scales(mins, N, K, "mins");
  auto out = torch::empty({N, K}, codes.options().dtype(torch::kBFloat16));
  const auto* c = codes.data_ptr<uint8_t>();
  const auto* d = scales.data_ptr<at::Half>();
  const auto* m = mins.numel() ? mins.data_ptr<at::Half>() : nullptr;
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { int4_rows(c, d, m, K, o, n0, n1); });
  return out;
}

// W bf16 [N, K] of Q8_0 blocks: codes int8 [N, K], scales float16 [N, K / 32]
torch::Tensor dequantize_int8_bf16(torch::Tensor codes, torch::Tensor scales) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kInt8 && codes.is_contiguous(),
              "dequantize_int8_bf16: codes int8 [N, K]");
  const int64_t N = codes.size(0), K = codes.size(1);
  TORCH_CHECK(K % kBlock == 0, "dequantize_int8_bf16: K a multiple of 32");
  check_scales(scales, N, K, "scales");
  auto out = torch::empty({N, K}, codes.options().dtype(torch::kBFloat16));
  const auto* c = codes.data_ptr<int8_t>();
  const auto* d = scales.data_ptr<at::Half>();
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { int8_rows(c, d, K, o, n0, n1); });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dequantize_int4_bf16", &dequantize_int4_bf16, "Q4_0 / Q4_1 blocks to bf16 [N, K]");
  m.def("dequantize_int8_bf16", &dequantize_int8_bf16, "Q8_0 blocks to bf16 [N, K]");
}
