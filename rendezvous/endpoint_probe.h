#pragma once
// What answers at a rendezvous endpoint, found without gRPC: one TCP connection that sends the
// HTTP/2 client preface (which every gRPC server answers with a SETTINGS frame) and reads the
// first bytes back.
//
// Why: given an endpoint held by another program (an HTTP server, anything that accepts and
// sends something else), gRPC reports only that it could not connect, and a join that waits for
// its server to come up would wait its whole join timeout. The probe tells "nothing there yet"
// (keep waiting, as torchrun does) from "someone else is there" (an error now).
//
// Thread-safety: a free function; it blocks for at most its timeout.

#include <string>

#include "rendezvous/run_state.h"

namespace cxxlaunch::rendezvous {

struct EndpointAnswer {
  enum class Kind {
    kNothing,  // no connection (refused, unreachable, timed out): no server there yet
    kSilent,   // connected, but nothing came back within the timeout, or it closed at once
    kHttp2,    // an HTTP/2 server, as gRPC servers are; the calls tell whether it is ours
    kTls,      // a TLS record: a server that speaks TLS first
    kOther,    // anything else: not a gRPC server
  };
  Kind kind = Kind::kNothing;
  std::string first_bytes;  // what it sent first (at most 64 bytes)
};

// Probes `endpoint` (HOST:PORT, [IPV6]:PORT). Throws InvalidArgument for an endpoint that does
// not parse.
EndpointAnswer probeEndpoint(const std::string& endpoint, Millis timeout);

// `bytes` as text for a message: printable ASCII as is, the rest escaped (\r, \n, \xHH).
std::string printableBytes(const std::string& bytes);

}  // namespace cxxlaunch::rendezvous
