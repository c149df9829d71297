// For backend authors: the GPU memory that device tensors view (DeviceTensor holds it opaquely).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "attnops/device_tensor.h"

namespace attnops {

// GPU memory that device tensors view; implemented by the GPU backend.
class DeviceStorage {
 public:
  virtual ~DeviceStorage() = default;
  virtual std::size_t nbytes() const = 0;
  virtual std::string describe() const = 0;  // e.g. "Vulkan device [0] llvmpipe (LLVM 15.0.6, 256 bits)"
  // Byte ranges of this storage copied from / to host memory, all in one submission.
  struct Copy {
    std::size_t device_offset = 0, bytes = 0;
    const void* src = nullptr;  // write(): host source
    void* dst = nullptr;        // read(): host destination
  };
  virtual void write(const std::vector<Copy>& copies) = 0;
  virtual void read(const std::vector<Copy>& copies) const = 0;
};

}  // namespace attnops
