// The tile shapes of each kernel variant for a problem on a device (vk_kernel_select.h calls
// them in its order of preference): pure functions of the device description and the problem,
// each returning the tiles or nullopt with the reason the variant cannot run it. Internal to
// backends/vulkan (the selection and its tests see them through select_kernel).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/vulkan/vk_kernel_select.h"

namespace attnops::vulkan {

inline std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}
// The narrowest and widest subgroup a pipeline may get on `dev` (the default size when the
// driver reports no range).
std::uint32_t min_subgroup(const DeviceDesc& dev);
std::uint32_t max_subgroup(const DeviceDesc& dev);

// flash_subgroup (flash_tiled.comp).
std::optional<SubgroupTiles> subgroup_tiles(const DeviceDesc& dev, const ProblemShape& p,
                                            const KernelOverride& force, std::string* why);
// flash_decode (flash_decode.comp).
std::optional<DecodeTiles> decode_tiles(const DeviceDesc& dev, const ProblemShape& p,
                                        const KernelOverride& force, std::string* why);
// flash_coopmat_* (flash_coopmat.comp); `shapes`: the extension's listed subgroup shapes.
std::optional<CoopTiles> coop_tiles(const DeviceDesc& dev, const std::vector<CoopMatShape>& shapes,
                                    const ProblemShape& p, std::string* why);

}  // namespace attnops::vulkan
