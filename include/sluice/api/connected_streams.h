// connect(): two streams of possibly different types feeding one two-input operator (Flink's
// ConnectedStreams and CoProcessFunction). The operator's watermark is the minimum of both inputs'.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "sluice/api/co_process_functions.h"
#include "sluice/api/data_stream.h"
#include "sluice/operators/co_process_operator.h"

namespace sluice {

/// Two streams connected for a two-input operator.
template <class T1, class T2>
class ConnectedStreams {
 public:
  ConnectedStreams(DataStream<T1> first, DataStream<T2> second)
      : first_(std::move(first)), second_(std::move(second)) {}

  /// Runs a CoProcessFunction<T1, T2, Out> over both inputs.
  template <class P>
  DataStream<typename P::OutputType> process(P fn) {
    using Out = typename P::OutputType;
    static_assert(std::is_base_of_v<CoProcessFunction<T1, T2, Out>, P>,
                  "ConnectedStreams::process() takes a CoProcessFunction<T1, T2, Out>");
    return add_two_input_node<Out>("Co-Process", false,
                                   [fn]() { return std::make_unique<CoProcessOperator<T1, T2, Out, P>>(fn); });
  }

  const DataStream<T1>& first() const { return first_; }
  const DataStream<T2>& second() const { return second_; }

  /// Adds a node fed by both inputs (input 0 from the first stream, input 1 from the second).
  template <class Out, class Make>
  DataStream<Out> add_two_input_node(std::string name, bool stateful, Make make) {
    auto graph = first_.graph();
    auto factory = std::make_shared<LambdaOperatorFactory>(
        [make]() -> std::unique_ptr<StreamOperatorBase> { return make(); }, stateful);
    int node = graph->add_node(std::move(name), factory).id;
    for (const auto& i : first_.pending_inputs()) {
      graph->add_edge(i.node, node, i.partitioner, i.explicit_partitioner, i.side_output_tag, i.ops, 0);
    }
    for (const auto& i : second_.pending_inputs()) {
      graph->add_edge(i.node, node, i.partitioner, i.explicit_partitioner, i.side_output_tag, i.ops, 1);
    }
    detail::PendingInput p{node, PartitionerKind::kForward, false, "", std::make_shared<TypedEdgeOps<Out>>()};
    graph->node(node).output_ops = p.ops;
    return DataStream<Out>(graph, {p});
  }

 private:
  DataStream<T1> first_;
  DataStream<T2> second_;
};

template <class T>
template <class U>
ConnectedStreams<T, U> DataStream<T>::connect(const DataStream<U>& other) const {
  if (other.graph() != graph_) {
    throw SluiceException(Error(ErrorCode::kGraph, "connect(): both streams must come from the same environment"));
  }
  return ConnectedStreams<T, U>(*this, other);
}

}  // namespace sluice
