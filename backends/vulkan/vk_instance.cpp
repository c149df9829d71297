// The instance (with the validation layer and a counting messenger when asked for), the
// messenger's counters, and device listing / selection.
#include "backends/vulkan/vk_instance.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>

namespace attnops::vulkan::rt {

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

// Preference among qualifying devices: discrete, integrated, virtual, other, software.
int type_rank(const std::string& type) {
  if (type == "discrete") return 0;
  if (type == "integrated") return 1;
  if (type == "virtual") return 2;
  if (type == "other") return 3;
  return 4;
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
  // The shaders are SPIR-V for Vulkan 1.2; asking for 1.3 lets 1.3 devices expose their 1.3
  // features (subgroup size control) to a 1.2 application without extensions.
  app.apiVersion = VK_API_VERSION_1_3;

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
  const std::optional<debug::DeviceOverride> injected = debug::device_override();
  for (std::uint32_t i = 0; i < n; ++i) {
    PhysicalDevice pd = describe_device(instance_, handles[i], static_cast<int>(i));
    if (injected) {  // tests: a description the real device can honour (vulkan_debug.h)
      if (injected->type) pd.info.type = *injected->type;
      if (injected->compute_units) pd.caps.compute_units = *injected->compute_units;
      if (injected->max_storage_buffer_range)
        pd.caps.max_storage_buffer_range = pd.info.max_storage_buffer_range =
            std::min(pd.caps.max_storage_buffer_range, *injected->max_storage_buffer_range);
      if (injected->max_allocation)
        pd.caps.max_allocation = std::min(pd.caps.max_allocation, *injected->max_allocation);
    }
    devices_.push_back(std::move(pd));
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

bool PhysicalDevice::has_extension(const char* name) const {
  return std::find(extensions.begin(), extensions.end(), name) != extensions.end();
}

// ---- device selection ----
std::vector<GpuDeviceInfo> list_devices(const Instance& inst, const GpuSettings& settings) {
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

int select_device(const Instance& inst, const GpuSettings& settings, std::string* why) {
  const std::vector<GpuDeviceInfo> devices = list_devices(inst, settings);
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

}  // namespace attnops::vulkan::rt
