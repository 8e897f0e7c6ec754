// Typed implementations of EdgeOps: how records of type T move along an edge, chained (a direct call) or
// across the network (serialized into a RecordWriterBase, channel chosen by the partitioner).
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "sluice/core/fault_points.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

/// The named fault point "operator.process:<name>" before a record reaches an operator. Per record, so while
/// no point is armed it is one relaxed atomic load and a predicted branch: the name is never built.
inline void operator_fault_point(const StreamOperatorBase* op) {
  if (__builtin_expect(fault::detail::any_armed(), 0)) {
    call_user_function(op->name(), [&] { SLUICE_FAULT_POINT("operator.process:" + op->name()); });
  }
}

/// Calls the next operator of the chain directly (no serialization, no copy).
template <class T>
class ChainingOutput final : public Output<T> {
 public:
  ChainingOutput(InputHandle<T>* target, const StreamOperatorBase* op)
      : target_(target), op_(op), counter_(&target->input_metrics().records_in) {}
  void collect(T&& record, TimestampMs ts) override {
    counter_->inc();
    operator_fault_point(op_);
    target_->process_element(std::move(record), ts);
  }
  void emit_watermark(TimestampMs wm) override { target_->process_input_watermark(wm); }
  void emit_watermark_status(bool idle) override { target_->process_input_watermark_status(idle); }

 private:
  InputHandle<T>* target_;
  const StreamOperatorBase* op_;
  Counter* counter_;
};

/// Hands each record to several outputs: copies for all but the last, which gets the original.
template <class T>
class BroadcastingOutput final : public Output<T> {
 public:
  explicit BroadcastingOutput(std::vector<OutputBase*> outputs) {
    for (auto* o : outputs)
      outputs_.push_back(static_cast<Output<T>*>(o));
  }
  void collect(T&& record, TimestampMs ts) override {
    for (size_t i = 0; i + 1 < outputs_.size(); ++i) {
      T copy = record;
      outputs_[i]->collect(std::move(copy), ts);
    }
    outputs_.back()->collect(std::move(record), ts);
  }
  void emit_watermark(TimestampMs wm) override {
    for (auto* o : outputs_)
      o->emit_watermark(wm);
  }
  void emit_watermark_status(bool idle) override {
    for (auto* o : outputs_)
      o->emit_watermark_status(idle);
  }

 private:
  std::vector<Output<T>*> outputs_;
};

/// Channel selection policies (Flink's StreamPartitioner subclasses).
namespace partitioners {
struct Forward {
  template <class T>
  int select(const T&) {
    return 0;  // a pointwise 1:1 partition has exactly one channel
  }
};
/// Round robin starting at the producer's own index, so producers do not all start on channel 0.
struct RoundRobin {
  int next = 0;
  int n = 1;
  template <class T>
  int select(const T&) {
    int c = next;
    next = next + 1 == n ? 0 : next + 1;
    return c;
  }
};
/// By key group: hash of the serialized key (key_group.h), then Flink's operator-index formula.
template <class T, class K, class Sel>
struct KeyGroups {
  Sel selector;
  int max_parallelism = kDefaultMaxParallelism;
  int n = 1;
  DataOutput key_bytes;
  int select(const T& record) {
    key_bytes.clear();
    TypeSerializer<K>::serialize(std::invoke(selector, record), key_bytes);
    return operator_index_for_key_group(max_parallelism, n, assign_to_key_group(key_bytes.bytes(), max_parallelism));
  }
};
}  // namespace partitioners

/// Serializes records into a RecordWriterBase; `Policy` picks the channel (inlined, no virtual call).
template <class T, class Policy>
class NetworkOutput final : public Output<T> {
 public:
  NetworkOutput(RecordWriterBase& writer, Policy policy) : writer_(writer), policy_(std::move(policy)) {}
  void collect(T&& record, TimestampMs ts) override {
    buf_.clear();
    TypeSerializer<T>::serialize(record, buf_);
    writer_.write_record(policy_.select(record), buf_.bytes(), ts);
  }
  void emit_watermark(TimestampMs wm) override { writer_.broadcast_watermark(wm); }
  void emit_watermark_status(bool idle) override { writer_.broadcast_watermark_status(idle); }

 private:
  RecordWriterBase& writer_;
  Policy policy_;
  DataOutput buf_{256};
};

/// Serializes each record once and appends it to every channel.
template <class T>
class BroadcastNetworkOutput final : public Output<T> {
 public:
  explicit BroadcastNetworkOutput(RecordWriterBase& writer) : writer_(writer) {}
  void collect(T&& record, TimestampMs ts) override {
    buf_.clear();
    TypeSerializer<T>::serialize(record, buf_);
    writer_.broadcast_record(buf_.bytes(), ts);
  }
  void emit_watermark(TimestampMs wm) override { writer_.broadcast_watermark(wm); }
  void emit_watermark_status(bool idle) override { writer_.broadcast_watermark_status(idle); }

 private:
  RecordWriterBase& writer_;
  DataOutput buf_{256};
};

/// Deserializes records of T into one reused object and feeds the chain's head operator.
template <class T>
class TypedRecordInput final : public RecordInput {
 public:
  TypedRecordInput(InputHandle<T>* head, const StreamOperatorBase* op)
      : head_(head), op_(op), counter_(&head->input_metrics().records_in) {}
  void process_record(DataInput& in, TimestampMs ts) override {
    TypeSerializer<T>::deserialize(reuse_, in);
    counter_->inc();
    operator_fault_point(op_);
    head_->process_element(std::move(reuse_), ts);
  }
  void process_watermark(TimestampMs wm) override { head_->process_input_watermark(wm); }
  void process_watermark_status(bool idle) override { head_->process_input_watermark_status(idle); }

 private:
  InputHandle<T>* head_;
  const StreamOperatorBase* op_;
  Counter* counter_;
  T reuse_{};
};

/// EdgeOps for records of T; the partitioner kind comes from the edge.
template <class T>
class TypedEdgeOps : public EdgeOps {
 public:
  TypedEdgeOps() = default;

  std::unique_ptr<OutputBase> make_chaining_output(StreamOperatorBase* target) const override {
    return std::make_unique<ChainingOutput<T>>(checked_cast(target, 0), target);
  }
  std::unique_ptr<OutputBase> make_network_output(RecordWriterBase& writer, PartitionerKind partitioner,
                                                  int subtask_index, int max_parallelism) const override {
    switch (partitioner) {
      case PartitionerKind::kForward:
        return std::make_unique<NetworkOutput<T, partitioners::Forward>>(writer, partitioners::Forward{});
      case PartitionerKind::kRebalance:
      case PartitionerKind::kRescale: {
        partitioners::RoundRobin rr;
        rr.n = writer.num_channels();
        rr.next = subtask_index % rr.n;
        return std::make_unique<NetworkOutput<T, partitioners::RoundRobin>>(writer, rr);
      }
      case PartitionerKind::kBroadcast:
        return std::make_unique<BroadcastNetworkOutput<T>>(writer);
      case PartitionerKind::kKeyGroup:
        return make_keyed_output(writer, max_parallelism);
    }
    return nullptr;
  }
  std::unique_ptr<OutputBase> make_broadcasting_output(std::vector<OutputBase*> outputs) const override {
    return std::make_unique<BroadcastingOutput<T>>(std::move(outputs));
  }
  std::unique_ptr<OutputBase> make_discarding_output() const override {
    struct Discard final : Output<T> {
      void collect(T&&, TimestampMs) override {}
      void emit_watermark(TimestampMs) override {}
      void emit_watermark_status(bool) override {}
    };
    return std::make_unique<Discard>();
  }
  std::unique_ptr<RecordInput> make_record_input(StreamOperatorBase* head, int input_index) const override {
    return std::make_unique<TypedRecordInput<T>>(checked_cast(head, input_index), head);
  }

 protected:
  virtual std::unique_ptr<OutputBase> make_keyed_output(RecordWriterBase&, int) const {
    throw SluiceException(Error(ErrorCode::kInternal, "a hash edge without a key selector"));
  }

 private:
  // The graph was built by typed API calls, so input `index` of the target is an InputHandle<T>.
  static InputHandle<T>* checked_cast(StreamOperatorBase* op, int index) {
    void* handle = op->input_handle(index);
    if (handle == nullptr) {
      throw SluiceException(Error(ErrorCode::kInternal, "operator has no input " + std::to_string(index)));
    }
    return static_cast<InputHandle<T>*>(handle);
  }
};

/// EdgeOps for a key_by edge: records of T partitioned by the key group of Sel(record) of type K.
template <class T, class K, class Sel>
class KeyedEdgeOps final : public TypedEdgeOps<T> {
 public:
  explicit KeyedEdgeOps(Sel selector) : selector_(std::move(selector)) {}

 protected:
  std::unique_ptr<OutputBase> make_keyed_output(RecordWriterBase& writer, int max_parallelism) const override {
    partitioners::KeyGroups<T, K, Sel> p{selector_, max_parallelism, writer.num_channels(), DataOutput(64)};
    return std::make_unique<NetworkOutput<T, partitioners::KeyGroups<T, K, Sel>>>(writer, std::move(p));
  }

 private:
  Sel selector_;
};

}  // namespace sluice
