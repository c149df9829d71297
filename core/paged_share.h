// Shared splits of a ragged batch (plan_paged, PagedAttentionOptions::share_prefixes): the
// splits of stream sequences whose keys lie in the same pages, each to be read once for the q
// rows of all of them. Internal to core/.
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/ext/paged_problem.h"

namespace attnops::paged_share {

// One shared split: keys [kv_begin, kv_end), members d.members[member_begin, + member_count).
struct Group {
  std::int64_t kv_begin = 0, kv_end = 0;
  std::int32_t member_begin = 0, member_count = 0;
};

// Most sequences one shared item serves: a longer group becomes several items (each reads the
// keys once, from the caches after the first), so that a machine with many cores still has
// items to spread.
inline constexpr std::int32_t kMaxMembers = 16;

// Finds the shared splits of d's stream sequences (d's per-sequence fields and unions filled,
// d.is_stream and d.num_splits too): appends the members to d.members, sets d.in_shared, and
// writes covered[s] = how many leading splits of sequence s are in shared items (0 for most).
// A split is shared by sequences that have it (the same split index, the same key range) in the
// same pages and all of whose rows see all of it; a group starts at the sequences' first split
// and goes on while at least two of them keep agreeing. Cost: O(stream sequences) hash probes,
// plus the page ids compared inside groups.
std::vector<Group> find(PagedPlanData& d, std::vector<std::int32_t>& covered);

}  // namespace attnops::paged_share
