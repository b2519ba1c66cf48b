#pragma once
// DeepSpeed's hostfile and its filters, for `cxxlaunch run --hostfile` (docs/clusters.md):
//
//   # comment                      whole-line and trailing comments, blank lines ignored
//   node1 slots=8                  a host and its slots (GPUs, or CPU workers)
//   node2 slots=4
//
// --include / --exclude (not both) take NODE_SPEC[@NODE_SPEC...], NODE_SPEC = HOST[:SLOT,...]:
// "node1:0,1@node2" keeps slots 0 and 1 of node1 and all of node2; as an exclusion it drops them.
// --num_nodes N keeps the first N hosts, --num_gpus N the first N slots of each; neither goes
// with --include/--exclude (as in DeepSpeed). Plain functions, no I/O but readHostfile.

#include <string>
#include <vector>

namespace cxxlaunch::launcher {

struct HostSlots {
  std::string host;
  std::vector<int> slots;  // the slots this host uses, ascending
};

// Parses hostfile text (`name` for messages: "hosts:3: ..."); throws UsageError on a malformed
// line, a duplicate host, slots < 1, or no host at all.
std::vector<HostSlots> parseHostfile(const std::string& text, const std::string& name);
// Reads and parses `path` (a regular file of at most 1 MiB).
std::vector<HostSlots> readHostfile(const std::string& path);

struct HostFilter {
  std::string include;  // NODE_SPEC[@NODE_SPEC...]
  std::string exclude;
  int num_nodes = 0;  // 0: every host
  int num_gpus = 0;   // 0: every slot
};

// The hosts and slots `filter` leaves, in hostfile order; throws UsageError for a filter that
// names a host or slot the file does not have, or leaves nothing.
std::vector<HostSlots> filterHosts(std::vector<HostSlots> hosts, const HostFilter& filter);

}  // namespace cxxlaunch::launcher
