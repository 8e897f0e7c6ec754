// Conversions between Sluice's Error and gRPC's Status, and the server options every Sluice gRPC server uses.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "sluice/core/error.h"

namespace sluice::rpc {

/// A failed gRPC call as an Error: kNetwork for an unreachable peer or a deadline, kGraph for
/// FAILED_PRECONDITION, kConfiguration for INVALID_ARGUMENT, kInternal otherwise. The message names the
/// call, the peer and gRPC's code and message.
Error to_error(const grpc::Status& status, const std::string& call, const std::string& peer);

/// Whether a failed call may succeed when retried (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
/// ABORTED, CANCELLED, UNKNOWN, INTERNAL: the peer is down, slow or restarting).
bool is_transient(const grpc::Status& status);

/// Options of every Sluice gRPC server: no SO_REUSEPORT (a second process must not bind the same port and
/// take half the calls), a small sync-server thread pool.
void configure_server(grpc::ServerBuilder& builder);

/// A channel to `address` (host:port) without TLS, as the control plane runs on a private network
/// (docs/cluster.md says so).
std::shared_ptr<grpc::Channel> make_channel(const std::string& address);

/// A deadline `ms` milliseconds from now.
std::chrono::system_clock::time_point deadline_in(int64_t ms);

}  // namespace sluice::rpc
