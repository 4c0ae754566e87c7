// Shared by the decode-sized (1-8 activation rows) linear kernels: how a call is split over the cores, and the
// AVX2 and AVX512 pieces (horizontal sums, activations quantized to int16) they build on.
//
// Why one split for all: at decode a linear is a stream over its weights, and a stream runs at memory speed only
// when every core reads long contiguous runs of it. The output rows are therefore cut into a few contiguous ranges
// per thread (torch's own pool and thread count, so nothing oversubscribes it), each range read front to back and
// claimed by whichever thread is free, so a worker still waking up does not hold the call; a small weight runs on
// the calling thread alone, where waking a sleeping worker (OMP_WAIT_POLICY=PASSIVE) would cost more than it saves.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if defined(CINQ_REGISTER_OPS)
#include <torch/library.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CINQ_SMALL_M_AVX2 1
#endif

namespace cinq_small_m {

// What a decode-sized linear's module answers to has_fast_path(): false without AVX2 + FMA, where its portable loop
// is slower than PyTorch's and cinq_native does not use the module.
#if defined(CINQ_SMALL_M_AVX2)
constexpr bool kFastPath = true;
#else
constexpr bool kFastPath = false;
#endif

// The Meta kernel of a linear op taking x [M, K] and a weight of N rows first (then anything): y [M, N] bf16, what
// torch.compile's fake tensors see.
template <typename... Rest>
at::Tensor meta_linear(at::Tensor x, at::Tensor weight, Rest...) {
  return at::empty({x.size(0), weight.size(0)}, x.options().dtype(at::kBFloat16));
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.<name> from `schema` ("name(...) -> Tensor") with its CPU kernel and meta_linear as its Meta
// kernel, in a TORCH_LIBRARY_FRAGMENT(cinq, m): what torch.compile'd code calls without Python. (By value, as the
// CPU kernels take their arguments: a dispatcher op's kernels must share one C++ signature.)
template <typename... Rest>
void def_linear_op(torch::Library& m, const char* schema, at::Tensor (*cpu)(at::Tensor, at::Tensor, Rest...)) {
  const std::string text(schema);
  const std::string name = text.substr(0, text.find('('));
  m.def(schema);
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CPU, cpu));
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Meta, &meta_linear<Rest...>));
}
#endif

// Weight bytes below which one thread does the whole call. One parallel region with OMP_WAIT_POLICY=PASSIVE costs
// ~11 us on a 2-core Zen 3 (benchmarks/decode_kernels.py measures it), and a second thread saves half of the
// stream's time: it pays from bytes / (2 * per-core bandwidth ~20-26 GB/s) > 11 us, i.e. ~450-570 KB.
constexpr int64_t kMinParallelBytes = 512 << 10;

// Ranges a parallel call is cut into per thread, claimed in turn: a sleeping worker (OMP_WAIT_POLICY=PASSIVE) took
// ~0.4 ms to wake on this VM after a 1 ms gap, and with one fixed range per thread the call waited for it (the
// SmolLM2 LM head at 2 threads: 1.2 ms after a gap, 0.78 ms back to back); with claimed ranges the threads that are
// awake take the late one's share.
constexpr int64_t kPartsPerThread = 4;

// f(n0, n1) over [0, N) in contiguous ranges, boundaries on multiples of `align` outputs: one range on the calling
// thread for a small call, else kPartsPerThread ranges per thread, each claimed by whichever thread is free next.
// `bytes` is the call's whole weight stream (to decide whether a second thread pays).
template <typename F>
void split_outputs(int64_t N, int64_t align, int64_t bytes, const F& f) {
  const int64_t blocks = (N + align - 1) / align;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), blocks);
  if (threads <= 1 || bytes < kMinParallelBytes || at::in_parallel_region()) {
    f(0, N);
    return;
  }
  const int64_t parts = std::min<int64_t>(blocks, threads * kPartsPerThread);
  std::atomic<int64_t> next{0};
  // grain 1 over `threads` items: at::parallel_for starts exactly `threads` threads, one item each
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t p = next.fetch_add(1, std::memory_order_relaxed); p < parts;
         p = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t b0 = blocks * p / parts, b1 = blocks * (p + 1) / parts;
      if (b0 < b1) f(b0 * align, std::min(N, b1 * align));
    }
  });
}

#if defined(CINQ_SMALL_M_AVX2)

// Bytes ahead of the read position that a weight stream asks for. The hardware prefetcher alone reached ~75% of the
// read bandwidth on Zen 3 (it stops at every 4 KB page and restarts late); one software prefetch per 64-byte line,
// 512 bytes ahead, ~90% (measured 256 B - 4 KB: 512 B was among the best, and shorter distances lose the most).
constexpr int64_t kPrefetchBytes = 512;

inline void prefetch_ahead(const void* p, int64_t bytes = kPrefetchBytes) {
  _mm_prefetch(static_cast<const char*>(p) + bytes, _MM_HINT_T0);
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

#endif

#if defined(__AVX512F__)
// r[t] = sum of the 16 lanes of a[t], for t < 16, in about 3 shuffle/add steps per input (vs ~8 for one
// _mm512_reduce_add_ps each). Pairs of inputs interleave into one vector, halving the vector count per level,
// first within 128-bit lanes, then across them; the result comes out in input order.
__attribute__((always_inline)) inline __m512 sum_lanes16(const __m512 (&a)[16]) {
  __m512 g[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {  // g[q]: 128-bit lane l, element i = partial sum of a[4q + i] over its lane l
    const __m512* p = a + 4 * q;
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(p[0], p[1]), _mm512_unpackhi_ps(p[0], p[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(p[2], p[3]), _mm512_unpackhi_ps(p[2], p[3]));
    g[q] = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
  }
  // h01: lanes [g0 (l0+l1), g0 (l2+l3), g1 (l0+l1), g1 (l2+l3)]; the last step leaves lane q = all of g[q]
  const __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(g[2], g[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(g[2], g[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(h01, h23, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// Activation rows quantized to int16 in blocks of `block` channels: q[m, k] = round(x[m, k] / s[m, b]) with
// s = max |x| over the block / 32767. Why int16: `vpmaddwd` multiplies 16 pairs of int16 per instruction, so the
// integer weight codes need only a widening, no conversion to float, and the error (2^-16 of the block's largest
// |x|) stays far below the bf16 rounding the activations already carry (2^-9 of each value).
// xsum[m, b] = s[m, b] * sum of q over the block: the quantized block's sum, for the affine (min) term.
inline void quantize_rows_int16(const uint16_t* x, int64_t M, int64_t K, int64_t block, int16_t* q, float* s,
                                float* xsum) {
  const int64_t B = K / block;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < B; ++b) {
      const uint16_t* xb = x + m * K + b * block;
      int16_t* qb = q + m * K + b * block;
      float amax = 0.f;
      for (int64_t i = 0; i < block; ++i) {
        uint32_t bits = static_cast<uint32_t>(xb[i] & 0x7fffu) << 16;
        float a;
        __builtin_memcpy(&a, &bits, sizeof(a));
        amax = std::max(amax, a);
      }
      const float scale = amax / 32767.f;
      const float inv = amax > 0.f ? 32767.f / amax : 0.f;
      int32_t total = 0;
      for (int64_t i = 0; i < block; ++i) {
        uint32_t bits = static_cast<uint32_t>(xb[i]) << 16;
        float v;
        __builtin_memcpy(&v, &bits, sizeof(v));
        const int32_t r = static_cast<int32_t>(std::nearbyint(v * inv));
        const int32_t c = std::max<int32_t>(-32767, std::min<int32_t>(32767, r));
        qb[i] = static_cast<int16_t>(c);
        total += c;
      }
      s[m * B + b] = scale;
      xsum[m * B + b] = scale * static_cast<float>(total);
    }
  }
}

}  // namespace cinq_small_m
