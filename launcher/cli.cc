#include "launcher/cli.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string_view>

#include "launcher/config.h"
#include "launcher/process.h"
#include "common/did_you_mean.h"
#include "common/file.h"
#include "common/host.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::launcher {
namespace {

// ---- value parsers: each throws UsageError naming the flag and what it accepts ------------

constexpr double kRendezvousSeconds =
    std::chrono::duration<double>(rendezvous::kMaxSettingTime).count();

[[noreturn]] void fail(const std::string& flag, const std::string& value, const std::string& want) {
  throw UsageError("--" + flag + ": '" + value + "' is not " + want);
}

bool parseIntText(std::string_view text, long long& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

int parseInt(const std::string& flag, const std::string& value, long long lo, long long hi,
             const std::string& want) {
  long long v = 0;
  if (!parseIntText(value, v) || v < lo || v > hi) fail(flag, value, want);
  return static_cast<int>(v);
}

// `max_seconds`: 1e7 s (115 days) for the launcher's own times; the rendezvous times have the
// daemon's bound (rendezvous::kMaxSettingTime), checked here rather than refused after launch.
std::chrono::milliseconds parseSeconds(const std::string& flag, const std::string& value,
                                       bool allow_zero, double max_seconds = 1e7) {
  char* end = nullptr;
  double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !(seconds >= 0) ||
      (!allow_zero && seconds == 0) || seconds > max_seconds) {
    fail(flag, value,
         std::string(allow_zero ? "a number of seconds >= 0" : "a number of seconds > 0") +
             " and <= " + std::to_string(static_cast<long long>(max_seconds)));
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

std::vector<int> parseIntList(const std::string& flag, const std::string& value) {
  std::vector<int> list;
  for (const auto& item : split(value, ',')) {
    list.push_back(parseInt(flag, item, 0, 1 << 20, "a comma-separated list of numbers, e.g. 0,2"));
  }
  if (list.empty()) fail(flag, value, "a comma-separated list of numbers, e.g. 0,2");
  return list;
}

StreamSpec parseStreamSpec(const std::string& flag, const std::string& value) {
  const std::string want = "0-3 or a per-local-rank map such as 0:3,1:1";
  StreamSpec spec;
  if (value.find(':') == std::string::npos) {
    spec.all = parseInt(flag, value, 0, 3, want);
    return spec;
  }
  for (const auto& item : split(value, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) fail(flag, value, want);
    int rank = parseInt(flag, item.substr(0, colon), 0, 1 << 20, want);
    spec.per_rank[rank] = parseInt(flag, item.substr(colon + 1), 0, 3, want);
  }
  return spec;
}

void parseNnodes(RendezvousOptions& r, const std::string& flag, const std::string& value) {
  const std::string want = "a number of nodes >= 1, or MIN:MAX with 1 <= MIN <= MAX";
  auto colon = value.find(':');
  if (colon == std::string::npos) {
    r.min_nodes = r.max_nodes = parseInt(flag, value, 1, 65536, want);
    return;
  }
  r.min_nodes = parseInt(flag, value.substr(0, colon), 1, 65536, want);
  r.max_nodes = parseInt(flag, value.substr(colon + 1), 1, 65536, want);
  if (r.min_nodes > r.max_nodes) fail(flag, value, want);
}

std::string parseEndpoint(const std::string& flag, const std::string& value) {
  const auto parsed = parseHostPort(value, 29400);  // torchrun's c10d default port
  if (!parsed) fail(flag, value, "HOST or HOST:PORT with a port 1-65535");
  return formatHostPort(parsed->host, parsed->port);
}

std::string readTokenFile(const std::string& path) {
  try {
    return cxxlaunch::readTokenFile(path, "--rdzv_conf token_file");
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

void parseRdzvConf(RendezvousOptions& r, const std::string& flag, const std::string& value) {
  for (const auto& item : split(value, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) fail(flag, value, "a list of KEY=VALUE separated by commas");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    const std::string name = flag + " " + key;
    if (key == "join_timeout" || key == "timeout") {
      r.join_timeout = parseSeconds(name, v, false);
    } else if (key == "last_call_timeout") {
      r.last_call_timeout = parseSeconds(name, v, true, kRendezvousSeconds);
    } else if (key == "close_timeout") {
      r.close_timeout = parseSeconds(name, v, true);
    } else if (key == "keep_alive_interval") {
      r.keep_alive_interval = parseSeconds(name, v, false, kRendezvousSeconds);
    } else if (key == "keep_alive_max_misses") {
      r.keep_alive_max_misses = parseInt(name, v, 1, 1000, "a number >= 1");
    } else if (key == "is_host") {
      if (v != "true" && v != "false" && v != "1" && v != "0") fail(name, v, "true or false");
      r.is_host = v == "true" || v == "1";
    } else if (key == "token_file") {
      r.token = readTokenFile(v);
    } else if (key == "tls_ca") {
      r.tls_ca = v;
    } else if (key == "tls_cert") {
      r.tls_cert = v;
    } else if (key == "tls_key") {
      r.tls_key = v;
    } else {
      const std::string best = closestMatch(
          key, {"join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval",
                "keep_alive_max_misses", "is_host", "token_file", "tls_ca", "tls_cert", "tls_key"});
      throw UsageError("--" + flag + ": unknown key '" + key + "'" +
                       (best.empty() ? "" : "; did you mean " + best + "?"));
    }
  }
}

std::string normalize(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

// ---- the flag table ---------------------------------------------------------------------

struct Parsed {
  LaunchOptions options;
  std::string nproc_text;
  bool nproc_explicit = false;  // a number given by --nproc_per_node
  std::string config_file;
  std::vector<FlagValue> config_flags;
};

struct FlagSpec {
  std::vector<std::string> names;  // long names in under_score form; one-letter names are short
  std::string value_name;          // empty: a switch that takes no value
  std::string help;
  std::function<void(Parsed&, const std::string& flag, const std::string& value)> apply;
  // Config flags (accelerate's) feed the config's flag layer and are read first; torchrun's
  // flags are applied after the config, so they win over it.
  bool config = false;
};

// accelerate's `launch` flags: one per config key that has one, plus its hardware and paradigm
// switches.
std::vector<FlagSpec> configFlags() {
  auto setKey = [](std::string key, std::string value) {
    return [key, value](Parsed& p, const std::string& flag, const std::string& given) {
      p.config_flags.push_back({key, value.empty() ? given : value, "--" + flag});
    };
  };
  std::vector<FlagSpec> flags = {
      {{"config_file"},
       "FILE",
       "accelerate-style YAML (default: " + defaultConfigPath() + " when it exists)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         if (v.empty()) fail(f, v, "a file name");
         p.config_file = v;
       },
       true},
      {{"cpu"}, "", "train on CPUs (use_cpu: true)", setKey("use_cpu", "true"), true},
      {{"multi_gpu"},
       "",
       "distributed_type: MULTI_GPU",
       setKey("distributed_type", "MULTI_GPU"),
       true},
      {{"use_deepspeed"},
       "",
       "distributed_type: DEEPSPEED (ZeRO; see --zero_stage)",
       setKey("distributed_type", "DEEPSPEED"),
       true},
      {{"use_fsdp"}, "", "distributed_type: FSDP", setKey("distributed_type", "FSDP"), true},
  };
  for (const auto& spec : configSchema()) {
    if (spec.flag.empty()) continue;
    const bool is_switch = spec.key == "use_cpu" || spec.key == "debug";
    std::string value_name = spec.type == KeyType::kBool     ? "true|false"
                             : spec.type == KeyType::kText   ? "TEXT"
                             : spec.type == KeyType::kGpuIds ? "IDS|all"
                                                             : "N";
    if (spec.type == KeyType::kChoice) {
      value_name.clear();
      for (const auto& choice : spec.choices)
        value_name += (value_name.empty() ? "" : "|") + choice;
    }
    flags.push_back({{spec.flag},
                     is_switch ? "" : value_name,
                     spec.help + " (config: " + spec.key + ")",
                     setKey(spec.key, is_switch ? "true" : ""),
                     true});
  }
  return flags;
}

const std::vector<FlagSpec>& flagTable() {
  static const std::vector<FlagSpec> table = {
      {{"nproc_per_node"},
       "N|cpu|gpu|auto",
       "workers on this node (default 1)",
       [](Parsed& p, const std::string&, const std::string& v) {
         p.nproc_text = v;
         p.nproc_explicit = v != "gpu" && v != "auto";
       }},
      {{"gpus"},
       "IDS",
       "GPU ids to use, e.g. 0,2: one worker per id",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.gpus = parseIntList(f, v);
       }},
      {{"standalone"},
       "",
       "single-node job with a private rendezvous (the default here)",
       [](Parsed& p, const std::string&, const std::string&) { p.options.standalone = true; }},
      {{"max_restarts"},
       "N",
       "restarts of the worker group before failing (default 0)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.max_restarts = parseInt(f, v, 0, 1'000'000, "a number >= 0");
       }},
      {{"monitor_interval"},
       "SECONDS",
       "accepted for torchrun compatibility; cxxlaunch reacts to exits at once",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.monitor_interval = parseSeconds(f, v, false);
       }},
      {{"shutdown_grace"},
       "SECONDS",
       "SIGTERM to SIGKILL grace when stopping workers (default 30)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.shutdown_grace = parseSeconds(f, v, true);
       }},
      {{"role"},
       "NAME",
       "worker role: ROLE_NAME (default 'default')",
       [](Parsed& p, const std::string& f, const std::string& v) {
         if (v.empty()) fail(f, v, "a non-empty name");
         p.options.role = v;
       }},
      {{"log_dir"},
       "DIR",
       "where per-attempt, per-rank logs go (default $TMPDIR/cxxlaunch)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         if (v.empty()) fail(f, v, "a directory");
         p.options.log_dir = v;
       }},
      {{"redirects", "r"},
       "SPEC",
       "streams kept off the console (files only): 0-3 or 0:3,1:1",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.redirects = parseStreamSpec(f, v);
       }},
      {{"tee", "t"},
       "SPEC",
       "streams echoed to the console as well (the default for all)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.tee = parseStreamSpec(f, v);
       }},
      {{"local_ranks_filter"},
       "RANKS",
       "only these local ranks reach the console, e.g. 0",
       [](Parsed& p, const std::string& f, const std::string& v) {
         auto list = parseIntList(f, v);
         p.options.local_ranks_filter = std::set<int>(list.begin(), list.end());
       }},
      {{"master_addr"},
       "HOST",
       "MASTER_ADDR given to workers (default 127.0.0.1)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         if (v.empty()) fail(f, v, "a host name or address");
         p.options.master_addr = v;
       }},
      {{"master_port"},
       "PORT",
       "MASTER_PORT (default: a free port; 0 picks one too)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.master_port = parseInt(f, v, 0, 65535, "a port number 0-65535");
       }},
      {{"run_id", "rdzv_id"},
       "ID",
       "job id: TORCHELASTIC_RUN_ID and the log folder (default random)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         const bool ok = !v.empty() && v.size() <= 128 && v != "." && v != ".." &&
                         std::all_of(v.begin(), v.end(), [](unsigned char c) {
                           return std::isalnum(c) || c == '-' || c == '_' || c == '.';
                         });
         if (!ok) fail(f, v, "an id of at most 128 letters, digits, '-', '_' or '.'");
         p.options.run_id = v;
         p.options.run_id_given = true;
       }},
      {{"no_python"},
       "",
       "accepted: cxxlaunch always executes the program itself",
       [](Parsed&, const std::string&, const std::string&) {}},
      {{"nnodes"},
       "N|MIN:MAX",
       "nodes in the job; MIN:MAX for an elastic job (default 1)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         parseNnodes(p.options.rdzv, f, v);
       }},
      {{"node_rank"},
       "N",
       "this node's rank (static rendezvous backend)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.rdzv.node_rank = parseInt(f, v, 0, 65535, "a node rank >= 0");
       }},
      {{"rdzv_backend"},
       "c10d|static",
       "c10d: ranks by node id (default); static: by --node_rank",
       [](Parsed& p, const std::string& f, const std::string& v) {
         if (v != "c10d" && v != "static") fail(f, v, "c10d or static");
         p.options.rdzv.backend = v;
       }},
      {{"rdzv_endpoint"},
       "HOST[:PORT]",
       "the rendezvous server (default port 29400); a launcher on that host hosts it",
       [](Parsed& p, const std::string& f, const std::string& v) {
         p.options.rdzv.endpoint = parseEndpoint(f, v);
       }},
      {{"rdzv_conf"},
       "K=V,...",
       "join_timeout, last_call_timeout, close_timeout, keep_alive_interval (seconds), "
       "keep_alive_max_misses, is_host, token_file, tls_ca, tls_cert, tls_key",
       [](Parsed& p, const std::string& f, const std::string& v) {
         parseRdzvConf(p.options.rdzv, f, v);
       }},
      {{"local_addr"},
       "ADDR",
       "address other nodes reach this node at (default: detected)",
       [](Parsed& p, const std::string& f, const std::string& v) {
         if (v.empty()) fail(f, v, "an address");
         p.options.rdzv.local_addr = v;
       }},
  };
  static const std::vector<FlagSpec> all = [] {
    std::vector<FlagSpec> both = table;
    for (auto& flag : configFlags()) both.push_back(std::move(flag));
    return both;
  }();
  return all;
}

const FlagSpec* findFlag(const std::string& name) {
  for (const auto& spec : flagTable()) {
    if (std::find(spec.names.begin(), spec.names.end(), name) != spec.names.end()) return &spec;
  }
  return nullptr;
}

[[noreturn]] void unknownFlag(const std::string& given, const std::string& name) {
  std::vector<std::string> long_names;
  for (const auto& spec : flagTable()) {
    for (const auto& candidate : spec.names) {
      if (candidate.size() > 1) long_names.push_back(candidate);
    }
  }
  const std::string best = closestMatch(name, long_names);
  std::string message = "unknown flag '" + given + "'";
  if (!best.empty()) message += "; did you mean --" + best + "?";
  throw UsageError(message + " (see cxxlaunch run --help)");
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

std::string findProgram(const std::string& program, const std::string& path) {
  namespace fs = std::filesystem;
  auto executable = [](const fs::path& candidate) {
    struct stat st {};
    return ::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(candidate.c_str(), X_OK) == 0;
  };
  auto hint = [&]() -> std::string {
    if (program.size() > 3 && program.ends_with(".py")) {
      return "; to run a Python script, name the interpreter: cxxlaunch run python3 " + program;
    }
    return "";
  };
  if (program.find('/') != std::string::npos) {
    std::error_code ec;
    if (!fs::exists(program, ec)) throw UsageError("program '" + program + "' does not exist");
    if (!executable(program)) {
      throw UsageError("program '" + program + "' is not an executable file" + hint());
    }
    return program;
  }
  for (const auto& dir : split(path, ':')) {
    fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    if (executable(candidate)) return candidate.string();
  }
  throw UsageError("program '" + program + "' was not found on PATH" + hint());
}

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

// The config's launch settings become the options torchrun's flags would set; the flags are
// applied afterwards and win. See docs/config.md, "How the file maps to the launcher".
void applyConfig(const Config& c, Parsed& p, const std::map<std::string, std::string>& env) {
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
  if (c.isSet("rdzv_backend") || machines > 1) o.rdzv.backend = c.text("rdzv_backend");
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
  layers.env = host.env;
  layers.flags = flags;
  return layers;
}

}  // namespace

HostInfo HostInfo::detect() {
  HostInfo host;
  cpu_set_t set;
  CPU_ZERO(&set);
  host.cpus = sched_getaffinity(0, sizeof(set), &set) == 0
                  ? CPU_COUNT(&set)
                  : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  // Count NVIDIA devices without loading CUDA: the launcher must start in milliseconds.
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");  // NOLINT(concurrency-mt-unsafe)
  if (visible != nullptr) {
    std::string text(visible);
    host.gpus = text.empty() ? 0 : static_cast<int>(split(text, ',').size());
  } else {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
      (void)entry;
      ++host.gpus;
    }
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe)
  host.path = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  host.env = configEnvironment();
  host.default_config = defaultConfigPath();
  return host;
}

LaunchOptions parseRunArgs(const std::vector<std::string>& args, const HostInfo& host) {
  Parsed parsed;
  parsed.nproc_text = std::to_string(host.default_nproc);
  std::vector<std::tuple<const FlagSpec*, std::string, std::string>> torchrun_flags;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    const bool is_long = arg.starts_with("--");
    std::string body = arg.substr(is_long ? 2 : 1);
    std::optional<std::string> value;
    if (auto eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const std::string name = normalize(body);
    const FlagSpec* spec = (is_long || name.size() == 1) ? findFlag(name) : nullptr;
    if (spec == nullptr || (!is_long && name.size() != 1) || (is_long && name.size() == 1)) {
      unknownFlag(arg, name);
    }
    const std::string& canonical = spec->names.front();
    if (spec->value_name.empty()) {
      if (value) throw UsageError("--" + canonical + " takes no value");
    } else if (!value) {
      if (i + 1 >= args.size()) {
        throw UsageError("--" + canonical + " needs a value (" + spec->value_name + ")");
      }
      value = args[++i];
    }
    if (spec->config) {
      spec->apply(parsed, canonical, value.value_or(""));
    } else {
      torchrun_flags.emplace_back(spec, canonical, value.value_or(""));
    }
  }
  if (i >= args.size()) {
    throw UsageError("no program given: cxxlaunch run [flags] PROGRAM [ARGS...]");
  }
  applyConfig(resolveConfig(configLayers(parsed.config_file, parsed.config_flags, host)), parsed,
              host.env);
  for (const auto& [spec, canonical, value] : torchrun_flags) spec->apply(parsed, canonical, value);
  LaunchOptions options = std::move(parsed.options);
  options.nproc_per_node = resolveNproc(parsed.nproc_text, options, host);
  if (!options.gpus.empty() && options.gpus.size() != static_cast<size_t>(options.nproc_per_node)) {
    if (parsed.nproc_explicit) {
      throw UsageError("--gpus names " + std::to_string(options.gpus.size()) +
                       " devices but --nproc_per_node is " +
                       std::to_string(options.nproc_per_node) + "; give one GPU id per worker");
    }
    options.nproc_per_node = static_cast<int>(options.gpus.size());
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
  if (options.run_id.empty()) options.run_id = randomHex(12);
  options.program = findProgram(args[i], host.path);
  options.args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  return options;
}

FlagArg nextFlagArg(const std::vector<std::string>& args, size_t& i) {
  FlagArg f;
  f.given = args[i];
  std::string flag = args[i];
  if (auto eq = flag.find('='); eq != std::string::npos) {
    f.value = flag.substr(eq + 1);
    flag = flag.substr(0, eq);
    f.given = flag;
  } else if (i + 1 < args.size()) {
    f.value = args[++i];
  } else {
    throw UsageError(flag + " needs a value");
  }
  size_t dashes = 0;
  while (dashes < flag.size() && dashes < 2 && flag[dashes] == '-') ++dashes;
  f.name = normalize(flag.substr(dashes));
  return f;
}

StatusOptions parseStatusArgs(const std::vector<std::string>& args) {
  StatusOptions status;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto [flag, name, value] = nextFlagArg(args, i);
    if (name == "rdzv_endpoint") {
      status.rdzv.endpoint = parseEndpoint(name, value);
    } else if (name == "rdzv_id" || name == "run_id") {
      status.run_id = value;
    } else if (name == "rdzv_conf") {
      parseRdzvConf(status.rdzv, name, value);
    } else {
      throw UsageError("unknown flag '" + flag +
                       "' (cxxlaunch status --rdzv_endpoint HOST:PORT --rdzv_id ID)");
    }
  }
  if (status.rdzv.endpoint.empty() || status.run_id.empty()) {
    throw UsageError("cxxlaunch status needs --rdzv_endpoint HOST:PORT and --rdzv_id ID");
  }
  if (status.rdzv.token.empty()) {
    const char* token = std::getenv("CXXLAUNCH_TOKEN");  // NOLINT(concurrency-mt-unsafe)
    if (token != nullptr) status.rdzv.token = token;
  }
  return status;
}

std::string runHelp() {
  std::ostringstream out;
  out << "usage: cxxlaunch run [flags] PROGRAM [ARGS...]\n"
         "Starts --nproc_per_node workers of PROGRAM with torchrun's environment.\n"
         "Flags take --dash-form or --under_score form, and --flag VALUE or --flag=VALUE.\n"
         "In ARGS, ${local_rank} becomes each worker's local rank.\n\nflags:\n";
  for (const auto& spec : flagTable()) {
    std::string names;
    for (const auto& name : spec.names) {
      names += (names.empty() ? "" : ", ") + std::string(name.size() == 1 ? "-" : "--") + name;
    }
    if (!spec.value_name.empty()) names += " " + spec.value_name;
    out << "  " << names << std::string(names.size() < 36 ? 36 - names.size() : 1, ' ') << spec.help
        << "\n";
  }
  return out.str();
}

}  // namespace cxxlaunch::launcher
