// y[M, N] = x[M, K] @ w[N, K]^T (+ bias) for a handful of rows M (1-32), bf16 in and out, float32 accumulation.
//
// Why: decoding a few sequences, or verifying a few speculative drafts of one, multiplies a few activation rows by
// every weight matrix, so the step is a stream over the weights and should run at memory bandwidth whatever M is.
// PyTorch's bf16 path (oneDNN) reaches a fraction of it on such skinny shapes.
//
// Two paths. AMX (where the CPU has it and Linux grants it), from 2 rows: one tile product per 16 weight rows x
// 32 k, the weight tile loaded straight from w and the activations packed once per call; it does 16 x M x 32
// multiply-adds per instruction, so M up to 16 costs what one row does and the weight stream bounds it.
// AVX512-BF16 vector tiles otherwise (and for 1 row, and the last N % 16 outputs): NB weight rows x MB activation
// rows with NB * MB <= 16, the NB weight rows read one after another (one stream per core); each weight vector
// is loaded once for all MB rows, and each of the tile's 16
// accumulators (16 float partial sums of one output) collects all of K before one transpose-add tree reduces
// the 16 together into one vector of outputs. (The previous kernel reduced each output on its own, ~8 shuffle/add
// steps after a dozen `vdpbf16ps` for K = 384, one output at a time: 1.2-1.4x slower wherever compute bounds it.)
// Past ~2 rows `vdpbf16ps` throughput, M dot products per weight vector, bounds the vector path, not memory.
// AVX2 + FMA without AVX512-BF16 (e.g. AMD Zen 3): the weights widen to float32 for free (a bf16 is the top half
// of a float32: a 32-bit lane of w holds weights 2j and 2j + 1, `w << 16` is the first as a float, `w & 0xffff0000`
// the second), against activations converted once per call and split into even and odd channels to match; each
// thread reads its range of weight rows front to back, one row at a time, prefetching ahead (small_m.h). Other CPUs get a
// plain float loop.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <numeric>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "bf16.h"
#include "small_m.h"

namespace {

constexpr int kMaxRows = 32;
// The most rows one pass of the vector tiles takes (their accumulators fill the 32 vector registers at 8). A call
// of more runs them in passes of 8 over each small block of outputs: the first pass reads the block from memory,
// the others read it again from cache. The weight streams from memory once, where calls of 8 rows each (the
// engine's chunks before) read it once per call; and a row's result is what a call of <= 8 rows gives it.
constexpr int kPassRows = 8;
// Weight bytes below which one thread does the whole call: waking a sleeping (OMP_WAIT_POLICY=PASSIVE) worker
// costs more than it saves on a weight this small.
constexpr int64_t kMinParallelBytes = 256 << 10;
// Rows from which the AMX path runs. One row streams from L3 at the same speed on both paths, but the two paths
// round differently: with one path for every M, a row's result does not depend on how many rows share the call,
// so a sequence decodes the same tokens alone, beside others, or as a speculative verify of k + 1 rows.
constexpr int64_t kAmxMinRows = 1;
// Without AMX, the most rows the engine sends to the vector tiles (with AMX: kMaxRows): all of them. On a Zen 4
// (AVX512-BF16, no AMX), over SmolLM2's decode linears from memory, 8 rows in one call took 23.9 ms against
// oneDNN's 39.4 on 1 thread and 21.0 against 26.8 on 2 (its 6-row cut-off, from an AMX CPU's comparison with
// oneDNN's AMX kernels, sent batch-8 decoding to oneDNN and off the fused step: 3x slower per step than batch 4).
// Past 8 rows, in passes (2 threads, the same weights): 9 rows 15.9 ms against oneDNN's 27.6, 16 rows 21.5 against
// 32.6 (and against 25.4 / 29.7 as two calls of 8 and the rest), 24 rows 1.5x, 32 rows 1.09x oneDNN; from 48 rows
// oneDNN's blocked GEMM is faster (0.95x, 64 rows 0.82x): kMaxRows stops at 32.
// On AVX2 (Zen 3) oneDNN's bf16 path widens on the fly, 2-4x slower at 1-8 rows.
constexpr int kVectorFastRows = kMaxRows;

using cinq_bf16::bf16_to_float;

// Output rows per tile for MB activation rows: the most that keeps the tile's accumulators within one reduction.
template <int MB>
constexpr int tile_rows() { return 16 / MB; }

// Bytes ahead of the read position that the vector tiles prefetch (their stream is one row after another). On a
// Zen 4, over SmolLM2's decode linears from memory, 0 to 512 bytes read within ~10% of each other; 128 was among
// the best at 1-5 rows.
constexpr int64_t kTilePrefetchBytes = 128;
// And a second prefetch per line, far ahead and into L2 only. From 2 rows a tile computes for longer than the memory
// takes to deliver its lines, and with the near prefetch alone the stream's latency stayed exposed: compute and
// memory time added up (8 rows: 24.6 ms over a SmolLM2 step's weights from memory, against 13.8 ms with them in
// cache and 11.9 ms for 1 row). 4-32 KB ahead into L2 ran 1.3-1.45x faster at 4-8 rows and ~1.1x at 1 row on a Zen 4
// (1 thread, weights cycled from memory); 1 KB gained little. Into L2, where 8 KB of lines in flight do not crowd
// the activations out of L1. Past a weight's end it asks for lines nobody reads: a prefetch never faults. (The same
// extra prefetch in the integer kernels, which already ask 4 KB ahead into L1, cost them up to 14%, and moving
// theirs 8 KB ahead into L2 up to 24%: they keep theirs.)
constexpr int64_t kTileFarPrefetchBytes = 8192;

#if defined(__AVX512BF16__)

inline void prefetch_tile_line(const uint16_t* p) {
  cinq_small_m::prefetch_ahead(p, kTilePrefetchBytes);
  _mm_prefetch(reinterpret_cast<const char*>(p) + kTileFarPrefetchBytes, _MM_HINT_T1);
}

// Lane t of a tile's result vector holds output t % NB of its row: the bias index of each lane.
template <int NB>
struct LaneOutput {
  alignas(64) int32_t j[16];
  constexpr LaneOutput() : j() {
    for (int t = 0; t < 16; ++t) j[t] = t % NB;
  }
};
template <int NB>
constexpr LaneOutput<NB> kLaneOutput{};

// Outputs n0 .. n0 + NB - 1 (those below N) of all MB rows. Accumulator t = m * NB + j holds row m, output n0 + j.
template <int MB>
void tile_avx512(const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t K, int64_t N,
                 int64_t n0) {
  constexpr int NB = tile_rows<MB>();
  const int nvalid = static_cast<int>(std::min<int64_t>(NB, N - n0));
  const uint16_t* wr[NB];
  for (int j = 0; j < NB; ++j) wr[j] = w + std::min<int64_t>(n0 + j, N - 1) * K;  // past N: a row, ignored
  // Row after row, not all NB rows at each k: the tile's rows are contiguous in w, so the core reads one stream
  // front to back (NB interleaved streams, the previous order, read 0.7-0.95x as fast from memory on a Zen 4).
  // Each row's sum runs on two chains (even and odd 32-channel steps) so that one row's dot products do not wait
  // on each other's latency.
  __m512 acc[16];
  const __mmask32 tail = _cvtu32_mask32(K % 32 ? (1u << (K % 32)) - 1 : 0);
  const int64_t k32 = K / 32 * 32;
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) {
    const uint16_t* r = wr[j];
    __m512 s0[MB], s1[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) s0[m] = s1[m] = _mm512_setzero_ps();
    auto dot = [&](__m512 (&s)[MB], int64_t k, __m512bh b, bool masked) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        const __m512bh a = (__m512bh)(masked ? _mm512_maskz_loadu_epi16(tail, x + m * K + k)
                                             : _mm512_loadu_si512(x + m * K + k));
        s[m] = _mm512_dpbf16_ps(s[m], a, b);
      }
    };
    int64_t k = 0;
    for (; k + 64 <= k32; k += 64) {
      prefetch_tile_line(r + k);
      prefetch_tile_line(r + k + 32);
      dot(s0, k, (__m512bh)_mm512_loadu_si512(r + k), false);
      dot(s1, k + 32, (__m512bh)_mm512_loadu_si512(r + k + 32), false);
    }
    if (k < k32) {
      prefetch_tile_line(r + k);
      dot(s0, k, (__m512bh)_mm512_loadu_si512(r + k), false);
      k += 32;
    }
    if (k < K) dot(s1, k, (__m512bh)_mm512_maskz_loadu_epi16(tail, r + k), true);  // zeros past K add nothing
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) acc[m * NB + j] = _mm512_add_ps(s0[m], s1[m]);
  }
#pragma GCC unroll 16
  for (int t = MB * NB; t < 16; ++t) acc[t] = _mm512_setzero_ps();  // MB * NB < 16 for MB = 3, 5, 6, 7
  __m512 r = cinq_small_m::sum_lanes16(acc);
  if (bias) {  // lane m * NB + j wants bias[n0 + j]
    const __m512 b = _mm512_maskz_loadu_ps(_cvtu32_mask16((1u << nvalid) - 1), bias + n0);
    r = _mm512_add_ps(r, _mm512_permutexvar_ps(_mm512_load_si512(kLaneOutput<NB>.j), b));
  }
  alignas(32) uint16_t out[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(r));
  for (int m = 0; m < MB; ++m) {
    if (nvalid == NB)
      std::memcpy(y + m * N + n0, out + m * NB, NB * sizeof(uint16_t));
    else
      std::memcpy(y + m * N + n0, out + m * NB, nvalid * sizeof(uint16_t));
  }
}

#endif  // __AVX512BF16__

#if defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define CINQ_SMALL_M_AMX 1

// Linux gives a process AMX's tile state only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM); until then the
// first tile instruction raises SIGILL. Asked once; a refusal (old kernel, hypervisor) means: AVX512-BF16 only.
bool amx_ready() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t
  uint8_t rows[16] = {};
};

// Tile registers (literal numbers in the calls: GCC's _tile_* macros paste them into the instruction text).
// tmm0: C, tmm1: W, tmm2: X.
// C[16 outputs][M rows] (float) += W[16 weight rows][32 k] . X[16 k pairs][M rows][2]: one weight block in one
// tile load straight from w (stride K), the activations packed once per call in the pair layout AMX wants.
void amx_configure(int M) {
  TileConfig cfg;
  cfg.rows[0] = 16;
  cfg.colsb[0] = static_cast<uint16_t>(M * 4);
  cfg.rows[1] = 16;
  cfg.colsb[1] = 64;
  cfg.rows[2] = 16;
  cfg.colsb[2] = static_cast<uint16_t>(M * 4);
  _tile_loadconfig(&cfg);
}

// xp[k / 2][m][k % 2] = x[m][k], zero from K up to K rounded up to 32: the x rows' bf16 pairs (one 32-bit word
// each) transposed, MB words per pair index; the pair loop outside, so every x row is read in order.
template <int MB>
std::vector<uint16_t> amx_pack_x(const uint16_t* x, int64_t K) {
  const int64_t padded = (K + 31) / 32 * 32;
  std::vector<uint16_t> xp(static_cast<size_t>(padded * MB), 0);
  uint16_t* out = xp.data();
  for (int64_t kp = 0; kp < K / 2; ++kp, out += 2 * MB)
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) std::memcpy(out + 2 * m, x + m * K + 2 * kp, 2 * sizeof(uint16_t));
  if (K & 1)
    for (int m = 0; m < MB; ++m) out[2 * m] = x[m * K + K - 1];
  return xp;
}

// Output blocks [b0, b1) (outputs 16 b ... 16 b + 15, all below N) of all M rows.
void amx_blocks(const uint16_t* xp, const uint16_t* w, const float* bias, uint16_t* y, int M, int64_t K,
                int64_t N, int64_t b0, int64_t b1) {
  amx_configure(M);
  alignas(64) float c[16 * kMaxRows];
  alignas(64) uint16_t tail[16 * 32];
  const int64_t kfull = K / 32 * 32;
  const __m512i c_row = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(M));  // c[i][m] for i = lane, at i * M + m
  for (int64_t b = b0; b < b1; ++b) {
    const uint16_t* wb = w + b * 16 * K;
    const bool prefetch = b + 1 < b1;  // the next block, row by row at the same k: a stream the core asks for
    _tile_zero(0);
    for (int64_t k = 0; k < kfull; k += 32) {
      if (prefetch)
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(wb + (16 + i) * K + k), _MM_HINT_T0);
      _tile_loadd(1, wb + k, K * 2);
      _tile_loadd(2, xp + k * M, M * 4);
      _tile_dpbf16ps(0, 1, 2);
    }
    if (kfull < K) {  // the last k < 32 from a zero-padded copy: a tile load must not read past a row (or w)
      std::memset(tail, 0, sizeof(tail));
      for (int i = 0; i < 16; ++i) std::memcpy(tail + i * 32, wb + i * K + kfull, (K - kfull) * sizeof(uint16_t));
      _tile_loadd(1, tail, 64);
      _tile_loadd(2, xp + kfull * M, M * 4);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, c, M * 4);
    const __m512 bv = bias ? _mm512_loadu_ps(bias + b * 16) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) {
      const __m512 v = _mm512_add_ps(_mm512_i32gather_ps(c_row, c + m, 4), bv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * N + b * 16), (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
  _tile_release();  // back to the init state: a context switch then saves no tile data
}

#endif  // CINQ_SMALL_M_AMX

#if defined(CINQ_SMALL_M_AVX2) && !defined(__AVX512BF16__)
#define CINQ_SMALL_M_AVX2_PATH 1

// x [MB, K] -> xp [MB, K16] float32 (K16 = K rounded down to 16): per 16 channels, the 8 even ones then the 8 odd.
std::vector<float> avx2_pack_x(const uint16_t* x, int64_t M, int64_t K) {
  const int64_t K16 = K / 16 * 16;
  std::vector<float> xp(static_cast<size_t>(M * K16));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K16; k += 16)
      for (int i = 0; i < 8; ++i) {
        xp[m * K16 + k + i] = bf16_to_float(x[m * K + k + 2 * i]);
        xp[m * K16 + k + 8 + i] = bf16_to_float(x[m * K + k + 2 * i + 1]);
      }
  return xp;
}

// Outputs n .. n + R - 1 of all MB rows; A accumulators per (row, output) (two where few chains would otherwise
// wait on the FMA latency).
template <int MB, int R, int A>
void avx2_rows(const float* xp, const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t K,
               int64_t N, int64_t n) {
  const int64_t K16 = K / 16 * 16;
  const __m256i odd = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  __m256 acc[A][R][MB] = {};
  for (int64_t k = 0; k < K16; k += 16) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint16_t* wk = w + (n + r) * K + k;
      if ((k & 31) == 0) cinq_small_m::prefetch_ahead(wk);
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(wv, odd));
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        acc[0][r][m] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xp + m * K16 + k), acc[0][r][m]);
        acc[A - 1][r][m] = _mm256_fmadd_ps(wo, _mm256_loadu_ps(xp + m * K16 + k + 8), acc[A - 1][r][m]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      float v = cinq_small_m::hsum(A == 2 ? _mm256_add_ps(acc[0][r][m], acc[A - 1][r][m]) : acc[0][r][m]);
      for (int64_t k = K16; k < K; ++k) v += bf16_to_float(x[m * K + k]) * bf16_to_float(w[(n + r) * K + k]);
      if (bias) v += bias[n + r];
      y[m * N + n + r] = cinq_bf16::float_to_bf16(v);
    }
}

template <int MB>
void avx2_range(const float* xp, const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t K,
                int64_t N, int64_t n0, int64_t n1) {
  // One weight row at a time: a single stream per core (two or four interleaved rows measured 10-40% slower from
  // memory on Zen 3). Two accumulator chains per output: with one, each 16-channel step waits on two dependent FMAs
  // (8 cycles) and fewer than 8 outputs cannot fill the two FMA pipes (3 rows ran 1.7x slower than 2). Every row
  // keeps its two chains whatever the row count, so its result does not depend on how many rows share the call: past
  // 4 rows (two chains each for 5+ rows spilled, 6 rows 1.4x slower) the rows run in passes of 4 over each weight
  // row, the second reading it from L1. One chain from 5 rows had made a row's sum differ from its sum alone
  // (a 5-row verify or batch decoded other tokens than one row on AVX2; found on a Zen 3, 2026-12-07).
  for (int64_t n = n0; n < n1; ++n) {
    if constexpr (MB <= 4) {
      avx2_rows<MB, 1, 2>(xp, x, w, bias, y, K, N, n);
    } else {
      const int64_t K16 = K / 16 * 16;
      avx2_rows<4, 1, 2>(xp, x, w, bias, y, K, N, n);
      avx2_rows<MB - 4, 1, 2>(xp + 4 * K16, x + 4 * K, w, bias, y + 4 * N, K, N, n);
    }
  }
}

template <int MB>
void run_avx2(const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t K, int64_t N) {
  const std::vector<float> xp = avx2_pack_x(x, MB, K);
  auto* yp = reinterpret_cast<uint16_t*>(y);
  cinq_small_m::split_outputs(N, 4, N * K * static_cast<int64_t>(sizeof(uint16_t)), [&](int64_t n0, int64_t n1) {
    avx2_range<MB>(xp.data(), x, w, bias, yp, K, N, n0, n1);
  });
}

#endif  // CINQ_SMALL_M_AVX2 without AVX512-BF16

#if defined(__AVX512BF16__)
// Outputs [n0, n1) of the MB rows of x and y (pointers at a pass's first row).
template <int MB>
void pass_tiles(const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t K, int64_t N,
                int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += tile_rows<MB>()) tile_avx512<MB>(x, w, bias, y, K, N, n);
}

// Outputs per block of a call of more than kPassRows rows: whole tiles for every pass, the last one of `rest` rows.
inline int64_t pass_block(int64_t rest) {
  return rest ? std::lcm<int64_t>(tile_rows<kPassRows>(), 16 / rest) : tile_rows<kPassRows>();
}

// Blocks [b0, b1) of pass_block() outputs of M > kPassRows rows: per block, the rows in passes of kPassRows (the
// last of the rest), each pass over the same outputs; the first reads the block from memory, the others from cache.
void multi_pass_blocks(const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t M, int64_t K,
                       int64_t N, int64_t b0, int64_t b1) {
  const int64_t full = M / kPassRows, rest = M % kPassRows, L = pass_block(rest);
  const uint16_t* xr = x + full * kPassRows * K;
  uint16_t* yr = y + full * kPassRows * N;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = b * L, n1 = std::min<int64_t>(n0 + L, N);
    for (int64_t g = 0; g < full; ++g)
      pass_tiles<kPassRows>(x + g * kPassRows * K, w, bias, y + g * kPassRows * N, K, N, n0, n1);
    switch (rest) {
      case 1: pass_tiles<1>(xr, w, bias, yr, K, N, n0, n1); break;
      case 2: pass_tiles<2>(xr, w, bias, yr, K, N, n0, n1); break;
      case 3: pass_tiles<3>(xr, w, bias, yr, K, N, n0, n1); break;
      case 4: pass_tiles<4>(xr, w, bias, yr, K, N, n0, n1); break;
      case 5: pass_tiles<5>(xr, w, bias, yr, K, N, n0, n1); break;
      case 6: pass_tiles<6>(xr, w, bias, yr, K, N, n0, n1); break;
      case 7: pass_tiles<7>(xr, w, bias, yr, K, N, n0, n1); break;
      default: break;
    }
  }
}
#endif

// Tiles [t0, t1) of tile_rows<MB>() outputs each, outputs from n_begin on.
template <int MB>
void tiles(const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t K, int64_t N,
           int64_t n_begin, int64_t t0, int64_t t1) {
  constexpr int NB = tile_rows<MB>();
#if defined(__AVX512BF16__)
  for (int64_t t = t0; t < t1; ++t)
    tile_avx512<MB>(x, w, bias, reinterpret_cast<uint16_t*>(y), K, N, n_begin + t * NB);
#else
  for (int64_t n = n_begin + t0 * NB; n < std::min(n_begin + t1 * NB, N); ++n) {
    const uint16_t* wr = w + n * K;
    float sums[MB] = {};
    for (int64_t k = 0; k < K; ++k) {
      const float wk = bf16_to_float(wr[k]);
      for (int m = 0; m < MB; ++m) sums[m] += bf16_to_float(x[m * K + k]) * wk;
    }
    for (int m = 0; m < MB; ++m) y[m * N + n] = c10::BFloat16(sums[m] + (bias ? bias[n] : 0.f));
  }
#endif
}

// parallel_for over [0, count) units of unit_bytes of weight each, on one thread below kMinParallelBytes.
template <typename F>
void split(int64_t count, int64_t unit_bytes, const F& f) {
  if (count * unit_bytes < kMinParallelBytes) {
    f(0, count);
    return;
  }
  // Grain: half of kMinParallelBytes per chunk at least, so no thread is woken for a sliver.
  at::parallel_for(0, count, std::max<int64_t>(1, kMinParallelBytes / 2 / unit_bytes), f);
}

template <int MB>
void run(const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t K, int64_t N,
         bool amx) {
#if defined(CINQ_SMALL_M_AVX2_PATH)
  run_avx2<MB>(x, w, bias, y, K, N);
  return;
#endif
  constexpr int NB = tile_rows<MB>();
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(uint16_t));
  int64_t n_begin = 0;  // the vector path's first output
#if defined(CINQ_SMALL_M_AMX)
  if (amx && N >= 16) {
    const std::vector<uint16_t> xp = amx_pack_x<MB>(x, K);
    auto* yp = reinterpret_cast<uint16_t*>(y);
    split(N / 16, 16 * row_bytes,
          [&](int64_t b0, int64_t b1) { amx_blocks(xp.data(), w, bias, yp, MB, K, N, b0, b1); });
    n_begin = N / 16 * 16;  // the last N % 16 outputs: vector tiles
  }
#endif
  split((N - n_begin + NB - 1) / NB, NB * row_bytes,
        [&](int64_t t0, int64_t t1) { tiles<MB>(x, w, bias, y, K, N, n_begin, t0, t1); });
}

// run<m> for 1 <= m <= kPassRows.
void run_rows(int64_t m, const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t K,
              int64_t N, bool amx) {
  switch (m) {
    case 1: run<1>(x, w, bias, y, K, N, amx); break;
    case 2: run<2>(x, w, bias, y, K, N, amx); break;
    case 3: run<3>(x, w, bias, y, K, N, amx); break;
    case 4: run<4>(x, w, bias, y, K, N, amx); break;
    case 5: run<5>(x, w, bias, y, K, N, amx); break;
    case 6: run<6>(x, w, bias, y, K, N, amx); break;
    case 7: run<7>(x, w, bias, y, K, N, amx); break;
    default: run<8>(x, w, bias, y, K, N, amx); break;
  }
}

// More than kPassRows rows: the vector tiles in passes (multi_pass_blocks), the weight read from memory once. AMX,
// AVX2 and the portable loop: one call per kPassRows rows, the weight read again by each (AMX's tiles take up to
// 16 rows at once, but a row's result would then depend on the call's row count).
void run_multi(const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t M, int64_t K,
               int64_t N, bool amx) {
#if defined(__AVX512BF16__)
  if (!amx) {
    const int64_t L = pass_block(M % kPassRows);
    auto* yp = reinterpret_cast<uint16_t*>(y);
    split((N + L - 1) / L, L * K * static_cast<int64_t>(sizeof(uint16_t)),
          [&](int64_t b0, int64_t b1) { multi_pass_blocks(x, w, bias, yp, M, K, N, b0, b1); });
    return;
  }
#endif
  for (int64_t r = 0; r < M; r += kPassRows)
    run_rows(std::min<int64_t>(kPassRows, M - r), x + r * K, w, bias, y + r * N, K, N, amx);
}

// The path for M rows: AMX where the CPU has it, the OS allows it and it is faster.
bool use_amx(int64_t M, int64_t path) {
#if defined(CINQ_SMALL_M_AMX)
  if (path == 1) return false;
  return amx_ready() && (path == 2 || M >= kAmxMinRows);
#else
  return false;
#endif
}

}  // namespace

// x [M, K] bf16 contiguous (M <= kMaxRows), w [N, K] bf16 contiguous, bias [N] float32 / bf16 or empty.
// Returns [M, N] bf16.
// path: 0 the fastest for this CPU and M, 1 AVX512-BF16 vector tiles, 2 AMX where available (tests, benchmarks).
torch::Tensor small_m_linear(torch::Tensor x, torch::Tensor w, torch::Tensor bias, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_m_linear: shapes");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && w.scalar_type() == torch::kBFloat16, "small_m_linear: bf16");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "small_m_linear: contiguous inputs");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "small_m_linear: 1 <= M <= ", kMaxRows);
  const float* b = nullptr;
  std::vector<float> widened;  // a bf16 bias (the model's own dtype) widened here, not cast by the caller per call
  if (bias.numel()) {
    TORCH_CHECK(bias.numel() == N && bias.is_contiguous() &&
                    (bias.scalar_type() == torch::kFloat32 || bias.scalar_type() == torch::kBFloat16),
                "small_m_linear: bias must be contiguous float32 or bf16 [N]");
    if (bias.scalar_type() == torch::kFloat32) {
      b = bias.data_ptr<float>();
    } else {
      const at::BFloat16* src = bias.data_ptr<at::BFloat16>();
      widened.assign(src, src + N);
      b = widened.data();
    }
  }
  auto y = torch::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* yp = y.data_ptr<at::BFloat16>();
  const bool amx = use_amx(M, path);
  if (M > kPassRows)
    run_multi(xp, wp, b, yp, M, K, N, amx);
  else
    run_rows(M, xp, wp, b, yp, K, N, amx);
  return y;
}

#if defined(CINQ_REGISTER_OPS)
// torch.ops.cinq.small_m_linear, registered here in C++ (cinq's own builds define CINQ_REGISTER_OPS; a second copy
// of this source loaded beside it, e.g. a benchmark's older revision, must not register the name again): compiled
// code then calls the kernel through the dispatcher without entering Python (a Python custom op costs ~10 us a
// call). The Meta kernel gives torch.compile's fake tensors their shape.
TORCH_LIBRARY_FRAGMENT(cinq, m) { m.def("small_m_linear(Tensor x, Tensor weight, Tensor bias) -> Tensor"); }
TORCH_LIBRARY_IMPL(cinq, CPU, m) {
  m.impl("small_m_linear",
         [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) { return small_m_linear(x, w, b, 0); });
}
TORCH_LIBRARY_IMPL(cinq, Meta, m) {
  m.impl("small_m_linear", [](const at::Tensor& x, const at::Tensor& w, const at::Tensor&) {
    return at::empty({x.size(0), w.size(0)}, x.options());
  });
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_m_linear", &small_m_linear, "skinny bf16 linear (CPU)", py::arg("x"), py::arg("w"),
        py::arg("bias"), py::arg("path") = 0);
  m.def("max_rows", [] { return kMaxRows; });
#if defined(CINQ_SMALL_M_AMX)
  m.def("has_amx", [] { return amx_ready(); });
#else
  m.def("has_amx", [] { return false; });
#endif
  m.def("fast_rows", [](int64_t path) { return use_amx(kMaxRows, path) ? kMaxRows : kVectorFastRows; },
        "the most rows for which this kernel (path as in small_m_linear) beats oneDNN on this CPU",
        py::arg("path") = 0);
  // Without AVX512-BF16 or AVX2 the portable loop does not beat oneDNN: the loader skips it then.
#if defined(__AVX512BF16__) || defined(CINQ_SMALL_M_AVX2)
  m.def("has_fast_path", [] { return true; });
#else
  m.def("has_fast_path", [] { return false; });
#endif
}
