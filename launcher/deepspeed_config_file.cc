// A DeepSpeed config file (`deepspeed_config.deepspeed_config_file`, --deepspeed_config_file): the
// JSON that DeepSpeed projects already have, read into the accelerate keys it corresponds to, so
// that a config pointing at one trains with its ZeRO stage, offload, accumulation, clipping and
// precision instead of the defaults. JSON is YAML (1.2), so yaml-cpp reads it with positions.
//
// Its values enter as the file layer: a CXXLAUNCH_* variable or a flag still wins over them. The
// same setting in both the YAML and the JSON is refused, as accelerate refuses it. "auto" means
// "from the other layers", as accelerate fills it in. Fields cxxlaunch decides itself (bucket
// sizes, overlap) are read without a word; what the trainer decides (the optimizer, the
// schedule, the batch sizes) is named in one note.

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/file.h"
#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

namespace {

namespace fs = std::filesystem;

constexpr char kFileKey[] = "deepspeed_config.deepspeed_config_file";

// The JSON fields that map onto a key of ours.
struct Field {
  std::vector<std::string> path;  // in the JSON; several spellings are separate entries
  std::string key;
};
const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      {{"zero_optimization", "stage"}, "deepspeed_config.zero_stage"},
      {{"zero_optimization", "offload_optimizer", "device"},
       "deepspeed_config.offload_optimizer_device"},
      {{"zero_optimization", "offload_optimizer", "nvme_path"},
       "deepspeed_config.offload_optimizer_nvme_path"},
      {{"zero_optimization", "offload_param", "device"}, "deepspeed_config.offload_param_device"},
      {{"zero_optimization", "offload_param", "nvme_path"},
       "deepspeed_config.offload_param_nvme_path"},
      {{"zero_optimization", "stage3_gather_16bit_weights_on_model_save"},
       "deepspeed_config.zero3_save_16bit_model"},
      {{"zero_optimization", "stage3_gather_fp16_weights_on_model_save"},  // older spelling
       "deepspeed_config.zero3_save_16bit_model"},
      {{"gradient_accumulation_steps"}, "deepspeed_config.gradient_accumulation_steps"},
      {{"gradient_clipping"}, "deepspeed_config.gradient_clipping"},
  };
  return table;
}

// The sections holding the fields above; what else they hold (bucket sizes, overlap_comm,
// loss-scale tuning) cxxlaunch decides itself, so it is read without a word.
bool readSection(const std::string& name) {
  return name == "zero_optimization" || name == "fp16" || name == "bf16" || name == "bfloat16";
}

class JsonReader {
 public:
  JsonReader(Config& config, std::string name) : config_(config), name_(std::move(name)) {}

  void read(const YAML::Node& root) {
    for (const auto& field : fields()) apply(root, field);
    applyPrecision(root);
    std::vector<std::string> ignored;
    collectIgnored(root, ignored);
    if (!ignored.empty()) {
      std::string list;
      for (const auto& f : ignored) list += (list.empty() ? "" : ", ") + f;
      config_.notes.push_back(
          name_ + ": " + list + (ignored.size() == 1 ? " is" : " are") +
          " DeepSpeed's and not used by cxxlaunch (the trainer builds its optimizer, schedule "
          "and batches itself); ignored");
    }
  }

 private:
  std::string at(const YAML::Node& node) const {
    const YAML::Mark m = node.Mark();
    if (m.is_null()) return name_;
    return name_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  }

  static std::string dotted(const std::vector<std::string>& path) {
    std::string out;
    for (const auto& p : path) out += (out.empty() ? "" : ".") + p;
    return out;
  }

  // The node at `path`, or a null node.
  static YAML::Node find(const YAML::Node& root, const std::vector<std::string>& path) {
    YAML::Node node;
    node.reset(root);  // not `=`: on a YAML::Node it assigns to the node referred to
    for (const auto& part : path) {
      if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
      const YAML::Node child = node[part];
      if (!child.IsDefined()) return child;
      node.reset(child);
    }
    return node;
  }

  // Sets `key` from the JSON unless another layer set it; the YAML setting it too is an error.
  void set(const std::string& key, const std::string& value, const YAML::Node& node,
           const std::string& field) {
    if (config_.isSet(key)) {
      const Origin origin = config_.origin(key);
      if (origin.kind != Origin::kFile) return;  // a variable or flag wins, as over the YAML
      if (config_.text(key) == canonical(key, value, node)) return;
      throw ConfigError(originName(origin) + ": " + key + " is set here and, as " + field +
                        ", in the DeepSpeed config file (" + at(node) +
                        "); set it in one of them (accelerate refuses both too)");
    }
    config_.set(key, value, {Origin::kFile, at(node)});
  }

  std::string canonical(const std::string& key, const std::string& text,
                        const YAML::Node& node) const {
    std::string value, why;
    if (!parseValue(*findKey(key), text, value, why)) {
      throw ConfigError(at(node) + ": " + key + ": " + why);
    }
    return value;
  }

  void apply(const YAML::Node& root, const Field& field) {
    const YAML::Node node = find(root, field.path);
    if (!node.IsDefined() || node.IsNull()) return;
    const std::string name = dotted(field.path);
    if (!node.IsScalar()) {
      throw ConfigError(at(node) + ": " + name + " must be a single value, not a " +
                        (node.IsMap() ? "mapping" : "list"));
    }
    if (node.Scalar() == "auto") return;  // from the other layers, as accelerate fills it in
    set(field.key, node.Scalar(), node, name);
  }

  // fp16.enabled / bf16.enabled (or bfloat16.enabled) true: mixed_precision.
  void applyPrecision(const YAML::Node& root) {
    std::string chosen;
    YAML::Node chosen_node;
    for (const auto& [section, precision] : {std::pair<const char*, const char*>{"fp16", "fp16"},
                                             {"bf16", "bf16"},
                                             {"bfloat16", "bf16"}}) {
      const YAML::Node enabled = find(root, {section, "enabled"});
      if (!enabled.IsDefined() || !enabled.IsScalar()) continue;
      const std::string text = lower(enabled.Scalar());
      if (text == "auto" || text == "false") continue;
      if (text != "true") {
        throw ConfigError(at(enabled) + ": " + section + ".enabled must be true, false or auto");
      }
      if (!chosen.empty() && chosen != precision) {
        throw ConfigError(at(enabled) + ": fp16 and bf16 are both enabled; enable one");
      }
      chosen = precision;
      chosen_node = enabled;
    }
    if (!chosen.empty()) set("mixed_precision", chosen, chosen_node, "fp16/bf16 .enabled");
  }

  // The top-level fields that are neither mapped nor in a section read above.
  static void collectIgnored(const YAML::Node& root, std::vector<std::string>& out) {
    for (const auto& entry : root) {
      const std::string name = entry.first.Scalar();
      bool mapped = readSection(name);
      for (const auto& field : fields()) mapped = mapped || dotted(field.path) == name;
      if (!mapped) out.push_back(name);
    }
  }

  Config& config_;
  std::string name_;
};

}  // namespace

void applyDeepSpeedConfigFile(Config& config) {
  if (!config.isSet(kFileKey)) return;
  const std::string given = config.text(kFileKey);
  const Origin origin = config.origin(kFileKey);
  // As accelerate: the file is DeepSpeed's, not even opened for another distributed type.
  if (const std::string type = config.text("distributed_type"); type != "DEEPSPEED") {
    config.notes.push_back(originName(origin) + ": deepspeed_config_file is read for " +
                           "distributed_type DEEPSPEED only, and this config's is " + type +
                           "; not read");
    return;
  }
  // As accelerate: relative to the current directory; a YAML's own folder is tried next, so a
  // config and its JSON kept side by side work from anywhere.
  std::string path = given;
  if (fs::path(given).is_relative() && !fs::exists(given) && origin.kind == Origin::kFile) {
    const std::string yaml = origin.where.substr(0, origin.where.find(':'));
    const fs::path beside = fs::path(yaml).parent_path() / given;
    if (fs::exists(beside)) path = beside.string();
  }
  std::string text;
  try {
    text = readRegularFile(path, "DeepSpeed config file", kMaxConfigFileBytes);
  } catch (const InvalidArgument& e) {
    throw ConfigError(originName(origin) + ": " + e.what() +
                      " (deepspeed_config_file: relative paths are read from the current "
                      "directory, then from the config file's)");
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw ConfigError(path + ": nests too deeply to be a DeepSpeed config file");
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": not valid JSON: " + e.msg);
  }
  if (!root.IsMap()) {
    throw ConfigError(path +
                      ": a DeepSpeed config file is a JSON object, such as "
                      "{\"zero_optimization\": {\"stage\": 3}}");
  }
  try {
    JsonReader(config, path).read(root);
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ": " + e.msg);
  }
}

}  // namespace cxxlaunch::launcher
