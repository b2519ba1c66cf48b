#pragma once
// LaunchOptions: everything `cxxlaunch run` needs, resolved and validated. The CLI (launcher/cli.h)
// fills it from flags; the node agent (launcher/agent.h) runs it. Plain data.

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/hostfile.h"

namespace cxxlaunch::launcher {

// Which of a worker's streams a setting applies to, torchrun's encoding: 0 none, 1 stdout,
// 2 stderr, 3 both; either one value for every local rank or a per-local-rank map.
struct StreamSpec {
  static constexpr int kNone = 0, kOut = 1, kErr = 2, kBoth = 3;
  int all = kNone;
  std::map<int, int> per_rank;  // when non-empty, overrides `all`; ranks not listed get kNone

  int forRank(int local_rank) const;
};

// How this node finds the others (--nnodes, --rdzv_*). Defaults are torchrun's.
struct RendezvousOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = -1;  // --node_rank, static backend only
  // "c10d" (ranks by node id), "static" (ranks by --node_rank) or "etcd" (an etcd cluster keeps
  // the rendezvous; also torchrun's "etcd-v2")
  std::string backend = "c10d";
  std::string endpoint;  // host:port of the rendezvous server; empty: a private one
  // etcd: the members as given (HOST[:PORT],...; etcd's port 2379 where none is given)
  std::string etcd_endpoints;
  std::string etcd_user;      // --rdzv_conf user=; empty: no etcd auth
  std::string etcd_password;  // password= or password_file=
  std::string etcd_root;      // etcd_prefix= as a key root ("/team/jobs/"); empty: /cxxlaunch/
  std::string local_addr;     // address advertised to other nodes; empty: detected
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);
  std::chrono::milliseconds last_call_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds close_timeout = std::chrono::seconds(300);  // exit barrier
  std::chrono::milliseconds keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_misses = 3;
  std::optional<bool> is_host;  // host the server here: yes, no, or decide (endpoint free here)
  std::string token;            // the job token (token_file=, or $CXXLAUNCH_TOKEN)
  std::string tls_ca, tls_cert, tls_key;

  bool multiNode() const { return max_nodes > 1 || !endpoint.empty(); }
  bool etcd() const { return backend == "etcd"; }
};

// `--hostfile`: this launcher starts one node agent per host over ssh (launcher/remote.h) instead
// of workers. Everything each agent needs is here.
struct RemoteLaunch {
  std::vector<HostSlots> hosts;            // node rank = index; the first hosts the rendezvous
  std::vector<std::string> ssh;            // the ssh program and its options (--ssh_opts)
  std::string endpoint;                    // HOST:PORT of the rendezvous, on the first host
  std::string run_id;                      // the job's, the same for every agent
  std::string launcher;                    // cxxlaunch's path on the hosts: this one's
  std::string cwd;                         // the agents start here
  std::vector<std::string> flags;          // the user's flags, passed on to every agent
  std::map<std::string, std::string> env;  // exported to every agent (CXXLAUNCH_*, NCCL_*, ...)
  std::vector<std::string> command;        // the program and its arguments
};

// --progress / cxxlaunch.progress: the live line on a terminal (auto, on), plain progress lines
// on anything else (on only), or none (off). docs/observability.md.
enum class ProgressMode { kAuto, kOn, kOff };

struct LaunchOptions {
  int nproc_per_node = 1;
  std::vector<int> gpus;  // --gpus: the devices to use, one per local worker; empty: none chosen
  bool standalone = false;
  int max_restarts = 0;
  std::chrono::milliseconds monitor_interval{100};  // accepted; the agent is event-driven
  std::chrono::milliseconds shutdown_grace = std::chrono::seconds(30);
  // A runtime worker whose heartbeat is older than this is named and the job stopped; 0: off.
  std::chrono::milliseconds watchdog_timeout{0};
  std::string role = "default";
  std::string log_dir;   // empty: <tmp>/cxxlaunch
  StreamSpec redirects;  // streams that go to log files only, not to the console
  StreamSpec tee;        // streams that go to the console as well (the default for all)
  std::optional<std::set<int>> local_ranks_filter;  // console shows only these local ranks
  ProgressMode progress = ProgressMode::kAuto;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: reserve a free port
  std::string run_id;   // empty: a random one
  bool run_id_given = false;
  RendezvousOptions rdzv;
  std::string program;            // resolved path of the worker executable
  std::vector<std::string> args;  // passed verbatim, ${local_rank} substituted
  // Training settings resolved from the config (launcher/config.h), set in every worker's
  // environment over anything inherited.
  std::map<std::string, std::string> worker_env;
  std::vector<std::string> config_notes;  // ignored keys and adjusted values, for the user
  // What will run, but probably not as meant (more workers than cores, the program `true`):
  // printed as `cxxlaunch: warning: ...`; the job still starts.
  std::vector<std::string> warnings;
  std::optional<RemoteLaunch> remote;  // --hostfile: start these hosts' agents instead

  // Whether local rank `r`'s `stream` (kOut or kErr) is echoed to the console.
  bool onConsole(int local_rank, int stream) const;
};

}  // namespace cxxlaunch::launcher
