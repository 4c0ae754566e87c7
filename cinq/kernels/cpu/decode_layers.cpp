// A Llama-family decoder stack's decode step in one call: every layer's norms, projections, rotary, KV write,
// paged attention and gated MLP, run from C++ through the same registered kernels (torch.ops.cinq.*) and ATen ops
// the Python layers call, in the same order on the same tensors, so the result is bit-identical to the eager path.
//
// Why: at batch 1 a SmolLM2-sized step spends as much time in Python between kernels as in the kernels (~14
// Python-level calls per layer at 5-15 us each on this 2-core CPU, 30 layers). Here a layer costs the kernels plus
// one dispatcher hop per op (well under a microsecond). The program is built once per model (the layers' kernel
// tensors and KV caches held by reference) and run per step; anything it does not cover (prefill rows, other
// linears, hidden-state capture, sliding windows, ...) stays on the Python path (cinq/model/decode_program.py).
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace {

// A linear's kernel: which registered op, its tensors after x, and its integer arguments.
enum Kind : int64_t { kDense = 0, kInt4I8 = 1, kInt8I8 = 2, kInt4Affine = 3, kInt8Grouped = 4 };

struct Linear {
  int64_t kind;
  std::vector<at::Tensor> t;  // dense: weight, bias (may be empty); int: codes, scales, mins (may be empty)
  std::vector<int64_t> ints;  // int kinds: group (, q_offset for kInt4I8)
};

struct Layer {
  at::Tensor in_norm, post_norm, kv_cache;
  Linear qkv, o, gate_up, down;
};

// The C++ signatures the ops were registered with (small_m.h's def_linear_op takes its tensors by value; the
// others' kernels are lambdas over const references): a typed handle must name them exactly.
using IntLinear6 = at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t);
using IntLinear5 = at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t);

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

class DecodeLayers {
 public:
  DecodeLayers(int64_t hq, int64_t hkv, int64_t head_dim, int64_t intermediate, double eps, double scale)
      : hq_(hq), hkv_(hkv), d_(head_dim), inter_(intermediate), eps_(eps), scale_(scale),
        rms_norm_(op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        double)>("cinq::rms_norm")),
        rotary_(op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cinq::rotary_")),
        write_kv_(
            op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cinq::write_kv")),
        paged_decode_(op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                    int64_t, const at::Tensor&)>("cinq::paged_decode")),
        dense_(op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cinq::small_m_linear")),
        int4_i8_(op<IntLinear6>("cinq::int4_affine_linear_i8")),
        int8_i8_(op<IntLinear5>("cinq::int8_grouped_linear_i8")),
        int4_(op<IntLinear5>("cinq::int4_affine_linear")),
        int8_(op<IntLinear5>("cinq::int8_grouped_linear")) {}

  // One layer, in model order. A linear is (kind, tensors, ints) as the Linear struct above.
  void add_layer(at::Tensor in_norm, at::Tensor post_norm, at::Tensor kv_cache, const Linear& qkv, const Linear& o,
                 const Linear& gate_up, const Linear& down) {
    for (const Linear* l : {&qkv, &o, &gate_up, &down}) check(*l);
    TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(3) == hkv_ && kv_cache.size(4) == d_,
                "decode_layers: kv_cache must be [2, blocks, block_size, ", hkv_, ", ", d_, "]");
    layers_.push_back(Layer{in_norm, post_norm, kv_cache, qkv, o, gate_up, down});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // hidden [M, H] bf16 (the embeddings), residual [M, H] or empty (none yet); the step's rotary table, positions
  // [M], slot mapping [M], block tables [nd, max_blocks] int32, seq lens [nd] int32, query rows per sequence and
  // tree mask (empty: causal among a sequence's new rows). Returns (hidden, residual) after the last layer.
  std::tuple<at::Tensor, at::Tensor> run(at::Tensor hidden, at::Tensor residual, const at::Tensor& positions,
                                         const at::Tensor& cos_sin, const at::Tensor& slot_mapping,
                                         const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t ql,
                                         const at::Tensor& tree) {
    const int64_t m = hidden.size(0), q_size = hq_ * d_, kv_size = hkv_ * d_;
    for (Layer& layer : layers_) {
      at::Tensor h;
      if (residual.numel() == 0) {  // the first layer: the embeddings are the residual
        residual = hidden;
        h = std::get<0>(rms_norm_.call(hidden, empty_, layer.in_norm, eps_));
      } else {
        std::tie(h, residual) = rms_norm_.call(hidden, residual, layer.in_norm, eps_);
      }
      const at::Tensor qkv = linear(layer.qkv, h);
      at::Tensor q = qkv.narrow(1, 0, q_size).view({m, hq_, d_});
      at::Tensor k = qkv.narrow(1, q_size, kv_size).view({m, hkv_, d_});
      const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({m, hkv_, d_});
      rotary_.call(q, k, positions, cos_sin);
      write_kv_.call(k, v, layer.kv_cache, slot_mapping);
      const at::Tensor o = paged_decode_.call(q, layer.kv_cache, block_tables, seq_lens, scale_, ql, tree);
      const at::Tensor attn = linear(layer.o, o.view({m, q_size}));
      std::tie(h, residual) = rms_norm_.call(attn, residual, layer.post_norm, eps_);
      const at::Tensor gu = linear(layer.gate_up, h);
      hidden = linear(layer.down, at::silu(gu.narrow(1, 0, inter_)) * gu.narrow(1, inter_, inter_));
    }
    return {hidden, residual};
  }

 private:
  void check(const Linear& l) const {
    const size_t tensors = l.kind == kDense ? 2 : 3, ints = l.kind == kDense ? 0 : (l.kind == kInt4I8 ? 2 : 1);
    TORCH_CHECK(l.kind >= kDense && l.kind <= kInt8Grouped && l.t.size() == tensors && l.ints.size() == ints,
                "decode_layers: linear of kind ", l.kind, " needs ", tensors, " tensors and ", ints, " ints");
  }

  at::Tensor linear(const Linear& l, const at::Tensor& x) {
    switch (l.kind) {
      case kDense: return dense_.call(x, l.t[0], l.t[1]);
      case kInt4I8: return int4_i8_.call(x, l.t[0], l.t[1], l.t[2], l.ints[0], l.ints[1]);
      case kInt8I8: return int8_i8_.call(x, l.t[0], l.t[1], l.t[2], l.ints[0]);
      case kInt4Affine: return int4_.call(x, l.t[0], l.t[1], l.t[2], l.ints[0]);
      default: return int8_.call(x, l.t[0], l.t[1], l.t[2], l.ints[0]);
    }
  }

  int64_t hq_, hkv_, d_, inter_;
  double eps_, scale_;
  at::Tensor empty_ = at::empty({0}, at::kBFloat16);
  std::vector<Layer> layers_;
  c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&, double)> rms_norm_;
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)> rotary_,
      write_kv_;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      double, int64_t, const at::Tensor&)> paged_decode_;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> dense_;
  c10::TypedOperatorHandle<IntLinear6> int4_i8_;
  c10::TypedOperatorHandle<IntLinear5> int8_i8_, int4_, int8_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Linear>(m, "Linear")
      .def(py::init<int64_t, std::vector<at::Tensor>, std::vector<int64_t>>(), py::arg("kind"), py::arg("tensors"),
           py::arg("ints"));
  py::class_<DecodeLayers>(m, "DecodeLayers")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, double, double>(), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("intermediate_size"), py::arg("eps"),
           py::arg("scale"))
      .def("add_layer", &DecodeLayers::add_layer)
      .def("num_layers", &DecodeLayers::num_layers)
      .def("run", &DecodeLayers::run);
  m.attr("DENSE") = static_cast<int64_t>(kDense);
  m.attr("INT4_I8") = static_cast<int64_t>(kInt4I8);
  m.attr("INT8_I8") = static_cast<int64_t>(kInt8I8);
  m.attr("INT4_AFFINE") = static_cast<int64_t>(kInt4Affine);
  m.attr("INT8_GROUPED") = static_cast<int64_t>(kInt8Grouped);
  m.def("has_fast_path", [] { return true; });
}
