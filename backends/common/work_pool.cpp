// The CPU kernels' thread pool (see work_pool.h for why it is not an OpenMP region).
//
// One call at a time owns the pool (busy_). A call publishes its job under mu_: the function,
// the context, the task count and a new generation g; next_ holds (g << 32 | next task index),
// so a worker still holding an older generation can never claim a task of this call (its
// compare-exchange fails on the generation bits) and never touches this call's context. A
// worker joins a call under mu_ (taking a slot, if one is left), then claims tasks with a
// compare-exchange on next_ until none is left; the thread that completes the last task wakes
// the caller. The caller claims tasks the same way, then waits only for tasks already claimed.
#include "backends/common/work_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace attnops {
namespace {

using Clock = std::chrono::steady_clock;

// How long an idle worker polls for the next call before it sleeps, and how long the caller polls
// for the last tasks before it sleeps. Short: a decode step's calls come back to back (a worker
// that polls catches the next one without a futex wake-up, ~5-20 us), but an idle process burns
// at most this much CPU per worker after its last call.
constexpr auto kSpin = std::chrono::microseconds(30);

// A stalled call: the caller ran out of tasks and then waited more than kStallMin, more than an
// eighth of its own working time, and more than twice the longest task it ran itself, for a task
// a worker had claimed: the worker was descheduled in the middle of it (a busy machine). The next
// kSoloCalls calls then run on the caller alone (the results do not change: no kernel's result
// depends on which or how many threads run its tasks), and the one after probes the workers
// again. A quiet machine waits for at most about one task (a worker's last task started before
// the caller ran out), hence the last condition: a 32K-key decode's eight ~1 ms tasks passed the
// first two about every other call and ran its next calls on one thread (measured: bf16 decode
// median 8.0 -> 7.2 ms with the last condition, 2 threads, Zen 5). A large call, where one
// scheduler slice is small beside the work, keeps its threads.
constexpr auto kStallMin = std::chrono::microseconds(500);
constexpr int kSoloCalls = 128;
// ... and for at most this long: after a stall in a large call (a long decode takes ~10 ms), 128
// calls alone would hold a quiet machine's second core back for seconds.
constexpr auto kSoloTime = std::chrono::milliseconds(50);
// A call that had to start workers never counts as a stall: a new thread's start and its first,
// cold task are not a busy machine (measured: the first 12 ms decode of a process waited 1.6 ms
// for its new worker, and the 128 calls after it ran on one thread).

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

class Pool {
 public:
  void run(int threads, std::int64_t tasks, TaskFn fn, void* ctx) {
    bool expected = false;
    if (threads <= 1 || tasks <= 1 || tasks > 0xffffffffLL || solo_calls_left() ||
        !busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      for (std::int64_t i = 0; i < tasks; ++i) fn(ctx, i, 0);  // alone (or the pool is in use)
      return;
    }
    std::uint32_t g = 0;
    bool cold = false;
    {
      std::lock_guard lock(mu_);
      g = ++gen_;
      fn_ = fn;
      ctx_ = ctx;
      tasks_ = tasks;
      max_slots_ = threads;
      slots_taken_ = 1;  // slot 0: the caller
      done_.store(0, std::memory_order_relaxed);
      next_.store(std::uint64_t{g} << 32, std::memory_order_relaxed);
      published_.store(g, std::memory_order_release);
      cold = start_workers(threads - 1) > 0;
    }
    wake_.notify_all();

    const auto start = Clock::now();
    const Clock::duration longest = work(g, tasks, fn, ctx, 0);
    if (done_.load(std::memory_order_acquire) != tasks) {
      const auto t0 = Clock::now();
      while (done_.load(std::memory_order_acquire) != tasks && Clock::now() - t0 < kSpin) cpu_relax();
      if (done_.load(std::memory_order_acquire) != tasks) {
        std::unique_lock lock(mu_);
        finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == tasks; });
      }
      const auto waited = Clock::now() - t0;
      if (!cold && waited > kStallMin && waited * 8 > t0 - start && waited > 2 * longest) start_solo();
    }
    busy_.store(false, std::memory_order_release);
  }

  // Counts down the calls left to run alone after a stall (see kStallMin), until kSoloTime ends.
  bool solo_calls_left() {
    int n = solo_.load(std::memory_order_relaxed);
    if (n <= 0) return false;
    if (Clock::now().time_since_epoch().count() >= solo_until_.load(std::memory_order_relaxed)) {
      solo_.store(0, std::memory_order_relaxed);
      return false;
    }
    while (n > 0)
      if (solo_.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) return true;
    return false;
  }

  int solo_calls() const { return solo_.load(std::memory_order_relaxed); }

  int workers() {
    std::lock_guard lock(mu_);
    return workers_;
  }

 private:
  // Claims the next task of generation g, if any is left.
  bool claim(std::uint32_t g, std::int64_t tasks, std::int64_t& task) {
    std::uint64_t v = next_.load(std::memory_order_relaxed);
    for (;;) {
      if ((v >> 32) != g || static_cast<std::int64_t>(v & 0xffffffffu) >= tasks) return false;
      if (next_.compare_exchange_weak(v, v + 1, std::memory_order_relaxed)) {
        task = static_cast<std::int64_t>(v & 0xffffffffu);
        return true;
      }
    }
  }

  // Runs tasks of generation g until none is left; the caller (slot 0) also returns the longest
  // time one of its tasks took (a worker returns 0, unmeasured).
  Clock::duration work(std::uint32_t g, std::int64_t tasks, TaskFn fn, void* ctx, int slot) {
    std::int64_t task = 0;
    Clock::duration longest{0};
    while (claim(g, tasks, task)) {
      if (slot == 0) {
        const auto t0 = Clock::now();
        fn(ctx, task, slot);
        longest = std::max(longest, Clock::now() - t0);
      } else {
        fn(ctx, task, slot);
      }
      // Release: the task's outputs are visible to whoever sees the count (the caller).
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks && slot != 0) {
        std::lock_guard lock(mu_);  // the caller checks the count under mu_ before it sleeps
        finished_.notify_all();
      }
    }
    return longest;
  }

  void start_solo() {
    solo_until_.store((Clock::now() + kSoloTime).time_since_epoch().count(), std::memory_order_relaxed);
    solo_.store(kSoloCalls, std::memory_order_relaxed);
  }

  // Under mu_; returns how many were started. A thread that cannot be started is not an error:
  // the call runs on fewer.
  int start_workers(int want) {
    int started = 0;
    while (workers_ < want) {
      try {
        // It starts with the call that starts it unseen, so it joins that call (else the first
        // call of a process would run on the caller alone).
        std::thread([this, before = gen_ - 1] { worker_loop(before); }).detach();
      } catch (...) {
        break;
      }
      ++workers_;
      ++started;
    }
    return started;
  }

  [[noreturn]] void worker_loop(std::uint32_t seen) {
    for (;;) {
      const auto t0 = Clock::now();
      while (published_.load(std::memory_order_acquire) == seen && Clock::now() - t0 < kSpin) cpu_relax();
      std::uint32_t g = 0;
      std::int64_t tasks = 0;
      TaskFn fn = nullptr;
      void* ctx = nullptr;
      int slot = 0;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return published_.load(std::memory_order_relaxed) != seen; });
        seen = gen_;
        if (slots_taken_ >= max_slots_) continue;  // enough threads on this call already
        slot = slots_taken_++;
        g = gen_, tasks = tasks_, fn = fn_, ctx = ctx_;
      }
      work(g, tasks, fn, ctx, slot);
    }
  }

  std::atomic<bool> busy_{false};
  std::atomic<int> solo_{0};               // calls left to run on the caller alone after a stall
  std::atomic<Clock::rep> solo_until_{0};  // ... until this time (Clock ticks)
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::atomic<std::uint32_t> published_{0};  // == gen_, readable without mu_ (polling)
  std::atomic<std::uint64_t> next_{0};       // generation << 32 | next task index
  std::atomic<std::int64_t> done_{0};        // tasks of the current call completed
  // Under mu_:
  std::uint32_t gen_ = 0;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t tasks_ = 0;
  int max_slots_ = 0, slots_taken_ = 0, workers_ = 0;
};

// Never destroyed: the workers sleep on its condition variable until the process exits (no
// thread teardown in static destructors).
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

void run_tasks(int threads, std::int64_t tasks, TaskFn fn, void* ctx) {
  if (tasks <= 0) return;
  pool().run(threads, tasks, fn, ctx);
}

int pool_workers() {
  return pool().workers();
}

int pool_solo_calls() {
  return pool().solo_calls();
}

}  // namespace attnops
