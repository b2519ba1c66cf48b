// cxxlaunchd: the standalone rendezvous daemon. Nodes of many jobs (run ids) meet here.
//   cxxlaunchd [--host 127.0.0.1] [--port 29400] [--token-file F] [--tls-cert F --tls-key F
//              [--tls-ca F]]
// Prints "cxxlaunchd listening on HOST:PORT" once it serves; SIGINT/SIGTERM stop it.
// Exit codes: 0 stopped by a signal, 1 cannot serve (port taken, address not local), 2 bad flags.

#include <csignal>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/error.h"
#include "rendezvous/server.h"

namespace {

constexpr const char* kUsage =
    "usage: cxxlaunchd [--host ADDR] [--port PORT] [--token-file FILE]\n"
    "                  [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]\n"
    "  --host        address to bind (default 127.0.0.1: loopback only)\n"
    "  --port        port to listen on (default 29400; 0 picks a free one)\n"
    "  --token-file  file whose first line is the job token every call must carry\n"
    "                (default: $CXXLAUNCH_TOKEN, else none)\n"
    "  --tls-cert/--tls-key  serve TLS only; --tls-ca also requires client certificates\n";

struct UsageError : cxxlaunch::InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

cxxlaunch::rendezvous::ServerOptions parse(const std::vector<std::string>& args) {
  cxxlaunch::rendezvous::ServerOptions o;
  o.port = 29400;
  if (const char* token = std::getenv("CXXLAUNCH_TOKEN")) o.token = token;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError(flag + " needs a value");
    }
    if (flag == "--host") {
      o.host = value;
    } else if (flag == "--port") {
      char* end = nullptr;
      long port = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || port < 0 || port > 65535) {
        throw UsageError("--port: '" + value + "' is not a port number 0-65535");
      }
      o.port = static_cast<int>(port);
    } else if (flag == "--token-file") {
      std::ifstream in(value);
      std::getline(in, o.token);
      if (o.token.empty()) throw UsageError("--token-file: cannot read a token from '" + value + "'");
    } else if (flag == "--tls-cert") {
      o.tls_cert_file = value;
    } else if (flag == "--tls-key") {
      o.tls_key_file = value;
    } else if (flag == "--tls-ca") {
      o.tls_ca_file = value;
    } else {
      throw UsageError("unknown flag '" + flag + "'");
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    throw UsageError("--tls-cert and --tls-key go together");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  // Block the stop signals before gRPC starts its threads; the main thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  try {
    const auto options = parse(args);
    cxxlaunch::rendezvous::RendezvousServer server(options);
    const bool loopback = options.host == "127.0.0.1" || options.host == "localhost" ||
                          options.host == "::1";
    if (!loopback && options.tls_cert_file.empty()) {
      std::cerr << "cxxlaunchd: warning: serving " << options.host
                << " without TLS; anyone who can reach it " 
                << (options.token.empty() ? "can join any job" : "can see the token") << "\n";
    }
    std::cout << "cxxlaunchd listening on " << server.endpoint() << std::endl;
    int sig = 0;
    sigwait(&stop, &sig);
    server.shutdown();
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "cxxlaunchd: error: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const cxxlaunch::InvalidArgument& e) {
    std::cerr << "cxxlaunchd: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cxxlaunchd: " << e.what() << "\n";
    return 1;
  }
}
