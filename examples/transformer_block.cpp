// A small decoder block on attnops, the way model code uses it (EasyDeL style): the attention
// operator is named by the YAML config's attn_mechanism and fetched from the registry once; the
// block never says which kernel or backend runs - the returned decision does.
//
//   RMSNorm -> q/k/v projections (GQA: Hq=8, Hkv=2, D=32) -> RoPE -> attention -> output
//   projection -> residual -> RMSNorm -> SwiGLU MLP -> residual
//
// It runs a 512-token prefill, then 32 decode steps against a preallocated KV cache
// [B, Tmax, Hkv, D] read through TensorView slices (no copies), and prints which operator and
// backend each phase used: with attn_mechanism: blocksparse the prefill runs blocksparse and each
// decode step falls back to vanilla (reason decode). Two checks, exit status 1 on a mismatch:
//  - the prefill output equals the same block with attention forced to native
//    (metadata backends = {native});
//  - each decode step's output equals the matching row of a native prefill over all 544 tokens
//    (the KV cache gives the same answer as recomputing everything).
//
// usage: transformer_block [CONFIG.yaml]    (default: the project's config/default.yaml)
#include <Eigen/Core>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attnops/attnops.h"

#ifndef ATTNOPS_DEFAULT_CONFIG
#define ATTNOPS_DEFAULT_CONFIG "config/default.yaml"
#endif

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapMatrix = Eigen::Map<Matrix>;

constexpr int kDModel = 256, kHq = 8, kHkv = 2, kHeadDim = 32, kDff = 512;
constexpr int kPrefill = 512, kDecodeSteps = 32, kTmax = kPrefill + kDecodeSteps;

// Deterministic weights: uniform in [-scale, scale).
Matrix random_matrix(int rows, int cols, std::uint64_t seed, float scale) {
  Matrix m(rows, cols);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
  for (int i = 0; i < m.size(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    m.data()[i] = scale * (2.f * static_cast<float>(s >> 40) / 16777216.f - 1.f);
  }
  return m;
}

Matrix rms_norm(const Matrix& x, const Eigen::RowVectorXf& gain) {
  Matrix y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const float inv = 1.f / std::sqrt(x.row(i).squaredNorm() / static_cast<float>(x.cols()) + 1e-6f);
    y.row(i) = x.row(i).cwiseProduct(gain) * inv;
  }
  return y;
}

// Rotary embedding (rotate-half form) on rows of [T, H * D] at positions pos0, pos0 + 1, ...
void rope(Matrix& x, int heads, int pos0) {
  const int half = kHeadDim / 2;
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double freq = std::pow(10000.0, -2.0 * i / kHeadDim);
        const double angle = static_cast<double>(pos0 + t) * freq;
        const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
        float& a = x(t, h * kHeadDim + i);
        float& b = x(t, h * kHeadDim + half + i);
        const float a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
}

struct Weights {
  Matrix wq = random_matrix(kDModel, kHq* kHeadDim, 1, 1.f / 16);
  Matrix wk = random_matrix(kDModel, kHkv* kHeadDim, 2, 1.f / 16);
  Matrix wv = random_matrix(kDModel, kHkv* kHeadDim, 3, 1.f / 16);
  Matrix wo = random_matrix(kHq * kHeadDim, kDModel, 4, 1.f / 16);
  Matrix w1 = random_matrix(kDModel, kDff, 5, 1.f / 16);
  Matrix w3 = random_matrix(kDModel, kDff, 6, 1.f / 16);
  Matrix w2 = random_matrix(kDff, kDModel, 7, 1.f / 22);
  Eigen::RowVectorXf g1 = Eigen::RowVectorXf::Ones(kDModel), g2 = Eigen::RowVectorXf::Ones(kDModel);
};

// The KV cache: [B=1, Tmax, Hkv, D], written in place; attention reads slices [0, len).
struct KvCache {
  attnops::Tensor k{attnops::DType::f32, {1, kTmax, kHkv, kHeadDim}};
  attnops::Tensor v{attnops::DType::f32, {1, kTmax, kHkv, kHeadDim}};
  int len = 0;
};

struct StepResult {
  Matrix out;
  attnops::DispatchDecision decision;
};

// One block over rows x [T, d_model] at positions cache.len .. cache.len + T - 1.
StepResult block(const Weights& w, const attnops::Attention& attn, KvCache& cache, const Matrix& x) {
  const int T = static_cast<int>(x.rows()), pos0 = cache.len;
  const Matrix h = rms_norm(x, w.g1);
  Matrix q = h * w.wq, k = h * w.wk;
  const Matrix v = h * w.wv;
  rope(q, kHq, pos0);
  rope(k, kHkv, pos0);
  // Append k, v at rows [pos0, pos0 + T) of the cache ([1, Tmax, Hkv, D] row-major: a row of k
  // is exactly Hkv * D contiguous floats).
  MapMatrix(cache.k.data_as<float>(), kTmax, kHkv * kHeadDim).middleRows(pos0, T) = k;
  MapMatrix(cache.v.data_as<float>(), kTmax, kHkv * kHeadDim).middleRows(pos0, T) = v;
  cache.len += T;

  const attnops::TensorView qv(q.data(), attnops::DType::f32, {1, T, kHq, kHeadDim});
  const attnops::TensorView kv = cache.k.view().slice(1, 0, cache.len);
  const attnops::TensorView vv = cache.v.view().slice(1, 0, cache.len);
  attnops::AttentionOutput a = attn(qv, kv, vv, {.causal = true});  // bottom-right aligned
  const MapMatrix ctx(a.out.data_as<float>(), T, kHq * kHeadDim);

  Matrix y = x + ctx * w.wo;
  const Matrix h2 = rms_norm(y, w.g2);
  const Matrix gate = h2 * w.w1, up = h2 * w.w3;
  const Matrix act =
      (gate.array() / (1.f + (-gate.array()).exp())).matrix().cwiseProduct(up);  // SiLU(gate) * up
  y += act * w.w2;
  return {y, std::move(a.decision)};
}

std::string describe(const attnops::DispatchDecision& d) {
  std::string s = d.requested + (d.fell_back() ? " -> " + d.op : "") + " on " +
                  std::string(attnops::backend_name(d.backend));
  std::string reasons;
  for (const auto& r : d.reasons)
    reasons +=
        (reasons.empty() ? "" : "; ") + std::string(attnops::reason_code_name(r.code)) + ": " + r.detail;
  return reasons.empty() ? s : s + " (" + reasons + ")";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_example(int argc, char** argv) {
  try {
    const std::string config_path = argc > 1 ? argv[1] : ATTNOPS_DEFAULT_CONFIG;
    const attnops::Config config = attnops::load_config(config_path);
    const std::string mechanism = config.attn_mechanism.value_or("vanilla");
    const attnops::Attention attn = attnops::registry().get(mechanism, config);
    attnops::Config native_config = config;  // the same operator, attention forced to forward_native
    native_config.backends = std::vector<attnops::Backend>{attnops::Backend::native};
    native_config.operators.clear();
    const attnops::Attention attn_native = attnops::registry().get(mechanism, native_config);
    std::printf("config %s: attn_mechanism = %s\n", config_path.c_str(), mechanism.c_str());

    const Weights w;
    const Matrix tokens = random_matrix(kTmax, kDModel, 99, 1.f);  // embeddings of 544 tokens

    // Prefill: the first 512 tokens in one call.
    KvCache cache;
    auto t0 = std::chrono::steady_clock::now();
    const StepResult pre = block(w, attn, cache, tokens.topRows(kPrefill));
    std::printf("prefill: %d tokens in %.1f ms, attention %s\n", kPrefill, ms_since(t0),
                describe(pre.decision).c_str());

    // Decode: one token at a time against the cache.
    Matrix decoded(kDecodeSteps, kDModel);
    attnops::DispatchDecision decode_decision;
    t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < kDecodeSteps; ++s) {
      StepResult r = block(w, attn, cache, tokens.middleRows(kPrefill + s, 1));
      decoded.row(s) = r.out.row(0);
      decode_decision = std::move(r.decision);
    }
    std::printf("decode: %d steps in %.1f ms (%.2f ms/token), attention %s\n", kDecodeSteps, ms_since(t0),
                ms_since(t0) / kDecodeSteps, describe(decode_decision).c_str());

    // Check 1: the prefill against the same block with native attention.
    KvCache native_cache;
    const StepResult ref = block(w, attn_native, native_cache, tokens.topRows(kPrefill));
    const double prefill_diff = (pre.out - ref.out).cwiseAbs().maxCoeff();
    // Check 2: decode through the cache == a native prefill of all 544 tokens, last 32 rows.
    KvCache full_cache;
    const StepResult full = block(w, attn_native, full_cache, tokens);
    const double decode_diff = (decoded - full.out.bottomRows(kDecodeSteps)).cwiseAbs().maxCoeff();
    const double scale = ref.out.cwiseAbs().maxCoeff();
    // fp32 everywhere; the two attention paths round differently, the MLP passes that on.
    const double tol = 1e-4 * std::max(1.0, scale);
    std::printf("check: prefill vs native attention: max |diff| = %.3g (ran %s)\n", prefill_diff,
                describe(ref.decision).c_str());
    std::printf("check: decode via KV cache vs native prefill of %d tokens: max |diff| = %.3g\n", kTmax,
                decode_diff);
    if (!(prefill_diff <= tol) || !(decode_diff <= tol)) {
      std::printf("MISMATCH (tolerance %.3g)\n", tol);
      return 1;
    }
    std::printf("ok (tolerance %.3g)\n", tol);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

// The GPU state is released before main returns (never from a static destructor: gpu.h).
int main(int argc, char** argv) {
  const int status = run_example(argc, argv);
  attnops::release_gpu();
  return status;
}
