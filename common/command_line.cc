#include "common/command_line.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <regex>

#include "common/did_you_mean.h"
#include "common/error.h"

namespace cxxlaunch::cli {
namespace {

std::string underscored(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Lists each flag once, under its short names and its under_score spellings.
class OneSpellingFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* option, bool positional) const override {
    if (positional) return option->get_name(true, false);
    std::string out;
    for (const auto& name : option->get_snames()) out += (out.empty() ? "-" : ", -") + name;
    std::vector<std::string> shown;
    for (const auto& name : option->get_lnames()) {
      if (std::find(shown.begin(), shown.end(), underscored(name)) != shown.end()) continue;
      shown.push_back(underscored(name));
      out += (out.empty() ? "--" : ", --") + name;
    }
    return out;
  }
};

std::vector<std::string> longNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const auto& name : option->get_lnames()) names.push_back(name);
  }
  for (const CLI::App* sub : app.get_subcommands({})) {
    for (const auto& name : longNames(*sub)) names.push_back(name);
  }
  return names;
}

// CLI11's messages, in our words: what is wrong, and with which flag.
std::string explain(const CLI::ParseError& e) {
  const std::string what = e.what();
  std::smatch m;
  static const std::regex missing(R"(^(\S+): \d+ required .* missing$)");
  static const std::regex override_given(R"(^(\S+) was given a disallowed flag override$)");
  static const std::regex conversion(R"(^Could not convert: (\S+) = (.*)$)");
  if (std::regex_match(what, m, missing)) return m[1].str() + " needs a value";
  if (std::regex_match(what, m, override_given)) {
    const std::string flag = m[1].str();
    return (flag.starts_with("-") ? flag : "--" + flag) + " takes no value";
  }
  if (std::regex_match(what, m, conversion)) {
    return m[1].str() + ": '" + m[2].str() + "' is not a valid value";
  }
  return what;
}

}  // namespace

std::string spellings(const std::string& names) {
  std::string out;
  size_t begin = 0;
  while (begin <= names.size()) {
    size_t end = names.find(',', begin);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(begin, end - begin);
    begin = end + 1;
    if (name.empty()) continue;
    if (!out.empty()) out += ",";
    if (name.size() == 1) {
      out += "-" + name;
      continue;
    }
    out += "--" + name;
    std::string other = name;
    const bool dashed = name.find('-') != std::string::npos;
    std::replace(other.begin(), other.end(), dashed ? '-' : '_', dashed ? '_' : '-');
    if (other != name) out += ",--" + other;
  }
  return out;
}

void useConventions(CLI::App& app) {
  app.formatter(std::make_shared<OneSpellingFormatter>());
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();
}

std::vector<Given> givenInOrder(const CLI::App& app) {
  std::vector<Given> given;
  std::map<const CLI::Option*, size_t> seen;
  for (const CLI::Option* option : app.parse_order()) {
    const size_t occurrence = seen[option]++;
    const bool takes_value = option->get_expected_min() > 0;
    const auto& results = option->results();
    given.push_back(
        {option, takes_value && occurrence < results.size() ? results[occurrence] : ""});
  }
  return given;
}

void throwUnknownFlag(const CLI::App& app, const std::string& given) {
  std::string name = given.substr(0, given.find('='));
  name.erase(0, name.find_first_not_of('-'));
  // Typed in either spelling, suggested in the same one.
  const bool dashed = name.find('-') != std::string::npos;
  std::vector<std::string> candidates;
  for (const auto& candidate : longNames(app)) {
    if ((candidate.find('-') != std::string::npos) == dashed) candidates.push_back(candidate);
  }
  const std::string best = closestMatch(name, candidates);
  std::string message = "unknown flag '" + given + "'";
  if (!best.empty()) message += "; did you mean --" + best + "?";
  throw InvalidArgument(message + " (see " + app.get_name() + " --help)");
}

void parse(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested{app.help()};
  } catch (const CLI::CallForAllHelp&) {
    throw HelpRequested{app.help("", CLI::AppFormatMode::All)};
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(explain(e));
  }
  if (app.get_prefix_command()) return;
  for (const std::string& extra : app.remaining(true)) {
    if (extra.size() > 1 && extra[0] == '-') throwUnknownFlag(app, extra);
    throw InvalidArgument("unexpected argument '" + extra + "' (see " + app.get_name() +
                          " --help)");
  }
}

void parseOrExit(CLI::App& app, int argc, char** argv) {
  try {
    parse(app, std::vector<std::string>(argv + 1, argv + argc));
  } catch (const HelpRequested& help) {
    std::cout << help.text;
    std::exit(0);
  } catch (const InvalidArgument& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    std::exit(2);
  }
}

}  // namespace cxxlaunch::cli
