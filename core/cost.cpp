#include "attnops/cost.h"

#include <cstdio>
#include <sstream>

namespace attnops {

CostEstimate estimate_cost(const CostRates& r, double flops, double bytes_up, double bytes_down) {
  CostEstimate e;
  e.call_us = r.call_us;
  e.upload_us = r.upload_gbps > 0 ? bytes_up / (r.upload_gbps * 1e3) : 0;
  e.download_us = r.download_gbps > 0 ? bytes_down / (r.download_gbps * 1e3) : 0;
  e.kernel_us = r.gpu_gflops > 0 ? flops / (r.gpu_gflops * 1e3) : 0;
  e.gpu_us = e.call_us + e.upload_us + e.kernel_us + e.download_us;
  e.cpu_us = r.cpu_gflops > 0 ? flops / (r.cpu_gflops * 1e3) : 0;
  return e;
}

std::string format_rates(const CostRates& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "cpu_gflops=%.6g gpu_gflops=%.6g upload_gbps=%.6g download_gbps=%.6g call_us=%.6g",
                r.cpu_gflops, r.gpu_gflops, r.upload_gbps, r.download_gbps, r.call_us);
  return buf;
}

CostRates parse_rates(const std::string& text) {
  CostRates r;
  std::istringstream in(text);
  std::string item;
  while (in >> item) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) return {};
    const std::string key = item.substr(0, eq);
    double v = 0;
    try {
      std::size_t used = 0;
      v = std::stod(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1 || !(v >= 0)) return {};
    } catch (const std::exception&) {
      return {};
    }
    if (key == "cpu_gflops")
      r.cpu_gflops = v;
    else if (key == "gpu_gflops")
      r.gpu_gflops = v;
    else if (key == "upload_gbps")
      r.upload_gbps = v;
    else if (key == "download_gbps")
      r.download_gbps = v;
    else if (key == "call_us")
      r.call_us = v;
    else
      return {};
  }
  return r;
}

}  // namespace attnops
