// An operator author's translation unit in the package test: the implementor headers
// (attnops/ext/) are installed beside the umbrella header and reach the operator an Attention holds.
#include <attnops/attnops.h>
#include <attnops/ext/attention.h>
#include <attnops/ext/backward_problem.h>
#include <attnops/ext/device_storage.h>
#include <attnops/ext/environment.h>
#include <attnops/ext/operation.h>
#include <attnops/ext/paged_problem.h>
#include <attnops/ext/problem.h>

#include <string>

std::string operator_name_via_ext(const attnops::Attention& attn) {
  static_assert(sizeof(attnops::AttentionProblem) > 0 && sizeof(attnops::PagedPlanData) > 0);
  (void)attnops::environment_generation();
  return attnops::operation_of(attn).name();
}
