// The explicit list of built-in operators. Registration is a plain function call, not a static
// initialiser: static libraries drop unreferenced objects, and with them such registrations.
#include "attnops/registry.h"
#include "operators/blocksparse.h"
#include "operators/flash_attn2.h"
#include "operators/ragged_paged.h"
#include "operators/vanilla.h"

namespace attnops {

namespace {
template <class Op>
OperationEntry entry_for(std::string name, std::vector<std::string> aliases) {
  return OperationEntry{std::move(name), std::move(aliases), Op::default_metadata(),
                        [](const OperationMetadata& md) { return std::make_shared<Op>(md); }};
}
}  // namespace

void register_builtin_operators(Registry& r) {
  r.add(entry_for<VanillaAttn>("vanilla", {}));
  r.add(entry_for<BlockSparseAttn>("blocksparse", {"splash"}));
  r.add(entry_for<FlashAttn2>("flash_attn2", {"flash"}));
  r.add(entry_for<RaggedPagedAttn>("ragged_paged", {"paged"}));
}

Registry& registry() {
  static Registry* r = [] {
    auto* x = new Registry();  // never destroyed: usable from other static destructors
    register_builtin_operators(*x);
    return x;
  }();
  return *r;
}

}  // namespace attnops
