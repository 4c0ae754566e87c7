// A Llama-family decoder stack's decode step in one call: every layer's norms, projections, rotary, KV write,
// paged attention and gated MLP, run from C++ through the same registered kernels (torch.ops.cinq.*) and ATen ops
// the Python layers call, in the same order on the same tensors, so the result is bit-identical to the eager path.
//
// Why: at batch 1 a SmolLM2-sized step spends as much time in Python between kernels as in the kernels (~14
// Python-level calls per layer at 5-15 us each on this 2-core CPU, 30 layers). Here a layer costs the kernels plus
// one dispatcher hop per op (well under a microsecond). The program is built once per model (the layers' kernel
// tensors and KV caches held by reference) and run per step; anything it does not cover (prefill rows, other
// linears, sliding windows, ...) stays on the Python path (cinq/model/decode_layers.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "decode_linear.h"
#include "team.h"

namespace {

using cinq_team::Team;
using namespace cinq_decode;

// K/V bytes a layer's attention reads (all sequences) from which its sequences are split across the team (a part
// costs a dispatcher call, ~1-2 us). Settable for tests.
int64_t min_attention_split_bytes = 16 << 10;
constexpr int kMaxTeam = 8;
#if defined(__AVX512BF16__)
constexpr bool kBf16Attention = true;  // decode_attention.h's bf16_path: bf16 cache and query, head_dim 64/128/256
#else
constexpr bool kBf16Attention = false;
#endif

struct Layer {
  at::Tensor in_norm, post_norm, kv_cache;
  Linear qkv, o, gate_up, down;
  at::Tensor q_norm, k_norm;  // Qwen3's per-head norms of q and k before the rotary (empty: none)
};

// (hidden, residual) after the last layer, and each layer's input when asked for.
using Result = std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>>;

// The attention ops' C++ signatures (as decode_linear.h's for the linears).
using PagedSeqs = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, int64_t,
                       const at::Tensor&, const at::Tensor&, int64_t, int64_t);
using VarlenSeqs = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                        const at::Tensor&, const at::Tensor&, int64_t, int64_t);

// A step's query rows per sequence: `ql` each, or ragged (`starts`: int32 [nd + 1] row offsets, non-empty).
struct Rows {
  int64_t ql;
  const at::Tensor& starts;
  bool ragged() const { return starts.numel() > 0; }
};

class DecodeLayers {
 public:
  DecodeLayers(int64_t hq, int64_t hkv, int64_t head_dim, int64_t intermediate, double eps, double scale)
      : hq_(hq), hkv_(hkv), d_(head_dim), inter_(intermediate), eps_(eps), scale_(scale),
        rms_norm_(op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        double)>("cinq::rms_norm")),
        rms_norm_scaled_(op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                               const at::Tensor&, double)>("cinq::rms_norm_scaled")),
        rotary_(op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cinq::rotary_")),
        write_kv_(
            op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cinq::write_kv")),
        paged_decode_(op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                    int64_t, const at::Tensor&)>("cinq::paged_decode")),
        paged_window_(op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                    int64_t, const at::Tensor&, int64_t)>("cinq::paged_decode_window")),
        paged_seqs_(op<PagedSeqs>("cinq::paged_decode_seqs")),
        paged_heads_(op<PagedSeqs>("cinq::paged_decode_heads")),
        paged_varlen_(op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                    const at::Tensor&)>("cinq::paged_decode_varlen")),
        varlen_seqs_(op<VarlenSeqs>("cinq::paged_decode_varlen_seqs")) {}

  void set_dense_chunk_rows(int64_t rows) { linears_.set_dense_chunk_rows(rows); }

  // One layer, in model order; a linear is (kind, tensors, ints) as decode_linear.h's Linear.
  // q_norm / k_norm: a Qwen3 layer's per-head norm weights [head_dim] (empty tensors: none).
  void add_layer(at::Tensor in_norm, at::Tensor post_norm, at::Tensor kv_cache, const Linear& qkv, const Linear& o,
                 const Linear& gate_up, const Linear& down, at::Tensor q_norm, at::Tensor k_norm) {
    for (const Linear* l : {&qkv, &o, &gate_up, &down}) Linears::check(*l);
    TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(3) == hkv_ && kv_cache.size(4) == d_,
                "decode_layers: kv_cache must be [2, blocks, block_size, ", hkv_, ", ", d_, "]");
    TORCH_CHECK(q_norm.numel() == k_norm.numel() && (q_norm.numel() == 0 || q_norm.numel() == d_),
                "decode_layers: q / k norms must both be [", d_, "] or both empty");
    layers_.push_back(Layer{in_norm, post_norm, kv_cache, qkv, o, gate_up, down, q_norm, k_norm});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t split_calls() const { return linears_.split_calls(); }
  int64_t split_attention_calls() const { return split_attention_calls_.load(); }

  // hidden [M, H] bf16 (the embeddings), residual [M, H] or empty (none yet); the step's rotary table, positions
  // [M], slot mapping [M], block tables [nd, max_blocks] int32, seq lens [nd] int32, query rows per sequence and
  // tree mask (empty: causal among a sequence's new rows), or, when rows are ragged (requests verifying different
  // numbers of drafts), query_start_loc int32 [nd + 1] (empty: ql rows each). Returns (hidden, residual) after the
  // last layer and the inputs of the layers `capture` names (ascending indices; empty: none). `prenormed`: `hidden`
  // is the first layer's normed input already, of the width its qkv projection takes, and `residual` its residual
  // (an EAGLE-3 head's layer attends over [normed embedding, normed feature], 2H wide, with the feature as the
  // residual); its in_norm is not used.
  Result run(at::Tensor hidden, at::Tensor residual, const at::Tensor& positions, const at::Tensor& cos_sin,
             const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t ql,
             const at::Tensor& tree, const std::vector<int64_t>& capture, const at::Tensor& query_start_loc,
             bool prenormed) {
    TORCH_CHECK(!prenormed || (capture.empty() && residual.dim() == 2 && residual.size(0) == hidden.size(0)),
                "decode_layers: a prenormed input needs its residual [M, H] and no capture");
    for (size_t i = 0; i < capture.size(); ++i)
      TORCH_CHECK(capture[i] >= 0 && capture[i] < num_layers() && (i == 0 || capture[i] > capture[i - 1]),
                  "decode_layers: capture must name ascending layers below ", num_layers());
    const Rows rows{ql, query_start_loc};
    return in_team([&](Team* team) {
      return run_layers(hidden, residual, positions, cos_sin, slot_mapping, block_tables, seq_lens, rows, tree,
                        capture, prenormed, team);
    });
  }

  // A Gemma 3 layer: add_layer's in_norm and post_norm are its input and post-attention norms' float32 scales
  // (1 + w); `gemma` holds the rest. `group`: which of run_gemma's slot mappings and block tables its KV uses (its
  // KV cache group); `window`: its sliding window (0: none).
  void add_gemma_layer(at::Tensor in_scale, at::Tensor post_attn_scale, at::Tensor pre_ff_scale,
                       at::Tensor post_ff_scale, at::Tensor q_scale, at::Tensor k_scale, at::Tensor kv_cache,
                       at::Tensor cos_sin, int64_t window, int64_t group, const Linear& qkv, const Linear& o,
                       const Linear& gate_up, const Linear& down) {
    TORCH_CHECK(gemma_.size() == layers_.size(), "decode_layers: a stack is all Gemma layers or none");
    for (const at::Tensor* t : {&in_scale, &post_attn_scale, &pre_ff_scale, &post_ff_scale, &q_scale, &k_scale})
      TORCH_CHECK(t->scalar_type() == at::kFloat, "decode_layers: a Gemma norm's scale must be float32");
    TORCH_CHECK(window >= 0 && group >= 0, "decode_layers: window and group must be >= 0");
    add_layer(in_scale, post_attn_scale, kv_cache, qkv, o, gate_up, down, empty_, empty_);
    gemma_.push_back(GemmaParts{q_scale, k_scale, pre_ff_scale, post_ff_scale, cos_sin, window, group});
  }

  // A Gemma 3 stack's decode step, ql rows per sequence (no tree, no ragged rows): hidden [M, H] (the scaled
  // embeddings) -> the residual stream after the last layer. slot_mappings / block_tables: one per KV cache group.
  at::Tensor run_gemma(at::Tensor hidden, const at::Tensor& positions, const std::vector<at::Tensor>& slot_mappings,
                       const std::vector<at::Tensor>& block_tables, const at::Tensor& seq_lens, int64_t ql) {
    TORCH_CHECK(!layers_.empty() && gemma_.size() == layers_.size(), "decode_layers: run_gemma needs Gemma layers");
    TORCH_CHECK(slot_mappings.size() == block_tables.size(), "decode_layers: a slot mapping per block table");
    for (const GemmaParts& g : gemma_)
      TORCH_CHECK(g.group < static_cast<int64_t>(block_tables.size()), "decode_layers: no tables for KV group ",
                  g.group);
    return in_team([&](Team* team) {
      return run_gemma_layers(hidden, positions, slot_mappings, block_tables, seq_lens, ql, team);
    });
  }

 private:
  struct GemmaParts {
    at::Tensor q_scale, k_scale, pre_ff, post_ff, cos_sin;
    int64_t window, group;
  };

  // layers(team) inside one OpenMP region of the step's threads (thread 0 runs it, the others serve the team), or
  // layers(nullptr) on one thread.
  template <typename F>
  auto in_team(F&& layers) -> decltype(layers(nullptr)) {
    const int threads = std::min<int>(at::get_num_threads(), kMaxTeam);
    if (threads <= 1 || at::in_parallel_region()) return layers(nullptr);
    Team team(threads);
    decltype(layers(nullptr)) out;
    std::exception_ptr error;
    const bool inference = c10::InferenceMode::is_enabled(), grad = at::GradMode::is_enabled();
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) {
        try {
          out = layers(&team);
        } catch (...) {
          error = std::current_exception();
        }
        team.stop();
      } else {
        c10::InferenceMode inference_mode(inference);  // the caller's modes: thread-local state
        at::AutoGradMode grad_mode(grad);
        team.work();
      }
    }
    if (error) std::rethrow_exception(error);
    return out;
  }

  // cinq/model/gemma3.py's Gemma3DecoderLayer, op for op: sandwich norms (each Gemma's float32-scaled norm), q/k
  // norms, the layer's rope table, its KV group's slots and tables, a window or not, GeGLU.
  at::Tensor run_gemma_layers(at::Tensor hidden, const at::Tensor& positions,
                              const std::vector<at::Tensor>& slot_mappings, const std::vector<at::Tensor>& block_tables,
                              const at::Tensor& seq_lens, int64_t ql, Team* team) {
    const int64_t m = hidden.size(0), q_size = hq_ * d_, kv_size = hkv_ * d_;
    auto norm = [&](const at::Tensor& x, const at::Tensor& scale) {
      return std::get<0>(rms_norm_scaled_.call(x, empty_, scale, eps_));
    };
    int64_t cached = 0;  // as run_layers: a layer's attention is split by sequences from this many K/V bytes
    for (int64_t s = 0; s < seq_lens.size(0); ++s) cached += seq_lens.data_ptr<int32_t>()[s];
    const bool split = team != nullptr && m / ql > 1 &&
                       cached * kv_size * 2 * layers_.front().kv_cache.element_size() >= min_attention_split_bytes;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      const GemmaParts& g = gemma_[i];
      const at::Tensor qkv = linear(layer.qkv, norm(hidden, layer.in_norm), team);
      const at::Tensor q = norm(qkv.narrow(1, 0, q_size).view({m, hq_, d_}), g.q_scale);
      const at::Tensor k = norm(qkv.narrow(1, q_size, kv_size).view({m, hkv_, d_}), g.k_scale);
      const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({m, hkv_, d_});
      rotary_.call(q, k, positions, g.cos_sin);
      write_kv_.call(k, v, layer.kv_cache, slot_mappings[g.group]);
      const at::Tensor o = gemma_attention(q, layer.kv_cache, block_tables[g.group], seq_lens, ql, g.window,
                                           split ? team : nullptr);
      hidden = hidden + norm(linear(layer.o, o.view({m, q_size}), team), layer.post_norm);
      const at::Tensor gu = linear(layer.gate_up, norm(hidden, g.pre_ff), team);
      const at::Tensor act = at::gelu(gu.narrow(1, 0, inter_), "tanh") * gu.narrow(1, inter_, inter_);
      hidden = hidden + norm(linear(layer.down, act, team), g.post_ff);
    }
    return hidden;
  }

  // A Gemma layer's decode attention (its window, or none); with a team, whole sequences in one range per thread,
  // each range's call on its rows, tables and lengths (every sequence is computed alone either way).
  at::Tensor gemma_attention(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& tables,
                             const at::Tensor& seq_lens, int64_t ql, int64_t window, Team* team) const {
    auto call = [&](const at::Tensor& qq, const at::Tensor& tt, const at::Tensor& ll) {
      return window > 0 ? paged_window_.call(qq, kv_cache, tt, ll, scale_, ql, no_tree_, window)
                        : paged_decode_.call(qq, kv_cache, tt, ll, scale_, ql, no_tree_);
    };
    const int64_t nd = q.size(0) / ql;
    if (team == nullptr) return call(q, tables, seq_lens);
    const int parts = static_cast<int>(std::min<int64_t>(team->size(), nd));
    std::vector<at::Tensor> outs(parts);
    split_attention_calls_.fetch_add(1, std::memory_order_relaxed);
    team->run(parts, [&](int p) {
      const int64_t b = nd * p / parts, e = nd * (p + 1) / parts;
      outs[p] = call(q.narrow(0, b * ql, (e - b) * ql), tables.narrow(0, b, e - b), seq_lens.narrow(0, b, e - b));
    });
    return at::cat(outs, 0);
  }

  Result run_layers(at::Tensor hidden, at::Tensor residual, const at::Tensor& positions, const at::Tensor& cos_sin,
                    const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                    const Rows& rows, const at::Tensor& tree, const std::vector<int64_t>& capture, bool prenormed,
                    Team* team) {
    const int64_t m = hidden.size(0), q_size = hq_ * d_, kv_size = hkv_ * d_;
    int64_t cached = 0;  // tokens every layer's attention reads, over all sequences
    for (int64_t s = 0; s < seq_lens.size(0); ++s) cached += seq_lens.data_ptr<int32_t>()[s];
    // Sequences split across the team; fewer sequences than threads (batch 1): their query heads, any range where
    // attention reads the bf16 pages in place, whole kv heads on the widening path (AVX2: each part widens its own
    // heads' K/V). An earlier note measured the widening split no faster (SmolLM2's 3 kv heads at a context of
    // 1024, 2 + 1 heads, on the Zen 4). On an AVX2 Zen 3 with the workers spinning, a kv-head split ran 1.64-1.69x
    // per call at a context of 2,000 (ad hoc), and a step 1.05x / 1.18x at prompts 128 / 1,024 (SmolLM2's file, 2
    // threads, split vs whole in one process: benchmarks/results/thread_scaling_smollm2.md, 2026-12-07).
    const int64_t nd = rows.ragged() ? rows.starts.numel() - 1 : m / rows.ql;
    const bool big = team != nullptr && cached * kv_size * 2 * layers_.front().kv_cache.element_size() >=
                                            min_attention_split_bytes;
    const bool split_heads = big && nd < team->size() && !rows.ragged() && (bf16_heads() || hkv_ > 1);
    const bool split_attention = big && !split_heads && nd > 1;
    std::vector<at::Tensor> states;
    size_t next_capture = 0;
    for (Layer& layer : layers_) {
      // the named layers' inputs, as the Python stack's output_hidden_states (EAGLE-3's features): only those,
      // since each is an add and a copy of the step's rows
      if (next_capture < capture.size() && capture[next_capture] == &layer - layers_.data()) {
        states.push_back(residual.numel() == 0 ? hidden : hidden + residual);
        ++next_capture;
      }
      at::Tensor h;
      if (prenormed && &layer == &layers_.front()) {
        h = hidden;
      } else if (residual.numel() == 0) {  // the first layer: the embeddings are the residual
        residual = hidden;
        h = std::get<0>(rms_norm_.call(hidden, empty_, layer.in_norm, eps_));
      } else {
        std::tie(h, residual) = rms_norm_.call(hidden, residual, layer.in_norm, eps_);
      }
      const at::Tensor qkv = linear(layer.qkv, h, team);
      at::Tensor q = qkv.narrow(1, 0, q_size).view({m, hq_, d_});
      at::Tensor k = qkv.narrow(1, q_size, kv_size).view({m, hkv_, d_});
      const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({m, hkv_, d_});
      if (layer.q_norm.numel()) {  // as LlamaAttention: each head's q and k normed, then rotated
        q = std::get<0>(rms_norm_.call(q, empty_, layer.q_norm, eps_));
        k = std::get<0>(rms_norm_.call(k, empty_, layer.k_norm, eps_));
      }
      rotary_.call(q, k, positions, cos_sin);
      write_kv_.call(k, v, layer.kv_cache, slot_mapping);
      const at::Tensor o =
          split_attention || split_heads
              ? attention(q, layer.kv_cache, block_tables, seq_lens, rows, split_heads ? 0 : nd, tree, *team)
          : rows.ragged() ? paged_varlen_.call(q, layer.kv_cache, block_tables, seq_lens, scale_, rows.starts)
                          : paged_decode_.call(q, layer.kv_cache, block_tables, seq_lens, scale_, rows.ql, tree);
      const at::Tensor attn = linear(layer.o, o.view({m, q_size}), team);
      std::tie(h, residual) = rms_norm_.call(attn, residual, layer.post_norm, eps_);
      const at::Tensor gu = linear(layer.gate_up, h, team);
      hidden = linear(layer.down, at::silu(gu.narrow(1, 0, inter_)) * gu.narrow(1, inter_, inter_), team);
    }
    return {hidden, residual, states};
  }

  // paged_decode with the sequences cut into one contiguous range per thread (whole sequences: each reads its pages
  // front to back, every kv head at once, as the whole call does), or with nd = 0 every sequence's query heads.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                       const at::Tensor& seq_lens, const Rows& rows, int64_t nd, const at::Tensor& tree,
                       Team& team) const {
    // nd = 0: query heads in units of one head (bf16 path) or of a kv head's group (widening path)
    const int64_t unit = nd > 0 || bf16_heads() ? 1 : hq_ / hkv_, items = nd > 0 ? nd : hq_ / unit;
    const int parts = static_cast<int>(std::min<int64_t>(team.size(), items));
    at::Tensor out = at::empty({q.size(0), hq_, d_}, q.options());
    split_attention_calls_.fetch_add(1, std::memory_order_relaxed);
    team.run(parts, [&](int p) {
      const int64_t begin = unit * (items * p / parts), end = unit * (items * (p + 1) / parts);
      if (nd == 0)
        paged_heads_.call(q, kv_cache, block_tables, seq_lens, scale_, rows.ql, tree, out, begin, end);
      else if (rows.ragged())
        varlen_seqs_.call(q, kv_cache, block_tables, seq_lens, scale_, rows.starts, out, begin, end);
      else
        paged_seqs_.call(q, kv_cache, block_tables, seq_lens, scale_, rows.ql, tree, out, begin, end);
    });
    return out;
  }

  at::Tensor linear(const Linear& l, const at::Tensor& x, Team* team) const { return linears_.run(l, x, team); }
  // whether a sequence's query heads split at any head (attention reads the bf16 pages: decode_attention.h's
  // bf16_path for the step's bf16 cache and query), else at whole kv heads
  bool bf16_heads() const { return kBf16Attention && (d_ == 64 || d_ == 128 || d_ == 256); }

  int64_t hq_, hkv_, d_, inter_;
  Linears linears_;
  double eps_, scale_;
  at::Tensor empty_ = at::empty({0}, at::kBFloat16);
  at::Tensor no_tree_ = at::empty({0}, at::kBool);
  std::vector<Layer> layers_;
  std::vector<GemmaParts> gemma_;  // a Gemma 3 stack's per-layer parts (add_gemma_layer), else empty
  mutable std::atomic<int64_t> split_attention_calls_{0};  // attentions run split across a team
  c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&, double)> rms_norm_, rms_norm_scaled_;
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)> rotary_,
      write_kv_;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      double, int64_t, const at::Tensor&)> paged_decode_;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      double, int64_t, const at::Tensor&, int64_t)> paged_window_;
  c10::TypedOperatorHandle<PagedSeqs> paged_seqs_, paged_heads_;
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      double, const at::Tensor&)> paged_varlen_;
  c10::TypedOperatorHandle<VarlenSeqs> varlen_seqs_;
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
      .def("add_gemma_layer", &DecodeLayers::add_gemma_layer)
      .def("run_gemma", &DecodeLayers::run_gemma, py::arg("hidden"), py::arg("positions"), py::arg("slot_mappings"),
           py::arg("block_tables"), py::arg("seq_lens"), py::arg("ql"))
      .def("set_dense_chunk_rows", &DecodeLayers::set_dense_chunk_rows)
      .def("num_layers", &DecodeLayers::num_layers)
      .def("split_calls", &DecodeLayers::split_calls)
      .def("split_attention_calls", &DecodeLayers::split_attention_calls)
      .def("run", &DecodeLayers::run, py::arg("hidden"), py::arg("residual"), py::arg("positions"), py::arg("cos_sin"),
           py::arg("slot_mapping"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("ql"), py::arg("tree"),
           py::arg("capture"), py::arg("query_start_loc"), py::arg("prenormed") = false);
  m.attr("DENSE") = static_cast<int64_t>(kDense);
  m.attr("INT4_I8") = static_cast<int64_t>(kInt4I8);
  m.attr("INT8_I8") = static_cast<int64_t>(kInt8I8);
  m.attr("INT4_AFFINE") = static_cast<int64_t>(kInt4Affine);
  m.attr("INT8_GROUPED") = static_cast<int64_t>(kInt8Grouped);
  m.def("set_min_split_bytes", [](int64_t bytes) { min_split_bytes = bytes; }, py::arg("bytes"));
  m.def("min_split_bytes", [] { return min_split_bytes; });
  m.def("set_min_attention_split_bytes", [](int64_t bytes) { min_attention_split_bytes = bytes; }, py::arg("bytes"));
  m.def("min_attention_split_bytes", [] { return min_attention_split_bytes; });
  m.def("set_write_parts_in_place", [](bool on) { write_parts_in_place = on; }, py::arg("on"));
  m.def("has_fast_path", [] { return true; });
}
