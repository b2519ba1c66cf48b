#include "text/post_processor.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "text/json_fields.h"

namespace cxxlaunch::text {
namespace {

// The single-sequence template, flattened: ids before $A and ids after it.
class Around final : public PostProcessor {
 public:
  Around(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

class Nothing final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> templateProcessing(const nlohmann::json& spec,
                                                  const std::string& where) {
  const auto& single = arrayField(spec, "single", where);
  const nlohmann::json empty = nlohmann::json::object();
  const auto& specials = spec.contains("special_tokens") ? spec["special_tokens"] : empty;
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (const auto& item : single) {
    if (item.contains("Sequence")) {
      const auto& sequence = item["Sequence"];
      if (seen_sequence || !sequence.contains("id") || sequence["id"] != "A") {
        throw InvalidArgument(where + ": the single template may name the sequence $A once only");
      }
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = stringField(item["SpecialToken"], "id", where + " SpecialToken");
      if (!specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        throw InvalidArgument(where + ": special token '" + name +
                              "' of the template is not in its special_tokens with ids");
      }
      for (const auto& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) {
          throw InvalidArgument(where + ": special token '" + name +
                                "' has an id that is not an integer");
        }
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    } else {
      throw InvalidArgument(where + ": a template item is neither Sequence nor SpecialToken");
    }
  }
  if (!seen_sequence) {
    throw InvalidArgument(where + ": the single template does not name the sequence $A");
  }
  return std::make_unique<Around>(std::move(before), std::move(after));
}

}  // namespace

std::unique_ptr<PostProcessor> makePostProcessor(const nlohmann::json& spec,
                                                 const std::string& where) {
  if (spec.is_null()) return std::make_unique<Nothing>();
  const std::string type = typeOf(spec, where);
  if (type == "TemplateProcessing") return templateProcessing(spec, where);
  if (type == "ByteLevel") return std::make_unique<Nothing>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step : arrayField(spec, "processors", where)) {
      steps.push_back(makePostProcessor(step, where));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throwUnsupported(where, type, {"TemplateProcessing", "ByteLevel", "Sequence"});
}

std::unique_ptr<PostProcessor> makeAroundTemplate(std::vector<int32_t> before,
                                                  std::vector<int32_t> after) {
  return std::make_unique<Around>(std::move(before), std::move(after));
}

}  // namespace cxxlaunch::text
