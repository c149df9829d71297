// Heap allocations of a warmed-up decode call (counted by replacing operator new and interposing
// aligned_alloc / malloc in this test program; it is not built under the sanitizers, which
// intercept them themselves). The cpu entry point, into buffers allocated beforehand, allocates
// nothing once warm (scratch from call_scratch.h, the ISA choice kept per thread, the decision's
// strings reuse their capacity), on one thread or two. Through the public API the count is fixed
// (the same call after call and whatever the size) and is only what the caller gets back: the
// output tensor (its shape and storage, 3) and the decision (the disabled gpu's reason, the
// kernel, its detail, 4): no shape strings are built for messages that are not thrown, the
// decision is moved, not copied, the candidate backends sit in a fixed array, the causal mask node
// is shared, the cpu's availability needs no string or ISA re-detection, and the environment is
// read once.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_cpu.h"
#include "tests/support/testing.h"

extern "C" void* __libc_malloc(std::size_t);
extern "C" void* __libc_memalign(std::size_t, std::size_t);
extern "C" void __libc_free(void*);

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

extern "C" void* malloc(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}
extern "C" void* aligned_alloc(std::size_t align, std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, n);
}
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  __libc_free(p);
}
void operator delete[](void* p) noexcept {
  __libc_free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  __libc_free(p);
}

namespace attnops::testing {
namespace {

struct Decode {
  Tensor q, k, v;
  AttentionProblem p;
  Decode(std::int64_t Tk, int threads)
      : q(random_tensor(DType::f32, {1, 1, 8, 64}, 1)),
        k(random_tensor(DType::f32, {1, Tk, 2, 64}, 2)),
        v(random_tensor(DType::f32, {1, Tk, 2, 64}, 3)) {
    AttentionOptions o;
    o.return_lse = true;
    OperationMetadata md;
    md.num_threads = threads;
    p = make_problem(q, k, v, o, md);
  }
};

// Allocations of one cpu::vanilla_attention call into buffers allocated beforehand, after a
// warm-up call (the pool's workers, the ISA detection, the block maps are made once).
long kernel_call_allocations(std::int64_t Tk, int threads) {
  Decode d(Tk, threads);
  const long before_buffers = g_allocations.load();
  AttentionBuffers b = allocate_buffers(d.p);
  EXPECT_GT(g_allocations.load(), before_buffers);  // the counter sees allocations
  cpu::vanilla_attention(d.p, b);
  const long before = g_allocations.load();
  cpu::vanilla_attention(d.p, b);
  return g_allocations.load() - before;
}

TEST(CallAllocations, WarmDecodeKernelCallAllocatesNothing) {
  for (int threads : {1, 2}) {
    EXPECT_EQ(kernel_call_allocations(2048, threads), 0) << "threads " << threads;
    EXPECT_EQ(kernel_call_allocations(16384, threads), 0) << "threads " << threads;
  }
}

TEST(CallAllocations, PublicDecodeCallCountIsSteady) {
  OperationMetadata md;
  md.backends = {Backend::cpu};
  md.disabled_backends = {Backend::gpu};
  md.num_threads = 2;
  const Attention attn = registry().get("vanilla", md);
  long counts[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    Decode d(i == 0 ? 2048 : 16384, 2);
    (void)attn(d.q, d.k, d.v);  // warm-up
    const long before = g_allocations.load();
    (void)attn(d.q, d.k, d.v);
    counts[i] = g_allocations.load() - before;
  }
  EXPECT_EQ(counts[0], counts[1]);
  EXPECT_LE(counts[0], 7) << "a warm public decode call allocates more than its output and its decision";
  std::printf("public decode call: %ld allocations\n", counts[0]);
}

}  // namespace
}  // namespace attnops::testing
