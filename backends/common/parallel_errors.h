// Exceptions inside an OpenMP parallel region must not leave it (that is std::terminate). A CPU
// kernel catches them per task with capture(), lets the remaining tasks skip (any()), and after
// the region rethrow()s the first one, outside OpenMP; std::bad_alloc becomes
// Error(out_of_memory) naming the kernel.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>
#include <new>
#include <string>

#include "attnops/error.h"

namespace attnops {

class ParallelErrors {
 public:
  bool any() const { return failed_.load(std::memory_order_relaxed); }

  // Call from a catch block.
  void capture() noexcept {
    std::lock_guard lock(mu_);
    if (!first_) first_ = std::current_exception();
    failed_.store(true, std::memory_order_relaxed);
  }

  void rethrow(const std::string& where) const {
    if (!first_) return;
    try {
      std::rethrow_exception(first_);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::out_of_memory, where + ": out of memory in a worker thread");
    }
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::exception_ptr first_;
};

}  // namespace attnops
