// The Vulkan runtime: instance, validation messenger, device selection, contexts, pipelines.
#include "backends/vulkan/vk_runtime.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>

#include "backends/vulkan/spirv.h"
#include "backends/vulkan/vk_device_query.h"

namespace attnops::vulkan::rt {

std::string result_name(VkResult r) {
  switch (r) {
#define ATTNOPS_VK_CASE(x) \
  case x:                  \
    return #x;
    ATTNOPS_VK_CASE(VK_SUCCESS)
    ATTNOPS_VK_CASE(VK_NOT_READY)
    ATTNOPS_VK_CASE(VK_TIMEOUT)
    ATTNOPS_VK_CASE(VK_INCOMPLETE)
    ATTNOPS_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    ATTNOPS_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    ATTNOPS_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    ATTNOPS_VK_CASE(VK_ERROR_DEVICE_LOST)
    ATTNOPS_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    ATTNOPS_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    ATTNOPS_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    ATTNOPS_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    ATTNOPS_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    ATTNOPS_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    ATTNOPS_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    ATTNOPS_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    ATTNOPS_VK_CASE(VK_ERROR_UNKNOWN)
    ATTNOPS_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    ATTNOPS_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    ATTNOPS_VK_CASE(VK_ERROR_FRAGMENTATION)
    ATTNOPS_VK_CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    ATTNOPS_VK_CASE(VK_PIPELINE_COMPILE_REQUIRED)
    ATTNOPS_VK_CASE(VK_ERROR_VALIDATION_FAILED_EXT)
#undef ATTNOPS_VK_CASE
    default:
      return "VkResult(" + std::to_string(static_cast<int>(r)) + ")";
  }
}

void throw_vk(VkResult r, const std::string& what) {
  throw Error(ErrorCode::gpu_error, "Vulkan: " + what + " failed (" + result_name(r) + ")");
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s == "1" || s == "true" || s == "on" || s == "yes";
}

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

namespace {

// ---- validation message counters (read through vulkan_debug.h) ----
struct MessageLog {
  std::atomic<std::uint64_t> errors{0}, warnings{0}, sync{0};
  std::mutex mu;
  std::deque<std::string> recent;  // the last kKeep messages
  static constexpr std::size_t kKeep = 32;
};
MessageLog& message_log() {
  // Never destroyed: the messenger may still report while static destructors run.
  static MessageLog* log = new MessageLog;
  return *log;
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                          VkDebugUtilsMessageTypeFlagsEXT /*types*/,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data, void* /*user*/) {
  const bool error = (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) != 0;
  const bool warning = (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) != 0;
  const char* id = data->pMessageIdName != nullptr ? data->pMessageIdName : "";
  const bool sync = std::strncmp(id, "SYNC-", 5) == 0;
  if (error || warning || sync) {
    std::string text = std::string(error ? "error " : "warning ") + id + ": " +
                       (data->pMessage != nullptr ? data->pMessage : "");
    count_message(error, warning, sync, text);
  }
  return VK_FALSE;  // never abort the call that triggered the message
}

bool has_layer(const char* name) {
  std::uint32_t n = 0;
  if (vkEnumerateInstanceLayerProperties(&n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkLayerProperties> layers(n);
  if (vkEnumerateInstanceLayerProperties(&n, layers.data()) != VK_SUCCESS) return false;
  return std::any_of(layers.begin(), layers.end(),
                     [&](const auto& l) { return std::strcmp(l.layerName, name) == 0; });
}

bool has_instance_extension(const char* layer, const char* name) {
  std::uint32_t n = 0;
  if (vkEnumerateInstanceExtensionProperties(layer, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkExtensionProperties> ext(n);
  if (vkEnumerateInstanceExtensionProperties(layer, &n, ext.data()) != VK_SUCCESS) return false;
  return std::any_of(ext.begin(), ext.end(),
                     [&](const auto& e) { return std::strcmp(e.extensionName, name) == 0; });
}

std::string version_string(std::uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

std::string type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

// Preference among qualifying devices: discrete, integrated, virtual, other, software.
int type_rank(const std::string& type) {
  if (type == "discrete") return 0;
  if (type == "integrated") return 1;
  if (type == "virtual") return 2;
  if (type == "other") return 3;
  return 4;
}

PhysicalDevice describe(VkPhysicalDevice h, int index) {
  PhysicalDevice pd;
  pd.handle = h;
  VkPhysicalDeviceProperties props{};
  vkGetPhysicalDeviceProperties(h, &props);
  pd.api_version = props.apiVersion;
  GpuDeviceInfo& info = pd.info;
  info.index = index;
  info.name = props.deviceName;
  info.type = type_name(props.deviceType);
  info.software = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  info.api_version = version_string(props.apiVersion);
  info.max_shared_memory = props.limits.maxComputeSharedMemorySize;
  info.max_workgroup_invocations = props.limits.maxComputeWorkGroupInvocations;
  info.max_storage_buffer_range = props.limits.maxStorageBufferRange;
  for (int a = 0; a < 3; ++a) pd.max_group_count[a] = props.limits.maxComputeWorkGroupCount[a];
  pd.max_group_size_x = props.limits.maxComputeWorkGroupSize[0];
  pd.max_push_constants = props.limits.maxPushConstantsSize;
  pd.max_allocation = UINT64_MAX;
  if (props.apiVersion >= VK_API_VERSION_1_2) {
    // Structures of Vulkan 1.1/1.2 may only be chained for devices that report those versions.
    VkPhysicalDeviceSubgroupProperties subgroup =
        rt::make<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
    VkPhysicalDeviceMaintenance3Properties m3 = rt::make<VkPhysicalDeviceMaintenance3Properties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
    subgroup.pNext = &m3;
    VkPhysicalDeviceProperties2 props2 =
        rt::make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props2.pNext = &subgroup;
    vkGetPhysicalDeviceProperties2(h, &props2);
    info.subgroup_size = subgroup.subgroupSize;
    pd.max_allocation = m3.maxMemoryAllocationSize;
    VkPhysicalDeviceVulkan11Features f11 =
        rt::make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
    VkPhysicalDeviceVulkan12Features f12 =
        rt::make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
    f11.pNext = &f12;
    VkPhysicalDeviceFeatures2 f2 =
        rt::make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    f2.pNext = &f11;
    vkGetPhysicalDeviceFeatures2(h, &f2);
    // Reported for information: the shaders read 16-bit data as uint words and need neither.
    info.shader_f16 = f12.shaderFloat16 == VK_TRUE && f11.storageBuffer16BitAccess == VK_TRUE;
  }
  std::uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> families(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, families.data());
  // Prefer a compute family without graphics (a dedicated compute queue), else any compute one.
  for (int pass = 0; pass < 2 && pd.compute_family == UINT32_MAX; ++pass)
    for (std::uint32_t f = 0; f < nq; ++f) {
      const VkQueueFlags fl = families[f].queueFlags;
      if ((fl & VK_QUEUE_COMPUTE_BIT) == 0 || families[f].queueCount == 0) continue;
      if (pass == 0 && (fl & VK_QUEUE_GRAPHICS_BIT) != 0) continue;
      pd.compute_family = f;
      break;
    }
  return pd;
}

// Owns the instance and the contexts; contexts go first when the process exits.
struct Runtime {
  std::mutex mu;
  std::unique_ptr<Instance> inst;
  std::string inst_error;  // why the instance could not be created (cached)
  std::map<int, std::unique_ptr<Context>> contexts;
  ~Runtime() {
    contexts.clear();
    inst.reset();
  }
};
Runtime& runtime() {
  message_log();  // constructed first, so it outlives the runtime
  static Runtime r;
  return r;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

void count_message(bool error, bool warning, bool sync, const std::string& text) {
  MessageLog& log = message_log();
  if (error) ++log.errors;
  if (warning) ++log.warnings;
  if (sync) ++log.sync;
  std::lock_guard<std::mutex> lock(log.mu);
  log.recent.push_back(text);
  if (log.recent.size() > MessageLog::kKeep) log.recent.pop_front();
}

debug::ValidationCounts message_counts() {
  MessageLog& log = message_log();
  return {log.errors.load(), log.warnings.load(), log.sync.load()};
}

std::vector<std::string> recent_messages() {
  MessageLog& log = message_log();
  std::lock_guard<std::mutex> lock(log.mu);
  return {log.recent.begin(), log.recent.end()};
}

void reset_message_counts() {
  MessageLog& log = message_log();
  log.errors = 0;
  log.warnings = 0;
  log.sync = 0;
  std::lock_guard<std::mutex> lock(log.mu);
  log.recent.clear();
}

// ---- Instance ----
Instance::Instance() {
  VkApplicationInfo app = rt::make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "attnops";
  app.pEngineName = "attnops";
  app.apiVersion = VK_API_VERSION_1_2;  // the shaders are SPIR-V for Vulkan 1.2

  std::vector<const char*> layers, extensions;
  const bool want_validation = env_flag("ATTNOPS_VK_VALIDATION");
  bool validation = false;
  if (want_validation) {
    const char* kLayer = "VK_LAYER_KHRONOS_validation";
    if (!has_layer(kLayer)) {
      std::fprintf(stderr, "attnops: ATTNOPS_VK_VALIDATION=1 but %s is not installed; running without it\n",
                   kLayer);
    } else if (!has_instance_extension(nullptr, VK_EXT_DEBUG_UTILS_EXTENSION_NAME) &&
               !has_instance_extension(kLayer, VK_EXT_DEBUG_UTILS_EXTENSION_NAME)) {
      std::fprintf(
          stderr, "attnops: ATTNOPS_VK_VALIDATION=1 but VK_EXT_debug_utils is missing; running without it\n");
    } else {
      validation = true;
      layers.push_back(kLayer);
      extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
      if (has_instance_extension(kLayer, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME))
        extensions.push_back(VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
      else
        std::fprintf(stderr,
                     "attnops: %s has no VK_EXT_validation_features; synchronization validation is off\n",
                     kLayer);
    }
  }

  VkDebugUtilsMessengerCreateInfoEXT dbg =
      rt::make<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
  dbg.messageSeverity =
      VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  dbg.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  dbg.pfnUserCallback = on_message;
  // Synchronization validation is off by default in the layer; it is what finds missing barriers.
  const VkValidationFeatureEnableEXT enables[] = {
      VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT features =
      rt::make<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = enables;
  const bool with_features = std::find_if(extensions.begin(), extensions.end(), [](const char* e) {
                               return std::strcmp(e, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME) == 0;
                             }) != extensions.end();
  if (with_features) dbg.pNext = &features;

  VkInstanceCreateInfo ci = rt::make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.pApplicationInfo = &app;
  ci.enabledLayerCount = static_cast<std::uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  ci.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
  ci.ppEnabledExtensionNames = extensions.data();
  if (validation) ci.pNext = &dbg;  // also reports problems of vkCreate/DestroyInstance
  VkResult r = vkCreateInstance(&ci, nullptr, &instance_);
  if (r != VK_SUCCESS)
    throw Error(ErrorCode::backend_unavailable,
                "vkCreateInstance (Vulkan 1.2) failed (" + result_name(r) + ")");

  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    VkDebugUtilsMessengerCreateInfoEXT mci = dbg;
    mci.pNext = nullptr;  // the validation features belong to the instance, not the messenger
    if (create == nullptr || create(instance_, &mci, nullptr, &messenger_) != VK_SUCCESS)
      messenger_ = VK_NULL_HANDLE;
  }

  std::uint32_t n = 0;
  r = vkEnumeratePhysicalDevices(instance_, &n, nullptr);
  std::vector<VkPhysicalDevice> handles(n);
  if (r == VK_SUCCESS && n > 0) r = vkEnumeratePhysicalDevices(instance_, &n, handles.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) n = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    devices_.push_back(describe(handles[i], static_cast<int>(i)));
    devices_.back().desc = query_device_desc(instance_, handles[i], devices_.back().api_version);
  }
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy != nullptr) destroy(instance_, messenger_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

const Instance& instance() {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mu);
  if (!rt.inst && rt.inst_error.empty()) {
    try {
      rt.inst.reset(new Instance());
    } catch (const Error& e) {
      rt.inst_error = e.what();
    }
  }
  if (!rt.inst) throw Error(ErrorCode::backend_unavailable, rt.inst_error);
  return *rt.inst;
}

// ---- device selection ----
std::vector<GpuDeviceInfo> list_devices(const GpuSettings& settings) {
  const Instance& inst = instance();
  const bool allow_software = settings.allow_software || env_flag("ATTNOPS_VK_ALLOW_SOFTWARE");
  std::string selector = env_string("ATTNOPS_VK_DEVICE");
  const char* selector_from = "ATTNOPS_VK_DEVICE";
  if (selector.empty()) {
    selector = settings.device;
    selector_from = "gpu.device";
  }
  const bool by_index =
      !selector.empty() &&
      std::all_of(selector.begin(), selector.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  // Digits only, so the only failure is overflow: such an index selects no device.
  const long long wanted_index = by_index && selector.size() < 10 ? std::stoll(selector) : -1;
  std::vector<GpuDeviceInfo> out;
  for (const PhysicalDevice& pd : inst.devices()) {
    GpuDeviceInfo info = pd.info;
    std::string why;
    if (pd.api_version < VK_API_VERSION_1_2) {
      why = "Vulkan 1.2 required, the device reports " + info.api_version;
    } else if (pd.compute_family == UINT32_MAX) {
      why = "no compute queue";
    } else if (!selector.empty() && by_index && wanted_index != info.index) {
      why = std::string("not selected (") + selector_from + "=" + selector + ")";
    } else if (!selector.empty() && !by_index &&
               lower(info.name).find(lower(selector)) == std::string::npos) {
      why = std::string("not selected (") + selector_from + "=\"" + selector + "\" is not in its name)";
    } else if (info.software && !allow_software) {
      why =
          "software device (lavapipe/llvmpipe, VK_PHYSICAL_DEVICE_TYPE_CPU) is used only with "
          "gpu.allow_software=true or ATTNOPS_VK_ALLOW_SOFTWARE=1";
    }
    info.qualifies = why.empty();
    info.why_not = why;
    out.push_back(std::move(info));
  }
  return out;
}

int select_device(const GpuSettings& settings, std::string* why) {
  std::vector<GpuDeviceInfo> devices;
  try {
    devices = list_devices(settings);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return -1;
  }
  int best = -1;
  for (const GpuDeviceInfo& d : devices)
    if (d.qualifies &&
        (best < 0 || type_rank(d.type) < type_rank(devices[static_cast<std::size_t>(best)].type)))
      best = d.index;
  if (best < 0 && why) {
    if (devices.empty()) {
      *why = "the Vulkan loader reports no device";
    } else {
      *why = "no Vulkan device qualifies:";
      for (const GpuDeviceInfo& d : devices)
        *why += " [" + std::to_string(d.index) + "] " + d.name + " (" + d.type + "): " + d.why_not + ";";
      why->pop_back();
    }
  }
  return best;
}

// ---- Context ----
Context::Context(const PhysicalDevice& pd, const GpuSettings& settings) : pd_(pd) {
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qci = rt::make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = pd.compute_family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  VkDeviceCreateInfo dci = rt::make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  const OptionalFeatures optional(pd.desc);  // what the kernels may use, where supported
  dci.pNext = optional.chain();
  dci.enabledExtensionCount = static_cast<std::uint32_t>(optional.extensions().size());
  dci.ppEnabledExtensionNames = optional.extensions().data();
  check(vkCreateDevice(pd.handle, &dci, nullptr, &device_), "vkCreateDevice");
  // From here on a throw must not leak the device: the destructor does not run for a
  // constructor that throws, so clean up by hand.
  try {
    vkGetDeviceQueue(device_, pd.compute_family, 0, &queue_);

    VkCommandPoolCreateInfo pci =
        rt::make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = pd.compute_family;
    VkCommandPool pool = VK_NULL_HANDLE;
    check(vkCreateCommandPool(device_, &pci, nullptr, &pool), "vkCreateCommandPool");
    pool_ = Owned<VkCommandPool>(device_, pool, vkDestroyCommandPool);
    VkCommandBufferAllocateInfo cai =
        rt::make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    cai.commandPool = pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device_, &cai, &cmd_), "vkAllocateCommandBuffers");

    VkFenceCreateInfo fci = rt::make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    VkFence fence = VK_NULL_HANDLE;
    check(vkCreateFence(device_, &fci, nullptr, &fence), "vkCreateFence");
    fence_ = Owned<VkFence>(device_, fence, vkDestroyFence);

    // Pipeline cache, seeded from the file when there is one (drivers ignore data whose header
    // does not match their device and version, so a stale file is harmless).
    std::vector<char> blob;
    if (!settings.pipeline_cache.empty()) {
      std::ifstream in(settings.pipeline_cache, std::ios::binary);
      if (in) blob.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    VkPipelineCacheCreateInfo cci =
        rt::make<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
    cci.initialDataSize = blob.size();
    cci.pInitialData = blob.empty() ? nullptr : blob.data();
    VkPipelineCache cache = VK_NULL_HANDLE;
    if (vkCreatePipelineCache(device_, &cci, nullptr, &cache) != VK_SUCCESS) {
      cci.initialDataSize = 0;  // a corrupt file: start empty
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
    VkDescriptorSetLayoutCreateInfo lci =
        rt::make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
    lci.bindingCount = kBindings;
    lci.pBindings = bindings;
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    check(vkCreateDescriptorSetLayout(device_, &lci, nullptr, &set_layout), "vkCreateDescriptorSetLayout");
    set_layout_ = Owned<VkDescriptorSetLayout>(device_, set_layout, vkDestroyDescriptorSetLayout);

    if (pd.max_push_constants < kPushConstantBytes)
      throw Error(ErrorCode::gpu_error, "Vulkan: the device allows " + std::to_string(pd.max_push_constants) +
                                            " bytes of push constants, the shaders need " +
                                            std::to_string(kPushConstantBytes));
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
    VkPipelineLayoutCreateInfo plci =
        rt::make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
    plci.setLayoutCount = 1;
    plci.pSetLayouts = &set_layout;
    plci.pushConstantRangeCount = 1;
    plci.pPushConstantRanges = &range;
    VkPipelineLayout pl = VK_NULL_HANDLE;
    check(vkCreatePipelineLayout(device_, &plci, nullptr, &pl), "vkCreatePipelineLayout");
    pipeline_layout_ = Owned<VkPipelineLayout>(device_, pl, vkDestroyPipelineLayout);

  } catch (...) {
    pipeline_layout_.reset();
    set_layout_.reset();
    cache_.reset();
    fence_.reset();
    pool_.reset();
    vkDestroyDevice(device_, nullptr);
    throw;
  }
}

Context::~Context() {
  if (broken_reason_.empty()) vkDeviceWaitIdle(device_);
  pipelines_.clear();
  modules_.clear();
  pipeline_layout_.reset();
  set_layout_.reset();
  cache_.reset();
  fence_.reset();
  pool_.reset();  // frees cmd_
  vkDestroyDevice(device_, nullptr);
}

void Context::persist_cache(const std::string& path) {
  if (path.empty() || (!cache_dirty_ && path == saved_path_)) return;
  std::size_t size = 0;
  if (vkGetPipelineCacheData(device_, cache_.get(), &size, nullptr) != VK_SUCCESS || size == 0) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(device_, cache_.get(), &size, data.data()) != VK_SUCCESS) return;
  // Write-then-rename so that a concurrent reader never sees half a file. A cache that cannot
  // be written only costs compile time later, so it is reported, not thrown.
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(size));
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    std::fprintf(stderr, "attnops: could not write the Vulkan pipeline cache to %s\n", path.c_str());
    return;
  }
  saved_path_ = path;
  cache_dirty_ = false;
}

Buffer Context::make_buffer(VkDeviceSize size, VkBufferUsageFlags usage) {
  Buffer b;
  b.size = size;
  VkBufferCreateInfo bci = rt::make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | usage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buf = VK_NULL_HANDLE;
  check(vkCreateBuffer(device_, &bci, nullptr, &buf), "vkCreateBuffer");
  b.buffer = Owned<VkBuffer>(device_, buf, vkDestroyBuffer);
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(device_, buf, &req);
  if (req.size > pd_.max_allocation)
    throw Error(ErrorCode::gpu_error, "Vulkan: a buffer of " + std::to_string(req.size) +
                                          " bytes exceeds maxMemoryAllocationSize (" +
                                          std::to_string(pd_.max_allocation) + ")");
  VkPhysicalDeviceMemoryProperties mp{};
  vkGetPhysicalDeviceMemoryProperties(pd_.handle, &mp);
  // Host-visible memory so that the host reads and writes buffers directly (no staging copies);
  // coherent where available, else flushed / invalidated explicitly.
  std::uint32_t type = UINT32_MAX;
  for (int pass = 0; pass < 2 && type == UINT32_MAX; ++pass)
    for (std::uint32_t t = 0; t < mp.memoryTypeCount; ++t) {
      VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
      if (pass == 0) want |= VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      if ((req.memoryTypeBits & (1u << t)) && (mp.memoryTypes[t].propertyFlags & want) == want) {
        type = t;
        b.coherent = pass == 0;
        break;
      }
    }
  if (type == UINT32_MAX)
    throw Error(ErrorCode::gpu_error, "Vulkan: no host-visible memory type for a storage buffer");
  VkMemoryAllocateInfo mai = rt::make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  VkDeviceMemory mem = VK_NULL_HANDLE;
  if (VkResult r = vkAllocateMemory(device_, &mai, nullptr, &mem); r != VK_SUCCESS)
    throw_vk(r, "vkAllocateMemory(" + std::to_string(req.size) + " bytes)");
  b.memory = Owned<VkDeviceMemory>(device_, mem, vkFreeMemory);
  check(vkBindBufferMemory(device_, buf, mem, 0), "vkBindBufferMemory");
  check(vkMapMemory(device_, mem, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
  return b;
}

VkShaderModule Context::module(ShaderId id) {
  auto it = modules_.find(id);
  if (it != modules_.end()) return it->second.get();
  const std::span<const std::uint32_t> code = spirv::code(id);
  if (code.empty())
    throw Error(ErrorCode::gpu_error,
                std::string("Vulkan: shader ") + shader_name(id) + " is not compiled into this build");
  VkShaderModuleCreateInfo sci =
      rt::make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  sci.codeSize = code.size() * sizeof(std::uint32_t);
  sci.pCode = code.data();
  VkShaderModule mod = VK_NULL_HANDLE;
  check(vkCreateShaderModule(device_, &sci, nullptr, &mod), "vkCreateShaderModule");
  return modules_.emplace(id, Owned<VkShaderModule>(device_, mod, vkDestroyShaderModule)).first->second.get();
}

VkPipeline Context::pipeline(const PipelineKey& key) {
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return it->second.get();
  // Specialization constant i takes key.spec[i] (ids a shader does not declare are ignored).
  VkSpecializationMapEntry entries[kMaxSpecConstants];
  for (std::uint32_t c = 0; c < kMaxSpecConstants; ++c) entries[c] = {c, c * 4u, 4u};
  VkSpecializationInfo spec{static_cast<std::uint32_t>(kMaxSpecConstants), entries, sizeof key.spec,
                            key.spec.data()};
  VkComputePipelineCreateInfo ci =
      rt::make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module(key.shader);
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = &spec;
  // Subgroup requirements (VK_EXT_subgroup_size_control; the kernel selection asks only for what
  // the device description says is enabled).
  VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT size_info =
      rt::make<VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT>(
          VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT);
  if (key.required_subgroup_size != 0) {
    size_info.requiredSubgroupSize = key.required_subgroup_size;
    ci.stage.pNext = &size_info;
  }
  if (key.full_subgroups) ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT;
  ci.layout = pipeline_layout_.get();
  VkPipeline p = VK_NULL_HANDLE;
  check(vkCreateComputePipelines(device_, cache_.get(), 1, &ci, nullptr, &p), "vkCreateComputePipelines");
  pipelines_.emplace(key, Owned<VkPipeline>(device_, p, vkDestroyPipeline));
  cache_dirty_ = true;
  return p;
}

void Context::begin() {
  if (broken())
    throw Error(ErrorCode::gpu_error,
                "Vulkan: the device is unusable since an earlier failure (" + broken_reason_ + ")");
  check(vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi =
      rt::make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
}

void Context::end_and_wait() {
  check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  VkFence fence = fence_.get();
  check(vkResetFences(device_, 1, &fence), "vkResetFences");
  VkSubmitInfo si = rt::make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  VkResult r = vkQueueSubmit(queue_, 1, &si, fence);
  if (r == VK_ERROR_DEVICE_LOST) mark_broken("vkQueueSubmit: VK_ERROR_DEVICE_LOST");
  check(r, "vkQueueSubmit");
  std::uint64_t timeout_ms = 120000;
  if (const std::string t = env_string("ATTNOPS_VK_TIMEOUT_MS"); !t.empty()) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
    if (end != t.c_str() && *end == '\0' && v > 0 && v < 86400000ull) timeout_ms = v;  // else the default
  }
  r = vkWaitForFences(device_, 1, &fence, VK_TRUE, timeout_ms * 1000000ull);
  if (r == VK_TIMEOUT) {
    // The work is still pending and uses the caller's buffers: wait until the device finishes
    // or is declared lost (drivers reset hung queues) before those buffers are freed. A device
    // that comes back idle stays usable; only the late call fails.
    if (VkResult idle = vkDeviceWaitIdle(device_); idle != VK_SUCCESS)
      mark_broken("fence wait timed out after " + std::to_string(timeout_ms) +
                  " ms, then vkDeviceWaitIdle: " + result_name(idle));
    throw Error(ErrorCode::gpu_error, "Vulkan: fence wait timed out after " + std::to_string(timeout_ms) +
                                          " ms (VK_TIMEOUT); set ATTNOPS_VK_TIMEOUT_MS to allow longer");
  }
  if (r == VK_ERROR_DEVICE_LOST) mark_broken("vkWaitForFences: VK_ERROR_DEVICE_LOST");
  check(r, "vkWaitForFences");
}

void flush(VkDevice dev, const Buffer& b) {
  if (b.coherent) return;
  VkMappedMemoryRange r = make<VkMappedMemoryRange>(VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE);
  r.memory = b.memory.get();
  r.size = VK_WHOLE_SIZE;
  check(vkFlushMappedMemoryRanges(dev, 1, &r), "vkFlushMappedMemoryRanges");
}

void invalidate(VkDevice dev, const Buffer& b) {
  if (b.coherent) return;
  VkMappedMemoryRange r = make<VkMappedMemoryRange>(VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE);
  r.memory = b.memory.get();
  r.size = VK_WHOLE_SIZE;
  check(vkInvalidateMappedMemoryRanges(dev, 1, &r), "vkInvalidateMappedMemoryRanges");
}

void Context::dispatch_steps(const Buffer* bufs, const DispatchStep* steps, std::size_t count) {
  // A descriptor pool per call: one set, freed with the pool.
  VkDescriptorPoolSize pool_size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kBindings};
  VkDescriptorPoolCreateInfo dpci =
      make<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
  dpci.maxSets = 1;
  dpci.poolSizeCount = 1;
  dpci.pPoolSizes = &pool_size;
  VkDescriptorPool pool_handle = VK_NULL_HANDLE;
  check(vkCreateDescriptorPool(device_, &dpci, nullptr, &pool_handle), "vkCreateDescriptorPool");
  Owned<VkDescriptorPool> pool(device_, pool_handle, vkDestroyDescriptorPool);
  VkDescriptorSetLayout layout = set_layout_.get();
  VkDescriptorSetAllocateInfo dsai =
      make<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
  dsai.descriptorPool = pool_handle;
  dsai.descriptorSetCount = 1;
  dsai.pSetLayouts = &layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(device_, &dsai, &set), "vkAllocateDescriptorSets");
  VkDescriptorBufferInfo infos[kBindings];
  VkWriteDescriptorSet writes[kBindings];
  for (std::uint32_t b = 0; b < kBindings; ++b) {
    infos[b] = {bufs[b].buffer.get(), 0, VK_WHOLE_SIZE};
    writes[b] = make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[b].dstSet = set;
    writes[b].dstBinding = b;
    writes[b].descriptorCount = 1;
    writes[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[b].pBufferInfo = &infos[b];
  }
  vkUpdateDescriptorSets(device_, kBindings, writes, 0, nullptr);

  submit([&](VkCommandBuffer cmd) {
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_.get(), 0, 1, &set, 0,
                            nullptr);
    for (std::size_t s = 0; s < count; ++s) {
      const DispatchStep& step = steps[s];
      if (s > 0) {
        // What the earlier steps wrote is read by this one.
        VkMemoryBarrier between = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
        between.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        between.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             0, 1, &between, 0, nullptr, 0, nullptr);
      }
      vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, step.pipeline);
      vkCmdPushConstants(cmd, pipeline_layout_.get(), VK_SHADER_STAGE_COMPUTE_BIT, 0, step.push_bytes,
                         step.push);
      vkCmdDispatch(cmd, step.groups[0], step.groups[1], step.groups[2]);
    }
    // The shaders' writes must be made available to the host's reads after the fence. (Host
    // writes before vkQueueSubmit need no barrier: submission makes them visible.)
    VkMemoryBarrier barrier = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                         &barrier, 0, nullptr, 0, nullptr);
  });
}

void Context::dispatch(VkPipeline pipeline, const Buffer* bufs, const void* push, std::uint32_t push_bytes,
                       const std::uint32_t (&groups)[3]) {
  DispatchStep step;
  step.pipeline = pipeline;
  step.push = push;
  step.push_bytes = push_bytes;
  for (int a = 0; a < 3; ++a) step.groups[a] = groups[a];
  dispatch_steps(bufs, &step, 1);
}

Context& context(const GpuSettings& settings) {
  std::string why;
  const int index = select_device(settings, &why);
  if (index < 0) throw Error(ErrorCode::backend_unavailable, why);
  const Instance& inst = instance();
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mu);
  auto& slot = rt.contexts[index];
  if (!slot) slot = std::make_unique<Context>(inst.devices()[static_cast<std::size_t>(index)], settings);
  return *slot;
}

}  // namespace attnops::vulkan::rt
