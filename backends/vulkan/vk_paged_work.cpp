#include "backends/vulkan/vk_paged_work.h"

#include <algorithm>

#include "attnops/ext/paged_problem.h"

namespace attnops::vulkan::paged {

namespace {
using i64 = std::int64_t;

std::uint32_t pow2_ceil(std::uint64_t x) {
  std::uint32_t p = 1;
  while (p < x) p *= 2;
  return p;
}
}  // namespace

std::optional<DecodeTiles> decode_tiles(const DeviceDesc& dev, const PagedProblem& p, std::string* why) {
  const std::uint32_t sg = std::max<std::uint32_t>(1, dev.subgroup_size);
  const std::uint32_t sg_min = dev.min_subgroup_size ? dev.min_subgroup_size : sg;
  const std::uint32_t sg_max = dev.max_subgroup_size ? dev.max_subgroup_size : sg;
  const bool fixed = sg_min == sg_max && sg == sg_min;
  if (!dev.subgroup_shuffle || !(dev.full_subgroups || fixed)) {
    *why =
        "needs subgroup shuffles and full subgroups or a single subgroup size (teams are numbered by lane)";
    return std::nullopt;
  }
  if (p.D > 512 || p.Dv > 512) {
    *why = "head dims up to 512";
    return std::nullopt;
  }
  DecodeTiles t;
  const std::uint64_t dmax = static_cast<std::uint64_t>(std::max(p.D, p.Dv));
  t.ds = std::min<std::uint32_t>({std::min<std::uint32_t>(sg_min, 32), pow2_ceil((dmax + 7) / 8)});
  t.wg = std::max<std::uint32_t>(std::min<std::uint32_t>(128, 4 * sg_max), sg_max);
  if (t.wg > dev.max_invocations || t.wg > dev.max_group_size_x) t.wg = sg_max;
  t.dk8 = static_cast<std::uint32_t>((p.D + 8 * t.ds - 1) / (8 * t.ds));
  t.dv8 = static_cast<std::uint32_t>((p.Dv + 8 * t.ds - 1) / (8 * t.ds));
  // q and o per lane and row (floats): a GPU keeps about 64 of them per row in registers.
  const std::uint32_t state = (t.dk8 + t.dv8) * 8u;
  t.rows = std::max<std::uint32_t>(1, std::min<std::uint32_t>(4, 64 / std::max<std::uint32_t>(state, 1)));
  std::int64_t most = 1;  // the most rows of a stream sequence (per kv head)
  for (std::int64_t s = 0; s < p.batch->S; ++s)
    if (p.batch->is_stream[static_cast<std::size_t>(s)])
      most = std::max(most, p.group() * p.batch->q_len[static_cast<std::size_t>(s)]);
  t.rows = std::min(t.rows, pow2_ceil(static_cast<std::uint64_t>(most)));
  t.max_subgroups = t.wg / sg_min;
  const auto shared = [&](std::uint32_t r) {
    return static_cast<std::uint64_t>(t.max_subgroups) * r * (8u * t.ds * t.dv8 + 2u) * 4u;
  };
  while (t.rows > 1 && shared(t.rows) > dev.shared_memory_bytes) t.rows /= 2;
  if (shared(t.rows) > dev.shared_memory_bytes) {
    *why = "shared memory";
    return std::nullopt;
  }
  t.full_subgroups = dev.full_subgroups && t.wg % sg_max == 0;
  return t;
}

WorkList build_work(const PagedPlanData& d, std::int64_t G, const DecodeTiles* decode) {
  WorkList w;
  w.row_slots.assign(static_cast<std::size_t>(2 * d.N), 0);
  w.row_ranges.assign(static_cast<std::size_t>(2 * d.N), 0);
  const i64 T = std::max<i64>(d.split_tokens, 1);
  const auto push = [&](i64 n, i64 pages, i64 kb, i64 ke) {
    for (i64 v : {n, pages, kb, ke}) w.tasks.push_back(static_cast<std::int32_t>(v));
  };
  // Pass 1: the tasks of paged_attn (their slots first), every row's range.
  for (i64 s = 0; s < d.S; ++s) {
    const auto us = static_cast<std::size_t>(s);
    const bool unit_rows = decode != nullptr && d.is_stream[us];
    for (i64 i = 0; i < d.q_len[us]; ++i) {
      const i64 n = d.q_begin[us] + i;
      const KeyRange r = visible_keys(d, s, i);
      w.row_ranges[static_cast<std::size_t>(2 * n)] = static_cast<std::int32_t>(r.lo);
      w.row_ranges[static_cast<std::size_t>(2 * n + 1)] = static_cast<std::int32_t>(std::max(r.lo, r.hi));
      if (unit_rows) continue;
      const i64 first = w.num_tasks();
      if (r.lo < r.hi) {
        if (d.is_stream[us]) {
          for (i64 k = r.lo / T; k * T < r.hi; ++k)
            push(n, d.page_begin[us], std::max(r.lo, k * T), std::min(r.hi, (k + 1) * T));
        } else {
          push(n, d.page_begin[us], r.lo, r.hi);
        }
      }
      w.row_slots[static_cast<std::size_t>(2 * n)] = static_cast<std::int32_t>(first);
      w.row_slots[static_cast<std::size_t>(2 * n + 1)] = static_cast<std::int32_t>(w.num_tasks() - first);
    }
  }
  w.slots = w.num_tasks();
  if (decode == nullptr) return w;
  // Pass 2: stream sequences as units, a slot per (row, split).
  const i64 R = decode->rows;
  for (i64 s = 0; s < d.S; ++s) {
    const auto us = static_cast<std::size_t>(s);
    if (!d.is_stream[us]) continue;
    const KeyRange u = d.unions[us];
    const i64 ql = d.q_len[us], splits = d.num_splits[us];
    for (i64 i = 0; i < ql; ++i) {
      const i64 n = d.q_begin[us] + i;
      w.row_slots[static_cast<std::size_t>(2 * n)] = static_cast<std::int32_t>(w.slots);
      w.row_slots[static_cast<std::size_t>(2 * n + 1)] = static_cast<std::int32_t>(splits);
      w.slots += splits;
    }
    const i64 first = u.lo / T;
    for (i64 k = first; k < first + splits; ++k)
      for (i64 row0 = 0; row0 < G * ql; row0 += R)
        for (i64 v : {d.q_begin[us], ql, d.page_begin[us], k - first, std::max(u.lo, k * T),
                      std::min(u.hi, (k + 1) * T), row0, i64{0}})
          w.units.push_back(static_cast<std::int32_t>(v));
  }
  return w;
}

}  // namespace attnops::vulkan::paged
