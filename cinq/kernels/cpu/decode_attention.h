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
#include <vector>

#include "bf16.h"
#include "small_m.h"

namespace cinq_decode {

inline void widen(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void widen(const c10::BFloat16* src, float* dst, int64_t n) {
  const auto* s = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(CINQ_SMALL_M_AVX2)
  for (; i + 8 <= n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = cinq_bf16::bf16_to_float(s[i]);
}

inline void widen(const c10::Half* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void narrow(const float* src, float* dst, int64_t n, float mul) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * mul;
}

inline void narrow(const float* src, c10::BFloat16* dst, int64_t n, float mul) {
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = cinq_bf16::float_to_bf16(src[i] * mul);
}

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float total = 0.f;
#if defined(CINQ_SMALL_M_AVX2)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  total = cinq_small_m::hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// acc[i] += w * v[i]
inline void axpy(float* acc, float w, const float* v, int64_t n) {
  int64_t i = 0;
#if defined(CINQ_SMALL_M_AVX2)
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
  }
#endif
  for (; i < n; ++i) acc[i] += w * v[i];
}

#if defined(CINQ_SMALL_M_AVX2)
// e^x for 8 lanes (Cephes' expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp), 0 below -87 (a masked
// score is -inf).
inline __m256 exp8(__m256 x) {
  const __m256 masked = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(masked, _mm256_mul_ps(y, _mm256_castsi256_ps(pow2)));
}
#endif

// s[i] <- exp(s[i] - mx) in place; returns 1 / their sum.
inline float softmax_numerators(float* s, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(CINQ_SMALL_M_AVX2)
  // the maximum 8 lanes at a time (exact in any order; the scalar loop was one dependent max per key)
  __m256 mv = _mm256_set1_ps(mx);
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  for (float v : lanes) mx = std::max(mx, v);
#endif
  for (; i < n; ++i) mx = std::max(mx, s[i]);
  i = 0;
  float total = 0.f;
#if defined(CINQ_SMALL_M_AVX2)
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  total = cinq_small_m::hsum(acc);
#endif
  for (; i < n; ++i) total += (s[i] = std::exp(s[i] - mx));
  return 1.f / total;
}

// s[t] = scale * q . k_t for the span's keys k_t = keys + t * stride (d floats each). Eight keys at a time where
// d is a multiple of 8: their eight dot products accumulate side by side over d and one transposing reduction
// sums them, where one dot per key paid a horizontal sum each (at d = 64, as much as its multiply-adds).
inline void scores_of(const float* q, const float* keys, int64_t stride, int64_t span, int64_t d, float scale,
                      float* s) {
  int64_t t = 0;
#if defined(CINQ_SMALL_M_AVX2)
  if (d % 8 == 0) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (; t + 8 <= span; t += 8) {
      __m256 acc[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      const float* k0 = keys + t * stride;
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + j * stride + i), acc[j]);
      }
      // lane j of the result: the sum of acc[j]'s eight lanes
      const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
      const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
      _mm256_storeu_ps(s + t, _mm256_mul_ps(sum, sc));
    }
  }
#endif
  for (; t < span; ++t) s[t] = dot(q, keys + t * stride, d) * scale;
}

// acc[:d] += sum over t of p[t] * v_t for the span's values v_t = values + t * stride. With d = 64 the sum stays in
// eight registers across the keys (one multiply-add per value), where an axpy per key loaded and stored it each time.
inline void weighted_sum(const float* p, const float* values, int64_t stride, int64_t span, int64_t d, float* acc) {
#if defined(CINQ_SMALL_M_AVX2)
  if (d == 64) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = _mm256_loadu_ps(acc + 8 * i);
    for (int64_t t = 0; t < span; ++t) {
      const __m256 w = _mm256_set1_ps(p[t]);
      const float* v = values + t * stride;
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * i), a[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
    return;
  }
#endif
  for (int64_t t = 0; t < span; ++t) axpy(acc, p[t], values + t * stride, d);
}

// Floats of widened K/V rows per tile of keys (16 KB: half of a 32 KB L1 data cache, the rest for the query rows,
// their scores and the accumulators). Settable (paged_decode's set_tile_floats) so that a test can show results do
// not depend on it.
inline int64_t tile_floats = 4096;

// Per-thread buffers, reused across the work items of a call.
struct Scratch {
  std::vector<float> q, scores, acc, inv;
  std::vector<float> row;      // a tile of K rows widened, [tile, kv heads * d]; then of V rows
  std::vector<int64_t> kv_of;  // query row -> its kv head's offset in a row of `row`
};

// What one call attends: query rows of `ql` tokens per sequence, `hq` heads of `d`, each sequence's query rows
// starting q_stride(0) apart; kv heads `hkv`; masks: `tree` (per sequence, [ql, ql] row-major, nullptr: causal
// among the new rows) and `window` (> 0: a row at position p sees keys > p - window).
struct Shape {
  int64_t ql, hq, hkv, d, q_token_stride;
  float scale;
  int64_t window;
};

// Masks the finished scores [ql * per_token, span] of keys t0 .. len-1 (query token r owns rows r * per_token ...):
// keys after the row's own position, those its tree row leaves out, those before its window.
inline void mask_scores(float* scores, int64_t span, int64_t t0, int64_t len, int64_t per_token, const bool* tree,
                        const Shape& sh) {
  const float neg = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < sh.ql; ++r) {
    const int64_t pos = len - sh.ql + r;  // this row's position: keys after it are later new rows
    for (int64_t j = 0; j < per_token; ++j) {
      float* s = scores + (r * per_token + j) * span - t0;  // s[t] for key t
      for (int64_t t = pos + 1; t < len; ++t) s[t] = neg;
      if (tree != nullptr) {
        for (int64_t rel = 0; rel <= r; ++rel) {
          if (!tree[r * sh.ql + rel]) s[len - sh.ql + rel] = neg;
        }
      }
      if (sh.window > 0) {
        for (int64_t t = t0; t <= pos - sh.window; ++t) s[t] = neg;
      }
    }
  }
}

// Attention of kv heads h0 .. h1-1 of one sequence of `len` cached tokens: q (this sequence's first query row,
// type Q), out (same layout as q, contiguous [ql, hq, d], type O).
template <typename T, typename Q, typename O, typename Rows>
void attend(const Q* q, O* out, const Rows& rows, int64_t len, int64_t h0, int64_t h1, const bool* tree,
            const Shape& sh, Scratch& buf) {
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
