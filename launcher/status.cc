#include "launcher/status.h"

#include <cstdio>
#include <sstream>

#include "rendezvous/client.h"

namespace cxxlaunch::launcher {

std::string describeRun(const StatusOptions& options) {
  rendezvous::ClientOptions client_options;
  client_options.endpoint = options.rdzv.endpoint;
  client_options.token = options.rdzv.token;
  client_options.tls_ca_file = options.rdzv.tls_ca;
  client_options.tls_cert_file = options.rdzv.tls_cert;
  client_options.tls_key_file = options.rdzv.tls_key;
  client_options.call_timeout = std::chrono::seconds(10);
  rendezvous::RendezvousClient client(client_options, options.run_id);
  const auto s = client.status();
  std::ostringstream out;
  out << "run " << options.run_id << " at " << options.rdzv.endpoint << "\n"
      << "round " << s.round << ": " << s.state << "; nodes " << s.settings.min_nodes << ":"
      << s.settings.max_nodes << "; restarts " << s.restart_count << " of "
      << s.settings.max_restarts << "\n";
  auto table = [&](const char* title, const auto& nodes) {
    if (nodes.empty()) return;
    out << title << ":\n";
    char line[512];
    std::snprintf(line, sizeof(line), "  %-5s %-40s %-16s %-7s %-14s %s\n", "rank", "node",
                  "address", "workers", "heartbeat age", "finished");
    out << line;
    for (const auto& n : nodes) {
      std::snprintf(line, sizeof(line), "  %-5s %-40s %-16s %-7d %-14s %s\n",
                    n.node_rank >= 0 ? std::to_string(n.node_rank).c_str() : "-",
                    n.spec.id.c_str(), n.spec.addr.c_str(), n.spec.local_world_size,
                    (std::to_string(n.heartbeat_age.count()) + " ms").c_str(),
                    n.finished ? "yes" : "no");
      out << line;
    }
  };
  table(s.state == "joining" ? "joined" : "nodes", s.participants);
  table("waiting", s.waiting);
  return out.str();
}

}  // namespace cxxlaunch::launcher
