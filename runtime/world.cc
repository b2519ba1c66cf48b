#include "runtime/world.h"

#include "common/error.h"
#include "rendezvous/client.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/memory_store.h"
#include "runtime/comm/checked_backend.h"

namespace cxxlaunch::runtime {

std::shared_ptr<rendezvous::Store> storeFromEnv(const WorkerEnv& env) {
  if (env.store_endpoint.empty()) {
    if (env.world_size > 1) {
      throw InvalidArgument("WORLD_SIZE=" + std::to_string(env.world_size) +
                            " but no CXXLAUNCH_STORE_ENDPOINT: start the workers with cxxlaunch "
                            "run, which gives them a rendezvous store");
    }
    return std::make_shared<rendezvous::MemoryStore>();
  }
  auto [run_id, round] = rendezvous::parseStorePrefix(env.store_prefix);
  if (env.store_endpoint.rfind(rendezvous::kEtcdScheme, 0) == 0) {
    // --rdzv_backend etcd: the round's keys live in the etcd cluster itself.
    rendezvous::EtcdOptions etcd;
    etcd.endpoints = rendezvous::parseEtcdEndpoints(env.store_endpoint);
    etcd.user = env.store_user;
    etcd.password = env.token;
    etcd.tls_ca_file = env.tls_ca;
    etcd.tls_cert_file = env.tls_cert;
    etcd.tls_key_file = env.tls_key;
    return std::make_shared<rendezvous::EtcdStore>(std::make_shared<rendezvous::EtcdClient>(etcd),
                                                   run_id, round,
                                                   rendezvous::etcdRootOf(env.store_endpoint));
  }
  rendezvous::ClientOptions options;
  options.endpoint = env.store_endpoint;
  options.token = env.token;
  options.tls_ca_file = env.tls_ca;
  options.tls_cert_file = env.tls_cert;
  options.tls_key_file = env.tls_key;
  return std::make_shared<rendezvous::GrpcStore>(options, run_id, round);
}

std::shared_ptr<Backend> backendFromEnv(const WorkerEnv& env,
                                        std::shared_ptr<rendezvous::Store> store, bool use_gpu,
                                        std::shared_ptr<Heartbeat> heartbeat) {
  BackendOptions options;
  options.rank = env.rank;
  options.world_size = env.world_size;
  options.store = std::move(store);
  options.address = env.node_addr;
  options.device = env.device.value_or(env.local_rank);
  options.shared_memory = env.shared_memory;
  options.timeout = std::chrono::seconds(env.collective_timeout_s);
  const bool nccl = env.backend == "nccl" ||
                    (env.backend == "auto" && ncclCompiledIn() && (use_gpu || env.device));
  CheckOptions check;  // hangs that explain themselves (checked_backend.h)
  check.debug = env.debug;
  check.store = options.store;
  // Waits in slices only when someone watches the beats.
  if (heartbeat && heartbeat->watched()) check.heartbeat = std::move(heartbeat);
  return makeCheckedBackend(nccl ? makeNcclBackend(options) : makeGlooBackend(options),
                            std::move(check));
}

World connectWorld(bool use_gpu) {
  World world;
  world.env = readWorkerEnv();
  world.store = storeFromEnv(world.env);
  world.heartbeat = std::make_shared<Heartbeat>(world.env.heartbeat_file);
  world.backend = backendFromEnv(world.env, world.store, use_gpu, world.heartbeat);
  return world;
}

}  // namespace cxxlaunch::runtime
