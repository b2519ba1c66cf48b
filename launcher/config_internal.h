#pragma once
// What the config_*.cc files share among themselves (launcher/config.h is the interface). Not
// for use outside the config implementation.

#include <array>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config.h"

namespace cxxlaunch::launcher::config_detail {

// fsdp_sharding_strategy's values; accelerate also writes them as their 1-based number.
inline const std::vector<std::string> kShardingStrategies = {
    "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};

// The top-level keys whose values are mappings of further keys.
inline constexpr std::array<std::string_view, 3> kSections = {"deepspeed_config", "fsdp_config",
                                                              "cxxlaunch"};

// accelerate's keys that mean nothing to a C++ launcher (config_schema.cc).
const std::set<std::string>& ignoredKeys();

// config_value.cc
std::string lower(std::string text);
std::string formatNumber(double v);
std::string kindName(const KeySpec& spec);  // "a whole number from 1 to 8", "one of a, b or c"

// Where a value came from, for the start of a message ("a.yaml:3:5", "--flag"; config_layers.cc).
std::string originName(const Origin& origin);

}  // namespace cxxlaunch::launcher::config_detail
