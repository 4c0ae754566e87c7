// Decode attention over the virtual-contiguous KV cache (cinq/engine/kv_cache_virtual.py): sequence s's keys are
// kv_cache[0, slots[s], 0:seq_len] and its values kv_cache[1, slots[s], 0:seq_len], one contiguous run each, so
// the row locator walks a pointer instead of looking up a block per token. The attention itself is
// decode_attention.h's, the one paged_decode.cpp runs too (query row r of ql sees keys up to seq_len - ql + r).
#include <torch/extension.h>

#include <cstdint>

#include "decode_attention.h"

namespace {

// Token t's K (or V) row of all kv heads: one contiguous run per sequence.
template <typename T>
struct SlotRows {
  const T* keys;
  int64_t row, value_offset;
  const T* key(int64_t t) const { return keys + t * row; }
  const T* value(int64_t t) const { return keys + value_offset + t * row; }
  int64_t run(int64_t) const { return INT64_MAX; }  // tokens from t whose rows follow each other: all of them
};

}  // namespace

// query [nd * ql, hq, d] float32 or bf16; kv_cache [2, num_slots, slot_tokens, hkv, d] contiguous (float32 / bf16 /
// fp16); slots, seq_lens [>= nd] int32 (seq_len <= slot_tokens, checked). Returns [nd * ql, hq, d] in the query's
// dtype, computed in float32.
torch::Tensor contiguous_decode(torch::Tensor query_in, torch::Tensor kv_cache, torch::Tensor slots,
                                torch::Tensor seq_lens, double scale, int64_t ql) {
  TORCH_CHECK(query_in.dim() == 3 && (query_in.scalar_type() == torch::kFloat32 ||
                                      query_in.scalar_type() == torch::kBFloat16),
              "contiguous_decode: query must be float32 or bf16 [nd * ql, hq, d]");
  const torch::Tensor query = query_in.contiguous();
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
  const cinq_decode::Shape sh{ql, hq, hkv, d, hq * d, static_cast<float>(scale), 0};
  const int64_t row = hkv * d, slot_stride = slot_tokens * row;
  const int64_t value_offset = kv_cache.numel() / 2;  // kv_cache[1], without a select op per call
  cinq_decode::dispatch_types(kv_cache.scalar_type(), query.scalar_type(), "contiguous_decode", [&](auto c, auto qz) {
    using T = decltype(c);
    using Q = decltype(qz);
    const T* cache = reinterpret_cast<const T*>(kv_cache.data_ptr());
    cinq_decode::attend_all<T>(reinterpret_cast<const Q*>(query.data_ptr()), reinterpret_cast<Q*>(out.data_ptr()), lp,
                               nd, nullptr, 0, sh, [&](int64_t s) {
      return SlotRows<T>{cache + sp[s] * slot_stride, row, value_offset};
    });
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("contiguous_decode", &contiguous_decode, "decode attention over the virtual-contiguous KV cache (CPU)");
}
