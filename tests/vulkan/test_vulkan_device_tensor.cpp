// Device-resident tensors: round trips with any strides, views without copies, a KV cache that
// grows by appends without re-uploading, operators on any mix of host and device inputs with
// the output left on the device, the recorded bytes, typed errors for other backends, and
// release_gpu() with tensors still alive.
#include <cstring>
#include <string>

#include "attnops/ext/problem.h"
#include "attnops/gpu.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

Config gpu_only() {
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu};
  cfg.gpu_allow_software = true;
  return cfg;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

using VulkanDeviceTensor = VulkanTest;

TEST_F(VulkanDeviceTensor, RoundTripsSlicesAndStridedSources) {
  const Tensor host = random_tensor(DType::f16, {2, 9, 3, 20}, 1);
  const DeviceTensor d = to_device(host, software_ok());
  EXPECT_EQ(d.shape(), host.shape());
  EXPECT_TRUE(d.is_contiguous());
  EXPECT_TRUE(bitwise_equal(d.to_host(), host));
  // A slice is a view: same storage, offset rows, strided across the batch.
  const DeviceTensor s = d.slice(1, 2, 7);
  EXPECT_EQ(s.storage(), d.storage());
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_TRUE(bitwise_equal(s.to_host(), Tensor::copy_of(host.view().slice(1, 2, 7))));
  // from_host of a strided host view packs it.
  const DeviceTensor t = DeviceTensor::from_host(host.view().slice(1, 1, 4), software_ok());
  EXPECT_TRUE(bitwise_equal(t.to_host(), Tensor::copy_of(host.view().slice(1, 1, 4))));
  // zeros, then copy_from into a view writes exactly those elements.
  DeviceTensor z = DeviceTensor::zeros(DType::f16, {2, 9, 3, 20}, software_ok());
  z.slice(1, 4, 6).copy_from(host.view().slice(1, 0, 2));
  const Tensor back = z.to_host();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t t2 = 0; t2 < 9; ++t2)
      for (std::int64_t i = 0; i < 60; ++i) {
        const float want =
            t2 == 4 || t2 == 5 ? host.at(static_cast<std::size_t>((b * 9 + (t2 - 4)) * 60 + i)) : 0.f;
        ASSERT_EQ(back.at(static_cast<std::size_t>((b * 9 + t2) * 60 + i)), want)
            << b << " " << t2 << " " << i;
      }
  // Shapes and dtypes must match.
  EXPECT_THROW(z.slice(1, 0, 3).copy_from(host.view().slice(1, 0, 2)), Error);
  EXPECT_THROW(z.copy_from(random_tensor(DType::f32, {2, 9, 3, 20}, 2)), Error);
  // A device view is not readable on the host by accident.
  try {
    Tensor::copy_of(d.view());
    ADD_FAILURE() << "copy_of read a device view";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("to_host"), std::string::npos) << e.what();
  }
}

// A decode loop against a KV cache that lives on the device: each step appends one row and
// attends over a view of the first T rows. Nothing but q and the new row moves to the device.
TEST_F(VulkanDeviceTensor, KvCacheViewsAndAppendsWithoutReupload) {
  const std::int64_t B = 2, Hq = 4, Hkv = 2, D = 32, Tmax = 40, T0 = 30;
  const Tensor k_all = random_tensor(DType::f32, {B, Tmax, Hkv, D}, 11);
  const Tensor v_all = random_tensor(DType::f32, {B, Tmax, Hkv, D}, 12);
  DeviceTensor ck = DeviceTensor::zeros(DType::f32, {B, Tmax, Hkv, D}, software_ok());
  DeviceTensor cv = DeviceTensor::zeros(DType::f32, {B, Tmax, Hkv, D}, software_ok());
  ck.slice(1, 0, T0).copy_from(k_all.view().slice(1, 0, T0));
  cv.slice(1, 0, T0).copy_from(v_all.view().slice(1, 0, T0));
  Registry r;
  register_builtin_operators(r);
  const Attention attn = r.get("flash_attn2", gpu_only());
  const std::uint64_t kv_bytes = static_cast<std::uint64_t>(B * Tmax * Hkv * D) * 4u;
  for (std::int64_t T = T0; T < Tmax; ++T) {
    ck.slice(1, T, T + 1).copy_from(k_all.view().slice(1, T, T + 1));  // append
    cv.slice(1, T, T + 1).copy_from(v_all.view().slice(1, T, T + 1));
    const Tensor q = random_tensor(DType::f32, {B, 1, Hq, D}, 100 + static_cast<std::uint64_t>(T));
    AttentionOptions o;
    o.return_lse = true;
    const AttentionOutput out = attn(q, ck.slice(1, 0, T + 1), cv.slice(1, 0, T + 1), o);
    EXPECT_EQ(out.decision.backend, Backend::gpu) << out.decision.to_log_line();
    EXPECT_EQ(out.decision.run.inputs, "mixed");
    EXPECT_EQ(out.decision.run.output, "host");  // q is on the host
    // q (and the tile plan) moved; the cache did not.
    EXPECT_LT(out.decision.run.bytes_to_device, kv_bytes / 4) << out.decision.to_json();
    // The same call on host copies of the views, through the oracle.
    const Tensor kh = Tensor::copy_of(k_all.view().slice(1, 0, T + 1)),
                 vh = Tensor::copy_of(v_all.view().slice(1, 0, T + 1));
    const AttentionProblem p = make_problem(q, kh, vh, o, attn.metadata());
    AttentionBuffers got{out.out, out.lse, std::nullopt, {}, {}};
    EXPECT_TRUE(within_tolerance(p, got)) << "T=" << T;
  }
}

TEST_F(VulkanDeviceTensor, OutputStaysOnTheDeviceWhenQIsThere) {
  Registry r;
  register_builtin_operators(r);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Case c = make_case(Spec().shape(2, 50, 70).heads(4, 2).dim(40).dtype(dt).causal(false).sinks(), 21);
    const Attention attn = r.get("flash_attn2", gpu_only());
    const AttentionOutput host_out = attn(c.q, c.k, c.v, c.options);
    const DeviceTensor dq = to_device(c.q, software_ok()), dk = to_device(c.k, software_ok()),
                       dv = to_device(c.v, software_ok());
    const AttentionOutput dev_out = attn(dq, dk, dv, c.options);
    EXPECT_EQ(dev_out.decision.run.inputs, "device");
    EXPECT_EQ(dev_out.decision.run.output, "device");
    EXPECT_EQ(dev_out.decision.run.bytes_to_host, static_cast<std::uint64_t>(2 * 4 * 50) * 4u) << "lse only";
    EXPECT_TRUE(dev_out.out.shape().empty());
    ASSERT_FALSE(dev_out.device_out.empty());
    EXPECT_EQ(dev_out.device_out.dtype(), dt);
    // The device path rounds exactly as the host path does (convert.comp for f16 / bf16).
    EXPECT_TRUE(bitwise_equal(dev_out.device_out.to_host(), host_out.out));
    ASSERT_TRUE(dev_out.lse.has_value());
    EXPECT_TRUE(bitwise_equal(*dev_out.lse, *host_out.lse));
    // The output feeds the next call without leaving the device (as a q of the same shape).
    const AttentionOutput chained = attn(dev_out.device_out, dk, dv, c.options);
    EXPECT_EQ(chained.decision.run.inputs, "device");
  }
}

TEST_F(VulkanDeviceTensor, OtherBackendsRefuseDeviceInputs) {
  const Case c = make_case(Spec().shape(1, 8, 8).dim(16), 31);
  const DeviceTensor dk = to_device(c.k, software_ok());
  Registry r;
  register_builtin_operators(r);
  Config cpu;
  cpu.backends = std::vector<Backend>{Backend::cpu};
  try {
    r.get("vanilla", cpu)(c.q, dk, c.v);
    ADD_FAILURE() << "the cpu backend took a device tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("device tensor"), std::string::npos) << e.what();
  }
  // A runtime dtype conversion of a device tensor is refused, typed.
  Config f16 = gpu_only();
  f16.runtime_dtype = DType::f16;
  EXPECT_THROW(r.get("vanilla", f16)(c.q, dk, c.v), Error);
  // Under auto, device inputs go to the gpu (no cost rule: nothing to upload).
  Config autocfg;
  autocfg.gpu_allow_software = true;
  const AttentionOutput out = r.get("vanilla", autocfg)(c.q, dk, c.v);
  EXPECT_EQ(out.decision.backend, Backend::gpu);
}

TEST_F(VulkanDeviceTensor, ReleaseWithLiveTensorsThenStartAgain) {
  const Case c = make_case(Spec().shape(1, 8, 8).dim(16), 41);
  DeviceTensor dk = to_device(c.k, software_ok());
  release_gpu();
  try {
    dk.to_host();
    ADD_FAILURE() << "read a released tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::gpu_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("release_gpu"), std::string::npos) << e.what();
  }
  // A call with it fails typed; a fresh tensor on the new state works.
  Registry r;
  register_builtin_operators(r);
  EXPECT_THROW(r.get("vanilla", gpu_only())(c.q, dk, c.v), Error);
  const DeviceTensor fresh = to_device(c.k, software_ok());
  EXPECT_TRUE(bitwise_equal(fresh.to_host(), c.k));
  dk = DeviceTensor();  // destroying the stale one is harmless
}

}  // namespace
}  // namespace attnops::testing
