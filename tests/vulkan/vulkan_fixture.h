// The fixture of every Vulkan test: skips without a device, fails on any validation error or
// synchronization hazard reported while the test ran.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "attnops/attnops.h"
#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::testing {

inline GpuSettings software_ok() {
  GpuSettings s;
  s.allow_software = true;
  return s;
}

inline std::string joined_validation_messages() {
  std::string all;
  for (const std::string& m : vulkan::debug::validation_messages()) all += "\n  " + m;
  return all;
}

// A CaseSpec built fluently (GCC warns about designated initialisers that leave members out).
struct Spec {
  CaseSpec s;
  Spec& shape(std::int64_t B, std::int64_t Tq, std::int64_t Tk) {
    s.B = B, s.Tq = Tq, s.Tk = Tk;
    return *this;
  }
  Spec& heads(std::int64_t Hq, std::int64_t Hkv) {
    s.Hq = Hq, s.Hkv = Hkv;
    return *this;
  }
  Spec& dim(std::int64_t D, std::int64_t Dv = -1) {
    s.D = D, s.Dv = Dv;
    return *this;
  }
  Spec& dtype(DType t) { return s.dtype = t, *this; }
  Spec& causal(bool c) { return s.causal = c, *this; }
  Spec& window(std::int64_t L, std::int64_t R) { return s.window = Window{L, R}, *this; }
  Spec& chunk(std::int64_t C) { return s.chunk = C, *this; }
  Spec& segments() { return s.segments = true, *this; }
  Spec& bias(bool broadcast = false) { return s.bias = true, s.bias_broadcast = broadcast, *this; }
  Spec& soft_cap(double c) { return s.soft_cap = c, *this; }
  Spec& sinks() { return s.sinks = true, *this; }
  Spec& mask(Mask m) { return s.mask = std::move(m), *this; }
  Spec& scale_inputs(float x) { return s.scale_inputs = x, *this; }
  operator const CaseSpec&() const { return s; }  // NOLINT(google-explicit-constructor)
};

class VulkanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vulkan::compiled_in()) GTEST_SKIP() << "attnops was built without the Vulkan backend";
    const Availability a = vulkan::availability(software_ok());
    if (!a.available) GTEST_SKIP() << "no Vulkan device: " << a.detail;
    vulkan::debug::reset_validation_counts();
  }
  void TearDown() override {
    const vulkan::debug::ValidationCounts c = vulkan::debug::validation_counts();
    EXPECT_EQ(c.errors, 0u) << "validation errors:" << joined_validation_messages();
    EXPECT_EQ(c.sync_hazards, 0u) << "synchronization hazards:" << joined_validation_messages();
    EXPECT_EQ(c.warnings, 0u) << "validation warnings:" << joined_validation_messages();
  }
};

}  // namespace attnops::testing
