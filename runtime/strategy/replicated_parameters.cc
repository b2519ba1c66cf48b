#include "runtime/strategy/replicated_parameters.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <type_traits>

#include "common/error.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/host_memory.h"
#include "runtime/optim/param_state_key.h"

namespace cxxlaunch::runtime {

namespace {

// torch::optim's per-parameter state as checkpoint arrays, under the sharded optimizers' names
// where they have one: AdamW and Adam (FusedAdamW too) exp_avg, exp_avg_sq and, with amsgrad,
// max_exp_avg_sq; SGD's momentum_buffer; RMSprop's square_avg, momentum_buffer and (centered)
// grad_avg; Adagrad's sum. An array an option leaves undefined is left out. Null for a state of
// any other type.
std::optional<std::vector<std::pair<std::string, torch::Tensor>>> torchStateArrays(
    torch::optim::OptimizerParamState& state) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  auto add = [&](const char* array, const torch::Tensor& t) {
    if (t.defined()) out.emplace_back(array, t);
  };
  auto adam = [&](const auto& s) {  // AdamW's and Adam's states have the same fields
    add("exp_avg", s.exp_avg());
    add("exp_avg_sq", s.exp_avg_sq());
    add("max_exp_avg_sq", s.max_exp_avg_sq());
  };
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    adam(*s);
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    adam(*s);
  } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    add("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    add("square_avg", s->square_avg());
    add("momentum_buffer", s->momentum_buffer());
    add("grad_avg", s->grad_avg());
  } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    add("sum", s->sum());
  } else {
    return std::nullopt;
  }
  return out;
}

// saveState keeps all of the optimizer's state or saves nothing: a state of another type
// (LBFGS's history, a trainer's own optimizer) would otherwise be lost without a word. Every
// rank checks every parameter, so that all of them refuse together, before any file is written.
void requireSavableState(torch::optim::Optimizer& optimizer) {
  for (auto& [key, state] : optimizer.state()) {
    if (state && !torchStateArrays(*state)) {
      throw InvalidArgument(
          "saveState can save the state of torch::optim's AdamW, Adam, SGD, RMSprop and Adagrad "
          "(and cxxlaunch::runtime::FusedAdamW), not this optimizer's (LBFGS, or one of your "
          "own); train with one of those, or save its state yourself with acc.save");
    }
  }
}

// The step count of a torch::optim state that keeps one (all but SGD's).
std::optional<int64_t> stepOf(torch::optim::OptimizerParamState& state) {
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&state)) return s->step();
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state)) return s->step();
  if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) return s->step();
  if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(&state)) return s->step();
  return std::nullopt;
}

std::string stepCounter(const std::string& param) { return "step:" + param; }

template <typename Options>
const Options* groupOptions(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) {
        return dynamic_cast<const Options*>(&group.options());
      }
    }
  }
  return nullptr;
}

// A fresh torch::optim state for `param` whose tensors `reads` fill from the checkpoint, or null
// when the checkpoint has no state of this optimizer for the parameter (a fresh start; Adagrad's
// starts as its constructor makes it). An array this optimizer's options need that the
// checkpoint lacks (saved with amsgrad, momentum or centered off) starts as torch starts it.
// Where the parameter already has that array (Adam's, made in prepare; any after a step, as in
// a roll-back), plain float32 on the CPU of the parameter's shape, it is read into in place: no
// new memory, and the optimizer's memory does not double while old and new state coexist.
std::unique_ptr<torch::optim::OptimizerParamState> torchStateFrom(
    torch::optim::Optimizer& optimizer, const std::string& name, const torch::Tensor& param,
    const StateSource& source, int64_t steps, std::vector<StateRead>& reads) {
  steps = source.wholeCounter(stepCounter(name), steps);
  std::vector<std::pair<std::string, torch::Tensor>> present;
  auto& state = optimizer.state();
  if (auto it = state.find(paramStateKey(state, param)); it != state.end()) {
    present = torchStateArrays(*it->second).value_or(present);
  }
  auto read = [&](const char* array, bool needed) -> torch::Tensor {
    if (!source.has(name, array)) {
      return needed ? torch::zeros_like(param, at::MemoryFormat::Contiguous) : torch::Tensor();
    }
    torch::Tensor t;
    for (const auto& [have, tensor] : present) {
      if (have == array && tensor.is_cpu() && tensor.is_contiguous() &&
          tensor.scalar_type() == torch::kFloat && tensor.sizes() == param.sizes()) {
        t = tensor;
      }
    }
    if (!t.defined()) {
      t = param.is_cpu() && param.scalar_type() == torch::kFloat
              ? emptyForReading(param.sizes())
              : torch::empty_like(param, at::MemoryFormat::Contiguous);
    }
    reads.push_back({name, array, 0, param.numel(), param.sizes().vec(), t});
    return t;
  };
  auto adam = [&](auto state, bool amsgrad) {
    state->step(steps);
    state->exp_avg(read("exp_avg", true));
    state->exp_avg_sq(read("exp_avg_sq", true));
    state->max_exp_avg_sq(read("max_exp_avg_sq", amsgrad));
    return state;
  };
  const bool adam_state = source.has(name, "exp_avg") && source.has(name, "exp_avg_sq");
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    if (!adam_state) return nullptr;
    const auto* o = groupOptions<torch::optim::AdamWOptions>(optimizer, param);
    return adam(std::make_unique<torch::optim::AdamWParamState>(), o && o->amsgrad());
  }
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    if (!adam_state) return nullptr;
    const auto* o = groupOptions<torch::optim::AdamOptions>(optimizer, param);
    return adam(std::make_unique<torch::optim::AdamParamState>(), o && o->amsgrad());
  }
  if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    if (!source.has(name, "momentum_buffer")) return nullptr;
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(read("momentum_buffer", true));
    return s;
  }
  if (dynamic_cast<torch::optim::RMSprop*>(&optimizer) != nullptr) {
    if (!source.has(name, "square_avg")) return nullptr;
    const auto* o = groupOptions<torch::optim::RMSpropOptions>(optimizer, param);
    auto s = std::make_unique<torch::optim::RMSpropParamState>();
    s->step(steps);
    s->square_avg(read("square_avg", true));
    s->momentum_buffer(read("momentum_buffer", o && o->momentum() > 0));
    s->grad_avg(read("grad_avg", o && o->centered()));
    return s;
  }
  if (dynamic_cast<torch::optim::Adagrad*>(&optimizer) != nullptr) {
    // Adagrad makes every parameter's state in its constructor, and its step expects it there.
    auto s = std::make_unique<torch::optim::AdagradParamState>();
    if (source.has(name, "sum")) {
      s->step(steps);
      s->sum(read("sum", true));
    } else {
      const auto* o = groupOptions<torch::optim::AdagradOptions>(optimizer, param);
      s->sum(torch::full_like(param, o ? o->initial_accumulator_value() : 0.0,
                              at::MemoryFormat::Contiguous));
    }
    return s;
  }
  return nullptr;
}

// Adam's and AdamW's state (FusedAdamW's too) for every trainable parameter, as torch makes it
// at a parameter's first step (zeros, step 0), made in prepare instead, as DeepSpeed's engine
// makes its state when it is built: a job that cannot hold it fails in prepare, not after its
// first backward, and a load reads into memory the job already has. Other optimizers keep
// torch's lazy state (SGD's momentum, for one, starts as the first gradient, not as zeros).
void allocateAdamState(torch::optim::Optimizer& optimizer) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  if (!adamw && dynamic_cast<torch::optim::Adam*>(&optimizer) == nullptr) return;
  auto zeros = [](const torch::Tensor& param) {
    if (!param.is_cpu() || param.scalar_type() != torch::kFloat || !param.is_contiguous()) {
      return torch::zeros_like(param, at::MemoryFormat::Preserve);
    }
    // Page-aligned, so that a load reads into it past the page cache; faulted in at once.
    auto t = emptyForReading(param.sizes());
    prefaultForWriting(t.data_ptr(), static_cast<size_t>(t.nbytes()));
    return t.zero_();
  };
  auto fill = [&](auto state, const torch::Tensor& param, bool amsgrad) {
    state->step(0);
    state->exp_avg(zeros(param));
    state->exp_avg_sq(zeros(param));
    if (amsgrad) state->max_exp_avg_sq(zeros(param));
    return state;
  };
  torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      const auto key = paramStateKey(state, param);
      if (!param.requires_grad() || state.count(key) != 0) continue;
      if (adamw) {
        const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
        state[key] = fill(std::make_unique<torch::optim::AdamWParamState>(), param, o.amsgrad());
      } else {
        const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
        state[key] = fill(std::make_unique<torch::optim::AdamParamState>(), param, o.amsgrad());
      }
    }
  }
}

// Moves each large float32 parameter in host memory that has its storage to itself onto memory
// from emptyForReading (the same tensor, its values copied), so that a load reads into it past
// the page cache, as into the optimizer's state; the file holds such arrays page-aligned.
std::shared_ptr<torch::nn::Module> alignForReading(std::shared_ptr<torch::nn::Module> model) {
  torch::NoGradGuard no_grad;
  for (auto& param : model->parameters()) {
    const auto bytes = static_cast<size_t>(param.nbytes());
    const bool own_storage = param.storage_offset() == 0 && param.storage().use_count() == 1 &&
                             param.storage().nbytes() == bytes;
    if (!param.is_cpu() || param.scalar_type() != torch::kFloat || !param.is_contiguous() ||
        !own_storage || bytes < kDirectReadBytes ||
        reinterpret_cast<uintptr_t>(param.data_ptr()) % readingAlignment(bytes) == 0) {
      continue;
    }
    auto aligned = emptyForReading(param.sizes());
    prefaultForWriting(aligned.data_ptr(), bytes);
    aligned.copy_(param);
    param.set_data(aligned);
  }
  return model;
}

}  // namespace

ReplicatedParameters::ReplicatedParameters(std::shared_ptr<torch::nn::Module> model,
                                           torch::optim::Optimizer& optimizer, int rank, int world)
    : model_(alignForReading(std::move(model))), optimizer_(optimizer), rank_(rank), world_(world) {
  allocateAdamState(optimizer_);
}

double ReplicatedParameters::clipGradNorm(double max_norm) {
  // After the all-reduce every rank holds the same whole gradients: the local norm is global.
  std::vector<torch::Tensor> params;
  for (auto& p : model_->parameters()) {
    if (p.grad().defined()) params.push_back(p);
  }
  if (max_norm <= 0) {
    double squares = 0;
    for (auto& p : params) squares += p.grad().pow(2).sum().item<double>();
    return std::sqrt(squares);
  }
  return torch::nn::utils::clip_grad_norm_(params, max_norm);
}

bool ReplicatedParameters::unscaleGradients(double factor) {
  // All-reduced gradients are the same on every rank: the local check is the global one.
  torch::NoGradGuard no_grad;
  bool finite = true;
  for (auto& p : model_->parameters()) {
    if (!p.grad().defined()) continue;
    finite = finite && p.grad().isfinite().all().item<bool>();
    p.mutable_grad().mul_(factor);
  }
  return finite;
}

void ReplicatedParameters::report(MemoryReport& out) const {
  for (const auto& p : model_->parameters()) {
    out.parameters += bytesOf(p);
    out.gradients += bytesOf(p.grad());
  }
  for (const auto& [key, state] : optimizer_.state()) {
    if (auto arrays = torchStateArrays(*state)) {
      for (const auto& [array, t] : *arrays) out.optimizer_state += bytesOf(t);
    }
  }
}

void ReplicatedParameters::visitFullParameters(const ParameterVisitor& visit) {
  for (const auto& item : model_->named_parameters()) visit(item.key(), item.value().detach());
}

StateStream ReplicatedParameters::stateStream(StateDictType type, bool with_frozen) {
  requireSavableState(optimizer_);
  // Every rank holds the same. Sharded, they share the writing: each parameter goes to the
  // rank with the fewest elements so far (the same choice on every rank), and they write in
  // parallel; full, rank 0 writes everything.
  if (type == StateDictType::kFull)
    return streamOf(rank_ == 0 ? viewsOf(0, 1, with_frozen) : std::vector<StateView>{});
  return streamOf(viewsOf(rank_, world_, with_frozen));
}

StateCounters ReplicatedParameters::stateCounters(int64_t optimizer_steps) {
  // torch steps a parameter only when it has a gradient (one no rank used, with
  // find_unused_parameters, has none). A name with white space cannot be a manifest key; such
  // a parameter resumes with the job's count.
  StateCounters out;
  auto& state = optimizer_.state();
  for (const auto& item : model_->named_parameters()) {
    auto it = state.find(paramStateKey(state, item.value()));
    if (it == state.end() || !it->second) continue;
    const auto step = stepOf(*it->second);
    const bool plain = std::none_of(item.key().begin(), item.key().end(),
                                    [](unsigned char c) { return std::isspace(c); });
    if (step && *step != optimizer_steps && plain) {
      out[stepCounter(item.key())] = std::to_string(*step);
    }
  }
  return out;
}

// Which of `ranks` each parameter falls to (in named_parameters' order): the one with the
// fewest elements so far.
std::vector<int> ReplicatedParameters::ownersOf(int ranks) const {
  std::vector<int> owners;
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  for (const auto& item : model_->named_parameters()) {
    const auto owner = std::min_element(load.begin(), load.end()) - load.begin();
    load[static_cast<size_t>(owner)] += item.value().numel();
    owners.push_back(static_cast<int>(owner));
  }
  return owners;
}

// The parameters (and their optimizer state) that fall to `rank` of `ranks`. Leaving the frozen
// ones out keeps the others' owners: a checkpoint with them and one without read alike.
std::vector<StateView> ReplicatedParameters::viewsOf(int rank, int ranks, bool with_frozen) {
  std::vector<StateView> out;
  auto& state = optimizer_.state();
  const std::vector<int> owners = ownersOf(ranks);
  size_t index = 0;
  for (const auto& item : model_->named_parameters()) {
    if (owners[index++] != rank || (!with_frozen && !item.value().requires_grad())) continue;
    const torch::Tensor& p = item.value();  // the optimizer's key is this TensorImpl
    StateView slice{
        item.key(), p.sizes().vec(), 0, p.numel(), {{"param", p.detach().reshape({-1})}}};
    if (auto it = state.find(paramStateKey(state, p)); it != state.end()) {
      // requireSavableState checked the type
      const auto arrays = torchStateArrays(*it->second).value();
      for (const auto& [array, t] : arrays) slice.arrays.emplace_back(array, t.reshape({-1}));
    }
    out.push_back(std::move(slice));
  }
  return out;
}

void ReplicatedParameters::fillState(StateSource& source) {
  torch::NoGradGuard no_grad;
  const int64_t steps = source.wholeCounter("optimizer_steps", 0);
  auto& state = optimizer_.state();
  // Everything read at once, straight into the parameters; the optimizer's state is installed
  // only once all of it was read. Each rank holds everything, so each parameter is read by the
  // rank that saved it at this world size (ownersOf) and shared with the others.
  std::vector<StateRead> reads;
  // The state's key type differs between LibTorch versions (optim/param_state_key.h).
  using Key = std::decay_t<decltype(state)>::key_type;
  std::vector<std::pair<Key, std::unique_ptr<torch::optim::OptimizerParamState>>> fresh;
  const std::vector<int> owners = ownersOf(world_);
  std::vector<int> readers;  // of each request
  size_t index = 0;
  for (const auto& item : model_->named_parameters()) {
    torch::Tensor p = item.value();
    const int owner = owners[index++];
    // A parameter the source lacks keeps its values and state: a LoRA checkpoint's frozen base
    // (loaded by loadModel), a base model's export's adapters (Strategy::fillState).
    if (!source.has(item.key(), "param")) continue;
    reads.push_back({item.key(), "param", 0, p.numel(), p.sizes().vec(), p.detach()});
    fresh.emplace_back(paramStateKey(state, p),
                       torchStateFrom(optimizer_, item.key(), p, source, steps, reads));
    readers.resize(reads.size(), owner);
  }
  source.readReplicated(reads, readers);
  if (source.failed()) return;  // the optimizer keeps its state; the caller throws
  for (auto& [key, s] : fresh) {
    if (s) {
      state[key] = std::move(s);
    } else {
      state.erase(key);
    }
  }
  // A load without this optimizer's state (loadModel, an HF folder) starts it afresh: for
  // Adam's that is its zeros at step 0 again, made now as prepare made them, so the memory stays
  // held and counted (memoryReport) instead of coming back at the next step.
  allocateAdamState(optimizer_);
}

}  // namespace cxxlaunch::runtime
