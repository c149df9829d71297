#include "cli/decision_text.h"

namespace attnops::cli {

std::string reason_codes(const DispatchDecision& d) {
  std::string s;
  for (const Reason& r : d.reasons) {
    if (!s.empty()) s += ',';
    s += reason_code_name(r.code);
  }
  return s;
}

}  // namespace attnops::cli
