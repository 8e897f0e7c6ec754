// MongoCdcSource: MongoDB change streams as a split-based source of cdc::ChangeEvent (DESIGN.md §8; issue 6;
// the user guide is docs/cdc.md, section "MongoDB"). Built on libmongoc/libbson.
//
//   auto source = MongoCdcSource::builder()
//                     .uri("mongodb://127.0.0.1:27017")
//                     .database("shop")
//                     .collections({"orders", "customers"})      // or .collection_pattern("orders_.*")
//                     .start_mode(MongoStartMode::kInitial)
//                     .build();
//   env.from_source(source, "mongo").key_by([](const cdc::ChangeEvent& e) { return e.entity_id(); }) ...
//
// Splits. One split per watched collection (a change stream does not split). Collections are a list, or a
// regular expression (ECMAScript, matched against the whole name; names starting with "system." never match)
// resolved by listCollections at start and then every `discovery_interval` (default 30 s, 0 = off). The
// enumerator pushes each split to reader subtask
//   owner("db.coll") = ((java_hash("db.coll") * 31) & 0x7FFFFFFF) % parallelism
// (the Kafka source's rule for partition 0: Java's String.hashCode, wrapping int32). It checkpoints its
// unassigned splits and a marker per assigned one, as the Kafka source does, so a restore never hands a split
// out twice. Collections found after the start are read with start mode `initial` (snapshot, then stream), so
// documents written before their discovery are not lost.
//
// Positions. A reader's checkpointed split holds the resume token of the last change it emitted (the raw BSON
// bytes, copied out of the driver's buffer: bson_copy semantics), taken per change as it is handed to the job,
// never a batch's postBatchResumeToken while changes of that batch are still unread (the reader adopts the
// server's post-batch token only after an empty batch, when everything before it has been emitted); before the
// first change, the startAtOperationTime to open the stream at; plus the snapshot state. A restored job reopens
// each stream with resumeAfter the token: the changes emitted before the checkpoint are not emitted again and
// the ones after it are, so with an exactly-once sink every change reaches the output once.
//
// Start modes (MongoStartMode), applied to a split that has no checkpointed position:
//   initial      consistent snapshot then stream: the reader takes the resume point T0 (the cluster time, see
//                below) BEFORE it scans the collection (find, sorted by _id), emits every document as op 'r'
//                (source.snapshot = true), takes T1 after the scan, and then streams from T0 inclusive. Stream
//                events with clusterTime <= T1 overlap the scan and are marked source.snapshot = true. A
//                checkpoint taken during the scan records T0 and the _id of the last document emitted: a
//                restore goes on scanning after that _id (sorted by _id, filter _id > last across BSON's
//                order of types) and streams from the same T0: no document is emitted twice, no change lost.
//   latest       only changes after the start (startAtOperationTime = cluster time + 1 increment, taken by the
//                enumerator when it creates the split).
//   timestamp    startAtOperationTime = (timestamp_ms / 1000, 0).
//   resume-token resumeAfter the given token (canonical Extended JSON of the token document), per collection.
// The cluster time is the reply's `operationTime` (replica sets), else `lastWrite.opTime` of isMaster, else
// the `ts` of the newest entry of local.oplog.rs (the mongo-java-server emulator, which reports neither).
//
// Events. insert -> 'c'; update and replace -> 'u'; delete -> 'd'. key = {"_id": documentKey._id} (falling
// back to fullDocument._id, for servers whose documentKey lacks it); after = fullDocument (updateLookup is
// on by default: the document as it is when the change is read, null when it no longer exists); before =
// fullDocumentBeforeChange when pre_images(true) and the collection has pre-images enabled, else null.
// source.position = canonical Extended JSON of the event's resume token, source.ts_ms = clusterTime seconds *
// 1000, source.txn_id = txnNumber. The event timestamp of each record is source.ts_ms. Other operation types
// (createIndexes, ...) are skipped and counted in metrics().ddl_events. A change without a determinable _id is a
// bad record (BadRecordPolicy: fail by default, or a dead-letter file entry
//   {"source":"mongodb","db":..,"collection":..,"position":..,"error":..,"record":"<change as Extended JSON>"}).
//
// Drop, rename, dropDatabase and invalidate carry no document and produce no envelope; they end the stream.
// MongoOnDrop::kFail (default) fails the job naming the collection, the event and the remedy;
// MongoOnDrop::kEndSplit ends the split (its output is released so the watermark moves on; it is dropped from
// checkpoints; the enumerator does not hand that collection out again while the job runs).
//
// History lost. Server errors 286 (ChangeStreamHistoryLost), 280 (ChangeStreamFatalError) and 260
// (InvalidResumeToken) are not resumable. By default the job fails with a kConnector error naming the collection,
// the stored token's cluster time and the remedy. With MongoOnHistoryLost::kResnapshot the split re-runs the
// `initial` procedure (all its events are marked source.snapshot = true) and metrics().resnapshots counts it.
// Other stream errors fail the task (the job restarts from its checkpoint under its restart strategy); libmongoc
// itself retries a resumable error once.
//
// Reading. Each reader subtask owns one mongoc_client_t (not thread-safe; used only on the task thread). I/O
// happens in poll_next on the task thread, one split per call (round robin), at most `batch_size` records; an
// empty getMore waits at most `max_await` (maxAwaitTimeMS) on the server, so a checkpoint barrier waits at most
// that long per idle collection of the reader (a poll tries the next collection while one has no data). When no
// split had data the reader returns kNothingAvailable and asks to be polled again after `poll_interval`
// (servers that ignore maxAwaitTimeMS, such as the emulator, answer at once).
//
// The driver boundary: all server access goes through mongodb::MongoDriver, so tests inject errors the emulator
// cannot produce (code 286) and run the reader without a server.
//
// Liveness. Every client sets libmongoc's socketTimeoutMS (socket_timeout(), default 30 s, unless the URI sets
// it) and connectTimeoutMS to at most that: a server that stops answering (paused, partitioned) fails the read
// within about that time, and the task fails so the restart strategy takes over, instead of waiting for TCP.
// Before that, each reader's probe (a client of its own pinging every second, timeouts 2.5 s) shows the reader
// disconnected once no ping was answered for 3 s (connections(), source_connection.h: /health's
// `source-disconnected`, the `sourceConnected` gauge, one log line when lost and one when back).
//
// Threading: MongoCdcSource is an immutable, thread-safe factory; the enumerator runs under the source
// coordinator's lock, except its periodic collection discovery, whose listCollections runs off that lock
// (SplitEnumeratorContext::call_async) so a slow or unreachable server does not hold up checkpoints (the first
// discovery, at start, and the cluster time of start mode latest run under it); readers run on their task
// threads; metrics() may be read from any thread.
#pragma once

#include <bson/bson.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/mongodb/bson_value.h"
#include "sluice/connectors/source_connection.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// Where a split without a checkpointed position starts (see the file comment).
enum class MongoStartMode : int32_t { kInitial = 0, kLatest = 1, kTimestamp = 2, kResumeToken = 3 };
/// "initial", "latest", "timestamp", "resume-token".
std::string_view mongo_start_mode_name(MongoStartMode mode) noexcept;

/// What a drop, rename, dropDatabase or invalidate event does.
enum class MongoOnDrop : int32_t {
  kFail = 0,      ///< fail the job (default)
  kEndSplit = 1,  ///< end the collection's split; the job goes on
};

/// What a non-resumable change stream (history lost: codes 286, 280, 260) does.
enum class MongoOnHistoryLost : int32_t {
  kFail = 0,        ///< fail the job naming collection, token time and remedy (default)
  kResnapshot = 1,  ///< snapshot the collection again and stream from there (events marked snapshot)
};

/// A BSON timestamp (cluster time) as one int64: seconds << 32 | increment. 0 = none.
using MongoClusterTime = int64_t;
inline constexpr MongoClusterTime mongo_cluster_time(uint32_t t, uint32_t i) noexcept {
  return static_cast<MongoClusterTime>((uint64_t{t} << 32) | i);
}

/// One watched collection: the split of a MongoCdcSource, with its position.
struct MongoCollectionSplit {
  std::string database;
  std::string collection;
  /// The raw BSON bytes of the resume token to resumeAfter ("" = none yet): a copy, never the driver's buffer.
  std::string resume_token;
  /// Cluster time of the change the token belongs to, ms since epoch (0 unknown); for messages and lag.
  int64_t token_time_ms = 0;
  /// startAtOperationTime when there is no token (0 = none).
  MongoClusterTime start_at = 0;
  /// A (re)snapshot must run before streaming; a restore restarts it from the beginning.
  bool snapshot_pending = false;
  /// The snapshot is a re-snapshot after lost history (its events are counted in metrics().resnapshots).
  bool resnapshot = false;
  /// Stream events with clusterTime <= this overlap the last snapshot and are marked snapshot (0 = none).
  MongoClusterTime overlap_until = 0;
  /// Only in the enumerator's checkpoint: a reader owns this split (the rest of the fields are meaningless).
  bool assigned = false;
  /// While snapshot_pending: the raw BSON of {"_id": <last document emitted by the scan>} ("" = none yet); a
  /// restore resumes the scan after it, with start_at as the snapshot's resume point T0.
  std::string snapshot_last_id;

  /// "<database>.<collection>".
  std::string split_id() const { return database + "." + collection; }
  friend bool operator==(const MongoCollectionSplit&, const MongoCollectionSplit&) = default;
};
SLUICE_FIELDS(MongoCollectionSplit, database, collection, resume_token, token_time_ms, start_at, snapshot_pending,
              resnapshot, overlap_until, assigned, snapshot_last_id);

namespace mongodb {

/// A failure reported by the server or the driver. `code` is the server's error code when it sent one
/// (286 = ChangeStreamHistoryLost), else libmongoc's.
struct DriverError {
  uint32_t domain = 0;
  uint32_t code = 0;
  std::string message;
};

/// True for the change-stream errors that cannot be resumed: 286, 280, 260 (DESIGN.md §10).
bool is_history_lost(uint32_t code) noexcept;

/// A change stream (the driver boundary). Used on one thread.
class ChangeStreamCursor {
 public:
  virtual ~ChangeStreamCursor() = default;
  /// The next change document, valid until the next call; nullptr when there is none now or on an error
  /// (see error()). May wait up to the stream's maxAwaitTimeMS on the server.
  virtual const bson_t* next() = 0;
  /// True (and `out` set) when the stream failed.
  virtual bool error(DriverError& out) const = 0;
  /// The stream's current resume token (the last change's, or the server's post-batch token), or nullptr.
  virtual const bson_t* resume_token() const = 0;
};

/// A cursor over a collection's documents (the snapshot scan). Used on one thread.
class DocumentCursor {
 public:
  virtual ~DocumentCursor() = default;
  /// The next document, valid until the next call; nullptr at the end or on an error (see error()).
  virtual const bson_t* next() = 0;
  virtual bool error(DriverError& out) const = 0;
};

/// Everything the source asks of a MongoDB deployment. The libmongoc implementation holds one client;
/// tests substitute fakes (the emulator cannot produce error 286). Not thread-safe: one per reader.
class MongoDriver {
 public:
  virtual ~MongoDriver() = default;
  /// Opens a change stream on db.coll with `options` (resumeAfter, startAtOperationTime, fullDocument, ...);
  /// errors surface through the cursor's error().
  virtual std::unique_ptr<ChangeStreamCursor> watch(const std::string& db, const std::string& coll,
                                                    const bson_t& options) = 0;
  /// Scans db.coll sorted by _id in batches of `batch_size`; with `after_id` ({"_id": v}) only the documents
  /// that sort after v (in BSON's order of types, then values).
  virtual std::unique_ptr<DocumentCursor> scan(const std::string& db, const std::string& coll, int batch_size,
                                               const bson_t* after_id) = 0;
  /// The deployment's current cluster time (see the file comment). False and `error` set on failure.
  virtual bool cluster_time(const std::string& db, MongoClusterTime& out, DriverError& error) = 0;
  /// The collection names of `db` (listCollections). False and `error` set on failure.
  virtual bool list_collections(const std::string& db, std::vector<std::string>& out, DriverError& error) = 0;
};

/// Makes a driver for the settings of one reader or enumerator.
using MongoDriverFactory = std::function<Result<std::unique_ptr<MongoDriver>>()>;

/// The libmongoc driver: one mongoc_client_t for `uri` (appname "sluice-mongodb-cdc"). Unless the URI sets them,
/// socketTimeoutMS = `socket_timeout_ms` and connectTimeoutMS = min(10 s, socket_timeout_ms) (0 = libmongoc's
/// defaults). Errors: kConfiguration for an invalid URI.
[[nodiscard]] Result<std::unique_ptr<MongoDriver>> make_libmongoc_driver(const std::string& uri,
                                                                         int64_t socket_timeout_ms = 0);

/// The filter of a scan that resumes after `after_id` ({"_id": v}): {$or: [{_id: {$gt: v}}, {_id: {$type: t}}
/// for every BSON type t that MongoDB sorts after v's type]} ($gt alone compares within one type). Appends to
/// `filter` (an initialised, empty bson_t). Exposed for tests.
void scan_after_filter(const bson_t& after_id, bson_t& filter);

/// One change document mapped (mongodb_change_mapping.cc; exposed for the mapping tests).
struct MappedChange {
  enum class Kind {
    kEvent,        ///< `event` holds an envelope
    kEndOfStream,  ///< drop, rename, dropDatabase or invalidate: `what` describes it
    kSkip,         ///< an operation type without an envelope (createIndexes, ...): `what` names it
  };
  Kind kind = Kind::kEvent;
  cdc::ChangeEvent event;
  std::string what;
  MongoClusterTime cluster_time = 0;
};

/// Maps a change-stream document of `split`'s collection. `overlap_until` marks events as snapshot (see
/// MongoCollectionSplit). Errors (kSerialization): not BSON-convertible, no operationType, no _id for a
/// document event. Thread-safety: pure function.
[[nodiscard]] Result<MappedChange> map_change_document(const bson_t& change, const MongoCollectionSplit& split,
                                                       const BsonToValueOptions& options = {});

/// The reader subtask that owns collection `split_id` ("db.coll") under `parallelism` (see the file comment).
int collection_split_owner(std::string_view split_id, int parallelism) noexcept;

}  // namespace mongodb

/// Counters and gauges of one MongoCdcSource, shared by its readers. Thread-safe: readers update them on
/// their task threads; anyone may read them.
class MongoCdcSourceMetrics {
 public:
  /// Envelopes emitted (stream and snapshot), over all attempts.
  std::atomic<int64_t> events{0};
  /// Snapshot reads (op 'r') among them.
  std::atomic<int64_t> snapshot_reads{0};
  /// Events skipped (operation types without an envelope) and end-of-stream events (drop, rename, ...).
  std::atomic<int64_t> ddl_events{0};
  /// Non-resumable stream errors seen (286/280/260) and re-snapshots they caused.
  std::atomic<int64_t> history_lost{0};
  std::atomic<int64_t> resnapshots{0};
  /// Bad records sent to the dead-letter file.
  std::atomic<int64_t> bad_records{0};
  /// Cluster time (ms since epoch) of the latest stream event emitted by any reader (0 none yet).
  std::atomic<int64_t> last_event_time_ms{0};
  /// Each open reader's connection to the server (source_connection.h), reported by its probe: a client of its
  /// own that pings the server every second (socket and server-selection timeouts 2.5 s); disconnected once no
  /// ping was answered for 3 s. Only with the default libmongoc driver.
  std::shared_ptr<SourceConnectionBoard> connections = std::make_shared<SourceConnectionBoard>("MongoDB CDC source");

  /// What a reader records after it emitted a stream event: `position` of split `split_id` and its time.
  void record_position(const std::string& split_id, const std::string& position, int64_t cluster_time_ms);
  /// What a reader records when the server answered split `split_id`'s getMore with an empty batch at `now_ms`
  /// (wall clock): the stream had nothing newer, so the split is caught up as of then.
  void record_caught_up(const std::string& split_id, int64_t now_ms);
  /// The latest position (resume token as Extended JSON) per split ("db.coll").
  std::map<std::string, std::string> positions() const;
  /// Source lag, measured against the server's position: the largest, over the streaming splits, of now_ms minus
  /// the later of the split's latest event's cluster time and the last time the server said it had nothing newer
  /// (an empty getMore batch); so an idle but caught-up collection lags at most about max_await, not the time
  /// since its last change. 0 before the first stream event or empty batch.
  int64_t lag_ms(int64_t now_ms) const noexcept;
  /// Events per second since the previous call of this function (the first call measures from creation).
  double events_per_second(int64_t now_monotonic_ns);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> positions_;
  struct SplitTimes {
    int64_t event_ms = 0;      // cluster time of the latest event
    int64_t caught_up_ms = 0;  // wall time of the latest empty batch
  };
  std::map<std::string, SplitTimes> split_times_;  // guarded by mu_
  int64_t rate_last_ns_ = -1;
  int64_t rate_last_events_ = 0;
};

namespace detail {

/// Everything a MongoCdcSource is configured with, validated by MongoCdcSourceBuilder::try_build().
struct MongoCdcSourceSettings {
  std::string uri;
  std::string database;
  std::vector<std::string> collections;
  std::string collection_pattern;
  MongoStartMode start_mode = MongoStartMode::kInitial;
  int64_t start_timestamp_ms = 0;
  /// kResumeToken: token (canonical Extended JSON of the token document) per collection name.
  std::map<std::string, std::string> resume_tokens;
  bool update_lookup = true;
  bool pre_images = false;
  MongoOnDrop on_drop = MongoOnDrop::kFail;
  MongoOnHistoryLost on_history_lost = MongoOnHistoryLost::kFail;
  int64_t discovery_interval_ms = 30'000;
  int64_t max_await_ms = 100;
  int64_t socket_timeout_ms = 30'000;
  int64_t poll_interval_ms = 20;
  int32_t batch_size = 1024;
  mongodb::BsonToValueOptions value_options;
  BadRecordPolicy bad_record_policy = BadRecordPolicy::kFail;
  std::string dead_letter_path;
  /// Makes the driver of each reader and of the enumerator; defaults to libmongoc on `uri`.
  mongodb::MongoDriverFactory driver_factory;
  /// Each reader pings `uri` on a client of its own (MongoCdcSourceMetrics::connections); set with the default
  /// driver.
  bool watch_connection = false;

  /// "db.[a, b]" or "db./pattern/" for messages.
  std::string describe() const;
};

}  // namespace detail

class MongoCdcSourceBuilder;

/// MongoDB change streams as a source of cdc::ChangeEvent (see the file comment).
class MongoCdcSource final : public Source<cdc::ChangeEvent, MongoCollectionSplit> {
 public:
  static MongoCdcSourceBuilder builder();

  /// Use builder(). `settings` must have been validated.
  explicit MongoCdcSource(detail::MongoCdcSourceSettings settings);

  Boundedness boundedness() const override { return Boundedness::kContinuousUnbounded; }
  /// The enumerator, with its own driver. Throws SluiceException (kConnector) when the server cannot be
  /// reached for discovery or cluster time at start.
  std::unique_ptr<SplitEnumerator<MongoCollectionSplit>> create_enumerator(
      SplitEnumeratorContext<MongoCollectionSplit>& ctx) const override;
  /// A reader with its own driver (client). Throws SluiceException (kConfiguration) for a bad URI.
  std::unique_ptr<SourceReader<cdc::ChangeEvent, MongoCollectionSplit>> create_reader(
      SourceReaderContext& ctx) const override;

  /// Counters and gauges shared by all readers (thread-safe).
  const std::shared_ptr<MongoCdcSourceMetrics>& metrics() const noexcept { return metrics_; }
  /// Each open reader subtask's connection to the server (see MongoCdcSourceMetrics::connections). Thread-safe.
  std::vector<SourceConnection> connections() const {
    return metrics_->connections->snapshot(SourceConnectionBoard::steady_now_ms());
  }
  const detail::MongoCdcSourceSettings& settings() const noexcept { return settings_; }

 private:
  std::shared_ptr<DeadLetterFile> dead_letter_file() const;

  detail::MongoCdcSourceSettings settings_;
  std::shared_ptr<MongoCdcSourceMetrics> metrics_ = std::make_shared<MongoCdcSourceMetrics>();
  mutable std::mutex mu_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;
};

/// Configures a MongoCdcSource. Not thread-safe; a value type.
class MongoCdcSourceBuilder {
 public:
  /// mongodb://host:port/... (libmongoc's URI; do not set a server API version against the emulator). Required.
  MongoCdcSourceBuilder& uri(std::string uri);
  /// The database of the collections. Required.
  MongoCdcSourceBuilder& database(std::string db);
  /// Watches these collections. Exclusive with collection_pattern().
  MongoCdcSourceBuilder& collections(std::vector<std::string> names);
  /// Watches every collection whose whole name matches `regex` (ECMAScript), found again every discovery.
  MongoCdcSourceBuilder& collection_pattern(std::string regex);
  /// Where splits without a checkpointed position start (default kInitial).
  MongoCdcSourceBuilder& start_mode(MongoStartMode mode);
  /// kTimestamp: the cluster time to start at, ms since epoch (rounded down to seconds).
  MongoCdcSourceBuilder& start_timestamp_ms(int64_t ms);
  /// kResumeToken: the token per collection (canonical Extended JSON, e.g. {"_data": "8263..."}).
  MongoCdcSourceBuilder& resume_token(std::string collection, std::string token_json);
  /// fullDocument: updateLookup (default true). Without it updates have after = null.
  MongoCdcSourceBuilder& update_lookup(bool on);
  /// fullDocumentBeforeChange: whenAvailable (default false; needs changeStreamPreAndPostImages on the
  /// collection, MongoDB 6.0+).
  MongoCdcSourceBuilder& pre_images(bool on);
  /// Drop, rename, invalidate: fail (default) or end the split.
  MongoCdcSourceBuilder& on_drop(MongoOnDrop policy);
  /// History lost (286/280/260): fail (default) or re-snapshot.
  MongoCdcSourceBuilder& on_history_lost(MongoOnHistoryLost policy);
  /// How often to list collections for a pattern (default 30 s; 0 = only at start).
  MongoCdcSourceBuilder& discovery_interval(std::chrono::milliseconds interval);
  /// maxAwaitTimeMS of the change streams (default 100 ms): the longest a poll blocks the task thread.
  MongoCdcSourceBuilder& max_await(std::chrono::milliseconds wait);
  /// libmongoc's socketTimeoutMS (default 30 s; a socketTimeoutMS in the URI wins): how long a read waits for
  /// a server that does not answer before the source fails. Must exceed max_await().
  MongoCdcSourceBuilder& socket_timeout(std::chrono::milliseconds timeout);
  /// How soon an idle reader polls again (default 20 ms; at least 1 ms).
  MongoCdcSourceBuilder& poll_interval(std::chrono::milliseconds interval);
  /// Records per poll and the cursors' batch size (default 1024).
  MongoCdcSourceBuilder& batch_size(int32_t n);
  /// How BSON int32 maps to Value (default: int64, width not kept).
  MongoCdcSourceBuilder& int32_mapping(mongodb::Int32Mapping mapping);
  /// What to do with changes that cannot be mapped (default fail); kDeadLetter needs a file path.
  MongoCdcSourceBuilder& on_bad_record(BadRecordPolicy policy, std::string dead_letter_path = "");
  /// Replaces the libmongoc driver (tests: error injection at the driver boundary).
  MongoCdcSourceBuilder& driver_factory(mongodb::MongoDriverFactory factory);

  /// The source, or a kConfiguration error saying what is missing or invalid.
  [[nodiscard]] Result<std::shared_ptr<MongoCdcSource>> try_build() const;
  /// As try_build(), throwing SluiceException on an error.
  std::shared_ptr<MongoCdcSource> build() const { return try_build().value_or_throw(); }

 private:
  detail::MongoCdcSourceSettings s_;
};

}  // namespace sluice
