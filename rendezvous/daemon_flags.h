#pragma once
// The command line of cxxlaunchd, parsed into ServerOptions: every numeric flag range-checked
// where it is read, so that a value past its bound is one clear error (exit 2), never an
// overflow later. The limits and their defaults are in docs/reliability.md.

#include <string>
#include <vector>

#include "rendezvous/server.h"

namespace cxxlaunch::rendezvous {

// What `cxxlaunchd --help` prints, generated from the flag table.
std::string daemonUsage();

// Throws InvalidArgument naming the flag and what it accepts (cli::HelpRequested for --help).
// $CXXLAUNCH_TOKEN is the token unless --token-file gives one.
ServerOptions parseDaemonFlags(const std::vector<std::string>& args);

// Why serving `options` is open to anyone who can reach it (not loopback and no TLS; worse with
// no token), as a warning line; empty when it is not.
std::string exposureWarning(const ServerOptions& options);

}  // namespace cxxlaunch::rendezvous
