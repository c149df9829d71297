// The exactness matrix of distributed attention, run by every rank of a world (in-process ranks
// in test_dist, MPI ranks in test_dist_mpi): every rank builds the same full problem, runs the
// single-process call and the fp64 oracle (forward and backward), takes its shards, runs ring or
// ulysses forward and backward, and compares its rows.
//
// Criterion, per quantity (out, lse, dq, dk, dv, dsinks) over this rank's rows: the distributed
// result's max error against the oracle is at most twice the single-process call's error on the
// same rows, plus 1e-7 * max(1, max |oracle|) for quantities where both are at rounding level;
// -inf lse exactly where the oracle has -inf; no NaN or inf anywhere else. With one rank the
// distributed results equal the single-process ones bitwise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/dist/communicator.h"
#include "attnops/dist/layout.h"
#include "attnops/mask.h"
#include "attnops/options.h"

namespace attnops::dist::testing {

struct DistCase {
  std::string name;
  std::int64_t B = 1, Tq = 45, Tk = 45, Hq = 4, Hkv = 4, D = 16, Dv = 16;
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  bool segments = false;
  bool masked_row = false;  // one query row whose segment id no key has (needs segments)
  std::optional<double> soft_cap;
  bool sinks = false;
  std::optional<Mask> mask;
  std::optional<Layout> layout;
};

// The matrix for a world of P ranks (heads chosen so that ulysses divides them: Hq % P == 0 and
// Hkv % P == 0 or P % Hkv == 0, GQA ratios 1, 2 and 4).
std::vector<DistCase> matrix(int P);

struct Report {
  bool ok = true;
  std::string message;  // what failed, with the errors; empty when ok
};

// Runs `op` ("ring" or "ulysses") on this rank for case c. Collective.
Report check_case(Communicator& comm, const std::string& op, const DistCase& c);

// Every case of matrix(P) for op; the reports of the failed ones joined ("" when all passed).
std::string check_matrix(Communicator& comm, const std::string& op);

}  // namespace attnops::dist::testing
