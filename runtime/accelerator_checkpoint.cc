// The Accelerator's checkpoints and model files (docs/checkpoints.md): saveState / loadState,
// asynchronous saves, saveModel / loadModel, acc.save, saveCheckpoint / resume. The training
// loop's members are in accelerator.cc.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/accelerator_impl.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/load_newest.h"
#include "runtime/checkpoint/model_source.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/strategy_state.h"
#include "runtime/comm/checked_backend.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/error_report.h"
#include "runtime/strategy/strategy.h"
#include "tensorfile/checkpoint_schema.h"
#include "tensorfile/manifest.h"

namespace cxxlaunch::runtime {

namespace {
namespace fs = std::filesystem;

// The generators a checkpoint keeps: the CPU's, and the GPU's of a GPU worker (its dropout and
// random initialisations), as accelerate saves both.
std::vector<std::pair<std::string, at::Generator>> generatorsOf(const torch::Device& device) {
  std::vector<std::pair<std::string, at::Generator>> out = {
      {tensorfile::kCpuGeneratorBlob, at::detail::getDefaultCPUGenerator()}};
  if (device.is_cuda()) {
    out.emplace_back(tensorfile::kCudaGeneratorBlob, at::globalContext().defaultGenerator(device));
  }
  return out;
}
}  // namespace

void Accelerator::saveState(const std::string& dir) {
  const CollectiveApi api("saveState");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::saveState before prepare");
  if (impl_->backward_pending) {
    throw InvalidArgument(
        "Accelerator::saveState between backward and step: call acc.step() "
        "first, or the checkpoint would miss this step's gradients");
  }
  waitForCheckpoint();  // one save at a time: the snapshot is reused
  impl_->prune_when_committed = false;
  const auto began = checkpoint::AsyncSaver::Clock::now();
  std::vector<std::pair<std::string, std::string>> blobs;
  for (auto& [name, generator] : generatorsOf(device())) {
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng = generator.get_state();
    }
    blobs.emplace_back(name, std::string(static_cast<const char*>(rng.data_ptr()),
                                         static_cast<size_t>(rng.nbytes())));
  }
  if (isMainProcess()) {  // buffers are the same everywhere (broadcast at prepare)
    for (const auto& item : impl_->model->named_buffers()) {
      const torch::Tensor b = item.value().to(torch::kCPU).contiguous();
      blobs.emplace_back(tensorfile::bufferBlob(item.key()),
                         std::string(static_cast<const char*>(b.data_ptr()), b.nbytes()));
    }
  }
  tensorfile::Counters counters = {
      {tensorfile::kOptimizerStepsCounter, std::to_string(impl_->optimizer_steps)},
      {tensorfile::kMicroStepCounter, std::to_string(impl_->micro_step)},
      {tensorfile::kStrategyCounter, std::string(impl_->world.env.strategy.name())},
      {tensorfile::kMixedPrecisionCounter, impl_->precision.name}};
  if (impl_->scheduler != nullptr) {
    counters[tensorfile::kSchedulerStepsCounter] = std::to_string(impl_->scheduler->stepCount());
  }
  // Each parameter group's learning rate, as an optimizer's state_dict keeps it: what a trainer
  // set by hand (without an LrScheduler) resumes too. 17 digits: the double round-trips exactly.
  const auto& groups = impl_->optimizer->param_groups();
  counters[tensorfile::kLrGroupsCounter] = std::to_string(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    char lr[32];
    std::snprintf(lr, sizeof(lr), "%.17g", groups[g].options().get_lr());
    counters[tensorfile::lrCounter(g)] = lr;
  }
  if (impl_->scaler) counters[tensorfile::kLossScalerCounter] = impl_->scaler->save();
  if (!impl_->model_source.empty()) {
    counters[tensorfile::kModelSourceCounter] = tensorfile::encodeCounterValue(impl_->model_source);
  }
  const bool base_by_reference = baseByReference();
  if (base_by_reference) counters[tensorfile::kBaseFingerprintCounter] = impl_->base_fingerprint;
  // A buffer's blob is its bytes; `cxxlaunch merge-weights` writes it as a tensor, from this.
  for (const auto& item : impl_->model->named_buffers()) {
    std::string layout;
    try {
      layout = checkpoint::safetensorsDtypeName(item.value().scalar_type());
    } catch (const InvalidArgument&) {
      continue;  // a dtype safetensors lacks: merge-weights leaves it out, with a note
    }
    layout += ':';
    for (int64_t d : item.value().sizes()) layout += std::to_string(d) + ',';
    if (layout.back() == ',') layout.pop_back();
    counters[tensorfile::bufferCounter(item.key())] = layout;
  }
  auto state =
      checkpoint::strategyState(*impl_->strategy, impl_->world.env.state_dict_type,
                                /*with_frozen=*/!base_by_reference, impl_->optimizer_steps);
  counters.merge(state.counters);
  if (impl_->async_saver) {
    impl_->async_saver->start(*impl_->world.backend, dir, state.stream, std::move(blobs),
                              std::move(counters), device().is_cuda(), began);
    return;
  }
  const uint64_t bytes =
      checkpoint::save(*impl_->world.backend, dir, state.stream, blobs, counters);
  const double seconds =
      std::chrono::duration<double>(checkpoint::AsyncSaver::Clock::now() - began).count();
  committed({dir, bytes, seconds, seconds});
}

bool Accelerator::checkpointInFlight() const {
  return impl_->async_saver && impl_->async_saver->inFlight();
}

void Accelerator::waitForCheckpoint() {
  const CollectiveApi api("waitForCheckpoint");
  if (!checkpointInFlight()) return;
  if (auto report = impl_->async_saver->finish(*impl_->world.backend))
    committed(std::move(*report));
}

void Accelerator::reserveSnapshot() {
  // After the first optimizer step the optimizer state exists, and the snapshot's size is known.
  // Not under nvme offload, whose state views are reads of its swap files.
  if (impl_->world.env.offloads(OffloadDevice::kNvme)) return;
  int64_t numel = 0;
  try {
    const auto state = checkpoint::strategyState(*impl_->strategy, impl_->world.env.state_dict_type,
                                                 !baseByReference(), impl_->optimizer_steps);
    for (const auto& l : state.stream.layout) {
      numel += (l.end - l.begin) * static_cast<int64_t>(l.arrays.size());
    }
  } catch (const Error&) {  // a state saveState refuses: it will say so
    return;
  }
  impl_->async_saver->reserve(numel, device().is_cuda());
}

bool Accelerator::baseByReference() const {
  if (impl_->base_fingerprint.empty()) return false;
  const auto params = impl_->model->parameters();
  return std::any_of(params.begin(), params.end(),
                     [](const torch::Tensor& p) { return !p.requires_grad(); });
}

std::string Accelerator::baseMismatch(const tensorfile::Reader& reader) const {
  const std::string& dir = reader.directory();
  const auto saved = reader.counter(tensorfile::kBaseFingerprintCounter);
  if (!saved) return "";  // the frozen parameters are in it, if any
  std::string base = "?";
  if (const auto text = reader.counter(tensorfile::kModelSourceCounter)) {
    base = tensorfile::decodeCounterValue(*text).value_or("?");
  }
  if (impl_->base_fingerprint.empty()) {
    return "checkpoint '" + dir + "' holds the trainable parameters only; the frozen ones are " +
           "its base model '" + base + "' (" + *saved + "): load that with acc.loadModel after " +
           "prepare and before loadState/resume";
  }
  if (*saved == impl_->base_fingerprint) return "";
  return "checkpoint '" + dir + "' was trained on the base model '" + base + "' (" + *saved +
         "), but the base loaded now, '" + impl_->model_source + "', is another (" +
         impl_->base_fingerprint +
         "): the base changed since; load the base the checkpoint was trained on, or train "
         "afresh";
}

void Accelerator::committed(checkpoint::SaveReport report) {
  if (std::exchange(impl_->prune_when_committed, false) && impl_->checkpoint_total_limit > 0 &&
      isMainProcess()) {
    tensorfile::removeOldest(impl_->checkpoint_dir,
                             static_cast<size_t>(impl_->checkpoint_total_limit));
  }
  impl_->save_reports.push_back(std::move(report));
}

std::string Accelerator::loadState(const std::string& path) {
  const CollectiveApi api("loadState");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::loadState before prepare");
  waitForCheckpoint();  // the save in flight may be the one to load
  // Another base is no fault of a checkpoint's: the older ones were trained on it too.
  return checkpoint::loadNewest(
      *impl_->world.backend, path,
      {[&](const tensorfile::Reader& reader) { return baseMismatch(reader); },
       [&](const tensorfile::Reader& reader) { restoreFrom(reader); }});
}

void Accelerator::restoreFrom(const tensorfile::Reader& reader) {
  const std::string& dir = reader.directory();
  // The counters first: a bad one (a damaged or crafted manifest) stops the load before anything
  // changed.
  const int64_t optimizer_steps = reader.wholeCounter(tensorfile::kOptimizerStepsCounter, 0);
  const int64_t micro_step = reader.wholeCounter(tensorfile::kMicroStepCounter, 0);
  const int64_t scheduler_steps = reader.wholeCounter(tensorfile::kSchedulerStepsCounter, 0);
  // The saved learning rates where the groups are the same in number (an LrScheduler then sets
  // its own, the same for the same step).
  auto& groups = impl_->optimizer->param_groups();
  std::vector<std::optional<double>> lrs;
  if (reader.wholeCounter(tensorfile::kLrGroupsCounter, -1) ==
      static_cast<int64_t>(groups.size())) {
    for (size_t g = 0; g < groups.size(); ++g) {
      lrs.push_back(reader.realCounter(tensorfile::lrCounter(g)));
    }
  }
  std::optional<LossScaler> scaler = impl_->scaler;
  if (const auto state = reader.counter(tensorfile::kLossScalerCounter); state && scaler)
    scaler->restore(*state);
  std::optional<std::string> model_source;
  if (const auto text = reader.counter(tensorfile::kModelSourceCounter)) {
    model_source = tensorfile::decodeCounterValue(*text);
  }
  // The strategy leaves a parameter the checkpoint lacks as it is: meant only for the frozen ones
  // of a checkpoint that names the base that gave them (loadState checked that base).
  const bool names_base = reader.counter(tensorfile::kBaseFingerprintCounter).has_value();
  for (const auto& item : impl_->model->named_parameters()) {
    if (item.value().numel() > 0 && !reader.has(item.key(), tensorfile::kParamArray) &&
        (item.value().requires_grad() || !names_base)) {
      throw InvalidArgument("checkpoint '" + dir + "' has no parameter '" + item.key() + "'");
    }
  }

  checkpoint::loadStrategyState(*impl_->strategy, reader, *impl_->world.backend);
  torch::NoGradGuard no_grad;
  for (const auto& item : impl_->model->named_buffers()) {
    torch::Tensor b = item.value();
    const auto bytes = reader.blob(0, tensorfile::bufferBlob(item.key()));
    if (!bytes || bytes->size() != b.nbytes() || !b.is_contiguous()) {
      throw InvalidArgument("checkpoint '" + dir + "' has no buffer '" + item.key() +
                            "' of this model's size");
    }
    // from_blob wants a mutable pointer; copy_ only reads it.
    b.copy_(torch::from_blob(const_cast<char*>(bytes->data()), b.sizes(),
                             b.options().device(torch::kCPU)));
  }
  std::vector<std::pair<at::Generator, std::string>> rngs;
  for (auto& [name, generator] : generatorsOf(device())) {
    if (auto state = reader.blob(rank(), name)) rngs.emplace_back(generator, std::move(*state));
  }
  if (reader.corruption()) return;  // loadState loads another checkpoint over all of this
  // Each rank its own generators; a rank the saving job did not have (or a CPU job's checkpoint
  // in a GPU job) keeps its own.
  for (auto& [generator, bytes] : rngs) {
    torch::Tensor state = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  impl_->optimizer_steps = optimizer_steps;
  impl_->micro_step = micro_step;
  impl_->resume_position = impl_->micro_step;
  for (size_t g = 0; g < lrs.size(); ++g) {
    if (lrs[g]) groups[g].options().set_lr(*lrs[g]);
  }
  if (impl_->scheduler != nullptr) impl_->scheduler->setStepCount(scheduler_steps);
  impl_->scaler = scaler;
  // A checkpoint that names its base keeps the folder the base was loaded from now (moved,
  // perhaps: its fingerprint is the same); one that holds its frozen parameters names no base.
  impl_->base_fingerprint = reader.counter(tensorfile::kBaseFingerprintCounter).value_or("");
  if (model_source && impl_->base_fingerprint.empty()) impl_->model_source = *model_source;
  impl_->strategy->zeroGrad();
}

void Accelerator::saveModel(const std::string& dir, uint64_t max_file_bytes,
                            std::optional<c10::ScalarType> wanted) {
  const CollectiveApi api("saveModel");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::saveModel before prepare");
  if (max_file_bytes == 0) {
    throw InvalidArgument(
        "Accelerator::saveModel: max_file_bytes is 0; give the largest file to "
        "write in bytes (e.g. 5'000'000'000)");
  }
  const c10::ScalarType dtype =
      wanted.value_or(!impl_->world.env.zero3_save_16bit_model ? c10::ScalarType::Float
                      : impl_->precision.mixed()               ? impl_->precision.compute
                                                               : c10::ScalarType::BFloat16);
  // Every tensor's place is known before the gathers: each is written as it comes, one unit at a
  // time, in the model's order in the files.
  std::vector<checkpoint::SafetensorsWriter::Planned> plan;
  for (const auto& item : impl_->model->named_parameters()) {
    plan.push_back({item.key(), item.value().sizes().vec(), dtype});
  }
  for (const auto& item : impl_->model->named_buffers()) {
    plan.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  std::optional<checkpoint::SafetensorsWriter> writer;
  std::string error;
  try {
    if (isMainProcess()) writer.emplace(dir, max_file_bytes, std::move(plan));
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank takes part in the gathers; rank 0 writes, or remembers why it cannot.
  impl_->strategy->visitFullParameters([&](const std::string& name, const torch::Tensor& value) {
    if (!writer || !error.empty()) return;
    try {
      writer->add(name, value.to(dtype));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (writer && error.empty()) {
    try {
      for (const auto& item : impl_->model->named_buffers()) writer->add(item.key(), item.value());
      writer->finish();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  int32_t ok = error.empty() ? 1 : 0;
  impl_->world.backend->allreduce(&ok, 1, DType::kInt32, ReduceOp::kMin)->wait();
  if (ok == 0) {
    throw CommunicationError("saveModel '" + dir + "' failed" +
                             (error.empty() ? " on rank 0 (see its log)" : ": " + error));
  }
}

void Accelerator::loadModel(const std::string& dir) {
  const CollectiveApi api("loadModel");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::loadModel before prepare");
  const checkpoint::ModelSource source(dir);
  // A model with frozen parameters (a LoRA model) loads its base: what trains beside it (the
  // adapters) is not in the base's export, and keeps its values.
  const auto params = impl_->model->parameters();
  const bool frozen = std::any_of(params.begin(), params.end(),
                                  [](const torch::Tensor& p) { return !p.requires_grad(); });
  std::vector<std::string> absent;
  // Every rank reads the same files: all refuse alike, before any collective of the load.
  if (const std::string why = source.mismatch(*impl_->model, frozen ? &absent : nullptr);
      !why.empty()) {
    throw InvalidArgument("'" + dir + "' does not hold this model's tensors:" + why);
  }
  if (!absent.empty() && isMainProcess()) {
    std::cerr << "cxxlaunch: note: loadModel '" << dir << "': " << absent.size()
              << " trainable parameter(s) it does not hold keep their values (" << absent.front()
              << (absent.size() > 1 ? ", ..." : "") << ")\n";
  }
  checkpoint::loadStrategyState(*impl_->strategy, source);
  torch::NoGradGuard no_grad;
  for (const auto& item : impl_->model->named_buffers()) {
    const torch::Tensor saved = source.tensor(item.key());
    if (!saved.defined() || saved.sizes() != item.value().sizes()) {
      throw InvalidArgument("'" + dir + "' has no buffer '" + item.key() +
                            "' of this model's shape");
    }
    item.value().copy_(saved);
  }
  impl_->optimizer_steps = 0;
  impl_->micro_step = 0;
  // What checkpoints name the frozen parameters by from now on (baseByReference).
  impl_->base_fingerprint = frozen ? source.fingerprint() : "";
  // The folder (a file names its own): an export folder's config and tokenizer files lie beside
  // its weights.
  std::error_code ec;
  fs::path folder = fs::absolute(dir, ec).lexically_normal();
  if (!folder.has_filename()) folder = folder.parent_path();  // "model/"
  if (fs::is_regular_file(folder, ec)) folder = folder.parent_path();
  impl_->model_source = folder.string();
}

void Accelerator::save(const std::string& path, const std::string& bytes) const {
  if (isMainProcess()) writeFileAtomically(path, bytes);
}

void Accelerator::save(const std::string& path,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  if (isMainProcess()) checkpoint::writeSafetensorsFile(path, tensors);
}

std::string Accelerator::saveCheckpoint() {
  const CollectiveApi api("saveCheckpoint");
  if (impl_->checkpoint_dir.empty()) {
    throw InvalidArgument(
        "saveCheckpoint needs a checkpoint folder: launch with --checkpoint_dir DIR (or "
        "CXXLAUNCH_CHECKPOINT_DIR, or cxxlaunch.checkpoint_dir in the config)");
  }
  const std::string dir = impl_->checkpoint_dir + "/" + impl_->checkpoint_prefix +
                          std::to_string(impl_->optimizer_steps);
  saveState(dir);
  // Pruning counts complete checkpoints only: an asynchronous save prunes again once committed.
  impl_->prune_when_committed = checkpointInFlight();
  if (impl_->checkpoint_total_limit > 0 && isMainProcess()) {
    tensorfile::removeOldest(impl_->checkpoint_dir,
                             static_cast<size_t>(impl_->checkpoint_total_limit));
  }
  waitForEveryone();
  return dir;
}

std::optional<std::string> Accelerator::resume() {
  const CollectiveApi api("resume");
  // A folder that holds checkpoints, none of which loads, is an error: starting from step 0 would
  // silently throw away the run (and the next save would remove the checkpoints in the end).
  waitForCheckpoint();
  if (impl_->checkpoint_dir.empty() || !tensorfile::holdsCheckpoints(impl_->checkpoint_dir)) {
    return std::nullopt;
  }
  return loadState(impl_->checkpoint_dir);
}

}  // namespace cxxlaunch::runtime
