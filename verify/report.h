// How a failure is told: one line with everything needed to act on it (seed, case, target,
// shapes and options, the error against its tolerance, the replay command), and on request the
// case's inputs as .npy files with an `attnops run` command that reruns it outside the fuzzer.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "attnops/tensor.h"
#include "verify/dense_problem.h"
#include "verify/outcome.h"
#include "verify/paged_problem.h"

namespace attnops::verify {

using Shape7 = std::array<std::int64_t, 7>;  // B, Tq, Tk, Hq, Hkv, D, Dv

// The flags that change what a case draws (--work, --max-seq, --no-nonfinite) where `l` is not
// the default: a replay needs them to draw the same case.
std::string limits_flags(const Limits& l);

// `attnops verify --replay SEED:CASE <target flags> <limits flags> [--shape B,Tq,Tk,Hq,Hkv,D,Dv]`.
std::string replay_command(std::uint64_t seed, std::uint64_t index, const Target& t, const Limits& limits,
                           const std::optional<Shape7>& shape = std::nullopt);

// "MISMATCH seed=S case=C <target> | <problem> | <mismatch> | replay: <command>"
std::string failure_line(std::uint64_t seed, std::uint64_t index, const Finding& f, const Limits& limits);

Shape7 shape_of(const DenseSpec& s);

// Writes a case's inputs into `dir` (created by the caller) with `save(path, tensor)` and returns
// the `attnops run` command that reproduces it (with the environment it needs first), plus a note
// for what flags cannot express (Mask objects, strided views).
using SaveNpy = std::function<void(const std::string& path, const TensorView& t)>;
using SaveText = std::function<void(const std::string& path, const std::string& text)>;
std::string save_dense_case(const DenseSpec& s, const Target& t, const std::string& dir, const SaveNpy& save,
                            const SaveText& save_text);
std::string save_paged_case(const PagedSpec& s, const Target& t, const std::string& dir, const SaveNpy& save);

}  // namespace attnops::verify
