#include "runtime/strategy/unit.h"

#include <map>
#include <shared_mutex>

namespace cxxlaunch::runtime::detail {
namespace {

// Module -> the strategy that owns it as a unit. Keyed by module, not per thread: ranks run as
// threads in tests, each with its own model.
struct Registry {
  std::shared_mutex mu;
  std::map<const torch::nn::Module*, UnitHooks*> hooks;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

UnitHooks* unitHooksFor(const torch::nn::Module* module) {
  Registry& r = registry();
  std::shared_lock lock(r.mu);
  auto it = r.hooks.find(module);
  return it == r.hooks.end() ? nullptr : it->second;
}

void registerUnit(const torch::nn::Module* module, UnitHooks* hooks) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.hooks[module] = hooks;
}

void unregisterUnit(const torch::nn::Module* module) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.hooks.erase(module);
}

}  // namespace cxxlaunch::runtime::detail
