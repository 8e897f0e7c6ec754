// The stream graph: what the DataStream API builds. One StreamNode per transformation and one StreamEdge per
// connection, with the typed pieces (operator factory, edge ops) behind small virtual interfaces so that the
// graph and the runtime stay untyped. build_job_graph() (job_graph.h) chains it into a JobGraph.
//
// Not thread-safe: built on the user's thread before execution and read-only afterwards.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/api/operator.h"
#include "sluice/core/config.h"
#include "sluice/graph/exchange.h"

namespace sluice {

/// How records are spread over the consumer's subtasks (DESIGN.md §4).
enum class PartitionerKind {
  kForward,    ///< subtask i feeds subtask i (equal parallelism), the chaining edge
  kRebalance,  ///< round robin over all consumer subtasks
  kRescale,    ///< round robin over a local subset (pointwise connection)
  kBroadcast,  ///< every record to every consumer subtask
  kKeyGroup,   ///< by key group of the record's key (key_by)
};

/// Returns "forward", "rebalance", "rescale", "broadcast" or "hash".
const char* partitioner_name(PartitionerKind kind);

/// Whether producer subtasks connect to all consumer subtasks or to a subset (Flink's DistributionPattern).
inline bool is_pointwise(PartitionerKind k) {
  return k == PartitionerKind::kForward || k == PartitionerKind::kRescale;
}

/// Typed operations on the records of one edge (type T known only to the implementation).
class EdgeOps {
 public:
  virtual ~EdgeOps() = default;
  /// An output that calls `target` (an OneInputOperator<T>) directly: the chaining of two operators.
  virtual std::unique_ptr<OutputBase> make_chaining_output(StreamOperatorBase* target) const = 0;
  /// An output that serializes records into `writer`, choosing channels by `partitioner`.
  /// `max_parallelism` is the consumer's (for key groups); `subtask_index` the producer's.
  virtual std::unique_ptr<OutputBase> make_network_output(RecordWriterBase& writer, PartitionerKind partitioner,
                                                          int subtask_index, int max_parallelism) const = 0;
  /// An output that hands each record to every output in `outputs` (copies for all but the last).
  virtual std::unique_ptr<OutputBase> make_broadcasting_output(std::vector<OutputBase*> outputs) const = 0;
  /// An output that drops every record (for a main output nothing reads).
  virtual std::unique_ptr<OutputBase> make_discarding_output() const = 0;
  /// A RecordInput that deserializes records of T and feeds input `input_index` of `head`.
  virtual std::unique_ptr<RecordInput> make_record_input(StreamOperatorBase* head, int input_index) const = 0;
};

class SourceCoordinatorBase;
class TaskServices;

/// Creates the operator of a node, once per parallel subtask.
class OperatorFactory {
 public:
  virtual ~OperatorFactory() = default;
  /// `coordinator` is the job's coordinator for this node when it is a source (else nullptr).
  virtual std::unique_ptr<StreamOperatorBase> create(SourceCoordinatorBase* coordinator) const = 0;
  /// True for source operators (the runtime drives them instead of feeding them input).
  virtual bool is_source() const { return false; }
  /// Sources: creates the job-wide coordinator that runs the split enumerator; `restored` (nullable) is the
  /// coordinator's state from the checkpoint being restored.
  virtual std::shared_ptr<SourceCoordinatorBase> create_coordinator(int /*parallelism*/,
                                                                    const std::string* /*restored*/) const {
    return nullptr;
  }
  /// True when the operator keeps keyed or operator state (used for uid warnings).
  virtual bool is_stateful() const { return false; }
};

/// One transformation.
struct StreamNode {
  int id = 0;
  std::string name;                ///< display name ("Map", "Source: words", or what name() set)
  std::optional<std::string> uid;  ///< stable id set by the user
  std::string derived_uid;         ///< filled by build_job_graph when uid is unset
  int parallelism = -1;            ///< -1: the environment's default
  int max_parallelism = -1;        ///< -1: the environment's default (128)
  std::string slot_sharing_group = "default";
  bool chaining_disabled = false;
  bool is_sink = false;
  std::shared_ptr<OperatorFactory> factory;
  std::shared_ptr<EdgeOps> output_ops;  ///< typed by the node's main output type (null for sinks)
  std::vector<int> in_edges;            ///< edge ids, in creation order
  std::vector<int> out_edges;           ///< edge ids, in creation order
};

/// One connection between two nodes.
struct StreamEdge {
  int id = 0;
  int source = 0;
  int target = 0;
  PartitionerKind partitioner = PartitionerKind::kForward;
  bool partitioner_explicit = false;  ///< false: forward if parallelisms match, else rebalance (as Flink)
  std::string side_output_tag;        ///< "" for the main output
  std::shared_ptr<EdgeOps> ops;       ///< typed by the record type of the edge
  int input_index = 0;                ///< which input of the target (1 = the second input of a two-input operator)
};

/// The graph the API builds.
class StreamGraph {
 public:
  explicit StreamGraph(Configuration config) : config_(std::move(config)) {}

  StreamNode& add_node(std::string name, std::shared_ptr<OperatorFactory> factory);
  StreamEdge& add_edge(int source, int target, PartitionerKind kind, bool explicit_partitioner,
                       std::string side_output_tag, std::shared_ptr<EdgeOps> ops, int input_index = 0);

  StreamNode& node(int id) { return nodes_.at(static_cast<size_t>(id)); }
  const StreamNode& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  StreamEdge& edge(int id) { return edges_.at(static_cast<size_t>(id)); }
  const StreamEdge& edge(int id) const { return edges_.at(static_cast<size_t>(id)); }
  const std::vector<StreamNode>& nodes() const { return nodes_; }
  const std::vector<StreamEdge>& edges() const { return edges_; }
  Configuration& config() { return config_; }
  const Configuration& config() const { return config_; }

  /// The effective parallelism of a node (its own, or the configured default).
  int parallelism_of(const StreamNode& n) const;
  /// The effective max parallelism of a node.
  int max_parallelism_of(const StreamNode& n) const;

 private:
  Configuration config_;
  std::vector<StreamNode> nodes_;
  std::vector<StreamEdge> edges_;
};

}  // namespace sluice
