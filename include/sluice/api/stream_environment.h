// StreamEnvironment: where a job starts (Flink's StreamExecutionEnvironment). It holds the configuration,
// creates source streams and runs the job on the local mini-cluster.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/connected_streams.h"
#include "sluice/api/data_stream.h"
#include "sluice/api/job.h"
#include "sluice/api/joins.h"
#include "sluice/api/windowed_stream.h"
#include "sluice/core/clock.h"
#include "sluice/core/config.h"
#include "sluice/operators/source_operator.h"

namespace sluice {

struct LocalJobProbe;

/// Not thread-safe: build and execute a job from one thread. execute() consumes the graph built so far.
class StreamEnvironment {
 public:
  explicit StreamEnvironment(Configuration config = {});

  /// An environment configured from command-line flags (`-p 4`, `-Dkey=value`, `--key=value`).
  /// Throws SluiceException (kConfiguration) on a malformed flag.
  static StreamEnvironment from_args(int argc, const char* const* argv);

  Configuration& config() { return graph_->config(); }
  /// Default parallelism of operators that do not set their own.
  StreamEnvironment& set_parallelism(int parallelism);
  /// Default max parallelism (number of key groups).
  StreamEnvironment& set_max_parallelism(int max_parallelism);
  /// The processing-time clock (a ManualClock in tests). Must outlive execution.
  StreamEnvironment& set_clock(const Clock& clock) {
    clock_ = &clock;
    return *this;
  }

  /// A stream read from a split-based source; records keep the timestamps the reader attached and no
  /// watermarks are generated (except the final one of a bounded source).
  template <class Src>
  DataStream<typename Src::RecordType> from_source(std::shared_ptr<Src> source, std::string name) {
    return from_source_impl(std::move(source), nullptr, std::move(name));
  }

  /// A stream read from a split-based source with event timestamps and watermarks generated per split.
  template <class Src>
  DataStream<typename Src::RecordType> from_source(std::shared_ptr<Src> source,
                                                   const WatermarkStrategy<typename Src::RecordType>& strategy,
                                                   std::string name) {
    return from_source_impl(std::move(source),
                            std::make_shared<const WatermarkStrategy<typename Src::RecordType>>(strategy),
                            std::move(name));
  }

 private:
  template <class Src>
  DataStream<typename Src::RecordType> from_source_impl(
      std::shared_ptr<Src> source, std::shared_ptr<const WatermarkStrategy<typename Src::RecordType>> strategy,
      std::string name) {
    using T = typename Src::RecordType;
    using SplitT = typename Src::SplitType;
    std::shared_ptr<const Source<T, SplitT>> base = std::move(source);
    // A malformed interval is reported by execute() (validate_engine_options); use the default until then.
    int64_t interval = options::kAutoWatermarkInterval.default_value;
    try {
      interval = graph_->config().get(options::kAutoWatermarkInterval);
    } catch (const SluiceException&) {
    }
    auto factory = std::make_shared<SourceOperatorFactory<T, SplitT>>(std::move(base), std::move(strategy), interval);
    int node = graph_->add_node("Source: " + name, factory).id;
    detail::PendingInput p{node, PartitionerKind::kForward, false, "", std::make_shared<TypedEdgeOps<T>>()};
    graph_->node(node).output_ops = p.ops;
    return DataStream<T>(graph_, {p});
  }

 public:
  /// Runs the job and blocks until it ends. Graph and configuration errors come back as a failed JobResult.
  JobResult execute(std::string job_name = "Sluice Job");
  /// Starts the job and returns a client to cancel or wait for it. Throws SluiceException when the job cannot
  /// start (graph or configuration error).
  JobClient execute_async(std::string job_name = "Sluice Job", LocalJobProbe* probe = nullptr);

  /// The graph built so far (for tests and tools).
  const StreamGraph& stream_graph() const { return *graph_; }

 private:
  std::shared_ptr<StreamGraph> graph_;
  const Clock* clock_ = &SystemClock::instance();
};

}  // namespace sluice
