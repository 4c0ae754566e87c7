// Paged decode attention for the CPU: the query tokens of each decode-like sequence (one for plain decoding,
// k + 1 when a speculative step verifies k drafts) read their K/V straight from the pages; query row r of a
// sequence with ql rows sees the keys up to position seq_len - ql + r (causal among the new rows). A tree
// verification step passes tree_mask [ql, ql] (one tree for all sequences) or [nd, ql, ql] (sequence s: slice
// s): row r then sees the cached context and, of the new rows, those with tree_mask[r][j] (its ancestors in
// the candidate tree, and itself).
//
// Why a native kernel: in PyTorch, decode attention over a paged cache needs a gather of every context into a
// contiguous copy (one extra write and read of the whole KV cache per layer per step) followed by a matmul
// with a single query row per head, which BLAS does poorly. This kernel reads each cached K and V row once.
//
// The attention itself (loops, masks, threads) is decode_attention.h's, shared with contiguous_decode.cpp; this file
// says where token t's K/V row lives in the pages.
#include <torch/extension.h>

#include <cstdint>
#include <type_traits>

#include "decode_attention.h"

namespace {

// Token t's K (or V) row of all kv heads: through the sequence's block table.
template <typename T>
struct PagedRows {
  const T* cache;
  const int32_t* table;
  int64_t block_size, block_stride, row, value_offset;
  const T* key(int64_t t) const { return cache + table[t / block_size] * block_stride + (t % block_size) * row; }
  const T* value(int64_t t) const { return key(t) + value_offset; }
  int64_t run(int64_t t) const { return block_size - t % block_size; }  // tokens from t in t's block
};

// A call's checked arguments: the query with a token's heads contiguous, the sequences, the masks.
struct Checked {
  torch::Tensor query;
  int64_t nd;
  const bool* tree;
  int64_t tree_stride;
  cinq_decode::Shape sh;
  const int32_t* starts;  // ragged rows: sequence s's first query row (nullptr: s * sh.ql)

  int64_t first_row(int64_t s) const { return starts == nullptr ? s * sh.ql : starts[s]; }
  // The shape sequence s attends with: its own row count when rows are ragged.
  cinq_decode::Shape shape_of(int64_t s) const {
    cinq_decode::Shape one = sh;
    if (starts != nullptr) one.ql = starts[s + 1] - starts[s];
    return one;
  }
};

// query [nd * ql, hq, d] float32 or bf16 (sequence s owns rows s * ql ...); kv_cache [2, num_blocks, block_size, hkv, d]
// (float32 / bf16 / fp16, contiguous); block_tables [>= nd, max_blocks] int32; seq_lens [>= nd] int32 (>= ql);
// tree_mask: empty (causal among the new rows), or contiguous bool [ql, ql] (shared by all sequences) or
// [nd, ql, ql] (one per sequence). The output is [nd * ql, hq, d] in the query's dtype (computed in float32; a bf16
// query and output convert here, in one call, rather than as two more ops per layer in Python).
// window: > 0 for a sliding-window layer (row at position p sees keys > p - window), 0 for none.
// starts: empty, or (ragged rows) int32 [nd + 1] with sequence s owning query rows starts[s] .. starts[s + 1] - 1 (then
// ql is ignored and tree_mask must be empty).
Checked check_call(const torch::Tensor& query_in, const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                   const torch::Tensor& seq_lens, double scale, int64_t ql, const torch::Tensor& tree_mask,
                   int64_t window, const torch::Tensor& starts = torch::Tensor()) {
  TORCH_CHECK(query_in.dim() == 3 && (query_in.scalar_type() == torch::kFloat32 ||
                                      query_in.scalar_type() == torch::kBFloat16),
              "paged_decode: query must be float32 or bf16 [nd * ql, hq, d]");
  // a token's heads contiguous (the split of the merged qkv output qualifies: only the token stride differs)
  const bool rows_ok = query_in.stride(2) == 1 && query_in.stride(1) == query_in.size(2);
  const torch::Tensor query = rows_ok ? query_in : query_in.contiguous();
  const bool ragged = starts.defined() && starts.numel() > 0;
  TORCH_CHECK(ragged || (ql >= 1 && query.size(0) % ql == 0),
              "paged_decode: query rows must be a multiple of ql >= 1");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "paged_decode: kv_cache must be contiguous [2, num_blocks, block_size, hkv, d]");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "paged_decode: block_tables must be contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(),
              "paged_decode: seq_lens must be contiguous int32");
  const int64_t nd = ragged ? starts.numel() - 1 : query.size(0) / ql, hq = query.size(1), d = query.size(2);
  const int32_t* first = nullptr;
  if (ragged) {
    TORCH_CHECK(starts.scalar_type() == torch::kInt32 && starts.is_contiguous() && starts.dim() == 1,
                "paged_decode_varlen: query_start_loc must be contiguous int32 [nd + 1]");
    TORCH_CHECK(tree_mask.numel() == 0, "paged_decode_varlen: tree_mask must be empty (tree rows are uniform)");
    TORCH_CHECK(seq_lens.numel() >= nd && block_tables.dim() == 2 && block_tables.size(0) >= nd,
                "paged_decode_varlen: seq_lens and block_tables need a row per sequence (", nd, ")");
    first = starts.data_ptr<int32_t>();
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    TORCH_CHECK(first[0] == 0 && first[nd] == query.size(0),
                "paged_decode_varlen: query_start_loc must run from 0 to the query's ", query.size(0), " rows");
    for (int64_t s = 0; s < nd; ++s)
      TORCH_CHECK(first[s + 1] > first[s] && lens[s] >= first[s + 1] - first[s],
                  "paged_decode_varlen: sequence ", s, " needs 1 to seq_len (", lens[s], ") query rows, has ",
                  first[s + 1] - first[s]);
  }
  const int64_t tdim = tree_mask.dim();
  TORCH_CHECK(tree_mask.numel() == 0 ||
                  (tree_mask.scalar_type() == torch::kBool && tree_mask.is_contiguous() && (tdim == 2 || tdim == 3) &&
                   (tdim == 2 || tree_mask.size(0) == nd) && tree_mask.size(tdim - 2) == ql &&
                   tree_mask.size(tdim - 1) == ql),
              "paged_decode: tree_mask must be empty or contiguous bool [ql, ql] or [nd, ql, ql]");
  const int64_t hkv = kv_cache.size(3);
  TORCH_CHECK(kv_cache.size(4) == d && hq % hkv == 0, "paged_decode: head shapes do not match");
  return Checked{query, nd, tree_mask.numel() ? tree_mask.data_ptr<bool>() : nullptr,
                 tdim == 3 ? ql * ql : 0,  // the shared mask: every sequence reads slice 0
                 cinq_decode::Shape{ragged ? 0 : ql, hq, hkv, d, query.stride(0), static_cast<float>(scale), window},
                 first};
}

// f(cache, query, out, rows_of) with the call's element types; rows_of(s) locates sequence s's K/V rows.
template <typename F>
void with_rows(const Checked& c, const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
               const torch::Tensor& out, const F& f) {
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t max_blocks = block_tables.size(1), block_size = kv_cache.size(2), row = c.sh.hkv * c.sh.d;
  const int64_t value_offset = kv_cache.numel() / 2;  // kv_cache[1], without a select op per call
  cinq_decode::dispatch_types(kv_cache.scalar_type(), c.query.scalar_type(), "paged_decode", [&](auto cz, auto qz) {
    using T = decltype(cz);
    using Q = decltype(qz);
    const T* cache = reinterpret_cast<const T*>(kv_cache.data_ptr());
    f(T{}, reinterpret_cast<const Q*>(c.query.data_ptr()), reinterpret_cast<Q*>(out.data_ptr()), [=](int64_t s) {
      return PagedRows<T>{cache, tables + s * max_blocks, block_size, block_size * row, row, value_offset};
    });
  });
}

// Sequences [begin, end) of a checked call, on the calling thread, into `out` (the call's whole output): each
// sequence is computed exactly as in the whole call, whichever thread runs it.
void attend_seqs(const Checked& c, const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                 const torch::Tensor& seq_lens, const torch::Tensor& out, int64_t begin, int64_t end) {
  TORCH_CHECK(begin >= 0 && begin <= end && end <= c.nd, "paged_decode_seqs: sequences [", begin, ", ", end,
              ") are outside the call's ", c.nd);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == c.query.scalar_type() && out.dim() == 3 &&
                  out.size(0) == c.query.size(0) && out.size(1) == c.sh.hq && out.size(2) == c.sh.d,
              "paged_decode_seqs: out must be contiguous [query rows, hq, d] of the query's dtype");
  thread_local cinq_decode::Scratch buf;
  with_rows(c, kv_cache, block_tables, out, [&](auto t, auto q, auto o, const auto& rows_of) {
    for (int64_t s = begin; s < end; ++s)
      cinq_decode::attend<decltype(t)>(q + c.first_row(s) * c.sh.q_token_stride, o + c.first_row(s) * c.sh.hq * c.sh.d,
                                       rows_of(s), seq_lens.data_ptr<int32_t>()[s], 0, c.sh.hkv,
                                       c.tree == nullptr ? nullptr : c.tree + s * c.tree_stride, c.shape_of(s), buf);
  });
}

}  // namespace

// Attention of every decode-like sequence over its pages (see check_call for the arguments); returns the output.
torch::Tensor paged_decode_window(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor block_tables,
                                  torch::Tensor seq_lens, double scale, int64_t ql, torch::Tensor tree_mask,
                                  int64_t window) {
  const Checked c = check_call(query_in, kv_cache, block_tables, seq_lens, scale, ql, tree_mask, window);
  auto out = torch::empty({c.query.size(0), c.sh.hq, c.sh.d}, c.query.options());
  with_rows(c, kv_cache, block_tables, out, [&](auto t, auto q, auto o, const auto& rows_of) {
    cinq_decode::attend_all<decltype(t)>(q, o, seq_lens.data_ptr<int32_t>(), c.nd, c.tree, c.tree_stride, c.sh,
                                         rows_of);
  });
  return out;
}

// Sequences [begin, end) of paged_decode (no window), on the calling thread, written into `out` (the caller's
// [nd * ql, hq, d] of the query's dtype). The fused decode step runs a layer's sequences across its thread team
// (inside the step's one parallel region the whole call would run on one thread); each sequence is computed
// exactly as in the whole call.
void paged_decode_seqs(const torch::Tensor& query_in, const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& seq_lens, double scale, int64_t ql, const torch::Tensor& tree_mask,
                       const torch::Tensor& out, int64_t begin, int64_t end) {
  const Checked c = check_call(query_in, kv_cache, block_tables, seq_lens, scale, ql, tree_mask, 0);
  attend_seqs(c, kv_cache, block_tables, seq_lens, out, begin, end);
}

// Query heads [head_begin, head_end) of every sequence of paged_decode (no window), on the calling thread, into `out`
// (as paged_decode_seqs): how a thread team splits one sequence. Any head range where attention takes the bf16 path
// (decode_attention.h's bf16_path), whole kv heads elsewhere; each head is computed exactly as in the whole call.
void paged_decode_heads(const torch::Tensor& query_in, const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens, double scale, int64_t ql, const torch::Tensor& tree_mask,
                        const torch::Tensor& out, int64_t head_begin, int64_t head_end) {
  const Checked c = check_call(query_in, kv_cache, block_tables, seq_lens, scale, ql, tree_mask, 0);
  const int64_t group = c.sh.hq / c.sh.hkv;
  TORCH_CHECK(0 <= head_begin && head_begin < head_end && head_end <= c.sh.hq, "paged_decode_heads: heads [",
              head_begin, ", ", head_end, ") are outside the query's ", c.sh.hq);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == c.query.scalar_type() && out.sizes() == c.query.sizes(),
              "paged_decode_heads: out must be contiguous [query rows, hq, d] of the query's dtype");
  thread_local cinq_decode::Scratch buf;
  with_rows(c, kv_cache, block_tables, out, [&](auto t, auto q, auto o, const auto& rows_of) {
    using T = decltype(t);
    using Q = std::remove_cv_t<std::remove_pointer_t<decltype(q)>>;
    const bool any = cinq_decode::bf16_path<T, Q>(c.sh);
    TORCH_CHECK(any || (head_begin % group == 0 && head_end % group == 0),
                "paged_decode_heads: off the bf16 path heads split at whole kv heads (multiples of ", group, ")");
    for (int64_t s = 0; s < c.nd; ++s) {
      const int32_t len = seq_lens.data_ptr<int32_t>()[s];
      const bool* tree = c.tree == nullptr ? nullptr : c.tree + s * c.tree_stride;
      if (any)
        cinq_decode::attend_heads<T>(q + s * c.sh.ql * c.sh.q_token_stride, o + s * c.sh.ql * c.sh.hq * c.sh.d,
                                     rows_of(s), len, head_begin, head_end, tree, c.sh, buf);
      else
        cinq_decode::attend<T>(q + s * c.sh.ql * c.sh.q_token_stride, o + s * c.sh.ql * c.sh.hq * c.sh.d, rows_of(s),
                               len, head_begin / group, head_end / group, tree, c.sh, buf);
    }
  });
}

torch::Tensor paged_decode(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor block_tables,
                           torch::Tensor seq_lens, double scale, int64_t ql, torch::Tensor tree_mask) {
  return paged_decode_window(query_in, kv_cache, block_tables, seq_lens, scale, ql, tree_mask, 0);
}

// Ragged rows: sequence s owns query rows query_start_loc[s] .. query_start_loc[s + 1] - 1 (a speculative step in
// which requests verify different numbers of drafts, or none), each causal among its own new rows; no tree, no
// window. Every sequence is computed exactly as a uniform call with its row count computes it.
torch::Tensor paged_decode_varlen(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor block_tables,
                                  torch::Tensor seq_lens, double scale, torch::Tensor query_start_loc) {
  const Checked c = check_call(query_in, kv_cache, block_tables, seq_lens, scale, 0, torch::Tensor(), 0,
                               query_start_loc);
  auto out = torch::empty({c.query.size(0), c.sh.hq, c.sh.d}, c.query.options());
  int64_t tokens = 0;
  for (int64_t s = 0; s < c.nd; ++s) tokens += seq_lens.data_ptr<int32_t>()[s];
  with_rows(c, kv_cache, block_tables, out, [&](auto t, auto q, auto o, const auto& rows_of) {
    cinq_decode::for_each_item(c.nd, c.sh.hkv, tokens * c.sh.hkv * c.sh.d * 2 * int64_t(kv_cache.element_size()),
                               [&](int64_t s, int64_t h0, int64_t h1, cinq_decode::Scratch& buf) {
      cinq_decode::attend<decltype(t)>(q + c.first_row(s) * c.sh.q_token_stride, o + c.first_row(s) * c.sh.hq * c.sh.d,
                                       rows_of(s), seq_lens.data_ptr<int32_t>()[s], h0, h1, nullptr, c.shape_of(s),
                                       buf);
    });
  });
  return out;
}

// Sequences [begin, end) of paged_decode_varlen, on the calling thread, into `out` (as paged_decode_seqs).
void paged_decode_varlen_seqs(const torch::Tensor& query_in, const torch::Tensor& kv_cache,
                              const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale,
                              const torch::Tensor& query_start_loc, const torch::Tensor& out, int64_t begin,
                              int64_t end) {
  const Checked c = check_call(query_in, kv_cache, block_tables, seq_lens, scale, 0, torch::Tensor(), 0,
                               query_start_loc);
  attend_seqs(c, kv_cache, block_tables, seq_lens, out, begin, end);
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.paged_decode(_window) in C++ (see small_m_gemm.cpp): one call per layer of a compiled decode step.
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  m.def("paged_decode(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int query_len, Tensor tree_mask) -> Tensor");
  m.def("paged_decode_window(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int query_len, Tensor tree_mask, int window) -> Tensor");
  m.def("paged_decode_seqs(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int query_len, Tensor tree_mask, Tensor(a!) out, int begin, int end) -> ()");
  m.def("paged_decode_heads(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int query_len, Tensor tree_mask, Tensor(a!) out, int head_begin, int head_end) -> ()");
  m.def("paged_decode_varlen(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "Tensor query_start_loc) -> Tensor");
  m.def("paged_decode_varlen_seqs(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "Tensor query_start_loc, Tensor(a!) out, int begin, int end) -> ()");
}
TORCH_LIBRARY_IMPL(cinq, CPU, m) {
  m.impl("paged_decode", [](const at::Tensor& q, const at::Tensor& cache, const at::Tensor& tables,
                            const at::Tensor& lens, double scale, int64_t ql, const at::Tensor& tree) {
    return paged_decode(q, cache, tables, lens, scale, ql, tree);
  });
  m.impl("paged_decode_window", [](const at::Tensor& q, const at::Tensor& cache, const at::Tensor& tables,
                                   const at::Tensor& lens, double scale, int64_t ql, const at::Tensor& tree,
                                   int64_t window) {
    return paged_decode_window(q, cache, tables, lens, scale, ql, tree, window);
  });
  m.impl("paged_decode_seqs", [](const at::Tensor& q, const at::Tensor& cache, const at::Tensor& tables,
                                 const at::Tensor& lens, double scale, int64_t ql, const at::Tensor& tree,
                                 const at::Tensor& out, int64_t begin, int64_t end) {
    paged_decode_seqs(q, cache, tables, lens, scale, ql, tree, out, begin, end);
  });
  m.impl("paged_decode_heads", [](const at::Tensor& q, const at::Tensor& cache, const at::Tensor& tables,
                                  const at::Tensor& lens, double scale, int64_t ql, const at::Tensor& tree,
                                  const at::Tensor& out, int64_t head_begin, int64_t head_end) {
    paged_decode_heads(q, cache, tables, lens, scale, ql, tree, out, head_begin, head_end);
  });
  m.impl("paged_decode_varlen", [](const at::Tensor& q, const at::Tensor& cache, const at::Tensor& tables,
                                   const at::Tensor& lens, double scale, const at::Tensor& starts) {
    return paged_decode_varlen(q, cache, tables, lens, scale, starts);
  });
  m.impl("paged_decode_varlen_seqs", [](const at::Tensor& q, const at::Tensor& cache, const at::Tensor& tables,
                                        const at::Tensor& lens, double scale, const at::Tensor& starts,
                                        const at::Tensor& out, int64_t begin, int64_t end) {
    paged_decode_varlen_seqs(q, cache, tables, lens, scale, starts, out, begin, end);
  });
}
TORCH_LIBRARY_IMPL(cinq, Meta, m) {
  m.impl("paged_decode", [](const at::Tensor& q, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                            int64_t, const at::Tensor&) { return at::empty_like(q); });
  m.impl("paged_decode_window", [](const at::Tensor& q, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   double, int64_t, const at::Tensor&, int64_t) { return at::empty_like(q); });
  m.impl("paged_decode_seqs", [](const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                 int64_t, const at::Tensor&, const at::Tensor&, int64_t, int64_t) {});
  m.impl("paged_decode_heads", [](const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                  int64_t, const at::Tensor&, const at::Tensor&, int64_t, int64_t) {});
  m.impl("paged_decode_varlen", [](const at::Tensor& q, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   double, const at::Tensor&) { return at::empty_like(q); });
  m.impl("paged_decode_varlen_seqs", [](const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        double, const at::Tensor&, const at::Tensor&, int64_t, int64_t) {});
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU)");
  m.def("paged_decode_window", &paged_decode_window, "paged decode attention (CPU), sliding window");
  m.def("paged_decode_seqs", &paged_decode_seqs, "sequences [begin, end) of paged_decode, into out");
  m.def("paged_decode_heads", &paged_decode_heads, "query heads [head_begin, head_end) of paged_decode, into out");
  m.def("paged_decode_varlen", &paged_decode_varlen, "paged decode attention (CPU), ragged query rows per sequence");
  m.def("paged_decode_varlen_seqs", &paged_decode_varlen_seqs, "sequences [begin, end) of paged_decode_varlen");
  m.def("set_tile_floats", [](int64_t floats) { cinq_decode::tile_floats = floats; }, py::arg("floats"));
  m.def("tile_floats", [] { return cinq_decode::tile_floats; });
  m.def("set_touch_bytes", [](int64_t bytes) { cinq_decode::touch_bytes = bytes; }, py::arg("bytes"));
  m.def("touch_bytes", [] { return cinq_decode::touch_bytes; });
}
