#include "text/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/utf8.h"
#include "text/added_vocabulary.h"
#include "text/bpe.h"
#include "text/decoder.h"
#include "text/json_fields.h"
#include "text/normalizer.h"
#include "text/post_processor.h"
#include "text/pre_tokenizer.h"

namespace cxxlaunch::text {

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  std::vector<std::string> id_to_token;  // by id; empty where no token has the id
  std::vector<bool> has_token;
  std::vector<bool> special;
  std::optional<int32_t> bos, eos, pad;
  bool clean_up_spaces = false;
};

namespace {

std::string readWhole(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("cannot read " + path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

nlohmann::json parseJson(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgument(source + " is not valid JSON");
  }
}

// A special token of tokenizer_config.json: a string or {"content": ...}; empty when absent.
std::string configToken(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const auto& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return "";
}

// transformers' update_post_processor: these tokenizer classes replace the file's post-processor
// with BOS/EOS as add_bos_token (default true) and add_eos_token (default false) say.
bool rebuildsTemplate(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("tokenizer_class") ||
      !config["tokenizer_class"].is_string()) {
    return false;
  }
  const auto name = config["tokenizer_class"].get<std::string>();
  return name == "LlamaTokenizer" || name == "LlamaTokenizerFast" || name == "CodeLlamaTokenizer" ||
         name == "CodeLlamaTokenizerFast";
}

// transformers' clean_up_tokenization.
std::string cleanUpSpaces(std::string text) {
  static const std::pair<std::string_view, std::string_view> kReplacements[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kReplacements) {
    std::string out;
    size_t last = 0;
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, last)) {
      out.append(text, last, at - last);
      out += to;
      last = at + from.size();
    }
    out.append(text, last, std::string::npos);
    text.swap(out);
  }
  return text;
}

}  // namespace

Tokenizer Tokenizer::fromFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "tokenizer.json";
  if (!fs::is_regular_file(path)) {
    throw InvalidArgument("no tokenizer.json in " + dir +
                          " (a Hugging Face model folder has one next to config.json)");
  }
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  const std::string config_text = fs::is_regular_file(config) ? readWhole(config) : "";
  return fromJson(readWhole(path), config_text, path.string());
}

Tokenizer Tokenizer::fromJson(std::string_view tokenizer_json,
                              std::string_view tokenizer_config_json, const std::string& source) {
  const nlohmann::json file = parseJson(tokenizer_json, source);
  if (!file.is_object()) throw InvalidArgument(source + " is not a JSON object");
  const nlohmann::json config =
      tokenizer_config_json.empty()
          ? nlohmann::json::object()
          : parseJson(tokenizer_config_json, "tokenizer_config.json next to " + source);
  auto impl = std::make_shared<Impl>();
  const nlohmann::json null;
  auto component = [&](const char* key) -> const nlohmann::json& {
    return file.contains(key) ? file[key] : null;
  };
  if (!file.contains("model") || !file["model"].is_object()) {
    throw InvalidArgument(source + ": no \"model\" object");
  }
  const std::string model_type = file["model"].contains("type") && file["model"]["type"].is_string()
                                     ? file["model"]["type"].get<std::string>()
                                     : "BPE";  // the library's files before "type" was written
  if (model_type != "BPE") throwUnsupported(source + ": model", model_type, {"BPE"});
  impl->normalizer = makeNormalizer(component("normalizer"), source + ": normalizer");
  impl->pre_tokenizer = makePreTokenizer(component("pre_tokenizer"), source + ": pre_tokenizer");
  impl->model = Bpe::fromJson(file["model"], source + ": model");
  impl->post_processor =
      makePostProcessor(component("post_processor"), source + ": post_processor");
  impl->decoder = makeDecoder(component("decoder"), source + ": decoder");

  std::vector<AddedToken> added;
  if (file.contains("added_tokens") && !file["added_tokens"].is_null()) {
    const std::string where = source + ": added_tokens";
    if (!file["added_tokens"].is_array()) throw InvalidArgument(where + " is not a list");
    for (const auto& entry : file["added_tokens"]) {
      AddedToken token;
      const int64_t id = intField(entry, "id", -1, where);
      if (id < 0 || id > INT32_MAX) throw InvalidArgument(where + ": an entry has no valid id");
      token.id = static_cast<int32_t>(id);
      token.content = stringField(entry, "content", where);
      token.special = boolField(entry, "special", false, where);
      token.normalized = boolField(entry, "normalized", true, where);  // the library's default
      token.lstrip = boolField(entry, "lstrip", false, where);
      token.rstrip = boolField(entry, "rstrip", false, where);
      token.single_word = boolField(entry, "single_word", false, where);
      added.push_back(std::move(token));
    }
  }
  const Normalizer* normalizer = impl->normalizer.get();
  impl->added = AddedVocabulary(std::move(added), [normalizer](std::string& content) {
    if (normalizer != nullptr) normalizer->normalize(content);
  });

  int64_t size = 0;
  for (const auto& [token, id] : impl->model->vocab()) size = std::max<int64_t>(size, id + 1);
  for (const auto& token : impl->added.tokens()) size = std::max<int64_t>(size, token.id + 1);
  impl->id_to_token.resize(size);
  impl->has_token.assign(size, false);
  impl->special.assign(size, false);
  for (const auto& [token, id] : impl->model->vocab()) {
    impl->id_to_token[id] = token;
    impl->has_token[id] = true;
  }
  for (const auto& token : impl->added.tokens()) {
    impl->id_to_token[token.id] = token.content;
    impl->has_token[token.id] = true;
    impl->special[token.id] = token.special;
  }

  Tokenizer tokenizer(impl);
  const std::string bos = configToken(config, "bos_token"), eos = configToken(config, "eos_token");
  impl->bos = bos.empty() ? std::nullopt : tokenizer.tokenToId(bos);
  impl->eos = eos.empty() ? std::nullopt : tokenizer.tokenToId(eos);
  const std::string pad = configToken(config, "pad_token");
  impl->pad = pad.empty() ? std::nullopt : tokenizer.tokenToId(pad);
  if (rebuildsTemplate(config)) {
    const bool add_bos = boolField(config, "add_bos_token", true, "tokenizer_config.json");
    const bool add_eos = boolField(config, "add_eos_token", false, "tokenizer_config.json");
    if ((add_bos && !impl->bos) || (add_eos && !impl->eos)) {
      throw InvalidArgument(
          "tokenizer_config.json next to " + source +
          ": add_bos_token/add_eos_token ask for a bos/eos token it does not name");
    }
    std::vector<int32_t> before, after;
    if (add_bos) before.push_back(*impl->bos);
    if (add_eos) after.push_back(*impl->eos);
    impl->post_processor = makeAroundTemplate(std::move(before), std::move(after));
  }
  impl->clean_up_spaces =
      boolField(config, "clean_up_tokenization_spaces", false, "tokenizer_config.json");
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (!isValidUtf8(text)) {
    throw InvalidArgument("the text to tokenize is not valid UTF-8");
  }
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> pieces;
  for (const Segment& raw : impl.added.split(text, /*normalized=*/false)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string normalized(text.substr(raw.begin, raw.end - raw.begin));
    if (impl.normalizer) impl.normalizer->normalize(normalized);
    for (const Segment& segment : impl.added.split(normalized, /*normalized=*/true)) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      pieces.assign(1, normalized.substr(segment.begin, segment.end - segment.begin));
      bool at_start = raw.begin == 0 && segment.begin == 0;
      if (impl.pre_tokenizer) impl.pre_tokenizer->preTokenize(pieces, at_start);
      for (const auto& piece : pieces) impl.model->tokenize(piece, ids);
    }
  }
  if (add_special_tokens) impl.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocabSize() || !impl.has_token[id]) {
      throw InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary (" +
                            std::to_string(vocabSize()) + " ids)");
    }
    if (skip_special_tokens && impl.special[id]) continue;
    tokens.push_back(impl.id_to_token[id]);
  }
  std::string text;
  if (impl.decoder) {
    impl.decoder->decodeChain(tokens);
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return impl.clean_up_spaces ? cleanUpSpaces(std::move(text)) : text;
}

int64_t Tokenizer::vocabSize() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::bosId() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eosId() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::padId() const { return impl_->pad; }

std::optional<int32_t> Tokenizer::tokenToId(std::string_view token) const {
  for (const auto& added : impl_->added.tokens()) {
    if (added.content == token) return added.id;
  }
  const auto& vocab = impl_->model->vocab();
  const auto found = vocab.find(token);
  if (found == vocab.end()) return std::nullopt;
  return found->second;
}

std::optional<std::string> Tokenizer::idToToken(int32_t id) const {
  if (id < 0 || id >= vocabSize() || !impl_->has_token[id]) return std::nullopt;
  return impl_->id_to_token[id];
}

}  // namespace cxxlaunch::text
