#include "launcher/launch_options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "common/host.h"
#include "launcher/flag_values.h"
#include "launcher/gpus.h"
#include "launcher/progress.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::launcher {

namespace {

void validateRendezvous(LaunchOptions& o) {
  RendezvousOptions& r = o.rdzv;
  if (o.standalone && r.max_nodes > 1) {
    throw UsageError("--standalone is a single-node job; drop it or --nnodes");
  }
  if (o.standalone) r.endpoint.clear();
  if (r.backend == "static") {
    if (r.min_nodes != r.max_nodes) {
      throw UsageError("--rdzv_backend static needs a fixed --nnodes, not " +
                       std::to_string(r.min_nodes) + ":" + std::to_string(r.max_nodes));
    }
    if (r.max_nodes > 1 && r.node_rank < 0) {
      throw UsageError("--rdzv_backend static needs --node_rank (0-" +
                       std::to_string(r.max_nodes - 1) + ") on every node");
    }
    if (r.node_rank >= r.max_nodes) {
      throw UsageError("--node_rank " + std::to_string(r.node_rank) + " is out of range for " +
                       std::to_string(r.max_nodes) + " nodes");
    }
  }
  if (r.etcd()) {
    if (r.endpoint.empty()) {
      throw UsageError(
          "--rdzv_backend etcd needs --rdzv_endpoint HOST:PORT[,HOST:PORT...]: the etcd "
          "members");
    }
    if (!r.etcd_user.empty() && r.etcd_password.empty()) {
      throw UsageError("--rdzv_conf user= needs password= or password_file=");
    }
    if (!o.run_id_given) {
      throw UsageError("--rdzv_backend etcd needs --rdzv_id: the same job id on every node");
    }
  } else if (!r.etcd_root.empty()) {
    throw UsageError("--rdzv_conf etcd_prefix is for --rdzv_backend etcd; the " + r.backend +
                     " backend keeps no keys in etcd");
  } else if (r.endpoint.find(',') != std::string::npos ||
             r.etcd_endpoints.find("://") != std::string::npos) {
    throw UsageError("--rdzv_endpoint " + r.etcd_endpoints +
                     ": a list of endpoints or a URL is for --rdzv_backend etcd; the " + r.backend +
                     " backend meets at one HOST:PORT");
  }
  if (r.max_nodes > 1 && r.endpoint.empty()) {
    throw UsageError(
        "a multi-node job needs --rdzv_endpoint HOST:PORT: the rendezvous server, or the host "
        "whose launcher should start it");
  }
  if (r.multiNode() && !o.run_id_given) {
    throw UsageError("a multi-node job needs --rdzv_id: the same job id on every node");
  }
  if ((r.tls_cert.empty()) != (r.tls_key.empty())) {
    throw UsageError("--rdzv_conf: tls_cert and tls_key go together");
  }
  if (r.token.empty()) {
    const char* token = std::getenv("CXXLAUNCH_TOKEN");  // NOLINT(concurrency-mt-unsafe)
    if (token != nullptr) r.token = token;
  }
}

}  // namespace

// The config's launch settings become the options torchrun's flags would set; the flags are
// applied afterwards and win. See docs/config.md, "How the file maps to the launcher".
void applyConfig(const Config& c, RunFlags& p, const std::map<std::string, std::string>& env) {
  LaunchOptions& o = p.options;
  auto seconds = [&](const std::string& key, std::chrono::milliseconds& out) {
    if (c.isSet(key)) out = std::chrono::milliseconds(std::llround(c.number(key) * 1000));
  };
  const int machines = static_cast<int>(c.integer("num_machines"));
  o.rdzv.min_nodes = o.rdzv.max_nodes = machines;
  if (c.isSet("num_processes")) {
    // Not "explicit": a --gpus flag is stronger than the file and sets the count instead.
    p.nproc_text = std::to_string(c.integer("num_processes") / machines);
  }
  const bool cpu = c.flag("use_cpu") || c.text("distributed_type") == "MULTI_CPU";
  if (!cpu && c.text("gpu_ids") != "all") o.gpus = parseIntList("gpu_ids", c.text("gpu_ids"));
  if (c.isSet("rdzv_backend") || machines > 1) {
    o.rdzv.backend = c.text("rdzv_backend") == "etcd-v2" ? "etcd" : c.text("rdzv_backend");
  }
  const std::string port = c.text("main_process_port");
  if (machines > 1) {
    // Both of accelerate's same_network modes meet at main_process_ip:main_process_port: the
    // launcher on that machine hosts the rendezvous there.
    o.rdzv.node_rank = static_cast<int>(c.integer("machine_rank"));
    if (c.isSet("cxxlaunch.rdzv_endpoint")) {
      o.rdzv.endpoint = parseEndpoint("cxxlaunch.rdzv_endpoint", c.text("cxxlaunch.rdzv_endpoint"));
    } else {
      if (port == "0") {
        throw ConfigError(c.origin("main_process_port").where +
                          ": main_process_port 0 (pick a free port) works on one machine only; "
                          "choose a port that every machine can reach");
      }
      const std::string ip = c.text("main_process_ip");
      o.rdzv.endpoint = parseEndpoint("main_process_ip", formatHostPort(ip, port));
      // Every machine reads the same file, so an id derived from it is the same everywhere.
      std::string id = "accelerate-" + ip + "-" + port;
      std::replace_if(
          id.begin(), id.end(), [](unsigned char ch) { return !std::isalnum(ch) && ch != '-'; },
          '-');
      o.run_id = id;
      o.run_id_given = true;
    }
  } else if (c.isSet("main_process_port")) {
    o.master_port = static_cast<int>(c.integer("main_process_port"));
  }
  if (c.isSet("cxxlaunch.rdzv_id")) {
    o.run_id = c.text("cxxlaunch.rdzv_id");
    o.run_id_given = true;
  }
  seconds("cxxlaunch.join_timeout", o.rdzv.join_timeout);
  seconds("cxxlaunch.last_call_timeout", o.rdzv.last_call_timeout);
  seconds("cxxlaunch.close_timeout", o.rdzv.close_timeout);
  seconds("cxxlaunch.keep_alive_interval", o.rdzv.keep_alive_interval);
  seconds("cxxlaunch.shutdown_grace", o.shutdown_grace);
  o.rdzv.keep_alive_max_misses = static_cast<int>(c.integer("cxxlaunch.keep_alive_max_misses"));
  o.max_restarts = static_cast<int>(c.integer("cxxlaunch.max_restarts"));
  if (c.isSet("cxxlaunch.log_dir")) o.log_dir = c.text("cxxlaunch.log_dir");
  o.progress = parseProgressMode(c.text("cxxlaunch.progress"));
  if (c.isSet("cxxlaunch.token_file")) {
    try {
      o.rdzv.token = readTokenFile(c.text("cxxlaunch.token_file"));
    } catch (const UsageError& e) {
      throw ConfigError(c.origin("cxxlaunch.token_file").where +
                        ": cxxlaunch.token_file: " + e.what());
    }
  }
  o.worker_env = workerSettings(c, env);
  if (c.flag("use_cpu")) o.worker_env["CUDA_VISIBLE_DEVICES"] = "";
  o.config_notes = c.notes;
  if (c.text("mixed_precision") == "fp8") {
    o.config_notes.push_back(c.origin("mixed_precision").where +
                             ": mixed_precision fp8 is not supported yet; training runs in bf16");
  }
}

ConfigLayers configLayers(const std::string& file, const std::vector<FlagValue>& flags,
                          const HostInfo& host) {
  ConfigLayers layers;
  layers.file = file;
  std::error_code ec;
  if (layers.file.empty() && !host.default_config.empty() &&
      std::filesystem::exists(host.default_config, ec)) {
    layers.file = host.default_config;
  }
  layers.cluster = host.cluster.settings;
  layers.env = host.env;
  layers.flags = flags;
  return layers;
}

int resolveNproc(const std::string& text, const LaunchOptions& options, const HostInfo& host) {
  if (text == "cpu") return std::max(host.cpus, 1);
  if (text == "gpu" || text == "auto") {
    int gpus = options.gpus.empty() ? host.gpus : static_cast<int>(options.gpus.size());
    if (gpus > 0) return gpus;
    if (text == "auto") return std::max(host.cpus, 1);
    throw UsageError("--nproc_per_node=gpu: no GPU found on this machine; use a number or 'cpu'");
  }
  return parseInt("nproc_per_node", text, 1, 1 << 16, "a number >= 1, cpu, gpu or auto");
}

void checkProcessCounts(const Config& c, LaunchOptions& options) {
  if (!c.isSet("num_processes")) return;
  const long long total = c.integer("num_processes");
  const long long machines = c.integer("num_machines");
  if (total / machines == options.nproc_per_node) return;
  const Origin& from = c.origin("num_processes");
  const std::string nproc = "--nproc_per_node " + std::to_string(options.nproc_per_node);
  const std::string per_machine = machines > 1 ? " (" + std::to_string(total / machines) +
                                                     " per machine over " +
                                                     std::to_string(machines) + " machines)"
                                               : "";
  if (from.kind == Origin::kFlag) {
    throw UsageError(nproc + " conflicts with " + from.where + " " + std::to_string(total) +
                     per_machine + "; give one of them");
  }
  options.config_notes.push_back(nproc + " overrides num_processes " + std::to_string(total) +
                                 per_machine + " from " + from.describe());
}

void validateLaunch(LaunchOptions& options, bool nproc_explicit) {
  if (!options.gpus.empty() && options.gpus.size() != static_cast<size_t>(options.nproc_per_node)) {
    if (nproc_explicit) {
      throw UsageError("--gpus names " + std::to_string(options.gpus.size()) +
                       " devices but --nproc_per_node is " +
                       std::to_string(options.nproc_per_node) + "; give one GPU id per worker");
    }
    options.nproc_per_node = static_cast<int>(options.gpus.size());
  }
  if (!options.gpus.empty()) {
    options.worker_env["CUDA_VISIBLE_DEVICES"] = visibleDevices(
        options.gpus, std::getenv("CUDA_VISIBLE_DEVICES"));  // NOLINT(concurrency-mt-unsafe)
  }
  // Each bound holds alone; their product is the job's world size, the largest rank offset + 1.
  const long long world = static_cast<long long>(options.rdzv.max_nodes) * options.nproc_per_node;
  if (world > rendezvous::kMaxWorldSize) {
    throw UsageError(std::to_string(options.rdzv.max_nodes) + " nodes x " +
                     std::to_string(options.nproc_per_node) +
                     " workers per node = " + std::to_string(world) + " ranks, more than the " +
                     std::to_string(rendezvous::kMaxWorldSize) +
                     " a job may have; lower --nnodes or --nproc_per_node");
  }
  validateRendezvous(options);
}

void warnOversubscription(const Config& c, LaunchOptions& options, const HostInfo& host) {
  const int workers = options.nproc_per_node;
  const bool cpu = c.flag("use_cpu") || c.text("distributed_type") == "MULTI_CPU";
  const std::string count = std::to_string(workers) + " worker processes";
  if (!cpu && host.gpus > 0) {
    // --gpus (gpu_ids) names exactly one per worker (validateLaunch); only a count can exceed.
    if (options.gpus.empty() && workers > host.gpus) {
      options.warnings.push_back(
          count + " on " + std::to_string(host.gpus) +
          " GPU(s): a program that takes cuda:LOCAL_RANK fails on local ranks " +
          std::to_string(host.gpus) +
          " and above, and workers that share a GPU run slower and split its memory; use "
          "--nproc_per_node " +
          std::to_string(host.gpus) + " or fewer, or --cpu");
    }
    return;
  }
  if (workers > host.cpus) {
    options.warnings.push_back(
        count + " on " + std::to_string(host.cpus) +
        " CPU core(s) available to this launcher: the workers will share cores "
        "(oversubscribed), so each step runs slower than with " +
        std::to_string(host.cpus) + " worker(s) or fewer; lower --nproc_per_node or num_processes");
  }
}

}  // namespace cxxlaunch::launcher
