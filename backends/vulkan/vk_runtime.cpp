// The process's GPU state (see vk_runtime.h for the lifetime rule).
#include "backends/vulkan/vk_runtime.h"

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace attnops::vulkan::rt {

namespace {

struct Runtime {
  std::mutex mu;
  std::unique_ptr<Instance> inst;
  std::string inst_error;  // why the instance could not be created (remembered)
  std::map<int, std::shared_ptr<Device>> devices;
  // Devices abandoned after a fence timeout (Device::hung), replaced in `devices` but kept until
  // their work has finished.
  std::vector<std::shared_ptr<Device>> abandoned;
  // Device selection by (settings.device, allow_software, ATTNOPS_VK_DEVICE,
  // ATTNOPS_VK_ALLOW_SOFTWARE): selection walks every device and builds reasons, so a call
  // looks it up here instead.
  std::map<std::tuple<std::string, bool, std::string, std::string>, std::pair<int, std::string>> selections;
};

// Created on first use and never destroyed by the C++ runtime: a static object's destructor
// would run Vulkan teardown from exit(), after drivers began their own.
Runtime& state() {
  static Runtime* r = new Runtime;
  return *r;
}

const Instance& instance_locked(Runtime& rt) {
  if (!rt.inst && rt.inst_error.empty()) {
    try {
      rt.inst = std::make_unique<Instance>();
    } catch (const Error& e) {
      rt.inst_error = e.what();
    }
  }
  if (!rt.inst) throw Error(ErrorCode::backend_unavailable, rt.inst_error);
  return *rt.inst;
}

int select_locked(Runtime& rt, const GpuSettings& settings, std::string* why) {
  auto key = std::make_tuple(settings.device, settings.allow_software, env_string("ATTNOPS_VK_DEVICE"),
                             env_string("ATTNOPS_VK_ALLOW_SOFTWARE"));
  auto it = rt.selections.find(key);
  if (it == rt.selections.end()) {
    std::pair<int, std::string> sel{-1, ""};
    try {
      sel.first = select_device(instance_locked(rt), settings, &sel.second);
    } catch (const Error& e) {
      sel = {-1, e.what()};
    }
    it = rt.selections.emplace(std::move(key), std::move(sel)).first;
  }
  if (why != nullptr) *why = it->second.second;
  return it->second.first;
}

}  // namespace

const Instance& instance() {
  Runtime& rt = state();
  std::lock_guard<std::mutex> lock(rt.mu);
  return instance_locked(rt);
}

int selected_index(const GpuSettings& settings, std::string* why) {
  Runtime& rt = state();
  std::lock_guard<std::mutex> lock(rt.mu);
  return select_locked(rt, settings, why);
}

std::shared_ptr<Device> device(const GpuSettings& settings) {
  Runtime& rt = state();
  std::lock_guard<std::mutex> lock(rt.mu);
  std::string why;
  const int index = select_locked(rt, settings, &why);
  if (index < 0) throw Error(ErrorCode::backend_unavailable, why);
  if (auto it = rt.devices.find(index); it != rt.devices.end()) {
    {
      std::lock_guard<std::mutex> dlock(it->second->mutex());
      if (!it->second->lost()) return it->second;
      if (it->second->hung())
        rt.abandoned.push_back(it->second);  // its work may still run: destroyed at release()
      else
        it->second->shutdown();  // legal after a loss; its device tensors now fail with gpu_error
    }
    rt.devices.erase(it);
  }
  // The map holds only devices that were created: a creation that throws (out of memory, a
  // driver error) leaves no entry behind for release() to trip over.
  auto dev = std::make_shared<Device>(rt.inst->devices()[static_cast<std::size_t>(index)], settings);
  rt.devices.emplace(index, dev);
  return dev;
}

void release_hangs() {
  Runtime& rt = state();
  std::lock_guard<std::mutex> lock(rt.mu);
  for (auto& [index, dev] : rt.devices) dev->release_hang();
  for (auto& dev : rt.abandoned) dev->release_hang();
}

void release() {
  Runtime& rt = state();
  std::lock_guard<std::mutex> lock(rt.mu);
  std::vector<std::shared_ptr<Device>> all = rt.abandoned;
  for (auto& [index, dev] : rt.devices) all.push_back(dev);
  bool leak_instance = false;
  for (const std::shared_ptr<Device>& dev : all) {
    dev->release_hang();
    std::lock_guard<std::mutex> dlock(dev->mutex());
    if (dev->hung() && !dev->wait_last_submission(2'000'000'000ull)) {
      // Still running after the timeout and two more seconds: destroying its objects now would
      // pull memory from under the kernel. It is left to the OS (never destroyed), and so is the
      // instance it belongs to.
      static auto* left = new std::vector<std::shared_ptr<Device>>;
      left->push_back(dev);
      leak_instance = true;
      continue;
    }
    dev->shutdown();
  }
  rt.devices.clear();
  rt.abandoned.clear();
  rt.selections.clear();
  if (leak_instance)
    static_cast<void>(rt.inst.release());
  else
    rt.inst.reset();
  rt.inst_error.clear();
}

}  // namespace attnops::vulkan::rt
