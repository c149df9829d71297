// The backward's non-finite policy on the gpu (README, "Gradients"):
//
//   A masked pair (i, j) -- excluded by the static mask, by segment ids, or by a logit of -inf
//   (e.g. a -inf bias) -- contributes nothing to dq_i, dk_j, dv_j, dbias_ij or dsinks, even when
//   q_i, k_j, v_j or dout_i hold NaN or inf. Visible pairs follow IEEE arithmetic, as in the
//   forward: a NaN in dout_i, q_i, k_j or v_j reaches the gradients of the pairs that see it. A
//   row whose forward output is NaN has NaN gradients wherever that arithmetic puts them. A fully
//   masked row (lse = -inf) has zero dq and contributes nothing.
//
// Each case plants NaN or +-inf in one row of q or dout, or one key of k or v, chosen where masked
// pairs meet it inside a tile (the gpu backward works on groups of four keys / rows there), for
// every mask kind: causal, sliding window, chunked, segment ids, a mask object read as bitsets,
// and a -inf bias. The forward residuals are the fp64 oracle's (its forward policy); the expected
// gradients come from the policy itself, evaluated in fp64 below (IEEE arithmetic over exactly
// the visible pairs). Every element must have the expected class (NaN, +inf, -inf, finite) and
// finite ones must match within the backward's tolerance.
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/backward/grad_testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

double elem(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  const std::int64_t off = b * t.stride(0) + s * t.stride(1) + h * t.stride(2) + d;
  switch (t.dtype()) {
    case DType::f32:
      return static_cast<const float*>(t.data())[off];
    case DType::f16:
      return half_bits_to_float(static_cast<const std::uint16_t*>(t.data())[off]);
    default:
      return bf16_bits_to_float(static_cast<const std::uint16_t*>(t.data())[off]);
  }
}

// The policy in fp64: IEEE arithmetic over the visible pairs only (static mask, segments, and
// logits that are not -inf), fully masked rows skipped.
native::ReferenceGradients policy_backward(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const std::int64_t B = p.B, Tq = p.Tq, Tk = p.Tk, Hq = p.Hq, Hkv = p.Hkv, D = p.D, Dv = p.Dv;
  native::ReferenceGradients g;
  g.dq.assign(static_cast<std::size_t>(B * Tq * Hq * D), 0.0);
  g.dk.assign(static_cast<std::size_t>(B * Tk * Hkv * D), 0.0);
  g.dv.assign(static_cast<std::size_t>(B * Tk * Hkv * Dv), 0.0);
  if (p.sinks) g.dsinks.assign(static_cast<std::size_t>(Hq), 0.0);
  if (p.bias) g.dbias.assign(static_cast<std::size_t>(bp.bias_B * bp.bias_H * Tq * Tk), 0.0);
  const double ninf = -std::numeric_limits<double>::infinity();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Tq; ++i) {
        const double lse = bp.lse[(b * Hq + h) * Tq + i];
        if (lse == ninf) continue;  // fully masked row
        double lz = lse;
        if (p.sinks) {
          const double a = p.sinks[h], m = std::max(lse, a);
          lz = (std::isnan(lse) || std::isnan(a)) ? std::nan("")
                                                  : m + std::log(std::exp(lse - m) + std::exp(a - m));
        }
        double delta = 0;
        for (std::int64_t d = 0; d < Dv; ++d) delta += elem(bp.dout, b, i, h, d) * elem(bp.out, b, i, h, d);
        if (p.sinks) g.dsinks[static_cast<std::size_t>(h)] -= std::exp(p.sinks[h] - lz) * delta;
        for (std::int64_t j = 0; j < Tk; ++j) {
          if (!p.mask.visible(h, i, j, Tq, Tk)) continue;
          if (p.seg_q && p.seg_q[b * Tq + i] != p.seg_kv[b * Tk + j]) continue;
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += elem(p.q, b, i, h, d) * elem(p.k, b, j, hk, d);
          double x = dot * p.scale, t = 0;
          if (p.soft_cap) {
            t = std::tanh(x / *p.soft_cap);
            x = *p.soft_cap * t;
          }
          if (p.bias) x += p.bias_row(b, h, i)[j];
          if (x == ninf) continue;  // a -inf logit is a mask
          const double pr = std::exp(x - lz);
          double dp = 0;
          for (std::int64_t d = 0; d < Dv; ++d) dp += elem(bp.dout, b, i, h, d) * elem(p.v, b, j, hk, d);
          double ds = pr * (dp - delta);
          if (p.bias) {
            const std::int64_t bb = bp.bias_B == 1 ? 0 : b, hb = bp.bias_H == 1 ? 0 : h;
            g.dbias[static_cast<std::size_t>(((bb * bp.bias_H + hb) * Tq + i) * Tk + j)] += ds;
          }
          if (p.soft_cap) ds *= 1 - t * t;
          for (std::int64_t d = 0; d < D; ++d) {
            g.dq[static_cast<std::size_t>(((b * Tq + i) * Hq + h) * D + d)] +=
                p.scale * ds * elem(p.k, b, j, hk, d);
            g.dk[static_cast<std::size_t>(((b * Tk + j) * Hkv + hk) * D + d)] +=
                p.scale * ds * elem(p.q, b, i, h, d);
          }
          for (std::int64_t d = 0; d < Dv; ++d)
            g.dv[static_cast<std::size_t>(((b * Tk + j) * Hkv + hk) * Dv + d)] +=
                pr * elem(bp.dout, b, i, h, d);
        }
      }
    }
  return g;
}

enum class Cls { nan, pos_inf, neg_inf, finite };
Cls classify(double x) {
  if (std::isnan(x)) return Cls::nan;
  if (std::isinf(x)) return x > 0 ? Cls::pos_inf : Cls::neg_inf;
  return Cls::finite;
}
const char* cls_name(Cls c) {
  return c == Cls::nan ? "NaN" : c == Cls::pos_inf ? "+inf" : c == Cls::neg_inf ? "-inf" : "finite";
}

// Same class everywhere, finite values within tol * max(1, max |finite want|).
::testing::AssertionResult same_classes_and_values(const char* name, const Tensor& got,
                                                   const std::vector<double>& want, double tol) {
  if (static_cast<std::size_t>(got.numel()) != want.size())
    return ::testing::AssertionFailure() << name << ": " << got.numel() << " elements, want " << want.size();
  double scale = 1;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double v = got.at(i);
    if (classify(v) != classify(want[i]))
      return ::testing::AssertionFailure()
             << name << "[" << i << "] is " << cls_name(classify(v)) << " (" << v << "), the policy says "
             << cls_name(classify(want[i])) << " (" << want[i] << ")";
    if (std::isfinite(v) && std::abs(v - want[i]) > tol * scale)
      return ::testing::AssertionFailure() << name << "[" << i << "] = " << v << ", want " << want[i];
  }
  return ::testing::AssertionSuccess();
}

struct MaskKind {
  const char* name;
  Spec spec;
};

// Small problems: Tq = Tk = 40 (a full and a partial 32-tile), GQA 2:1, f32 head dim 8 (rows of
// whole 16-byte vectors: the four-at-a-time paths), plus one head dim of 5 (row by row).
std::vector<MaskKind> mask_kinds(std::int64_t D, DType dt) {
  const auto base = [&] { return Spec().shape(1, 40, 40).heads(4, 2).dim(D).dtype(dt); };
  std::vector<MaskKind> kinds;
  kinds.push_back({"causal", base().causal(true).sinks()});
  kinds.push_back({"sliding_window", base().causal(false).window(5, 2).bias()});
  kinds.push_back({"causal_window", base().causal(true).window(6, 0).soft_cap(5.0)});
  kinds.push_back({"chunked", base().causal(false).chunk(7)});
  kinds.push_back({"segments", base().causal(false).segments().sinks()});
  kinds.push_back({"mask_bitsets", base().causal(false).mask(Mask::local(3, 1) | Mask::local(0, 9))});
  kinds.push_back({"minus_inf_bias", base().causal(false).bias()});
  return kinds;
}

// Where to plant: a row / key index, and which tensor.
struct Plant {
  const char* what;  // "q", "k", "v", "dout"
  std::int64_t index;
  float value;
};

void plant(Case& c, Tensor& dout, const Plant& pl) {
  Tensor& t = std::string(pl.what) == "q"   ? c.q
              : std::string(pl.what) == "k" ? c.k
              : std::string(pl.what) == "v" ? c.v
                                            : dout;
  const std::int64_t H = t.dim(2), Dx = t.dim(3);
  const std::int64_t h = std::string(pl.what) == "q" || std::string(pl.what) == "dout" ? 1 : 0;
  for (std::int64_t d = 0; d < Dx; ++d) {
    const std::size_t at = static_cast<std::size_t>((pl.index * H + h) * Dx + d);
    // Inf in one element only (the others finite): its sign then reaches the logits as +-inf.
    if (std::isinf(pl.value) && d > 0) continue;
    t.set(at, pl.value);
  }
}

using VulkanBackwardNonFinite = VulkanTest;

void run_cases(std::int64_t D, DType dt) {
  const std::vector<Plant> plants = {
      {"k", 13, kNaN},   {"k", 30, kNaN},    {"v", 13, kNaN}, {"v", 30, kNaN}, {"q", 9, kNaN},
      {"dout", 9, kNaN}, {"dout", 33, kNaN}, {"k", 13, kInf}, {"v", 21, kInf}, {"q", 17, -kInf},
  };
  int ran = 0;
  for (const MaskKind& kind : mask_kinds(D, dt))
    for (const Plant& pl : plants) {
      Case c = make_case(kind.spec, 77);
      if (std::string(kind.name) == "minus_inf_bias") {
        // -inf on a band of pairs (every pair of key 13, of row 9 against keys 0..20, and a
        // scattered pattern): masks as the static mask does.
        float* bias = c.bias->data_as<float>();
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < c.Tq; ++i)
            for (std::int64_t j = 0; j < c.Tk; ++j)
              if (j == 13 || (i == 9 && j <= 20) || (i * 7 + j * 3) % 5 == 0)
                bias[((h * c.Tq) + i) * c.Tk + j] = -kInf;
      }
      if (std::string(kind.name) == "segments") {
        auto* sq = c.seg_q->data_as<std::int32_t>();
        auto* sk = c.seg_kv->data_as<std::int32_t>();
        for (std::int64_t t = 0; t < 40; ++t) sq[t] = sk[t] = static_cast<std::int32_t>(t / 6);
        sk[13] = 99;  // key 13 is seen by no row, in a tile of keys that others see
      }
      Tensor dout = random_tensor(dt, {c.B, c.Tq, c.Hq, c.Dv}, 91);
      plant(c, dout, pl);
      std::ostringstream label;
      label << kind.name << ", " << pl.what << "[" << pl.index << "] = " << pl.value << ", D=" << D << " "
            << dtype_name(dt);
      SCOPED_TRACE(label.str());
      // The forward residuals from the fp64 oracle (its forward policy), as a forward would give.
      const AttentionProblem fp = problem_for(c, 32, 32);
      AttentionProblem with_lse = fp;
      with_lse.want_lse = true;
      AttentionBuffers fwd = allocate_buffers(with_lse);
      native::reference_attention(with_lse, fwd);
      const BackwardProblem bp =
          make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, c.options, OperationMetadata{});
      GradientBuffers got = allocate_gradient_buffers(bp);
      vulkan::run_backward(bp, software_ok(), got);
      const native::ReferenceGradients want = policy_backward(bp);
      const double tol = gradient_tolerance(dt);
      EXPECT_TRUE(same_classes_and_values("dq", got.dq, want.dq, tol));
      EXPECT_TRUE(same_classes_and_values("dk", got.dk, want.dk, tol));
      EXPECT_TRUE(same_classes_and_values("dv", got.dv, want.dv, tol));
      if (got.dsinks) {
        EXPECT_TRUE(same_classes_and_values("dsinks", *got.dsinks, want.dsinks, tol));
      }
      if (got.dbias) {
        EXPECT_TRUE(same_classes_and_values("dbias", *got.dbias, want.dbias, tol));
      }
      ++ran;
    }
  EXPECT_EQ(ran, 70);
}

TEST_F(VulkanBackwardNonFinite, MaskedPairsStopNaNAndInfVectorRows) {
  run_cases(8, DType::f32);
}
TEST_F(VulkanBackwardNonFinite, MaskedPairsStopNaNAndInfRowByRow) {
  run_cases(5, DType::f32);
}
TEST_F(VulkanBackwardNonFinite, MaskedPairsStopNaNAndInfBf16) {
  run_cases(16, DType::bf16);
}

}  // namespace
}  // namespace attnops::testing
