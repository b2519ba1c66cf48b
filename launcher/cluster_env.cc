// Cluster pickup from Slurm's and MPI's variables; docs/clusters.md lists which variable sets
// which setting.

#include "launcher/cluster_env.h"

#include <algorithm>
#include <cctype>

#include "launcher/cli.h"
#include "launcher/hostlist.h"

namespace cxxlaunch::launcher {
namespace {

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  const char* raw(const char* name) const { return lookup_(name); }
  bool has(const char* name) const { return raw(name) != nullptr; }
  std::string text(const char* name) const {
    const char* v = raw(name);
    return v != nullptr ? v : "";
  }
  // The first of `names` that is set, or nullptr.
  const char* first(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (has(name)) return name;
    }
    return nullptr;
  }
  long long number(const char* name, long long lo, long long hi) const {
    const std::string v = text(name);
    const bool digits =
        !v.empty() && v.size() <= 12 &&
        std::all_of(v.begin(), v.end(), [](unsigned char c) { return std::isdigit(c); });
    const long long n = digits ? std::stoll(v) : -1;
    if (n < lo || n > hi) {
      throw UsageError(std::string(name) + "='" + v + "' is not a number from " +
                       std::to_string(lo) + " to " + std::to_string(hi) +
                       " (its launcher sets it; --use_cluster_env=false ignores it)");
    }
    return n;
  }

 private:
  const EnvLookup& lookup_;
};

// A run id from a scheduler's job id: the characters --rdzv_id accepts.
std::string idFrom(const std::string& prefix, const std::string& text) {
  std::string id = prefix + text;
  std::replace_if(
      id.begin(), id.end(),
      [](unsigned char c) { return !std::isalnum(c) && c != '-' && c != '_' && c != '.'; }, '-');
  return id.substr(0, 128);
}

void add(ClusterEnv& env, const std::string& key, const std::string& value, const char* var) {
  env.settings.push_back({key, value, var});
}

// MASTER_ADDR / MASTER_PORT, as torch's env:// reads them, name the rendezvous when set.
bool masterFromEnv(const Reader& r, ClusterEnv& env) {
  if (r.has("MASTER_PORT")) {
    add(env, "main_process_port", std::to_string(r.number("MASTER_PORT", 1, 65535)), "MASTER_PORT");
  }
  if (!r.has("MASTER_ADDR")) return false;
  if (r.text("MASTER_ADDR").empty()) throw UsageError("MASTER_ADDR is set but empty");
  add(env, "main_process_ip", r.text("MASTER_ADDR"), "MASTER_ADDR");
  return true;
}

//  Each mpirun process is one node agent: its MPI rank is the node rank, the MPI world the
//  node count. Rank 0's host is the rendezvous: MASTER_ADDR when set, else 127.0.0.1 when every
//  rank runs on this host; across hosts without MASTER_ADDR there is no way to know it.
ClusterEnv mpiPickup(const Reader& r, bool open_mpi) {
  ClusterEnv env;
  env.source = open_mpi ? "Open MPI" : "MPI";
  const char* size_var = open_mpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const char* rank_var = open_mpi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const char* local_size_var = open_mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
  const long long size = r.number(size_var, 1, 65536);
  const long long rank = r.number(rank_var, 0, size - 1);
  add(env, "num_machines", std::to_string(size), size_var);
  add(env, "machine_rank", std::to_string(rank), rank_var);
  if (!masterFromEnv(r, env) && size > 1) {
    const bool one_host = r.has(local_size_var) && r.number(local_size_var, 1, size) == size;
    if (!one_host) {
      throw UsageError(std::string("mpirun started ") + std::to_string(size) +
                       " launchers on more than one host (or did not say, " + local_size_var +
                       "): give them rank 0's host, e.g. mpirun -x MASTER_ADDR=<host of rank 0> "
                       "... cxxlaunch run ..., or --rdzv_endpoint HOST:PORT");
    }
    add(env, "main_process_ip", "127.0.0.1", local_size_var);
  }
  if (const char* id = r.first({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"})) {
    add(env, "cxxlaunch.rdzv_id", idFrom("mpi-", r.text(id)), id);
  }
  return env;
}

//  One launcher per node of the step (srun --ntasks-per-node=1): SLURM_NODEID is the node
//  rank, the step's node count the number of nodes, its first host the rendezvous (unless
//  MASTER_ADDR says otherwise), SLURM_GPUS_ON_NODE the workers per node.
ClusterEnv slurmPickup(const Reader& r) {
  ClusterEnv env;
  env.source = "Slurm";
  const bool step = r.has("SLURM_STEP_ID");  // under srun; the batch script has no step id
  const char* nodes_var = step && r.has("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES"
                          : r.has("SLURM_NNODES")               ? "SLURM_NNODES"
                                                                : "SLURM_JOB_NUM_NODES";
  const char* list_var = step && r.has("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                         : r.has("SLURM_JOB_NODELIST")        ? "SLURM_JOB_NODELIST"
                                                              : "SLURM_NODELIST";
  const long long nodes = r.has(nodes_var) ? r.number(nodes_var, 1, 65536) : 1;
  const long long node = r.has("SLURM_NODEID") ? r.number("SLURM_NODEID", 0, nodes - 1) : 0;
  if (!step && nodes > 1) {
    throw UsageError("this is the batch script of a " + std::to_string(nodes) +
                     "-node allocation (SLURM_JOB_ID set, no SLURM_STEP_ID), which runs "
                     "on its first node only: start one launcher per node with "
                     "srun --ntasks-per-node=1 cxxlaunch run ...");
  }
  if (step && r.has("SLURM_STEP_NUM_TASKS")) {
    const long long tasks = r.number("SLURM_STEP_NUM_TASKS", 1, 1 << 24);
    if (tasks != nodes) {
      throw UsageError("srun started " + std::to_string(tasks) + " tasks on " +
                       std::to_string(nodes) +
                       " nodes; cxxlaunch is one launcher per node, which starts the workers: "
                       "srun --ntasks-per-node=1 cxxlaunch run --nproc_per_node=N ...");
    }
  }
  add(env, "num_machines", std::to_string(nodes), nodes_var);
  add(env, "machine_rank", std::to_string(node), "SLURM_NODEID");
  if (!masterFromEnv(r, env) && r.has(list_var)) {
    std::vector<std::string> hosts;
    try {
      hosts = expandHostlist(r.text(list_var));
    } catch (const InvalidArgument& e) {
      throw UsageError(std::string(list_var) + ": " + e.what());
    }
    if (static_cast<long long>(hosts.size()) != nodes) {
      throw UsageError(std::string(list_var) + " names " + std::to_string(hosts.size()) +
                       " hosts but " + nodes_var + " is " + std::to_string(nodes));
    }
    add(env, "main_process_ip", hosts.front(), list_var);
  }
  std::string id = r.text("SLURM_JOB_ID");
  if (step) id += "." + r.text("SLURM_STEP_ID");
  add(env, "cxxlaunch.rdzv_id", idFrom("slurm-", id), "SLURM_JOB_ID");
  if (r.has("SLURM_GPUS_ON_NODE")) {
    const long long gpus = r.number("SLURM_GPUS_ON_NODE", 0, 1 << 16);
    if (gpus > 0) {
      add(env, "num_processes", std::to_string(gpus * nodes), "SLURM_GPUS_ON_NODE");
    }
  }
  if (r.has("SLURM_CPUS_ON_NODE")) {
    env.cpus = static_cast<int>(r.number("SLURM_CPUS_ON_NODE", 1, 1 << 20));
  }
  return env;
}

}  // namespace

ClusterEnv detectCluster(const EnvLookup& lookup) {
  const Reader r(lookup);
  const bool open_mpi = r.has("OMPI_COMM_WORLD_SIZE");
  const bool mpi = open_mpi || r.has("PMI_SIZE");
  if (!mpi && !r.has("SLURM_JOB_ID")) return {};
  try {
    return mpi ? mpiPickup(r, open_mpi) : slurmPickup(r);
  } catch (const UsageError& e) {
    ClusterEnv failed;
    failed.source = mpi ? (open_mpi ? "Open MPI" : "MPI") : "Slurm";
    failed.error = e.what();
    return failed;
  }
}

}  // namespace cxxlaunch::launcher
