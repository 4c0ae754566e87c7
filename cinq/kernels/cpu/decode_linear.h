// A linear of the fused decode program (decode_layers.cpp): which registered kernel runs it, and how a large one is
// split across the step's team. Every kernel computes an output row from its weight row alone, so a linear cut into
// ranges of output rows, one per thread, is bit-identical to one call.
#pragma once

#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "team.h"

namespace cinq_decode {

using cinq_team::Team;

// Weight bytes from which a linear is split across the team (below it, a part's call and the concatenation cost
// more than the second core saves); settable for tests, whose tiny weights would never split. 64 KB splits
// SmolLM2's int4 o_proj (187-207 KB), which 128 KB left on one thread: its 2-thread int4 layers ran 1.05x faster
// (ad hoc, three alternations on the Zen 4; 32 KB no better).
inline int64_t min_split_bytes = 64 << 10;
// Split int8-activation linears write their parts into one output (the kernels' _out ops) rather than
// concatenating part outputs; settable so that tests compare both (bit-identical) and A/Bs time them.
inline bool write_parts_in_place = true;

// A linear's kernel: which registered op, its tensors after x, and its integer arguments.
enum Kind : int64_t { kDense = 0, kInt4I8 = 1, kInt8I8 = 2, kInt4Affine = 3, kInt8Grouped = 4 };

struct Linear {
  int64_t kind;
  std::vector<at::Tensor> t;  // dense: weight, bias (may be empty); int: codes, scales, mins (may be empty)
  std::vector<int64_t> ints;  // int kinds: group (, q_offset for kInt4I8)
  // t cut into `cut_parts` ranges of rows (part p: [N p / parts, N (p + 1) / parts)), made at the first split into
  // that many parts and kept: made per call, the views cost ~1 us each, three per part of every split linear.
  mutable int cut_parts = 0;
  mutable std::vector<std::vector<at::Tensor>> cuts;
};

// The C++ signatures the ops were registered with (small_m.h's def_linear_op takes its tensors by value; the
// others' kernels are lambdas over const references): a typed handle must name them exactly.
using IntLinear6 = at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t);
using IntLinear5 = at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t);
using IntLinear6Out = void(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, at::Tensor);
using IntLinear5Out = void(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, at::Tensor);

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// The program's linears: their kernels' handles, looked up once.
class Linears {
 public:
  Linears()
      : dense_(op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cinq::small_m_linear")),
        int4_i8_(op<IntLinear6>("cinq::int4_affine_linear_i8")),
        int8_i8_(op<IntLinear5>("cinq::int8_grouped_linear_i8")),
        int4_(op<IntLinear5>("cinq::int4_affine_linear")),
        int8_(op<IntLinear5>("cinq::int8_grouped_linear")),
        int4_i8_out_(op<IntLinear6Out>("cinq::int4_affine_linear_i8_out")),
        int8_i8_out_(op<IntLinear5Out>("cinq::int8_grouped_linear_i8_out")) {}

  // Dense linears of more rows than this run the kernel on chunks of it, as the Python layers do where the bf16 GEMM
  // is emulated (cpu_native.chunked_small_m_linear); 0: never (the caller keeps such steps off the program).
  void set_dense_chunk_rows(int64_t rows) { dense_chunk_rows_ = rows; }
  int64_t split_calls() const { return split_calls_.load(); }

  static void check(const Linear& l) {
    const size_t tensors = l.kind == kDense ? 2 : 3, ints = l.kind == kDense ? 0 : (l.kind == kInt4I8 ? 2 : 1);
    TORCH_CHECK(l.kind >= kDense && l.kind <= kInt8Grouped && l.t.size() == tensors && l.ints.size() == ints,
                "decode_layers: linear of kind ", l.kind, " needs ", tensors, " tensors and ", ints, " ints");
    for (const at::Tensor& t : l.t)  // rows split across threads: each tensor must be [N, ...] (or empty)
      TORCH_CHECK(t.numel() == 0 || (t.dim() >= 1 && t.size(0) == l.t[0].size(0) && t.is_contiguous()),
                  "decode_layers: a linear's tensors must be contiguous with one row per output");
  }

  // y = x W^T; with a team, large weights in one range of output rows per thread.
  at::Tensor run(const Linear& l, const at::Tensor& x, Team* team) const {
    const int64_t n = l.t[0].size(0);
    int64_t bytes = 0;
    for (const at::Tensor& t : l.t) bytes += t.numel() * t.element_size();
    const int parts = team == nullptr ? 1
                                      : static_cast<int>(std::min<int64_t>(
                                            team->size(), bytes / std::max<int64_t>(min_split_bytes, 1)));
    if (parts <= 1) return call(l, l.t, x);
    split_calls_.fetch_add(1, std::memory_order_relaxed);
    if (l.cut_parts != parts) {  // only thread 0 gets here (the team's parts run inside team->run below)
      l.cuts.assign(parts, {});
      for (int p = 0; p < parts; ++p)
        for (const at::Tensor& t : l.t)
          l.cuts[p].push_back(t.numel() == 0 ? t : t.narrow(0, n * p / parts, n * (p + 1) / parts - n * p / parts));
      l.cut_parts = parts;
    }
    if (write_parts_in_place && (l.kind == kInt4I8 || l.kind == kInt8I8)) {
      // each part writes its columns of one output: no per-part tensors, no concatenation on thread 0 (4 per
      // layer, each a dispatch and a copy between the team's parts)
      at::Tensor y = at::empty({x.size(0), n}, x.options());
      team->run(parts, [&](int p) {
        const int64_t a = n * p / parts, b = n * (p + 1) / parts;
        const std::vector<at::Tensor>& t = l.cuts[p];
        if (l.kind == kInt4I8)
          int4_i8_out_.call(x, t[0], t[1], t[2], l.ints[0], l.ints[1], y.narrow(1, a, b - a));
        else
          int8_i8_out_.call(x, t[0], t[1], t[2], l.ints[0], y.narrow(1, a, b - a));
      });
      return y;
    }
    std::vector<at::Tensor> out(parts);
    team->run(parts, [&](int p) { out[p] = call(l, l.cuts[p], x); });
    return at::cat(out, 1);
  }

 private:
  // The kernel on `t`: the linear's tensors, or one part's rows of them (every tensor of a linear is [N, ...]).
  at::Tensor call(const Linear& l, const std::vector<at::Tensor>& t, const at::Tensor& x) const {
    switch (l.kind) {
      case kDense: {
        const int64_t m = x.size(0), chunk = dense_chunk_rows_;
        if (chunk <= 0 || m <= chunk) return dense_.call(x, t[0], t[1]);
        std::vector<at::Tensor> rows;
        for (int64_t r = 0; r < m; r += chunk)
          rows.push_back(dense_.call(x.narrow(0, r, std::min(chunk, m - r)), t[0], t[1]));
        return at::cat(rows, 0);
      }
      case kInt4I8: return int4_i8_.call(x, t[0], t[1], t[2], l.ints[0], l.ints[1]);
      case kInt8I8: return int8_i8_.call(x, t[0], t[1], t[2], l.ints[0]);
      case kInt4Affine: return int4_.call(x, t[0], t[1], t[2], l.ints[0]);
      default: return int8_.call(x, t[0], t[1], t[2], l.ints[0]);
    }
  }

  int64_t dense_chunk_rows_ = 0;
  mutable std::atomic<int64_t> split_calls_{0};  // linears run split across a team (tests check the path)
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> dense_;
  c10::TypedOperatorHandle<IntLinear6> int4_i8_;
  c10::TypedOperatorHandle<IntLinear5> int8_i8_, int4_, int8_;
  c10::TypedOperatorHandle<IntLinear6Out> int4_i8_out_;
  c10::TypedOperatorHandle<IntLinear5Out> int8_i8_out_;
};

}  // namespace cinq_decode
