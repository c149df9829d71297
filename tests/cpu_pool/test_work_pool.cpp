// run_tasks (backends/common/work_pool.h): every task runs exactly once, slots stay below the
// thread count and are never shared by two threads at once, calls from several threads and calls
// nested in a task are safe, and the pool never starts more workers than threads - 1.
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "backends/common/work_pool.h"

namespace attnops {
namespace {

struct Count {
  std::vector<std::atomic<int>> runs;
  std::vector<std::atomic<int>> in_slot;  // threads inside a task with this slot right now
  int threads = 0;
  std::atomic<int> bad_slot{0}, shared_slot{0};
  Count(std::int64_t tasks, int t)
      : runs(static_cast<std::size_t>(tasks)), in_slot(static_cast<std::size_t>(t)), threads(t) {}
};

void count_task(void* c, std::int64_t task, int slot) {
  Count& x = *static_cast<Count*>(c);
  if (slot < 0 || slot >= x.threads) {
    x.bad_slot.fetch_add(1);
    return;
  }
  if (x.in_slot[static_cast<std::size_t>(slot)].fetch_add(1) != 0) x.shared_slot.fetch_add(1);
  volatile double s = 0;  // a little work, so that workers join
  for (int i = 0; i < 2000; ++i) s = s + i * 0.5;
  x.runs[static_cast<std::size_t>(task)].fetch_add(1);
  x.in_slot[static_cast<std::size_t>(slot)].fetch_sub(1);
}

void expect_each_once(const Count& c) {
  EXPECT_EQ(c.bad_slot.load(), 0);
  EXPECT_EQ(c.shared_slot.load(), 0);
  for (std::size_t i = 0; i < c.runs.size(); ++i) ASSERT_EQ(c.runs[i].load(), 1) << "task " << i;
}

TEST(WorkPool, EveryTaskRunsOnceWithSlotsBelowTheThreadCount) {
  for (int threads : {1, 2, 3}) {
    for (std::int64_t tasks : {0, 1, 2, 7, 100}) {
      for (int rep = 0; rep < 20; ++rep) {
        Count c(tasks, threads);
        run_tasks(threads, tasks, count_task, &c);
        expect_each_once(c);
      }
    }
  }
  EXPECT_LE(pool_workers(), 2);  // threads - 1 for the largest call
}

TEST(WorkPool, CallsFromSeveralThreadsAtOnce) {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        Count c(31, 2);
        run_tasks(2, 31, count_task, &c);
        for (auto& r : c.runs)
          if (r.load() != 1) failures.fetch_add(1);
        if (c.bad_slot.load() || c.shared_slot.load()) failures.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

struct Nested {
  std::vector<std::atomic<int>> runs;
  explicit Nested(std::size_t n) : runs(n) {}
};

TEST(WorkPool, ACallInsideATaskRunsOnItsOwnThread) {
  Nested outer(8 * 5);
  run_tasks(
      2, 8,
      [](void* c, std::int64_t task, int) {
        auto inner = [](void* d, std::int64_t i, int slot) {
          auto* n = static_cast<std::pair<Nested*, std::int64_t>*>(d);
          if (slot == 0) n->first->runs[static_cast<std::size_t>(n->second * 5 + i)].fetch_add(1);
        };
        std::pair<Nested*, std::int64_t> ctx{static_cast<Nested*>(c), task};
        run_tasks(2, 5, inner, &ctx);
      },
      &outer);
  for (std::size_t i = 0; i < outer.runs.size(); ++i) EXPECT_EQ(outer.runs[i].load(), 1) << i;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The workers poll for kSpin (tens of microseconds) after a call, then sleep: a process whose
// calls stopped uses no CPU. (Not a timing of the kernels: a worker that kept spinning would use
// the whole 300 ms of the sleep, the bound is a tenth of that.)
TEST(WorkPool, IdleWorkersSleep) {
  Count c(64, 3);
  run_tasks(3, 64, count_task, &c);
  expect_each_once(c);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the polling
  const double t0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(process_cpu_seconds() - t0, 0.03);
}

// A call whose caller waits milliseconds for a worker's task (a worker descheduled by a busy
// machine; here the worker's task sleeps 20 ms) sends the next calls to the caller alone, for at
// most kSoloTime (50 ms); a call that had to start its workers does not count (a new thread's
// first task is slow for other reasons). The caller's own task waits until a worker holds the
// other one, so the worker's task is the one the caller waits for.
struct Stall {
  std::atomic<bool> worker_in{false};
};
void stall_task(void* c, std::int64_t, int slot) {
  Stall& x = *static_cast<Stall*>(c);
  if (slot != 0) {
    x.worker_in = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!x.worker_in && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::yield();
}

TEST(WorkPool, AStallSendsCallsToTheCallerAloneForABoundedTimeButAColdStartDoesNot) {
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // whatever an earlier test left ends
  Count clear(2, 2);
  run_tasks(2, 2, count_task, &clear);
  ASSERT_EQ(pool_solo_calls(), 0);
  const int threads = pool_workers() + 2;  // this call starts a worker: cold, never a stall
  Stall cold;
  run_tasks(threads, 2, stall_task, &cold);
  ASSERT_TRUE(cold.worker_in);
  EXPECT_EQ(pool_solo_calls(), 0);
  Stall warm;  // the same call with the workers running: the caller waited ~20 ms for one
  run_tasks(threads, 2, stall_task, &warm);
  ASSERT_TRUE(warm.worker_in);
  EXPECT_GT(pool_solo_calls(), 0);
  Count alone(8, threads);  // runs on the caller alone: slot 0 only
  run_tasks(threads, 8, count_task, &alone);
  expect_each_once(alone);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past kSoloTime
  Count after(8, threads);
  run_tasks(threads, 8, count_task, &after);
  expect_each_once(after);
  EXPECT_EQ(pool_solo_calls(), 0);
}

// The caller's task runs 10 ms after the worker's has started, the worker's 12 ms: the caller
// waits ~2 ms for it, more than kStallMin and an eighth of its working time, but a quiet machine
// with long tasks waits that long (a 32K-key decode's tasks take ~1 ms each): no stall, because
// the wait is under twice the caller's own task.
struct LongTasks {
  std::atomic<bool> worker_in{false};
};
void long_task(void* c, std::int64_t, int slot) {
  LongTasks& x = *static_cast<LongTasks*>(c);
  const auto t0 = std::chrono::steady_clock::now();
  if (slot != 0) {
    x.worker_in = true;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(12)) std::this_thread::yield();
    return;
  }
  while (!x.worker_in && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::yield();
  const auto t1 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(10)) std::this_thread::yield();
}

TEST(WorkPool, WaitingForATaskAsLongAsTheCallersOwnIsNoStall) {
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // whatever an earlier test left ends
  // Two threads: one worker slot, so the caller runs one of the two tasks (with more, two workers
  // could take both and the caller would wait with no task of its own: a stall by the rule).
  Count warmup(2, 2);
  run_tasks(2, 2, count_task, &warmup);  // starts the worker if none runs yet
  for (int i = 0; i < 3; ++i) {
    LongTasks x;
    run_tasks(2, 2, long_task, &x);
    ASSERT_TRUE(x.worker_in);
    EXPECT_EQ(pool_solo_calls(), 0) << "call " << i;
  }
}

}  // namespace
}  // namespace attnops
