#include "verify/views.h"

#include <limits>

namespace attnops::verify {

std::string StorageLayout::text() const {
  if (!strided) return "contiguous";
  static const char* kNames = "BTH";
  std::string s;
  for (int d : perm) s += kNames[d];
  s += "D+pad(" + std::to_string(pad[0]) + "," + std::to_string(pad[1]) + "," + std::to_string(pad[2]) + ")";
  if (inner_stride > 1) s += "+inner_stride" + std::to_string(inner_stride);
  if (offset > 0) s += "+offset" + std::to_string(offset);
  return s;
}

StorageLayout draw_layout(Rng& rng) {
  StorageLayout l;
  l.strided = true;
  static const std::vector<std::array<int, 3>> kPerms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {2, 0, 1}};
  l.perm = rng.pick(kPerms);
  for (auto& p : l.pad) p = rng.chance(0.5) ? 0 : rng.uniform(1, 3);
  l.inner_stride = rng.chance(0.15) ? 2 : 1;
  l.offset = rng.chance(0.5) ? 0 : rng.uniform(1, 17);
  return l;
}

Placed place(DType dtype, const std::vector<std::int64_t>& shape, const StorageLayout& l,
             const std::vector<float>& values) {
  Placed r;
  if (!l.strided) {
    r.storage = Tensor(dtype, shape);
    for (std::size_t i = 0; i < values.size(); ++i) r.storage.set(i, values[i]);
    r.view = r.storage.view();
    return r;
  }
  // Storage dims: the outer three in perm order, each padded, then the innermost (strided).
  std::array<std::int64_t, 3> sdim{};
  for (int i = 0; i < 3; ++i)
    sdim[static_cast<std::size_t>(i)] = shape[static_cast<std::size_t>(l.perm[static_cast<std::size_t>(i)])] +
                                        l.pad[static_cast<std::size_t>(i)];
  const std::int64_t inner = shape[3] * l.inner_stride + (l.inner_stride > 1 ? 1 : 0);
  const std::int64_t total = l.offset + sdim[0] * sdim[1] * sdim[2] * inner;
  r.storage = Tensor(dtype, {std::max<std::int64_t>(1, total)});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 0; i < r.storage.numel(); ++i) r.storage.set(static_cast<std::size_t>(i), nan);
  // Element strides of the storage order, mapped back to the logical (B, T, H) dimensions.
  std::array<std::int64_t, 3> sstride{sdim[1] * sdim[2] * inner, sdim[2] * inner, inner};
  std::vector<std::int64_t> strides(4);
  for (int i = 0; i < 3; ++i)
    strides[static_cast<std::size_t>(l.perm[static_cast<std::size_t>(i)])] =
        sstride[static_cast<std::size_t>(i)];
  strides[3] = l.inner_stride;
  const char* base =
      static_cast<const char*>(r.storage.data()) + l.offset * static_cast<std::int64_t>(dtype_size(dtype));
  r.view = TensorView(base, dtype, shape, strides);
  std::size_t i = 0;
  for (std::int64_t a = 0; a < shape[0]; ++a)
    for (std::int64_t b = 0; b < shape[1]; ++b)
      for (std::int64_t c = 0; c < shape[2]; ++c)
        for (std::int64_t d = 0; d < shape[3]; ++d, ++i)
          r.storage.set(static_cast<std::size_t>(l.offset + a * strides[0] + b * strides[1] + c * strides[2] +
                                                 d * strides[3]),
                        values[i]);
  return r;
}

}  // namespace attnops::verify
