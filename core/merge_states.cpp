// merge_states: two attention states (normalised output and lse) of the same query rows over
// disjoint key sets, merged into the state over their union (cascade attention, FlashInfer's
// merge_state with natural logarithms).
//
// With M = max(lse_a, lse_b), w_x = e^(lse_x - M):  out = (w_a out_a + w_b out_b) / (w_a + w_b),
// lse = M + log(w_a + w_b). A state with lse -inf (no visible key) has weight 0 and contributes
// nothing (its out is never multiplied, so a NaN there cannot leak); both -inf give out 0 and lse
// -inf; a NaN lse makes the row NaN (the non-finite policy). Weights in fp64, values in fp32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "attnops/paged.h"

namespace attnops {

namespace {

using i64 = std::int64_t;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

void check_state(const TensorView& out, const TensorView& lse, const char* on, const char* ln) {
  for (auto [t, n] : {std::pair{&out, on}, std::pair{&lse, ln}}) {
    if (t->on_device())
      fail(ErrorCode::invalid_argument,
           std::string(n) + ": a device tensor; merge_states reads host tensors");
    if (!is_float(t->dtype()))
      fail(ErrorCode::unsupported_dtype,
           std::string(n) + ": expected f32, f16 or bf16, got " + std::string(dtype_name(t->dtype())));
    if (t->data() == nullptr && t->numel() != 0)
      fail(ErrorCode::invalid_argument, std::string(n) + ": null data pointer");
  }
  if (out.rank() != 3)
    fail(ErrorCode::shape_mismatch, std::string(on) + ": expected rank 3 [N, H, Dv], got " +
                                        (out.empty() ? std::string("none") : shape_string(out.shape())));
  if (lse.rank() != 2 || lse.dim(0) != out.dim(0) || lse.dim(1) != out.dim(1))
    fail(ErrorCode::shape_mismatch, std::string(ln) + ": expected shape [N=" + std::to_string(out.dim(0)) +
                                        ", H=" + std::to_string(out.dim(1)) + "] (from " + on + "), got " +
                                        (lse.empty() ? std::string("none") : shape_string(lse.shape())));
}

float load(const TensorView& t, i64 off) {
  return load_as_float(t.data(), t.dtype(), static_cast<std::size_t>(off));
}

}  // namespace

MergedState merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                         const TensorView& lse_b) {
  check_state(out_a, lse_a, "out_a", "lse_a");
  check_state(out_b, lse_b, "out_b", "lse_b");
  if (out_b.shape() != out_a.shape())
    fail(ErrorCode::shape_mismatch, "out_b: expected shape " + shape_string(out_a.shape()) +
                                        " (as out_a), got " + shape_string(out_b.shape()));
  const i64 N = out_a.dim(0), H = out_a.dim(1), Dv = out_a.dim(2);
  MergedState m{Tensor(out_a.dtype(), {N, H, Dv}), Tensor(DType::f32, {N, H})};
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<float> row(static_cast<std::size_t>(Dv));
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H; ++h) {
      const double la = load(lse_a, n * lse_a.stride(0) + h * lse_a.stride(1));
      const double lb = load(lse_b, n * lse_b.stride(0) + h * lse_b.stride(1));
      const double M = (la > lb || la != la) ? la : lb;  // NaN if either is NaN
      double lse = ninf;
      std::fill(row.begin(), row.end(), 0.f);
      if (std::isnan(M)) {
        lse = M;
        std::fill(row.begin(), row.end(), std::numeric_limits<float>::quiet_NaN());
      } else if (M != ninf) {
        // M = +inf (a state over an infinite logit) makes e^(x - M) NaN for the other: as IEEE.
        const double wa = la == ninf ? 0.0 : std::exp(la - M), wb = lb == ninf ? 0.0 : std::exp(lb - M);
        const double sum = wa + wb;
        lse = M + std::log(sum);
        const auto fa = static_cast<float>(wa / sum), fb = static_cast<float>(wb / sum);
        const i64 oa = n * out_a.stride(0) + h * out_a.stride(1),
                  ob = n * out_b.stride(0) + h * out_b.stride(1);
        for (i64 e = 0; e < Dv; ++e) {
          float x = 0.f;
          if (wa != 0.0) x += fa * load(out_a, oa + e * out_a.stride(2));
          if (wb != 0.0) x += fb * load(out_b, ob + e * out_b.stride(2));
          row[static_cast<std::size_t>(e)] = x;
        }
      }
      const i64 base = (n * H + h) * Dv;
      for (i64 e = 0; e < Dv; ++e)
        m.out.set(static_cast<std::size_t>(base + e), row[static_cast<std::size_t>(e)]);
      m.lse.data_as<float>()[n * H + h] = static_cast<float>(lse);
    }
  return m;
}

}  // namespace attnops
