#pragma once
// The values of the launcher's flags, parsed and range-checked where they are read: each parser
// throws UsageError naming the flag and what it accepts ("--nnodes: '0' is not a number of
// nodes >= 1, or MIN:MAX ..."). Shared by `cxxlaunch run`, `status` and the config mapping.

#include <chrono>
#include <string>
#include <vector>

#include "launcher/options.h"

namespace cxxlaunch::launcher {

// `flag` without its dashes, as the messages name it.
[[noreturn]] void failFlag(const std::string& flag, const std::string& value,
                           const std::string& want);

int parseInt(const std::string& flag, const std::string& value, long long lo, long long hi,
             const std::string& want);

// `max_seconds`: 1e7 s (115 days) for the launcher's own times; the rendezvous times have the
// daemon's bound (rendezvous::kMaxSettingTime), checked here rather than refused after launch.
std::chrono::milliseconds parseSeconds(const std::string& flag, const std::string& value,
                                       bool allow_zero, double max_seconds = 1e7);

// "0,2" -> {0, 2}.
std::vector<int> parseIntList(const std::string& flag, const std::string& value);

// torchrun's --redirects/--tee: "3" or "0:3,1:1".
StreamSpec parseStreamSpec(const std::string& flag, const std::string& value);

// "N" or "MIN:MAX".
void parseNnodes(RendezvousOptions& r, const std::string& flag, const std::string& value);

// HOST[:PORT] (torchrun's default port 29400) as "host:port", IPv6 in brackets.
std::string parseEndpoint(const std::string& flag, const std::string& value);
// --rdzv_endpoint: one HOST[:PORT] (the server), or a comma-separated list (etcd's members). The
// text is kept for etcd, whose default port differs; validateLaunch checks it with the backend.
void parseRdzvEndpoint(RendezvousOptions& r, const std::string& flag, const std::string& value);

// The job token from the file `path` (--rdzv_conf token_file=).
std::string readTokenFile(const std::string& path);

// --rdzv_conf KEY=VALUE,...
void parseRdzvConf(RendezvousOptions& r, const std::string& flag, const std::string& value);

// `text` cut at each `sep`, keeping empty parts.
std::vector<std::string> split(const std::string& text, char sep);

}  // namespace cxxlaunch::launcher
