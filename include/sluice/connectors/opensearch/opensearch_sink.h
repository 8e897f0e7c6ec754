// The OpenSearch / Elasticsearch sink (DESIGN.md §8): writes records as `_bulk` actions over HTTP (libcurl),
// at-least-once and idempotent by document id. Works with OpenSearch 1.x/2.x and Elasticsearch 7.x/8.x (the bulk
// format without `_type`).
//
//   auto sink = OpenSearchSink<Charge>::builder()
//                   .url("http://127.0.0.1:9200")
//                   .date_index("charges-{yyyy.MM.dd}", [](const Charge& c) { return c.ts_ms; })
//                   .id([](const Charge& c) { return c.id; })
//                   // document(): by default a SLUICE_FIELDS record's JSON; or a function returning a Value
//                   .build();
//   stream.sink_to(sink).uid("charges-search");
//
// For CDC streams, OpenSearchSink<cdc::ChangeEvent>::builder().change_event_defaults() sets id (the entity id),
// action (delete for op 'd', else index), document (`after`), external version from the source position and the
// dead-letter position.
//
// Records become actions: per record the builder's functions give the index (fixed, per record, or date-based),
// the document id, the action (index, create, delete, update, upsert = update with doc_as_upsert), the document
// (a Value written as JSON) and optionally an external version. Actions are buffered into a bulk request that is
// sent when it holds max_batch_actions actions or max_batch_bytes bytes, when flush_interval has passed since its
// first action, and at every checkpoint.
//
// Delivery guarantee: at-least-once. The checkpoint's snapshot (SinkWriter::flush) sends what is buffered and waits
// until every action written before the barrier is acknowledged by the cluster; any failure fails the checkpoint and
// the task. After a restore the actions since the checkpoint are sent again: with document ids this is idempotent
// (an index overwrites with the same document, a delete of a missing document is a 404, counted as success).
//
// External versioning: with a version function each action carries `version` and `version_type` (`external`: the
// cluster applies it only when it is greater than the stored version; `external_gte`: greater or equal). A replayed
// older change then never overwrites a newer one: the cluster answers 409 version_conflict_engine_exception, which
// this sink counts as success (a newer version is already there; stats()->version_conflicts). Update and upsert
// actions cannot carry a version (the cluster rejects them). Deletes with a version leave a tombstone that the cluster
// keeps for `index.gc_deletes` (60 s by default): an older insert replayed later than that recreates the document,
// so raise `index.gc_deletes` above the longest replay window (checkpoint interval + restart time) of a CDC job.
// CDC versions (change_event_version): Postgres commit LSN "X/Y" (hex) -> (X << 32) | Y; MongoDB resume token
// -> its cluster time (t << 32) | i (a server token's `_data` is KeyString hex starting with 0x82 followed by the 8
// big-endian bytes of the timestamp; mongo-java-server's `_data` is the timestamp's hex value itself). Several
// changes of one row in one transaction share that position, so change_event_defaults() uses `external_gte`: a
// transaction is replayed whole and in order, so the last change of the row wins again, while an older
// transaction's change has a strictly smaller version and is rejected.
//
// Retries: an HTTP 429, a 5xx or a network error (connection refused, timeout; the next URL of the list is tried)
// resends the whole request; inside a 200 response, items that failed with 429 or 5xx are resent alone. Each resend
// waits an exponential backoff (BackoffPolicy: initial, multiplier, max delay, max retries per request); when the
// retries are exhausted the task fails with the last error. Without external versioning a per-item retry can reorder
// two actions on one id inside a request; use versions for change streams.
//
// Failed items: an item that failed for another reason (a mapping error, 400; a 409 without versioning; 4xx) is not
// retried. BadRecordPolicy::kFail (default) fails the task with an error naming the index, id, action, status and the
// cluster's error type and reason; kDeadLetter appends the JSON line
//   {"sink":"opensearch","index":..,"id":..,"action":..,"version":..,"status":..,"error":..,"position":..,
//    "document":..}
// to the dead-letter file (bad_record.h), counts it in stats()->dead_letters and goes on; dead letters are synced
// before a checkpoint's flush returns. Any other HTTP status of the whole request (400, 401, 403, 413: lower
// max_batch_bytes) fails the task with the status and the response's beginning.
//
// Threading: OpenSearchSink and its builder are configured on one thread before the job starts; the sink is then a
// thread-safe factory. A writer belongs to one subtask: its user functions run on the task thread, which encodes
// actions into the open request. Each writer owns one I/O thread that sends requests (one at a time, in order),
// sleeps the backoffs and fires the flush interval. At most max_pending_requests full requests wait or are in flight:
// beyond that write() blocks (backpressure). Errors found by the I/O thread are thrown on the task thread by the next
// write() or flush() (so an idle job learns of them at its next checkpoint). close() stops the I/O thread, aborting
// a request in flight and dropping what is buffered (after a failure; a finished job has flushed everything).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/sink.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/core/json_mapping.h"
#include "sluice/core/value.h"

namespace sluice {

namespace opensearch {

/// The bulk action of a record.
enum class BulkOp : uint8_t {
  kIndex,   ///< create or replace the document (the default)
  kCreate,  ///< create; fails with 409 when the id exists
  kDelete,  ///< delete by id (404 when absent: counted as success)
  kUpdate,  ///< partial update `{"doc": ...}`; fails with 404 when the id is absent
  kUpsert,  ///< partial update, creating the document when absent (`doc_as_upsert`)
};

/// The action's name in the bulk format: "index", "create", "delete", "update" (kUpdate and kUpsert).
std::string_view bulk_op_name(BulkOp op) noexcept;

/// How an action's version is compared with the stored one (the bulk metadata's `version_type`).
enum class VersionType : uint8_t {
  kExternal,     ///< `external`: applied when greater than the stored version
  kExternalGte,  ///< `external_gte`: applied when greater than or equal
};

/// "external" or "external_gte".
std::string_view version_type_name(VersionType type) noexcept;

/// One bulk action, as encoded by append_bulk_action. A plain value type.
struct BulkAction {
  BulkOp op = BulkOp::kIndex;
  std::string index;               ///< target index (or alias / data stream); required
  std::string id;                  ///< document id; empty: the cluster assigns one (index and create only)
  std::optional<int64_t> version;  ///< external version (not for update/upsert)
  VersionType version_type = VersionType::kExternal;
  std::string document;  ///< compact JSON object: the source (index/create) or the partial document (update/upsert)
};

/// Appends the NDJSON lines of `action` to `out`: the metadata line and, except for deletes, the document line
/// (`{"doc":...}` for kUpdate, `{"doc":...,"doc_as_upsert":true}` for kUpsert), each ending in '\n'. Returns a
/// kConfiguration error (and appends nothing) when the index is empty, a delete/update/upsert has no id, an
/// update/upsert carries a version, or a document is missing for an action that needs one.
[[nodiscard]] Status append_bulk_action(const BulkAction& action, std::string& out);

/// The result of one item of a bulk response.
struct BulkItemResult {
  std::string op;          ///< the key of the item ("index", "create", "delete", "update")
  int status = 0;          ///< the item's HTTP status
  std::string error_type;  ///< error.type, e.g. "mapper_parsing_exception"; empty on success
  std::string error;       ///< "type: reason" (plus "; caused by type: reason"); empty on success
};

/// A parsed `_bulk` response body.
struct BulkResponse {
  bool errors = false;  ///< the response's "errors" flag: false means every item succeeded
  std::vector<BulkItemResult> items;
};

/// Parses a `_bulk` response (full, or filtered by `filter_path=errors,items.*.status,items.*.error`) with simdjson.
/// Returns a kConnector error naming the problem and the body's beginning when it is not such a response.
[[nodiscard]] Result<BulkResponse> parse_bulk_response(std::string_view body);

/// What the sink does with an item of a 200 bulk response.
enum class ItemOutcome : uint8_t {
  kSuccess,          ///< 2xx, or a delete's 404 (already absent)
  kVersionConflict,  ///< 409 version_conflict_engine_exception of a versioned action: a newer version is stored
  kRetry,            ///< 429 or 5xx: send it again after the backoff
  kFailed,           ///< anything else: dead letter or job failure
};

/// Classifies an item result of an action `op` that carried a version (`versioned`) or not.
ItemOutcome classify_item(const BulkItemResult& item, BulkOp op, bool versioned) noexcept;

/// True for the HTTP statuses of a whole request that are retried: 429 and 5xx.
bool is_retryable_status(int http_status) noexcept;

/// Exponential backoff between resends of one request. Delay of retry n (1-based):
/// min(initial * multiplier^(n-1), max). A plain value type.
struct BackoffPolicy {
  std::chrono::milliseconds initial{100};  ///< delay before the first retry
  std::chrono::milliseconds max{10'000};   ///< cap of a single delay
  double multiplier = 2.0;                 ///< growth per retry (>= 1)
  int max_retries = 8;                     ///< resends per request; 0 = no retry

  /// The delay before retry `retry` (1-based), in ms.
  int64_t delay_ms(int retry) const noexcept;
};

/// The retry schedule of one request on an injected clock. Not thread-safe (one request, one thread).
class Backoff {
 public:
  Backoff(BackoffPolicy policy, const Clock& clock) : policy_(policy), clock_(clock) {}
  /// Records a failed attempt. Returns the clock time (ms) at which to try again, or nullopt when the
  /// policy's retries are used up.
  std::optional<TimestampMs> next_attempt();
  /// Retries scheduled so far.
  int retries() const noexcept { return retries_; }

 private:
  BackoffPolicy policy_;
  const Clock& clock_;
  int retries_ = 0;
};

/// A date-based index name: literal text with date fields in braces, formatted in UTC from a ms timestamp:
/// "charges-{yyyy.MM.dd}" -> "charges-2026.11.30". Fields: yyyy, yy, MM, dd, HH, mm, ss; other characters inside
/// the braces (".", "-", "_") are copied. An immutable value type, safe to share between threads.
class DateIndexPattern {
 public:
  /// Parses `pattern`; a kConfiguration error naming the position for an unclosed brace or an unknown field.
  [[nodiscard]] static Result<DateIndexPattern> parse(std::string_view pattern);
  /// Appends the name for `ts_ms` (ms since the Unix epoch, may be negative) to `out`.
  void format_to(TimestampMs ts_ms, std::string& out) const;
  /// The name for `ts_ms`.
  std::string format(TimestampMs ts_ms) const {
    std::string s;
    format_to(ts_ms, s);
    return s;
  }
  /// The pattern as given to parse().
  const std::string& pattern() const noexcept { return pattern_; }

 private:
  enum class Field : uint8_t { kLiteral, kYear4, kYear2, kMonth, kDay, kHour, kMinute, kSecond };
  struct Part {
    Field field;
    std::string text;  // kLiteral
  };
  std::string pattern_;
  std::vector<Part> parts_;
};

/// Postgres LSN "X/Y" (hex, as pg_lsn prints it) -> (X << 32) | Y. kConfiguration error for other text or
/// an LSN beyond int64.
[[nodiscard]] Result<int64_t> postgres_lsn_version(std::string_view lsn);

/// MongoDB resume token (extended JSON `{"_data": "..."}`) -> its cluster time (t << 32) | i (see the file
/// comment). kConfiguration error for a token without a readable timestamp.
[[nodiscard]] Result<int64_t> mongodb_resume_token_version(std::string_view token_json);

/// The external version of a change event from its source position, by source.connector ("postgres",
/// "mongodb"); a kConfiguration error naming the connector and position otherwise.
[[nodiscard]] Result<int64_t> change_event_version(const cdc::ChangeEvent& event);

/// The document id of a change event: its entity id as text (a string as it is, a number in decimal, anything
/// else, e.g. a composite key object, as compact JSON).
std::string change_event_id(const cdc::ChangeEvent& event);

/// kDelete for op 'd', kIndex otherwise.
BulkOp change_event_op(const cdc::ChangeEvent& event) noexcept;

/// Counters of one sink instance, shared by its writers; readable from any thread while the job runs.
struct OpenSearchSinkStats {
  std::atomic<int64_t> acknowledged{0};       ///< actions the cluster accepted (incl. version conflicts)
  std::atomic<int64_t> version_conflicts{0};  ///< versioned actions skipped because a newer version is stored
  std::atomic<int64_t> requests{0};           ///< bulk requests sent (incl. resends)
  std::atomic<int64_t> retries{0};            ///< resends (whole requests and per-item)
  std::atomic<int64_t> retried_items{0};      ///< actions resent after a 429/5xx item result
  std::atomic<int64_t> dead_letters{0};       ///< failed items written to the dead-letter file
  std::atomic<int64_t> bytes_sent{0};         ///< request body bytes, incl. resends
};

/// Settings of an OpenSearch sink (the builder fills them). A plain value type.
/// How a decimal Value goes into a document. OpenSearch's dynamic mapping maps a JSON number with a fraction to
/// `float` and a whole one to `long`, so a decimal written as a number is indexed rounded (a float keeps about 7
/// significant digits, a double 15-17) while `_source` keeps its text: term queries, ranges, sorting and
/// aggregations see another value than the one written.
enum class DecimalHandling {
  /// The default: a JSON string of its exact text ("12345678901234567890.123", scale kept), as Debezium's
  /// decimal.handling.mode=string. Exact; dynamic mapping makes the field `text` with a `keyword` sub-field.
  kString,
  /// A JSON number with every digit. Exact only where the index maps the field itself (e.g. `keyword`, or a
  /// `scaled_float` whose scaling factor covers the scale); under dynamic mapping it is indexed rounded.
  kNumber,
};

/// Appends `document` as JSON to `out`, decimals (at any depth) as `handling` says and everything else as
/// Value::write_json writes it.
void write_document(const Value& document, DecimalHandling handling, std::string& out);

struct OpenSearchSinkOptions {
  /// Base URLs ("http://host:9200", optionally with a path prefix). Requests go to the first; after a network error
  /// the next one is used. At least one.
  std::vector<std::string> urls;
  /// HTTP basic authentication (both empty: none).
  std::string username;
  std::string password;
  /// An API key: sent as "Authorization: ApiKey <api_key>" (the base64 id:key form). Empty: none.
  std::string api_key;
  /// TLS (https URLs): verify the server's certificate chain (CURLOPT_SSL_VERIFYPEER) and host name
  /// (CURLOPT_SSL_VERIFYHOST). Turn off only for tests.
  bool tls_verify_peer = true;
  bool tls_verify_host = true;
  std::string ca_file;                                ///< PEM CA bundle (CURLOPT_CAINFO); empty: the system's
  std::string client_cert_file;                       ///< PEM client certificate (CURLOPT_SSLCERT); empty: none
  std::string client_key_file;                        ///< its key (CURLOPT_SSLKEY)
  std::chrono::milliseconds connect_timeout{5'000};   ///< TCP + TLS connect, per attempt
  std::chrono::milliseconds request_timeout{60'000};  ///< a whole request, per attempt
  /// `refresh` query parameter of each request: "" (none, the default), "true" or "wait_for" (slow; for tests).
  std::string refresh;

  int64_t max_batch_actions = 1000;                ///< send when the request holds this many actions
  int64_t max_batch_bytes = 5 * 1024 * 1024;       ///< ... or this many body bytes
  std::chrono::milliseconds flush_interval{1000};  ///< ... or when its first action is this old; 0: no timer
  int max_pending_requests = 2;                    ///< full requests waiting or in flight before write() blocks
  BackoffPolicy backoff;

  BadRecordPolicy on_failed_item = BadRecordPolicy::kFail;
  std::string dead_letter_path;  ///< the dead-letter file for kDeadLetter

  /// How the default documents (change_event_defaults(), Value records) write decimals; see DecimalHandling.
  DecimalHandling decimal_handling = DecimalHandling::kString;
};

/// Checks `options`: a kConfiguration error naming the setting (no URL, a URL that is not http(s), batch limits
/// < 1, backoff multiplier < 1, negative retries, kDeadLetter without a path).
[[nodiscard]] Status validate(const OpenSearchSinkOptions& options);

/// The result of one HTTP request.
struct HttpResult {
  bool network_error = false;  ///< no HTTP response (connect, TLS, timeout, reset); `error` says which
  int status = 0;              ///< HTTP status when there was a response
  std::string body;            ///< response body
  std::string error;           ///< transport error text (network_error) ; empty otherwise
  /// A network_error that every retry and restart would meet again: the server's certificate is not trusted
  /// or does not name the host, the CA file or the client certificate cannot be used, a malformed URL.
  bool permanent = false;
};

/// Sends bulk bodies. One instance per writer, used by its I/O thread only; abort() may be called from any thread.
class BulkTransport {
 public:
  virtual ~BulkTransport() = default;
  /// POSTs `body` (NDJSON) to `<url>/_bulk` and returns the outcome (never throws).
  virtual HttpResult post_bulk(std::string_view body) = 0;
  /// Makes a request in flight and every later one end soon with a network error. Thread-safe.
  virtual void abort() {}
};

/// The libcurl transport: keeps its connection alive between requests, rotates through options.urls after network
/// errors, sends `?filter_path=errors,items.*.status,items.*.error` (and `refresh`) to keep responses small.
std::unique_ptr<BulkTransport> make_curl_transport(const OpenSearchSinkOptions& options);

/// One action's bookkeeping inside an encoded request.
struct BulkItemMeta {
  uint32_t begin = 0;  ///< the action's first byte in BulkBatch::body
  uint32_t end = 0;    ///< one past its last byte (its lines, newlines included)
  BulkOp op = BulkOp::kIndex;
  bool versioned = false;
  std::string position;  ///< the record's source position, for dead letters (may be empty)
};

/// An encoded bulk request: the NDJSON body and one BulkItemMeta per action, in order.
struct BulkBatch {
  std::string body;
  std::vector<BulkItemMeta> items;
  int64_t first_add_ns = 0;  ///< Clock::monotonic_ns() when the first action was added

  /// True when no action was added.
  bool empty() const noexcept { return items.empty(); }
  /// Appends `action` (append_bulk_action) with its meta; on error nothing is appended.
  [[nodiscard]] Status add(const BulkAction& action, std::string position = {});
};

/// An item that failed without a retry (or after its retries): what a dead letter or the job's error reports.
struct FailedItem {
  std::string action;  ///< "index", "create", "delete", "update"
  std::string index;
  std::string id;
  std::optional<int64_t> version;
  int status = 0;
  std::string error;     ///< the cluster's "type: reason"
  std::string position;  ///< the record's source position, if known
  std::string document;  ///< the document line as sent (empty for deletes)

  /// The dead-letter JSON object (see the file comment).
  Value to_dead_letter() const;
  /// Its dead-letter `reason`: the error type ("mapper_parsing_exception"), or "status-<status>" without one.
  std::string reason_code() const;
  /// One line for an error message: "index 'x', id 'y', action index, status 400: mapper_parsing_exception: ...".
  std::string describe() const;
};

/// Sends one BulkBatch to completion: the retries and per-item retries of the file comment, sleeping the backoff
/// through `sleep` (returns false when the sender should stop: the send is then abandoned). Not thread-safe;
/// the clock and transport must outlive it.
class BulkSender {
 public:
  /// Waits `delay_ms`; false when interrupted (closing).
  using Sleeper = std::function<bool(int64_t delay_ms)>;

  BulkSender(BulkTransport& transport, BackoffPolicy backoff, const Clock& clock, Sleeper sleep,
             OpenSearchSinkStats* stats)
      : transport_(transport), backoff_(backoff), clock_(clock), sleep_(std::move(sleep)), stats_(stats) {}

  /// The outcome of send().
  struct Outcome {
    /// Set when the request failed as a whole (a non-retryable status, retries exhausted, an unreadable response)
    /// or was abandoned: nothing of it may be assumed written.
    std::optional<Error> error;
    bool abandoned = false;          ///< the sleeper returned false
    std::vector<FailedItem> failed;  ///< items that failed without retry (dead letter or job failure)
    int64_t acknowledged = 0;        ///< items accepted (incl. version conflicts)
    int64_t version_conflicts = 0;
  };

  /// Sends `batch` (unchanged by the call).
  Outcome send(const BulkBatch& batch);

 private:
  BulkTransport& transport_;
  BackoffPolicy backoff_;
  const Clock& clock_;
  Sleeper sleep_;
  OpenSearchSinkStats* stats_;
};

/// The type-independent part of a writer (see the file comment): the open request, the queue, the I/O thread.
/// add() and flush() run on the task thread; close() too.
class OpenSearchWriterCore {
 public:
  /// Starts the I/O thread. `dead_letter` is required under kDeadLetter. `describe` names the writer in errors
  /// ("OpenSearch sink 'name' subtask 1").
  OpenSearchWriterCore(const OpenSearchSinkOptions& options, std::unique_ptr<BulkTransport> transport,
                       const Clock& clock, std::shared_ptr<DeadLetterFile> dead_letter,
                       std::shared_ptr<OpenSearchSinkStats> stats, std::string describe);
  ~OpenSearchWriterCore();
  OpenSearchWriterCore(const OpenSearchWriterCore&) = delete;
  OpenSearchWriterCore& operator=(const OpenSearchWriterCore&) = delete;

  /// Adds one action to the open request; sends the request when it is full, blocking while max_pending_requests
  /// are pending. Throws SluiceException: kConfiguration for an invalid action, kConnector for an error the
  /// I/O thread found.
  void add(const BulkAction& action, std::string position = {});
  /// Sends the open request and waits until every action added so far is acknowledged (or dead-lettered, and
  /// the dead letters synced). Throws SluiceException (kConnector) on any failure.
  void flush();
  /// Stops the I/O thread (aborting a request in flight); drops what was not sent. Idempotent.
  void close();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace opensearch

/// Writes records to OpenSearch or Elasticsearch (see the file comment). Build with OpenSearchSink<T>::builder().
/// A thread-safe factory.
template <class T>
class OpenSearchSink final : public Sink<T> {
 public:
  class Builder;
  static Builder builder() { return Builder(); }

  /// The settings the builder made (URLs, batching, retries, failed-item policy).
  const opensearch::OpenSearchSinkOptions& options() const noexcept { return options_; }
  /// Counters of every writer of this sink (across jobs that use it).
  const std::shared_ptr<opensearch::OpenSearchSinkStats>& stats() const noexcept { return stats_; }

  /// Opens the dead-letter file (kDeadLetter) and starts the writer's I/O thread; throws SluiceException when the
  /// file cannot be opened.
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const override {
    std::unique_ptr<opensearch::BulkTransport> transport =
        transport_factory_ ? transport_factory_() : opensearch::make_curl_transport(options_);
    return std::make_unique<Writer>(
        *this, std::make_unique<opensearch::OpenSearchWriterCore>(
                   options_, std::move(transport), ctx.clock(), dead_letter_file(), stats_,
                   "OpenSearch sink '" + ctx.operator_name() + "' subtask " + std::to_string(ctx.subtask_index())));
  }

 private:
  friend class Builder;
  OpenSearchSink() = default;

  std::shared_ptr<DeadLetterFile> dead_letter_file() const {
    if (options_.on_failed_item != BadRecordPolicy::kDeadLetter) return nullptr;
    std::lock_guard lock(mu_);
    if (!dead_letter_) dead_letter_ = DeadLetterFile::open(options_.dead_letter_path).value_or_throw();
    return dead_letter_;
  }

  class Writer final : public SinkWriter<T> {
   public:
    Writer(const OpenSearchSink& sink, std::unique_ptr<opensearch::OpenSearchWriterCore> core)
        : sink_(sink), core_(std::move(core)) {}
    void write(const T& record, const SinkWriterContext& /*ctx*/) override {
      const OpenSearchSink& s = sink_;
      action_.op = s.action_ ? s.action_(record) : opensearch::BulkOp::kIndex;
      action_.index.clear();
      if (s.date_index_) {
        s.date_index_->format_to(s.timestamp_(record), action_.index);
      } else if (s.index_selector_) {
        action_.index = s.index_selector_(record);
      } else {
        action_.index = s.index_;
      }
      action_.id = s.id_ ? s.id_(record) : std::string();
      action_.version = s.version_ ? s.version_(record) : std::nullopt;
      action_.version_type = s.version_type_;
      action_.document.clear();
      if (action_.op != opensearch::BulkOp::kDelete) s.document_(record, action_.document);
      core_->add(action_, s.position_ ? s.position_(record) : std::string());
    }
    void flush(bool /*end_of_input*/) override { core_->flush(); }
    void close() override { core_->close(); }

   private:
    const OpenSearchSink& sink_;
    std::unique_ptr<opensearch::OpenSearchWriterCore> core_;
    opensearch::BulkAction action_;  // reused: keeps its buffers' capacity
  };

  opensearch::OpenSearchSinkOptions options_;
  std::string index_;
  std::function<std::string(const T&)> index_selector_;
  std::optional<opensearch::DateIndexPattern> date_index_;
  std::function<TimestampMs(const T&)> timestamp_;
  std::function<std::string(const T&)> id_;
  std::function<opensearch::BulkOp(const T&)> action_;
  std::function<void(const T&, std::string&)> document_;
  std::function<std::optional<int64_t>(const T&)> version_;
  opensearch::VersionType version_type_ = opensearch::VersionType::kExternal;
  std::function<std::string(const T&)> position_;
  std::function<std::unique_ptr<opensearch::BulkTransport>()> transport_factory_;
  std::shared_ptr<opensearch::OpenSearchSinkStats> stats_ = std::make_shared<opensearch::OpenSearchSinkStats>();
  mutable std::mutex mu_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;
};

/// Configures an OpenSearchSink. Methods return *this; try_build() checks the settings.
template <class T>
class OpenSearchSink<T>::Builder {
 public:
  /// The cluster's base URL ("http://127.0.0.1:9200"); call again to add fallbacks. Required.
  Builder& url(std::string url) {
    options_.urls.push_back(std::move(url));
    return *this;
  }
  /// HTTP basic authentication.
  Builder& basic_auth(std::string username, std::string password) {
    options_.username = std::move(username);
    options_.password = std::move(password);
    return *this;
  }
  /// API key authentication ("Authorization: ApiKey <key>").
  Builder& api_key(std::string key) {
    options_.api_key = std::move(key);
    return *this;
  }
  /// TLS certificate checks (curl's VERIFYPEER / VERIFYHOST); both on by default.
  Builder& tls_verify(bool verify_peer, bool verify_host) {
    options_.tls_verify_peer = verify_peer;
    options_.tls_verify_host = verify_host;
    return *this;
  }
  /// A PEM CA bundle to verify the server with.
  Builder& ca_file(std::string path) {
    options_.ca_file = std::move(path);
    return *this;
  }
  /// A client certificate and key (PEM files) for mutual TLS.
  Builder& client_certificate(std::string cert_file, std::string key_file) {
    options_.client_cert_file = std::move(cert_file);
    options_.client_key_file = std::move(key_file);
    return *this;
  }
  /// Connect and whole-request timeouts, per attempt.
  Builder& timeouts(std::chrono::milliseconds connect, std::chrono::milliseconds request) {
    options_.connect_timeout = connect;
    options_.request_timeout = request;
    return *this;
  }
  /// The `refresh` parameter of every request ("true", "wait_for"; default none).
  Builder& refresh(std::string policy) {
    options_.refresh = std::move(policy);
    return *this;
  }
  /// Writes every record to `index`.
  Builder& index(std::string index) {
    index_ = std::move(index);
    return *this;
  }
  /// Chooses the index per record (replaces index()).
  Builder& index_selector(std::function<std::string(const T&)> selector) {
    index_selector_ = std::move(selector);
    return *this;
  }
  /// A date-based index (DateIndexPattern, e.g. "charges-{yyyy.MM.dd}") formatted from `timestamp_ms(record)`
  /// in UTC (replaces index() and index_selector()). An invalid pattern fails try_build().
  Builder& date_index(std::string pattern, std::function<TimestampMs(const T&)> timestamp_ms) {
    date_pattern_ = std::move(pattern);
    timestamp_ = std::move(timestamp_ms);
    return *this;
  }
  /// The document id (default: none; the cluster assigns one, which makes replays duplicate documents).
  Builder& id(std::function<std::string(const T&)> id) {
    id_ = std::move(id);
    return *this;
  }
  /// The action per record (default: index).
  Builder& action(std::function<opensearch::BulkOp(const T&)> action) {
    action_ = std::move(action);
    return *this;
  }
  /// The document (default: the record itself for Value, its JSON for SLUICE_FIELDS types). Must be an object.
  Builder& document(std::function<Value(const T&)> document) {
    document_ = [f = std::move(document)](const T& r, std::string& out) { f(r).write_json(out); };
    return *this;
  }
  /// The document as JSON text appended to `out` (no Value in between).
  Builder& document_json(std::function<void(const T&, std::string& out)> writer) {
    document_ = std::move(writer);
    return *this;
  }
  /// An external version per record (nullopt: none for that record), compared with `type` (file comment).
  Builder& version(std::function<std::optional<int64_t>(const T&)> version,
                   opensearch::VersionType type = opensearch::VersionType::kExternal) {
    version_ = std::move(version);
    version_type_ = type;
    return *this;
  }
  /// The record's source position, written into its dead letter.
  Builder& position(std::function<std::string(const T&)> position) {
    position_ = std::move(position);
    return *this;
  }
  /// Send a request once it holds `actions` actions or `bytes` bytes (defaults 1000 and 5 MiB).
  Builder& batch(int64_t actions, int64_t bytes) {
    options_.max_batch_actions = actions;
    options_.max_batch_bytes = bytes;
    return *this;
  }
  /// Send a request once its first action is `interval` old (default 1 s; 0 disables the timer).
  Builder& flush_interval(std::chrono::milliseconds interval) {
    options_.flush_interval = interval;
    return *this;
  }
  /// Full requests waiting or in flight before write() blocks (default 2).
  Builder& max_pending_requests(int n) {
    options_.max_pending_requests = n;
    return *this;
  }
  /// Retries of a request (429, 5xx, network errors, 429/5xx items).
  Builder& backoff(opensearch::BackoffPolicy policy) {
    options_.backoff = policy;
    return *this;
  }
  /// What to do with items that fail without retry (default kFail); kDeadLetter needs `dead_letter_path`.
  Builder& on_failed_item(BadRecordPolicy policy, std::string dead_letter_path = "") {
    options_.on_failed_item = policy;
    options_.dead_letter_path = std::move(dead_letter_path);
    return *this;
  }
  /// How the default documents write decimals (default DecimalHandling::kString: exact under dynamic mapping).
  Builder& decimal_handling(opensearch::DecimalHandling handling) {
    options_.decimal_handling = handling;
    return *this;
  }
  /// Replaces the HTTP transport (tests: a fake cluster). Called once per writer.
  Builder& transport_factory(std::function<std::unique_ptr<opensearch::BulkTransport>()> factory) {
    transport_factory_ = std::move(factory);
    return *this;
  }
  /// For change events: id = change_event_id, action = change_event_op, document = `after` (decimals as
  /// decimal_handling() says), version =
  /// change_event_version with external_gte, position = source.position (see the file comment). Set an index
  /// (or selector, or date index) too.
  Builder& change_event_defaults() requires std::is_same_v<T, cdc::ChangeEvent> {
    id_ = [](const cdc::ChangeEvent& e) { return opensearch::change_event_id(e); };
    action_ = [](const cdc::ChangeEvent& e) { return opensearch::change_event_op(e); };
    document_ = nullptr;  // try_build() writes `after` with the decimal handling set by then
    change_event_document_ = true;
    version_ = [](const cdc::ChangeEvent& e) -> std::optional<int64_t> {
      return opensearch::change_event_version(e).value_or_throw();
    };
    version_type_ = opensearch::VersionType::kExternalGte;
    position_ = [](const cdc::ChangeEvent& e) { return e.source.position; };
    return *this;
  }

  /// The sink, or a kConfiguration error (validate(options), no index, an invalid date pattern, no document
  /// function for a type without a default).
  [[nodiscard]] Result<std::shared_ptr<OpenSearchSink<T>>> try_build() const {
    SLUICE_RETURN_IF_ERROR(opensearch::validate(options_));
    std::shared_ptr<OpenSearchSink<T>> sink(new OpenSearchSink<T>());
    if (!date_pattern_.empty()) {
      Result<opensearch::DateIndexPattern> pattern = opensearch::DateIndexPattern::parse(date_pattern_);
      if (!pattern.ok()) return pattern.error();
      if (!timestamp_)
        return Error(ErrorCode::kConfiguration, "OpenSearchSink: date_index() needs a timestamp function");
      sink->date_index_ = std::move(pattern).value();
    } else if (!index_selector_ && index_.empty()) {
      return Error(ErrorCode::kConfiguration,
                   "OpenSearchSink: no index: set index(), index_selector() or date_index()");
    }
    sink->options_ = options_;
    sink->index_ = index_;
    sink->index_selector_ = index_selector_;
    sink->timestamp_ = timestamp_;
    sink->id_ = id_;
    sink->action_ = action_;
    sink->version_ = version_;
    sink->version_type_ = version_type_;
    sink->position_ = position_;
    sink->transport_factory_ = transport_factory_;
    if (document_) {
      sink->document_ = document_;
    } else if constexpr (std::is_same_v<T, cdc::ChangeEvent>) {
      if (!change_event_document_) {
        return Error(ErrorCode::kConfiguration,
                     "OpenSearchSink: the record type has no default document: set document() or document_json(), "
                     "or call change_event_defaults()");
      }
      sink->document_ = [h = options_.decimal_handling](const cdc::ChangeEvent& e, std::string& out) {
        opensearch::write_document(e.after, h, out);
      };
    } else if constexpr (std::is_same_v<T, Value>) {
      sink->document_ = [h = options_.decimal_handling](const Value& v, std::string& out) {
        opensearch::write_document(v, h, out);
      };
    } else if constexpr (JsonMappable<T>) {
      sink->document_ = [](const T& r, std::string& out) { append_json(r, out); };
    } else {
      return Error(ErrorCode::kConfiguration,
                   "OpenSearchSink: the record type has no default document: set document() or document_json()");
    }
    return sink;
  }

  /// try_build(), throwing SluiceException on an invalid configuration.
  std::shared_ptr<OpenSearchSink<T>> build() const { return try_build().value_or_throw(); }

 private:
  opensearch::OpenSearchSinkOptions options_;
  std::string index_;
  std::function<std::string(const T&)> index_selector_;
  std::string date_pattern_;
  std::function<TimestampMs(const T&)> timestamp_;
  std::function<std::string(const T&)> id_;
  std::function<opensearch::BulkOp(const T&)> action_;
  std::function<void(const T&, std::string&)> document_;
  bool change_event_document_ = false;  // change_event_defaults(): the document is `after`
  std::function<std::optional<int64_t>(const T&)> version_;
  opensearch::VersionType version_type_ = opensearch::VersionType::kExternal;
  std::function<std::string(const T&)> position_;
  std::function<std::unique_ptr<opensearch::BulkTransport>()> transport_factory_;
};

}  // namespace sluice
