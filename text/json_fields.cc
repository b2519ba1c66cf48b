#include "text/json_fields.h"

#include "common/error.h"

namespace cxxlaunch::text {

std::string typeOf(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    throw InvalidArgument(where + " is not an object with a string \"type\"");
  }
  return spec["type"].get<std::string>();
}

std::string stringField(const nlohmann::json& spec, const char* name, const std::string& where) {
  if (!spec.contains(name) || !spec[name].is_string()) {
    throw InvalidArgument(where + ": field '" + name + "' is missing or not a string");
  }
  return spec[name].get<std::string>();
}

bool boolField(const nlohmann::json& spec, const char* name, bool fallback,
               const std::string& where) {
  if (!spec.contains(name) || spec[name].is_null()) return fallback;
  if (!spec[name].is_boolean()) {
    throw InvalidArgument(where + ": field '" + name + "' is not true or false");
  }
  return spec[name].get<bool>();
}

int64_t intField(const nlohmann::json& spec, const char* name, int64_t fallback,
                 const std::string& where) {
  if (!spec.contains(name) || spec[name].is_null()) return fallback;
  if (!spec[name].is_number_integer()) {
    throw InvalidArgument(where + ": field '" + name + "' is not an integer");
  }
  return spec[name].get<int64_t>();
}

const nlohmann::json& arrayField(const nlohmann::json& spec, const char* name,
                                 const std::string& where) {
  if (!spec.contains(name) || !spec[name].is_array()) {
    throw InvalidArgument(where + ": field '" + name + "' is missing or not a list");
  }
  return spec[name];
}

void throwUnsupported(const std::string& where, const std::string& type,
                      const std::vector<std::string>& supported) {
  std::string list;
  for (const auto& s : supported) list += (list.empty() ? "" : ", ") + s;
  throw InvalidArgument(where + " type '" + type + "' is not supported (supported: " + list + ")");
}

std::string patternField(const nlohmann::json& spec, bool& is_regex, const std::string& where) {
  if (!spec.contains("pattern") || !spec["pattern"].is_object()) {
    throw InvalidArgument(where + ": field 'pattern' is missing or not an object");
  }
  const auto& pattern = spec["pattern"];
  if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
    is_regex = true;
    return pattern["Regex"].get<std::string>();
  }
  if (pattern.contains("String") && pattern["String"].is_string()) {
    is_regex = false;
    return pattern["String"].get<std::string>();
  }
  throw InvalidArgument(where +
                        ": field 'pattern' is neither {\"String\": ...} nor {\"Regex\": ...}");
}

}  // namespace cxxlaunch::text
