// From the config to the hostfile start (launcher/remote.h): which hosts, what each agent is
// told, where they meet. docs/clusters.md#hostfile.

#include <filesystem>
#include <set>

#include "common/host.h"
#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/doc_reference.h"
#include "launcher/flag_values.h"
#include "launcher/remote.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace cxxlaunch::launcher {
namespace {

// Flags the hostfile start sets for each agent itself, or that mean nothing to one agent.
const std::set<std::string>& notPassedOn() {
  static const std::set<std::string> names = {"hostfile",
                                              "include",
                                              "exclude",
                                              "num_nodes",
                                              "num_gpus",
                                              "ssh_opts",
                                              "nnodes",
                                              "node_rank",
                                              "rdzv_backend",
                                              "rdzv_endpoint",
                                              "run_id",
                                              "nproc_per_node",
                                              "gpus",
                                              "num_machines",
                                              "machine_rank",
                                              "main_process_ip",
                                              "main_process_port",
                                              "num_processes",
                                              "gpu_ids",
                                              "use_cluster_env",
                                              "deepspeed_multinode_launcher",
                                              "standalone"};
  return names;
}

// Variables the agents get from this environment, as DeepSpeed exports NCCL_* and friends. The
// job token stays out: it would show in the remote command line (use token_file=).
bool exported(const std::string& name) {
  if (name == "CXXLAUNCH_TOKEN") return false;
  for (const char* prefix : {"CXXLAUNCH_", "NCCL_", "GLOO_", "OMP_"}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

std::vector<std::string> splitWords(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text + " ") {
    if (c == ' ' || c == '\t') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  return words;
}

}  // namespace

std::optional<RemoteLaunch> planRemoteLaunch(const RemotePlan& plan) {
  const Config& c = plan.config;
  const std::string hostfile = c.text("deepspeed_config.deepspeed_hostfile");
  const std::string launcher = c.text("deepspeed_config.deepspeed_multinode_launcher");
  const bool from_file = c.origin("deepspeed_config.deepspeed_hostfile").kind == Origin::kFile;
  const bool multi = c.integer("num_machines") > 1;
  const std::string at = c.origin("deepspeed_config.deepspeed_multinode_launcher").where;
  if (c.isSet("deepspeed_config.deepspeed_multinode_launcher") && (!hostfile.empty() || multi)) {
    if (launcher == "slurm") {
      throw UsageError(at +
                       ": deepspeed_multinode_launcher slurm: run srun cxxlaunch run ... "
                       "inside the allocation instead (see " +
                       docReference("clusters.md", "Slurm") + ")");
    }
    if (launcher == "openmpi" || launcher == "mvapich" || launcher == "mpich" ||
        launcher == "impi") {
      throw UsageError(at + ": deepspeed_multinode_launcher " + launcher +
                       ": run mpirun -np NODES cxxlaunch run ... instead (see " +
                       docReference("clusters.md", "MPI") + ")");
    }
  }
  if (hostfile.empty() || (from_file && !multi)) return std::nullopt;
  if (launcher == "standard" || launcher == "nossh") return std::nullopt;  // one per machine

  RemoteLaunch r;
  HostFilter filter;
  filter.include = c.text("deepspeed_config.deepspeed_inclusion_filter");
  filter.exclude = c.text("deepspeed_config.deepspeed_exclusion_filter");
  filter.num_nodes = static_cast<int>(c.integer("cxxlaunch.num_nodes"));
  filter.num_gpus = static_cast<int>(c.integer("cxxlaunch.num_gpus"));
  r.hosts = filterHosts(readHostfile(hostfile), filter);
  r.ssh = {"ssh"};
  for (auto& word : splitWords(c.text("cxxlaunch.ssh_opts"))) r.ssh.push_back(word);
  if (!plan.endpoint.empty()) {
    r.endpoint = plan.endpoint;
  } else {
    const std::string port = c.text("main_process_port");
    if (port == "0") {
      throw UsageError(
          "--hostfile: main_process_port 0 (a free port) works on one machine only; "
          "choose the rendezvous port on " +
          r.hosts.front().host);
    }
    r.endpoint = formatHostPort(r.hosts.front().host, port);
  }
  r.run_id = plan.run_id;
  std::error_code ec;
  r.launcher = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (r.launcher.empty()) r.launcher = "cxxlaunch";
  r.cwd = std::filesystem::current_path(ec).string();
  for (const auto& [name, value] : plan.given) {
    if (notPassedOn().count(name) != 0) continue;
    r.flags.push_back(value ? "--" + name + "=" + *value : "--" + name);
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && exported(entry.substr(0, eq))) {
      r.env[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
  }
  // An agent starts no hosts of its own, whatever its config file says.
  for (const char* name : {"CXXLAUNCH_HOSTFILE", "CXXLAUNCH_INCLUDE", "CXXLAUNCH_EXCLUDE",
                           "CXXLAUNCH_NUM_NODES", "CXXLAUNCH_NUM_GPUS"}) {
    r.env.erase(name);
  }
  r.env["CXXLAUNCH_HOSTFILE"] = "";
  r.command = plan.command;
  return r;
}

}  // namespace cxxlaunch::launcher
