// The gRPC plugins the cxxlaunch binary registers: gRPC 1.51's own list
// (src/core/plugin_registry/grpc_plugin_registry.cc, grpc_core::BuildCoreConfiguration) without
// what a launcher never uses: xDS and its filters (RegisterExtraFilters), the grpclb, RLS, ring
// hash, outlier detection, priority and weighted-target load balancers, fault injection, the
// fake resolver and the c-ares DNS resolver (names resolve through getaddrinfo, gRPC's native
// resolver, as everywhere else in the launcher).
//
// Why: the binary links gRPC statically (cmake/static_deps.cmake), and gRPC's start-up touches
// every plugin it registers; without these the launcher's peak memory stays under 10 MiB
// (docs/benchmarks.md). Defining the function here keeps the linker from pulling gRPC's
// registry, and with it the code of the plugins, out of libgrpc.a. Built only against gRPC 1.51
// (apps/CMakeLists.txt): the list is that version's.
//
// The declarations name gRPC's internal functions; CoreConfiguration is declared only as far as
// the pointer type in their signatures needs.

namespace grpc_core {
class CoreConfiguration {
 public:
  class Builder;
};
}  // namespace grpc_core

namespace grpc_event_engine::experimental {
void RegisterEventEngineChannelArgPreconditioning(grpc_core::CoreConfiguration::Builder* builder);
}  // namespace grpc_event_engine::experimental

namespace grpc_core {

void RegisterHttpConnectHandshaker(CoreConfiguration::Builder* builder);
void RegisterTCPConnectHandshaker(CoreConfiguration::Builder* builder);
void RegisterPickFirstLbPolicy(CoreConfiguration::Builder* builder);
void RegisterRoundRobinLbPolicy(CoreConfiguration::Builder* builder);
void BuildClientChannelConfiguration(CoreConfiguration::Builder* builder);
void SecurityRegisterHandshakerFactories(CoreConfiguration::Builder* builder);
void RegisterClientAuthorityFilter(CoreConfiguration::Builder* builder);
void RegisterChannelIdleFilters(CoreConfiguration::Builder* builder);
void RegisterHttpFilters(CoreConfiguration::Builder* builder);
void RegisterDeadlineFilter(CoreConfiguration::Builder* builder);
void RegisterMessageSizeFilter(CoreConfiguration::Builder* builder);
void RegisterServiceConfigChannelArgFilter(CoreConfiguration::Builder* builder);
void RegisterResourceQuota(CoreConfiguration::Builder* builder);
void RegisterNativeDnsResolver(CoreConfiguration::Builder* builder);
void RegisterSockaddrResolver(CoreConfiguration::Builder* builder);
void RegisterHttpProxyMapper(CoreConfiguration::Builder* builder);
void RegisterSecurityFilters(CoreConfiguration::Builder* builder);
void RegisterBuiltins(CoreConfiguration::Builder* builder);

// In gRPC's order (the handshakers' order matters: the last registered runs first).
void BuildCoreConfiguration(CoreConfiguration::Builder* builder) {
  grpc_event_engine::experimental::RegisterEventEngineChannelArgPreconditioning(builder);
  RegisterHttpConnectHandshaker(builder);
  RegisterTCPConnectHandshaker(builder);
  RegisterPickFirstLbPolicy(builder);
  RegisterRoundRobinLbPolicy(builder);
  BuildClientChannelConfiguration(builder);
  SecurityRegisterHandshakerFactories(builder);
  RegisterClientAuthorityFilter(builder);
  RegisterChannelIdleFilters(builder);
  RegisterHttpFilters(builder);
  RegisterDeadlineFilter(builder);
  RegisterMessageSizeFilter(builder);
  RegisterServiceConfigChannelArgFilter(builder);
  RegisterResourceQuota(builder);
  RegisterNativeDnsResolver(builder);
  RegisterSockaddrResolver(builder);
  RegisterHttpProxyMapper(builder);
  RegisterSecurityFilters(builder);
  RegisterBuiltins(builder);
}

}  // namespace grpc_core
