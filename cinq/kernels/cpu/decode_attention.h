// Decode attention over one sequence's cached K/V, shared by the paged (paged_decode.cpp) and the
// virtual-contiguous (contiguous_decode.cpp) layouts: they differ only in where token t's K/V row lives, which the
// caller's row locator says (`rows.key(t)`, `rows.value(t)`: token t's row of all kv heads).
//
// Why this shape: at batch 1 the context is a few hundred rows of a few hundred bytes, so the cost was never the
// bytes but the inner loops: the earlier kernels divided (query row -> token, head, kv head) inside the per-key
// loop and called a scalar exp per score, ~0.25 us per cached token on a 9-head model (5-8x the bytes' time).
// Here the loops run per kv head over the query rows that share it (no division inside), the dots and the
// weighted V sum are AVX2 + FMA over head_dim, the exps are vectorized, and masks (causal among the step's rows,
// tree, sliding window) are applied to the finished score rows instead of tested per score.
//
// Two passes per kv head: scores (into a per-thread buffer) and their softmax, then the weighted sum of V.
// Accumulation is in float32; the query is widened once per call and the output written in the query's dtype
// (bf16 rounded to nearest even, as torch's .to()), so the Python side adds no conversion op per layer.
//
// With a bf16 cache and query on a CPU with AVX512-BF16 (and head_dim 64, 128 or 256), attend() takes
// decode_attention_bf16.h's path instead: dot products in bf16 straight from the pages (1.45-1.8x at 150-1024
// cached tokens, SmolLM2's heads, ad hoc). The pieces both paths share are in decode_attention_ops.h.
#pragma once

#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "decode_attention_bf16.h"
#include "decode_attention_ops.h"
#include "small_m.h"

namespace cinq_decode {

// Whether attend() takes decode_attention_bf16.h's path: a bf16 cache and query on an AVX512-BF16 CPU, head_dim 64
// or 128. There a sequence's query heads can be split at any head (attend_heads), elsewhere at whole kv heads.
template <typename T, typename Q>
bool bf16_path(const Shape& sh) {
#if defined(__AVX512BF16__)
  return std::is_same_v<T, c10::BFloat16> && std::is_same_v<Q, c10::BFloat16> && (sh.d == 64 || sh.d == 128 || sh.d == 256);
#else
  return false;
#endif
}

// Query heads a .. b-1 of one sequence on the bf16 path (bf16_path<T, Q>(sh) must hold).
template <typename T, typename Q, typename O, typename Rows>
void attend_heads(const Q* q, O* out, const Rows& rows, int64_t len, int64_t a, int64_t b, const bool* tree,
                  const Shape& sh, Scratch& buf) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<Q, c10::BFloat16>) {
    if (sh.d == 64) return attend_bf16<64>(q, out, rows, len, a, b, tree, sh, buf);
    if (sh.d == 128) return attend_bf16<128>(q, out, rows, len, a, b, tree, sh, buf);
    if (sh.d == 256) return attend_bf16<256>(q, out, rows, len, a, b, tree, sh, buf);
  }
#endif
  TORCH_CHECK(false, "decode attention: no bf16 path for this cache, query and head_dim on this CPU");
}

// Attention of kv heads h0 .. h1-1 of one sequence of `len` cached tokens: q (this sequence's first query row,
// type Q), out (same layout as q, contiguous [ql, hq, d], type O).
template <typename T, typename Q, typename O, typename Rows>
void attend(const Q* q, O* out, const Rows& rows, int64_t len, int64_t h0, int64_t h1, const bool* tree,
            const Shape& sh, Scratch& buf) {
  if (bf16_path<T, Q>(sh)) return attend_heads<T>(q, out, rows, len, h0 * (sh.hq / sh.hkv),
                                                  h1 * (sh.hq / sh.hkv), tree, sh, buf);
  // Query rows jq = r * nqh + j: query token r, head h0 * group + j. Token t's K/V row of kv heads h0 .. h1-1 is
  // widened once for all the query rows that read it.
  const int64_t group = sh.hq / sh.hkv, d = sh.d, nh = h1 - h0, nqh = nh * group, nq = sh.ql * nqh;
  // keys before the first row's window are never read
  const int64_t t0 = sh.window > 0 ? std::max<int64_t>(0, len - sh.ql - sh.window + 1) : 0, span = len - t0;
  buf.q.resize(nq * d);
  buf.scores.resize(nq * span);
  buf.acc.assign(nq * d, 0.f);
  buf.inv.resize(nq);
  buf.kv_of.resize(nq);
  for (int64_t r = 0; r < sh.ql; ++r) {
    for (int64_t j = 0; j < nqh; ++j) {
      widen(q + r * sh.q_token_stride + (h0 * group + j) * d, buf.q.data() + (r * nqh + j) * d, d);
      buf.kv_of[r * nqh + j] = (j / group) * d;
    }
  }
  const int64_t* kv_of = buf.kv_of.data();
  // K (then V) rows widened a tile of keys at a time, [tile, nh * d], small enough to stay in L1 while every query
  // row of the tile's kv heads reads it (widening the whole span first measured ~1.5x slower at a context of 1024:
  // a span of rows outgrows L2 and each query row re-read it from L3). Tiles are multiples of 8 keys from t0, so
  // scores_of groups keys exactly as over the whole span and every result is the same to the bit; a run of
  // tokens whose rows follow each other (a page) is widened in one call when every kv head is read.
  const int64_t row = nh * d, full = sh.hkv * d;
  const int64_t tile = std::max<int64_t>(8, (tile_floats / row) / 8 * 8);
  buf.row.resize(std::min(tile, span) * row);
  auto widen_tile = [&](bool values, int64_t ta, int64_t tb) {
    for (int64_t t = ta; t < tb;) {
      const int64_t n = std::min(rows.run(t), tb - t);
      const T* src = (values ? rows.value(t) : rows.key(t)) + h0 * d;
      float* dst = buf.row.data() + (t - ta) * row;
      if (row == full) {
        widen(src, dst, n * row);
      } else {
        for (int64_t i = 0; i < n; ++i) widen(src + i * full, dst + i * row, row);
      }
      t += n;
    }
  };
  for (int64_t ta = t0; ta < len; ta += tile) {
    const int64_t tb = std::min(len, ta + tile);
    widen_tile(false, ta, tb);
    for (int64_t jq = 0; jq < nq; ++jq)
      scores_of(buf.q.data() + jq * d, buf.row.data() + kv_of[jq], row, tb - ta, d, sh.scale,
                buf.scores.data() + jq * span + (ta - t0));
  }
  mask_scores(buf.scores.data(), span, t0, len, nqh, tree, sh);
  for (int64_t jq = 0; jq < nq; ++jq) buf.inv[jq] = softmax_numerators(buf.scores.data() + jq * span, span);
  for (int64_t ta = t0; ta < len; ta += tile) {
    const int64_t tb = std::min(len, ta + tile);
    widen_tile(true, ta, tb);
    for (int64_t jq = 0; jq < nq; ++jq)
      weighted_sum(buf.scores.data() + jq * span + (ta - t0), buf.row.data() + kv_of[jq], row, tb - ta, d,
                   buf.acc.data() + jq * d);
  }
  for (int64_t r = 0; r < sh.ql; ++r) {
    for (int64_t j = 0; j < nqh; ++j) {
      narrow(buf.acc.data() + (r * nqh + j) * d, out + (r * sh.hq + h0 * group + j) * d, d, buf.inv[r * nqh + j]);
    }
  }
}

// Runs item(s, h0, h1, scratch) over every (sequence, chunk of kv heads): whole sequences when there are enough of
// them for the threads, kv heads split so that batch-1 decode still uses every thread; one thread when the
// call's K/V read (`kv_bytes`) is too small to pay for waking the pool (small_m.h's threshold).
template <typename F>
void for_each_item(int64_t nd, int64_t hkv, int64_t kv_bytes, const F& item) {
  const int64_t threads = kv_bytes < cinq_small_m::kMinParallelBytes ? 1 : at::get_num_threads();
  const int64_t chunks = nd >= threads ? 1 : std::min<int64_t>(hkv, (threads + nd - 1) / nd);
  const int64_t per_chunk = (hkv + chunks - 1) / chunks;
  auto body = [&](int64_t begin, int64_t end) {
    Scratch buf;
    for (int64_t it = begin; it < end; ++it) {
      const int64_t s = it / chunks, h0 = (it % chunks) * per_chunk, h1 = std::min(hkv, h0 + per_chunk);
      if (h0 < h1) item(s, h0, h1, buf);
    }
  };
  if (threads == 1) {
    body(0, nd * chunks);
  } else {
    at::parallel_for(0, nd * chunks, 1, body);
  }
}

// Every sequence of a call: rows_of(s) locates sequence s's K/V rows; tree (nullptr: none) steps tree_stride per
// sequence. q / out: [nd * ql, hq, d], sequence s's rows from s * ql.
template <typename T, typename Q, typename RowsOf>
void attend_all(const Q* q, Q* out, const int32_t* seq_lens, int64_t nd, const bool* tree, int64_t tree_stride,
                const Shape& sh, const RowsOf& rows_of) {
  int64_t tokens = 0;
  for (int64_t s = 0; s < nd; ++s) tokens += seq_lens[s];
  for_each_item(nd, sh.hkv, tokens * sh.hkv * sh.d * 2 * int64_t(sizeof(T)),
                [&](int64_t s, int64_t h0, int64_t h1, Scratch& buf) {
    attend<T>(q + s * sh.ql * sh.q_token_stride, out + s * sh.ql * sh.hq * sh.d, rows_of(s), seq_lens[s], h0, h1,
              tree == nullptr ? nullptr : tree + s * tree_stride, sh, buf);
  });
}

// f(T{}, Q{}) for the cache's element type T (float32 / bf16 / fp16) and the query's Q (float32 / bf16).
template <typename F>
void dispatch_types(c10::ScalarType cache, c10::ScalarType query, const char* op, const F& f) {
  auto with_query = [&](auto cache_type) {
    if (query == c10::ScalarType::Float) {
      f(cache_type, float{});
    } else {
      f(cache_type, c10::BFloat16{});
    }
  };
  switch (cache) {
    case c10::ScalarType::Float:
      return with_query(float{});
    case c10::ScalarType::BFloat16:
      return with_query(c10::BFloat16{});
    case c10::ScalarType::Half:
      return with_query(c10::Half{});
    default:
      TORCH_CHECK(false, op, ": kv_cache dtype must be float32, bf16 or fp16");
  }
}

}  // namespace cinq_decode
