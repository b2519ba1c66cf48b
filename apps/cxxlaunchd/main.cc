// cxxlaunchd: the standalone rendezvous daemon. Nodes of many jobs (run ids) meet here. Its flags
// (rendezvous/daemon_flags.h, `cxxlaunchd --help`): --host, --port, --token-file, --tls-cert,
// --tls-key, --tls-ca and the store limits. Prints "cxxlaunchd listening on HOST:PORT" once it
// serves; SIGINT/SIGTERM stop it. Exit codes: 0 stopped by a signal, 1 cannot serve (port taken,
// address not local), 2 bad flags.

#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "common/error.h"
#include "rendezvous/daemon_flags.h"
#include "rendezvous/server.h"

int main(int argc, char** argv) {
  using namespace cxxlaunch::rendezvous;
  const std::vector<std::string> args(argv + 1, argv + argc);
  // Block the stop signals before gRPC starts its threads; the main thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ServerOptions options;
  try {
    options = parseDaemonFlags(args);
  } catch (const cxxlaunch::cli::HelpRequested& help) {
    std::cout << help.text;
    return 0;
  } catch (const cxxlaunch::InvalidArgument& e) {
    std::cerr << "cxxlaunchd: error: " << e.what() << "\n";
    return 2;
  }
  try {
    RendezvousServer server(options);
    if (const std::string warning = exposureWarning(options); !warning.empty()) {
      std::cerr << "cxxlaunchd: " << warning << "\n";
    }
    std::cout << "cxxlaunchd listening on " << server.endpoint() << std::endl;
    int sig = 0;
    sigwait(&stop, &sig);
    server.shutdown();
    return 0;
  } catch (const cxxlaunch::InvalidArgument& e) {
    std::cerr << "cxxlaunchd: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cxxlaunchd: " << e.what() << "\n";
    return 1;
  }
}
