#include "runtime/strategy/unit_plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"
#include "runtime/strategy/unit_registry.h"

namespace cxxlaunch::runtime {
namespace {

// The modules that are units, before parameters are assigned: `modules` in pre-order.
std::set<const torch::nn::Module*> chooseUnitModules(
    const std::vector<const torch::nn::Module*>& modules, const WrapOptions& options) {
  std::set<const torch::nn::Module*> chosen(options.wrapped.begin(), options.wrapped.end());
  // A module that runs itself through unitForward is a unit as a marked one is: DeepSpeed's
  // configs name no wrap policy, and ZeRO-3 gathers module by module there too.
  for (const auto* m : modules) {
    if (detail::runsThroughUnitForward(m)) chosen.insert(m);
  }
  // Type names without a policy select by type, as accelerate reads them.
  const bool by_type = options.policy == WrapPolicy::kTransformerBased ||
                       (options.policy == WrapPolicy::kNone && !options.unit_types.empty());
  std::set<std::string> unmatched(options.unit_types.begin(), options.unit_types.end());
  for (size_t i = 1; i < modules.size(); ++i) {
    for (const auto& wanted : options.unit_types) {
      if (!detail::typeMatches(*modules[i], wanted)) continue;
      unmatched.erase(wanted);
      if (by_type) chosen.insert(modules[i]);
    }
  }
  if (by_type && !unmatched.empty()) {
    std::set<std::string> names;
    for (const auto* m : modules) names.insert(detail::shortTypeName(*m));
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw InvalidArgument(
        "fsdp_transformer_layer_cls_to_wrap names '" + *unmatched.begin() +
        "', which is no module type of this model; its module types are: " + list);
  }
  return chosen;
}

}  // namespace

UnitPlan planUnits(torch::nn::Module& model, const WrapOptions& options) {
  std::map<const c10::TensorImpl*, std::string> name_of;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    name_of[item.value().unsafeGetTensorImpl()] = item.key();
  }
  std::vector<std::string> paths;
  std::vector<const torch::nn::Module*> modules;  // pre-order (registration order)
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    paths.push_back(item.key());
    modules.push_back(item.value().get());
  }
  const std::set<const torch::nn::Module*> chosen = chooseUnitModules(modules, options);

  // Reverse pre-order visits every module after all of its descendants: an inner unit takes its
  // parameters before the unit around it.
  std::set<const c10::TensorImpl*> taken;
  std::set<const torch::nn::Module*> by_policy;
  std::map<const torch::nn::Module*, std::vector<torch::Tensor>> unit_params;
  for (size_t i = modules.size(); i-- > 1;) {
    const auto& module = *modules[i];
    std::vector<torch::Tensor> mine;
    int64_t numel = 0;
    for (const auto& p : module.parameters(/*recurse=*/true)) {
      if (!p.requires_grad() || taken.count(p.unsafeGetTensorImpl()) != 0) continue;
      mine.push_back(p);
      numel += p.numel();
    }
    const bool by_size =
        options.policy == WrapPolicy::kSizeBased && numel >= options.min_num_params;
    if (chosen.count(&module) == 0 && !by_size) continue;
    by_policy.insert(&module);
    if (mine.empty()) continue;
    for (const auto& p : mine) taken.insert(p.unsafeGetTensorImpl());
    unit_params[&module] = std::move(mine);
  }
  if (!options.module_units) {  // the policy's modules' parameters go to buckets
    taken.clear();
    unit_params.clear();
  }

  UnitPlan plan;
  for (size_t i = 1; i < modules.size(); ++i) {
    if (by_policy.count(modules[i]) != 0) plan.policy_modules.push_back(modules[i]);
  }
  auto add = [&](std::string name, const torch::nn::Module* module,
                 std::vector<torch::Tensor> params) {
    PlannedUnit unit{std::move(name), module, std::move(params), {}};
    for (const auto& p : unit.params) unit.names.push_back(name_of.at(p.unsafeGetTensorImpl()));
    plan.units.push_back(std::move(unit));
  };
  for (size_t i = 1; i < modules.size(); ++i) {
    auto it = unit_params.find(modules[i]);
    if (it != unit_params.end()) add(paths[i], it->first, std::move(it->second));
  }
  const size_t module_units = plan.units.size();

  std::vector<torch::Tensor> rest;
  for (const auto& p : model.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) {
      plan.frozen.push_back(p);
    } else if (taken.count(p.unsafeGetTensorImpl()) == 0) {
      rest.push_back(p);
    }
  }
  std::reverse(rest.begin(), rest.end());
  std::vector<torch::Tensor> bucket;
  size_t bucket_bytes = 0;
  auto close = [&] {
    if (bucket.empty()) return;
    add("bucket " + std::to_string(plan.units.size() - module_units), nullptr, std::move(bucket));
    bucket.clear();
    bucket_bytes = 0;
  };
  for (const auto& p : rest) {
    const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
    if (!bucket.empty() && (bucket_bytes + bytes > options.bucket_bytes ||
                            p.scalar_type() != bucket.front().scalar_type() ||
                            p.device() != bucket.front().device())) {
      close();
    }
    bucket.push_back(p);
    bucket_bytes += bytes;
  }
  close();

  for (size_t i = module_units; i-- > 0;) plan.reduce_order.push_back(i);
  for (size_t i = module_units; i < plan.units.size(); ++i) plan.reduce_order.push_back(i);
  return plan;
}

}  // namespace cxxlaunch::runtime
