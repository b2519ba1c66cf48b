// `cxxlaunch status`'s command line: which run, at which rendezvous.

#include <cstdlib>

#include "common/command_line.h"
#include "launcher/cli.h"
#include "launcher/flag_values.h"

namespace cxxlaunch::launcher {

StatusOptions parseStatusArgs(const std::vector<std::string>& args) {
  CLI::App app(
      "Shows a run's rendezvous: its round, nodes and state, and each worker's last progress.",
      "cxxlaunch status");
  cli::useConventions(app);
  std::string endpoint, conf, backend = "c10d";
  StatusOptions status;
  app.add_option(cli::spellings("rdzv_endpoint"), endpoint,
                 "the rendezvous server (with --rdzv_backend etcd: the etcd members)")
      ->type_name("HOST:PORT[,...]");
  app.add_option(cli::spellings("rdzv_backend"), backend, "c10d (default) or etcd (etcd-v2)")
      ->type_name("c10d|etcd");
  app.add_option(cli::spellings("rdzv_id,run_id"), status.run_id, "the job id")->type_name("ID");
  app.add_option(cli::spellings("rdzv_conf"), conf,
                 "token_file=FILE, tls_ca, tls_cert, tls_key; etcd: user, password, password_file")
      ->type_name("K=V,...");
  std::string silent_after;
  app.add_option(cli::spellings("silent_after"), silent_after,
                 "flag workers whose last progress is at least this old (default 60)")
      ->type_name("SECONDS");
  try {
    cli::parse(app, args);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  if (endpoint.empty() || status.run_id.empty()) {
    throw UsageError("cxxlaunch status needs --rdzv_endpoint HOST:PORT and --rdzv_id ID");
  }
  if (backend == "etcd" || backend == "etcd-v2") {
    status.rdzv.backend = "etcd";
    parseRdzvEndpoint(status.rdzv, "rdzv_endpoint", endpoint);
  } else if (backend == "c10d" || backend == "static") {
    status.rdzv.endpoint = parseEndpoint("rdzv_endpoint", endpoint);
  } else {
    throw UsageError("--rdzv_backend '" + backend + "': c10d, static or etcd");
  }
  if (!conf.empty()) parseRdzvConf(status.rdzv, "rdzv_conf", conf);
  if (!silent_after.empty()) {
    status.silent_after = parseSeconds("silent_after", silent_after, /*allow_zero=*/false);
  }
  if (status.rdzv.token.empty()) {
    const char* token = std::getenv("CXXLAUNCH_TOKEN");  // NOLINT(concurrency-mt-unsafe)
    if (token != nullptr) status.rdzv.token = token;
  }
  return status;
}

}  // namespace cxxlaunch::launcher
