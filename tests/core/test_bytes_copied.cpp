// decision.run.bytes_copied: the host copies a call made of its inputs. Contiguous inputs in the
// runtime dtype are used in place (0 bytes); a view whose innermost stride is not 1, a dtype
// conversion and segment ids in i64 are copied, and the decision says how many bytes.
#include <gtest/gtest.h>

#include <string>

#include "attnops/attnops.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

const Attention& native_vanilla() {
  static const Attention attn = [] {
    OperationMetadata md;
    md.backends = {Backend::native};
    return registry().get("vanilla", md);
  }();
  return attn;
}

TEST(BytesCopied, ContiguousInputsAreUsedInPlace) {
  const Tensor q = random_tensor(DType::f32, {1, 8, 2, 16}, 1),
               k = random_tensor(DType::f32, {1, 8, 2, 16}, 2),
               v = random_tensor(DType::f32, {1, 8, 2, 16}, 3);
  const AttentionOutput out = native_vanilla()(q, k, v);
  EXPECT_EQ(out.decision.run.bytes_copied, 0u);
  EXPECT_EQ(out.decision.to_json().find("bytes_copied"), std::string::npos) << out.decision.to_json();
  EXPECT_EQ(native_vanilla().explain(q, k, v).run.bytes_copied, 0u);
}

TEST(BytesCopied, CountsStridedViewsConversionsAndSegmentIds) {
  // k viewed with innermost stride 2 (every other element of a [1, 8, 2, 32] buffer): copied.
  const Tensor q = random_tensor(DType::f32, {1, 8, 2, 16}, 1),
               kbuf = random_tensor(DType::f32, {1, 8, 2, 32}, 2),
               v = random_tensor(DType::f32, {1, 8, 2, 16}, 3);
  const TensorView k(kbuf.data(), DType::f32, {1, 8, 2, 16}, {8 * 2 * 32, 2 * 32, 32, 2});
  AttentionOutput out = native_vanilla()(q, k, v);
  EXPECT_EQ(out.decision.run.bytes_copied, 1u * 8 * 2 * 16 * 4);
  EXPECT_NE(out.decision.to_json().find("\"bytes_copied\": 1024"), std::string::npos)
      << out.decision.to_json();

  // Segment ids in i64 are narrowed to i32 copies: 8 + 8 ids of 4 bytes.
  Tensor seg(DType::i64, {1, 8});
  AttentionOptions o;
  o.segment_ids_q = seg.view();
  o.segment_ids_kv = seg.view();
  out = native_vanilla()(q, q, v, o);
  EXPECT_EQ(out.decision.run.bytes_copied, 2u * 8 * 4);
  EXPECT_EQ(native_vanilla().explain(q, q, v, o).run.bytes_copied, 2u * 8 * 4);

  // The backward counts its own copies (the forward's inputs and the residuals it converts).
  o = {};
  o.return_lse = true;
  const AttentionOutput fwd = native_vanilla()(q, k, v, o);
  const AttentionGradients g = native_vanilla().backward(q, k, v, fwd, fwd.out, o);
  EXPECT_GE(g.decision.run.bytes_copied, 1u * 8 * 2 * 16 * 4);
}

}  // namespace
}  // namespace attnops::testing
