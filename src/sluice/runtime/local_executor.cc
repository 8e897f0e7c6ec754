#include "sluice/runtime/local_executor.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "sluice/api/source_operator.h"
#include "sluice/graph/job_graph.h"
#include "sluice/runtime/buffer_pool.h"
#include "sluice/runtime/channel.h"
#include "sluice/runtime/task.h"

namespace sluice {

const char* job_status_name(JobStatus s) {
  switch (s) {
    case JobStatus::kCreated:
      return "CREATED";
    case JobStatus::kRunning:
      return "RUNNING";
    case JobStatus::kFinished:
      return "FINISHED";
    case JobStatus::kFailed:
      return "FAILED";
    case JobStatus::kCanceled:
      return "CANCELED";
  }
  return "UNKNOWN";
}

namespace {

std::string new_job_id() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;  // only for a unique id, never for data
  uint64_t a = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}{:016x}", a, counter.fetch_add(1) + 1);
}

class LocalJob final : public JobClient::Impl, public TaskListener {
 public:
  LocalJob(std::shared_ptr<StreamGraph> graph, std::string name, const Clock& clock)
      : graph_(std::move(graph)), name_(std::move(name)), id_(new_job_id()), clock_(clock) {}

  ~LocalJob() override {
    cancel();
    join_all();
  }

  Status deploy(const JobGraph& jg);
  void start();

  const std::string& job_id() const override { return id_; }
  JobStatus status() const override {
    std::lock_guard lock(mu_);
    return status_;
  }
  void cancel() override {
    {
      std::lock_guard lock(mu_);
      if (status_ != JobStatus::kRunning) return;
      cancel_requested_ = true;
    }
    for (auto& t : tasks_)
      t->cancel();
  }
  JobResult wait() override {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return terminal_; });
    }
    join_all();
    std::lock_guard lock(mu_);
    return result_;
  }
  bool wait_for(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return terminal_; });
  }

  void on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) override {
    bool cancel_others = false;
    {
      std::lock_guard lock(mu_);
      ++terminated_;
      if (state == TaskState::kFailed && !first_error_) {
        first_error_ = error.value_or(Error(ErrorCode::kRuntime, "task '" + task.display_name() + "' failed"));
        spdlog::error("job '{}' ({}) failed: {}", name_, id_, first_error_->to_string());
        cancel_others = true;
      }
    }
    if (cancel_others) {
      for (auto& t : tasks_)
        t->cancel();
    }
    std::lock_guard lock(mu_);
    if (terminated_ == tasks_.size()) finalize_locked();
  }

  const NetworkBufferPool* pool() const { return pool_.get(); }
  int task_count() const { return static_cast<int>(tasks_.size()); }

 private:
  void finalize_locked() {
    if (first_error_) {
      status_ = JobStatus::kFailed;
    } else if (cancel_requested_) {
      status_ = JobStatus::kCanceled;
    } else {
      status_ = JobStatus::kFinished;
    }
    for (auto& c : coordinators_)
      c.second->close();
    result_.job_id = id_;
    result_.job_name = name_;
    result_.status = status_;
    result_.error = first_error_;
    result_.duration = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_);
    result_.operators.clear();
    for (const auto& node : graph_->nodes()) {
      OperatorStats s;
      s.name = node.name;
      s.uid = node.uid.value_or(node.derived_uid);
      s.parallelism = node_parallelism_[static_cast<size_t>(node.id)];
      for (auto* op : node_operators_[static_cast<size_t>(node.id)]) {
        s.records_in += op->metrics().records_in.get();
        s.records_out += op->metrics().records_out.get();
      }
      result_.operators.push_back(std::move(s));
    }
    terminal_ = true;
    cv_.notify_all();
  }

  void join_all() {
    std::lock_guard lock(join_mu_);
    for (auto& t : tasks_)
      t->join();
  }

  std::shared_ptr<StreamGraph> graph_;
  std::string name_;
  std::string id_;
  const Clock& clock_;
  std::unique_ptr<NetworkBufferPool> pool_;
  std::vector<std::unique_ptr<LocalChannel>> channels_;
  std::map<int, std::shared_ptr<SourceCoordinatorBase>> coordinators_;
  std::vector<std::unique_ptr<Task>> tasks_;
  std::vector<std::vector<StreamOperatorBase*>> node_operators_;
  std::vector<int> node_parallelism_;
  std::chrono::steady_clock::time_point start_;

  mutable std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable cv_;
  JobStatus status_ = JobStatus::kCreated;
  bool cancel_requested_ = false;
  bool terminal_ = false;
  size_t terminated_ = 0;
  std::optional<Error> first_error_;
  JobResult result_;
};

Status LocalJob::deploy(const JobGraph& jg) {
  const Configuration& config = graph_->config();
  const int configured_slots = config.get(options::kTaskSlots);
  if (configured_slots > 0 && configured_slots < jg.required_slots) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("the job needs {} task slots (the largest parallelism of each slot sharing group, "
                             "summed) but {} = {}; raise it or lower the parallelism",
                             jg.required_slots, options::kTaskSlots.key, configured_slots));
  }
  const int64_t segment_size = config.get(options::kBufferSize);
  const int credits = config.get(options::kBuffersPerChannel);
  if (segment_size < 1024 || segment_size > (64 << 20)) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} = {} bytes; it must be between 1 KiB and 64 MiB",
                                                        options::kBufferSize.key, segment_size));
  }
  if (credits < 1) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} must be at least 1", options::kBuffersPerChannel.key));
  }

  // Channels per job edge: producer i feeds consumers targets[i].
  struct EdgeChannels {
    std::vector<std::vector<int>> targets;  // per producer subtask
  };
  std::vector<EdgeChannels> edge_channels(jg.edges.size());
  size_t channel_count = 0;
  for (const auto& e : jg.edges) {
    int ps = jg.vertices[static_cast<size_t>(e.source_vertex)].parallelism;
    int pt = jg.vertices[static_cast<size_t>(e.target_vertex)].parallelism;
    auto& ec = edge_channels[static_cast<size_t>(e.id)];
    ec.targets.resize(static_cast<size_t>(ps));
    for (int i = 0; i < ps; ++i) {
      if (is_pointwise(e.partitioner)) {
        ec.targets[static_cast<size_t>(i)] = pointwise_targets(ps, pt, i);
      } else {
        for (int j = 0; j < pt; ++j)
          ec.targets[static_cast<size_t>(i)].push_back(j);
      }
      channel_count += ec.targets[static_cast<size_t>(i)].size();
    }
  }
  const int64_t network_max = config.get(options::kNetworkMemoryMax);
  const long double needed = static_cast<long double>(channel_count) * credits * segment_size;
  if (needed > static_cast<long double>(network_max)) {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("the job's data exchange needs {} channels x {} buffers x {} bytes = {:.0f} MiB of network "
                    "buffers, above {} = {} MiB; lower the parallelism, {} or {}, or raise {}",
                    channel_count, credits, segment_size, static_cast<double>(needed) / (1 << 20),
                    options::kNetworkMemoryMax.key, network_max >> 20, options::kBuffersPerChannel.key,
                    options::kBufferSize.key, options::kNetworkMemoryMax.key));
  }
  pool_ = std::make_unique<NetworkBufferPool>(static_cast<uint32_t>(segment_size),
                                              channel_count * static_cast<size_t>(credits));

  // Coordinators of sources.
  for (const auto& node : graph_->nodes()) {
    if (node.factory->is_source()) {
      coordinators_[node.id] = node.factory->create_coordinator(jg.node_parallelism[static_cast<size_t>(node.id)]);
    }
  }

  // Tasks, vertex by vertex.
  std::vector<std::vector<Task*>> vertex_tasks(jg.vertices.size());
  const int64_t buffer_timeout = config.get(options::kBufferTimeout);
  for (const auto& v : jg.vertices) {
    for (int i = 0; i < v.parallelism; ++i) {
      Task::Options o;
      o.vertex_name = v.name;
      o.subtask_index = i;
      o.parallelism = v.parallelism;
      o.clock = &clock_;
      o.buffer_timeout_ms = buffer_timeout;
      tasks_.push_back(std::make_unique<Task>(o, *this));
      vertex_tasks[static_cast<size_t>(v.id)].push_back(tasks_.back().get());
    }
  }

  // Channels and writers. writers[edge][producer subtask]; receivers[vertex][consumer subtask][input index].
  std::vector<std::vector<RecordWriter*>> writers(jg.edges.size());
  std::vector<std::vector<std::vector<std::vector<ChannelReceiver*>>>> receivers(jg.vertices.size());
  for (const auto& v : jg.vertices) {
    receivers[static_cast<size_t>(v.id)].assign(static_cast<size_t>(v.parallelism),
                                                std::vector<std::vector<ChannelReceiver*>>(2));
  }
  for (const auto& e : jg.edges) {
    const auto& ec = edge_channels[static_cast<size_t>(e.id)];
    for (size_t i = 0; i < ec.targets.size(); ++i) {
      std::vector<ChannelSender*> senders;
      for (int j : ec.targets[i]) {
        auto buffers = pool_->allocate(static_cast<size_t>(credits));
        if (!buffers.ok()) return buffers.error();
        channels_.push_back(std::make_unique<LocalChannel>(*pool_, std::move(*buffers)));
        senders.push_back(channels_.back().get());
        const int input_index = graph_->edge(e.stream_edge).input_index;
        receivers[static_cast<size_t>(e.target_vertex)][static_cast<size_t>(j)][static_cast<size_t>(input_index)]
            .push_back(channels_.back().get());
      }
      writers[static_cast<size_t>(e.id)].push_back(
          vertex_tasks[static_cast<size_t>(e.source_vertex)][i]->add_record_writer(std::move(senders)));
    }
  }

  // Operators, outputs and inputs per task.
  node_operators_.resize(graph_->nodes().size());
  node_parallelism_ = jg.node_parallelism;
  std::map<int, int> job_edge_of_stream_edge;
  for (const auto& e : jg.edges)
    job_edge_of_stream_edge[e.stream_edge] = e.id;
  for (const auto& v : jg.vertices) {
    for (int i = 0; i < v.parallelism; ++i) {
      Task* task = vertex_tasks[static_cast<size_t>(v.id)][static_cast<size_t>(i)];
      std::map<int, StreamOperatorBase*> op_of_node;
      std::map<int, TaskRuntimeContext*> ctx_of_node;
      for (int nid : v.chained_nodes) {
        const StreamNode& node = graph_->node(nid);
        auto it = coordinators_.find(nid);
        auto op = node.factory->create(it == coordinators_.end() ? nullptr : it->second.get());
        auto ctx = std::make_unique<TaskRuntimeContext>(node.name, i, v.parallelism,
                                                        jg.node_max_parallelism[static_cast<size_t>(nid)], 0, clock_);
        ctx_of_node[nid] = ctx.get();
        op_of_node[nid] = task->add_operator(std::move(op), std::move(ctx));
        node_operators_[static_cast<size_t>(nid)].push_back(op_of_node[nid]);
      }
      // Outputs: tail first so chained targets exist; edges grouped by side-output tag.
      for (auto it = v.chained_nodes.rbegin(); it != v.chained_nodes.rend(); ++it) {
        const StreamNode& node = graph_->node(*it);
        std::map<std::string, std::vector<std::pair<const StreamEdge*, OutputBase*>>> by_tag;
        for (int eid : node.out_edges) {
          const StreamEdge& se = graph_->edge(eid);
          OutputBase* out = nullptr;
          if (jg.vertex_of_node[static_cast<size_t>(se.target)] == v.id) {
            out = task->own_output(se.ops->make_chaining_output(op_of_node.at(se.target)));
          } else {
            int je = job_edge_of_stream_edge.at(eid);
            RecordWriter* w = writers[static_cast<size_t>(je)][static_cast<size_t>(i)];
            out = task->own_output(se.ops->make_network_output(
                *w, se.partitioner, i, jg.node_max_parallelism[static_cast<size_t>(se.target)]));
          }
          by_tag[se.side_output_tag].push_back({&se, out});
        }
        std::unordered_map<std::string, OutputBase*> outputs;
        if (by_tag.find("") == by_tag.end() && node.output_ops != nullptr) {
          // Nothing reads the main output (only side outputs, or a dangling operator): drop its records.
          outputs[""] = task->own_output(node.output_ops->make_discarding_output());
        }
        for (auto& [tag, outs] : by_tag) {
          if (outs.size() == 1) {
            outputs[tag] = outs[0].second;
          } else {
            std::vector<OutputBase*> list;
            for (auto& p : outs)
              list.push_back(p.second);
            outputs[tag] = task->own_output(outs[0].first->ops->make_broadcasting_output(std::move(list)));
          }
        }
        op_of_node.at(*it)->setup(ctx_of_node.at(*it), task, std::move(outputs));
      }
      // One input processor per input index of the head (two for connect and joins).
      for (int input_index = 0; input_index < 2; ++input_index) {
        const JobEdge* first = nullptr;
        for (int je : v.inputs) {
          const JobEdge& e = jg.edges[static_cast<size_t>(je)];
          if (graph_->edge(e.stream_edge).input_index == input_index) {
            first = &e;
            break;
          }
        }
        if (first == nullptr) continue;
        auto input =
            graph_->edge(first->stream_edge).ops->make_record_input(op_of_node.at(v.chained_nodes[0]), input_index);
        task->add_input(receivers[static_cast<size_t>(v.id)][static_cast<size_t>(i)][static_cast<size_t>(input_index)],
                        std::move(input));
      }
    }
  }
  return ok_status();
}

void LocalJob::start() {
  {
    std::lock_guard lock(mu_);
    status_ = JobStatus::kRunning;
    start_ = std::chrono::steady_clock::now();
  }
  spdlog::info("job '{}' ({}) starting with {} tasks", name_, id_, tasks_.size());
  for (auto& t : tasks_)
    t->start();
}

}  // namespace

Result<JobClient> submit_local_job(std::shared_ptr<StreamGraph> graph, std::string job_name, const Clock& clock,
                                   LocalJobProbe* probe) {
  Result<JobGraph> jg = [&]() -> Result<JobGraph> {
    try {
      return build_job_graph(*graph);
    } catch (const SluiceException& e) {
      return e.error();
    }
  }();
  if (!jg.ok()) return jg.error();
  auto job = std::make_shared<LocalJob>(graph, std::move(job_name), clock);
  try {
    Status st = job->deploy(*jg);
    if (!st.ok()) return st.error();
  } catch (const SluiceException& e) {
    return e.error();
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::kConfiguration,
                 "out of memory while deploying the job (network buffers, operators); lower the parallelism or "
                 "the network memory options");
  }
  if (probe != nullptr) {
    probe->buffer_pool = job->pool();
    probe->task_count = job->task_count();
  }
  job->start();
  return JobClient(job);
}

}  // namespace sluice
