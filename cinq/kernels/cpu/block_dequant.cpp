// Integer weight blocks dequantized to bf16, for the GEMM that inputs of many rows take instead of the decode-sized
// integer kernels (cinq/kernels/prefill_gemm.py). The tensors are the native kernels' (grouped_int_linear.cpp,
// int8_activation_linear.cpp): int4 codes two to a byte (in each 16-byte block of 32 values, byte j holds value j
// in its low nibble and value j + 16 in its high one, GGUF's Q4 order) or int8 codes, with a scale s and an optional
// minimum m per group of `group` weights (a multiple of 32), float16 (a GGUF file's own) or float32 (GPTQ / AWQ /
// RTN). Each weight is computed in float32 by the same operations, in the same order, as the Python dequantization
// it replaces, so that the bits equal those values rounded once to bf16:
//   int4, q_offset 0:  q * s + m          (GGUF Q4_0 without mins: m = -8 s; gguf_linear.dequantize_i8_int4)
//   int4, q_offset o:  (q - o) * s + (m + o * s)                      (native.dequantize_int4_affine)
//   int8:              q * s (+ m)                                    (native.dequantize_int8_grouped)
// each product rounded before its sum: no fused multiply-add, no reassociation (the functions opt out of both).
// Why: those torch ops (a float32 copy and four passes over it) took ~0.7 ms for one 3,072 x 576 weight on 2
// threads, as long as the bf16 GEMM they feed at 64 rows; this is one pass.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kBlock = 32;
#define CINQ_EXACT_FLOAT __attribute__((optimize("fp-contract=off", "no-associative-math")))

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

template <typename S>
CINQ_EXACT_FLOAT void int4_rows(const uint8_t* codes, const S* d, const S* m, int64_t K, int64_t group,
                                int64_t q_offset, uint16_t* out, int64_t n0, int64_t n1) {
  const int64_t B = K / kBlock, G = K / group, per = group / kBlock;
  const float o = static_cast<float>(q_offset);
  alignas(64) float w[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t g = n * G + b / per;
      const float s = static_cast<float>(d[g]);
      const uint8_t* c = codes + (n * B + b) * (kBlock / 2);
      float mn;
      if (q_offset != 0) {
        const float os = o * s;
        mn = static_cast<float>(m[g]) + os;
        for (int j = 0; j < kBlock / 2; ++j) {
          w[j] = (static_cast<float>(c[j] & 15) - o) * s;
          w[j + kBlock / 2] = (static_cast<float>(c[j] >> 4) - o) * s;
        }
      } else {
        mn = m != nullptr ? static_cast<float>(m[g]) : s * -8.0f;
        for (int j = 0; j < kBlock / 2; ++j) {
          w[j] = static_cast<float>(c[j] & 15) * s;
          w[j + kBlock / 2] = static_cast<float>(c[j] >> 4) * s;
        }
      }
      for (int j = 0; j < kBlock; ++j) w[j] += mn;  // a second statement: multiplied, then added (as torch)
      store_block(w, out + n * K + b * kBlock);
    }
  }
}

template <typename S>
CINQ_EXACT_FLOAT void int8_rows(const int8_t* codes, const S* d, const S* m, int64_t K, int64_t group, uint16_t* out,
                                int64_t n0, int64_t n1) {
  const int64_t B = K / kBlock, G = K / group, per = group / kBlock;
  alignas(64) float w[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t g = n * G + b / per;
      const float s = static_cast<float>(d[g]);
      const int8_t* c = codes + n * K + b * kBlock;
      for (int j = 0; j < kBlock; ++j) w[j] = static_cast<float>(c[j]) * s;
      if (m != nullptr) {
        const float mn = static_cast<float>(m[g]);
        for (int j = 0; j < kBlock; ++j) w[j] += mn;
      }
      store_block(w, out + n * K + b * kBlock);
    }
  }
}

// scales (and mins) [N, K / group] float16 or float32, mins empty or of the scales' dtype
void check_groups(const torch::Tensor& scales, const torch::Tensor& mins, int64_t N, int64_t K, int64_t group,
                  const char* name) {
  TORCH_CHECK(group >= kBlock && group % kBlock == 0 && K % group == 0, name, ": group a multiple of 32 dividing K");
  const auto st = scales.scalar_type();
  TORCH_CHECK((st == torch::kFloat16 || st == torch::kFloat32) && scales.is_contiguous() &&
                  scales.numel() == N * (K / group),
              name, ": scales float16 or float32 [N, K / group]");
  TORCH_CHECK(mins.numel() == 0 || (mins.scalar_type() == st && mins.is_contiguous() && mins.numel() == scales.numel()),
              name, ": mins empty, or [N, K / group] of the scales' dtype");
}

// f(scales, mins) with both pointers typed by the scales' dtype (mins nullptr when empty)
template <typename F>
void with_scales(const torch::Tensor& scales, const torch::Tensor& mins, F&& f) {
  if (scales.scalar_type() == torch::kFloat16)
    f(scales.data_ptr<at::Half>(), mins.numel() ? mins.data_ptr<at::Half>() : nullptr);
  else
    f(scales.data_ptr<float>(), mins.numel() ? mins.data_ptr<float>() : nullptr);
}

}  // namespace

// W bf16 [N, K] of int4 codes uint8 [N, K / 2]; q_offset: 8 for (q - 8) * s + (m + 8 s), the packed Q4_0-like
// layers (needs mins), else 0
torch::Tensor dequantize_int4_bf16(torch::Tensor codes, torch::Tensor scales, torch::Tensor mins, int64_t group,
                                   int64_t q_offset) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kUInt8 && codes.is_contiguous(),
              "dequantize_int4_bf16: codes uint8 [N, K / 2]");
  const int64_t N = codes.size(0), K = codes.size(1) * 2;
  check_groups(scales, mins, N, K, group, "dequantize_int4_bf16");
  TORCH_CHECK(q_offset == 0 || mins.numel(), "dequantize_int4_bf16: a q_offset needs the mins");
  auto out = torch::empty({N, K}, codes.options().dtype(torch::kBFloat16));
  const auto* c = codes.data_ptr<uint8_t>();
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  with_scales(scales, mins, [&](const auto* d, const auto* m) {
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { int4_rows(c, d, m, K, group, q_offset, o, n0, n1); });
  });
  return out;
}

// W bf16 [N, K] of int8 codes [N, K]
torch::Tensor dequantize_int8_bf16(torch::Tensor codes, torch::Tensor scales, torch::Tensor mins, int64_t group) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kInt8 && codes.is_contiguous(),
              "dequantize_int8_bf16: codes int8 [N, K]");
  const int64_t N = codes.size(0), K = codes.size(1);
  check_groups(scales, mins, N, K, group, "dequantize_int8_bf16");
  auto out = torch::empty({N, K}, codes.options().dtype(torch::kBFloat16));
  const auto* c = codes.data_ptr<int8_t>();
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  with_scales(scales, mins, [&](const auto* d, const auto* m) {
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { int8_rows(c, d, m, K, group, o, n0, n1); });
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dequantize_int4_bf16", &dequantize_int4_bf16, "int4 blocks to bf16 [N, K]", py::arg("codes"),
        py::arg("scales"), py::arg("mins"), py::arg("group"), py::arg("q_offset"));
  m.def("dequantize_int8_bf16", &dequantize_int8_bf16, "int8 blocks to bf16 [N, K]", py::arg("codes"),
        py::arg("scales"), py::arg("mins"), py::arg("group"));
}
