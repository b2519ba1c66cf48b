#include "launcher/status.h"

#include <cstdio>
#include <sstream>
#include <vector>

#include "launcher/node_rendezvous.h"
#include "launcher/progress.h"
#include "rendezvous/client.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_rendezvous.h"

namespace cxxlaunch::launcher {
namespace {

std::string seconds(std::chrono::milliseconds age) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(age.count()) / 1000);
  return text;
}

// "52.3 ms"; "-" for none.
std::string milliseconds(int64_t us) {
  if (us <= 0) return "-";
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f ms", static_cast<double>(us) / 1000);
  return text;
}

}  // namespace

std::string describeRun(const StatusOptions& options) {
  if (options.rdzv.etcd()) {
    const rendezvous::EtcdOptions etcd = etcdOptionsOf(options.rdzv);
    rendezvous::EtcdRendezvous run(std::make_shared<rendezvous::EtcdClient>(etcd), options.run_id,
                                   etcdKeyRoot(options.rdzv));
    return formatRunStatus(options.run_id, rendezvous::etcdEndpointUrl(etcd.endpoints),
                           run.status(), options.silent_after);
  }
  rendezvous::ClientOptions client_options;
  client_options.endpoint = options.rdzv.endpoint;
  client_options.token = options.rdzv.token;
  client_options.tls_ca_file = options.rdzv.tls_ca;
  client_options.tls_cert_file = options.rdzv.tls_cert;
  client_options.tls_key_file = options.rdzv.tls_key;
  client_options.call_timeout = std::chrono::seconds(10);
  rendezvous::RendezvousClient client(client_options, options.run_id);
  return formatRunStatus(options.run_id, options.rdzv.endpoint, client.status(),
                         options.silent_after);
}

std::string formatRunStatus(const std::string& run_id, const std::string& endpoint,
                            const rendezvous::RunStatus& s,
                            std::chrono::milliseconds silent_after) {
  std::ostringstream out;
  out << "run " << run_id << " at " << endpoint << "\n"
      << "round " << s.round << ": " << s.state << "; nodes " << s.settings.min_nodes << ":"
      << s.settings.max_nodes << "; restarts " << s.restart_count << " of "
      << s.settings.max_restarts << "\n";
  char line[512];
  auto table = [&](const char* title, const auto& nodes) {
    if (nodes.empty()) return;
    out << title << ":\n";
    std::snprintf(line, sizeof(line), "  %-5s %-40s %-16s %-7s %-14s %s\n", "rank", "node",
                  "address", "workers", "heartbeat age", "finished");
    out << line;
    for (const auto& n : nodes) {
      std::snprintf(line, sizeof(line), "  %-5s %-40s %-16s %-7d %-14s %s\n",
                    n.node_rank >= 0 ? std::to_string(n.node_rank).c_str() : "-", n.spec.id.c_str(),
                    n.spec.addr.c_str(), n.spec.local_world_size,
                    (std::to_string(n.heartbeat_age.count()) + " ms").c_str(),
                    n.finished ? "yes" : "no");
      out << line;
    }
  };
  table(s.state == "joining" ? "joined" : "nodes", s.participants);
  table("waiting", s.waiting);

  // Each worker as its node saw it at its last keep-alive (the node's heartbeat age above says
  // how long ago): the ages are at least this old, never older than they were then.
  bool any = false;
  for (const auto& n : s.participants) any = any || !n.workers.empty();
  if (!any) return out.str();
  out << "workers (as of their node's last keep-alive; silent: no progress for "
      << seconds(silent_after) << " or more):\n";
  // Stragglers: a rank whose work per step is well above the median of all ranks' (progress.h).
  std::vector<int64_t> work;
  for (const auto& n : s.participants) {
    for (const auto& w : n.workers) work.push_back(w.work_us);
  }
  const std::vector<bool> slow = stragglers(work);
  std::snprintf(line, sizeof(line), "  %-5s %-5s %-9s %-10s %-8s %-10s %-15s %s\n", "rank", "node",
                "pid", "state", "steps", "step time", "work/step", "last progress");
  out << line;
  int silent = 0;
  size_t index = 0;
  std::vector<int> slow_ranks;
  for (const auto& n : s.participants) {
    for (const auto& w : n.workers) {
      std::string work_text = milliseconds(w.work_us);
      if (slow[index++]) {
        work_text += " SLOW";
        slow_ranks.push_back(w.rank);
      }
      std::string progress = "never (no heartbeat: not using the runtime, or not training yet)";
      bool flagged = false;
      if (w.progress_age) {
        progress = seconds(*w.progress_age) + " ago";
        flagged = w.state != "exited" && w.state != "zombie" && w.state != "gone" &&
                  *w.progress_age >= silent_after;
      }
      if (flagged) {
        progress += "  SILENT";
        ++silent;
      }
      std::snprintf(line, sizeof(line), "  %-5d %-5s %-9d %-10s %-8s %-10s %-15s %s\n", w.rank,
                    n.node_rank >= 0 ? std::to_string(n.node_rank).c_str() : "-", w.pid,
                    w.state.c_str(), w.steps > 0 ? std::to_string(w.steps).c_str() : "-",
                    milliseconds(w.step_us).c_str(), work_text.c_str(), progress.c_str());
      out << line;
    }
  }
  if (!slow_ranks.empty()) {
    out << (slow_ranks.size() == 1 ? "rank" : "ranks");
    for (size_t i = 0; i < slow_ranks.size(); ++i) {
      out << (i == 0 ? " " : ", ") << slow_ranks[i];
    }
    out << (slow_ranks.size() == 1 ? " is" : " are")
        << " SLOW: more than 1.25x the median work per step (a step's time less the time spent "
           "waiting for the other ranks in collectives); the others wait for "
        << (slow_ranks.size() == 1 ? "it" : "them") << " at every step\n";
  }
  if (silent > 0) {
    out << silent << (silent == 1 ? " worker has" : " workers have") << " made no progress for "
        << seconds(silent_after)
        << " or more (stopped, deadlocked outside collectives, or in a long step)\n";
  }
  return out.str();
}

}  // namespace cxxlaunch::launcher
