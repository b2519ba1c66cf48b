#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/utf8.h"
#include "text/jinja_interpreter.h"

namespace cxxlaunch::text {

struct ChatTemplate::Impl {
  std::string source;
  jinja::Template compiled;
  jinja::Dict special_tokens;
  Impl(std::string text, jinja::Dict tokens)
      : source(checkedUtf8(std::move(text))), compiled(source), special_tokens(std::move(tokens)) {}
  static std::string checkedUtf8(std::string text) {
    if (!isValidUtf8(text)) throw InvalidArgument("the chat template is not valid UTF-8");
    return text;
  }
};

namespace {

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("cannot read " + path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// As transformers' special_tokens_map: the tokens that are set, as strings (an AddedToken dict
// gives its content), additional_special_tokens as a list of strings.
jinja::Dict specialTokens(const nlohmann::json& config, const std::string& source) {
  jinja::Dict out;
  static const char* kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                 "pad_token", "cls_token", "mask_token"};
  auto text = [&](const nlohmann::json& v, const std::string& name) -> std::optional<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      return v["content"].get<std::string>();
    }
    if (v.is_null()) return std::nullopt;
    throw InvalidArgument(source + ": '" + name + "' must be a string or {\"content\": ...}");
  };
  for (const char* name : kNames) {
    if (!config.contains(name)) continue;
    if (auto t = text(config[name], name)) out.set(name, jinja::Value::string(*t));
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    jinja::List tokens;
    for (const auto& t : config["additional_special_tokens"]) {
      if (auto s = text(t, "additional_special_tokens")) tokens.push_back(jinja::Value::string(*s));
    }
    out.set("additional_special_tokens", jinja::Value::makeList(std::move(tokens)));
  }
  return out;
}

std::string templateOf(const nlohmann::json& config, const std::string& source) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    throw InvalidArgument(source +
                          " has no chat_template; the model folder must ship one "
                          "(tokenizer_config.json's chat_template or chat_template.jinja)");
  }
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    throw InvalidArgument(source + ": chat_template is a list without a template named 'default'");
  }
  throw InvalidArgument(source + ": chat_template must be a string or a list of {name, template}");
}

nlohmann::json parseConfig(std::string_view text, const std::string& source) {
  nlohmann::json config = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    throw InvalidArgument(source + " is not a JSON object");
  }
  return config;
}

}  // namespace

ChatTemplate ChatTemplate::fromFolder(const std::string& dir) {
  const std::filesystem::path folder(dir);
  const auto config_path = folder / "tokenizer_config.json";
  const auto jinja_path = folder / "chat_template.jinja";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_path)) {
    config = parseConfig(readFile(config_path), config_path.string());
  }
  std::string text;
  if (std::filesystem::exists(jinja_path)) {
    text = readFile(jinja_path);
  } else if (std::filesystem::exists(config_path)) {
    text = templateOf(config, config_path.string());
  } else {
    throw InvalidArgument("no tokenizer_config.json or chat_template.jinja in " + dir);
  }
  return ChatTemplate(
      std::make_shared<Impl>(std::move(text), specialTokens(config, config_path.string())));
}

std::optional<ChatTemplate> ChatTemplate::fromFolderIfAny(const std::string& dir) {
  const std::filesystem::path folder(dir);
  const auto config_path = folder / "tokenizer_config.json";
  if (!std::filesystem::exists(folder / "chat_template.jinja")) {
    if (!std::filesystem::exists(config_path)) return std::nullopt;
    // A config that does not parse is fromFolder's error to report.
    const auto config =
        nlohmann::json::parse(readFile(config_path), nullptr, /*allow_exceptions=*/false);
    if (config.is_object() &&
        (!config.contains("chat_template") || config["chat_template"].is_null())) {
      return std::nullopt;
    }
  }
  return fromFolder(dir);
}

ChatTemplate ChatTemplate::fromConfigJson(std::string_view tokenizer_config_json,
                                          const std::string& source) {
  const nlohmann::json config = parseConfig(tokenizer_config_json, source);
  return ChatTemplate(
      std::make_shared<Impl>(templateOf(config, source), specialTokens(config, source)));
}

ChatTemplate ChatTemplate::fromString(const std::string& text,
                                      const nlohmann::json& special_tokens) {
  if (!special_tokens.is_object()) throw InvalidArgument("special tokens must be a JSON object");
  return ChatTemplate(
      std::make_shared<Impl>(text, specialTokens(special_tokens, "special tokens")));
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  return render(nlohmann::ordered_json::parse(messages.dump()), add_generation_prompt,
                nlohmann::ordered_json::parse(extra.dump()));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  if (!messages.is_array())
    throw InvalidArgument("messages must be a JSON array of {role, content}");
  if (!extra.is_object()) throw InvalidArgument("extra template variables must be a JSON object");
  jinja::Dict context = impl_->special_tokens;
  context.set("messages", jinja::Value::fromJson(messages));
  context.set("tools", jinja::Value::none());
  context.set("documents", jinja::Value::none());
  context.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    context.set(it.key(), jinja::Value::fromJson(*it));
  }
  return impl_->compiled.render(context);
}

const std::string& ChatTemplate::source() const { return impl_->source; }

}  // namespace cxxlaunch::text
