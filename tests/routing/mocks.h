// GoogleMock doubles for routing tests: a host whose capabilities a test sets, and operators
// that keep their real gates (fallback policy, implements, implements_backward) but record
// forward_* and backward_* calls.
#pragma once

#include <gmock/gmock.h>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"

namespace attnops::testing {

class MockHost : public Host {
 public:
  MOCK_METHOD(CpuInfo, cpu, (), (const, override));
  MOCK_METHOD(std::vector<GpuDeviceInfo>, gpu_devices, (const GpuSettings&), (const, override));
  MOCK_METHOD(Availability, availability, (Backend, const GpuSettings&), (const, override));
  using Rates = std::optional<std::pair<CostRates, std::string>>;
  MOCK_METHOD(Rates, cost_rates, (const GpuSettings&), (const, override));
};

// A real operator (Base) whose forwards, backwards and input checks are mocked. By default every
// input check passes and every forward / backward returns an empty result.
template <class Base>
class MockOp : public Base {
 public:
  explicit MockOp(const OperationMetadata& md) : Base(md) {
    using ::testing::Return;
    ON_CALL(*this, check_inputs).WillByDefault(Return(std::nullopt));
    ON_CALL(*this, check_backward_inputs).WillByDefault(Return(std::nullopt));
    ON_CALL(*this, forward_native).WillByDefault(Return(AttentionOutput{}));
    ON_CALL(*this, forward_cpu).WillByDefault(Return(AttentionOutput{}));
    ON_CALL(*this, forward_gpu).WillByDefault(Return(AttentionOutput{}));
    ON_CALL(*this, forward_tpu).WillByDefault(Return(AttentionOutput{}));
    ON_CALL(*this, backward_native).WillByDefault(Return(AttentionGradients{}));
    ON_CALL(*this, backward_cpu).WillByDefault(Return(AttentionGradients{}));
    ON_CALL(*this, backward_gpu).WillByDefault(Return(AttentionGradients{}));
    ON_CALL(*this, backward_tpu).WillByDefault(Return(AttentionGradients{}));
  }
  MOCK_METHOD(std::optional<Reason>, check_inputs, (Backend, const AttentionProblem&), (const, override));
  MOCK_METHOD(std::optional<Reason>, check_backward_inputs, (Backend, const BackwardProblem&),
              (const, override));
  MOCK_METHOD(AttentionOutput, forward_native, (const AttentionProblem&), (override));
  MOCK_METHOD(AttentionOutput, forward_cpu, (const AttentionProblem&), (override));
  MOCK_METHOD(AttentionOutput, forward_gpu, (const AttentionProblem&), (override));
  MOCK_METHOD(AttentionOutput, forward_tpu, (const AttentionProblem&), (override));
  MOCK_METHOD(AttentionGradients, backward_native, (const BackwardProblem&), (override));
  MOCK_METHOD(AttentionGradients, backward_cpu, (const BackwardProblem&), (override));
  MOCK_METHOD(AttentionGradients, backward_gpu, (const BackwardProblem&), (override));
  MOCK_METHOD(AttentionGradients, backward_tpu, (const BackwardProblem&), (override));
};

}  // namespace attnops::testing
