// The threads of one decode step's OpenMP region (decode_layers.cpp): thread 0 runs the layers and posts the parts
// of a split linear or attention; every thread claims parts until none is left.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cinq_team {

// Spins before a waiting thread starts yielding its core: a few hundred microseconds, longer than any wait inside
// a step on an idle machine, short enough not to starve another process of a shared core for long.
constexpr int64_t kSpinsBeforeYield = 1 << 14;

inline void relax(int64_t& spins) {
  if (++spins < kSpinsBeforeYield) {
#if defined(__x86_64__)
    _mm_pause();
#endif
  } else {
    std::this_thread::yield();
  }
}

// The threads of one step's OpenMP region. Thread 0 runs the layers; a split linear posts its parts, and every
// thread (thread 0 too, once its own part is done) claims parts until none is left, so a worker the OS has
// descheduled never holds the step up unless it is in the middle of a part. One region per step replaces the
// ~2 regions per layer of the kernels' own parallel loops, whose sleeping workers (OMP_WAIT_POLICY=PASSIVE) each
// cost a wake-up: the reason 2 threads decoded slower than 1.
class Team {
 public:
  explicit Team(int size) : size_(size) {}
  int size() const { return size_; }

  // fn(p) for p in [0, parts), thread 0 taking part 0; returns when every part is done.
  void run(int parts, const std::function<void(int)>& fn) {
    job_.store(&fn, std::memory_order_relaxed);
    parts_.store(parts, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    next_.store(1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    std::exception_ptr mine;
    try {
      fn(0);
    } catch (...) {
      mine = std::current_exception();
    }
    claim();
    // every part done before returning, even on an error: the parts write into the caller's frame
    for (int64_t spins = 0; done_.load(std::memory_order_acquire) < parts - 1;) relax(spins);
    if (mine) std::rethrow_exception(mine);
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_) std::rethrow_exception(error_);
  }

  // A worker's loop: claim parts of each posted job until stop().
  void work() {
    int64_t seen = 0, spins = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      const int64_t g = generation_.load(std::memory_order_acquire);
      if (g == seen) {
        relax(spins);
        continue;
      }
      seen = g;
      spins = 0;
      claim();
    }
  }

  void stop() { stop_.store(true, std::memory_order_release); }

 private:
  void claim() {
    for (;;) {
      const int p = next_.fetch_add(1, std::memory_order_acq_rel);
      if (p >= parts_.load(std::memory_order_relaxed)) return;
      try {
        (*job_.load(std::memory_order_relaxed))(p);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();  // the first failure; thread 0 rethrows it
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  const int size_;
  std::atomic<const std::function<void(int)>*> job_{nullptr};
  std::atomic<int> parts_{0}, next_{0}, done_{0};
  std::atomic<int64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace cinq_team
