// RMSNorm with the optional residual add before it, for bf16 rows on the CPU: one call instead of the ~10 ATen
// ops (add, float copy, pow, mean, add eps, rsqrt, mul, bf16 copy, weight mul) PyTorch dispatches per norm.
// At batch 1 a row is a few hundred values, so the op dispatch, not the arithmetic, was the cost (~50 us per
// norm, 11 norms per step on cinq-tiny).
//
// Rounding follows the PyTorch path it replaces (cinq/layers/norm.py) step by step, so results agree to the
// bit except where the float32 sum of squares, summed in another order, rounds differently:
//   s = bf16(x + residual)                      (the new residual)
//   y = bf16(bf16(s * rsqrt(mean(s^2) + eps)) * w)
// Gemma's norm (cinq/model/gemma3.py) scales by (1 + w) in float32 before its one rounding; the caller passes that
// float32 scale:
//   y = bf16((s * rsqrt(mean(s^2) + eps)) * scale)
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "bf16.h"

namespace {

using cinq_bf16::bf16_to_float;
using cinq_bf16::float_to_bf16;

// One row of n values: optional residual add into s (written to res_out); returns 1 / rms(s).
inline float inv_rms(const uint16_t* x, const uint16_t* res, uint16_t* res_out, float* s, int64_t n, float eps) {
  float sq = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    float v = bf16_to_float(x[i]);
    if (res != nullptr) {
      uint16_t r = float_to_bf16(v + bf16_to_float(res[i]));
      res_out[i] = r;
      v = bf16_to_float(r);
    }
    s[i] = v;
    sq += v * v;
  }
  return 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
}

// Llama's weight: the normed row rounded, then scaled by the bf16 weight.
struct Bf16Weight {
  const uint16_t* w;
  uint16_t operator()(float normed, int64_t i) const {
    return float_to_bf16(bf16_to_float(float_to_bf16(normed)) * bf16_to_float(w[i]));
  }
};

// Gemma's: scaled by the float32 (1 + w), rounded once.
struct Float32Scale {
  const float* scale;
  uint16_t operator()(float normed, int64_t i) const { return float_to_bf16(normed * scale[i]); }
};

const uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); }
uint16_t* bits_mut(torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// x [..., n] bf16 and residual (same shape, or an empty tensor: none) -> (y, x + residual), rows normed and
// weighted by `weigh`; without a residual the second is an empty tensor.
template <typename Weigh>
std::vector<torch::Tensor> norm_rows(torch::Tensor x, torch::Tensor residual, const Weigh& weigh, double eps) {
  const int64_t n = x.size(-1);
  const bool has_res = residual.numel() > 0;
  if (has_res) {
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == torch::kBFloat16,
                "rms_norm: residual must match x");
  }
  x = x.contiguous();
  if (has_res) residual = residual.contiguous();
  auto y = torch::empty_like(x);
  auto res_out = has_res ? torch::empty_like(x) : torch::empty({0}, x.options());
  const int64_t rows = n ? x.numel() / n : 0;
  const uint16_t* xp = bits(x);
  const uint16_t* rp = has_res ? bits(residual) : nullptr;
  uint16_t* yp = bits_mut(y);
  uint16_t* op = has_res ? bits_mut(res_out) : nullptr;
  const float e = static_cast<float>(eps);
  auto body = [&](int64_t begin, int64_t end) {
    std::vector<float> s(n);
    for (int64_t r = begin; r < end; ++r) {
      const float inv = inv_rms(xp + r * n, rp ? rp + r * n : nullptr, op ? op + r * n : nullptr, s.data(), n, e);
      uint16_t* out = yp + r * n;
      for (int64_t i = 0; i < n; ++i) out[i] = weigh(s[i] * inv, i);
    }
  };
  if (rows * n < 32768) {
    body(0, rows);  // a decode step: threads would cost more than the work
  } else {
    at::parallel_for(0, rows, 16, body);
  }
  return {y, res_out};
}

}  // namespace

// x [..., n] bf16, residual (same shape, or an empty tensor: none), weight [n] bf16. Returns (y, x + residual);
// without a residual the second is an empty tensor.
std::vector<torch::Tensor> rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && weight.scalar_type() == torch::kBFloat16, "rms_norm: bf16");
  TORCH_CHECK(weight.numel() == x.size(-1), "rms_norm: weight has ", weight.numel(), " values for rows of ",
              x.size(-1));
  weight = weight.contiguous();
  return norm_rows(x, residual, Bf16Weight{bits(weight)}, eps);
}

// As rms_norm with a float32 scale [n] applied before the one rounding (Gemma's (1 + w)).
std::vector<torch::Tensor> rms_norm_scaled(torch::Tensor x, torch::Tensor residual, torch::Tensor scale,
                                           double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && scale.scalar_type() == torch::kFloat32,
              "rms_norm_scaled: bf16 rows, a float32 scale");
  TORCH_CHECK(scale.numel() == x.size(-1), "rms_norm_scaled: scale has ", scale.numel(), " values for rows of ",
              x.size(-1));
  scale = scale.contiguous();
  return norm_rows(x, residual, Float32Scale{scale.data_ptr<float>()}, eps);
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.rms_norm in C++ (see small_m_gemm.cpp): the compiled decode step calls it ~60 times per step of a
// 30-layer model, each call through a Python custom op costing ~7 us more.
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  m.def("rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_scaled(Tensor x, Tensor residual, Tensor scale, float eps) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(cinq, CPU, m) {
  m.impl("rms_norm", [](const at::Tensor& x, const at::Tensor& r, const at::Tensor& w, double eps) {
    auto out = rms_norm(x, r, w, eps);
    return std::make_tuple(out[0], out[1]);
  });
  // Gemma's norm, for the fused decode step's Gemma layers (decode_layers.cpp)
  m.impl("rms_norm_scaled", [](const at::Tensor& x, const at::Tensor& r, const at::Tensor& scale, double eps) {
    auto out = rms_norm_scaled(x, r, scale, eps);
    return std::make_tuple(out[0], out[1]);
  });
}
TORCH_LIBRARY_IMPL(cinq, Meta, m) {
  auto meta = [](const at::Tensor& x, const at::Tensor& r, const at::Tensor&, double) {
    return std::make_tuple(at::empty_like(x), r.numel() ? at::empty_like(x) : at::empty({0}, x.options()));
  };
  m.impl("rms_norm", meta);
  m.impl("rms_norm_scaled", meta);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm with optional fused residual add, bf16 (CPU)");
  m.def("rms_norm_scaled", &rms_norm_scaled, "RMSNorm scaled in float32 (Gemma's 1 + w), bf16 rows (CPU)");
}
