// Pipelines of a Device: the shared descriptor-set and pipeline layouts, shader modules from the
// embedded table (vk_shader_table.h), compute pipelines keyed by (shader, specialization
// constants, subgroup size) through the pipeline cache, and the cache file.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/vulkan/vk_device.h"
#include "core/cache_file.h"

namespace attnops::vulkan::rt {

std::string pipeline_cache_seed(const std::string& path, const PhysicalDevice& pd) {
  if (path.empty()) return {};
  CacheFileRead r = read_cache_file(path, kMaxPipelineCacheBytes);
  if (r.status == CacheFileRead::Status::missing) return {};
  const std::string what = "Vulkan pipeline cache";
  if (r.status != CacheFileRead::Status::ok) {
    warn_cache_file_once(what, path, r.why, "ignored (pipelines are compiled afresh)");
    return {};
  }
  // VkPipelineCacheHeaderVersionOne: headerSize, headerVersion (1), vendorID, deviceID (uint32
  // each), pipelineCacheUUID[16]. Data for another device or driver is dropped silently (it is
  // a stale cache, not a bad one); data without such a header never reaches the driver.
  std::uint32_t head[4] = {};
  if (r.bytes.size() >= 32) std::memcpy(head, r.bytes.data(), sizeof head);
  if (r.bytes.size() < 32 || head[0] < 32 || head[0] > r.bytes.size() || head[1] != 1) {
    warn_cache_file_once(what, path, "not a Vulkan pipeline cache (no VkPipelineCacheHeaderVersionOne)",
                         "ignored (pipelines are compiled afresh)");
    return {};
  }
  if (head[2] != pd.vendor_id || head[3] != pd.device_id ||
      std::memcmp(r.bytes.data() + 16, pd.cache_uuid, sizeof pd.cache_uuid) != 0)
    return {};
  return std::move(r.bytes);
}

void Device::create_pipeline_objects(const GpuSettings& settings) {
  // Pipeline cache, seeded from the file when there is a usable one (pipeline_cache_seed).
  const std::string blob = pipeline_cache_seed(settings.pipeline_cache, pd_);
  auto cci = make<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  cci.initialDataSize = blob.size();
  cci.pInitialData = blob.empty() ? nullptr : blob.data();
  VkPipelineCache cache = VK_NULL_HANDLE;
  if (vkCreatePipelineCache(device_, &cci, nullptr, &cache) != VK_SUCCESS) {
    cci.initialDataSize = 0;  // the driver refused the data: start empty
    cci.pInitialData = nullptr;
    check(vkCreatePipelineCache(device_, &cci, nullptr, &cache), "vkCreatePipelineCache");
  }
  cache_ = Owned<VkPipelineCache>(device_, cache, vkDestroyPipelineCache);

  VkDescriptorSetLayoutBinding bindings[kBindings];
  for (std::uint32_t b = 0; b < kBindings; ++b) {
    bindings[b] = VkDescriptorSetLayoutBinding{};
    bindings[b].binding = b;
    bindings[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    bindings[b].descriptorCount = 1;
    bindings[b].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  auto lci = make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  lci.bindingCount = kBindings;
  lci.pBindings = bindings;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  check(vkCreateDescriptorSetLayout(device_, &lci, nullptr, &set_layout), "vkCreateDescriptorSetLayout");
  set_layout_ = Owned<VkDescriptorSetLayout>(device_, set_layout, vkDestroyDescriptorSetLayout);

  if (pd_.caps.max_push_constants < kPushConstantBytes)
    throw Error(ErrorCode::gpu_error,
                "Vulkan: the device allows " + std::to_string(pd_.caps.max_push_constants) +
                    " bytes of push constants, the runtime needs " + std::to_string(kPushConstantBytes));
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  auto plci = make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  plci.setLayoutCount = 1;
  plci.pSetLayouts = &set_layout;
  plci.pushConstantRangeCount = 1;
  plci.pPushConstantRanges = &range;
  VkPipelineLayout pl = VK_NULL_HANDLE;
  check(vkCreatePipelineLayout(device_, &plci, nullptr, &pl), "vkCreatePipelineLayout");
  pipeline_layout_ = Owned<VkPipelineLayout>(device_, pl, vkDestroyPipelineLayout);
  modules_.resize(static_cast<std::size_t>(ShaderId::count_));
}

VkPipeline Device::pipeline(const PipelineKey& key) {
  check_usable();
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return it->second.get();
  const auto id = static_cast<std::size_t>(key.shader);
  if (id >= modules_.size()) throw Error(ErrorCode::internal, "Vulkan: unknown shader id");
  if (modules_[id].get() == VK_NULL_HANDLE) {
    const ShaderBlob& blob = shader_blob(key.shader);
    if (blob.words == 0)  // an optional shader this build's glslc could not compile
      throw Error(ErrorCode::unsupported_feature,
                  std::string("Vulkan: shader ") + blob.name + " is not compiled into this build");
    // The float controls the device supports, declared on the module (vk_spirv.h).
    FloatControls fc = pd_.caps.float_controls;
    if (const std::string v = env_string("ATTNOPS_VK_FLOAT_CONTROLS"); v == "0" || v == "off")
      fc = FloatControls{};
    std::string declared;
    const std::vector<std::uint32_t> code = with_float_controls(blob.code, blob.words, fc, &declared);
    if (!declared.empty() && key.shader != ShaderId::sgemm) float_controls_ = declared;
    auto sci = make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    sci.codeSize = code.size() * sizeof(std::uint32_t);
    sci.pCode = code.data();
    VkShaderModule mod = VK_NULL_HANDLE;
    check(vkCreateShaderModule(device_, &sci, nullptr, &mod), "vkCreateShaderModule");
    modules_[id] = Owned<VkShaderModule>(device_, mod, vkDestroyShaderModule);
  }
  if (key.subgroup_size != 0 && !pd_.caps.required_subgroup_size_compute)
    throw Error(ErrorCode::unsupported_feature,
                std::string("Vulkan: ") + shader_blob(key.shader).name + " asks for subgroup size " +
                    std::to_string(key.subgroup_size) + " and the device cannot require one for compute");
  if (key.spec_count > PipelineKey::kMaxSpec)
    throw Error(ErrorCode::internal, "Vulkan: too many specialization constants");
  VkSpecializationMapEntry entries[PipelineKey::kMaxSpec];
  for (std::uint32_t c = 0; c < key.spec_count; ++c) entries[c] = {c, c * 4u, 4u};
  VkSpecializationInfo spec{key.spec_count, entries, key.spec_count * 4u, key.spec.data()};
  auto ci = make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = modules_[id].get();
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = key.spec_count > 0 ? &spec : nullptr;
  auto required = make<VkPipelineShaderStageRequiredSubgroupSizeCreateInfo>(
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO);
  if (key.subgroup_size != 0) {
    required.requiredSubgroupSize = key.subgroup_size;
    ci.stage.pNext = &required;
  }
  if (key.full_subgroups && pd_.caps.compute_full_subgroups)
    ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
  ci.layout = pipeline_layout_.get();
  VkPipeline p = VK_NULL_HANDLE;
  check(vkCreateComputePipelines(device_, cache_.get(), 1, &ci, nullptr, &p), "vkCreateComputePipelines");
  count_created(Created::pipeline);
  pipelines_.emplace(key, Owned<VkPipeline>(device_, p, vkDestroyPipeline));
  cache_dirty_ = true;
  return p;
}

void Device::persist_cache(const std::string& path) {
  if (path.empty() || (!cache_dirty_ && path == saved_path_)) return;
  const std::string what = "Vulkan pipeline cache";
  std::string why;
  if (!cache_file_writable(path, &why)) {
    warn_cache_file_once(what, path, why, "not written");
    saved_path_ = path;  // do not try again for this path
    cache_dirty_ = false;
    return;
  }
  std::size_t size = 0;
  if (vkGetPipelineCacheData(device_, cache_.get(), &size, nullptr) != VK_SUCCESS || size == 0) return;
  std::string data(size, '\0');
  if (vkGetPipelineCacheData(device_, cache_.get(), &size, data.data()) != VK_SUCCESS) return;
  data.resize(size);
  // Write a new file beside the target, then rename it over: a concurrent reader never sees half
  // a file. A cache that cannot be written only costs compile time later, so it is reported, not
  // thrown.
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  bool ok = fd >= 0;
  for (std::size_t done = 0; ok && done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (fd >= 0) std::remove(tmp.c_str());
    warn_cache_file_once(what, path, std::strerror(errno), "not written");
    return;
  }
  saved_path_ = path;
  cache_dirty_ = false;
}

}  // namespace attnops::vulkan::rt
