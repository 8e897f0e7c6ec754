// One file over 800 lines: the transform step's logic, its user-function operator and the builder are private
// to it (anonymous namespace) and form one component; a split would move them into a header only to share them.
//
// The transform step of a pipeline: one change event in, routed domain events out (at most one without a
// function; a function may return a list).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "pipeline_internal.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/opensearch/opensearch_sink.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/pipeline/domain_event.h"
#include "sluice/udf/function_module.h"
#include "sluice/udf/function_protocol.h"
#include "sluice/udf/function_worker.h"

namespace sluice::pipeline::detail {
namespace {

const OutputTag<Value>& dead_letter_tag() {
  static const OutputTag<Value> tag("pipeline-dead-letter");
  return tag;
}

// What applies to one collection, resolved once per collection name and cached per subtask.
struct CollectionPlan {
  const TransformSpec* transform = nullptr;  // the first matching transform, or none
  size_t index = 0;                          // of `transform` in spec.transforms
  uint64_t sinks = 0;
};

// The transform's logic, shared by the plain operator (TransformFunction) and the one that calls functions on
// workers (FunctionTransformOperator): prepare() runs filter and projection, finish() the key and event mapping
// over the prepared change and a function's result. One instance per subtask; task thread only.
class TransformLogic {
 public:
  TransformLogic(std::shared_ptr<const PipelineSpec> spec, std::shared_ptr<PipelineCounters> counters,
                 bool has_dead_letter)
      : spec_(std::move(spec)), counters_(std::move(counters)), has_dead_letter_(has_dead_letter) {}

  const PipelineSpec& spec() const { return *spec_; }
  PipelineCounters& counters() { return *counters_; }

  // Counts the change and finds its plan.
  const CollectionPlan& begin(const cdc::ChangeEvent& change) {
    counters_->changes_in.fetch_add(1, std::memory_order_relaxed);
    if (change.source.ts_ms > 0) {
      counters_->last_source_ts_ms.store(change.source.ts_ms, std::memory_order_relaxed);
    }
    collection_.assign(change.source.database).append(".").append(change.source.collection);
    return plan_for(collection_);
  }

  // An event ready for the sinks: counted, or dropped as unrouted. False when it is not to be emitted.
  bool emit_ready(RoutedEvent& r) {
    if (r.sinks == 0) {
      counters_->unrouted.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    counters_->events_out.fetch_add(1, std::memory_order_relaxed);
    if (const Value* type = r.event.find("type"); type != nullptr && type->is_string()) {
      ++type_counts_[std::string(type->as_string())];
      if (++since_merge_ >= 4096) {
        counters_->add_types(type_counts_);
        since_merge_ = 0;
      }
    }
    return true;
  }

  void close() { counters_->add_types(type_counts_); }

  // prepare(), with a value too large to build turned into a record error (dead letter or failure per policy):
  // one record's size must not end the process or fail a job that has a dead-letter sink.
  Result<std::optional<Value>> prepare_guarded(const cdc::ChangeEvent& change, const CollectionPlan& plan) {
    try {
      return prepare(change, plan);
    } catch (const std::bad_alloc&) {
      return Error(ErrorCode::kRuntime, "out of memory while transforming the change (a value too large)");
    } catch (const std::length_error& e) {
      return Error(ErrorCode::kRuntime, fmt::format("a value is too large to represent: {}", e.what()));
    }
  }
  Result<std::optional<RoutedEvent>> finish_guarded(const cdc::ChangeEvent& change, const CollectionPlan& plan,
                                                    Value input, const Value* result, size_t index) {
    try {
      return finish(change, plan, std::move(input), result, index);
    } catch (const std::bad_alloc&) {
      return Error(ErrorCode::kRuntime, "out of memory while transforming the change (a value too large)");
    } catch (const std::length_error& e) {
      return Error(ErrorCode::kRuntime, fmt::format("a value is too large to represent: {}", e.what()));
    }
  }

  // A change the transform cannot turn into an event: a dead-letter entry to emit, or the job fails naming it.
  // `extra` fields (the function and the JavaScript stack) go into the entry.
  Value bad_record(const cdc::ChangeEvent& change, const std::string& message, std::string_view stage,
                   std::vector<std::pair<std::string, Value>> extra = {}) {
    const std::string collection = fmt::format("{}.{}", change.source.database, change.source.collection);
    const std::string where =
        fmt::format("{} {} at position {}{}", change.source.connector, collection, change.source.position,
                    change.source.sequence != 0 ? fmt::format(" (sequence {})", change.source.sequence) : "");
    if (!has_dead_letter_) {
      std::string record = change.to_value().to_json();
      if (record.size() > 512) record = record.substr(0, 512) + "...";
      throw SluiceException(
          Error(ErrorCode::kRuntime,
                fmt::format("pipeline '{}': the change of {} could not be transformed: {}. Record: {}. Remedy: fix the "
                            "transform, or set pipeline.dead-letter to divert such records and go on",
                            spec_->pipeline.name, where, message, record)));
    }
    counters_->dead_letters.fetch_add(1, std::memory_order_relaxed);
    const bool function = stage == "function";
    if (function) counters_->function_dead_letters.fetch_add(1, std::memory_order_relaxed);
    Value entry =
        Value::object({{"stage", Value(std::string(stage))},
                       {"reason", Value(function ? dead_letter_reason::kFunction : dead_letter_reason::kExpression)},
                       {"pipeline", Value(spec_->pipeline.name)},
                       {"connector", Value(change.source.connector)},
                       {"collection", Value(collection)},
                       {"position", Value(change.source.position)},
                       {"sequence", Value(change.source.sequence)},
                       {"error", Value(message)}});
    for (auto& [k, v] : extra)
      entry.set(k, std::move(v));
    entry.set("record", change.to_value());
    return entry;
  }

  Result<std::optional<Value>> prepare(const cdc::ChangeEvent& change, const CollectionPlan& plan) {
    const TransformSpec* t = plan.transform;
    if (t == nullptr) {
      // The default mapping evaluates no expression: finish() reads only the row image that becomes the
      // payload, so the input holds just that one (the whole change as a Value was most of the transform's cost).
      const bool is_delete = change.op == cdc::ChangeOp::kDelete;
      Value input = Value::object();
      input.set(is_delete ? "before" : "after", is_delete ? change.before : change.after);
      return std::optional<Value>(std::move(input));
    }
    Value input = change.to_value();
    if (t->filter) {
      SLUICE_ASSIGN_OR_RETURN(Value keep, eval(*t->filter, input, "filter"));
      if (FilterStats* fs = counters_->filter(plan.index)) {
        if (fs->seen.fetch_add(1, std::memory_order_relaxed) == 0) fs->sample_once(input);
        // Each field is looked for only until one record has it: the cost ends with the first sighting.
        for (size_t i = 0; i < fs->paths.size(); ++i) {
          if (fs->present[i].load(std::memory_order_relaxed) == 0 && t->filter->has_field(i, input)) {
            fs->present[i].fetch_add(1, std::memory_order_relaxed);
          }
        }
        if (keep.is_bool() && keep.as_bool()) fs->kept.fetch_add(1, std::memory_order_relaxed);
      }
      if (!keep.is_bool() || !keep.as_bool()) {
        if (!keep.is_bool() && !keep.is_null()) {
          return Error(ErrorCode::kRuntime,
                       fmt::format("filter '{}' gave {}, not a boolean", t->filter->text(), keep.to_json()));
        }
        counters_->filtered.fetch_add(1, std::memory_order_relaxed);
        return std::optional<Value>();
      }
    }
    if (t->projection) {
      // The projection reshapes the row images: `after`, and `before` when the source knows it.
      Result<Value> after = t->projection->evaluate(input);
      if (!after.ok()) return after.error().with_context("projection");
      Value before_input = input;
      Result<Value> before = Value();
      if (const Value* b = input.find("before"); b != nullptr && b->is_object()) {
        before_input.set("after", *b);
        before = t->projection->evaluate(before_input);
        if (!before.ok()) return before.error().with_context("projection of the before image");
      }
      if (const Value* a = input.find("after"); a != nullptr && a->is_object()) {
        input.set("after", std::move(*after));
      }
      input.set("before", std::move(*before));
    }
    return std::optional<Value>(std::move(input));
  }

  // `input`: what prepare() gave (without a transform, only the row image of the payload).
  // `result`: the function's result for this change (one object of what it returned, the `index`th), or nullptr.
  Result<std::optional<RoutedEvent>> finish(const cdc::ChangeEvent& change, const CollectionPlan& plan, Value input,
                                            const Value* result, size_t index) {
    const TransformSpec* t = plan.transform;
    const bool is_delete = change.op == cdc::ChangeOp::kDelete;
    if (result != nullptr) input.set("result", *result);
    Value key;
    if (t != nullptr && t->key) {
      SLUICE_ASSIGN_OR_RETURN(Value k, eval(*t->key, input, "key"));
      key = std::move(k);
    } else {
      key = change.entity_id();
    }
    Value entity = key;
    if (t != nullptr && t->event.entity) {
      SLUICE_ASSIGN_OR_RETURN(Value e, eval(*t->event.entity, input, "event.entity"));
      entity = std::move(e);
    }
    if (entity.is_null()) {
      return Error(ErrorCode::kRuntime,
                   "the entity id is NULL (set the transform's `key` to an expression that "
                   "is never NULL for this collection)");
    }
    std::string type;
    if (t != nullptr && t->event.type) {
      SLUICE_ASSIGN_OR_RETURN(Value ty, eval(*t->event.type, input, "event.type"));
      if (!ty.is_string() || ty.as_string().empty()) {
        return Error(ErrorCode::kRuntime, fmt::format("event.type '{}' gave {}, not a non-empty string",
                                                      t->event.type->text(), ty.to_json()));
      }
      type = std::string(ty.as_string());
    } else {
      type = default_event_type(change);
    }
    Value payload;
    if (t != nullptr && t->event.payload) {
      Result<Value> p = t->event.payload->evaluate(input);
      if (!p.ok()) return p.error().with_context("event.payload");
      payload = std::move(*p);
    } else if (result != nullptr) {
      payload = *result;
    }
    // The row image becomes the payload by a move, after the last expression that could read it.
    const bool payload_is_row = (t == nullptr || !t->event.payload) && result == nullptr;
    int64_t occurred_us = change.source.ts_ms * 1000;
    if (t != nullptr && t->event.occurred_at) {
      SLUICE_ASSIGN_OR_RETURN(Value o, eval(*t->event.occurred_at, input, "event.occurred-at"));
      if (o.is_timestamp()) {
        occurred_us = o.as_timestamp_micros();
      } else if (o.is_int64()) {
        occurred_us = o.as_int64() * 1000;  // ms since epoch
      } else {
        return Error(ErrorCode::kRuntime, fmt::format("event.occurred-at '{}' gave {}, not a timestamp or ms",
                                                      t->event.occurred_at->text(), o.to_json()));
      }
    }
    if (payload_is_row) {
      if (Value* row = input.find(is_delete ? "before" : "after"); row != nullptr) payload = std::move(*row);
    }
    RoutedEvent r;
    r.entity_key = entity.is_string() ? std::string(entity.as_string()) : entity.to_json();
    r.event = make_domain_event(change, entity, type, std::move(payload), occurred_us);
    if (index > 0) {
      // The further events of one change (a function returned a list) get ids of their own, as stable.
      r.event.set("id", Value(event_id(change.source, entity, fmt::format("{}\x1f{}", type, index))));
    }
    r.collection = collection_;
    r.sinks = plan.sinks;
    if (change.source.connector == "postgres" || change.source.connector == "mongodb") {
      Result<int64_t> v = opensearch::change_event_version(change);
      if (v.ok()) r.version = *v;
    }
    return std::optional<RoutedEvent>(std::move(r));
  }

  // The collection of the change passed to begin() last ("database.collection").
  void set_collection(const cdc::ChangeEvent& change) {
    collection_.assign(change.source.database).append(".").append(change.source.collection);
  }

 private:
  const CollectionPlan& plan_for(const std::string& collection) {
    auto it = plans_.find(collection);
    if (it != plans_.end()) return it->second;
    CollectionPlan plan;
    for (size_t i = 0; i < spec_->transforms.size(); ++i) {
      const TransformSpec& t = spec_->transforms[i];
      if (match_collection(t.match, collection)) {
        plan.transform = &t;
        plan.index = i;
        break;
      }
    }
    if (spec_->routes.empty()) {
      plan.sinks = spec_->sinks.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << spec_->sinks.size()) - 1;
    } else {
      for (const RouteSpec& r : spec_->routes) {
        if (!match_collection(r.match, collection)) continue;
        for (size_t i = 0; i < spec_->sinks.size(); ++i) {
          if (spec_->sinks[i].name == r.sink) plan.sinks |= uint64_t{1} << i;
        }
      }
      if (plan.sinks == 0) {
        spdlog::warn(
            "pipeline '{}': no route matches {}: its events are dropped (counted in "
            "sluice_pipeline_unrouted_events_total)",
            spec_->pipeline.name, collection);
      }
    }
    return plans_.emplace(collection, plan).first->second;
  }

  static Result<Value> eval(const Expression& e, const Value& input, std::string_view what) {
    Result<Value> v = e.evaluate(input);
    if (!v.ok()) return v.error().with_context(what);
    return v;
  }

  std::shared_ptr<const PipelineSpec> spec_;
  std::shared_ptr<PipelineCounters> counters_;
  bool has_dead_letter_;
  std::unordered_map<std::string, CollectionPlan> plans_;  // node-based: references stay valid
  std::string collection_;
  std::map<std::string, int64_t> type_counts_;  // merged into counters_ every 4096 events and at close
  int since_merge_ = 0;
};

// The transform of a pipeline without functions: a synchronous ProcessFunction.
class TransformFunction final : public ProcessFunction<cdc::ChangeEvent, RoutedEvent> {
 public:
  explicit TransformFunction(TransformLogic logic) : logic_(std::move(logic)) {}

  void process_element(const cdc::ChangeEvent& change, Context& ctx, Collector<RoutedEvent>& out) override {
    const CollectionPlan& plan = logic_.begin(change);
    Result<std::optional<Value>> input = logic_.prepare_guarded(change, plan);
    if (!input.ok()) {
      ctx.output(dead_letter_tag(), logic_.bad_record(change, input.error().message(), "transform"));
      return;
    }
    if (!input->has_value()) return;
    Result<std::optional<RoutedEvent>> r = logic_.finish_guarded(change, plan, std::move(**input), nullptr, 0);
    if (!r.ok()) {
      ctx.output(dead_letter_tag(), logic_.bad_record(change, r.error().message(), "transform"));
      return;
    }
    if (!r->has_value() || !logic_.emit_ready(**r)) return;
    out.collect(std::move(**r));
  }

  void close() override { logic_.close(); }

 private:
  TransformLogic logic_;
};

// A function resolved for the runner: the spec and the module the worker loads.
struct ResolvedFunction {
  size_t transform = 0;  // index in spec.transforms
  FunctionSpec spec;
  std::string module_path;        // what the worker imports (the esbuild bundle, the .js or the .py itself)
  std::vector<std::string> argv;  // the worker's command
  std::string display;            // "chargeEvent (./domain/charges.ts)"
};

// The transform of a pipeline with functions (docs/functions.md): like TransformFunction, but the changes of a
// transform with a `function` are sent in batches to an out-of-process worker (one per function per subtask),
// and the events are emitted in the order the changes arrived (Flink's AsyncWaitOperator, ordered mode):
//   - a batch is sent when the worker is idle (no batch unanswered), when it holds `batch-size` records, or
//     `batch-max-delay` after its first record, whichever comes first;
//   - at most `max-in-flight` batches per function are unanswered: the next one waits (the task thread blocks,
//     its input stops, backpressure reaches the source), as does a change queued behind too many others;
//   - before a checkpoint barrier passes (snapshot_state) and at the end of input, every batch is sent and
//     answered and its events emitted, so no record is inside a worker at a checkpoint: a restore replays from
//     the source exactly what the checkpoint did not cover (exactly-once holds with exactly-once sinks);
//   - a batch not answered within `timeout`, a worker that dies (crash, kill, out of memory) or breaks the
//     protocol fails the task naming the function, and the job restarts from its last checkpoint.
// Task thread only, except the workers' reader threads, which only post mails.
class FunctionTransformOperator final : public OneInputOperator<cdc::ChangeEvent>, OutputOf<RoutedEvent> {
 public:
  FunctionTransformOperator(TransformLogic logic, std::vector<ResolvedFunction> functions)
      : logic_(std::move(logic)), functions_(std::move(functions)) {}

  void open() override {
    alive_ = std::make_shared<std::atomic<bool>>(true);
    states_.resize(functions_.size());
    for (size_t i = 0; i < functions_.size(); ++i) {
      const ResolvedFunction& f = functions_[i];
      udf::FunctionWorkerOptions o;
      o.argv = f.argv;
      o.module = f.module_path;
      o.export_name = f.spec.export_name;
      o.display_name = fmt::format("{} subtask {}", f.display, ctx_->subtask_index());
      o.memory_mb = f.spec.memory_mb;
      auto alive = alive_;
      auto posted = posted_;
      TaskServices* services = services_;
      Result<std::unique_ptr<udf::FunctionWorker>> w =
          udf::FunctionWorker::start(std::move(o), [this, alive, posted, services] {
            // From the reader thread: have the task thread take the replies (once per burst).
            if (posted->exchange(true)) return;
            services->post_mail([this, alive, posted] {
              posted->store(false);
              if (alive->load()) call_user_function(this->name(), [&] { poll_all(); });
            });
          });
      if (!w.ok()) throw OperatorException(this->name(), w.error().message(), w.error().code());
      spdlog::info("pipeline '{}': function {} runs in worker pid {} ({} {})", logic_.spec().pipeline.name,
                   functions_[i].display, (*w)->pid(), f.spec.runtime, (*w)->runtime_version());
      states_[i].worker = std::move(*w);
    }
    for (size_t i = 0; i < functions_.size(); ++i)
      by_transform_[functions_[i].transform] = i;
  }

  // Every entry point names this operator in a failure (the source it is chained to would be named otherwise).
  void process_element(cdc::ChangeEvent&& change, TimestampMs ts) override {
    call_user_function(this->name(), [&] { process_change(std::move(change), ts); });
  }
  void process_watermark(TimestampMs watermark) override {
    call_user_function(this->name(), [&] { hold_watermark(watermark); });
  }
  void snapshot_state(int64_t /*checkpoint_id*/) override { guarded_flush(); }
  void end_input() override { guarded_flush(); }
  void finish() override { guarded_flush(); }

 private:
  void guarded_flush() {
    call_user_function(this->name(), [&] { flush_all(); });
  }

  void process_change(cdc::ChangeEvent&& change, TimestampMs ts) {
    const CollectionPlan& plan = logic_.begin(change);
    Result<std::optional<Value>> input = logic_.prepare_guarded(change, plan);
    if (!input.ok()) {
      dead_letter(logic_.bad_record(change, input.error().message(), "transform"));
      return;
    }
    if (!input->has_value()) return;
    auto fn = plan.transform != nullptr ? by_transform_.find(plan.index) : by_transform_.end();
    if (fn == by_transform_.end()) {
      if (pending_.empty()) {
        emit(change, plan, std::move(**input), nullptr, 0, ts);
        return;
      }
      Pending p;
      p.change = std::move(change);
      p.plan = &plan;
      p.input = std::move(**input);
      p.ts = ts;
      p.resolved = true;
      pending_.push_back(std::move(p));
    } else {
      FunctionState& st = states_[fn->second];
      if (st.open_count == 0) open_batch(fn->second);
      if (Status s = st.batch.append(**input); !s.ok()) {
        // A value the protocol cannot carry exactly (docs/functions.md "Protocol"): this record only.
        dead_letter(logic_.bad_record(
            change, fmt::format("function {}: {}", functions_[fn->second].display, s.error().message()), "function",
            {{"function", Value(functions_[fn->second].display)}}));
        return;
      }
      ++st.open_count;
      Pending p;
      p.change = std::move(change);
      p.plan = &plan;
      p.input = std::move(**input);
      p.ts = ts;
      p.function = static_cast<int>(fn->second);
      pending_.push_back(std::move(p));
      ++st.unresolved;
      // An idle worker gets the record at once (the added latency at low rates is one round trip, not the batch
      // delay); a busy one lets the batch grow until it is full, the worker is idle again or the delay runs out.
      if (st.open_count >= static_cast<size_t>(functions_[fn->second].spec.batch_size) || st.in_flight.empty()) {
        send_batch(fn->second);
      } else if (!st.delay_armed) {
        arm_delay_timer(fn->second, st.opened_ms + functions_[fn->second].spec.batch_max_delay_ms);
      }
    }
    max_pending_seen_ = std::max(max_pending_seen_, pending_.size());
    // Records queued behind unanswered batches are bounded too (a stream of changes without a function behind
    // a slow batch must not grow the queue without bound).
    while (pending_.size() > max_pending_ && any_in_flight())
      await_oldest();
    if (pending_.size() > max_pending_) flush_all();
  }

  void hold_watermark(TimestampMs watermark) {
    if (pending_.empty()) {
      StreamOperatorBase::process_watermark(watermark);
      return;
    }
    Pending p;
    p.watermark = true;
    p.ts = watermark;
    p.resolved = true;
    pending_.push_back(std::move(p));
  }

 public:
  void close() override {
    if (alive_) alive_->store(false);
    for (size_t i = 0; i < states_.size() && i < functions_.size(); ++i) {
      // The figures that show the bounds held (tests read them; operators see the batching at work).
      spdlog::info(
          "pipeline '{}': function {} subtask {}: {} records in {} batches, at most {} batches in flight (bound {}), "
          "at most {} changes queued (bound {}), {} timers",
          logic_.spec().pipeline.name, functions_[i].display, ctx_->subtask_index(), states_[i].records_sent,
          states_[i].batches_sent, states_[i].max_in_flight_seen, functions_[i].spec.max_in_flight, max_pending_seen_,
          max_pending_ + 1, states_[i].timers);
    }
    states_.clear();  // kills the workers and joins their threads
    logic_.close();
  }

 private:
  struct Pending {
    cdc::ChangeEvent change;
    const CollectionPlan* plan = nullptr;
    Value input;
    TimestampMs ts = kNoTimestamp;
    int function = -1;       // index in functions_, -1: no function
    bool watermark = false;  // a watermark held behind records (ts is the watermark)
    bool resolved = false;
    udf::RecordResult result;  // the function's result
  };
  struct InFlight {
    int64_t id = 0;
    size_t count = 0;
    std::chrono::steady_clock::time_point sent;
  };
  struct FunctionState {
    std::unique_ptr<udf::FunctionWorker> worker;
    udf::BatchFrame batch;  // the open batch's frame text
    size_t open_count = 0;
    int64_t next_id = 1;
    std::deque<InFlight> in_flight;
    size_t unresolved = 0;  // pending records of this function without a result
    uint64_t batches_sent = 0;
    uint64_t records_sent = 0;
    size_t max_in_flight_seen = 0;
    TimestampMs opened_ms = 0;   // processing time the open batch got its first record
    bool delay_armed = false;    // a batch-max-delay timer is pending
    bool timeout_armed = false;  // a timeout timer is pending
    uint64_t timers = 0;         // timers registered, for the figures at close
  };

  bool any_in_flight() const {
    for (const FunctionState& st : states_)
      if (!st.in_flight.empty()) return true;
    return false;
  }

  void open_batch(size_t f) {
    FunctionState& st = states_[f];
    st.batch.open(st.next_id);
    st.opened_ms = services_->processing_clock().now_ms();
  }

  // At most one batch-max-delay timer per function, and only for a batch that stays open: most batches at a low
  // rate go to an idle worker at once and need none (a timer per batch kept tens of thousands pending).
  void arm_delay_timer(size_t f, TimestampMs at) {
    FunctionState& st = states_[f];
    st.delay_armed = true;
    ++st.timers;
    auto alive = alive_;
    services_->register_processing_timer(at, [this, alive, f](TimestampMs) {
      if (!alive->load()) return;
      FunctionState& s = states_[f];
      s.delay_armed = false;
      if (s.open_count == 0) return;
      const TimestampMs due = s.opened_ms + functions_[f].spec.batch_max_delay_ms;
      if (services_->processing_clock().now_ms() >= due) {
        call_user_function(this->name(), [&] { send_batch(f); });
      } else {
        arm_delay_timer(f, due);  // the batch this timer was armed for went out; the open one is younger
      }
    });
  }

  // At most one timeout timer per function, armed for the oldest unanswered batch: a batch still unanswered
  // after `timeout` fails the task even when no record arrives to notice it. Later batches' deadlines are not
  // earlier, so when it fires it fails the task or re-arms for the batch that is then the oldest.
  void arm_timeout_timer(size_t f) {
    FunctionState& st = states_[f];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        st.in_flight.front().sent + std::chrono::milliseconds(functions_[f].spec.timeout_ms) -
        std::chrono::steady_clock::now());
    st.timeout_armed = true;
    ++st.timers;
    auto alive = alive_;
    services_->register_processing_timer(
        services_->processing_clock().now_ms() + std::max<int64_t>(0, left.count()) + 1, [this, alive, f](TimestampMs) {
          if (!alive->load()) return;
          states_[f].timeout_armed = false;
          call_user_function(this->name(), [&] {
            poll_all();
            FunctionState& s = states_[f];
            if (s.in_flight.empty() || s.timeout_armed) return;
            if (std::chrono::steady_clock::now() >=
                s.in_flight.front().sent + std::chrono::milliseconds(functions_[f].spec.timeout_ms)) {
              await_reply(f);  // past its deadline: fails now, unless its reply arrived since the poll
            }
            // Re-armed whatever happened above: a reply taken by await_reply leaves later batches in flight.
            if (!s.in_flight.empty() && !s.timeout_armed) arm_timeout_timer(f);
          });
        });
  }

  // Sends the open batch of function `f`, first waiting while `max-in-flight` batches are unanswered.
  void send_batch(size_t f) {
    FunctionState& st = states_[f];
    const FunctionSpec& spec = functions_[f].spec;
    while (st.in_flight.size() >= static_cast<size_t>(spec.max_in_flight))
      await_reply(f);
    const auto now = std::chrono::steady_clock::now();
    Status s = st.worker->send(st.batch.close(), now + std::chrono::milliseconds(spec.timeout_ms));
    if (!s.ok()) throw SluiceException(s.error());
    st.in_flight.push_back(InFlight{st.next_id, st.open_count, now});
    ++st.batches_sent;
    st.records_sent += st.open_count;
    st.max_in_flight_seen = std::max(st.max_in_flight_seen, st.in_flight.size());
    ++st.next_id;
    st.open_count = 0;
    if (!st.timeout_armed) arm_timeout_timer(f);
  }

  // Blocks until function `f`'s oldest batch is answered; fails the task at its deadline.
  void await_reply(size_t f) {
    FunctionState& st = states_[f];
    const InFlight& oldest = st.in_flight.front();
    const FunctionSpec& spec = functions_[f].spec;
    const auto deadline = oldest.sent + std::chrono::milliseconds(spec.timeout_ms);
    Result<std::optional<std::string>> r = st.worker->wait_reply(deadline);
    if (!r.ok()) throw SluiceException(r.error());
    if (!r->has_value()) {
      throw SluiceException(Error(
          ErrorCode::kRuntime,
          fmt::format("function {} subtask {}: batch {} ({} records) was not answered within {} ms (function.timeout: "
                      "the function hangs or is too slow); {}",
                      functions_[f].display, ctx_->subtask_index(), oldest.id, oldest.count, spec.timeout_ms,
                      st.worker->describe_exit())));
    }
    take_reply(f, **r);
    drain();
  }

  void await_oldest() {
    // The function whose unanswered batch holds the oldest pending record.
    for (const Pending& p : pending_) {
      if (p.resolved || p.function < 0) continue;
      FunctionState& st = states_[static_cast<size_t>(p.function)];
      if (!st.in_flight.empty()) {
        await_reply(static_cast<size_t>(p.function));
      } else {
        send_batch(static_cast<size_t>(p.function));
      }
      return;
    }
  }

  // Takes every reply that arrived (non-blocking) and emits what is ready.
  void poll_all() {
    for (size_t f = 0; f < states_.size(); ++f) {
      FunctionState& st = states_[f];
      while (!st.in_flight.empty()) {
        Result<std::optional<std::string>> r = st.worker->next_reply();
        if (!r.ok()) throw SluiceException(r.error());
        if (!r->has_value()) break;
        take_reply(f, **r);
      }
    }
    drain();
    // A worker that became idle gets the batch that grew while it was busy.
    for (size_t f = 0; f < states_.size(); ++f) {
      if (states_[f].in_flight.empty() && states_[f].open_count > 0) send_batch(f);
    }
  }

  // Every batch sent and answered, every event emitted.
  void flush_all() {
    for (size_t f = 0; f < states_.size(); ++f) {
      if (states_[f].open_count > 0) send_batch(f);
    }
    for (size_t f = 0; f < states_.size(); ++f) {
      while (!states_[f].in_flight.empty())
        await_reply(f);
    }
    drain();
  }

  [[noreturn]] void protocol_error(size_t f, const std::string& what) {
    throw SluiceException(
        Error(ErrorCode::kRuntime, fmt::format("function {} subtask {}: the worker broke the protocol: {}",
                                               functions_[f].display, ctx_->subtask_index(), what)));
  }

  void take_reply(size_t f, const std::string& text) {
    FunctionState& st = states_[f];
    const InFlight batch = st.in_flight.front();
    Result<std::vector<udf::RecordResult>> results = udf::parse_result_frame(text, batch.id, batch.count);
    if (!results.ok()) protocol_error(f, results.error().message());
    st.in_flight.pop_front();
    size_t next = 0;
    auto& items = *results;
    for (Pending& p : pending_) {
      if (next == items.size()) break;
      if (p.resolved || p.function != static_cast<int>(f)) continue;
      p.result = std::move(items[next++]);
      p.resolved = true;
      --st.unresolved;
    }
    if (next != items.size()) protocol_error(f, "more results than records waiting");
  }

  // Emits the resolved records at the head of the queue, in arrival order.
  void drain() {
    while (!pending_.empty() && pending_.front().resolved) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      if (p.watermark) {
        StreamOperatorBase::process_watermark(p.ts);
      } else if (p.function < 0) {
        emit(p.change, *p.plan, std::move(p.input), nullptr, 0, p.ts);
      } else {
        apply_result(p);
      }
    }
  }

  void apply_result(Pending& p) {
    const ResolvedFunction& f = functions_[static_cast<size_t>(p.function)];
    if (p.result.failed) {
      const std::string& msg = p.result.message;
      const std::string& st = p.result.stack;
      dead_letter(logic_.bad_record(p.change, fmt::format("function {} threw: {}", f.display, st.empty() ? msg : st),
                                    "function",
                                    {{"function", Value(f.display)}, {"message", Value(msg)}, {"stack", Value(st)}}));
      return;
    }
    const Value* ok = &p.result.ok;
    if (ok->is_null()) {
      logic_.counters().filtered.fetch_add(1, std::memory_order_relaxed);  // null: the function dropped it
      return;
    }
    if (ok->is_object()) {
      emit(p.change, *p.plan, std::move(p.input), ok, 0, p.ts);
      return;
    }
    if (ok->is_array()) {
      const auto& items = ok->as_array();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_object()) {
          dead_letter(logic_.bad_record(p.change,
                                        fmt::format("function {} returned a list whose item {} is {}, not an object",
                                                    f.display, i, items[i].to_json().substr(0, 200)),
                                        "function", {{"function", Value(f.display)}}));
          return;
        }
      }
      for (size_t i = 0; i < items.size(); ++i) {
        emit(p.change, *p.plan, i + 1 < items.size() ? p.input : std::move(p.input), &items[i], i, p.ts);
      }
      return;
    }
    dead_letter(logic_.bad_record(p.change,
                                  fmt::format("function {} returned {}, not an object, a list of objects or null",
                                              f.display, ok->to_json().substr(0, 200)),
                                  "function", {{"function", Value(f.display)}}));
  }

  void emit(const cdc::ChangeEvent& change, const CollectionPlan& plan, Value input, const Value* result, size_t index,
            TimestampMs ts) {
    logic_.set_collection(change);
    Result<std::optional<RoutedEvent>> r = logic_.finish_guarded(change, plan, std::move(input), result, index);
    if (!r.ok()) {
      dead_letter(logic_.bad_record(change, r.error().message(), result != nullptr ? "function" : "transform"));
      return;
    }
    if (!r->has_value() || !logic_.emit_ready(**r)) return;
    this->metrics_.records_out.inc();
    this->typed(this->main_output_)->collect(std::move(**r), ts);
  }

  void dead_letter(Value entry) {
    if (OutputBase* out = side_output(dead_letter_tag().id()); out != nullptr) {
      static_cast<Output<Value>*>(out)->collect(std::move(entry), kNoTimestamp);
    }
  }

  TransformLogic logic_;
  std::vector<ResolvedFunction> functions_;
  std::vector<FunctionState> states_;
  std::unordered_map<size_t, size_t> by_transform_;  // transform index -> functions_ index
  std::deque<Pending> pending_;
  size_t max_pending_ = 0;
  std::shared_ptr<std::atomic<bool>> alive_;
  std::shared_ptr<std::atomic<bool>> posted_ = std::make_shared<std::atomic<bool>>(false);
  size_t max_pending_seen_ = 0;

 public:
  void set_max_pending(size_t n) { max_pending_ = n; }
};

// DataStream::transform is for the api's own operators; the pipeline adds its operator through a subclass.
template <class T>
struct OperatorAdder : DataStream<T> {
  explicit OperatorAdder(const DataStream<T>& s) : DataStream<T>(s) {}
  template <class U, class Make>
  DataStream<U> add(std::string name, Make make) {
    return this->template transform<U>(std::move(name), false, std::move(make));
  }
};

}  // namespace

Result<DataStream<RoutedEvent>> add_transform(DataStream<cdc::ChangeEvent>& changes, const PipelineSpec& spec,
                                              std::shared_ptr<PipelineCounters> counters,
                                              std::optional<DataStream<Value>>* dead_letters) {
  auto shared = std::make_shared<const PipelineSpec>(spec);
  const bool has_dead_letter = spec.pipeline.dead_letter.has_value();
  TransformLogic logic(shared, std::move(counters), has_dead_letter);
  std::vector<ResolvedFunction> functions;
  const std::filesystem::path base = std::filesystem::absolute(spec.file).parent_path();
  for (size_t i = 0; i < spec.transforms.size(); ++i) {
    const TransformSpec& t = spec.transforms[i];
    if (!t.function) continue;
    const std::filesystem::path module = (base / t.function->module).lexically_normal();
    const bool python = t.function->runtime == "python";
    Result<udf::PreparedModule> prepared =
        python ? udf::prepare_python_module(module) : udf::prepare_node_module(module, base);
    if (!prepared.ok()) {
      return Error(ErrorCode::kConfiguration, fmt::format("{}:{}:{}: {}", spec.file, t.function->module_mark.line,
                                                          t.function->module_mark.column, prepared.error().message()));
    }
    functions.push_back(ResolvedFunction{
        i, *t.function, prepared->path,
        python ? udf::python_worker_command(t.function->memory_mb) : udf::node_worker_command(t.function->memory_mb),
        fmt::format("{} ({})", t.function->export_name, t.function->module)});
  }
  DataStream<RoutedEvent> out = [&] {
    if (functions.empty()) return changes.process(TransformFunction(std::move(logic)));
    size_t max_pending = 0;
    for (const ResolvedFunction& f : functions)
      max_pending += static_cast<size_t>((f.spec.max_in_flight + 1) * f.spec.batch_size);
    return OperatorAdder<cdc::ChangeEvent>(changes).add<RoutedEvent>("Transform", [logic, functions, max_pending]() {
      auto op = std::make_unique<FunctionTransformOperator>(logic, functions);
      op->set_max_pending(max_pending);
      return op;
    });
  }();
  // At the source's parallelism, so that the edge is forward: a source of parallelism 1 (Postgres) feeding more
  // transform subtasks went round-robin, and the events of one entity overtook each other before the key_by.
  if (const int p = changes.graph()->node(changes.node_id()).parallelism; p > 0) out.set_parallelism(p);
  if (has_dead_letter) *dead_letters = out.get_side_output(dead_letter_tag());
  return out;
}

std::string sample_transform(const PipelineSpec& spec, const std::vector<cdc::ChangeEvent>& changes) {
  auto counters = std::make_shared<PipelineCounters>();
  counters->init_filters(spec);
  // With a dead-letter sink assumed, a record the transform cannot handle is reported instead of thrown.
  TransformLogic logic(std::make_shared<const PipelineSpec>(spec), counters, true);
  std::string out;
  std::vector<int64_t> matched(spec.transforms.size(), 0);
  int64_t unmatched = 0;
  for (size_t n = 0; n < changes.size(); ++n) {
    const cdc::ChangeEvent& change = changes[n];
    const CollectionPlan& plan = logic.begin(change);
    out += fmt::format("record {} ({}.{}, op {}, position {}): ", n + 1, change.source.database,
                       change.source.collection, change.to_value().find("op")->to_json(), change.source.position);
    const TransformSpec* t = plan.transform;
    if (t == nullptr) {
      ++unmatched;
      out += "no transform matches (default mapping); ";
    } else {
      ++matched[plan.index];
      out += fmt::format("transform #{} (match '{}'); ", plan.index + 1, t->match);
      if (t->filter) {
        Result<Value> v = t->filter->evaluate(change.to_value());
        out += fmt::format("filter -> {}", v.ok() ? v->to_json() : "error");
      }
    }
    Result<std::optional<Value>> input = logic.prepare_guarded(change, plan);
    if (!input.ok()) {
      out += fmt::format(" ERROR: {} (the dead-letter sink, or the job fails)\n", input.error().message());
      continue;
    }
    if (!input->has_value()) {
      out += ": dropped\n";
      continue;
    }
    if (t != nullptr && t->filter) out += ": kept; ";
    if (t != nullptr && t->function) {
      out += fmt::format("function '{}' is not run by --sample (its input: {})\n", t->function->export_name,
                         (**input).to_json());
      continue;
    }
    Result<std::optional<RoutedEvent>> r = logic.finish_guarded(change, plan, std::move(**input), nullptr, 0);
    if (!r.ok()) {
      out += fmt::format("ERROR: {} (the dead-letter sink, or the job fails)\n", r.error().message());
      continue;
    }
    if (!r->has_value()) {
      out += "no event\n";
      continue;
    }
    RoutedEvent& e = **r;
    const Value* type = e.event.find("type");
    out += fmt::format("entity {}, event {}", e.entity_key, type != nullptr ? type->to_json() : "?");
    std::string sinks;
    for (size_t i = 0; i < spec.sinks.size(); ++i) {
      if ((e.sinks >> i) & 1U) sinks += (sinks.empty() ? "" : ", ") + spec.sinks[i].name;
    }
    logic.emit_ready(e);  // counts the event, or counts it unrouted
    out += sinks.empty() ? " -> no route: unrouted, dropped\n" : fmt::format(" -> {}\n", sinks);
    if (const Value* payload = e.event.find("payload"); payload != nullptr) {
      out += fmt::format("    payload {}\n", payload->to_json());
    }
  }
  out += fmt::format("{} records: {} changes in, {} events out, {} filtered, {} unrouted, {} errors\n", changes.size(),
                     counters->changes_in.load(), counters->events_out.load(), counters->filtered.load(),
                     counters->unrouted.load(), counters->dead_letters.load());
  for (size_t i = 0; i < spec.transforms.size(); ++i) {
    const TransformSpec& t = spec.transforms[i];
    out += fmt::format("transform #{} (match '{}', line {}): {} records", i + 1, t.match, t.mark.line, matched[i]);
    const FilterStats* f = counters->filter(i);
    if (f != nullptr) {
      const int64_t seen = f->seen.load();
      const int64_t kept = f->kept.load();
      out += fmt::format(", filter kept {} and dropped {}", kept, seen - kept);
      for (size_t p = 0; p < f->paths.size(); ++p) {
        if (seen > 0 && f->present[p].load() == 0) {
          out += fmt::format(
              "\n  warning: the filter '{}' reads '{}', which is absent from all {} records (a typo?); "
              "the records have {}",
              t.filter->text(), f->paths[p], seen, f->sample_fields());
        }
      }
      if (seen > 0 && kept == 0) {
        out += fmt::format("\n  warning: the filter '{}' dropped all {} records", t.filter->text(), seen);
      }
    }
    out += "\n";
  }
  if (unmatched > 0) out += fmt::format("{} records matched no transform\n", unmatched);
  return out;
}

}  // namespace sluice::pipeline::detail
