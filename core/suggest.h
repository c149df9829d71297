// "Did you mean ...?" for misspelt names (operators, YAML keys): the candidate with the smallest
// edit distance, if it is close enough to be a plausible typo.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnops {

std::size_t edit_distance(std::string_view a, std::string_view b);
// The nearest candidate within max(2, len/3) edits, or nullopt.
std::optional<std::string> nearest_name(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace attnops
