// MongoCdcReader (mongodb_cdc_reader.h) and the probe that watches its connection.
#include "mongodb_cdc_reader.h"

#include <fmt/format.h>
#include <mongoc/mongoc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mongodb_cdc_internals.h"
#include "sluice/connectors/mongodb/libmongoc_logging.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/redact.h"

namespace sluice {
namespace mongodb_cdc_internal {

namespace {

// Watches one reader's connection to the server for /health (MongoCdcSourceMetrics::connections): the change
// stream's own calls block up to the socket timeout (30 s) on a paused server, so a thread of its own pings the
// server every second on a client of its own with short timeouts, and reports the reader disconnected once no ping
// was answered for 3 s.
class MongoConnectionProbe {
 public:
  static constexpr int32_t kTimeoutMs = 2'500;
  static constexpr int64_t kDisconnectedAfterMs = 3'000;

  MongoConnectionProbe(const std::string& uri, std::shared_ptr<SourceConnectionBoard> board, int subtask)
      : board_(std::move(board)), subtask_(subtask) {
    mongodb::init_libmongoc();
    bson_error_t e;
    mongoc_uri_t* u = mongoc_uri_new_with_error(uri.c_str(), &e);
    if (u == nullptr) return;  // the source's own client reports it
    mongoc_uri_set_appname(u, "sluice-mongodb-probe");
    mongoc_uri_set_option_as_int32(u, MONGOC_URI_SOCKETTIMEOUTMS, kTimeoutMs);
    mongoc_uri_set_option_as_int32(u, MONGOC_URI_CONNECTTIMEOUTMS, kTimeoutMs);
    mongoc_uri_set_option_as_int32(u, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, kTimeoutMs);
    client_ = mongoc_client_new_from_uri_with_error(u, &e);
    mongoc_uri_destroy(u);
    if (client_ == nullptr) return;
    mongoc_client_set_error_api(client_, MONGOC_ERROR_API_VERSION_2);
    board_->set_connected(subtask_, SourceConnectionBoard::steady_now_ms());
    thread_ = std::thread([this] { run(); });
  }
  ~MongoConnectionProbe() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (client_ != nullptr) mongoc_client_destroy(client_);
    board_->remove(subtask_);
  }
  MongoConnectionProbe(const MongoConnectionProbe&) = delete;
  MongoConnectionProbe& operator=(const MongoConnectionProbe&) = delete;

 private:
  void run() {
    int64_t last_answer = SourceConnectionBoard::steady_now_ms();
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      const auto sent = std::chrono::steady_clock::now();
      bson_t* ping = BCON_NEW("ping", BCON_INT32(1));
      bson_t reply;
      bson_error_t e;
      const bool ok = mongoc_client_command_simple(client_, "admin", ping, nullptr, &reply, &e);
      bson_destroy(&reply);
      bson_destroy(ping);
      const int64_t now = SourceConnectionBoard::steady_now_ms();
      if (ok) {
        last_answer = now;
        board_->set_connected(subtask_, now);
      } else if (now - last_answer > kDisconnectedAfterMs) {
        board_->set_disconnected(subtask_, last_answer,
                                 fmt::format("the server does not answer pings: {}", redact_secrets(e.message)));
      }
      lock.lock();
      cv_.wait_until(lock, sent + std::chrono::seconds(1), [this] { return stop_; });
    }
  }

  std::shared_ptr<SourceConnectionBoard> board_;
  const int subtask_;
  mongoc_client_t* client_ = nullptr;  // used by the probe's thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

class MongoCdcReader final : public SourceReader<cdc::ChangeEvent, MongoCollectionSplit> {
 public:
  MongoCdcReader(SourceReaderContext& ctx, const detail::MongoCdcSourceSettings& s,
                 std::unique_ptr<mongodb::MongoDriver> driver, std::shared_ptr<MongoCdcSourceMetrics> metrics,
                 std::shared_ptr<DeadLetterFile> dead_letter)
      : ctx_(ctx),
        s_(s),
        driver_(std::move(driver)),
        metrics_(std::move(metrics)),
        dead_letter_(std::move(dead_letter)),
        name_(fmt::format("{} subtask {} ({})", kRole, ctx.subtask_index(), s.describe())) {
    if (s.watch_connection) {
      probe_ = std::make_unique<MongoConnectionProbe>(s.uri, metrics_->connections, ctx.subtask_index());
    }
  }

  InputStatus poll_next(ReaderOutput<cdc::ChangeEvent>& output) override {
    out_ = &output;
    for (auto& sp : splits_) {
      if (sp->output == nullptr) sp->output = &output.output_for_split(sp->split.split_id());
    }
    size_t emitted = 0;
    // One split per call, round robin; an idle split lets the next one try within the same call.
    for (size_t tries = 0; tries < splits_.size() && emitted == 0; ++tries) {
      next_ = next_ % splits_.size();
      Split& sp = *splits_[next_];
      ++next_;
      emitted += poll_split(sp);
    }
    std::erase_if(splits_, [](const std::unique_ptr<Split>& sp) { return sp->finished; });
    if (splits_.empty() && no_more_splits_) return InputStatus::kEndOfInput;
    if (emitted > 0) return InputStatus::kMoreAvailable;
    ctx_.wakeup_at(ctx_.clock().now_ms() + s_.poll_interval_ms);
    return InputStatus::kNothingAvailable;
  }

  void add_splits(std::vector<MongoCollectionSplit> splits) override {
    for (MongoCollectionSplit& s : splits) {
      const bool dup = std::any_of(splits_.begin(), splits_.end(),
                                   [&](const auto& p) { return p->split.split_id() == s.split_id(); });
      if (s.assigned || dup) {
        spdlog::warn("{}: ignoring a split for '{}': {}", name_, s.split_id(),
                     s.assigned ? "it is an enumerator marker" : "this reader already reads it");
        continue;
      }
      auto sp = std::make_unique<Split>();
      sp->split = std::move(s);
      splits_.push_back(std::move(sp));
    }
  }

  void notify_no_more_splits() override { no_more_splits_ = true; }

  std::vector<MongoCollectionSplit> snapshot_state(int64_t /*checkpoint_id*/) override {
    if (unsynced_dead_letters_) {
      dead_letter_->sync().value_or_throw();
      unsynced_dead_letters_ = false;
    }
    std::vector<MongoCollectionSplit> out;
    for (const auto& sp : splits_) {
      if (!sp->finished) out.push_back(sp->split);
    }
    return out;
  }

  void close() override {
    for (auto& sp : splits_) {
      sp->scan.reset();
      sp->stream.reset();
    }
    splits_.clear();
    driver_.reset();
    probe_.reset();
  }

 private:
  struct Split {
    MongoCollectionSplit split;
    ReaderOutput<cdc::ChangeEvent>* output = nullptr;
    std::unique_ptr<mongodb::DocumentCursor> scan;
    std::unique_ptr<mongodb::ChangeStreamCursor> stream;
    MongoClusterTime snapshot_start = 0;
    bool finished = false;
  };

  std::string coll_name(const Split& sp) const { return sp.split.split_id(); }

  [[noreturn]] void fail(const std::string& message) const {
    throw SluiceException(Error(ErrorCode::kConnector, fmt::format("{}: {}", name_, message)));
  }

  /// Fails with an error no restart can cure (core/non_recoverable.h): the job fails at once with `reason`.
  [[noreturn]] void fail_for_good(const std::string& message, std::string_view reason) const {
    throw SluiceException(
        mark_non_recoverable(Error(ErrorCode::kConnector, fmt::format("{}: {}", name_, message)), reason));
  }

  /// Why a driver error can never pass on a retry: the server refused the credentials (AuthenticationFailed, 18;
  /// the driver's authentication error) or the user lacks a privilege (Unauthorized, 13). "" for anything else.
  static std::string non_recoverable_driver_error(const mongodb::DriverError& e) {
    if (e.domain == MONGOC_ERROR_CLIENT && e.code == MONGOC_ERROR_CLIENT_AUTHENTICATE) {
      return "the server refused the credentials";
    }
    if (e.domain == MONGOC_ERROR_SERVER && e.code == 18) return "the server refused the credentials";
    if (e.domain == MONGOC_ERROR_SERVER && e.code == 13) return "the user lacks a privilege the source needs";
    return "";
  }

  size_t poll_split(Split& sp) {
    if (sp.split.snapshot_pending) return poll_snapshot(sp);
    return poll_stream(sp);
  }

  MongoClusterTime cluster_time_or_fail(const Split& sp) {
    MongoClusterTime t = 0;
    mongodb::DriverError e;
    if (!driver_->cluster_time(sp.split.database, t, e)) {
      fail(fmt::format("reading the cluster time for '{}' failed: {} (code {})", coll_name(sp), e.message, e.code));
    }
    return t;
  }

  size_t poll_snapshot(Split& sp) {
    if (!sp.scan) {
      sp.split.resume_token.clear();
      sp.split.token_time_ms = 0;
      sp.stream.reset();
      if (!sp.split.snapshot_last_id.empty() && sp.split.start_at != 0) {
        // A restored scan: documents up to the last one emitted before the checkpoint are not read again, and
        // the stream starts at the same T0, so the changes to those documents since T0 are still streamed.
        bson_t after;
        if (!bson_init_static(&after, reinterpret_cast<const uint8_t*>(sp.split.snapshot_last_id.data()),
                              sp.split.snapshot_last_id.size())) {
          fail(fmt::format("the stored snapshot position of '{}' is not BSON", coll_name(sp)));
        }
        sp.snapshot_start = sp.split.start_at;
        sp.scan = driver_->scan(sp.split.database, sp.split.collection, s_.batch_size, &after);
        spdlog::info("{}: {}snapshot of '{}' resumes after {}; streaming resumes at {}", name_,
                     sp.split.resnapshot ? "re-" : "", coll_name(sp), mongodb::bson_to_canonical_json(after),
                     describe_cluster_time(sp.snapshot_start));
      } else {
        // Consistent start: the resume point is taken before the scan, so every change after it is streamed.
        sp.snapshot_start = cluster_time_or_fail(sp);
        sp.split.start_at = sp.snapshot_start;
        sp.split.snapshot_last_id.clear();
        sp.scan = driver_->scan(sp.split.database, sp.split.collection, s_.batch_size, nullptr);
        spdlog::info("{}: {}snapshot of '{}' starts; streaming resumes at {}", name_, sp.split.resnapshot ? "re-" : "",
                     coll_name(sp), describe_cluster_time(sp.snapshot_start));
      }
    }
    size_t n = 0;
    const int64_t ts_ms = cluster_time_ms(sp.snapshot_start);
    while (n < static_cast<size_t>(s_.batch_size)) {
      const bson_t* doc = sp.scan->next();
      if (doc == nullptr) break;
      remember_scan_position(sp, *doc);
      Result<Value> v = mongodb::bson_to_value(*doc, s_.value_options);
      if (!v.ok()) {
        bad_record(sp, describe_cluster_time(sp.snapshot_start), v.error().message(), *doc);
        continue;
      }
      const Value* id = v->find("_id");
      if (id == nullptr) {
        bad_record(sp, describe_cluster_time(sp.snapshot_start), "a document without _id", *doc,
                   dead_letter_reason::kMissingId);
        continue;
      }
      cdc::ChangeEvent e;
      e.op = cdc::ChangeOp::kRead;
      e.key = Value::object({{"_id", *id}});
      e.after = std::move(v).value();
      e.source.connector = "mongodb";
      e.source.database = sp.split.database;
      e.source.collection = sp.split.collection;
      e.source.position = describe_cluster_time(sp.snapshot_start);
      e.source.ts_ms = ts_ms;
      e.source.snapshot = true;
      sp.output->collect(std::move(e), ts_ms);
      ++n;
    }
    metrics_->events.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    metrics_->snapshot_reads.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    if (n < static_cast<size_t>(s_.batch_size)) {
      mongodb::DriverError e;
      if (sp.scan->error(e)) {
        fail(fmt::format("the snapshot scan of '{}' failed: {} (code {})", coll_name(sp), e.message, e.code));
      }
      sp.scan.reset();
      sp.split.overlap_until = cluster_time_or_fail(sp);
      sp.split.snapshot_pending = false;
      sp.split.snapshot_last_id.clear();
      spdlog::info("{}: snapshot of '{}' done; stream events up to {} are marked as overlapping it", name_,
                   coll_name(sp), describe_cluster_time(sp.split.overlap_until));
    }
    return std::max<size_t>(n, 1);  // a finished scan counts as progress: stream next
  }

  // The scan's position moves past `doc` whether it is emitted or goes to the dead-letter file (as the stream's
  // token does): the copy of {"_id": ...} a checkpoint stores.
  static void remember_scan_position(Split& sp, const bson_t& doc) {
    bson_iter_t it;
    if (!bson_iter_init_find(&it, &doc, "_id")) return;
    bson_t id = BSON_INITIALIZER;
    bson_append_iter(&id, "_id", 3, &it);
    sp.split.snapshot_last_id.assign(reinterpret_cast<const char*>(bson_get_data(&id)), id.len);
    bson_destroy(&id);
  }

  void open_stream(Split& sp) {
    BsonPtr opts(bson_new());
    if (s_.update_lookup) BSON_APPEND_UTF8(opts.get(), "fullDocument", "updateLookup");
    if (s_.pre_images) BSON_APPEND_UTF8(opts.get(), "fullDocumentBeforeChange", "whenAvailable");
    BSON_APPEND_INT64(opts.get(), "maxAwaitTimeMS", s_.max_await_ms);
    BSON_APPEND_INT32(opts.get(), "batchSize", s_.batch_size);
    if (!sp.split.resume_token.empty()) {
      bson_t token;
      if (!bson_init_static(&token, reinterpret_cast<const uint8_t*>(sp.split.resume_token.data()),
                            sp.split.resume_token.size())) {
        fail(fmt::format("the stored resume token of '{}' is not BSON", coll_name(sp)));
      }
      BSON_APPEND_DOCUMENT(opts.get(), "resumeAfter", &token);
    } else if (sp.split.start_at != 0) {
      const auto t = static_cast<uint64_t>(sp.split.start_at);
      BSON_APPEND_TIMESTAMP(opts.get(), "startAtOperationTime", static_cast<uint32_t>(t >> 32),
                            static_cast<uint32_t>(t));
    }
    sp.stream = driver_->watch(sp.split.database, sp.split.collection, *opts);
  }

  size_t poll_stream(Split& sp) {
    if (!sp.stream) open_stream(sp);
    size_t n = 0;
    while (n < static_cast<size_t>(s_.batch_size) && !sp.finished && !sp.split.snapshot_pending) {
      const bson_t* doc = sp.stream->next();
      if (doc == nullptr) break;
      ++n;
      handle_change(sp, *doc);
    }
    if (sp.finished || sp.split.snapshot_pending) return std::max<size_t>(n, 1);
    mongodb::DriverError e;
    if (sp.stream->error(e)) {
      handle_stream_error(sp, e);
      return 1;
    }
    if (n == 0) {
      // An empty batch: the server has nothing newer for this stream, so the split is caught up now (the source
      // lag is measured against the server's position, not the age of the last change).
      metrics_->record_caught_up(sp.split.split_id(), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          std::chrono::system_clock::now().time_since_epoch())
                                                          .count());
      // Adopt the server's post-batch resume token (real servers advance it while idle).
      const bson_t* token = sp.stream->resume_token();
      if (token != nullptr && token->len > 5) {
        std::string bytes(reinterpret_cast<const char*>(bson_get_data(token)), token->len);
        if (bytes != sp.split.resume_token) sp.split.resume_token = std::move(bytes);
      }
    }
    return n;
  }

  void handle_change(Split& sp, const bson_t& doc) {
    Result<mongodb::MappedChange> m = mongodb::map_change_document(doc, sp.split, s_.value_options);
    // The resume token moves past this change whatever happens to it (bson_copy semantics: our own bytes).
    bson_iter_t it;
    if (bson_iter_init_find(&it, &doc, "_id") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
      uint32_t len = 0;
      const uint8_t* data = nullptr;
      bson_iter_document(&it, &len, &data);
      sp.split.resume_token.assign(reinterpret_cast<const char*>(data), len);
    }
    if (!m.ok()) {
      bad_record(sp, mongodb::bson_to_canonical_json(doc), m.error().message(), doc);
      return;
    }
    if (m->cluster_time != 0) sp.split.token_time_ms = cluster_time_ms(m->cluster_time);
    switch (m->kind) {
      case mongodb::MappedChange::Kind::kSkip:
        metrics_->ddl_events.fetch_add(1, std::memory_order_relaxed);
        return;
      case mongodb::MappedChange::Kind::kEndOfStream:
        metrics_->ddl_events.fetch_add(1, std::memory_order_relaxed);
        if (s_.on_drop == MongoOnDrop::kFail) {
          // A restart from the checkpoint reads the same end of the stream again.
          fail_for_good(
              fmt::format("collection '{}' ended its change stream ({}). The source is configured with on-drop: fail; "
                          "re-create the collection and restart the job without its checkpoint, or set "
                          "on_drop(MongoOnDrop::kEndSplit) to let the job go on without it",
                          coll_name(sp), m->what),
              "the collection was dropped or renamed (on-drop: fail)");
        }
        spdlog::warn("{}: collection '{}' ended its change stream ({}): its split ends (on-drop: end-split)", name_,
                     coll_name(sp), m->what);
        sp.finished = true;
        sp.stream.reset();
        if (out_ != nullptr) out_->release_output_for_split(sp.split.split_id());
        return;
      case mongodb::MappedChange::Kind::kEvent:
        break;
    }
    cdc::ChangeEvent& e = m->event;
    if (sp.split.resnapshot) e.source.snapshot = e.source.snapshot || m->cluster_time <= sp.split.overlap_until;
    metrics_->record_position(sp.split.split_id(), e.source.position, e.source.ts_ms);
    metrics_->events.fetch_add(1, std::memory_order_relaxed);
    const int64_t ts = e.source.ts_ms;
    sp.output->collect(std::move(e), ts > 0 ? ts : kNoTimestamp);
  }

  void handle_stream_error(Split& sp, const mongodb::DriverError& e) {
    sp.stream.reset();
    if (mongodb::is_history_lost(e.code)) {
      metrics_->history_lost.fetch_add(1, std::memory_order_relaxed);
      const std::string token =
          sp.split.resume_token.empty()
              ? (sp.split.start_at != 0 ? "start time " + describe_cluster_time(sp.split.start_at)
                                        : std::string("no token"))
              : mongodb::bson_to_canonical_json(reinterpret_cast<const uint8_t*>(sp.split.resume_token.data()),
                                                sp.split.resume_token.size());
      const int64_t when = sp.split.token_time_ms != 0 ? sp.split.token_time_ms : cluster_time_ms(sp.split.start_at);
      if (s_.on_history_lost == MongoOnHistoryLost::kFail) {
        fail_for_good(
            fmt::format(
                "the change stream history of collection '{}' is lost (server error {}: {}): the stored position {} "
                "(cluster time {}) is no longer in the oplog. Remedy: restart the job without its checkpoint with "
                "start "
                "mode 'initial' to take a new snapshot, or set on_history_lost(MongoOnHistoryLost::kResnapshot); to "
                "prevent it, size the oplog (replSetResizeOplog / oplogMinRetentionHours) to cover the longest outage "
                "plus the checkpoint interval",
                coll_name(sp), e.code, e.message, token, iso_time(when)),
            "the checkpoint's position is no longer in the oplog (on-history-lost: fail)");
      }
      spdlog::warn(
          "{}: the change stream history of '{}' is lost (server error {}: {}; position {} at {}): "
          "re-snapshotting the collection (on-history-lost: resnapshot)",
          name_, coll_name(sp), e.code, e.message, token, iso_time(when));
      metrics_->resnapshots.fetch_add(1, std::memory_order_relaxed);
      sp.split.snapshot_pending = true;
      sp.split.resnapshot = true;
      sp.split.snapshot_last_id.clear();
      sp.split.resume_token.clear();
      sp.split.token_time_ms = 0;
      return;
    }
    // A socket error or a failed server selection: most often a server that stopped answering (the liveness
    // timeout), which the driver's own message does not say.
    const bool unreachable = e.domain == MONGOC_ERROR_STREAM || e.domain == MONGOC_ERROR_SERVER_SELECTION;
    if (std::string reason = non_recoverable_driver_error(e); !reason.empty()) {
      fail_for_good(fmt::format("the change stream of collection '{}' failed (error {}, domain {}): {}", coll_name(sp),
                                e.code, e.domain, e.message),
                    reason);
    }
    fail(fmt::format("the change stream of collection '{}' failed (error {}, domain {}): {}{}", coll_name(sp), e.code,
                     e.domain, e.message,
                     unreachable ? fmt::format("; the server did not answer within the socket timeout ({} ms unless "
                                               "the URI sets socketTimeoutMS) or cannot be reached",
                                               s_.socket_timeout_ms)
                                 : std::string()));
  }

  void bad_record(Split& sp, const std::string& position, const std::string& reason, const bson_t& doc,
                  std::string_view reason_code = dead_letter_reason::kUndecodable) {
    if (s_.bad_record_policy == BadRecordPolicy::kFail || !dead_letter_) {
      fail(fmt::format(
          "bad change in collection '{}' at position {}: {}. Divert such records with "
          "on_bad_record(BadRecordPolicy::kDeadLetter, path) (in a pipeline file: set pipeline.dead-letter)",
          coll_name(sp), position, reason));
    }
    Value entry = Value::object({{"source", Value("mongodb")},
                                 {"db", Value(sp.split.database)},
                                 {"collection", Value(sp.split.collection)},
                                 {"position", Value(position)},
                                 {"reason", Value(reason_code)},
                                 {"error", Value(reason)},
                                 {"record", Value(mongodb::bson_to_canonical_json(doc))}});
    dead_letter_->append(entry).value_or_throw();
    unsynced_dead_letters_ = true;
    metrics_->bad_records.fetch_add(1, std::memory_order_relaxed);
  }

  SourceReaderContext& ctx_;
  detail::MongoCdcSourceSettings s_;
  std::unique_ptr<mongodb::MongoDriver> driver_;
  std::shared_ptr<MongoCdcSourceMetrics> metrics_;
  std::shared_ptr<DeadLetterFile> dead_letter_;
  std::string name_;
  std::unique_ptr<MongoConnectionProbe> probe_;  // null with a driver other than libmongoc's
  std::vector<std::unique_ptr<Split>> splits_;
  size_t next_ = 0;
  bool no_more_splits_ = false;
  bool unsynced_dead_letters_ = false;
  ReaderOutput<cdc::ChangeEvent>* out_ = nullptr;
};

}  // namespace

std::unique_ptr<SourceReader<cdc::ChangeEvent, MongoCollectionSplit>> make_mongo_cdc_reader(
    SourceReaderContext& ctx, const detail::MongoCdcSourceSettings& settings,
    std::unique_ptr<mongodb::MongoDriver> driver, std::shared_ptr<MongoCdcSourceMetrics> metrics,
    std::shared_ptr<DeadLetterFile> dead_letter) {
  return std::make_unique<MongoCdcReader>(ctx, settings, std::move(driver), std::move(metrics), std::move(dead_letter));
}

}  // namespace mongodb_cdc_internal
}  // namespace sluice
