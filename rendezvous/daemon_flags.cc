#include "rendezvous/daemon_flags.h"

#include <charconv>
#include <cstdlib>
#include <vector>

#include "common/command_line.h"
#include "common/error.h"
#include "common/file.h"

namespace cxxlaunch::rendezvous {
namespace {

[[noreturn]] void fail(const std::string& flag, const std::string& value, const std::string& want) {
  throw InvalidArgument(flag + ": '" + value + "' is not " + want);
}

int64_t parseCount(const std::string& flag, const std::string& value, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v < lo ||
      v > hi) {
    fail(flag, value, "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v;
}

// The daemon's numeric flags: each row its name, meaning, range and where its value goes, so
// that a value past its bound is one clear error, never an overflow later.
struct NumberFlag {
  const char* name;
  const char* value_name;
  const char* help;
  int64_t lo, hi;
  void (*store)(ServerOptions&, int64_t);
};

const std::vector<NumberFlag>& numberFlags() {
  static const std::vector<NumberFlag> table = {
      {"port", "PORT", "port to listen on (default 29400; 0 picks a free one)", 0, 65535,
       [](ServerOptions& o, int64_t v) { o.port = static_cast<int>(v); }},
      {"store-max-keys", "N", "keys in a run's store (default 100000)", 1, 1'000'000'000,
       [](ServerOptions& o, int64_t v) { o.store_limits.max_keys = v; }},
      {"store-max-bytes", "N", "bytes of keys and values in a run's store (default 64 MiB)", 1,
       int64_t{1} << 40, [](ServerOptions& o, int64_t v) { o.store_limits.max_bytes = v; }},
      {"store-max-key-bytes", "N", "bytes of one key (default 4096)", 1, 1 << 20,
       [](ServerOptions& o, int64_t v) { o.store_limits.max_key_bytes = v; }},
      {"store-max-value-bytes", "N", "bytes of one value (default 16 MiB)", 1, 1 << 30,
       [](ServerOptions& o, int64_t v) { o.store_limits.max_value_bytes = v; }},
      {"store-max-total-bytes", "N",
       "bytes held for all runs together: keys, values, failure descriptions, run state "
       "(default 1 GiB)",
       1, int64_t{1} << 50, [](ServerOptions& o, int64_t v) { o.max_total_bytes = v; }},
      {"max-message-bytes", "N", "bytes of one request or answer (default 64 MiB)", 4096, 1 << 30,
       [](ServerOptions& o, int64_t v) { o.max_message_bytes = static_cast<int>(v); }},
      {"run-retention", "SECONDS",
       "how long a finished run, or one whose nodes all went silent, stays after its last call "
       "(default 600)",
       0, 7 * 24 * 3600,
       [](ServerOptions& o, int64_t v) { o.run_retention = std::chrono::seconds(v); }},
  };
  return table;
}

// What the command line said, as text until each value is checked.
struct DaemonFlags {
  std::string host, token_file, tls_cert, tls_key, tls_ca;
  std::vector<std::string> numbers = std::vector<std::string>(numberFlags().size());
};

void addDaemonFlags(CLI::App& app, DaemonFlags& f) {
  cli::useConventions(app);
  app.footer(
      "The --store-max-* limits are per run, --store-max-total-bytes over all runs; a call past "
      "one gets RESOURCE_EXHAUSTED naming it.");
  app.add_option(cli::spellings("host"), f.host,
                 "address to bind (default 127.0.0.1: loopback only)")
      ->type_name("ADDR");
  app.add_option(cli::spellings("token-file"), f.token_file,
                 "file whose first line is the job token every call must carry (default: "
                 "$CXXLAUNCH_TOKEN, else none)")
      ->type_name("FILE");
  app.add_option(cli::spellings("tls-cert"), f.tls_cert, "serve TLS only, with this certificate")
      ->type_name("FILE");
  app.add_option(cli::spellings("tls-key"), f.tls_key, "the certificate's key")->type_name("FILE");
  app.add_option(cli::spellings("tls-ca"), f.tls_ca,
                 "also require client certificates signed by this CA")
      ->type_name("FILE");
  for (size_t i = 0; i < numberFlags().size(); ++i) {
    const NumberFlag& n = numberFlags()[i];
    app.add_option(cli::spellings(n.name), f.numbers[i], n.help)->type_name(n.value_name);
  }
}

constexpr const char* kDaemonDescription =
    "cxxlaunchd: the standalone rendezvous daemon; nodes of many jobs (run ids) meet here.\n"
    "Prints \"cxxlaunchd listening on HOST:PORT\" once it serves; SIGINT/SIGTERM stop it.\n"
    "Exit codes: 0 stopped by a signal, 1 cannot serve, 2 bad flags.";

}  // namespace

std::string daemonUsage() {
  CLI::App app(kDaemonDescription, "cxxlaunchd");
  DaemonFlags flags;
  addDaemonFlags(app, flags);
  return app.help();
}

ServerOptions parseDaemonFlags(const std::vector<std::string>& args) {
  CLI::App app(kDaemonDescription, "cxxlaunchd");
  DaemonFlags f;
  addDaemonFlags(app, f);
  cli::parse(app, args);
  ServerOptions o;
  o.port = 29400;
  if (const char* token = std::getenv("CXXLAUNCH_TOKEN")) o.token = token;  // NOLINT
  if (!f.host.empty()) o.host = f.host;
  if (!f.token_file.empty()) o.token = readTokenFile(f.token_file, "--token-file");
  o.tls_cert_file = f.tls_cert;
  o.tls_key_file = f.tls_key;
  o.tls_ca_file = f.tls_ca;
  for (size_t i = 0; i < numberFlags().size(); ++i) {
    const NumberFlag& n = numberFlags()[i];
    if (f.numbers[i].empty()) continue;
    n.store(o, parseCount("--" + std::string(n.name), f.numbers[i], n.lo, n.hi));
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    throw InvalidArgument("--tls-cert and --tls-key go together");
  }
  // A value the store takes must fit in the message that carries it, with its key and framing.
  const int64_t largest = o.store_limits.max_value_bytes + o.store_limits.max_key_bytes + 4096;
  if (largest > o.max_message_bytes) {
    throw InvalidArgument("--max-message-bytes " + std::to_string(o.max_message_bytes) +
                          " cannot carry the largest value and key the store takes (" +
                          std::to_string(largest) +
                          " bytes with framing); raise it or lower "
                          "--store-max-value-bytes");
  }
  return o;
}

std::string exposureWarning(const ServerOptions& options) {
  const bool loopback = options.host == "127.0.0.1" || options.host == "localhost" ||
                        options.host == "::1" || options.host == "[::1]";
  if (loopback || !options.tls_cert_file.empty()) return "";
  return "warning: serving " + options.host + " without TLS; anyone who can reach it " +
         (options.token.empty() ? "can join any job and read or write its store (set a token)"
                                : "can see the token");
}

}  // namespace cxxlaunch::rendezvous
