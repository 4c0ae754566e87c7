// Decode attention over the virtual-contiguous KV cache (cinq/engine/kv_cache_virtual.py): sequence s's keys are
// kv_cache[0, slots[s], 0:seq_len] and its values kv_cache[1, slots[s], 0:seq_len], one contiguous run each, so
// the inner loops walk a pointer instead of looking up a block per token. Otherwise the same algorithm as
// paged_decode.cpp (kept separate so the two layouts can be measured side by side and changed independently):
// each K/V row is loaded and widened to float32 once for all the query heads of its kv head; two passes (scores
// and their max, then exp and the weighted sum of V); query row r of ql sees keys up to seq_len - ql + r.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "small_m.h"

namespace {

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline float widen(c10::Half x) { return static_cast<float>(x); }

template <typename T>
void contiguous_kernel(const float* q, const T* cache, const int32_t* slots, const int32_t* seq_lens, float* out,
                       int64_t nd, int64_t ql, int64_t hq, int64_t hkv, int64_t d, int64_t slot_stride,
                       int64_t value_offset, float scale) {
  const int64_t group = hq / hkv;
  const int64_t row = hkv * d;
  int64_t tokens = 0;
  for (int64_t s = 0; s < nd; ++s) tokens += seq_lens[s];
  // one thread when the whole read is too small to pay for waking the pool (small_m.h's threshold)
  const int64_t threads = tokens * row * 2 * int64_t(sizeof(T)) < cinq_small_m::kMinParallelBytes
                              ? 1 : at::get_num_threads();
  const int64_t chunks = nd >= threads ? 1 : std::min<int64_t>(hkv, (threads + nd - 1) / nd);
  const int64_t per_chunk = (hkv + chunks - 1) / chunks;
  at::parallel_for(0, nd * chunks, threads == 1 ? nd * chunks : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc, buf(row), mx;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / chunks, h0 = (item % chunks) * per_chunk;
      const int64_t nh = std::min(hkv, h0 + per_chunk) - h0;
      if (nh <= 0) continue;
      const int64_t len = seq_lens[s], nqh = nh * group, nq = ql * nqh;
      const T* keys = cache + slots[s] * slot_stride + h0 * d;  // token t at keys + t * row
      const T* values = keys + value_offset;
      const float* qs = q + (s * ql * hq + h0 * group) * d;
      scores.resize(nq * len);
      mx.assign(nq, -std::numeric_limits<float>::infinity());
      for (int64_t t = 0; t < len; ++t) {
        const T* kp = keys + t * row;
        for (int64_t i = 0; i < nh * d; ++i) buf[i] = widen(kp[i]);
        for (int64_t jr = 0; jr < nq; ++jr) {
          const int64_t r = jr / nqh, j = jr % nqh;
          if (t > len - ql + r) {  // a later new row: causal among the step's rows
            scores[jr * len + t] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* qj = qs + (r * hq + j) * d;
          const float* kj = buf.data() + (j / group) * d;
          float dot = 0.f;
          for (int64_t i = 0; i < d; ++i) dot += qj[i] * kj[i];
          dot *= scale;
          scores[jr * len + t] = dot;
          mx[jr] = std::max(mx[jr], dot);
        }
      }
      std::vector<float> inv(nq);
      for (int64_t jr = 0; jr < nq; ++jr) {
        float* sj = scores.data() + jr * len;
        float total = 0.f;
        for (int64_t t = 0; t < len; ++t) total += (sj[t] = std::exp(sj[t] - mx[jr]));
        inv[jr] = 1.f / total;
      }
      acc.assign(nq * d, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const T* vp = values + t * row;
        for (int64_t i = 0; i < nh * d; ++i) buf[i] = widen(vp[i]);
        for (int64_t jr = 0; jr < nq; ++jr) {
          const float w = scores[jr * len + t];
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

}  // namespace

// query [nd * ql, hq, d] float32 or bf16; kv_cache [2, num_slots, slot_tokens, hkv, d] contiguous (float32 / bf16 /
// fp16); slots, seq_lens [>= nd] int32 (seq_len <= slot_tokens, checked). Returns [nd * ql, hq, d] in the query's
// dtype, computed in float32.
torch::Tensor contiguous_decode(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor slots,
                                torch::Tensor seq_lens, double scale, int64_t ql) {
  TORCH_CHECK(query_in.dim() == 3 && (query_in.scalar_type() == torch::kFloat32 ||
                                      query_in.scalar_type() == torch::kBFloat16),
              "contiguous_decode: query must be float32 or bf16 [nd * ql, hq, d]");
  const torch::Tensor query = query_in.to(torch::kFloat32).contiguous();
  TORCH_CHECK(ql >= 1 && query.size(0) % ql == 0, "contiguous_decode: query rows must be a multiple of ql >= 1");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "contiguous_decode: kv_cache must be contiguous [2, num_slots, slot_tokens, hkv, d]");
  TORCH_CHECK(slots.scalar_type() == torch::kInt32 && slots.is_contiguous() &&
                  seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(),
              "contiguous_decode: slots and seq_lens must be contiguous int32");
  const int64_t nd = query.size(0) / ql, hq = query.size(1), d = query.size(2);
  const int64_t num_slots = kv_cache.size(1), slot_tokens = kv_cache.size(2), hkv = kv_cache.size(3);
  TORCH_CHECK(kv_cache.size(4) == d && hq % hkv == 0, "contiguous_decode: head shapes do not match");
  TORCH_CHECK(slots.numel() >= nd && seq_lens.numel() >= nd, "contiguous_decode: need a slot and length per sequence");
  const int32_t* sp = slots.data_ptr<int32_t>();
  const int32_t* lp = seq_lens.data_ptr<int32_t>();
  for (int64_t s = 0; s < nd; ++s) {  // the guard: never read outside the sequence's own range
    TORCH_CHECK(sp[s] >= 0 && sp[s] < num_slots && lp[s] >= ql && lp[s] <= slot_tokens, "contiguous_decode: sequence ",
                s, " has slot ", sp[s], " (of ", num_slots, ") and seq_len ", lp[s], " (need ", ql, "..", slot_tokens, ")");
  }
  auto out = torch::empty_like(query);
  const int64_t slot_stride = slot_tokens * hkv * d, value_offset = kv_cache[0].numel();
  const float sc = static_cast<float>(scale);
  switch (kv_cache.scalar_type()) {
    case torch::kFloat32:
      contiguous_kernel(query.data_ptr<float>(), kv_cache.data_ptr<float>(), sp, lp, out.data_ptr<float>(), nd, ql,
                        hq, hkv, d, slot_stride, value_offset, sc);
      break;
    case torch::kBFloat16:
      contiguous_kernel(query.data_ptr<float>(), kv_cache.data_ptr<c10::BFloat16>(), sp, lp, out.data_ptr<float>(),
                        nd, ql, hq, hkv, d, slot_stride, value_offset, sc);
      break;
    case torch::kHalf:
      contiguous_kernel(query.data_ptr<float>(), kv_cache.data_ptr<c10::Half>(), sp, lp, out.data_ptr<float>(), nd,
                        ql, hq, hkv, d, slot_stride, value_offset, sc);
      break;
    default:
      TORCH_CHECK(false, "contiguous_decode: kv_cache dtype must be float32, bf16 or fp16");
  }
  return query_in.scalar_type() == torch::kFloat32 ? out : out.to(query_in.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("contiguous_decode", &contiguous_decode, "decode attention over the virtual-contiguous KV cache (CPU)");
}
