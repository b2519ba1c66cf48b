#include "launcher/wizard.h"

#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <functional>

#include "common/command_line.h"

namespace cxxlaunch::launcher {
namespace {

// The terminal state to put back if a signal ends the wizard while a menu has the terminal in
// raw mode. Written before the handler is installed; read only by the handler.
struct termios g_saved_termios;
int g_raw_fd = -1;

void restoreAndReraise(int sig) {
  if (g_raw_fd >= 0) ::tcsetattr(g_raw_fd, TCSANOW, &g_saved_termios);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Raw mode (no line buffering, no echo; Ctrl-C still raises SIGINT) for one menu.
class RawMode {
 public:
  explicit RawMode(int fd) : fd_(fd) {
    ::tcgetattr(fd, &g_saved_termios);
    struct termios raw = g_saved_termios;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    g_raw_fd = fd;
    struct sigaction action {};
    action.sa_handler = restoreAndReraise;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &action, &old_[sig]);
    ::tcsetattr(fd, TCSANOW, &raw);
  }
  ~RawMode() {
    ::tcsetattr(fd_, TCSANOW, &g_saved_termios);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &old_[sig], nullptr);
    g_raw_fd = -1;
  }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  int fd_;
  struct sigaction old_[NSIG] {};
};

class Prompter {
 public:
  Prompter(int in_fd, int out_fd) : in_(in_fd), out_(out_fd), tty_(::isatty(in_fd) != 0) {}

  bool terminal() const { return tty_; }

  // One of `options`; returns its index.
  size_t choose(const std::string& question, const std::vector<std::string>& options,
                size_t default_index) {
    return tty_ ? menu(question, options, default_index)
                : numbered(question, options, default_index);
  }

  // A typed answer; `check` returns "" or why the answer does not fit. Empty input takes
  // `default_text` (when there is one).
  std::string ask(const std::string& question, const std::string& default_text,
                  const std::function<std::string(const std::string&)>& check) {
    while (true) {
      write(question + (default_text.empty() ? "" : " [" + default_text + "]") + ": ");
      std::string answer = trim(readLine());
      if (answer.empty()) answer = default_text;
      const std::string why = answer.empty() ? "an answer is needed" : check(answer);
      if (why.empty()) return answer;
      write("  " + why + "; try again.\n");
    }
  }

  bool yesNo(const std::string& question, bool default_yes) {
    while (true) {
      write(question + (default_yes ? " [YES/no]: " : " [yes/NO]: "));
      std::string answer = trim(readLine());
      for (auto& c : answer) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (answer.empty()) return default_yes;
      if (answer == "y" || answer == "yes") return true;
      if (answer == "n" || answer == "no") return false;
      write("  '" + answer + "' is not yes or no; try again.\n");
    }
  }

  void write(const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(out_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

 private:
  static std::string trim(std::string text) {
    while (!text.empty() && (text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) {
      text.pop_back();
    }
    text.erase(0, text.find_first_not_of(" \t"));
    return text;
  }

  char readByte() {
    char c = 0;
    while (true) {
      const ssize_t n = ::read(in_, &c, 1);
      if (n == 1) return c;
      if (n < 0 && errno == EINTR) continue;
      throw ConfigError("the answers ended before the last question; nothing was written");
    }
  }

  std::string readLine() {
    std::string line;
    for (char c = readByte(); c != '\n'; c = readByte()) line += c;
    return line;
  }

  size_t numbered(const std::string& question, const std::vector<std::string>& options,
                  size_t default_index) {
    write(question + "\n");
    for (size_t i = 0; i < options.size(); ++i) {
      write("  [" + std::to_string(i) + "] " + options[i] + "\n");
    }
    const std::string last = std::to_string(options.size() - 1);
    const std::string answer =
        ask("choose 0-" + last, std::to_string(default_index), [&](const std::string& text) {
          if (text.size() <= 4 && text.find_first_not_of("0123456789") == std::string::npos &&
              std::stoul(text) < options.size()) {
            return std::string();
          }
          return "'" + text + "' is not one of the numbers 0 to " + last;
        });
    return std::stoul(answer);
  }

  size_t menu(const std::string& question, const std::vector<std::string>& options,
              size_t default_index) {
    write(question + " (arrows to move, enter to choose)\n");
    size_t current = default_index;
    auto draw = [&](bool again) {
      if (again) write("\x1b[" + std::to_string(options.size()) + "A");
      for (size_t i = 0; i < options.size(); ++i) {
        write(std::string("\r\x1b[2K") + (i == current ? " > " : "   ") + options[i] + "\n");
      }
    };
    {
      RawMode raw(in_);
      draw(false);
      while (true) {
        const char c = readByte();
        if (c == '\r' || c == '\n') break;
        if (c >= '0' && c <= '9' && static_cast<size_t>(c - '0') < options.size()) {
          current = static_cast<size_t>(c - '0');
        } else if (c == '\x1b') {
          if (readByte() != '[') continue;
          const char key = readByte();
          if (key == 'A' && current > 0) --current;
          if (key == 'B' && current + 1 < options.size()) ++current;
        } else if (c == 'k' && current > 0) {
          --current;
        } else if (c == 'j' && current + 1 < options.size()) {
          ++current;
        } else {
          continue;
        }
        draw(true);
      }
    }
    // Collapse the menu into one line with the answer.
    write("\x1b[" + std::to_string(options.size()) + "A\r\x1b[J" + "  -> " + options[current] +
          "\n");
    return current;
  }

  int in_, out_;
  bool tty_;
};

// Asks for `key` until the answer parses as its type and passes `extra`; stores it in `config`.
void askKey(Prompter& p, Config& config, const std::string& key, const std::string& question,
            const std::string& default_text,
            const std::function<std::string(const std::string&)>& extra = nullptr) {
  const KeySpec& spec = *findKey(key);
  const std::string answer = p.ask(question, default_text, [&](const std::string& text) {
    std::string value, why;
    if (!parseValue(spec, text, value, why)) return why;
    return extra ? extra(value) : std::string();
  });
  config.set(key, answer, {Origin::kFile, "your answers"});
}

void chooseKey(Prompter& p, Config& config, const std::string& key, const std::string& question,
               std::vector<std::string> options, const std::string& default_value) {
  const auto it = std::find(options.begin(), options.end(), default_value);
  const size_t index = p.choose(
      question, options, it == options.end() ? 0 : static_cast<size_t>(it - options.begin()));
  config.set(key, options[index], {Origin::kFile, "your answers"});
}

void yesNoKey(Prompter& p, Config& config, const std::string& key, const std::string& question,
              bool default_yes) {
  config.set(key, p.yesNo(question, default_yes) ? "true" : "false",
             {Origin::kFile, "your answers"});
}

}  // namespace

Config askConfig(int in_fd, int out_fd, const HostInfo& host) {
  Prompter p(in_fd, out_fd);
  Config c;
  const Origin answer{Origin::kFile, "your answers"};
  c.set("compute_environment", "LOCAL_MACHINE", answer);
  // Only what this machine can run is offered: without a GPU, no multi-GPU (and below, no fp16
  // and no offload to host memory).
  const bool has_gpu = host.gpus > 0;
  std::vector<std::string> types = {"NO", "MULTI_CPU", "MULTI_GPU"};
  std::vector<std::string> type_names = {"No distributed training", "multi-CPU", "multi-GPU"};
  if (!has_gpu) {
    types.pop_back();
    type_names.pop_back();
  }
  const size_t type =
      p.choose("Which type of machine are you using?", type_names, host.gpus > 1 ? 2 : 0);
  c.set("distributed_type", types[type], answer);
  const bool multi = type != 0;
  // accelerate's rule: multi-CPU is use_cpu: true, multi-GPU false, one process asks.
  if (multi) c.set("use_cpu", type == 1 ? "true" : "false", answer);
  int machines = 1;
  if (multi) {
    askKey(p, c, "num_machines",
           "How many different machines will you use (more than 1 for multi-node training)?", "1");
    machines = static_cast<int>(c.integer("num_machines"));
    if (machines > 1) {
      std::vector<std::string> ranks;
      for (int r = 0; r < machines && r < 10; ++r) ranks.push_back(std::to_string(r));
      if (machines <= 10) {
        chooseKey(p, c, "machine_rank", "What is the rank of this machine?", ranks, "0");
      } else {
        askKey(p, c, "machine_rank", "What is the rank of this machine?", "0",
               [&](const std::string& v) {
                 return std::stoll(v) < machines ? std::string()
                                                 : "the rank must be below num_machines (" +
                                                       std::to_string(machines) + ")";
               });
      }
      askKey(p, c, "main_process_ip",
             "What is the IP address of the machine that will host the main process?", "");
      askKey(p, c, "main_process_port",
             "What is the port you will use to communicate with the main process?", "29500",
             [](const std::string& v) {
               return v == "0" ? "several machines need a fixed port, not 0" : std::string();
             });
      yesNoKey(p, c, "same_network", "Are all the machines on the same local network?", true);
      if (!c.flag("same_network")) {
        // etcd: main_process_ip:main_process_port names the etcd server (docs/clusters.md).
        chooseKey(p, c, "rdzv_backend", "What rendezvous backend will you use?",
                  {"static", "c10d", "etcd", "etcd-v2"}, "static");
      }
    }
    yesNoKey(p, c, "debug",
             "Should distributed operations be checked while running for errors? This can avoid "
             "timeout issues but will be slower.",
             false);
  } else if (has_gpu) {
    yesNoKey(p, c, "use_cpu",
             "Do you want to run your training on CPU only (even if a GPU is available)?", false);
  } else {
    p.write("No GPU found on this machine: training runs on CPUs (use_cpu: true).\n");
    c.set("use_cpu", "true", answer);
  }
  const bool gpu = type == 2;
  // Sharding runs on CPUs too (over Gloo): a multi-CPU machine is offered it as a GPU one is.
  // Offload to host memory is for GPU runs; nvme for both.
  const std::vector<std::string> offload = gpu ? std::vector<std::string>{"none", "cpu", "nvme"}
                                               : std::vector<std::string>{"none", "nvme"};
  auto offloadKey = [&](const std::string& what, const std::string& question) {
    const std::string key = "deepspeed_config.offload_" + what + "_device";
    chooseKey(p, c, key, question, offload, "none");
    if (c.text(key) == "nvme") {
      askKey(p, c, "deepspeed_config.offload_" + what + "_nvme_path",
             "Which directory on local disk holds the swap file?", "", [](const std::string& path) {
               std::error_code ec;
               return std::filesystem::is_directory(path, ec)
                          ? std::string()
                          : "'" + path + "' is not an existing directory; create it first";
             });
    }
  };
  if (multi && p.yesNo("Do you want to use DeepSpeed?", false)) {
    c.set("distributed_type", "DEEPSPEED", answer);
    chooseKey(p, c, "deepspeed_config.zero_stage", "What should be your DeepSpeed's ZeRO stage?",
              {"0", "1", "2", "3"}, "2");
    offloadKey("optimizer", "Where to offload optimizer states?");
    if (c.integer("deepspeed_config.zero_stage") == 3) {
      offloadKey("param", "Where to offload parameters?");
    }
    askKey(p, c, "deepspeed_config.gradient_accumulation_steps",
           "How many gradient accumulation steps you're passing in your script?", "1");
    if (p.yesNo("Do you want to use gradient clipping?", false)) {
      askKey(p, c, "deepspeed_config.gradient_clipping", "What is the gradient clipping value?",
             "1.0");
    }
    if (c.integer("deepspeed_config.zero_stage") == 3) {
      yesNoKey(p, c, "deepspeed_config.zero3_save_16bit_model",
               "Do you want to save 16-bit model weights when using ZeRO Stage-3?", false);
      yesNoKey(p, c, "deepspeed_config.zero3_init_flag",
               "Do you want to build the model already sharded (ZeRO-3 init)?", false);
    }
  } else if (multi && p.yesNo("Do you want to use FullyShardedDataParallel?", false)) {
    c.set("distributed_type", "FSDP", answer);
    chooseKey(p, c, "fsdp_config.fsdp_sharding_strategy", "What should be your sharding strategy?",
              {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"},
              "FULL_SHARD");
    if (gpu) {
      yesNoKey(p, c, "fsdp_config.fsdp_offload_params",
               "Do you want to offload parameters and gradients to CPU?", false);
    }
    chooseKey(p, c, "fsdp_config.fsdp_auto_wrap_policy", "What should be your auto wrap policy?",
              {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"}, "TRANSFORMER_BASED_WRAP");
    const std::string policy = c.text("fsdp_config.fsdp_auto_wrap_policy");
    if (policy == "TRANSFORMER_BASED_WRAP") {
      askKey(p, c, "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
             "Specify the comma-separated list of module names to wrap, e.g. Block", "");
    } else if (policy == "SIZE_BASED_WRAP") {
      askKey(p, c, "fsdp_config.fsdp_min_num_params",
             "What should be your FSDP's minimum number of parameters for auto wrapping?",
             "100000000");
    }
    chooseKey(p, c, "fsdp_config.fsdp_backward_prefetch",
              "What should be your FSDP's backward prefetch policy?",
              {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"}, "BACKWARD_PRE");
    chooseKey(p, c, "fsdp_config.fsdp_state_dict_type",
              "What should be your FSDP's state dict type?",
              {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"}, "FULL_STATE_DICT");
    yesNoKey(p, c, "fsdp_config.fsdp_forward_prefetch",
             "Do you want to enable FSDP's forward prefetch?", false);
    yesNoKey(p, c, "fsdp_config.fsdp_sync_module_states",
             "Do you want each rank to start from rank 0's weights (sync module states)?", true);
    yesNoKey(p, c, "fsdp_config.fsdp_activation_checkpointing",
             "Do you want to enable FSDP activation checkpointing?", false);
  }
  if (multi) {
    const int per_machine = gpu ? std::max(host.gpus, 1) : 1;
    askKey(p, c, "num_processes",
           std::string(gpu ? "How many GPU(s)" : "How many processes") +
               " should be used in total, across all machines?",
           std::to_string(per_machine * machines), [&](const std::string& v) {
             return std::stoll(v) % machines == 0 ? std::string()
                                                  : "the total must divide evenly among " +
                                                        std::to_string(machines) + " machines";
           });
  }
  if (gpu) {
    const long long per_node = c.integer("num_processes") / machines;
    askKey(p, c, "gpu_ids",
           "What GPU(s) (by id) should be used for training on this machine as a "
           "comma-separated list?",
           "all", [&](const std::string& v) {
             const long long ids = std::count(v.begin(), v.end(), ',') + 1;
             return v == "all" || ids == per_node
                        ? std::string()
                        : "name " + std::to_string(per_node) + " GPU(s), one per process, or all";
           });
  }
  std::vector<std::string> precisions = {"no", "fp16", "bf16"};
  if (c.flag("use_cpu") || !has_gpu) precisions = {"no", "bf16"};  // fp16 needs a GPU
  chooseKey(p, c, "mixed_precision", "Do you wish to use mixed precision?", precisions, "no");
  validateConfig(c);
  return c;
}

Config defaultConfig(const HostInfo& host, const std::string& mixed_precision) {
  Config c;
  const Origin origin{Origin::kFile, "config default"};
  c.set("compute_environment", "LOCAL_MACHINE", origin);
  c.set("distributed_type", host.gpus > 1 ? "MULTI_GPU" : "NO", origin);
  c.set("mixed_precision", mixed_precision.empty() ? "no" : mixed_precision,
        {Origin::kFlag, "--mixed_precision"});
  c.set("use_cpu", host.gpus == 0 ? "true" : "false", origin);
  c.set("num_machines", "1", origin);
  c.set("num_processes", std::to_string(std::max(host.gpus, 1)), origin);
  c.set("machine_rank", "0", origin);
  c.set("gpu_ids", "all", origin);
  validateConfig(c);
  return c;
}

ConfigCommand parseConfigArgs(const std::vector<std::string>& args) {
  CLI::App app(
      "Writes a config file by answering questions; `config default` writes one from the "
      "hardware; `config --print` shows each setting and where it comes from.",
      "cxxlaunch config");
  cli::useConventions(app);
  ConfigCommand command;
  bool print = false;
  app.add_flag(cli::spellings("print"), print, "show the resolved settings, write nothing");
  app.add_flag(cli::spellings("force"), command.force, "replace an existing file without asking");
  app.add_option(cli::spellings("config_file"), command.file,
                 "the file (default: " + defaultConfigPath() + ")")
      ->type_name("FILE");
  CLI::App* by_default =
      app.add_subcommand("default", "write a config for this machine's hardware");
  by_default->fallthrough();  // --config_file and --force after `default` too
  by_default
      ->add_option(cli::spellings("mixed_precision"), command.mixed_precision, "no, fp16 or bf16")
      ->type_name("no|fp16|bf16");
  try {
    cli::parse(app, args);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  if (by_default->parsed()) command.action = ConfigCommand::kDefault;
  if (print) command.action = ConfigCommand::kPrint;
  return command;
}

std::string runConfigCommand(const ConfigCommand& command, const HostInfo& host) {
  const std::string path = command.file.empty() ? defaultConfigPath() : command.file;
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec);
  if (command.action == ConfigCommand::kPrint) {
    ConfigLayers layers;
    layers.file = command.file.empty() && !exists ? "" : path;
    layers.cluster = host.cluster.settings;
    layers.env = host.env;
    Config config = resolveConfig(layers);
    validateConfigOnMachine(config, host.gpus);
    std::string notes;
    for (const auto& note : config.notes) notes += "note: " + note + "\n";
    return "config file: " + (layers.file.empty() ? "none (" + path + " does not exist)" : path) +
           "\n" + notes + describeConfig(config, host.env);
  }
  // Never replace a file silently: ask on a terminal before any question, else need --force.
  Prompter terminal(STDIN_FILENO, STDOUT_FILENO);
  bool overwrite = command.force;
  if (exists && !overwrite && command.action == ConfigCommand::kWizard && terminal.terminal()) {
    overwrite = terminal.yesNo(path + " exists. Replace it?", false);
    if (!overwrite) return "kept " + path + "; nothing was written\n";
  }
  if (exists && !overwrite) {
    throw ConfigError(path +
                      " already exists; pass --force to replace it, or --config_file to "
                      "write elsewhere");
  }
  Config config = command.action == ConfigCommand::kDefault
                      ? defaultConfig(host, command.mixed_precision)
                      : askConfig(STDIN_FILENO, STDOUT_FILENO, host);
  writeConfigFile(config, path, overwrite);
  return "cxxlaunch configuration saved at " + path + "\n";
}

}  // namespace cxxlaunch::launcher
