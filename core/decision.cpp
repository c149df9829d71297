#include "attnops/decision.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace attnops {

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::native:
      return "native";
    case Backend::cpu:
      return "cpu";
    case Backend::gpu:
      return "gpu";
    case Backend::tpu:
      return "tpu";
  }
  return "?";
}

std::optional<Backend> parse_backend(std::string_view s) {
  for (Backend b : {Backend::native, Backend::cpu, Backend::gpu, Backend::tpu})
    if (backend_name(b) == s) return b;
  return std::nullopt;
}

std::string_view pass_name(Pass p) {
  return p == Pass::backward ? "backward" : "forward";
}

std::string_view reason_code_name(ReasonCode c) {
  switch (c) {
    case ReasonCode::decode:
      return "decode";
    case ReasonCode::non_causal:
      return "non_causal";
    case ReasonCode::seq_multiple:
      return "seq_multiple";
    case ReasonCode::backend_unavailable:
      return "backend_unavailable";
    case ReasonCode::not_implemented:
      return "not_implemented";
    case ReasonCode::unsupported_feature:
      return "unsupported_feature";
    case ReasonCode::unsupported_dtype:
      return "unsupported_dtype";
    case ReasonCode::disabled_by_config:
      return "disabled_by_config";
    case ReasonCode::gpu_error:
      return "gpu_error";
    case ReasonCode::cpu_faster:
      return "cpu_faster";
    case ReasonCode::selftest_failed:
      return "selftest_failed";
    case ReasonCode::forced_native:
      return "forced_native";
  }
  return "?";
}

std::optional<ReasonCode> parse_reason_code(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(ReasonCode::forced_native); ++i) {
    auto c = static_cast<ReasonCode>(i);
    if (reason_code_name(c) == s) return c;
  }
  return std::nullopt;
}

bool DispatchDecision::has(ReasonCode c) const {
  for (const auto& r : reasons)
    if (r.code == c) return true;
  return false;
}

namespace {
void json_string(std::ostringstream& os, std::string_view s) {
  os << '"';
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        os << "\\\"";
        break;
      case '\\':
        os << "\\\\";
        break;
      case '\n':
        os << "\\n";
        break;
      case '\t':
        os << "\\t";
        break;
      case '\r':
        os << "\\r";
        break;
      default:
        if (ch < 0x20) {
          static const char* hex = "0123456789abcdef";
          os << "\\u00" << hex[ch >> 4] << hex[ch & 15];
        } else {
          os << ch;
        }
    }
  }
  os << '"';
}
// A finite number as JSON (non-finite values become null).
std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}
// A setting the caller gave, in the fewest digits that read back as the same double (0.3, not
// 0.29999999999999999).
std::string exact(double v) {
  if (!std::isfinite(v)) return "null";
  std::string s;
  for (int digits = 15; digits <= 17; ++digits) {
    std::ostringstream os;
    os.precision(digits);
    os << v;
    s = os.str();
    if (std::strtod(s.c_str(), nullptr) == v) break;
  }
  return s;
}
}  // namespace

std::string DispatchDecision::to_json() const {
  std::ostringstream os;
  os << "{\"requested\": ";
  json_string(os, requested);
  os << ", \"operator\": ";
  json_string(os, op);
  os << ", \"backend\": ";
  json_string(os, backend_name(backend));
  os << ", \"reasons\": [";
  for (std::size_t i = 0; i < reasons.size(); ++i) {
    os << (i ? ", " : "") << "{\"code\": ";
    json_string(os, reason_code_name(reasons[i].code));
    os << ", \"detail\": ";
    json_string(os, reasons[i].detail);
    os << '}';
  }
  os << ']';
  if (!run.kernel.empty()) {
    os << ", \"kernel\": ";
    json_string(os, run.kernel);
    os << ", \"kernel_detail\": ";
    json_string(os, run.kernel_detail);
  }
  if (run.batch_invariant) os << ", \"batch_invariant\": true";
  if (run.shared_keys > 0) os << ", \"shared_keys\": " << run.shared_keys;
  if (!run.inputs.empty()) {
    os << ", \"inputs\": ";
    json_string(os, run.inputs);
    os << ", \"output\": ";
    json_string(os, run.output);
    os << ", \"bytes_to_device\": " << run.bytes_to_device << ", \"bytes_to_host\": " << run.bytes_to_host;
  }
  if (run.bytes_copied != 0) os << ", \"bytes_copied\": " << run.bytes_copied;
  if (run.timings) {
    const RunTimings& t = *run.timings;
    os << ", \"timings\": {\"device_timestamps\": " << (t.device_timestamps ? "true" : "false")
       << ", \"host_pack_ms\": " << num(t.host_pack_ms) << ", \"upload_ms\": " << num(t.upload_ms)
       << ", \"kernel_ms\": " << num(t.kernel_ms) << ", \"passes\": [";
    for (std::size_t i = 0; i < t.passes.size(); ++i) {
      os << (i ? ", " : "") << "{\"name\": ";
      json_string(os, t.passes[i].name);
      os << ", \"ms\": " << num(t.passes[i].ms) << '}';
    }
    os << "], \"download_ms\": " << num(t.download_ms) << ", \"host_unpack_ms\": " << num(t.host_unpack_ms)
       << ", \"wall_ms\": " << num(t.wall_ms) << '}';
  }
  if (cost) {
    os << ", \"cost\": {\"gpu_us\": " << num(cost->gpu_us) << ", \"cpu_us\": " << num(cost->cpu_us)
       << ", \"call_us\": " << num(cost->call_us) << ", \"upload_us\": " << num(cost->upload_us)
       << ", \"kernel_us\": " << num(cost->kernel_us) << ", \"download_us\": " << num(cost->download_us)
       << ", \"rates\": ";
    json_string(os, cost->rates_source);
    os << '}';
  }
  if (settings.any()) {
    os << ", \"settings\": {";
    const char* sep = "";
    if (settings.softmax_scale) {
      os << sep << "\"softmax_scale\": " << exact(*settings.softmax_scale);
      sep = ", ";
    }
    if (settings.runtime_dtype) {
      os << sep << "\"runtime_dtype\": ";
      json_string(os, dtype_name(*settings.runtime_dtype));
      sep = ", ";
    }
    if (settings.num_threads) {
      os << sep << "\"num_threads\": " << *settings.num_threads;
      sep = ", ";
    }
    if (settings.backends) {
      os << sep << "\"backends\": [";
      for (std::size_t i = 0; i < settings.backends->size(); ++i) {
        os << (i ? ", " : "");
        json_string(os, backend_name((*settings.backends)[i]));
      }
      os << ']';
    }
    os << '}';
  }
  if (pass == Pass::backward) os << ", \"pass\": \"backward\"";
  os << '}';
  return os.str();
}

std::string DispatchDecision::to_log_line() const {
  std::ostringstream os;
  os << (pass == Pass::backward ? "attnops,dispatch_backward," : "attnops,dispatch,") << requested;
  if (op != requested) os << "->" << op;
  os << ',' << backend_name(backend);
  if (!run.kernel.empty()) os << '/' << run.kernel;
  os << ',';
  for (std::size_t i = 0; i < reasons.size(); ++i)
    os << (i ? ";" : "") << reason_code_name(reasons[i].code) << ':' << reasons[i].detail;
  return os.str();
}

}  // namespace attnops
