// The environment variables read once (include/attnops/environment.h). Each read makes an
// immutable snapshot; environment() returns the current one through an atomic pointer, and
// snapshots replaced by reload_environment() are kept (a caller may still hold a reference):
// a few hundred bytes per reload, which only tests do.
#include "attnops/environment.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/environment.h"
#include "core/printable.h"

namespace attnops {

namespace {

// A yes/no variable: 1, true, yes (on) or 0, false, no, empty (off), any case; anything else sets
// *error: a typo must not silently mean "on".
bool env_switch(const char* name, const char* value, std::string* error) {
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v.empty() || v == "0" || v == "false" || v == "no") return false;
  *error = std::string(name) + "='" + printable(value, 40) +
           "': expected 1, true or yes (on), or 0, false or no (off)";
  return false;
}

std::unique_ptr<EnvironmentSettings> read() {
  auto e = std::make_unique<EnvironmentSettings>();
  if (const char* s = std::getenv("ATTNOPS_FORCE_NATIVE"))
    e->force_native = env_switch("ATTNOPS_FORCE_NATIVE", s, &e->force_native_error);
  if (const char* s = std::getenv("ATTNOPS_LOG")) {
    const std::string v = std::string(",") + s + ",";
    e->log_dispatch = v.find(",dispatch,") != std::string::npos || v.find(",all,") != std::string::npos;
  }
  if (const char* s = std::getenv("ATTNOPS_PROFILE"))
    e->profile = *s != '\0' && std::string_view(s) != "0" && std::string_view(s) != "false";
  if (const char* s = std::getenv("ATTNOPS_CPU_ISA")) e->cpu_isa = std::string(s);
  return e;
}

struct Store {
  std::mutex mu;
  std::vector<std::unique_ptr<EnvironmentSettings>> all;  // every snapshot made (kept alive)
  std::atomic<const EnvironmentSettings*> current{nullptr};
  std::atomic<std::uint64_t> generation{0};  // all.size() once current is set

  const EnvironmentSettings* reload() {
    std::lock_guard lock(mu);
    all.push_back(read());
    generation.store(all.size(), std::memory_order_release);
    current.store(all.back().get(), std::memory_order_release);
    return all.back().get();
  }
};

// Never destroyed (no teardown in static destructors; a reference may be in use at exit).
Store& store() {
  static Store* s = new Store;
  return *s;
}

}  // namespace

bool EnvironmentSettings::forced_native() const {
  if (!force_native_error.empty()) throw Error(ErrorCode::invalid_argument, force_native_error);
  return force_native;
}

const EnvironmentSettings& environment() {
  Store& s = store();
  if (const EnvironmentSettings* e = s.current.load(std::memory_order_acquire)) return *e;
  std::lock_guard lock(s.mu);  // the first call: read once, whichever thread comes first
  if (const EnvironmentSettings* e = s.current.load(std::memory_order_acquire)) return *e;
  s.all.push_back(read());
  s.generation.store(1, std::memory_order_release);
  s.current.store(s.all.back().get(), std::memory_order_release);
  return *s.all.back();
}

std::uint64_t environment_generation() {
  environment();  // the first read is generation 1
  return store().generation.load(std::memory_order_acquire);
}

void reload_environment() {
  store().reload();
}

}  // namespace attnops
