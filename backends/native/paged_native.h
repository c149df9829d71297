// The paged forward of the native backend: the fp64 oracle. Each sequence's keys are gathered
// from the pages into dense tensors and the dense oracle (reference.h) runs on them with the same
// options, so a sequence's result is bitwise the dense native call on its keys.
#pragma once

#include "attnops/ext/paged_problem.h"

namespace attnops::native {

void paged_reference(const PagedProblem& p, PagedBuffers& buffers);

}  // namespace attnops::native
