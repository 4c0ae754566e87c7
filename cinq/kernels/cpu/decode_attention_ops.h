// The pieces decode attention is built from (decode_attention.h's generic path and decode_attention_bf16.h's
// AVX512-BF16 one): what a call attends (Shape), per-thread buffers, the float32 dot / weighted-sum / softmax loops
// over widened K/V rows, and the masks applied to finished score rows.
#pragma once

#include <c10/util/BFloat16.h>
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

// K and V bytes the bf16 path reads ahead of their use at once (decode_attention_bf16.h's touch): half of a 1 MB L2
// (Zen 4; Intel's are 1.25-2 MB), the rest for the scores, the query and the accumulators. Settable
// (paged_decode's set_touch_bytes) so that a test can show results do not depend on it.
inline int64_t touch_bytes = 512 << 10;

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

}  // namespace cinq_decode
