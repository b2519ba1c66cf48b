#pragma once
// WorkerSpec: what each local worker is started with, torch.distributed.elastic's WorkerSpec:
// the program, its arguments with torchrun's ${local_rank} macro replaced, and torchrun's
// environment contract (common/env_names.h: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
// TORCHELASTIC_*, the store's endpoint and credentials...) over the launcher's own environment.
//
// Immutable after construction: safe from any thread.

#include <string>
#include <vector>

#include "launcher/node_rendezvous.h"
#include "launcher/options.h"
#include "launcher/worker_group.h"

namespace cxxlaunch::launcher {

class WorkerSpec {
 public:
  // `inherited`: the launcher's environment, "NAME=value" (currentEnvironment()). The contract's
  // variables in it are dropped (they are ours to set), and so are those the user sets for the
  // workers (options.worker_env, which comes last). With more than one worker per node and no
  // OMP_NUM_THREADS, the workers get OMP_NUM_THREADS=1, as with torchrun.
  WorkerSpec(const LaunchOptions& options, const std::vector<std::string>& inherited);

  // How to start `worker` (its ranks and files set) in `world`: program, arguments, environment.
  SpawnSpec of(const Worker& worker, const WorldAssignment& world) const;

  // The complete environment of `worker` in `world`, "NAME=value".
  std::vector<std::string> environment(const Worker& worker, const WorldAssignment& world) const;

 private:
  // Whether the user gave workers `name` (their own environment, or the config's worker env).
  bool userSets(const char* name) const;

  const LaunchOptions& options_;
  std::vector<std::string> base_;
};

// `arg` with each ${local_rank} replaced by `local_rank`.
std::string substituteLocalRank(std::string arg, int local_rank);

}  // namespace cxxlaunch::launcher
