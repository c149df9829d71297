// Per-tier header: fn(slot, task) for every task < tasks on the work pool
// (backends/common/work_pool.h), on at most `threads` threads; slot < threads indexes per-thread
// scratch. The pool takes a plain function pointer and a context; this adapts a lambda (usually
// capturing by reference) to it, so a kernel writes its loop body once as `[&](int slot, i64 t)`.
// fn must not throw (kernels allocate before the loop) and a task's result must not depend on
// the thread or slot that runs it. Per tier (ATTNOPS_TIER_NS): each instantiation belongs to the
// tier that calls it (backends/cpu/README.md, rules for per-tier sources).
#pragma once

#if !defined(ATTNOPS_TIER_NS)
#error "backends/cpu/pool_for.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

#include <cstdint>

#include "backends/common/work_pool.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {

template <class Fn>
void pool_for(int threads, std::int64_t tasks, Fn& fn) {
  run_tasks(
      threads, tasks, [](void* ctx, std::int64_t task, int slot) { (*static_cast<Fn*>(ctx))(slot, task); },
      &fn);
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
