#pragma once
// Reading the fields of tokenizer.json's components with errors that name the component and the
// field, instead of nlohmann's type_error text. Internal to text/.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cxxlaunch::text {

// The "type" of a component object; throws when `spec` is not an object with a string type.
std::string typeOf(const nlohmann::json& spec, const std::string& where);

// A field of a given kind; throws InvalidArgument("WHERE: field 'NAME' ...") when it is missing
// (for the ones without a default) or of another kind.
std::string stringField(const nlohmann::json& spec, const char* name, const std::string& where);
bool boolField(const nlohmann::json& spec, const char* name, bool fallback,
               const std::string& where);
int64_t intField(const nlohmann::json& spec, const char* name, int64_t fallback,
                 const std::string& where);
const nlohmann::json& arrayField(const nlohmann::json& spec, const char* name,
                                 const std::string& where);

// "unsupported" error: "WHERE type 'T' is not supported (supported: A, B, ...)".
[[noreturn]] void throwUnsupported(const std::string& where, const std::string& type,
                                   const std::vector<std::string>& supported);

// A Split/Replace "pattern": {"String": s} or {"Regex": r}. Sets `is_regex`.
std::string patternField(const nlohmann::json& spec, bool& is_regex, const std::string& where);

}  // namespace cxxlaunch::text
