// The Vulkan paged forward's work list (vk_paged.cpp), built on the host from the plan once per
// call, and the decode kernel's tiles for a device.
//
//   tile tasks   (paged_attn.comp) 4 ints each: (q row, index of the sequence's first page in
//                page_ids, kv_begin, kv_end): one query row of a tile sequence over the keys it
//                sees (and, where the decode kernel cannot run, every stream row's keys cut at the
//                split boundaries). Task t writes partial slot t.
//   decode units (paged_decode.comp) 8 ints each: (q_begin, q_len, first page index, split) and
//                (kv_begin, kv_end, first row, 0): up to `rows` rows of one split of a stream
//                sequence; row g * q_len + i of the unit is q head hk * G + g at query i.
//   row slots    per q row (first partial slot, count): a tile row's task, or one slot per split
//                of its stream sequence (the rows of a split that see none of its keys leave an
//                empty state there); paged_merge.comp merges a row's slots in split order.
//   row ranges   per q row, the keys [lo, hi) it sees.
// Every choice depends on the sequence alone (its splits at the plan's kv_split_tokens from key
// 0), so a sequence's result is bitwise the same alone or inside any batch on a device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/ext/paged_problem.h"
#include "backends/vulkan/vk_device_desc.h"

namespace attnops::vulkan::paged {

// paged_decode.comp's specialization for a device and problem.
struct DecodeTiles {
  std::uint32_t wg = 0;            // invocations per workgroup (whole subgroups)
  std::uint32_t ds = 0;            // lanes per key
  std::uint32_t rows = 0;          // rows per workgroup at most
  std::uint32_t dk8 = 0, dv8 = 0;  // 8-element chunks of q / k and v / o per lane
  std::uint32_t max_subgroups = 0;
  bool full_subgroups = false;  // the pipeline requires full subgroups
};
// The tiles, or nullopt with the reason (no subgroup shuffles, neither full subgroups nor one
// subgroup size, head dims past 512, shared memory).
std::optional<DecodeTiles> decode_tiles(const DeviceDesc& dev, const PagedProblem& p, std::string* why);

struct WorkList {
  std::vector<std::int32_t> tasks, units, row_slots, row_ranges;
  std::int64_t slots = 0;
  std::int64_t num_tasks() const { return static_cast<std::int64_t>(tasks.size() / 4); }
  std::int64_t num_units() const { return static_cast<std::int64_t>(units.size() / 8); }
};
// decode: the decode kernel's tiles (stream sequences become units), or null (they become tile
// tasks cut at their splits, the row-wise path).
WorkList build_work(const PagedPlanData& d, std::int64_t group, const DecodeTiles* decode);

}  // namespace attnops::vulkan::paged
