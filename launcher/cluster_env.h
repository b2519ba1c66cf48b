#pragma once
// Cluster pickup: what a job scheduler or an MPI launcher already says about this node's place
// in the job, read from the variables it sets, so that `srun cxxlaunch run ./train` and
// `mpirun -np N cxxlaunch run ./train` need no multi-node flags (docs/clusters.md).
//
// The pickup becomes a layer of the config (launcher/config.h) between the file and the
// CXXLAUNCH_* variables: flags and CXXLAUNCH_* variables win over it, it wins over the file and
// the defaults. Each value keeps the variable it came from, which `config --print` and errors name.
//
// Which one: Open MPI's OMPI_COMM_WORLD_* first (mpirun inside an allocation also inherits the
// allocation's SLURM_* variables), then MPICH's / Intel MPI's PMI_SIZE, then SLURM_JOB_ID. With
// none of these set the pickup costs three lookups. Plain functions, thread-safe.

#include <functional>
#include <string>
#include <vector>

#include "launcher/config.h"

namespace cxxlaunch::launcher {

struct ClusterEnv {
  std::string source;  // "Slurm", "Open MPI", "MPI"; empty: none found
  // Config keys with their values; FlagValue::flag names the variable they came from.
  std::vector<FlagValue> settings;
  int cpus = 0;  // SLURM_CPUS_ON_NODE: what --nproc_per_node cpu|auto count on; 0: the machine's
  // Why the variables cannot be used (malformed, contradictory, or a multi-node allocation's
  // batch script rather than srun), one line; `cxxlaunch run` refuses to start with it unless
  // the pickup is turned off (cxxlaunch.use_cluster_env false).
  std::string error;
};

// A variable's value, or nullptr when it is unset (std::getenv in production).
using EnvLookup = std::function<const char*(const char*)>;

// The pickup for the variables `lookup` sees; never throws (see ClusterEnv::error).
ClusterEnv detectCluster(const EnvLookup& lookup);

}  // namespace cxxlaunch::launcher
