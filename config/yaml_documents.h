// Every document of a YAML stream, as YAML::LoadAll returns them, but guaranteed to terminate.
//
// yaml-cpp 0.7 (Debian 12) loops forever in LoadAll on some malformed streams, allocating as it
// goes: after "{}," no rule consumes the ',', so every further document is an empty one at the
// same position (upstream yaml-cpp bug 1040, fixed after 0.7).
// load_yaml_documents first walks the stream with an event handler that builds nothing and
// throws YAML::ParserException at the position where the parser stops advancing; then LoadAll.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace attnops {

std::vector<YAML::Node> load_yaml_documents(const std::string& text);

}  // namespace attnops
