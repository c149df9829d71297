#include "backends/native/paged_native.h"

#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/paged_gather.h"
#include "backends/native/reference.h"

namespace attnops::native {

void paged_reference(const PagedProblem& p, PagedBuffers& buffers) {
  const PagedPlanData& d = *p.batch;
  for (std::int64_t s = 0; s < d.S; ++s) {
    if (d.q_len[static_cast<std::size_t>(s)] == 0) continue;  // q_len >= 1 implies kv_len >= 1
    // An 8-bit cache: its values in f32, exactly gather()'s; q widened to f32 (exact).
    const paged::DenseSequence x =
        paged::dense_sequence(p, s, 0, true, p.quantized() ? std::optional<DType>(DType::f32) : std::nullopt);
    const AttentionProblem dp = make_problem(x.q, x.k, x.v, x.options, x.metadata);
    AttentionBuffers ab = allocate_buffers(dp);
    reference_attention(dp, ab);
    paged::scatter_outputs(p, s, ab, buffers);
  }
  buffers.run.kernel = "fp64_oracle";
  buffers.run.kernel_detail =
      p.quantized()
          ? "per sequence: keys gathered from the pages and dequantized (code x scale, f32), the dense "
            "fp64 oracle, the output rounded to q's dtype"
          : "per sequence: keys gathered from the pages, the dense fp64 oracle";
  buffers.run.batch_invariant = true;
}

}  // namespace attnops::native
