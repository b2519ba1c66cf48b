// `cxxlaunch run`'s command line: the flag table (torchrun's flags, then accelerate's, one per
// config key that has a flag), parsed with CLI11 into RunFlags, then resolved into LaunchOptions
// (launcher/launch_options.h). `cxxlaunch run --help` is generated from the same table.

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "common/command_line.h"
#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/doc_reference.h"
#include "launcher/flag_values.h"
#include "launcher/launch_options.h"
#include "launcher/process.h"
#include "launcher/program_path.h"
#include "launcher/remote.h"

namespace cxxlaunch::launcher {
namespace {

struct FlagSpec {
  std::string names;  // comma-separated, under_score form; a one-letter name is a short flag
  // Empty: a boolean flag, whose value is optional (`--flag` is `--flag=true`); `apply` gets
  // "true" or "false".
  std::string value_name;
  std::string help;
  std::function<void(RunFlags&, const std::string& flag, const std::string& value)> apply;
  // Config flags (accelerate's) feed the config's flag layer and are read first; torchrun's
  // flags are applied after the config, so they win over it.
  bool config = false;
};

// A flag on the command line: its row and its value.
using GivenFlag = std::pair<const FlagSpec*, std::string>;

// accelerate's `launch` flags: one per config key that has one, plus its hardware and paradigm
// switches.
std::vector<FlagSpec> configFlags() {
  auto setKey = [](std::string key) {
    return [key](RunFlags& p, const std::string& flag, const std::string& given) {
      p.config_flags.push_back({key, given, "--" + flag});
    };
  };
  // A paradigm switch sets distributed_type when on; off, it leaves the config's.
  auto setType = [](std::string type) {
    return [type](RunFlags& p, const std::string& flag, const std::string& given) {
      if (given == "true") p.config_flags.push_back({"distributed_type", type, "--" + flag});
    };
  };
  std::vector<FlagSpec> flags = {
      {"config_file", "FILE",
       "accelerate-style YAML (default: " + defaultConfigPath() + " when it exists)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         if (v.empty()) failFlag(f, v, "a file name");
         p.config_file = v;
       },
       true},
      {"cpu", "", "train on CPUs (use_cpu: true)", setKey("use_cpu"), true},
      {"multi_gpu", "", "distributed_type: MULTI_GPU", setType("MULTI_GPU"), true},
      {"use_deepspeed", "", "distributed_type: DEEPSPEED (ZeRO; see --zero_stage)",
       setType("DEEPSPEED"), true},
      {"use_fsdp", "", "distributed_type: FSDP", setType("FSDP"), true},
  };
  for (const auto& spec : configSchema()) {
    if (spec.flag.empty()) continue;
    std::string value_name = spec.type == KeyType::kBool     ? ""
                             : spec.type == KeyType::kText   ? "TEXT"
                             : spec.type == KeyType::kGpuIds ? "IDS|all"
                                                             : "N";
    if (spec.type == KeyType::kChoice) {
      value_name.clear();
      for (const auto& choice : spec.choices)
        value_name += (value_name.empty() ? "" : "|") + choice;
    }
    flags.push_back(
        {spec.flag, value_name, spec.help + " (config: " + spec.key + ")", setKey(spec.key), true});
  }
  return flags;
}

const std::vector<FlagSpec>& flagTable() {
  static const std::vector<FlagSpec> table = {
      {"nproc_per_node", "N|cpu|gpu|auto", "workers on this node (default 1)",
       [](RunFlags& p, const std::string&, const std::string& v) {
         p.nproc_text = v;
         p.nproc_given = true;
         p.nproc_explicit = v != "gpu" && v != "auto";
       }},
      {"gpus", "IDS", "GPU ids to use, e.g. 0,2: one worker per id",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.gpus = parseIntList(f, v);
       }},
      {"standalone", "", "single-node job with a private rendezvous (the default here)",
       [](RunFlags& p, const std::string&, const std::string& v) {
         p.options.standalone = v == "true";
       }},
      {"max_restarts", "N", "restarts of the worker group before failing (default 0)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.max_restarts = parseInt(f, v, 0, 1'000'000, "a number >= 0");
       }},
      {"monitor_interval", "SECONDS",
       "accepted for torchrun compatibility; cxxlaunch reacts to exits at once",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.monitor_interval = parseSeconds(f, v, false);
       }},
      {"shutdown_grace", "SECONDS", "SIGTERM to SIGKILL grace when stopping workers (default 30)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.shutdown_grace = parseSeconds(f, v, true);
       }},
      {"watchdog_timeout", "SECONDS",
       "stop the job when a runtime worker makes no progress (no micro-step) for this long "
       "(default 0: off)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.watchdog_timeout = parseSeconds(f, v, true);
       }},
      {"role", "NAME", "worker role: ROLE_NAME (default 'default')",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         if (v.empty()) failFlag(f, v, "a non-empty name");
         p.options.role = v;
       }},
      {"log_dir", "DIR", "where per-attempt, per-rank logs go (default $TMPDIR/cxxlaunch-UID)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         if (v.empty()) failFlag(f, v, "a directory");
         p.options.log_dir = v;
       }},
      {"redirects,r", "SPEC", "streams kept off the console (files only): 0-3 or 0:3,1:1",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.redirects = parseStreamSpec(f, v);
       }},
      {"tee,t", "SPEC", "streams echoed to the console as well (the default for all)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.tee = parseStreamSpec(f, v);
       }},
      {"local_ranks_filter", "RANKS", "only these local ranks reach the console, e.g. 0",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         auto list = parseIntList(f, v);
         p.options.local_ranks_filter = std::set<int>(list.begin(), list.end());
       }},
      {"master_addr", "HOST", "MASTER_ADDR given to workers (default 127.0.0.1)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         if (v.empty()) failFlag(f, v, "a host name or address");
         p.options.master_addr = v;
       }},
      {"master_port", "PORT", "MASTER_PORT (default: a free port; 0 picks one too)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.master_port = parseInt(f, v, 0, 65535, "a port number 0-65535");
       }},
      {"run_id,rdzv_id", "ID", "job id: TORCHELASTIC_RUN_ID and the log folder (default random)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         const bool ok = !v.empty() && v.size() <= 128 && v != "." && v != ".." &&
                         std::all_of(v.begin(), v.end(), [](unsigned char c) {
                           return std::isalnum(c) || c == '-' || c == '_' || c == '.';
                         });
         if (!ok) failFlag(f, v, "an id of at most 128 letters, digits, '-', '_' or '.'");
         p.options.run_id = v;
         p.options.run_id_given = true;
       }},
      {"no_python", "", "accepted: cxxlaunch always executes the program itself",
       [](RunFlags&, const std::string&, const std::string&) {}},
      {"nnodes", "N|MIN:MAX", "nodes in the job; MIN:MAX for an elastic job (default 1)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         parseNnodes(p.options.rdzv, f, v);
       }},
      {"node_rank", "N", "this node's rank (static rendezvous backend)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         p.options.rdzv.node_rank = parseInt(f, v, 0, 65535, "a node rank >= 0");
       }},
      {"rdzv_backend", "c10d|static|etcd",
       "c10d: ranks by node id (default); static: by --node_rank; etcd (or etcd-v2): an etcd "
       "cluster at --rdzv_endpoint keeps the rendezvous",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         if (v != "c10d" && v != "static" && v != "etcd" && v != "etcd-v2") {
           failFlag(f, v, "c10d, static or etcd");
         }
         p.options.rdzv.backend = v == "etcd-v2" ? "etcd" : v;
       }},
      {"rdzv_endpoint", "HOST[:PORT][,...]",
       "the rendezvous server (default port 29400; a launcher on that host hosts it), or with "
       "--rdzv_backend etcd the etcd members (default port 2379)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         parseRdzvEndpoint(p.options.rdzv, f, v);
       }},
      {"rdzv_conf", "K=V,...",
       "join_timeout, last_call_timeout, close_timeout, keep_alive_interval (seconds), "
       "keep_alive_max_misses, is_host, token_file, tls_ca, tls_cert, tls_key; etcd: user, "
       "password, password_file (cacert, cert, key as torchrun names tls_*)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         parseRdzvConf(p.options.rdzv, f, v);
       }},
      {"local_addr", "ADDR", "address other nodes reach this node at (default: detected)",
       [](RunFlags& p, const std::string& f, const std::string& v) {
         if (v.empty()) failFlag(f, v, "an address");
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

constexpr const char* kRunDescription =
    "Starts --nproc_per_node workers of PROGRAM with torchrun's environment.\n"
    "Flags take --dash-form or --under_score form, and --flag VALUE or --flag=VALUE.\n"
    "A boolean flag alone is on; it also takes true or false (yes/no, on/off, 1/0):\n"
    "--debug, --debug true, --debug=false.\n"
    "The first argument that is not a flag is PROGRAM; it and everything after it go to the\n"
    "workers verbatim. In ARGS, ${local_rank} becomes each worker's local rank.";

bool isBoolean(const FlagSpec& spec) { return spec.value_name.empty(); }

// `text` as a boolean flag's value, "true" or "false"; nullopt when it is none of the words
// the config's booleans take (true/false, yes/no, on/off, y/n, 1/0), as --zero3_init_flag always
// took them.
std::optional<std::string> booleanWord(const std::string& text) {
  KeySpec spec;
  spec.type = KeyType::kBool;
  std::string value, why;
  if (!parseValue(spec, text, value, why)) return std::nullopt;
  return value;
}

// The app for `cxxlaunch run`, one option per row of the table; `specs` maps them back. A
// boolean flag is an option that always has its value: joinBooleanValues supplies it.
void addRunFlags(CLI::App& app, std::map<const CLI::Option*, const FlagSpec*>& specs,
                 const std::vector<const FlagSpec*>& rows) {
  cli::useConventions(app);
  app.prefix_command();  // the first argument it does not know starts the program
  app.footer("More in " + docReference("launcher.md") +
             "; the guides named above (the clusters guide, ...) are beside it.");
  for (const FlagSpec* spec : rows) {
    CLI::Option* option = app.add_option(cli::spellings(spec->names))
                              ->type_name(isBoolean(*spec) ? "[true|false]" : spec->value_name);
    option->description(spec->help);
    specs[option] = spec;
  }
}

// Every row of the table, by each of its spellings ("--nnodes", "-r").
const std::map<std::string, const FlagSpec*>& flagsByName() {
  static const std::map<std::string, const FlagSpec*> by_name = [] {
    std::map<std::string, const FlagSpec*> out;
    for (const FlagSpec& spec : flagTable()) {
      for (const auto& name : split(cli::spellings(spec.names), ',')) out[name] = &spec;
    }
    return out;
  }();
  return by_name;
}

std::vector<const FlagSpec*> allRows() {
  std::vector<const FlagSpec*> rows;
  for (const FlagSpec& spec : flagTable()) rows.push_back(&spec);
  return rows;
}

// The rows `args` names, in the table's order: each argument that looks like a flag, looked up
// by its name (`--flag=V`: --flag; `-rV`: -r). More than the flags before the program (the
// program's own arguments may name some) costs nothing: the parse stops at the program.
std::vector<const FlagSpec*> rowsNamedIn(const std::vector<std::string>& args) {
  const auto& by_name = flagsByName();
  std::set<const FlagSpec*> named;
  for (const std::string& arg : args) {
    if (arg.size() < 2 || arg[0] != '-') continue;
    const auto it =
        by_name.find(arg.starts_with("--") ? arg.substr(0, arg.find('=')) : arg.substr(0, 2));
    if (it != by_name.end()) named.insert(it->second);
  }
  std::vector<const FlagSpec*> rows;
  for (const FlagSpec* spec : allRows()) {
    if (named.contains(spec)) rows.push_back(spec);
  }
  return rows;
}

// Boolean flags take an optional value: `--flag`, `--flag=V`, or `--flag V` when V is a boolean
// word. CLI11 cannot take an optional value without taking the program's name for one, so the
// value is joined to its flag here (`--flag V` -> `--flag=V`, `--flag` -> `--flag=true`) before
// it parses. The scan reads the flags as CLI11 will and stops where it stops: at the first
// argument that is neither a flag nor a flag's value (the program), at `--`, or at a flag it
// does not know (which CLI11 reports).
std::vector<std::string> joinBooleanValues(const std::vector<std::string>& args) {
  const auto& by_name = flagsByName();
  std::vector<std::string> out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;
    const bool long_flag = arg.starts_with("--");
    const size_t eq = long_flag ? arg.find('=') : std::string::npos;
    const auto it = by_name.find(long_flag ? arg.substr(0, eq) : arg.substr(0, 2));
    if (it == by_name.end()) break;
    out.push_back(arg);
    if (isBoolean(*it->second)) {
      // CLI11 would take the next argument as the value of a `--flag=` left empty.
      if (eq != std::string::npos && eq + 1 == arg.size()) {
        failFlag(it->second->names.substr(0, it->second->names.find(',')), "",
                 "true or false (also yes/no, on/off, 1/0)");
      }
      if (eq != std::string::npos) continue;
      if (i + 1 < args.size() && booleanWord(args[i + 1])) {
        out.back() += "=" + args[++i];
      } else {
        out.back() += "=true";
      }
      continue;
    }
    // A flag that takes a value: the rest of this argument (--flag=V, -rV), else the next one.
    const bool inline_value = long_flag ? eq != std::string::npos : arg.size() > 2;
    if (!inline_value && i + 1 < args.size()) out.push_back(args[++i]);
  }
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

// --hostfile (launcher/remote.h): the user's flags go on to every host's agent.
std::optional<RemoteLaunch> planRemote(const Config& config, const std::vector<GivenFlag>& given,
                                       const LaunchOptions& options,
                                       const std::vector<std::string>& rest, const HostInfo& host) {
  RemotePlan plan{config, {}, "", "", {}};
  bool endpoint_flag = false;
  for (const auto& [spec, value] : given) {
    const std::string name = spec->names.substr(0, spec->names.find(','));
    endpoint_flag = endpoint_flag || name == "rdzv_endpoint";
    // A boolean flag that is on goes on as the switch it was (most likely) typed as.
    plan.given.emplace_back(name, isBoolean(*spec) && value == "true"
                                      ? std::nullopt
                                      : std::optional<std::string>(value));
  }
  if (endpoint_flag || config.isSet("cxxlaunch.rdzv_endpoint"))
    plan.endpoint = options.rdzv.endpoint;
  plan.run_id = options.run_id_given ? options.run_id : randomHex(12);
  plan.command.push_back(findProgram(rest[0], host.path));
  plan.command.insert(plan.command.end(), rest.begin() + 1, rest.end());
  return planRemoteLaunch(plan);
}

// The flags given, in their order, with their values (a boolean's as "true" or "false"), and
// what follows them (the program and its arguments). Parsed with CLI11 by the table's `rows`.
struct CommandLine {
  std::vector<GivenFlag> given;
  std::vector<std::string> rest;
};

CommandLine parseFlags(const std::vector<std::string>& args,
                       const std::vector<const FlagSpec*>& rows) {
  CLI::App app(kRunDescription, "cxxlaunch run");
  std::map<const CLI::Option*, const FlagSpec*> specs;
  addRunFlags(app, specs, rows);
  CommandLine line;
  try {
    cli::parse(app, joinBooleanValues(args));
    line.rest = app.remaining();
    if (!line.rest.empty() && line.rest[0] != "--" && line.rest[0].size() > 1 &&
        line.rest[0][0] == '-') {
      cli::throwUnknownFlag(app, line.rest[0]);
    }
    for (auto& [option, value] : cli::givenInOrder(app)) {
      line.given.emplace_back(specs.at(option), std::move(value));
    }
  } catch (const UsageError&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  for (auto& [spec, value] : line.given) {
    if (!isBoolean(*spec)) continue;
    const auto word = booleanWord(value);
    if (!word) {
      failFlag(spec->names.substr(0, spec->names.find(',')), value,
               "true or false (also yes/no, on/off, 1/0)");
    }
    value = *word;
  }
  return line;
}

}  // namespace

LaunchOptions parseRunArgs(const std::vector<std::string>& args, const HostInfo& host) {
  // CLI11 checks each option it is given against every one it has: for the whole table, 150
  // rows, that is 3.5 M instructions, most of a launch's own work before its first worker. So
  // the flags are parsed with the rows the command line names; anything that goes wrong then
  // (a flag the table lacks, a missing value, --help) is parsed again with every row, for CLI11's
  // full answer: the help, the suggestions, the messages as they always were.
  CommandLine line;
  try {
    line = parseFlags(args, rowsNamedIn(args));
  } catch (...) {
    line = parseFlags(args, allRows());
  }
  auto& [given, rest] = line;
  if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
  if (rest.empty()) throw UsageError("no program given: cxxlaunch run [flags] PROGRAM [ARGS...]");

  RunFlags parsed;
  parsed.nproc_text = std::to_string(host.default_nproc);
  // accelerate's flags feed the config's flag layer, resolved first; torchrun's flags are applied
  // after the config, so they win over it.
  std::vector<std::pair<const FlagSpec*, std::string>> torchrun_flags;
  for (const auto& [spec, value] : given) {
    const std::string canonical = spec->names.substr(0, spec->names.find(','));
    if (spec->config) {
      spec->apply(parsed, canonical, value);
    } else {
      torchrun_flags.emplace_back(spec, value);
    }
  }
  ConfigLayers layers = configLayers(parsed.config_file, parsed.config_flags, host);
  // The cluster's variables (Slurm, MPI) are a layer of their own, used unless the other layers
  // turn them off.
  std::vector<FlagValue> cluster = std::move(layers.cluster);
  layers.cluster.clear();
  Config config = resolveConfig(layers);
  if (!host.cluster.source.empty() && config.flag("cxxlaunch.use_cluster_env")) {
    if (!host.cluster.error.empty())
      throw UsageError(host.cluster.source + ": " + host.cluster.error);
    layers.cluster = std::move(cluster);
    config = resolveConfig(layers);
  }
  applyConfig(config, parsed, host.env);
  for (const auto& [spec, value] : torchrun_flags) {
    spec->apply(parsed, spec->names.substr(0, spec->names.find(',')), value);
  }
  LaunchOptions options = std::move(parsed.options);
  if (rest[0] == "true" || rest[0] == "false") {
    // Most likely a boolean flag's value cut off from its flag (`--flag VALUE` with a flag that
    // takes none): /bin/true would "train" and succeed.
    options.warnings.push_back("the program to launch is '" + rest[0] +
                               "', which does nothing but exit " + (rest[0] == "true" ? "0" : "1") +
                               "; if it was meant as a flag's value, write --FLAG=" + rest[0] +
                               " before the program");
  }
  if (auto remote = planRemote(config, given, options, rest, host)) {
    options.remote = std::move(remote);
    return options;
  }
  // The workers start here: the config must be one this machine can run.
  validateConfigOnMachine(config, host.gpus);
  options.nproc_per_node = resolveNproc(parsed.nproc_text, options, host);
  if (parsed.nproc_given) checkProcessCounts(config, options);
  validateLaunch(options, parsed.nproc_explicit);
  warnOversubscription(config, options, host);
  if (options.run_id.empty()) options.run_id = randomHex(12);
  options.program = findProgram(rest[0], host.path);
  options.args.assign(rest.begin() + 1, rest.end());
  return options;
}

std::string runHelp() {
  CLI::App app(kRunDescription, "cxxlaunch run");
  std::map<const CLI::Option*, const FlagSpec*> specs;
  addRunFlags(app, specs, allRows());
  return app.help();
}

}  // namespace cxxlaunch::launcher
