// libFuzzer target: the YAML config loader (attnops::parse_config, as load_config calls it).
// Contract: parse, or Error(config_error) whose message starts "fuzz.yaml:LINE:COL: " (1-based);
// a parsed config merges into every built-in operator's metadata, or fails with config_error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "attnops/config.h"
#include "attnops/metadata.h"
#include "fuzz/fuzz_contract.h"

namespace {

// "fuzz.yaml:LINE:COL: message", LINE and COL positive decimal numbers without leading zeros.
bool has_position_prefix(std::string_view m) {
  constexpr std::string_view kSource = "fuzz.yaml:";
  if (!m.starts_with(kSource)) return false;
  m.remove_prefix(kSource.size());
  for (int field = 0; field < 2; ++field) {
    std::size_t digits = 0;
    while (digits < m.size() && m[digits] >= '0' && m[digits] <= '9') ++digits;
    if (digits == 0 || m[0] == '0' || digits >= m.size() || m[digits] != ':') return false;
    m.remove_prefix(digits + 1);
  }
  return m.size() > 1 && m[0] == ' ';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnops;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Config c;
  try {
    c = parse_config(text, "fuzz.yaml");
  } catch (const Error& e) {
    fuzz::check_error(e, ErrorCode::config_error, "fuzz.yaml");
    if (!has_position_prefix(e.what())) fuzz::contract_violation("no FILE:LINE:COL: prefix", e.what());
    return 0;
  }
  // The built-in operators, canonical name and aliases (registry/builtin.cpp).
  struct Op {
    const char* name;
    std::vector<std::string> aliases;
  };
  for (const Op& op : {Op{"vanilla", {}}, Op{"blocksparse", {"splash"}}, Op{"flash_attn2", {"flash"}}}) {
    try {
      c.metadata_for(op.name, op.aliases, OperationMetadata{});
    } catch (const Error& e) {
      // A section under the canonical name and another under an alias: found only here.
      fuzz::check_error(e, ErrorCode::config_error, "fuzz.yaml");
    }
  }
  return 0;
}
