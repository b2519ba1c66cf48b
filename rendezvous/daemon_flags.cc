#include "rendezvous/daemon_flags.h"

#include <charconv>
#include <cstdlib>

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

}  // namespace

const char* daemonUsage() {
  return "usage: cxxlaunchd [--host ADDR] [--port PORT] [--token-file FILE]\n"
         "                  [--tls-cert FILE --tls-key FILE [--tls-ca FILE]] [limits]\n"
         "  --host        address to bind (default 127.0.0.1: loopback only)\n"
         "  --port        port to listen on (default 29400; 0 picks a free one)\n"
         "  --token-file  file whose first line is the job token every call must carry\n"
         "                (default: $CXXLAUNCH_TOKEN, else none)\n"
         "  --tls-cert/--tls-key  serve TLS only; --tls-ca also requires client certificates\n"
         "limits (per run; a call past one gets RESOURCE_EXHAUSTED naming it):\n"
         "  --store-max-keys N          keys in a run's store (default 100000)\n"
         "  --store-max-bytes N         bytes of keys and values in a run's store (default 64 "
         "MiB)\n"
         "  --store-max-key-bytes N     bytes of one key (default 4096)\n"
         "  --store-max-value-bytes N   bytes of one value (default 16 MiB)\n"
         "  --max-message-bytes N       bytes of one request or answer (default 64 MiB)\n"
         "  --run-retention SECONDS     how long a finished run, or one whose nodes all went\n"
         "                              silent, stays after its last call (default 600)\n";
}

ServerOptions parseDaemonFlags(const std::vector<std::string>& args) {
  ServerOptions o;
  o.port = 29400;
  if (const char* token = std::getenv("CXXLAUNCH_TOKEN")) o.token = token;  // NOLINT
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw InvalidArgument(flag + " needs a value");
    }
    StoreLimits& limits = o.store_limits;
    if (flag == "--host") {
      o.host = value;
    } else if (flag == "--port") {
      o.port = static_cast<int>(parseCount(flag, value, 0, 65535));
    } else if (flag == "--token-file") {
      o.token = readTokenFile(value, "--token-file");
    } else if (flag == "--tls-cert") {
      o.tls_cert_file = value;
    } else if (flag == "--tls-key") {
      o.tls_key_file = value;
    } else if (flag == "--tls-ca") {
      o.tls_ca_file = value;
    } else if (flag == "--store-max-keys") {
      limits.max_keys = parseCount(flag, value, 1, 1'000'000'000);
    } else if (flag == "--store-max-bytes") {
      limits.max_bytes = parseCount(flag, value, 1, int64_t{1} << 40);
    } else if (flag == "--store-max-key-bytes") {
      limits.max_key_bytes = parseCount(flag, value, 1, 1 << 20);
    } else if (flag == "--store-max-value-bytes") {
      limits.max_value_bytes = parseCount(flag, value, 1, 1 << 30);
    } else if (flag == "--max-message-bytes") {
      o.max_message_bytes = static_cast<int>(parseCount(flag, value, 4096, 1 << 30));
    } else if (flag == "--run-retention") {
      o.run_retention = std::chrono::seconds(parseCount(flag, value, 0, 7 * 24 * 3600));
    } else {
      throw InvalidArgument("unknown flag '" + flag + "'");
    }
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
