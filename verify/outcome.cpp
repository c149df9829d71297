#include "verify/outcome.h"

#include <string_view>

namespace attnops::verify {

void Tally::merge(const Tally& o) {
  calls += o.calls;
  checks += o.checks;
  for (const auto& [k, n] : o.calls_by_target) calls_by_target[k] += n;
  for (const auto& [k, n] : o.skipped) skipped[k] += n;
}

std::optional<std::string> skip_reason(const Error& e) {
  const std::string_view msg = e.what();
  switch (e.code()) {
    case ErrorCode::unsupported_feature:
    case ErrorCode::unsupported_dtype:
    case ErrorCode::not_implemented:
      return std::string(error_code_name(e.code()));
    case ErrorCode::backend_unavailable:
      // The dispatcher's "no backend can run ...: <reasons>" when the one allowed backend refused
      // the inputs; a gpu that failed while running is a finding, not a skip.
      if (msg.find("gpu_error") != std::string_view::npos) return std::nullopt;
      for (const char* code : {"selftest_failed", "unsupported_feature", "unsupported_dtype",
                               "not_implemented", "backend_unavailable"})
        if (msg.find(std::string(code) + ":") != std::string_view::npos ||
            msg.find(std::string(code) + " ") != std::string_view::npos)
          return std::string(code);
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

namespace {

// Whether `k` is `name` or ends with ":name" (a distributed kernel, "ring(zigzag)+flash_attn2:avx2").
bool names(const std::string& k, std::string_view name) {
  if (k == name) return true;
  return k.size() > name.size() && k[k.size() - name.size() - 1] == ':' &&
         std::string_view(k).substr(k.size() - name.size()) == name;
}

}  // namespace

std::optional<Mismatch> check_decision(const Target& t, const DispatchDecision& d, const std::string& op_ran,
                                       bool* variant_refused, bool empty) {
  if (variant_refused) *variant_refused = false;
  if (d.backend != t.backend)
    return Mismatch{"decision", 0, 0,
                    "ran on " + std::string(backend_name(d.backend)) + ", not " +
                        std::string(backend_name(t.backend)) + ": " + d.to_json()};
  if (!op_ran.empty() && d.op != op_ran)
    return Mismatch{"decision", 0, 0, "operator " + d.op + " ran, not " + op_ran + ": " + d.to_json()};
  const std::string& k = d.run.kernel;
  if (empty && (k.empty() || names(k, backend_name(t.backend)))) return std::nullopt;
  if (t.backend == Backend::cpu) {
    if (!names(k, t.kernel))
      return Mismatch{"decision", 0, 0,
                      "ran ISA tier '" + k + "', asked for " + t.kernel + ": " + d.to_json()};
  }
  if (t.backend == Backend::gpu && t.kernel != "auto" && k.find(t.kernel) == std::string::npos) {
    if (variant_refused) *variant_refused = true;
  }
  return std::nullopt;
}

}  // namespace attnops::verify
