// Private to src/sluice/connectors/kafka/: what several files of the Kafka sink share (its settings, producer,
// producer pool, writer and committer): the writer state, the transaction timeout, the marker decision, the
// transactional ids and their owners; and (namespace kafka_sink_internal) the steady clock of the deadlines,
// `fail`, the sink's name in messages and the producers' properties. Not installed; kafka_sink.h's file comment
// describes the design.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/api/functions.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// One writer's entry of the union list state "kafka-sink-writers": which transactional ids a run used, so that
/// a restore with another parallelism or pool size still aborts all of them.
struct KafkaSinkWriterState {
  int32_t subtask = 0;
  int32_t parallelism = 1;
  int32_t pool_size = 0;
  std::string transactional_id_prefix;
  friend bool operator==(const KafkaSinkWriterState&, const KafkaSinkWriterState&) = default;
};
SLUICE_FIELDS(KafkaSinkWriterState, subtask, parallelism, pool_size, transactional_id_prefix);

namespace detail {

/// The default transaction.timeout.ms of exactly-once producers (Kafka's default transaction.max.timeout.ms).
inline constexpr int64_t kDefaultTransactionTimeoutMs = 900'000;
/// Name of the union list state of KafkaSinkWriterState.
inline constexpr const char* kWriterStateName = "kafka-sink-writers";

// Defined in kafka_sink_settings.cc.

/// transaction.timeout.ms the exactly-once producers use (the property, else kDefaultTransactionTimeoutMs).
int64_t transaction_timeout_ms(const KafkaSinkSettings& settings);

/// The warning logged at start when transaction.timeout.ms is less than twice max_commit_delay_ms, or when
/// max_commit_delay_ms is unknown; nullopt when there is nothing to warn about (or not exactly-once).
std::optional<std::string> transaction_timeout_warning(const KafkaSinkSettings& settings);

// The marker decision for committables without a probe record (resolve_marker is defined in
// kafka_sink_committer.cc).

/// One answer of the broker to "the committed offset of a marker group" (an OffsetFetch).
struct MarkerReading {
  enum class Kind : uint8_t {
    kOffset,          ///< an offset is committed; `metadata` is its token
    kNoOffset,        ///< no offset is committed for the group
    kUnstable,        ///< UNSTABLE_OFFSET_COMMIT: the broker still holds pending transactional offsets
    kRetriableError,  ///< a timeout, a coordinator moving or loading: ask again (`error` says what)
  };
  Kind kind = Kind::kNoOffset;
  std::string metadata;
  std::string error;
};

/// Decides whether the transaction whose marker carries `token` was committed, from the readings of
/// `fetch(require_stable)`, called on the task thread after init_transactions completed the transactional id's
/// last transaction. Returns the committed marker's metadata (nullopt: no offset is committed). Used for
/// committables without a probe record (written before format version 2, or a transaction without records).
///  * A stable reading (require_stable) is certain and returned.
///  * While the broker answers UNSTABLE_OFFSET_COMMIT or not at all (a read_committed consumer's fetch times
///    out while offsets are pending), the materialized offsets (require_stable off) are read as well: only committed
///    transactional offsets are materialized, so when they carry `token` the transaction was committed, certainly, and
///    `token` is returned. Anything else there is no evidence either way.
///  * Otherwise it asks again every `retry_ms` until `timeout_ms`, then throws SluiceException (kConnector)
///    naming `who`, the group and the last answer: re-publishing could publish the transaction twice and
///    skipping could lose it, so the task fails (and the restore runs again after the restart) instead of
///    guessing. (Kafka 4.4 was seen to answer UNSTABLE_OFFSET_COMMIT for a complete transaction's group for
///    minutes after a broker restart.)
///  `interrupt` (may be empty) is called between the questions and throws to stop waiting (the task's
///  cancellation, the sink's liveness probe).
std::optional<std::string> resolve_marker(const std::function<MarkerReading(bool require_stable)>& fetch,
                                          std::string_view token, int64_t timeout_ms, int64_t retry_ms,
                                          std::string_view who, std::string_view group,
                                          const std::function<void()>& interrupt = nullptr);

// The transactional ids of a subtask (defined in kafka_producer_pool.cc) and which subtask settles a restored
// committable.

/// `<prefix>-<subtask>-<k>`.
std::string transactional_id(std::string_view prefix, int subtask, int k);

/// The transactional ids abort_lingering of subtask `subtask` (of `parallelism`) initializes: `<prefix>-<j>-<k>`
/// for every j < max(old_parallelism, parallelism) with j % parallelism == subtask and k < max(old_pool_size,
/// pool_size), except those in `skip`. Sorted by (j, k).
std::vector<std::string> lingering_transactional_ids(std::string_view prefix, int subtask, int parallelism,
                                                     int old_parallelism, int pool_size, int old_pool_size,
                                                     const std::vector<std::string>& skip);

/// Whether subtask `subtask` of `parallelism` settles a restored committable written by old subtask
/// `committable_subtask` (committable_subtask % parallelism == subtask).
inline bool owns_committable(int committable_subtask, int subtask, int parallelism) noexcept {
  return parallelism > 0 && committable_subtask % parallelism == subtask;
}

}  // namespace detail

namespace kafka_sink_internal {

using detail::KafkaSinkSettings;

// The clock of the sink's deadlines and waits.
using Clock = std::chrono::steady_clock;

inline Clock::time_point deadline_after(int64_t ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}

inline int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1'000'000'000));
}

/// Throws SluiceException (kConnector) with `message`, which fails the task.
[[noreturn]] inline void fail(std::string message) {
  throw SluiceException(Error(ErrorCode::kConnector, std::move(message)));
}

/// Wall-clock milliseconds (pre-commit times, tokens).
inline int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// "Kafka sink '<operator>' (subtask <i>)", the sink's name in messages.
inline std::string describe(const RuntimeContext& ctx) {
  return "Kafka sink '" + ctx.operator_name() + "' (subtask " + std::to_string(ctx.subtask_index()) + ")";
}

// Defined in kafka_sink_settings.cc.

// The librdkafka properties of a sink producer: the sink's defaults, the user's properties, then the ones the
// sink manages.
kafka::KafkaProperties producer_properties(const KafkaSinkSettings& settings, const std::string& transactional_id);

// The connection and security settings among the sink's client properties (a consumer of a marker group needs
// them; the producer's own settings would only draw librdkafka's "producer property ignored" warnings).
kafka::KafkaProperties marker_consumer_properties(const KafkaSinkSettings& settings);

}  // namespace kafka_sink_internal
}  // namespace sluice
