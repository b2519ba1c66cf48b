#include "rendezvous/wire.h"

#include <grpc/support/log.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/file.h"

namespace cxxlaunch::rendezvous::wire {

NodeSpec fromProto(const rdzv::NodeInfo& p) {
  NodeSpec n;
  n.id = p.id();
  n.addr = p.addr();
  n.local_world_size = p.local_world_size();
  n.master_port = p.master_port();
  n.node_rank = p.node_rank();
  return n;
}

void toProto(const NodeSpec& n, rdzv::NodeInfo* p) {
  p->set_id(n.id);
  p->set_addr(n.addr);
  p->set_local_world_size(n.local_world_size);
  p->set_master_port(n.master_port);
  p->set_node_rank(n.node_rank);
}

RunSettings fromProto(const rdzv::RunSettings& p) {
  RunSettings s;
  s.min_nodes = p.min_nodes();
  s.max_nodes = p.max_nodes();
  s.last_call_timeout = Millis(p.last_call_timeout_ms());
  s.keep_alive_interval = Millis(p.keep_alive_interval_ms());
  s.keep_alive_max_misses = p.keep_alive_max_misses();
  s.max_restarts = p.max_restarts();
  return s;
}

void toProto(const RunSettings& s, rdzv::RunSettings* p) {
  p->set_min_nodes(s.min_nodes);
  p->set_max_nodes(s.max_nodes);
  p->set_last_call_timeout_ms(s.last_call_timeout.count());
  p->set_keep_alive_interval_ms(s.keep_alive_interval.count());
  p->set_keep_alive_max_misses(s.keep_alive_max_misses);
  p->set_max_restarts(s.max_restarts);
}

Placement fromProto(const rdzv::RoundInfo& p) {
  Placement r;
  r.round = p.round();
  r.node_rank = p.node_rank();
  r.num_nodes = p.num_nodes();
  r.rank_offset = p.rank_offset();
  r.world_size = p.world_size();
  r.master_addr = p.master_addr();
  r.master_port = p.master_port();
  r.restart_count = p.restart_count();
  return r;
}

void toProto(const Placement& r, rdzv::RoundInfo* p) {
  p->set_round(r.round);
  p->set_node_rank(r.node_rank);
  p->set_num_nodes(r.num_nodes);
  p->set_rank_offset(r.rank_offset);
  p->set_world_size(r.world_size);
  p->set_master_addr(r.master_addr);
  p->set_master_port(r.master_port);
  p->set_restart_count(r.restart_count);
}

FailureReport fromProto(const rdzv::Failure& p) {
  return {p.node_id(), p.rank(), p.exit_code(), p.description()};
}

void toProto(const FailureReport& f, rdzv::Failure* p) {
  p->set_node_id(f.node_id);
  p->set_rank(f.rank);
  p->set_exit_code(f.exit_code);
  p->set_description(f.description);
}

Verdict fromProto(const rdzv::KeepAliveResponse& p) {
  Verdict v;
  switch (p.action()) {
    case rdzv::RESTART:
      v.action = Action::kRestart;
      break;
    case rdzv::FAIL:
      v.action = Action::kFail;
      break;
    case rdzv::CLOSED:
      v.action = Action::kClosed;
      break;
    default:
      v.action = Action::kContinue;
      break;
  }
  v.reason = p.reason();
  if (p.has_root_cause()) v.root_cause = fromProto(p.root_cause());
  return v;
}

void toProto(const Verdict& v, rdzv::KeepAliveResponse* p) {
  switch (v.action) {
    case Action::kContinue:
      p->set_action(rdzv::CONTINUE);
      break;
    case Action::kRestart:
      p->set_action(rdzv::RESTART);
      break;
    case Action::kFail:
      p->set_action(rdzv::FAIL);
      break;
    case Action::kClosed:
      p->set_action(rdzv::CLOSED);
      break;
  }
  p->set_reason(v.reason);
  if (v.root_cause) toProto(*v.root_cause, p->mutable_root_cause());
}

WorkerProgress fromProto(const rdzv::WorkerProgress& p) {
  WorkerProgress w;
  w.local_rank = p.local_rank();
  w.rank = p.rank();
  w.pid = p.pid();
  w.state = p.state();
  if (p.progress_age_ms() >= 0) w.progress_age = Millis(p.progress_age_ms());
  w.steps = std::max<int64_t>(0, p.steps());
  w.step_us = std::max<int64_t>(0, p.step_us());
  w.work_us = std::max<int64_t>(0, p.work_us());
  return w;
}

void toProto(const WorkerProgress& w, rdzv::WorkerProgress* p) {
  p->set_local_rank(w.local_rank);
  p->set_rank(w.rank);
  p->set_pid(w.pid);
  p->set_state(w.state);
  p->set_progress_age_ms(w.progress_age ? w.progress_age->count() : -1);
  p->set_steps(w.steps);
  p->set_step_us(w.step_us);
  p->set_work_us(w.work_us);
}

namespace {
NodeState fromProto(const rdzv::NodeStatus& p) {
  NodeState n;
  n.spec.id = p.id();
  n.spec.addr = p.addr();
  n.spec.local_world_size = p.local_world_size();
  n.node_rank = p.node_rank();
  n.heartbeat_age = Millis(p.heartbeat_age_ms());
  n.finished = p.finished();
  for (const auto& w : p.workers()) n.workers.push_back(wire::fromProto(w));
  return n;
}

void toProto(const NodeState& n, rdzv::NodeStatus* p) {
  p->set_id(n.spec.id);
  p->set_addr(n.spec.addr);
  p->set_local_world_size(n.spec.local_world_size);
  p->set_node_rank(n.node_rank);
  p->set_heartbeat_age_ms(n.heartbeat_age.count());
  p->set_finished(n.finished);
  for (const auto& w : n.workers) wire::toProto(w, p->add_workers());
}
}  // namespace

RunStatus fromProto(const rdzv::StatusResponse& p) {
  RunStatus s;
  s.round = p.round();
  s.state = p.state();
  for (const auto& n : p.participants()) s.participants.push_back(fromProto(n));
  for (const auto& n : p.waiting()) s.waiting.push_back(fromProto(n));
  s.restart_count = p.restart_count();
  s.settings = fromProto(p.settings());
  return s;
}

void toProto(const RunStatus& s, rdzv::StatusResponse* p) {
  p->set_round(s.round);
  p->set_state(s.state);
  for (const auto& n : s.participants) toProto(n, p->add_participants());
  for (const auto& n : s.waiting) toProto(n, p->add_waiting());
  p->set_restart_count(s.restart_count);
  toProto(s.settings, p->mutable_settings());
}

std::string readTlsFile(const std::string& path, const char* what) {
  const std::string name = std::string("the TLS ") + what + " file";
  std::string text = readRegularFile(path, name, 1 << 20);  // PEM files are a few KiB
  if (text.empty()) throw InvalidArgument(name + " '" + path + "' is empty");
  return text;
}

std::shared_ptr<grpc::ChannelCredentials> clientCredentials(const std::string& ca_file,
                                                            const std::string& cert_file,
                                                            const std::string& key_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = readTlsFile(ca_file, "CA");
  if (!cert_file.empty()) {
    ssl.pem_cert_chain = readTlsFile(cert_file, "certificate");
    ssl.pem_private_key = readTlsFile(key_file, "key");
  }
  return grpc::SslCredentials(ssl);
}

void quietGrpcLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("CXXLAUNCH_GRPC_LOG") == nullptr) {  // NOLINT(concurrency-mt-unsafe)
      gpr_set_log_function([](gpr_log_func_args*) {});
    }
  });
}

void throwIfError(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return;
  const std::string message = what + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNAUTHENTICATED:  // a wrong token is the user's to fix, not to retry
    case grpc::StatusCode::PERMISSION_DENIED:
      throw InvalidArgument(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      throw LimitExceeded(message);
    case grpc::StatusCode::FAILED_PRECONDITION:
      throw StaleError(message);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw TimeoutError(message);
    default:
      throw CommunicationError(message + " (gRPC status " +
                               std::to_string(static_cast<int>(status.error_code())) + ")");
  }
}

}  // namespace cxxlaunch::rendezvous::wire
