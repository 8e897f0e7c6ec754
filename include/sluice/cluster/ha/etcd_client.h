// EtcdClient: the parts of etcd's v3 API that Sluice's high-availability services use (key-value, transactions,
// leases), spoken through etcd's JSON gateway (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/kv/deleterange,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/lease/timetolive) with libcurl.
//
// Keys and values are bytes (base64 on the wire, plain std::string here). Every call is one HTTP request with the
// configured timeout. When an endpoint cannot be reached (connect error, timeout, 5xx such as "etcdserver: no
// leader") the call moves on to the next endpoint of the list and tries each once, so a cluster of three survives
// one member's restart; the endpoint that answered is used first by the next call. A request whose answer was lost
// may have been applied: callers write with transactions whose compares make a replay harmless.
//
// Thread-safety: every method may be called from any thread concurrently (each request uses its own curl handle
// from a small pool). Errors: kConnector naming the endpoint(s) and etcd's own message.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/error.h"

namespace sluice::ha {

/// Where etcd is and how long one request may take.
struct EtcdClientOptions {
  /// Client URLs, e.g. {"http://127.0.0.1:2379", "http://127.0.0.1:22379"}; at least one.
  std::vector<std::string> endpoints;
  /// Longest time one HTTP request to one endpoint may take (connect included).
  std::chrono::milliseconds request_timeout{2000};
  std::chrono::milliseconds connect_timeout{1000};
};

/// Parses "http://a:2379,http://b:2379" (commas or spaces; a bare host:port gets http://). kConfiguration when empty.
Result<std::vector<std::string>> parse_etcd_endpoints(std::string_view text);

/// One key as etcd stores it. Revisions are etcd's cluster-wide revision numbers; lease 0 means none.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

/// One condition of a transaction: `target(key) op number` (or `value(key) op value`). A key that does not exist
/// has create_revision, mod_revision, version and lease 0.
struct EtcdCompare {
  enum class Target { kCreateRevision, kModRevision, kVersion, kValue, kLease };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kCreateRevision;
  Op op = Op::kEqual;
  int64_t number = 0;  ///< for every target but kValue
  std::string value;   ///< for kValue
};

/// One operation of a transaction branch.
struct EtcdOp {
  enum class Kind { kPut, kRange, kDelete };
  Kind kind = Kind::kRange;
  std::string key;
  std::string value;  ///< kPut
  int64_t lease = 0;  ///< kPut: attach the key to this lease (0: none)

  static EtcdOp put(std::string key, std::string value, int64_t lease = 0) {
    return EtcdOp{Kind::kPut, std::move(key), std::move(value), lease};
  }
  static EtcdOp range(std::string key) { return EtcdOp{Kind::kRange, std::move(key), {}, 0}; }
  static EtcdOp remove(std::string key) { return EtcdOp{Kind::kDelete, std::move(key), {}, 0}; }
};

/// What a transaction did: which branch ran, the store's revision after it, and per operation of that branch the
/// keys a kRange found (empty for puts and deletes).
struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<std::vector<EtcdKeyValue>> ranges;
};

/// A granted lease: its id and the TTL etcd granted (seconds).
struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_s = 0;
};

/// A client of one etcd cluster. Create with create(); see the file comment for threads and failover.
class EtcdClient {
 public:
  [[nodiscard]] static Result<std::unique_ptr<EtcdClient>> create(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  /// The key, or nullopt when it does not exist.
  Result<std::optional<EtcdKeyValue>> get(std::string_view key);
  /// Every key starting with `prefix`, in key order.
  Result<std::vector<EtcdKeyValue>> get_prefix(std::string_view prefix);
  /// Writes `key` (attached to `lease` unless 0); returns the revision of the write.
  Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease = 0);
  /// Deletes `key`; returns how many keys were deleted (0 or 1).
  Result<int64_t> remove(std::string_view key);
  /// Runs `success` when every compare holds, else `failure`, atomically.
  Result<EtcdTxnResult> txn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& success,
                            const std::vector<EtcdOp>& failure);

  /// Grants a lease of `ttl` (whole seconds, at least 1).
  Result<EtcdLease> grant_lease(std::chrono::seconds ttl);
  /// Renews the lease once; returns its new TTL in seconds, 0 when the lease no longer exists (expired or revoked).
  Result<int64_t> keep_alive_once(int64_t lease_id);
  /// Revokes the lease, deleting every key attached to it. A lease that is already gone is not an error.
  Status revoke_lease(int64_t lease_id);
  /// The lease's remaining TTL in seconds, -1 when it no longer exists.
  Result<int64_t> lease_time_to_live(int64_t lease_id);

  const std::vector<std::string>& endpoints() const;

 private:
  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::ha
