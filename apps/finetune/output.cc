#include "apps/finetune/output.h"

#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>

#include "apps/examples/output_dir.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file.h"
#include "tensorfile/manifest.h"
#include "tensorfile/model_folder.h"

namespace cxxlaunch::finetune {

namespace fs = std::filesystem;

namespace {

bool endsWith(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// checkpoint-<step>, and the staging names of a save (.tmp) and of its replacement (.old).
bool isCheckpointName(std::string name) {
  for (const char* suffix : {".tmp", ".old"}) {
    if (endsWith(name, suffix)) name.resize(name.size() - 4);
  }
  return name.rfind("checkpoint-", 0) == 0 && tensorfile::wholeNumber(name.substr(11)).has_value();
}

// A file the export moves into OUT (all of them but config.json, which comes last).
bool isExportFile(const std::string& name) {
  if (name.rfind("model", 0) == 0 &&
      (endsWith(name, ".safetensors") || name == "model.safetensors.index.json")) {
    return true;
  }
  if (name == kAdapterWeights || name == kAdapterConfig) return true;
  for (const char* file : tensorfile::kModelFolderFiles) {
    if (name == file) return true;
  }
  return false;
}

}  // namespace

std::string checkOutputDir(const std::string& value) {
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument("--output_dir '" + value + "' " + why);
  };
  const fs::path out = examples::normalOutputPath(value);
  if (out.empty()) {
    refuse("names no folder of its own; give a new folder's name (such as out/tuned)");
  }
  struct stat st {};
  if (::lstat(out.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      refuse("is a symbolic link; give the folder itself");
    }
    if (!S_ISDIR(st.st_mode)) refuse("exists and is not a folder; give a new folder");
    std::error_code ec;
    if (fs::exists(fs::symlink_status(out / "config.json", ec))) {
      refuse(
          "already holds a fine-tuned model (config.json); give a new folder (its "
          "checkpoint-<step> folders resume with --resume_from_checkpoint PATH)");
    }
    if (fs::exists(fs::symlink_status(out / kAdapterConfig, ec))) {
      refuse("already holds a LoRA adapter (" + std::string(kAdapterConfig) +
             "); give a new folder (--adapter " + out.string() + " trains it further)");
    }
    for (const auto& entry : fs::directory_iterator(out, ec)) {
      const std::string entry_name = entry.path().filename().string();
      if (entry.is_symlink(ec)) refuse("holds a symbolic link '" + entry_name + "'");
      const bool folder = entry.is_directory(ec);
      if (folder && (isCheckpointName(entry_name) || entry_name == kExportStaging)) continue;
      if (!folder && isExportFile(entry_name)) continue;  // an export cut short: replaced
      refuse("holds '" + entry_name +
             "', which is not this program's (only checkpoint-<step> folders of an earlier run "
             "of it may be there); give a new folder");
    }
    if (ec) refuse("cannot be read: " + ec.message());
  } else if (errno != ENOENT) {
    refuse(std::string("cannot be used: ") + std::strerror(errno));
  }
  if (const std::string why = examples::whyCannotMake(out); !why.empty()) refuse(why);
  return out.string();
}

namespace {

// Rank 0's part of the export: OUT and its staging folder, removed again (the staging folder,
// the files moved so far, OUT itself where this made it and it is left empty) unless committed.
class Staged {
 public:
  explicit Staged(std::string out) : out_(std::move(out)), staging_(out_ + "/" + kExportStaging) {
    std::error_code ec;
    made_out_ = !fs::exists(out_, ec);
    fs::create_directories(out_);
    fs::remove_all(staging_);  // a crashed export's leftovers
  }
  ~Staged() {
    if (committed_) return;
    std::error_code ec;
    fs::remove_all(staging_, ec);
    for (const auto& moved : moved_) fs::remove(moved, ec);
    if (made_out_ && fs::is_empty(out_, ec)) fs::remove(out_, ec);
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  const std::string& path() const { return staging_; }

  // 1. drop an earlier export's files that this one does not have (a cut-short export with
  //    another shard count), 2. move every file but `last` (config.json, or an adapter's
  //    adapter_config.json: what a loader opens first), 3. fsync OUT, 4. move `last`: the
  //    model is there, 5. fsync OUT again, remove the staging folder.
  void commit(const std::string& last) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(staging_)) {
      names.push_back(entry.path().filename().string());
    }
    for (const auto& entry : fs::directory_iterator(out_)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_directory() && isExportFile(name) &&
          std::find(names.begin(), names.end(), name) == names.end()) {
        fs::remove(entry.path());
      }
    }
    for (const auto& name : names) {
      if (name == last) continue;
      fs::rename(staging_ + "/" + name, out_ + "/" + name);
      moved_.push_back(out_ + "/" + name);
    }
    fsyncDirectory(out_);
    fs::rename(staging_ + "/" + last, out_ + "/" + last);
    committed_ = true;
    fsyncDirectory(out_);
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }

 private:
  std::string out_, staging_;
  bool made_out_ = false, committed_ = false;
  std::vector<std::string> moved_;
};

// Rank 0's verdict reaches every rank (none waits for a collective rank 0 left): throws on every
// rank when rank 0 failed. A collective.
void agree(runtime::Accelerator& acc, const std::string& error, const std::string& out) {
  const auto failed = acc.gather(torch::tensor({error.empty() ? 0 : 1}, torch::kInt));
  if (failed[0].item<int>() != 0) {
    throw std::runtime_error(error.empty() ? "rank 0 could not write " + out : error);
  }
}

// The export's protocol, for a model or an adapter: rank 0 stages OUT, every rank runs
// `collective` (rank 0's part writes into the staging folder), rank 0 runs `main_part` (writes
// of its own into it), adds `files` of `model_dir` and commits with `last` moved in last. Throws
// on every rank when rank 0 failed.
void exportFolder(runtime::Accelerator& acc, const std::string& out, const std::string& model_dir,
                  const std::vector<CopiedFile>& files, const std::string& last,
                  const std::function<void(const std::string& staging)>& collective,
                  const std::function<void(const std::string& staging)>& main_part) {
  std::optional<Staged> staged;
  std::string error;
  try {
    if (acc.isMainProcess()) staged.emplace(out);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(acc, error, out);
  collective(staged ? staged->path() : out + "/" + kExportStaging);
  if (staged) {
    try {
      main_part(staged->path());
      for (const CopiedFile& file : files) {
        acc.save(staged->path() + "/" + file.name,
                 readRegularFile(model_dir + "/" + file.name,
                                 "the model's " + std::string(file.name), file.max_bytes));
      }
      staged->commit(last);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  staged.reset();  // removes what an uncommitted export wrote
  agree(acc, error, out);
}

}  // namespace

void writeModel(runtime::Accelerator& acc, const std::string& out, const std::string& model_dir,
                const std::vector<CopiedFile>& files) {
  // Every rank takes part in saveModel's gathers; rank 0 writes. config.json verbatim (the
  // architecture is the same; its other keys, token ids and all, stay) and the tokenizer, so
  // that OUT is a complete HF folder: the files merge-weights copies too.
  exportFolder(
      acc, out, model_dir, files, "config.json",
      [&](const std::string& staging) { acc.saveModel(staging); }, [](const std::string&) {});
}

void writeAdapter(runtime::Accelerator& acc, const std::string& out, const std::string& model_dir,
                  const std::vector<CopiedFile>& files, const std::string& adapter_config,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  // PEFT's save_pretrained writes no config.json: the base's stays the base's.
  std::vector<CopiedFile> tokenizer;
  for (const CopiedFile& file : files) {
    if (std::string(file.name) != "config.json") tokenizer.push_back(file);
  }
  exportFolder(
      acc, out, model_dir, tokenizer, kAdapterConfig, [](const std::string&) {},
      [&](const std::string& staging) {
        fs::create_directories(staging);
        acc.save(staging + "/" + kAdapterWeights, tensors);
        acc.save(staging + "/" + kAdapterConfig, adapter_config);
      });
}

}  // namespace cxxlaunch::finetune
