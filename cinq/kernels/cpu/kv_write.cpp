// Store one step's new K and V rows into the paged KV cache at their flat slots, on the CPU: one call instead of
// the seven ATen ops (view, two selects, two casts, two index_copy_) of the PyTorch path, which at batch 1 cost
// far more than copying a few hundred bytes per layer.
//
// key / value [T, Hkv, D] may be strided views (the split of the merged qkv projection's output) as long as each
// token's Hkv * D values are contiguous; they must already have the cache's dtype (the caller falls back to the
// PyTorch path otherwise). kv_cache [2, num_blocks, block_size, Hkv, D] contiguous; slot_mapping [T] int64.
#include <torch/extension.h>

#include <cstdint>
#include <cstring>

void write_kv(torch::Tensor key, torch::Tensor value, torch::Tensor kv_cache, torch::Tensor slot_mapping) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "write_kv: kv_cache must be contiguous [2, num_blocks, block_size, hkv, d]");
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes() && key.size(1) == kv_cache.size(3) &&
                  key.size(2) == kv_cache.size(4), "write_kv: key / value must be [T, hkv, d] like the cache");
  TORCH_CHECK(key.scalar_type() == kv_cache.scalar_type() && value.scalar_type() == kv_cache.scalar_type(),
              "write_kv: key / value must have the cache's dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && slot_mapping.dim() == 1 &&
                  slot_mapping.size(0) == key.size(0), "write_kv: slot_mapping must be int64 [T]");
  const int64_t row = key.size(1) * key.size(2);  // elements of one token's K (or V)
  for (const auto* t : {&key, &value}) {
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2), "write_kv: a token's heads must be contiguous");
  }
  const int64_t tokens = key.size(0), num_slots = kv_cache.size(1) * kv_cache.size(2);
  const int64_t elem = kv_cache.element_size(), bytes = row * elem;
  const auto slots = slot_mapping.contiguous();
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto* cache = static_cast<char*>(kv_cache.data_ptr());
  char* values = cache + num_slots * bytes;  // kv_cache[1]
  const auto* kp = static_cast<const char*>(key.data_ptr());
  const auto* vp = static_cast<const char*>(value.data_ptr());
  const int64_t ks = key.stride(0) * elem, vs = value.stride(0) * elem;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t s = sp[t];
    TORCH_CHECK(s >= 0 && s < num_slots, "write_kv: slot ", s, " outside the cache (", num_slots, " slots)");
    std::memcpy(cache + s * bytes, kp + t * ks, bytes);
    std::memcpy(values + s * bytes, vp + t * vs, bytes);
  }
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.write_kv in C++ (see small_m_gemm.cpp); the cache is declared mutated, so a compiled graph keeps
// the write before the attention that reads it.
TORCH_LIBRARY_FRAGMENT(cinq, m) {
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
}
TORCH_LIBRARY_IMPL(cinq, CPU, m) {
  m.impl("write_kv", [](const at::Tensor& k, const at::Tensor& v, const at::Tensor& cache, const at::Tensor& s) {
    write_kv(k, v, cache, s);
  });
}
TORCH_LIBRARY_IMPL(cinq, Meta, m) {
  m.impl("write_kv", [](const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {});
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("write_kv", &write_kv, "store new K/V rows into the paged cache at their slots (CPU)");
}
