// DataStream<T> and KeyedStream<K, T>: the fluent API that builds the stream graph (Flink's DataStream API).
//
//   env.from_source(src, "words").flat_map<std::string>(split).key_by(identity).reduce(add).sink_to(sink);
//
// A DataStream is a cheap handle (a shared graph plus the inputs of the next operator). Transformations add a
// node; name(), uid(), set_parallelism(), set_max_parallelism(), slot_sharing_group() and disable_chaining()
// configure the operator that produced the stream. Not thread-safe: build a job on one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/graph/stream_graph.h"
#include "sluice/graph/typed_edge_ops.h"
#include "sluice/operators/keyed_operators.h"
#include "sluice/operators/operators.h"
#include "sluice/operators/sink_operator.h"
#include "sluice/operators/timestamps_and_watermarks_operator.h"

namespace sluice {

template <class K, class T>
class KeyedStream;
template <class T1, class T2>
class ConnectedStreams;
template <class K, class T, class W>
class WindowedStream;

namespace detail {

template <class I, class O>
O flat_map_output_of(const FlatMapFunction<I, O>*);

/// The output type of flat_map: U when given, else deduced from a FlatMapFunction (lazily, so lambdas work).
template <class U, class F>
struct FlatMapOutput {
  using type = U;
};
template <class F>
struct FlatMapOutput<void, F> {
  using type = decltype(flat_map_output_of(std::declval<F*>()));
};

/// The upstream half of an edge the next transformation will create.
struct PendingInput {
  int node = 0;
  PartitionerKind partitioner = PartitionerKind::kForward;
  bool explicit_partitioner = false;
  std::string side_output_tag;
  std::shared_ptr<EdgeOps> ops;
};

}  // namespace detail

/// Configures a sink operator after sink_to().
class DataStreamSink {
 public:
  DataStreamSink(std::shared_ptr<StreamGraph> graph, int node) : graph_(std::move(graph)), node_(node) {}
  DataStreamSink& name(std::string n) {
    graph_->node(node_).name = std::move(n);
    return *this;
  }
  DataStreamSink& uid(std::string u) {
    graph_->node(node_).uid = std::move(u);
    return *this;
  }
  DataStreamSink& set_parallelism(int p) {
    graph_->node(node_).parallelism = p;
    return *this;
  }
  DataStreamSink& slot_sharing_group(std::string g) {
    graph_->node(node_).slot_sharing_group = std::move(g);
    return *this;
  }
  DataStreamSink& disable_chaining() {
    graph_->node(node_).chaining_disabled = true;
    return *this;
  }
  int node_id() const { return node_; }

 private:
  std::shared_ptr<StreamGraph> graph_;
  int node_;
};

/// A stream of records of type T. T needs a TypeSerializer (to cross task boundaries) and a default
/// constructor (deserialization reuses one object).
template <class T>
class DataStream {
 public:
  using RecordType = T;

  DataStream(std::shared_ptr<StreamGraph> graph, std::vector<detail::PendingInput> inputs)
      : graph_(std::move(graph)), inputs_(std::move(inputs)) {}

  // ---- transformations ----

  /// One output record per input record. F: a callable `U(const T&)` (or `U(T)`), or a MapFunction<T, U>.
  template <class F>
  auto map(F fn) -> DataStream<typename detail::MapResult<F, T>::type> {
    using U = typename detail::MapResult<F, T>::type;
    return transform<U>("Map", false, [fn]() { return std::make_unique<MapOperator<T, U, F>>(fn); });
  }

  /// Keeps records for which `fn` returns true. F: `bool(const T&)` or a FilterFunction<T>.
  template <class F>
  DataStream<T> filter(F fn) {
    return transform<T>("Filter", false, [fn]() { return std::make_unique<FilterOperator<T, F>>(fn); });
  }

  /// Zero or more output records per input. F: `void(const T&, Collector<U>&)` (give U explicitly), or a
  /// FlatMapFunction<T, U> (U deduced).
  template <class U = void, class F>
  auto flat_map(F fn) {
    using Out = typename detail::FlatMapOutput<U, F>::type;
    return transform<Out>("Flat Map", false, [fn]() { return std::make_unique<FlatMapOperator<T, Out, F>>(fn); });
  }

  /// Runs a ProcessFunction<T, Out> (timestamps, side outputs).
  template <class P>
  DataStream<typename P::OutputType> process(P fn) {
    using Out = typename P::OutputType;
    static_assert(std::is_base_of_v<ProcessFunction<T, Out>, P>, "process() takes a ProcessFunction<T, Out>");
    return transform<Out>("Process", false, [fn]() { return std::make_unique<ProcessOperator<T, Out, P>>(fn); });
  }

  /// Assigns event timestamps and generates watermarks with `strategy` (upstream watermarks are replaced).
  DataStream<T> assign_timestamps_and_watermarks(const WatermarkStrategy<T>& strategy) {
    auto s = std::make_shared<const WatermarkStrategy<T>>(strategy);
    int64_t interval = options::kAutoWatermarkInterval.default_value;
    try {
      interval = graph_->config().get(options::kAutoWatermarkInterval);
    } catch (const SluiceException&) {  // reported by execute() (validate_engine_options)
    }
    return transform<T>("Timestamps/Watermarks", false,
                        [s, interval]() { return std::make_unique<TimestampsAndWatermarksOperator<T>>(s, interval); });
  }

  /// Partitions by key: records with equal keys go to the same subtask, in order. Sel: `K(const T&)` or a
  /// pointer to a member of T. K needs a TypeSerializer (its bytes choose the key group).
  template <class Sel>
  auto key_by(Sel selector) const {
    using K = std::decay_t<std::invoke_result_t<Sel&, const T&>>;
    std::vector<detail::PendingInput> in = inputs_;
    auto ops = std::make_shared<KeyedEdgeOps<T, K, Sel>>(selector);
    for (auto& i : in) {
      i.partitioner = PartitionerKind::kKeyGroup;
      i.explicit_partitioner = true;
      i.ops = ops;
    }
    return KeyedStream<K, T>(graph_, std::move(in), std::move(selector));
  }

  /// Merges streams of the same type (no operator; the next operator reads all of them).
  template <class... Streams>
  DataStream<T> union_with(const Streams&... others) {
    std::vector<detail::PendingInput> in = inputs_;
    (in.insert(in.end(), others.inputs_.begin(), others.inputs_.end()), ...);
    return DataStream<T>(graph_, std::move(in));
  }

  DataStream<T> rebalance() const { return repartition(PartitionerKind::kRebalance); }
  DataStream<T> rescale() const { return repartition(PartitionerKind::kRescale); }
  DataStream<T> broadcast() const { return repartition(PartitionerKind::kBroadcast); }
  DataStream<T> forward() const { return repartition(PartitionerKind::kForward); }

  /// Connects this stream with `other` for a two-input operator (include sluice/api/connected_streams.h).
  template <class U>
  ConnectedStreams<T, U> connect(const DataStream<U>& other) const;

  /// The side output named by `tag` of the process operator that produced this stream.
  template <class U>
  DataStream<U> get_side_output(const OutputTag<U>& tag) const {
    detail::PendingInput p{single_node("get_side_output"), PartitionerKind::kForward, false, tag.id(),
                           std::make_shared<TypedEdgeOps<U>>()};
    return DataStream<U>(graph_, {p});
  }

  /// Writes the stream to a sink (SinkOperator: at-least-once, flush on snapshot).
  DataStreamSink sink_to(std::shared_ptr<const Sink<T>> sink, std::string name = "Sink") {
    auto factory = std::make_shared<LambdaOperatorFactory>(
        [sink]() -> std::unique_ptr<StreamOperatorBase> { return std::make_unique<SinkOperator<T>>(sink); }, true);
    int node = add_node(std::move(name), factory);
    graph_->node(node).is_sink = true;
    return DataStreamSink(graph_, node);
  }

  /// Writes the stream to a two-phase-commit sink (TwoPhaseCommitSinkOperator: exactly-once with
  /// checkpointing). Chosen by the static type: pass the sink's own shared_ptr, not a shared_ptr<const Sink<T>>.
  template <TwoPhaseCommittingSinkOf<T> S>
  DataStreamSink sink_to(std::shared_ptr<S> sink, std::string name = "Sink") {
    using CommT = typename std::remove_cv_t<S>::CommittableType;
    std::shared_ptr<const TwoPhaseCommittingSink<T, CommT>> base = std::move(sink);
    auto factory = std::make_shared<LambdaOperatorFactory>(
        [base]() -> std::unique_ptr<StreamOperatorBase> {
          return std::make_unique<TwoPhaseCommitSinkOperator<T, CommT>>(base);
        },
        true);
    int node = add_node(std::move(name), factory);
    graph_->node(node).is_sink = true;
    return DataStreamSink(graph_, node);
  }

  // ---- configuration of the operator that produced this stream ----

  DataStream<T>& name(std::string n) {
    node_for("name").name = std::move(n);
    return *this;
  }
  DataStream<T>& uid(std::string u) {
    node_for("uid").uid = std::move(u);
    return *this;
  }
  DataStream<T>& set_parallelism(int p) {
    node_for("set_parallelism").parallelism = p;
    return *this;
  }
  DataStream<T>& set_max_parallelism(int p) {
    node_for("set_max_parallelism").max_parallelism = p;
    return *this;
  }
  DataStream<T>& slot_sharing_group(std::string g) {
    node_for("slot_sharing_group").slot_sharing_group = std::move(g);
    return *this;
  }
  DataStream<T>& disable_chaining() {
    node_for("disable_chaining").chaining_disabled = true;
    return *this;
  }

  /// The id of the node that produced this stream (for tests and tools).
  int node_id() const { return single_node("node_id"); }
  const std::shared_ptr<StreamGraph>& graph() const { return graph_; }
  /// The upstream ends of the edges the next transformation will create.
  const std::vector<detail::PendingInput>& pending_inputs() const { return inputs_; }

 protected:
  template <class U>
  friend class DataStream;
  template <class K, class V>
  friend class KeyedStream;

  template <class U, class Make>
  DataStream<U> transform(std::string name, bool stateful, Make make) {
    auto factory = std::make_shared<LambdaOperatorFactory>(
        [make]() -> std::unique_ptr<StreamOperatorBase> { return make(); }, stateful);
    int node = add_node(std::move(name), factory);
    detail::PendingInput p{node, PartitionerKind::kForward, false, "", std::make_shared<TypedEdgeOps<U>>()};
    graph_->node(node).output_ops = p.ops;
    return DataStream<U>(graph_, {p});
  }

  int add_node(std::string name, std::shared_ptr<OperatorFactory> factory) {
    int node = graph_->add_node(std::move(name), std::move(factory)).id;
    for (const auto& i : inputs_) {
      graph_->add_edge(i.node, node, i.partitioner, i.explicit_partitioner, i.side_output_tag, i.ops);
    }
    return node;
  }

  DataStream<T> repartition(PartitionerKind kind) const {
    std::vector<detail::PendingInput> in = inputs_;
    for (auto& i : in) {
      i.partitioner = kind;
      i.explicit_partitioner = true;
      i.ops = std::make_shared<TypedEdgeOps<T>>();
    }
    return DataStream<T>(graph_, std::move(in));
  }

  int single_node(const char* what) const {
    if (inputs_.size() != 1) {
      throw SluiceException(Error(ErrorCode::kGraph, std::string(what) +
                                                         "() applies to the stream of one operator; this stream is a "
                                                         "union of several"));
    }
    return inputs_[0].node;
  }
  StreamNode& node_for(const char* what) {
    if (inputs_.size() != 1 || inputs_[0].explicit_partitioner || !inputs_[0].side_output_tag.empty()) {
      throw SluiceException(
          Error(ErrorCode::kGraph, std::string(what) + "() configures the operator that produced a stream; call it "
                                                       "right after the transformation, before partitioning or union"));
    }
    return graph_->node(inputs_[0].node);
  }

  std::shared_ptr<StreamGraph> graph_;
  std::vector<detail::PendingInput> inputs_;
};

/// A stream partitioned by key K (Flink's KeyedStream). Stateful operations keep one value per key.
template <class K, class T>
class KeyedStream : public DataStream<T> {
 public:
  using KeyType = K;
  using Selector = std::function<K(const T&)>;

  template <class Sel>
  KeyedStream(std::shared_ptr<StreamGraph> graph, std::vector<detail::PendingInput> inputs, Sel selector)
      : DataStream<T>(std::move(graph), std::move(inputs)), selector_(std::move(selector)) {}

  /// Rolling reduce: for each record, emits reduce(previous aggregate of its key, record).
  /// R: `T(const T&, const T&)` or a ReduceFunction<T>.
  template <class R>
  DataStream<T> reduce(R reducer) {
    auto sel = selector_;
    return this->template transform<T>("Keyed Reduce", true, [sel, reducer]() {
      return std::make_unique<KeyedReduceOperator<K, T, Selector, R>>(sel, reducer);
    });
  }

  /// Rolling sum of a member; other members keep the values of the key's first record (as Flink).
  template <class M, class C = T>
  requires std::is_class_v<C> DataStream<T> sum(M C::*field) {
    return reduce([field](const T& a, const T& b) {
             T r = a;
             r.*field += b.*field;
             return r;
           })
        .name("Keyed Sum");
  }
  /// Rolling minimum of a member.
  template <class M, class C = T>
  requires std::is_class_v<C> DataStream<T> min(M C::*field) {
    return reduce([field](const T& a, const T& b) {
             T r = a;
             if (b.*field < r.*field) r.*field = b.*field;
             return r;
           })
        .name("Keyed Min");
  }
  /// Rolling maximum of a member.
  template <class M, class C = T>
  requires std::is_class_v<C> DataStream<T> max(M C::*field) {
    return reduce([field](const T& a, const T& b) {
             T r = a;
             if (r.*field < b.*field) r.*field = b.*field;
             return r;
           })
        .name("Keyed Max");
  }
  /// Rolling sum of element I of a pair or tuple (word count: `sum<1>()` over pair<string, int64_t>).
  template <size_t I>
  DataStream<T> sum() {
    return reduce([](const T& a, const T& b) {
             T r = a;
             std::get<I>(r) += std::get<I>(b);
             return r;
           })
        .name("Keyed Sum");
  }
  /// Rolling sum of arithmetic records.
  DataStream<T> sum() requires std::is_arithmetic_v<T> {
    return reduce([](const T& a, const T& b) { return static_cast<T>(a + b); }).name("Keyed Sum");
  }

  /// Cuts the keyed stream into windows (include sluice/api/windowed_stream.h).
  template <class Assigner>
  WindowedStream<K, T, typename Assigner::WindowType> window(std::shared_ptr<Assigner> assigner);

  /// The key selector (for operators built on this stream).
  const Selector& selector() const { return selector_; }

  /// Adds a one-input operator fed by this keyed stream (hash partitioned).
  template <class U, class Make>
  DataStream<U> add_transform(std::string name, bool stateful, Make make) {
    return this->template transform<U>(std::move(name), stateful, std::move(make));
  }

  /// Runs a KeyedProcessFunction<K, T, Out>.
  template <class P>
  DataStream<typename P::OutputType> process(P fn) {
    using Out = typename P::OutputType;
    static_assert(std::is_base_of_v<KeyedProcessFunction<K, T, Out>, P>,
                  "KeyedStream::process() takes a KeyedProcessFunction<K, T, Out>");
    auto sel = selector_;
    return this->template transform<Out>("Keyed Process", true, [sel, fn]() {
      return std::make_unique<KeyedProcessOperator<K, T, Out, Selector, P>>(sel, fn);
    });
  }

 private:
  Selector selector_;
};

}  // namespace sluice
