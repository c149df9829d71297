// Inputs as the callers of a library pass them: not always contiguous tensors, but views into
// larger storage (a slice of a KV cache, BHTD storage seen as BTHD, rows padded apart, an
// innermost dimension with a stride, which the library must copy). The storage around a view is
// filled with NaN, so a kernel that reads one element outside its view gets a NaN it cannot hide.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "attnops/tensor.h"
#include "verify/rng.h"

namespace attnops::verify {

struct StorageLayout {
  bool strided = false;
  std::array<int, 3> perm{0, 1, 2};   // storage order of the outer dimensions (B, T, H), outermost first
  std::array<std::int64_t, 3> pad{};  // extra extent of each outer dimension in storage
  std::int64_t inner_stride = 1;      // > 1: the innermost dimension is not contiguous
  std::int64_t offset = 0;            // elements before the view's first element
  std::string text() const;           // "BHTD+pad(0,3,1)" for descriptions
};

StorageLayout draw_layout(Rng& rng);

struct Placed {
  Tensor storage;
  TensorView view;
};

// A rank-4 view of `shape` in storage laid out as `l`, holding values[i] at logical flat index i
// (row-major over `shape`, rounded to `dtype`); every other storage element is NaN.
Placed place(DType dtype, const std::vector<std::int64_t>& shape, const StorageLayout& l,
             const std::vector<float>& values);

}  // namespace attnops::verify
