#include "cli/settings.h"

#include <algorithm>

#include "attnops/error.h"

namespace attnops::cli {

Config load_optional_config(const std::string& path) {
  if (path.empty()) return Config{};
  return load_config(path);
}

void apply_to_config(Config& config, const CallSettings& o) {
  if (o.backends) {
    config.backends = *o.backends;
    const auto named = [&](Backend b) {
      return std::find(o.backends->begin(), o.backends->end(), b) != o.backends->end();
    };
    if (config.disabled_backends) std::erase_if(*config.disabled_backends, named);
    for (auto& [name, op] : config.operators) {
      op.backends.reset();
      if (op.disabled_backends) std::erase_if(*op.disabled_backends, named);
    }
  }
  if (o.softmax_scale) config.softmax_scale = o.softmax_scale;
  if (o.num_threads) config.num_threads = o.num_threads;
  if (o.runtime_dtype) config.runtime_dtype = o.runtime_dtype;
}

}  // namespace attnops::cli
