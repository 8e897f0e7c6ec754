#include "sluice/cluster/rpc/rpc_status.h"

#include <fmt/format.h>

namespace sluice::rpc {
namespace {

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

Error to_error(const grpc::Status& status, const std::string& call, const std::string& peer) {
  ErrorCode code = ErrorCode::kInternal;
  switch (status.error_code()) {
    case grpc::StatusCode::FAILED_PRECONDITION:
      code = ErrorCode::kGraph;
      break;
    case grpc::StatusCode::INVALID_ARGUMENT:
      code = ErrorCode::kConfiguration;
      break;
    default:
      if (is_transient(status)) code = ErrorCode::kNetwork;
      break;
  }
  return Error(code,
               fmt::format("{} at {}: {} {}", call, peer, code_name(status.error_code()), status.error_message()));
}

bool is_transient(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
      return true;
    default:
      return false;
  }
}

void configure_server(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address) {
  grpc::ChannelArguments args;
  // Reconnect quickly after the peer comes back (gRPC's default backoff grows to 120 s), so a restarted
  // JobManager is found within the TaskManager's own registration backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC (1.51, subchannel.cc) reads the "minimum reconnect backoff" as the minimum timeout of one connection
  // attempt, not as a floor of the backoff: at 100 ms, attempts on a loaded machine timed out "before receiving
  // SETTINGS frame" and RPCs failed UNAVAILABLE (checkpoint triggers, deployments). Attempts still start 100 ms
  // apart at first and at most 1 s apart.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::chrono::system_clock::time_point deadline_in(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

}  // namespace sluice::rpc
