// One dense case on every ring / ulysses target: the ranks as threads of this process
// (attnops/dist/local_communicator.h), each with its shards of q, k, v, dout and the segment ids,
// the outputs gathered and checked against the fp64 oracle of the whole problem (forward and
// backward). The case's bias and weights are dropped (the distributed operators refuse them);
// the rank count, layout, local operator, progress granularity and the transport's eager limit
// are drawn per case. Tolerances: twice the dtype's for f32, (P + 1) times for f16 / bf16, whose
// partial outputs are rounded before each of the P merges (README, Beyond one machine); with one
// rank the result must equal the local operator's own call bitwise.
#pragma once

#include <string>
#include <vector>

#include "verify/dense_problem.h"
#include "verify/outcome.h"

namespace attnops::verify {

struct DistSpec {
  int ranks = 1;
  std::string layout;          // "" (the operator's default), "contiguous", "zigzag"
  std::string local_operator;  // what each rank runs
  std::int64_t progress_rows = 1024;
  std::size_t eager_limit = 0;
  std::string describe() const;
};

DistSpec draw_dist(const DenseSpec& spec, const std::string& op);

std::vector<Finding> run_dist(const RunSettings& rs, const DenseSpec& spec,
                              const std::vector<Target>& targets, Tally& tally);

}  // namespace attnops::verify
