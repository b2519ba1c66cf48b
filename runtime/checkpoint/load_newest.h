#pragma once
// Loading the newest checkpoint every rank can load: the retry-and-fallback protocol of
// Accelerator::loadState and resume (docs/checkpoints.md), apart from what a load restores.
//
// A collective; one training thread.

#include <functional>
#include <string>

#include "runtime/comm/backend.h"
#include "tensorfile/reader.h"

namespace cxxlaunch::runtime::checkpoint {

// What one attempt does with a checkpoint every rank opened.
struct LoadSteps {
  // Why the job cannot load this checkpoint, nor any older one (a base model other than the one
  // it was trained on); empty when it can. Non-empty on any rank stops the load on every rank.
  std::function<std::string(const tensorfile::Reader&)> refuse;
  // Restores the job from it. A failure is an Error thrown, or the reader's corruption() after
  // it returns; the next attempt restores over whatever this one changed.
  std::function<void(const tensorfile::Reader&)> restore;
};

// Loads the newest of the complete checkpoints `path` names (tensorfile/manifest.h: complete)
// that loads on every rank; returns its directory. Throws InvalidArgument, listing each one
// tried and why, when none does, or `steps.refuse`'s reason.
std::string loadNewest(Backend& backend, const std::string& path, const LoadSteps& steps);

}  // namespace cxxlaunch::runtime::checkpoint
