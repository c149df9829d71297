// The case grid of the tiled-kernel tests: a list of named explicit cases (each feature on its
// own, edge shapes) and a seeded random sample of feature combinations whose oracle cost is
// bounded, so that the whole suite stays fast in a Release build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/testing.h"

namespace attnops::tiled_test {

struct KernelCase {
  std::string name;  // a valid gtest name: letters, digits and '_'
  testing::CaseSpec spec;
  std::int64_t bq = 64, bk = 64;
  std::uint64_t seed = 1;
};

std::vector<KernelCase> explicit_cases();
// `count` random cases drawn with `seed` (same seed, same list).
std::vector<KernelCase> random_cases(int count, std::uint64_t seed);

}  // namespace attnops::tiled_test
