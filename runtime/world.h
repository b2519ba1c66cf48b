#pragma once
// World: this process's place in the job and how it talks to the other ranks, built once from
// the launcher's environment (runtime/env.h). A process started without the launcher is a world
// of one with an in-memory store and a Gloo backend that never touches the network.
//
// Thread-safety: build it once, on the main thread; the backend is then thread-safe.

#include <memory>

#include "runtime/comm/backend.h"
#include "runtime/env.h"
#include "runtime/heartbeat.h"

namespace cxxlaunch::rendezvous {
class Store;
}

namespace cxxlaunch::runtime {

struct World {
  WorkerEnv env;
  std::shared_ptr<rendezvous::Store> store;  // this round's store (the launcher's)
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Heartbeat> heartbeat;  // for the launcher's --watchdog_timeout
};

// The store the launcher gave this worker (CXXLAUNCH_STORE_*), or a MemoryStore for a world of
// one. Throws InvalidArgument for a world of several without a store.
std::shared_ptr<rendezvous::Store> storeFromEnv(const WorkerEnv& env);

// env.backend: "gloo", "nccl", or "auto" (NCCL when compiled in and a device is assigned or
// `use_gpu`, else Gloo). Connects the ranks: throws TimeoutError when they do not all come. The
// backend is checked (checked_backend.h); its waits beat `heartbeat`, if given.
std::shared_ptr<Backend> backendFromEnv(const WorkerEnv& env,
                                        std::shared_ptr<rendezvous::Store> store,
                                        bool use_gpu = false,
                                        std::shared_ptr<Heartbeat> heartbeat = nullptr);

World connectWorld(bool use_gpu = false);

}  // namespace cxxlaunch::runtime
