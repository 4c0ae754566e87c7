// Rotary position embedding (rotate-half / NeoX layout) applied in place to the q and k heads of one step, bf16
// on the CPU: one call instead of the ~15 ATen ops of the PyTorch path (table gather, chunks, four multiplies,
// two adds, cat, per tensor). q [T, Hq, D] and k [T, Hkv, D] may be strided views (the split of the merged qkv
// projection's output): only the last dimension must be contiguous.
//
// Rounding follows the PyTorch path (cinq/layers/rotary.py) op by op, so the results are bit-identical: the
// cos / sin table is in bf16, every product and sum is rounded to bf16 as the bf16 tensor ops round them:
//   out1 = bf16(bf16(x1 * cos) - bf16(x2 * sin)),  out2 = bf16(bf16(x2 * cos) + bf16(x1 * sin))
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#include "bf16.h"

namespace {

using cinq_bf16::bf16_to_float;
using cinq_bf16::float_to_bf16;
using cinq_bf16::round_bf16;

inline void rotate_head(uint16_t* x, const uint16_t* cos, const uint16_t* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = bf16_to_float(x[i]), x2 = bf16_to_float(x[i + half]);
    const float c = bf16_to_float(cos[i]), s = bf16_to_float(sin[i]);
    x[i] = float_to_bf16(round_bf16(x1 * c) - round_bf16(x2 * s));
    x[i + half] = float_to_bf16(round_bf16(x2 * c) + round_bf16(x1 * s));
  }
}

void rotate(torch::Tensor& x, const int64_t* pos, const uint16_t* table, int64_t d) {
  const int64_t tokens = x.size(0), heads = x.size(1);
  const int64_t st = x.stride(0), sh = x.stride(1);
  auto* base = reinterpret_cast<uint16_t*>(x.data_ptr<at::BFloat16>());
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* cs = table + pos[t] * d;
      for (int64_t h = 0; h < heads; ++h) rotate_head(base + t * st + h * sh, cs, cs + d / 2, d / 2);
    }
  };
  if (tokens * heads * d < 65536) {
    body(0, tokens);  // a decode step: threads would cost more than the work
  } else {
    at::parallel_for(0, tokens, 16, body);
  }
}

}  // namespace

// q [T, Hq, D], k [T, Hkv, D] bf16 (last dim contiguous), positions [T] int64, cos_sin [max_pos, D] bf16
// (cos in the first half of a row, sin in the second). Rotates q and k in place.
void rotary_(torch::Tensor q, torch::Tensor k, torch::Tensor positions, torch::Tensor cos_sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2), "rotary: shapes");
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
              cos_sin.scalar_type() == torch::kBFloat16, "rotary: bf16");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, "rotary: head_dim must be contiguous");
  const int64_t d = q.size(2);
  TORCH_CHECK(d % 2 == 0 && cos_sin.dim() == 2 && cos_sin.size(1) == d && cos_sin.is_contiguous(), "rotary: table");
  TORCH_CHECK(positions.scalar_type() == torch::kLong && positions.numel() == q.size(0), "rotary: positions");
  positions = positions.contiguous();
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t max_pos = cos_sin.size(0);
  for (int64_t t = 0; t < positions.numel(); ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "rotary: position ", pos[t], " outside the table (", max_pos, ")");
  }
  const auto* table = reinterpret_cast<const uint16_t*>(cos_sin.data_ptr<at::BFloat16>());
  rotate(q, pos, table, d);
  rotate(k, pos, table, d);
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.rotary_ in C++ (see small_m_gemm.cpp); the schema declares q and k mutated, which keeps the order
// of the rotation before the KV write and the attention in a compiled graph.
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor positions, Tensor cos_sin) -> ()");
}
TORCH_LIBRARY_IMPL(cinq, CPU, m) {
  m.impl("rotary_", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& p, const at::Tensor& t) {
    rotary_(q, k, p, t);
  });
}
TORCH_LIBRARY_IMPL(cinq, Meta, m) {
  m.impl("rotary_", [](const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {});
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rotary_", &rotary_, "rotary embedding in place on q and k, bf16 (CPU)");
}
