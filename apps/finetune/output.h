#pragma once
// finetune's output folder OUT: this run's checkpoints (checkpoint-<step>, unless the launch
// names another folder for them) and, at the end, the fine-tuned model at OUT's top level.
//
// The export is staged: the weights and the model folder's files are written into the hidden
// folder OUT/.export.partial, then moved into OUT one by one with config.json last, so that a
// loader (which needs config.json) never sees a half model, and a failure on the way removes
// what it wrote (the checkpoints stay: they are what a rerun resumes from).
//
// Thread-safety: none needed (no shared state).

#include <string>
#include <vector>

#include "apps/finetune/model_folder.h"
#include "runtime/accelerator.h"

namespace cxxlaunch::finetune {

// The staging folder's name inside OUT.
inline constexpr char kExportStaging[] = ".export.partial";

// OUT given to --output_dir, lexically normal and without a trailing separator. Throws
// InvalidArgument, before any work, where the run cannot use it: it names no folder of its own
// ("." or ".."), is a symbolic link, a file, or a folder above it is not one or cannot be
// written; it holds a finished model (a config.json: fine-tuned by an earlier run); or it holds
// anything but this program's own files (checkpoint-<step> folders and their staging names, the
// export's staging folder, the weights and tokenizer files of an export cut short before its
// config.json was moved in).
std::string checkOutputDir(const std::string& value);

// A collective: writes the model (Accelerator::saveModel) and `files` of `model_dir` as the HF
// folder OUT, as said above. Throws on every rank when rank 0 could not write it.
void writeModel(runtime::Accelerator& acc, const std::string& out, const std::string& model_dir,
                const std::vector<CopiedFile>& files);

}  // namespace cxxlaunch::finetune
