#pragma once
// Conversions between the wire messages (proto/rendezvous.proto) and our structs, and between
// grpc::Status and our errors. Internal to rendezvous/: no other module includes .pb.h files.

#include <grpcpp/grpcpp.h>

#include "proto/rendezvous.pb.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::rendezvous::wire {

// The metadata key that carries the job token.
inline constexpr char kTokenHeader[] = "x-cxxlaunch-token";

NodeSpec fromProto(const rdzv::NodeInfo& p);
void toProto(const NodeSpec& n, rdzv::NodeInfo* p);

RunSettings fromProto(const rdzv::RunSettings& p);
void toProto(const RunSettings& s, rdzv::RunSettings* p);

Placement fromProto(const rdzv::RoundInfo& p);
void toProto(const Placement& placement, rdzv::RoundInfo* p);

FailureReport fromProto(const rdzv::Failure& p);
void toProto(const FailureReport& f, rdzv::Failure* p);

Verdict fromProto(const rdzv::KeepAliveResponse& p);
void toProto(const Verdict& v, rdzv::KeepAliveResponse* p);

WorkerProgress fromProto(const rdzv::WorkerProgress& p);
void toProto(const WorkerProgress& w, rdzv::WorkerProgress* p);

RunStatus fromProto(const rdzv::StatusResponse& p);
void toProto(const RunStatus& s, rdzv::StatusResponse* p);

// Runs `body`, mapping our exceptions to the canonical status codes: LimitExceeded ->
// RESOURCE_EXHAUSTED, InvalidArgument ->
// INVALID_ARGUMENT, StaleError -> FAILED_PRECONDITION, TimeoutError -> DEADLINE_EXCEEDED,
// anything else -> INTERNAL.
template <typename Body>
grpc::Status guarded(Body&& body) {
  try {
    return body();
  } catch (const LimitExceeded& e) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, e.what()};
  } catch (const InvalidArgument& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  } catch (const StaleError& e) {
    return {grpc::StatusCode::FAILED_PRECONDITION, e.what()};
  } catch (const TimeoutError& e) {
    return {grpc::StatusCode::DEADLINE_EXCEEDED, e.what()};
  } catch (const std::exception& e) {
    return {grpc::StatusCode::INTERNAL, e.what()};
  }
}

// The contents of a TLS file (`what`: "certificate", "key", "CA"); InvalidArgument naming the
// file when it cannot be read or is empty.
std::string readTlsFile(const std::string& path, const char* what);

// A client's channel credentials: TLS when `ca_file` is given (mutual when `cert_file` and
// `key_file` are too), else insecure. InvalidArgument when a file cannot be read.
std::shared_ptr<grpc::ChannelCredentials> clientCredentials(const std::string& ca_file,
                                                            const std::string& cert_file,
                                                            const std::string& key_file);

// gRPC's own log lines ("Handshake failed ...", "No address added ...") would reach users next to
// our clear errors; they are dropped unless CXXLAUNCH_GRPC_LOG is set. Idempotent.
void quietGrpcLogs();

// The other way, for clients: throws the error a status stands for. `what` names the call.
// INVALID_ARGUMENT and UNAUTHENTICATED -> InvalidArgument (retrying cannot help),
// RESOURCE_EXHAUSTED -> LimitExceeded, FAILED_PRECONDITION -> StaleError, DEADLINE_EXCEEDED ->
// TimeoutError, else CommunicationError.
void throwIfError(const grpc::Status& status, const std::string& what);

}  // namespace cxxlaunch::rendezvous::wire
