#pragma once
// The one error hierarchy of cxxlaunch. Library code throws these; each `main` maps them to
// documented exit codes and the gRPC edge maps them to canonical status codes. Messages are
// written for the user: what was wrong and what to do about it.

#include <stdexcept>
#include <string>

namespace cxxlaunch {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller asked for something impossible (bad flag, bad config, bad key). Exit code 2.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A request would pass a configured bound (store keys, bytes, key or value size, message size).
// A kind of InvalidArgument: retrying the same request cannot help. The message names the limit
// and the flag that sets it.
class LimitExceeded : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A bounded wait ran out (store get, rendezvous join, collective).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Talking to a peer or a server failed (socket, gRPC, NCCL).
class CommunicationError : public Error {
 public:
  using Error::Error;
};

// A peer that the protocol needs is gone (evicted node, killed rank).
class PeerLost : public Error {
 public:
  using Error::Error;
};

// The call refers to a rendezvous round the run has moved past (the fencing token is stale), or
// to a run that is closed or failed.
class StaleError : public Error {
 public:
  using Error::Error;
};

// An operating-system call failed. `what` names the call and the errno text.
class SystemError : public Error {
 public:
  SystemError(const std::string& call, int err);
  int code() const { return code_; }

 private:
  int code_;
};

}  // namespace cxxlaunch

// Checks a syscall-style return value (-1 means failure, errno set) and throws SystemError
// naming the call. Evaluates `expr` exactly once and yields its value.
#define CXXLAUNCH_SYSCALL(expr)                                            \
  ([&]() {                                                                 \
    auto cxxlaunch_rc_ = (expr);                                           \
    if (cxxlaunch_rc_ == -1) throw ::cxxlaunch::SystemError(#expr, errno); \
    return cxxlaunch_rc_;                                                  \
  }())
