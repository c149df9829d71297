// One reusable scratch buffer per calling thread, for kernels whose working memory is sized per
// call (baseline code; per-tier kernels call it through this plain function). A warmed-up call of
// the same or a smaller size allocates nothing: a decode step per layer per token is a stream of
// equal calls. The buffer only grows; it is freed when the thread ends.
//
// A kernel takes the buffer once per call, before its tasks run, and carves it up itself; it must
// not call another kernel that uses it while it holds it (none does: they are leaves).
#pragma once

#include <cstddef>

namespace attnops {

// At least `bytes`, 64-byte aligned, contents unspecified; std::bad_alloc if it cannot grow.
void* call_scratch(std::size_t bytes);

}  // namespace attnops
