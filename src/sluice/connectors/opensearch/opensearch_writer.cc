// The OpenSearch sink's sending side: BulkSender (one request to completion, with retries) and
// OpenSearchWriterCore (the open request, the queue of full ones and the I/O thread). See opensearch_sink.h.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <thread>

#include "sluice/connectors/opensearch/opensearch_sink.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/non_recoverable.h"

namespace sluice::opensearch {

namespace {

std::string head(std::string_view s, size_t n = 300) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + "...";
}

void add(std::atomic<int64_t>* counter, int64_t n) {
  if (counter != nullptr) counter->fetch_add(n, std::memory_order_relaxed);
}

// What a failed item reports: its metadata line read back (index, id, version) and its document line.
FailedItem make_failed(const BulkBatch& batch, const BulkItemMeta& meta, const BulkItemResult& result) {
  FailedItem f;
  f.action = std::string(bulk_op_name(meta.op));
  f.status = result.status;
  f.error = result.error.empty() ? fmt::format("HTTP status {}", result.status) : result.error;
  f.position = meta.position;
  const std::string_view lines = std::string_view(batch.body).substr(meta.begin, meta.end - meta.begin);
  const size_t nl = lines.find('\n');
  const std::string_view meta_line = lines.substr(0, nl);
  if (nl != std::string_view::npos && nl + 1 < lines.size()) {
    std::string_view doc = lines.substr(nl + 1);
    if (!doc.empty() && doc.back() == '\n') doc.remove_suffix(1);
    f.document = std::string(doc);
  }
  Result<Value> parsed = Value::from_json(meta_line);
  if (parsed.ok() && parsed->is_object() && parsed->as_object().size() == 1) {
    const Value& inner = parsed->as_object().begin()->second;
    if (const Value* v = inner.find("_index"); v != nullptr && v->is_string()) f.index = std::string(v->as_string());
    if (const Value* v = inner.find("_id"); v != nullptr && v->is_string()) f.id = std::string(v->as_string());
    if (const Value* v = inner.find("version"); v != nullptr && v->is_int64()) f.version = v->as_int64();
  }
  return f;
}

}  // namespace

BulkSender::Outcome BulkSender::send(const BulkBatch& batch) {
  Outcome out;
  if (batch.empty()) return out;
  Backoff backoff(backoff_, clock_);
  std::vector<uint32_t> pending(batch.items.size());
  for (size_t i = 0; i < pending.size(); ++i)
    pending[i] = static_cast<uint32_t>(i);
  std::string partial;  // the body of a per-item resend
  std::string last_error;
  OpenSearchSinkStats* st = stats_;
  while (true) {
    std::string_view body = batch.body;
    if (pending.size() != batch.items.size()) {
      partial.clear();
      for (uint32_t k : pending) {
        const BulkItemMeta& m = batch.items[k];
        partial.append(batch.body, m.begin, m.end - m.begin);
      }
      body = partial;
    }
    add(st ? &st->requests : nullptr, 1);
    add(st ? &st->bytes_sent : nullptr, static_cast<int64_t>(body.size()));
    HttpResult r = transport_.post_bulk(body);
    if (r.network_error && r.permanent) {
      // A certificate the sink does not trust, a CA file it cannot read: the same after any retry or restart.
      out.error = mark_non_recoverable(
          Error(ErrorCode::kConnector, fmt::format("bulk request of {} actions failed: {}", pending.size(), r.error)),
          "the sink's TLS settings or URL do not fit the cluster (check url, ca-file and the server's certificate)");
      return out;
    }
    if (r.network_error) {
      last_error = "network error: " + r.error;
    } else if (is_retryable_status(r.status)) {
      last_error = fmt::format("HTTP {}: {}", r.status, head(r.body));
    } else if (r.status < 200 || r.status > 299) {
      out.error =
          Error(ErrorCode::kConnector,
                fmt::format("bulk request of {} actions failed with HTTP {}{}: {}", pending.size(), r.status,
                            r.status == 413 ? " (request too large: lower the batch byte limit)" : "", head(r.body)));
      // Bad credentials or missing privileges: the same request fails the same way after any restart.
      if (r.status == 401 || r.status == 403) {
        out.error =
            mark_non_recoverable(*out.error, r.status == 401 ? "the cluster refused the sink's credentials"
                                                             : "the sink's user lacks a privilege on the index");
      }
      return out;
    } else {
      Result<BulkResponse> resp = parse_bulk_response(r.body);
      if (!resp.ok()) {
        out.error = resp.error();
        return out;
      }
      if (!resp->errors && resp->items.empty()) {
        out.acknowledged += static_cast<int64_t>(pending.size());
        return out;
      }
      if (resp->items.size() != pending.size()) {
        out.error = Error(ErrorCode::kConnector, fmt::format("_bulk response has {} items for {} actions: {}",
                                                             resp->items.size(), pending.size(), head(r.body)));
        return out;
      }
      std::vector<uint32_t> again;
      for (size_t k = 0; k < pending.size(); ++k) {
        const BulkItemMeta& m = batch.items[pending[k]];
        const BulkItemResult& item = resp->items[k];
        switch (classify_item(item, m.op, m.versioned)) {
          case ItemOutcome::kSuccess:
            ++out.acknowledged;
            break;
          case ItemOutcome::kVersionConflict:
            ++out.acknowledged;
            ++out.version_conflicts;
            break;
          case ItemOutcome::kRetry:
            if (again.empty()) last_error = make_failed(batch, m, item).describe();
            again.push_back(pending[k]);
            break;
          case ItemOutcome::kFailed:
            out.failed.push_back(make_failed(batch, m, item));
            break;
        }
      }
      if (again.empty()) return out;
      add(st ? &st->retried_items : nullptr, static_cast<int64_t>(again.size()));
      last_error = fmt::format("{} of {} items to retry, the first: {}", again.size(), pending.size(), last_error);
      pending = std::move(again);
    }
    const std::optional<TimestampMs> at = backoff.next_attempt();
    if (!at) {
      out.error = Error(ErrorCode::kConnector,
                        fmt::format("bulk request gave up after {} retries: {}", backoff.retries(), last_error));
      return out;
    }
    add(st ? &st->retries : nullptr, 1);
    const int64_t delay = std::max<int64_t>(0, *at - clock_.now_ms());
    spdlog::warn("OpenSearch sink: retry {} of {} in {} ms: {}", backoff.retries(), backoff_.max_retries, delay,
                 last_error);
    if (!sleep_(delay)) {
      out.abandoned = true;
      out.error = Error(ErrorCode::kCancelled, "the writer was closed during a retry");
      return out;
    }
  }
}

// ---- OpenSearchWriterCore ----

struct OpenSearchWriterCore::State {
  State(const OpenSearchSinkOptions& o, std::unique_ptr<BulkTransport> t, const Clock& c,
        std::shared_ptr<DeadLetterFile> dl, std::shared_ptr<OpenSearchSinkStats> s, std::string d)
      : options(o),
        transport(std::move(t)),
        clock(c),
        dead_letter(std::move(dl)),
        stats(std::move(s)),
        describe(std::move(d)),
        lease(current_task_lease()) {}

  OpenSearchSinkOptions options;
  std::unique_ptr<BulkTransport> transport;
  const Clock& clock;
  std::shared_ptr<DeadLetterFile> dead_letter;
  std::shared_ptr<OpenSearchSinkStats> stats;
  std::string describe;
  // The task's TaskManager lease (cluster mode; it outlives the task, hence this writer), or null: a request is
  // not sent once it lapsed, as the task is stale then (core/task_lease.h).
  const TaskLease* lease;

  std::mutex mu;
  std::condition_variable io_cv;    // wakes the I/O thread: a full request, closing
  std::condition_variable task_cv;  // wakes the task thread: a request done, an error
  BulkBatch open;                   // being filled by the task thread
  std::deque<BulkBatch> queue;      // full requests, oldest first
  bool sending = false;             // the I/O thread holds a request
  bool closing = false;
  bool closed = false;
  bool unsynced_dead_letters = false;
  bool logged_dead_letter = false;
  std::optional<Error> error;  // the first failure; the I/O thread stops sending after it
  std::thread io;

  void throw_if_error_locked() const {
    if (error) throw SluiceException(*error);
  }

  void fail_locked(Error e) {
    if (!error) error = std::move(e);
    queue.clear();
    task_cv.notify_all();
  }

  // Moves the open request to the queue (the caller holds mu).
  void seal_locked() {
    if (open.empty()) return;
    queue.push_back(std::move(open));
    open = BulkBatch{};
    io_cv.notify_one();
  }

  // Handles a sent request's outcome: counters, dead letters or the failure. I/O thread, without mu.
  void settle(BulkSender::Outcome& o) {
    if (o.abandoned) return;
    std::unique_lock lock(mu);
    if (o.error) {
      fail_locked(o.error->with_context(describe));
      return;
    }
    stats->acknowledged.fetch_add(o.acknowledged, std::memory_order_relaxed);
    stats->version_conflicts.fetch_add(o.version_conflicts, std::memory_order_relaxed);
    if (o.failed.empty()) return;
    if (options.on_failed_item == BadRecordPolicy::kFail) {
      fail_locked(Error(ErrorCode::kConnector,
                        fmt::format("{}: {} action(s) failed (on_failed_item is fail; set it to dead-letter to divert "
                                    "them), the first: {}",
                                    describe, o.failed.size(), o.failed.front().describe())));
      return;
    }
    lock.unlock();
    for (const FailedItem& f : o.failed) {
      Status st = dead_letter->append(f.to_dead_letter());
      if (!st.ok()) {
        lock.lock();
        fail_locked(st.error().with_context(describe));
        return;
      }
      stats->dead_letters.fetch_add(1, std::memory_order_relaxed);
    }
    lock.lock();
    unsynced_dead_letters = true;
    if (!logged_dead_letter) {
      logged_dead_letter = true;
      spdlog::warn("{}: failed action(s) written to the dead-letter file {}; the first: {}", describe,
                   dead_letter->path(), o.failed.front().describe());
    }
  }

  void run() {
    BulkSender sender(
        *transport, options.backoff, clock,
        [this](int64_t delay_ms) {
          std::unique_lock lock(mu);
          return !io_cv.wait_for(lock, std::chrono::milliseconds(delay_ms), [this] { return closing; });
        },
        stats.get());
    const int64_t interval_ns = options.flush_interval.count() * 1'000'000;
    std::unique_lock lock(mu);
    while (!closing) {
      if (error) {
        io_cv.wait(lock);
        continue;
      }
      if (!queue.empty() && lease != nullptr && lease->lapsed()) {
        fail_locked(Error(ErrorCode::kRuntime,
                          describe + ": not sending a bulk request: the task is stale (its TaskManager's lease on "
                                     "the JobManager lapsed; the JobManager may have declared it lost)"));
        continue;
      }
      if (!queue.empty()) {
        BulkBatch batch = std::move(queue.front());
        queue.pop_front();
        sending = true;
        lock.unlock();
        BulkSender::Outcome o = sender.send(batch);
        settle(o);
        lock.lock();
        sending = false;
        task_cv.notify_all();
        continue;
      }
      if (!open.empty() && interval_ns > 0) {
        const int64_t now = clock.monotonic_ns();
        const int64_t due = open.first_add_ns + interval_ns;
        if (now >= due) {
          seal_locked();
          continue;
        }
        io_cv.wait_for(lock, std::chrono::nanoseconds(due - now));
        continue;
      }
      io_cv.wait(lock);
    }
  }
};

OpenSearchWriterCore::OpenSearchWriterCore(const OpenSearchSinkOptions& options,
                                           std::unique_ptr<BulkTransport> transport, const Clock& clock,
                                           std::shared_ptr<DeadLetterFile> dead_letter,
                                           std::shared_ptr<OpenSearchSinkStats> stats, std::string describe)
    : state_(std::make_unique<State>(options, std::move(transport), clock, std::move(dead_letter),
                                     stats ? std::move(stats) : std::make_shared<OpenSearchSinkStats>(),
                                     std::move(describe))) {
  if (state_->options.on_failed_item == BadRecordPolicy::kDeadLetter && !state_->dead_letter) {
    throw SluiceException(Error(ErrorCode::kConfiguration, state_->describe + ": dead-letter policy without a file"));
  }
  state_->io = std::thread([s = state_.get()] { s->run(); });
}

OpenSearchWriterCore::~OpenSearchWriterCore() {
  close();
}

void OpenSearchWriterCore::add(const BulkAction& action, std::string position) {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  s.throw_if_error_locked();
  if (s.closing) throw SluiceException(Error(ErrorCode::kInternal, s.describe + ": write after close"));
  const bool first = s.open.empty();
  Status st = s.open.add(action, std::move(position));
  if (!st.ok()) throw SluiceException(st.error().with_context(s.describe));
  if (first) {
    s.open.first_add_ns = s.clock.monotonic_ns();
    s.io_cv.notify_one();  // starts the flush-interval timer
  }
  if (static_cast<int64_t>(s.open.items.size()) < s.options.max_batch_actions &&
      static_cast<int64_t>(s.open.body.size()) < s.options.max_batch_bytes) {
    return;
  }
  // Backpressure: wait while max_pending_requests full requests wait or are in flight.
  s.task_cv.wait(lock, [&s] {
    return s.error || s.closing ||
           static_cast<int>(s.queue.size()) + (s.sending ? 1 : 0) < s.options.max_pending_requests;
  });
  s.throw_if_error_locked();
  s.seal_locked();  // (a no-op when the flush-interval timer sealed it meanwhile)
}

void OpenSearchWriterCore::flush() {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  s.throw_if_error_locked();
  s.seal_locked();
  s.task_cv.wait(lock, [&s] { return s.error || s.closing || (s.queue.empty() && !s.sending); });
  s.throw_if_error_locked();
  if (s.closing) throw SluiceException(Error(ErrorCode::kCancelled, s.describe + ": closed during a flush"));
  const bool sync = s.unsynced_dead_letters;
  s.unsynced_dead_letters = false;
  lock.unlock();
  if (sync) {
    Status st = s.dead_letter->sync();
    if (!st.ok()) throw SluiceException(st.error().with_context(s.describe));
  }
}

void OpenSearchWriterCore::close() {
  if (!state_) return;
  State& s = *state_;
  {
    std::lock_guard lock(s.mu);
    if (s.closed) return;
    s.closed = true;
    s.closing = true;
  }
  s.transport->abort();
  s.io_cv.notify_all();
  s.task_cv.notify_all();
  if (s.io.joinable()) s.io.join();
}

}  // namespace sluice::opensearch
