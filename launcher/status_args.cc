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
  std::string endpoint, conf;
  StatusOptions status;
  app.add_option(cli::spellings("rdzv_endpoint"), endpoint, "the rendezvous server")
      ->type_name("HOST:PORT");
  app.add_option(cli::spellings("rdzv_id,run_id"), status.run_id, "the job id")->type_name("ID");
  app.add_option(cli::spellings("rdzv_conf"), conf, "token_file=FILE, tls_ca, tls_cert, tls_key")
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
  status.rdzv.endpoint = parseEndpoint("rdzv_endpoint", endpoint);
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
