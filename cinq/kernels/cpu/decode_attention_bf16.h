// Decode attention for a bf16 cache and a bf16 query on CPUs with AVX512-BF16 (attend() in decode_attention.h
// takes this path there): K and V read from the pages as they are, no widened copy.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

#include "decode_attention_ops.h"
#include "small_m.h"

namespace cinq_decode {

#if defined(__AVX512BF16__)
// Where touch() puts what it reads: a load the compiler must keep.
inline volatile uint32_t touch_sink = 0;

// Query rows a PV pass accumulates together (D / 16 float vectors each, up to 8 of them at a time).
template <int D>
constexpr int kPvRows = D == 64 ? 6 : 3;

// attend() for a bf16 cache and a bf16 query with AVX512-BF16, head_dim D (64, 128, or Gemma 3's 256): the K and
// V rows are read from the pages as they are, with no widened copy. Scores: `vdpbf16ps` of the bf16 query against
// 16 keys at a time (exact products, float32 sums), their 16 sums reduced together; V: each row widened in
// registers once for the query rows of its kv head that a pass accumulates (the float sums in key order, as
// weighted_sum's). The widening path measured ~2x slower per cached token at batch 1 (SmolLM2: 9 heads of 64 over
// 3 kv heads; Gemma 3 270M's 4 heads of 256 over one, a call at a context of 320: 54 -> 22 us with the rows in
// cache, 79 -> 38 us from memory). Query heads a .. b-1 of one sequence (any range: a thread team splits one
// sequence's heads this way).
template <int D, typename O, typename Rows>
void attend_bf16(const c10::BFloat16* q, O* out, const Rows& rows, int64_t len, int64_t a, int64_t b,
                 const bool* tree, const Shape& sh, Scratch& buf) {
  const int64_t group = sh.hq / sh.hkv, nqh = b - a, nq = sh.ql * nqh;
  const int64_t t0 = sh.window > 0 ? std::max<int64_t>(0, len - sh.ql - sh.window + 1) : 0, span = len - t0;
  buf.scores.resize(nq * span);
  buf.inv.resize(nq);
  const auto* qb = reinterpret_cast<const uint16_t*>(q);
  // query row jq = r * nqh + j: token r, head a + j
  auto q_row = [&](int64_t jq) { return qb + (jq / nqh) * sh.q_token_stride + (a + jq % nqh) * D; };
  // kv head h serves the range's query heads h * group + g for g in [g_lo(h), g_hi(h))
  auto g_lo = [&](int64_t h) { return std::max<int64_t>(a - h * group, 0); };
  auto g_hi = [&](int64_t h) { return std::min<int64_t>(b - h * group, group); };
  const __m512 scale = _mm512_set1_ps(sh.scale);
  // The range's kv heads: a token's rows of them are contiguous, row_bytes of K and as many of V.
  const int64_t h_first = a / group, h_end = (b - 1) / group + 1, row_bytes = (h_end - h_first) * D * 2;
  // Reads tokens ta .. tb-1's rows (K, or V) ahead of their use, one plain load per 64-byte line. A decode step's
  // linears stream megabytes of weights between two calls of a layer, so the rows come from memory; read in
  // place by the dot products they arrived at ~6-7 GB/s (SmolLM2 at a context of 320, its rows cycled from memory:
  // 36 us a call, 16 with them in cache). Independent loads with nothing waiting on them keep many lines in flight;
  // software prefetches (0.5-8 KB ahead, to L1 or L2) and loads interleaved with the tiles measured no better on
  // this Zen 4 VM. The segment then runs from L2.
  auto touch = [&](bool values, int64_t ta, int64_t tb) {
    uint32_t sink = 0;
    for (int64_t t = ta; t < tb; ++t) {
      const char* p = reinterpret_cast<const char*>((values ? rows.value(t) : rows.key(t)) + h_first * D);
      for (int64_t l = 0; l < row_bytes; l += 64) sink += static_cast<unsigned char>(p[l]);
    }
    touch_sink = sink;
  };
  // K and V of the whole span read at the start when they fit touch_bytes, else segments of it: K before the
  // segment's scores, V before its part of the weighted sums (the running sums kept in buf.acc between segments).
  const bool at_once = 2 * span * row_bytes <= touch_bytes;
  const int64_t seg = at_once ? span : std::max<int64_t>(16, touch_bytes / 2 / row_bytes / 16 * 16);
  if (at_once) {
    touch(false, t0, len);
    touch(true, t0, len);
  }
  // Tiles of 16 keys (multiples of 16 from t0, as segments are), every kv head of the range per tile.
  for (int64_t sa = t0; sa < len; sa += seg) {
    const int64_t sb = std::min(len, sa + seg);
    if (!at_once) touch(false, sa, sb);
    for (int64_t ta = sa; ta < sb; ta += 16) {
      const int64_t n = std::min<int64_t>(16, len - ta);
      for (int64_t h = h_first; h < h_end; ++h) {
        const int64_t j0 = h * group - a;  // query head h * group + g is row j0 + g of a token
        const uint16_t* k[16];
        for (int64_t i = 0; i < 16; ++i)  // past the span: the last key again, its score not stored
          k[i] = reinterpret_cast<const uint16_t*>(rows.key(ta + std::min(i, n - 1))) + h * D;
        for (int64_t r = 0; r < sh.ql; ++r) {
          for (int64_t g = g_lo(h); g < g_hi(h); ++g) {
            const int64_t jq = r * nqh + j0 + g;
            const uint16_t* qr = q_row(jq);
            __m512bh qv[D / 32];
#pragma GCC unroll 4
            for (int c = 0; c < D / 32; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(qr + 32 * c);
            __m512 acc[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i) {
              acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
              for (int c = 0; c < D / 32; ++c)
                acc[i] = _mm512_dpbf16_ps(acc[i], qv[c], (__m512bh)_mm512_loadu_si512(k[i] + 32 * c));
            }
            const __m512 sc = _mm512_mul_ps(cinq_small_m::sum_lanes16(acc), scale);
            _mm512_mask_storeu_ps(buf.scores.data() + jq * span + (ta - t0), _cvtu32_mask16((1u << n) - 1), sc);
          }
        }
      }
    }
  }
  mask_scores(buf.scores.data(), span, t0, len, nqh, tree, sh);
  for (int64_t jq = 0; jq < nq; ++jq) buf.inv[jq] = softmax_numerators(buf.scores.data() + jq * span, span);
  // V: a row's D / 16 float vectors, taken VC at a time (a column chunk): R rows x VC accumulators and the VC
  // widened V vectors stay within the 32 vector registers (D = 256 in two chunks of 128 columns, R = 3)
  constexpr int R = kPvRows<D>, V = D / 16, VC = V < 8 ? V : 8;
  buf.acc.assign(nq * D, 0.f);  // each query row's weighted sum of V over the segments so far
  for (int64_t sa = t0; sa < len; sa += seg) {
    const int64_t sb = std::min(len, sa + seg);
    if (!at_once) touch(true, sa, sb);
    for (int64_t h = h_first; h < h_end; ++h) {
      const int64_t j0 = h * group - a, gl = g_lo(h), gn = g_hi(h) - gl;
      // this kv head's query rows, R at a time: (token r, row j0 + g) for r < ql, g in [gl, gl + gn)
      for (int64_t i0 = 0; i0 < sh.ql * gn; i0 += R) {
        const int rn = static_cast<int>(std::min<int64_t>(R, sh.ql * gn - i0));
        int64_t jq[R];
        for (int i = 0; i < rn; ++i) jq[i] = (i0 + i) / gn * nqh + j0 + gl + (i0 + i) % gn;
        for (int cc = 0; cc < V; cc += VC) {
          __m512 acc[R][VC];
#pragma GCC unroll 8
          for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
            for (int c = 0; c < VC; ++c)
              acc[i][c] = i < rn ? _mm512_loadu_ps(buf.acc.data() + jq[i] * D + 16 * (cc + c)) : _mm512_setzero_ps();
          for (int64_t t = sa; t < sb; ++t) {
            const uint16_t* v = reinterpret_cast<const uint16_t*>(rows.value(t)) + h * D + 16 * cc;
            __m512 vf[VC];
#pragma GCC unroll 8
            for (int c = 0; c < VC; ++c)
              vf[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
                  _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c))), 16));
#pragma GCC unroll 8
            for (int i = 0; i < R; ++i) {
              if (i < rn) {
                const __m512 w = _mm512_set1_ps(buf.scores[jq[i] * span + (t - t0)]);
#pragma GCC unroll 8
                for (int c = 0; c < VC; ++c) acc[i][c] = _mm512_fmadd_ps(w, vf[c], acc[i][c]);
              }
            }
          }
          for (int i = 0; i < rn; ++i)
#pragma GCC unroll 8
            for (int c = 0; c < VC; ++c) _mm512_storeu_ps(buf.acc.data() + jq[i] * D + 16 * (cc + c), acc[i][c]);
        }
      }
    }
  }
  for (int64_t jq = 0; jq < nq; ++jq) {
    const int64_t r = jq / nqh, j = jq % nqh;
    narrow(buf.acc.data() + jq * D, out + (r * sh.hq + a + j) * D, D, buf.inv[jq]);
  }
}
#endif

}  // namespace cinq_decode
