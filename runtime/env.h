#pragma once
// WorkerEnv: the launcher's contract (runtime/env_names.h) read once into a typed struct.
// A program started without the launcher gets a world of one: rank 0 of 1, no store.
// readWorkerEnv() throws InvalidArgument naming the variable when a value is malformed.
// Thread-safety: reads the process environment; call it before starting threads that setenv.

#include <optional>
#include <string>

namespace cxxlaunch::runtime {

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string role = "default";
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: no launcher, nothing reserved
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string error_file;
  std::string store_endpoint;  // empty: no rendezvous store (single process)
  std::string store_prefix;
  std::string token;
  std::optional<int> device;            // GPU id chosen by the launcher, if any
  std::string node_addr = "127.0.0.1";  // where other ranks reach this one
  std::string tls_ca, tls_cert, tls_key;

  // Training settings (runtime/env_names.h), validated.
  std::string strategy = "ddp";
  std::string mixed_precision = "no";
  int gradient_accumulation_steps = 1;
  double gradient_clipping = 0;  // max norm; 0: no clipping
  std::string backend = "auto";
  bool shared_memory = true;  // Gloo: allreduce through shared memory when all ranks are local

  bool launched() const { return !run_id.empty(); }
};

WorkerEnv readWorkerEnv();

}  // namespace cxxlaunch::runtime
