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
// Each K/V row is loaded (and converted to float32) once for all the query heads that read it. Two passes over
// the context: scores (and their max), then exp / sum and the weighted sum of V; scores live in a small
// per-thread buffer. Accumulation is in float32.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "small_m.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline float to_float(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline void load_row(const T* src, float* dst, int64_t d) {
  for (int64_t i = 0; i < d; ++i) dst[i] = to_float(src[i]);
}

// Whether query row r sees the key rel positions after the first new row (rel < 0: the cached context). Causal
// among the new rows; with a tree mask (this sequence's [ql, ql], row-major), only the rows it marks. With a
// sliding window (> 0) only keys within window - 1 positions before the row (Gemma 3's local layers).
inline bool visible(int64_t rel, int64_t r, int64_t ql, const bool* tree, int64_t window) {
  if (window > 0 && rel <= r - window) return false;
  if (rel < 0) return true;
  return rel <= r && (tree == nullptr || tree[r * ql + rel]);
}

// scores[j] <- exp(scores[j] - mx[j]) in place for each of the nq rows of len; returns 1 / row sum.
inline std::vector<float> exp_rows(float* scores, const float* mx, int64_t nq, int64_t len) {
  std::vector<float> inv(nq);
  for (int64_t j = 0; j < nq; ++j) {
    float* sj = scores + j * len;
    float total = 0.f;
    for (int64_t t = 0; t < len; ++t) {
      sj[t] = std::exp(sj[t] - mx[j]);
      total += sj[t];
    }
    inv[j] = 1.f / total;
  }
  return inv;
}

// Threads for a decode call reading kv_bytes of K/V: torch's count, or 1 when waking a sleeping worker would cost
// more than it saves (short contexts at small batch; small_m.h's threshold, measured for the weight streams).
inline int64_t decode_threads(const int32_t* seq_lens, int64_t nd, int64_t row, int64_t elem) {
  int64_t tokens = 0;
  for (int64_t s = 0; s < nd; ++s) tokens += seq_lens[s];
  return tokens * row * 2 * elem < cinq_small_m::kMinParallelBytes ? 1 : at::get_num_threads();
}

template <typename T>
void decode_kernel(const float* q, const T* cache, const int32_t* tables, const int32_t* seq_lens, const bool* tree,
                   int64_t tree_stride, float* out, int64_t nd, int64_t ql, int64_t hq, int64_t hkv, int64_t d,
                   int64_t block_size, int64_t max_blocks, int64_t value_offset, float scale,
                   int64_t window) {
  const int64_t group = hq / hkv;
  const int64_t row = hkv * d;  // one token's K (or V) for all kv heads: contiguous in the page
  const int64_t block_stride = block_size * row;
  // Work item = (sequence, chunk of kv heads). Whole sequences when there are enough of them (a token's K/V row
  // for all heads is contiguous); heads split so that batch-1 decode still uses every thread.
  const int64_t threads = decode_threads(seq_lens, nd, row, sizeof(T));
  const int64_t chunks = nd >= threads ? 1 : std::min<int64_t>(hkv, (threads + nd - 1) / nd);
  const int64_t per_chunk = (hkv + chunks - 1) / chunks;
  at::parallel_for(0, nd * chunks, threads == 1 ? nd * chunks : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, buf(row), acc;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / chunks, h0 = (item % chunks) * per_chunk;
      const int64_t h1 = std::min(hkv, h0 + per_chunk), nh = h1 - h0;
      if (nh <= 0) continue;
      // Rows jr = r * nqh + j: query token r, head h0 * group + j (the query heads of kv heads h0..h1).
      const int64_t len = seq_lens[s], nqh = nh * group, nq = ql * nqh;
      // keys before the first row's window are never read: scores hold positions t0 .. len - 1 only
      const int64_t t0 = window > 0 ? std::max<int64_t>(0, len - ql - window + 1) : 0, span = len - t0;
      const int32_t* table = tables + s * max_blocks;
      const float* qs = q + (s * ql * hq + h0 * group) * d;
      const bool* ts = tree == nullptr ? nullptr : tree + s * tree_stride;
      scores.resize(nq * span);
      std::vector<float> mx(nq, -std::numeric_limits<float>::infinity());
      for (int64_t t = t0; t < len; ++t) {
        const T* kp = cache + table[t / block_size] * block_stride + (t % block_size) * row + h0 * d;
        load_row(kp, buf.data(), nh * d);
        for (int64_t jr = 0; jr < nq; ++jr) {
          const int64_t r = jr / nqh, j = jr % nqh;
          if (!visible(t - (len - ql), r, ql, ts, window)) {
            scores[jr * span + (t - t0)] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* qj = qs + (r * hq + j) * d;
          const float* kj = buf.data() + (j / group) * d;
          float dot = 0.f;
          for (int64_t i = 0; i < d; ++i) dot += qj[i] * kj[i];
          dot *= scale;
          scores[jr * span + (t - t0)] = dot;
          mx[jr] = dot > mx[jr] ? dot : mx[jr];
        }
      }
      const std::vector<float> inv = exp_rows(scores.data(), mx.data(), nq, span);
      acc.assign(nq * d, 0.f);
      for (int64_t t = t0; t < len; ++t) {
        const T* vp = cache + value_offset + table[t / block_size] * block_stride + (t % block_size) * row + h0 * d;
        load_row(vp, buf.data(), nh * d);
        for (int64_t jr = 0; jr < nq; ++jr) {
          const float w = scores[jr * span + (t - t0)];
          const float* vj = buf.data() + ((jr % nqh) / group) * d;
          float* aj = acc.data() + jr * d;
          for (int64_t i = 0; i < d; ++i) aj[i] += w * vj[i];
        }
      }
      for (int64_t jr = 0; jr < nq; ++jr) {
        float* o = out + ((s * ql + jr / nqh) * hq + h0 * group + jr % nqh) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = acc[jr * d + i] * inv[jr];
      }
    }
  });
}


#if defined(__AVX512BF16__)
// bf16 cache, head_dim a multiple of 32: q.k with vdpbf16ps straight on the bf16 rows (the query came in as bf16,
// so rounding it back is exact) and V rows widened 16 lanes at a time. Same two passes as the generic kernel.
void decode_kernel_bf16(const float* q, const c10::BFloat16* cache_t, const int32_t* tables, const int32_t* seq_lens,
                        const bool* tree, int64_t tree_stride, float* out, int64_t nd, int64_t ql, int64_t hq,
                        int64_t hkv, int64_t d, int64_t block_size, int64_t max_blocks, int64_t value_offset,
                        float scale, int64_t window) {
  const uint16_t* cache = reinterpret_cast<const uint16_t*>(cache_t);
  const int64_t group = hq / hkv;
  const int64_t row = hkv * d;
  const int64_t block_stride = block_size * row;
  const int64_t threads = decode_threads(seq_lens, nd, row, sizeof(uint16_t));
  const int64_t chunks = nd >= threads ? 1 : std::min<int64_t>(hkv, (threads + nd - 1) / nd);
  const int64_t per_chunk = (hkv + chunks - 1) / chunks;
  at::parallel_for(0, nd * chunks, threads == 1 ? nd * chunks : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;
    std::vector<uint16_t> qb;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / chunks, h0 = (item % chunks) * per_chunk;
      const int64_t h1 = std::min(hkv, h0 + per_chunk), nh = h1 - h0;
      if (nh <= 0) continue;
      const int64_t len = seq_lens[s], nqh = nh * group, nq = ql * nqh;  // rows as in decode_kernel
      const int64_t t0 = window > 0 ? std::max<int64_t>(0, len - ql - window + 1) : 0, span = len - t0;
      const int32_t* table = tables + s * max_blocks;
      const float* qs = q + (s * ql * hq + h0 * group) * d;
      const bool* ts = tree == nullptr ? nullptr : tree + s * tree_stride;
      qb.resize(nq * d);
      for (int64_t jr = 0; jr < nq; ++jr) {
        const float* src = qs + ((jr / nqh) * hq + jr % nqh) * d;
        for (int64_t i = 0; i < d; i += 16) {
          const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
          std::memcpy(qb.data() + jr * d + i, &h, 32);
        }
      }
      scores.resize(nq * span);
      std::vector<float> mx(nq, -std::numeric_limits<float>::infinity());
      for (int64_t t = t0; t < len; ++t) {
        const uint16_t* kp = cache + table[t / block_size] * block_stride + (t % block_size) * row + h0 * d;
        for (int64_t jr = 0; jr < nq; ++jr) {
          if (!visible(t - (len - ql), jr / nqh, ql, ts, window)) {
            scores[jr * span + (t - t0)] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const int64_t j = jr % nqh;
          const uint16_t* kj = kp + (j / group) * d;
          const uint16_t* qj = qb.data() + jr * d;
          __m512 a = _mm512_setzero_ps();
          for (int64_t i = 0; i < d; i += 32)
            a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(qj + i), (__m512bh)_mm512_loadu_si512(kj + i));
          const float dot = _mm512_reduce_add_ps(a) * scale;
          scores[jr * span + (t - t0)] = dot;
          mx[jr] = dot > mx[jr] ? dot : mx[jr];
        }
      }
      const std::vector<float> inv = exp_rows(scores.data(), mx.data(), nq, span);
      acc.assign(nq * d, 0.f);
      for (int64_t t = t0; t < len; ++t) {
        const uint16_t* vp = cache + value_offset + table[t / block_size] * block_stride
                             + (t % block_size) * row + h0 * d;
        for (int64_t hh = 0; hh < nh; ++hh) {
          for (int64_t i = 0; i < d; i += 16) {
            const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(vp + hh * d + i)));
            const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
            for (int64_t r = 0; r < ql; ++r) {
              for (int64_t g = 0; g < group; ++g) {
                const int64_t jr = r * nqh + hh * group + g;
                float* aj = acc.data() + jr * d + i;
                _mm512_storeu_ps(aj, _mm512_fmadd_ps(_mm512_set1_ps(scores[jr * span + (t - t0)]), v, _mm512_loadu_ps(aj)));
              }
            }
          }
        }
      }
      for (int64_t jr = 0; jr < nq; ++jr) {
        float* o = out + ((s * ql + jr / nqh) * hq + h0 * group + jr % nqh) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = acc[jr * d + i] * inv[jr];
      }
    }
  });
}
#endif

}  // namespace

// query [nd * ql, hq, d] float32 or bf16 (sequence s owns rows s * ql ...); kv_cache [2, num_blocks, block_size, hkv, d]
// (float32 / bf16 / fp16, contiguous); block_tables [>= nd, max_blocks] int32; seq_lens [>= nd] int32 (>= ql);
// tree_mask: empty (causal among the new rows), or contiguous bool [ql, ql] (shared by all sequences) or
// [nd, ql, ql] (one per sequence). Returns [nd * ql, hq, d] in the query's dtype (computed in float32; a bf16
// query and output convert here, in one call, rather than as two more ops per layer in Python).
// window: > 0 for a sliding-window layer (row at position p sees keys > p - window), 0 for none.
torch::Tensor paged_decode_window(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor block_tables,
                                  torch::Tensor seq_lens, double scale, int64_t ql, torch::Tensor tree_mask,
                                  int64_t window) {
  TORCH_CHECK(query_in.dim() == 3 && (query_in.scalar_type() == torch::kFloat32 ||
                                      query_in.scalar_type() == torch::kBFloat16),
              "paged_decode: query must be float32 or bf16 [nd * ql, hq, d]");
  const torch::Tensor query = query_in.to(torch::kFloat32).contiguous();
  TORCH_CHECK(ql >= 1 && query.size(0) % ql == 0, "paged_decode: query rows must be a multiple of ql >= 1");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "paged_decode: kv_cache must be contiguous [2, num_blocks, block_size, hkv, d]");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "paged_decode: block_tables must be contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(),
              "paged_decode: seq_lens must be contiguous int32");
  const int64_t nd = query.size(0) / ql, hq = query.size(1), d = query.size(2);
  const int64_t tdim = tree_mask.dim();
  TORCH_CHECK(tree_mask.numel() == 0 ||
                  (tree_mask.scalar_type() == torch::kBool && tree_mask.is_contiguous() && (tdim == 2 || tdim == 3) &&
                   (tdim == 2 || tree_mask.size(0) == nd) && tree_mask.size(tdim - 2) == ql &&
                   tree_mask.size(tdim - 1) == ql),
              "paged_decode: tree_mask must be empty or contiguous bool [ql, ql] or [nd, ql, ql]");
  const bool* tree = tree_mask.numel() ? tree_mask.data_ptr<bool>() : nullptr;
  const int64_t tree_stride = tdim == 3 ? ql * ql : 0;  // the shared mask: every sequence reads slice 0
  const int64_t block_size = kv_cache.size(2), hkv = kv_cache.size(3);
  TORCH_CHECK(kv_cache.size(4) == d && hq % hkv == 0, "paged_decode: head shapes do not match");
  auto out = torch::empty_like(query);
  const int64_t value_offset = kv_cache[0].numel();
  const int64_t max_blocks = block_tables.size(1);
  const float sc = static_cast<float>(scale);
  switch (kv_cache.scalar_type()) {
    case torch::kFloat32:
      decode_kernel(query.data_ptr<float>(), kv_cache.data_ptr<float>(), block_tables.data_ptr<int32_t>(),
                    seq_lens.data_ptr<int32_t>(), tree, tree_stride, out.data_ptr<float>(), nd, ql, hq, hkv, d,
                    block_size, max_blocks, value_offset, sc, window);
      break;
    case torch::kBFloat16:
#if defined(__AVX512BF16__)
      if (d % 32 == 0) {
        decode_kernel_bf16(query.data_ptr<float>(), kv_cache.data_ptr<c10::BFloat16>(),
                           block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), tree, tree_stride,
                           out.data_ptr<float>(), nd, ql, hq, hkv, d, block_size, max_blocks, value_offset, sc, window);
        break;
      }
#endif
      decode_kernel(query.data_ptr<float>(), kv_cache.data_ptr<c10::BFloat16>(), block_tables.data_ptr<int32_t>(),
                    seq_lens.data_ptr<int32_t>(), tree, tree_stride, out.data_ptr<float>(), nd, ql, hq, hkv, d,
                    block_size, max_blocks, value_offset, sc, window);
      break;
    case torch::kHalf:
      decode_kernel(query.data_ptr<float>(), kv_cache.data_ptr<c10::Half>(), block_tables.data_ptr<int32_t>(),
                    seq_lens.data_ptr<int32_t>(), tree, tree_stride, out.data_ptr<float>(), nd, ql, hq, hkv, d,
                    block_size, max_blocks, value_offset, sc, window);
      break;
    default:
      TORCH_CHECK(false, "paged_decode: unsupported kv_cache dtype");
  }
  return out.to(query_in.scalar_type());
}

torch::Tensor paged_decode(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor block_tables,
                           torch::Tensor seq_lens, double scale, int64_t ql, torch::Tensor tree_mask) {
  return paged_decode_window(query_in, kv_cache, block_tables, seq_lens, scale, ql, tree_mask, 0);
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.paged_decode(_window) in C++ (see small_m_gemm.cpp): one call per layer of a compiled decode step.
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  m.def("paged_decode(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int query_len, Tensor tree_mask) -> Tensor");
  m.def("paged_decode_window(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int query_len, Tensor tree_mask, int window) -> Tensor");
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
}
TORCH_LIBRARY_IMPL(cinq, Meta, m) {
  m.impl("paged_decode", [](const at::Tensor& q, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                            int64_t, const at::Tensor&) { return at::empty_like(q); });
  m.impl("paged_decode_window", [](const at::Tensor& q, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   double, int64_t, const at::Tensor&, int64_t) { return at::empty_like(q); });
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU)");
  m.def("paged_decode_window", &paged_decode_window, "paged decode attention (CPU), sliding window");
}
