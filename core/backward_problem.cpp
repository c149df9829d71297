// make_backward_problem: the forward's validation plus the residuals (out, lse) and dout.
#include "attnops/ext/backward_problem.h"

#include <string>

#include "attnops/backward.h"
#include "attnops/error.h"
#include "attnops/ext/problem.h"

namespace attnops {

namespace {

std::string expected_btdh(const AttentionProblem& p) {
  return "[B=" + std::to_string(p.B) + ", Tq=" + std::to_string(p.Tq) + ", Hq=" + std::to_string(p.Hq) +
         ", Dv=" + std::to_string(p.Dv) + "]";
}

void require_float(const TensorView& t, const char* name) {
  if (!is_float(t.dtype()))
    throw Error(ErrorCode::unsupported_dtype, std::string(name) +
                                                  ": expected a float dtype (f32, f16 or bf16), got " +
                                                  std::string(dtype_name(t.dtype())));
  if (t.data() == nullptr && t.numel() != 0)
    throw Error(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
}

// out / dout: [B, Tq, Hq, Dv], stored as the kernels read q (fwd.dtype, stride(3) == 1).
TensorView output_like(BackwardProblem& bp, const TensorView& t, const char* name, const char* what) {
  const AttentionProblem& p = bp.fwd;
  if (t.rank() != 4 || t.dim(0) != p.B || t.dim(1) != p.Tq || t.dim(2) != p.Hq || t.dim(3) != p.Dv)
    throw Error(ErrorCode::shape_mismatch, std::string(name) + ": expected shape " + expected_btdh(p) + " (" +
                                               what + "), got " + shape_string(t.shape()));
  require_float(t, name);
  if (t.dtype() == p.dtype && (t.stride(3) == 1 || t.dim(3) <= 1)) return t;
  bp.owned.push_back(Tensor::copy_of(t, p.dtype));
  return bp.owned.back().view();
}

}  // namespace

BackwardProblem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse, const TensorView& dout,
                                      const AttentionOptions& options, const OperationMetadata& metadata) {
  AttentionOptions o = options;
  o.return_lse = false;  // forward output requests: the backward returns gradients
  o.return_weights = false;
  BackwardProblem bp;
  bp.fwd = make_problem(q, k, v, o, metadata);
  const AttentionProblem& p = bp.fwd;
  bp.owned.reserve(3);
  bp.out = output_like(bp, out, "out", "the forward's output");
  bp.dout = output_like(bp, dout, "dout", "the gradient of the forward's output");

  if (lse.rank() != 3 || lse.dim(0) != p.B || lse.dim(1) != p.Hq || lse.dim(2) != p.Tq)
    throw Error(ErrorCode::shape_mismatch,
                "lse: expected shape [B=" + std::to_string(p.B) + ", Hq=" + std::to_string(p.Hq) + ", Tq=" +
                    std::to_string(p.Tq) + "] (the forward's log-sum-exp: call it with return_lse), got " +
                    (lse.empty() ? std::string("none") : shape_string(lse.shape())));
  require_float(lse, "lse");
  if (lse.dtype() == DType::f32 && lse.is_contiguous()) {
    bp.lse = lse.data_as<float>();
  } else {
    bp.owned.push_back(Tensor::copy_of(lse, DType::f32));
    bp.lse = bp.owned.back().data_as<float>();
  }

  if (p.bias) {  // a stride of 0 is a broadcast dimension (see make_problem)
    bp.bias_B = p.bias_stride_b == 0 ? 1 : p.B;
    bp.bias_H = p.bias_stride_h == 0 ? 1 : p.Hq;
  }
  return bp;
}

GradientBuffers allocate_gradient_buffers(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  GradientBuffers g;
  g.dq = Tensor(p.dtype, {p.B, p.Tq, p.Hq, p.D});
  g.dk = Tensor(p.dtype, {p.B, p.Tk, p.Hkv, p.D});
  g.dv = Tensor(p.dtype, {p.B, p.Tk, p.Hkv, p.Dv});
  if (p.sinks) g.dsinks = Tensor(DType::f32, {p.Hq});
  if (p.bias) g.dbias = Tensor(DType::f32, {bp.bias_B, bp.bias_H, p.Tq, p.Tk});
  return g;
}

double backward_flops(const AttentionProblem& p, double visible_pairs_per_head) {
  return 2.5 * attention_flops(p, visible_pairs_per_head);
}

}  // namespace attnops
