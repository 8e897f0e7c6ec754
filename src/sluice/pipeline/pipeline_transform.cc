// The transform step of a pipeline: one change event in, at most one routed domain event out.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "pipeline_internal.h"
#include "sluice/connectors/opensearch/opensearch_sink.h"
#include "sluice/pipeline/domain_event.h"

namespace sluice::pipeline::detail {
namespace {

const OutputTag<Value>& dead_letter_tag() {
  static const OutputTag<Value> tag("pipeline-dead-letter");
  return tag;
}

// What applies to one collection, resolved once per collection name and cached per subtask.
struct CollectionPlan {
  const TransformSpec* transform = nullptr;  // the first matching transform, or none
  uint64_t sinks = 0;
};

class TransformFunction final : public ProcessFunction<cdc::ChangeEvent, RoutedEvent> {
 public:
  TransformFunction(std::shared_ptr<const PipelineSpec> spec, std::shared_ptr<PipelineCounters> counters,
                    bool has_dead_letter)
      : spec_(std::move(spec)), counters_(std::move(counters)), has_dead_letter_(has_dead_letter) {}

  void process_element(const cdc::ChangeEvent& change, Context& ctx, Collector<RoutedEvent>& out) override {
    counters_->changes_in.fetch_add(1, std::memory_order_relaxed);
    if (change.source.ts_ms > 0) {
      counters_->last_source_ts_ms.store(change.source.ts_ms, std::memory_order_relaxed);
    }
    collection_.assign(change.source.database).append(".").append(change.source.collection);
    const CollectionPlan& plan = plan_for(collection_);
    Result<std::optional<RoutedEvent>> r = apply_guarded(change, plan);
    if (!r.ok()) {
      bad_record(change, r.error(), ctx);
      return;
    }
    if (!r->has_value()) return;
    if ((*r)->sinks == 0) {
      counters_->unrouted.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    counters_->events_out.fetch_add(1, std::memory_order_relaxed);
    if (const Value* type = (*r)->event.find("type"); type != nullptr && type->is_string()) {
      ++type_counts_[std::string(type->as_string())];
      if (++since_merge_ >= 4096) {
        counters_->add_types(type_counts_);
        since_merge_ = 0;
      }
    }
    out.collect(std::move(**r));
  }

  void close() override { counters_->add_types(type_counts_); }

 private:
  const CollectionPlan& plan_for(const std::string& collection) {
    auto it = plans_.find(collection);
    if (it != plans_.end()) return it->second;
    CollectionPlan plan;
    for (const TransformSpec& t : spec_->transforms) {
      if (match_collection(t.match, collection)) {
        plan.transform = &t;
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

  // apply(), with a value too large to build turned into a record error (dead letter or failure per policy):
  // one record's size must not end the process or fail a job that has a dead-letter sink.
  Result<std::optional<RoutedEvent>> apply_guarded(const cdc::ChangeEvent& change, const CollectionPlan& plan) {
    try {
      return apply(change, plan);
    } catch (const std::bad_alloc&) {
      return Error(ErrorCode::kRuntime, "out of memory while transforming the change (a value too large)");
    } catch (const std::length_error& e) {
      return Error(ErrorCode::kRuntime, fmt::format("a value is too large to represent: {}", e.what()));
    }
  }

  Result<std::optional<RoutedEvent>> apply(const cdc::ChangeEvent& change, const CollectionPlan& plan) {
    const TransformSpec* t = plan.transform;
    Value input = change.to_value();
    const bool is_delete = change.op == cdc::ChangeOp::kDelete;
    if (t != nullptr && t->filter) {
      Result<Value> keep = eval(*t->filter, input, "filter");
      if (!keep.ok()) return keep.error();
      if (!keep->is_bool() || !keep->as_bool()) {
        if (!keep->is_bool() && !keep->is_null()) {
          return Error(ErrorCode::kRuntime,
                       fmt::format("filter '{}' gave {}, not a boolean", t->filter->text(), keep->to_json()));
        }
        counters_->filtered.fetch_add(1, std::memory_order_relaxed);
        return std::optional<RoutedEvent>();
      }
    }
    if (t != nullptr && t->projection) {
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
    Value key;
    if (t != nullptr && t->key) {
      Result<Value> k = eval(*t->key, input, "key");
      if (!k.ok()) return k.error();
      key = std::move(*k);
    } else {
      key = change.entity_id();
    }
    Value entity = key;
    if (t != nullptr && t->event.entity) {
      Result<Value> e = eval(*t->event.entity, input, "event.entity");
      if (!e.ok()) return e.error();
      entity = std::move(*e);
    }
    if (entity.is_null()) {
      return Error(ErrorCode::kRuntime,
                   "the entity id is NULL (set the transform's `key` to an expression that "
                   "is never NULL for this collection)");
    }
    std::string type;
    if (t != nullptr && t->event.type) {
      Result<Value> ty = eval(*t->event.type, input, "event.type");
      if (!ty.ok()) return ty.error();
      if (!ty->is_string() || ty->as_string().empty()) {
        return Error(ErrorCode::kRuntime, fmt::format("event.type '{}' gave {}, not a non-empty string",
                                                      t->event.type->text(), ty->to_json()));
      }
      type = std::string(ty->as_string());
    } else {
      type = default_event_type(change);
    }
    Value payload;
    if (t != nullptr && t->event.payload) {
      Result<Value> p = t->event.payload->evaluate(input);
      if (!p.ok()) return p.error().with_context("event.payload");
      payload = std::move(*p);
    } else if (const Value* row = input.find(is_delete ? "before" : "after"); row != nullptr) {
      payload = *row;
    }
    int64_t occurred_us = change.source.ts_ms * 1000;
    if (t != nullptr && t->event.occurred_at) {
      Result<Value> o = eval(*t->event.occurred_at, input, "event.occurred-at");
      if (!o.ok()) return o.error();
      if (o->is_timestamp()) {
        occurred_us = o->as_timestamp_micros();
      } else if (o->is_int64()) {
        occurred_us = o->as_int64() * 1000;  // ms since epoch
      } else {
        return Error(ErrorCode::kRuntime, fmt::format("event.occurred-at '{}' gave {}, not a timestamp or ms",
                                                      t->event.occurred_at->text(), o->to_json()));
      }
    }
    RoutedEvent r;
    r.entity_key = entity.is_string() ? std::string(entity.as_string()) : entity.to_json();
    r.event = make_domain_event(change, entity, std::move(type), std::move(payload), occurred_us);
    r.collection = collection_;
    r.sinks = plan.sinks;
    if (change.source.connector == "postgres" || change.source.connector == "mongodb") {
      Result<int64_t> v = opensearch::change_event_version(change);
      if (v.ok()) r.version = *v;
    }
    return std::optional<RoutedEvent>(std::move(r));
  }

  // A change the transform cannot turn into an event: to the dead-letter sink, or the job fails naming it.
  void bad_record(const cdc::ChangeEvent& change, const Error& error, Context& ctx) {
    const std::string where =
        fmt::format("{} {}.{} at position {}{}", change.source.connector, change.source.database,
                    change.source.collection, change.source.position,
                    change.source.sequence != 0 ? fmt::format(" (sequence {})", change.source.sequence) : "");
    if (!has_dead_letter_) {
      std::string record = change.to_value().to_json();
      if (record.size() > 512) record = record.substr(0, 512) + "...";
      throw SluiceException(
          Error(ErrorCode::kRuntime,
                fmt::format("pipeline '{}': the change of {} could not be transformed: {}. Record: {}. Remedy: fix the "
                            "transform, or set pipeline.dead-letter to divert such records and go on",
                            spec_->pipeline.name, where, error.message(), record)));
    }
    counters_->dead_letters.fetch_add(1, std::memory_order_relaxed);
    Value entry = Value::object({{"stage", Value("transform")},
                                 {"pipeline", Value(spec_->pipeline.name)},
                                 {"connector", Value(change.source.connector)},
                                 {"collection", Value(collection_)},
                                 {"position", Value(change.source.position)},
                                 {"sequence", Value(change.source.sequence)},
                                 {"error", Value(error.message())},
                                 {"record", change.to_value()}});
    ctx.output(dead_letter_tag(), std::move(entry));
  }

  std::shared_ptr<const PipelineSpec> spec_;
  std::shared_ptr<PipelineCounters> counters_;
  bool has_dead_letter_;
  std::unordered_map<std::string, CollectionPlan> plans_;
  std::string collection_;
  std::map<std::string, int64_t> type_counts_;  // merged into counters_ every 4096 events and at close
  int since_merge_ = 0;
};

}  // namespace

DataStream<RoutedEvent> add_transform(DataStream<cdc::ChangeEvent>& changes, const PipelineSpec& spec,
                                      std::shared_ptr<PipelineCounters> counters,
                                      std::optional<DataStream<Value>>* dead_letters) {
  auto shared = std::make_shared<const PipelineSpec>(spec);
  const bool has_dead_letter = spec.pipeline.dead_letter.has_value();
  DataStream<RoutedEvent> out = changes.process(TransformFunction(shared, std::move(counters), has_dead_letter));
  // At the source's parallelism, so that the edge is forward: a source of parallelism 1 (Postgres) feeding more
  // transform subtasks went round-robin, and the events of one entity overtook each other before the key_by.
  if (const int p = changes.graph()->node(changes.node_id()).parallelism; p > 0) out.set_parallelism(p);
  if (has_dead_letter) *dead_letters = out.get_side_output(dead_letter_tag());
  return out;
}

}  // namespace sluice::pipeline::detail
