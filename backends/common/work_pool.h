// The CPU kernels' thread pool: tasks handed out one at a time to whichever threads are running,
// and a call that never waits for a thread that has not started.
//
// Why not an OpenMP parallel region: a region ends in a barrier that every thread of the team
// must reach. On a busy machine (other processes on every core) a worker woken for the region
// may not run for a whole scheduler time slice (4 ms), and the call waits for it even when the
// caller has done all the work meanwhile: a 0.1 ms decode took 16 ms with two busy processes on
// two cores. Here the calling thread takes tasks too, workers join only while tasks
// are left, and the call returns once every task is done: a worker that never ran is never
// waited for, only one that is in the middle of a task. When even that happens (a worker
// descheduled mid-task held the caller for longer than a quarter of its own work), the next calls
// run on the caller alone for a while, then try the workers again (work_pool.cpp, kStallMin): on a
// machine with every core busy a second thread cannot help, and waiting for it costs whole
// scheduler slices. Results never depend on it: which and how many threads run the tasks does not
// change any kernel's output (decode's split count follows the thread count asked for).
//
// Waiting never burns a core for long: an idle worker spins briefly (kSpinMicros) for the next
// call, then sleeps on a condition variable; the caller does the same while the last tasks finish.
//
// Plain function pointer and context (no templates): the per-tier kernels call it without
// instantiating anything shared between tiers (backends/cpu/README.md, rule 2).
#pragma once

#include <cstdint>

namespace attnops {

// fn(ctx, task, slot): slot in [0, threads) is unique among the threads running this call at a
// time (index of the caller's per-thread scratch); which thread runs which task is not fixed, so
// a task's result must depend on the task alone (it does in every kernel: each writes its own
// outputs, merges run in a fixed order).
using TaskFn = void (*)(void* ctx, std::int64_t task, int slot);

// Runs fn for every task in [0, tasks) on the calling thread and at most threads - 1 pool
// workers, returns when all are done. fn must not throw (the kernels allocate before the call).
// Calls from several threads at once are safe: one runs on the pool, the others on their own
// thread alone.
void run_tasks(int threads, std::int64_t tasks, TaskFn fn, void* ctx);

// Pool workers started so far (tests; they are started on first need and live until exit).
int pool_workers();

// Calls left that run on the caller alone after a stall (tests; 0 when none is pending).
int pool_solo_calls();

}  // namespace attnops
