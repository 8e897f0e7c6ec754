// map_external: the C++ API's way to run a function written in TypeScript, JavaScript or Python on a DataStream
// (issue 17; docs/functions.md "From the C++ API"). Each record is turned into a Value by the caller's serializer,
// sent in batches to an out-of-process worker (one per subtask, the protocol of docs/functions.md), and the
// function's result for it is turned back into the output type by the caller's deserializer:
//
//   udf::ExternalFunction fn{.runtime = "node", .module = "/abs/path/score.js", .export_name = "score"};
//   DataStream<Scored> scored = udf::map_external<Scored>(orders, fn,
//       [](const Order& o) { return Value::object({{"id", Value(o.id)}, {"amount", Value(o.amount)}}); },
//       [](const Value& r) { return Scored{std::string(r.find("id")->as_string()), r.find("score")->as_double()}; });
//
// Guarantees as for a pipeline's function: one output per input, in input order per subtask; at most
// `max_in_flight` batches unanswered (then the task waits: backpressure); every batch sent and answered before a
// checkpoint barrier passes and at the end of input (no record is inside a worker at a checkpoint); watermarks
// wait behind the records before them. A function that throws, a worker that dies, hangs (`timeout`) or breaks
// the protocol, and a serializer or deserializer that throws fail the task (the job restarts from its last
// checkpoint under its restart strategy). A record on which the function throws fails the task too (the message
// names the function, the record's position and the stack), or, with `on_error = BadRecordPolicy::kDeadLetter`,
// becomes a dead letter on the side output `dead_letters(fn)` (the record, its position, the error and the stack)
// and the rest go on:
//
//   fn.on_error = BadRecordPolicy::kDeadLetter;
//   auto scored = udf::map_external<Scored>(orders, fn, to_value, from_value,
//                                           [](const Order& o) { return "order " + o.id; });  // the position
//   scored.get_side_output(udf::dead_letters(fn)).sink_to(dead_letter_sink);
//
// Threading: the operator runs on its task thread; the serializers and the position function are called there.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/data_stream.h"
#include "sluice/api/operator.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/udf/function_protocol.h"
#include "sluice/udf/function_worker.h"

namespace sluice::udf {

/// Which function to run and how to batch (the keys of a pipeline's `function:`; docs/functions.md).
struct ExternalFunction {
  std::string runtime = "node";  ///< "node" (TypeScript/JavaScript) or "python"
  /// Path of the module: node: .ts/.mts/.cts/.js/.mjs/.cjs (a TypeScript module needs `project_dir`'s
  /// package.json with esbuild); python: .py. Relative paths are taken from the current directory.
  std::string module;
  std::string export_name;         ///< the exported function
  std::string project_dir;         ///< the npm project (package.json, package-lock.json); default: the module's folder
  int batch_size = 256;            ///< records per batch
  int64_t batch_max_delay_ms = 2;  ///< a batch is sent at the latest this long after its first record
  int max_in_flight = 2;           ///< unanswered batches per subtask
  int64_t timeout_ms = 30'000;     ///< a batch not answered within this fails the task
  int64_t memory_mb = 512;         ///< node: heap limit; python: address-space limit
  /// A record on which the function throws: kFail (the default) fails the task; kDeadLetter emits a dead letter
  /// on the side output dead_letters(*this) and goes on (refused when the job reads no such side output).
  BadRecordPolicy on_error = BadRecordPolicy::kFail;
  /// The id of the dead letters' side output (two map_external calls with dead letters need two ids).
  std::string dead_letter_tag = "map-external-dead-letters";
};

/// The side output of `fn`'s dead letters (on_error = kDeadLetter): one object per record the function threw on,
/// {"function": "<export> (<module>)", "subtask": N, "position": <the position function's text, or null>,
/// "error": <message>, "stack": <the JavaScript/Python stack>, "record": <the Value the function received>}.
inline OutputTag<Value> dead_letters(const ExternalFunction& fn) {
  return OutputTag<Value>(fn.dead_letter_tag);
}

/// The position of a record, named by failures and dead letters (e.g. its source offset or its key).
template <class T>
using ExternalRecordPosition = std::function<std::string(const T&)>;

/// A function prepared to run (the module bundled when it is TypeScript): what each subtask's worker starts with.
struct PreparedExternalFunction {
  ExternalFunction spec;
  std::vector<std::string> argv;  ///< the worker's command
  std::string module_path;        ///< what the worker loads
  std::string display;            ///< "score (/abs/path/score.js)"
};

/// Checks and prepares `fn` (npm ci and esbuild for TypeScript, as `sluice run` does). kConfiguration naming the
/// module when it does not exist, does not compile, or an option is out of range.
[[nodiscard]] Result<PreparedExternalFunction> prepare_external_function(const ExternalFunction& fn);

/// One subtask's worker and batches: records appended to an open batch, batches sent up to `max_in_flight`,
/// results taken in order. Task thread only, except `on_reply`, which the worker's reader thread calls.
class ExternalCall {
 public:
  ExternalCall(PreparedExternalFunction fn, std::string display);
  /// Spawns the worker (kRuntime/kConfiguration when it does not start or load the module).
  Status start(std::function<void()> on_reply);
  /// Appends one record to the open batch (kSerialization when the protocol cannot carry it exactly).
  Status append(const Value& record);
  /// Whether the open batch should go now: it is full or the worker is idle.
  bool should_send() const;
  size_t open_count() const { return frame_.count(); }
  bool idle() const { return in_flight_.empty(); }
  /// Sends the open batch, first waiting (and taking results into `out`) while `max_in_flight` are unanswered.
  void send(std::deque<RecordResult>& out);
  /// Takes every result that arrived, without blocking.
  void poll(std::deque<RecordResult>& out);
  /// Sends the open batch and waits for every answer.
  void flush(std::deque<RecordResult>& out);
  /// Fails (throws) when the oldest batch is past its timeout.
  void check_timeout(std::deque<RecordResult>& out);
  const PreparedExternalFunction& function() const { return fn_; }
  /// The id of the batch being filled.
  int64_t open_id() const { return frame_.id(); }
  /// When the oldest unanswered batch times out (steady clock); nullopt when none is in flight.
  std::optional<std::chrono::steady_clock::time_point> oldest_deadline() const;
  /// Logs the figures that show the batching at work (records, batches, and the operator's `timers`
  /// registered), at close; tests read them.
  void log_figures(uint64_t timers) const;

 private:
  struct InFlight {
    int64_t id;
    size_t count;
    std::chrono::steady_clock::time_point sent;
  };
  void await_oldest(std::deque<RecordResult>& out);
  void take(const std::string& text, std::deque<RecordResult>& out);

  PreparedExternalFunction fn_;
  std::string display_;
  std::unique_ptr<FunctionWorker> worker_;
  BatchFrame frame_;
  int64_t next_id_ = 1;
  std::deque<InFlight> in_flight_;
  uint64_t batches_sent_ = 0;
  uint64_t records_sent_ = 0;
};

/// The operator behind map_external. One per subtask; task thread only.
template <class T, class R>
class ExternalMapOperator final : public OneInputOperator<T>, OutputOf<R> {
 public:
  ExternalMapOperator(PreparedExternalFunction fn, std::function<Value(const T&)> to_value,
                      std::function<R(const Value&)> from_value, ExternalRecordPosition<T> position = {})
      : fn_(std::move(fn)),
        to_value_(std::move(to_value)),
        from_value_(std::move(from_value)),
        position_(std::move(position)) {}

  void open() override {
    if (fn_.spec.on_error == BadRecordPolicy::kDeadLetter) {
      dead_letters_ = this->side_output(fn_.spec.dead_letter_tag);
      if (dead_letters_ == nullptr) {
        // Never a silent skip: dead letters nobody reads would be lost.
        throw OperatorException(this->name(),
                                fmt::format("function {}: on_error is dead-letter but the job reads no side output "
                                            "'{}' (get_side_output(udf::dead_letters(fn)))",
                                            fn_.display, fn_.spec.dead_letter_tag),
                                ErrorCode::kConfiguration);
      }
    }
    alive_ = std::make_shared<std::atomic<bool>>(true);
    call_ = std::make_unique<ExternalCall>(fn_, fmt::format("{} subtask {}", fn_.display, this->ctx_->subtask_index()));
    auto alive = alive_;
    auto posted = posted_;
    TaskServices* services = this->services_;
    Status s = call_->start([this, alive, posted, services] {
      if (posted->exchange(true)) return;  // one mail per burst of replies
      services->post_mail([this, alive, posted] {
        posted->store(false);
        if (alive->load()) call_user_function(this->name(), [&] { on_replies(); });
      });
    });
    if (!s.ok()) throw OperatorException(this->name(), s.error().message(), s.error().code());
  }

  void process_element(T&& record, TimestampMs ts) override {
    call_user_function(this->name(), [&] {
      Value v = to_value_(record);
      if (call_->open_count() == 0) opened_ms_ = this->services_->processing_clock().now_ms();
      if (Status s = call_->append(v); !s.ok()) throw SluiceException(s.error());
      Entry e{ts, false};
      // Kept only for what a failure names (bounded: max_in_flight batches of batch_size records).
      if (position_) e.position = position_(record);
      if (dead_letters_ != nullptr) e.record = std::move(v);
      pending_.push_back(std::move(e));
      if (call_->should_send()) {
        call_->send(results_);
      } else if (!delay_armed_) {
        arm_delay_timer(opened_ms_ + fn_.spec.batch_max_delay_ms);
      }
      drain();
      arm_timeout_timer();
    });
  }
  void process_watermark(TimestampMs watermark) override {
    if (pending_.empty()) {
      StreamOperatorBase::process_watermark(watermark);
      return;
    }
    pending_.push_back(Entry{watermark, true});
  }
  void snapshot_state(int64_t /*checkpoint_id*/) override { flush(); }
  void end_input() override { flush(); }
  void finish() override { flush(); }
  void close() override {
    if (alive_) alive_->store(false);
    if (call_) call_->log_figures(timers_);
    call_.reset();  // kills the worker and joins its threads
  }

 private:
  struct Entry {
    TimestampMs ts;
    bool watermark;
    std::string position;  // when a position function is given
    Value record;          // under kDeadLetter: what the function received
  };

  void flush() {
    call_user_function(this->name(), [&] {
      call_->flush(results_);
      drain();
    });
  }
  void on_replies() {
    call_->poll(results_);
    if (call_->idle() && call_->open_count() > 0) call_->send(results_);
    drain();
    arm_timeout_timer();
  }
  // At most one batch-max-delay timer, and only for a batch that stays open: at a low rate most batches go to an
  // idle worker at once and need none (a timer per batch kept tens of thousands pending).
  void arm_delay_timer(TimestampMs at) {
    delay_armed_ = true;
    ++timers_;
    auto alive = alive_;
    this->services_->register_processing_timer(at, [this, alive](TimestampMs) {
      if (!alive->load()) return;
      delay_armed_ = false;
      if (call_->open_count() == 0) return;
      const TimestampMs due = opened_ms_ + fn_.spec.batch_max_delay_ms;
      if (this->services_->processing_clock().now_ms() < due) {
        arm_delay_timer(due);  // the batch it was armed for went out; the open one is younger
        return;
      }
      call_user_function(this->name(), [&] {
        call_->send(results_);
        drain();
        arm_timeout_timer();
      });
    });
  }
  // At most one timeout timer, armed for the oldest unanswered batch: a batch still unanswered after `timeout`
  // fails the task even when no record arrives to notice it. Later batches' deadlines are not earlier, so when it
  // fires it fails the task or re-arms for the batch that is then the oldest.
  void arm_timeout_timer() {
    if (timeout_armed_) return;
    const std::optional<std::chrono::steady_clock::time_point> deadline = call_->oldest_deadline();
    if (!deadline) return;
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now()).count();
    timeout_armed_ = true;
    ++timers_;
    auto alive = alive_;
    this->services_->register_processing_timer(
        this->services_->processing_clock().now_ms() + std::max<int64_t>(0, left) + 1, [this, alive](TimestampMs) {
          if (!alive->load()) return;
          timeout_armed_ = false;
          call_user_function(this->name(), [&] {
            call_->check_timeout(results_);  // past its deadline: fails now
            if (call_->idle() && call_->open_count() > 0) call_->send(results_);
            drain();
            arm_timeout_timer();
          });
        });
  }
  // Emits the results at the head of the queue, in input order, and the watermarks that waited behind them.
  void drain() {
    while (!pending_.empty()) {
      Entry& e = pending_.front();
      if (e.watermark) {
        const TimestampMs wm = e.ts;
        pending_.pop_front();
        StreamOperatorBase::process_watermark(wm);
        continue;
      }
      if (results_.empty()) return;
      RecordResult r = std::move(results_.front());
      results_.pop_front();
      Entry entry = std::move(e);
      pending_.pop_front();
      if (r.failed) {
        if (dead_letters_ != nullptr) {
          emit_dead_letter(std::move(entry), std::move(r));
          continue;
        }
        const std::string at = position_ ? fmt::format(" on the record at {}", entry.position) : std::string();
        throw SluiceException(Error(ErrorCode::kRuntime, fmt::format("function {} threw{}: {}", fn_.display, at,
                                                                     r.stack.empty() ? r.message : r.stack)));
      }
      this->metrics_.records_out.inc();
      this->typed(this->main_output_)->collect(from_value_(r.ok), entry.ts);
    }
  }

  void emit_dead_letter(Entry entry, RecordResult r) {
    Value letter = Value::object({{"function", Value(fn_.display)},
                                  {"subtask", Value(int64_t{this->ctx_->subtask_index()})},
                                  {"position", position_ ? Value(entry.position) : Value()},
                                  {"error", Value(r.message)},
                                  {"stack", Value(r.stack)},
                                  {"record", std::move(entry.record)}});
    static_cast<Output<Value>*>(dead_letters_)->collect(std::move(letter), entry.ts);
  }

  PreparedExternalFunction fn_;
  std::function<Value(const T&)> to_value_;
  std::function<R(const Value&)> from_value_;
  ExternalRecordPosition<T> position_;
  OutputBase* dead_letters_ = nullptr;
  std::unique_ptr<ExternalCall> call_;
  std::deque<Entry> pending_;
  std::deque<RecordResult> results_;
  std::shared_ptr<std::atomic<bool>> alive_;
  std::shared_ptr<std::atomic<bool>> posted_ = std::make_shared<std::atomic<bool>>(false);
  TimestampMs opened_ms_ = 0;   // processing time the open batch got its first record
  bool delay_armed_ = false;    // a batch-max-delay timer is pending
  bool timeout_armed_ = false;  // a timeout timer is pending
  uint64_t timers_ = 0;         // timers registered, for the figures at close
};

namespace detail {
template <class T>
struct ExternalOperatorAdder : DataStream<T> {
  explicit ExternalOperatorAdder(const DataStream<T>& s) : DataStream<T>(s) {}
  template <class U, class Make>
  DataStream<U> add(std::string name, Make make) {
    return this->template transform<U>(std::move(name), false, std::move(make));
  }
};
}  // namespace detail

/// Maps each record of `in` through the external function `fn`: `to_value` serializes a record to the Value the
/// function receives (as JSON: objects, arrays, strings, numbers, exact decimals), `from_value` turns the function's
/// result into an R. The function is prepared here (a TypeScript module is bundled), so a module that does not
/// exist or compile throws SluiceException (kConfiguration) while the job is built, not when it runs.
template <class R, class T>
DataStream<R> map_external(const DataStream<T>& in, const ExternalFunction& fn,
                           std::type_identity_t<std::function<Value(const T&)>> to_value,
                           std::type_identity_t<std::function<R(const Value&)>> from_value,
                           std::type_identity_t<ExternalRecordPosition<T>> position,
                           std::string name = "Map External") {
  Result<PreparedExternalFunction> prepared = prepare_external_function(fn);
  if (!prepared.ok()) throw SluiceException(prepared.error());
  PreparedExternalFunction p = std::move(*prepared);
  return detail::ExternalOperatorAdder<T>(in).template add<R>(std::move(name), [p, to_value, from_value, position]() {
    return std::make_unique<ExternalMapOperator<T, R>>(p, to_value, from_value, position);
  });
}

/// map_external without a position function (failures and dead letters name no position).
template <class R, class T>
DataStream<R> map_external(const DataStream<T>& in, const ExternalFunction& fn,
                           std::type_identity_t<std::function<Value(const T&)>> to_value,
                           std::type_identity_t<std::function<R(const Value&)>> from_value,
                           std::string name = "Map External") {
  return map_external<R, T>(in, fn, std::move(to_value), std::move(from_value), ExternalRecordPosition<T>(),
                            std::move(name));
}

}  // namespace sluice::udf
