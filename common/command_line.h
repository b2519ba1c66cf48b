#pragma once
// The command-line conventions every cxxlaunch binary shares, over CLI11 (header-only):
//   - a long flag has two spellings, --under_score (torchrun's, accelerate's) and --dash-form,
//     and takes its value as --flag=V or --flag V; --help lists the one the table gives;
//   - given twice, the last value wins (as argparse does);
//   - a bad command line is one line, an InvalidArgument (each main exits 2 on it), and an unknown
//     flag names the closest known one.
// Each binary's flags are one table of add_option calls; its --help is generated from it.

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

namespace cxxlaunch::cli {

// CLI11's name list for `names` (comma-separated): "nproc_per_node" ->
// "--nproc_per_node,--nproc-per-node", "token-file" -> "--token-file,--token_file"; the spelling
// given is the one --help shows. A one-letter name is a short flag: "r" -> "-r".
std::string spellings(const std::string& names);

// Applies the conventions to `app`: last value wins, --help shows one spelling, and arguments no
// flag takes are kept for parse() to judge (or for the caller, with prefix_command()).
void useConventions(CLI::App& app);

// Thrown by parse() for --help or -h: the help generated from the app's flags.
struct HelpRequested {
  std::string text;
};

// Parses `args` (argv without the program name). Throws HelpRequested, or InvalidArgument with
// one line. Unless `app` is a prefix command (it stops at the first argument it does not know and
// leaves the rest in app.remaining()), any argument left over is an error.
void parse(CLI::App& app, const std::vector<std::string>& args);

// The flags of `app` that were given, in command-line order (a flag given twice, twice), each
// with its value ("" for a switch); for tables whose flags apply in the order typed.
struct Given {
  const CLI::Option* option;
  std::string value;
};
std::vector<Given> givenInOrder(const CLI::App& app);

// The error for an unknown flag `given`, with the closest flag of `app` and where to look.
[[noreturn]] void throwUnknownFlag(const CLI::App& app, const std::string& given);

// For a main: parse(); on --help prints it and exits 0, on a bad command line prints
// "NAME: error: MESSAGE" to stderr and exits 2.
void parseOrExit(CLI::App& app, int argc, char** argv);

}  // namespace cxxlaunch::cli
