#include "backends/common/call_scratch.h"

#include <cstdlib>
#include <new>

namespace attnops {
namespace {

struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(p); }
};

}  // namespace

void* call_scratch(std::size_t bytes) {
  thread_local Buffer b;
  if (bytes <= b.bytes && b.p) return b.p;
  // Grow by at least half again, so slowly growing calls (a KV cache filling up) reallocate
  // O(log) times, not once per call.
  std::size_t want = bytes + bytes / 2;
  want = (want + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, want);
  if (!p) throw std::bad_alloc();
  std::free(b.p);
  b.p = p;
  b.bytes = want;
  return p;
}

}  // namespace attnops
