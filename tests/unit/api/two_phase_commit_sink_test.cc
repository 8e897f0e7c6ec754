// Unit tests of TwoPhaseCommitSinkOperator (and SinkOperator's flush on snapshot), driven by hand: open,
// records, snapshot_state, notify_checkpoint_complete / aborted, finish, and restores from the bytes of an
// operator state snapshot, with a recording transactional sink.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/api/data_stream.h"
#include "sluice/api/sink.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/fault_points.h"
#include "sluice/operators/sink_operator.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---------------------------------------------------------------------------------------------------------
// A recording transactional sink: a writer buffers records in an open transaction "t<subtask>-<k>";
// prepare_commit pre-commits it; commit makes its records visible once (a repeated commit is counted, not
// applied); abort_lingering aborts this subtask's open and prepared transactions not named by the restored
// committables.

struct Txn {
  std::string id;
  std::vector<std::string> records;
  friend bool operator==(const Txn&, const Txn&) = default;
};
SLUICE_FIELDS(Txn, id, records);

/// The "external system" the sink writes to; shared by every run (operator instance) of a test.
struct TxnStore {
  std::map<std::string, int> next_txn;  // per subtask prefix
  std::set<std::string> open;           // written to, not prepared
  std::set<std::string> prepared;       // pre-committed, not committed
  std::set<std::string> committed;
  std::set<std::string> aborted;
  std::vector<std::string> visible;               // records of committed transactions, in commit order
  std::vector<std::vector<std::string>> commits;  // the transaction ids of each Committer::commit call
  int repeated_commits = 0;
  std::vector<std::vector<std::string>> abort_lingering_calls;  // restored transaction ids, per call
  std::vector<std::string> flushes;                             // "false" / "true"
};

std::string prefix_of(int subtask) {
  return "t" + std::to_string(subtask) + "-";
}

class TxnWriter final : public PrecommittingSinkWriter<std::string, Txn> {
 public:
  TxnWriter(std::shared_ptr<TxnStore> store, int subtask) : store_(std::move(store)), subtask_(subtask) {}
  void write(const std::string& record, const SinkWriterContext&) override {
    if (!current_) {
      const std::string prefix = prefix_of(subtask_);
      current_ = Txn{prefix + std::to_string(store_->next_txn[prefix]++), {}};
      store_->open.insert(current_->id);
    }
    current_->records.push_back(record);
  }
  void flush(bool end_of_input) override { store_->flushes.push_back(end_of_input ? "true" : "false"); }
  std::vector<Txn> prepare_commit() override {
    if (!current_) return {};
    store_->open.erase(current_->id);
    store_->prepared.insert(current_->id);
    std::vector<Txn> out{std::move(*current_)};
    current_.reset();
    return out;
  }

 private:
  std::shared_ptr<TxnStore> store_;
  int subtask_;
  std::optional<Txn> current_;
};

class TxnCommitter final : public Committer<Txn> {
 public:
  explicit TxnCommitter(std::shared_ptr<TxnStore> store) : store_(std::move(store)) {}
  void commit(std::vector<Txn>& committables) override {
    std::vector<std::string> ids;
    for (const Txn& t : committables) {
      ids.push_back(t.id);
      if (store_->committed.contains(t.id)) {
        ++store_->repeated_commits;
        continue;
      }
      if (!store_->prepared.erase(t.id)) throw std::runtime_error("commit of a transaction never prepared: " + t.id);
      store_->committed.insert(t.id);
      store_->visible.insert(store_->visible.end(), t.records.begin(), t.records.end());
    }
    store_->commits.push_back(std::move(ids));
  }
  void abort_lingering(RuntimeContext& ctx, const std::vector<Txn>& restored) override {
    std::set<std::string> keep;
    std::vector<std::string> ids;
    for (const Txn& t : restored) {
      keep.insert(t.id);
      ids.push_back(t.id);
    }
    store_->abort_lingering_calls.push_back(ids);
    const std::string prefix = prefix_of(ctx.subtask_index());
    for (std::set<std::string>* set : {&store_->open, &store_->prepared}) {
      for (auto it = set->begin(); it != set->end();) {
        if (it->starts_with(prefix) && !keep.contains(*it)) {
          store_->aborted.insert(*it);
          it = set->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

 private:
  std::shared_ptr<TxnStore> store_;
};

class TxnSink final : public TwoPhaseCommittingSink<std::string, Txn> {
 public:
  explicit TxnSink(std::shared_ptr<TxnStore> store) : store_(std::move(store)) {}
  std::unique_ptr<PrecommittingSinkWriter<std::string, Txn>> create_precommitting_writer(
      RuntimeContext& ctx) const override {
    return std::make_unique<TxnWriter>(store_, ctx.subtask_index());
  }
  std::unique_ptr<Committer<Txn>> create_committer(RuntimeContext&) const override {
    return std::make_unique<TxnCommitter>(store_);
  }

 private:
  std::shared_ptr<TxnStore> store_;
};

// ---------------------------------------------------------------------------------------------------------
// Driving an operator by hand

class TestContext final : public RuntimeContext {
 public:
  TestContext(int subtask, int parallelism, int attempt, bool checkpointing)
      : subtask_(subtask), parallelism_(parallelism), attempt_(attempt), checkpointing_(checkpointing) {}
  const std::string& operator_name() const override { return name_; }
  int subtask_index() const override { return subtask_; }
  int parallelism() const override { return parallelism_; }
  int max_parallelism() const override { return 128; }
  int attempt_number() const override { return attempt_; }
  const Clock& clock() const override { return clock_; }
  OperatorStateStore& operator_state() override { return store_; }
  bool is_checkpointing_enabled() const override { return checkpointing_; }

 private:
  std::string name_ = "Sink: out";
  int subtask_, parallelism_, attempt_;
  bool checkpointing_;
  ManualClock clock_;
  OperatorStateStore store_;
};

/// One run of one subtask of the sink operator.
template <class Op>
class OperatorRun {
 public:
  struct Options {
    int subtask = 0;
    int parallelism = 1;
    int attempt = 0;
    bool checkpointing = true;
    std::optional<std::string> restored_state;  // the subtask's (redistributed) operator state snapshot
  };
  template <class SinkPtr>
  OperatorRun(SinkPtr sink, Options o)
      : ctx_(o.subtask, o.parallelism, o.attempt, o.checkpointing), op_(std::move(sink)) {
    if (o.restored_state) {
      DataInput in(*o.restored_state);
      Status st = ctx_.operator_state().restore(in);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
    }
    op_.setup(&ctx_, nullptr, {});
  }
  Op& op() { return op_; }
  void open() { op_.open(); }
  void write(std::string r) { op_.process_element(std::move(r), kNoTimestamp); }
  /// snapshot_state(id), then the bytes the runtime would store for the operator state.
  std::string snapshot(int64_t id) {
    op_.snapshot_state(id);
    DataOutput out;
    ctx_.operator_state().snapshot(out);
    return std::string(out.view());
  }

 private:
  TestContext ctx_;
  Op op_;
};

using TxnOperator = TwoPhaseCommitSinkOperator<std::string, Txn>;
using TxnRun = OperatorRun<TxnOperator>;

/// The snapshot new subtask `index` of `parallelism` restores from the old subtasks' snapshots.
std::string redistribute(const std::vector<std::string>& old, int parallelism, int index) {
  std::vector<std::string_view> views(old.begin(), old.end());
  DataOutput out;
  Status st = OperatorStateStore::redistribute(views, parallelism, index, out);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
  return std::string(out.view());
}

class TwoPhaseCommitSinkOperatorTest : public ::testing::Test {
 protected:
  void TearDown() override { fault::disarm_all(); }
  std::shared_ptr<TxnStore> store_ = std::make_shared<TxnStore>();
  std::shared_ptr<TxnSink> sink_ = std::make_shared<TxnSink>(store_);
};

TEST_F(TwoPhaseCommitSinkOperatorTest, CommitsOnlyWhenTheCheckpointCompletes) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  run.write("b");
  run.snapshot(1);
  EXPECT_THAT(store_->flushes, ElementsAre("false"));
  EXPECT_THAT(store_->prepared, ElementsAre("t0-0"));
  EXPECT_THAT(store_->visible, IsEmpty());
  EXPECT_THAT(run.op().pending_checkpoint_ids(), ElementsAre(1));
  run.op().notify_checkpoint_complete(1);
  EXPECT_THAT(store_->visible, ElementsAre("a", "b"));
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0")));
  EXPECT_THAT(run.op().pending_checkpoint_ids(), IsEmpty());
  // A checkpoint with nothing written pre-commits nothing, and its completion commits nothing.
  run.snapshot(2);
  run.op().notify_checkpoint_complete(2);
  EXPECT_EQ(store_->commits.size(), 1U);
  run.op().close();
}

TEST_F(TwoPhaseCommitSinkOperatorTest, ACompletedCheckpointCommitsEveryEarlierOneInIdOrder) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  run.snapshot(1);
  run.write("b");
  run.snapshot(2);
  run.write("c");
  run.snapshot(3);
  EXPECT_THAT(run.op().pending_checkpoint_ids(), ElementsAre(1, 2, 3));
  run.op().notify_checkpoint_complete(2);
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0"), ElementsAre("t0-1")));
  EXPECT_THAT(store_->visible, ElementsAre("a", "b"));
  EXPECT_THAT(run.op().pending_checkpoint_ids(), ElementsAre(3));
  // A late notification of an older checkpoint changes nothing.
  run.op().notify_checkpoint_complete(1);
  EXPECT_EQ(store_->commits.size(), 2U);
  run.op().notify_checkpoint_complete(3);
  EXPECT_THAT(store_->visible, ElementsAre("a", "b", "c"));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, AnAbortedCheckpointIsCommittedWithTheNextCompletedOne) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  run.snapshot(1);
  run.op().notify_checkpoint_aborted(1);
  EXPECT_THAT(store_->visible, IsEmpty());
  EXPECT_THAT(run.op().pending_checkpoint_ids(), ElementsAre(1));
  run.write("b");
  run.snapshot(2);
  run.op().notify_checkpoint_complete(2);
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0"), ElementsAre("t0-1")));
  EXPECT_THAT(store_->visible, ElementsAre("a", "b"));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, TheStateHoldsEveryPendingCommittableWithItsCheckpointId) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  run.snapshot(1);
  run.write("b");
  std::string state = run.snapshot(2);
  OperatorStateStore restored;
  DataInput in(state);
  ASSERT_TRUE(restored.restore(in).ok());
  using Entry = TxnOperator::StateEntry;
  EXPECT_THAT(restored.get_union_list_state<Entry>(TxnOperator::kStateName).get(),
              ElementsAre(Entry{1, Txn{"t0-0", {"a"}}}, Entry{2, Txn{"t0-1", {"b"}}}));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, ARestoreCommitsWhatTheCheckpointPreCommittedAndAbortsTheRest) {
  std::string chk2;
  {
    TxnRun run(sink_, {});
    run.open();
    run.write("a");
    run.snapshot(1);
    run.op().notify_checkpoint_complete(1);  // t0-0 committed
    run.write("b");
    chk2 = run.snapshot(2);  // t0-1 pre-committed; checkpoint 2 completes but the task fails before the notify
    run.write("c");
    run.snapshot(3);  // t0-2 pre-committed by a checkpoint that never completes
    run.write("d");   // t0-3 open
    run.op().close();
  }
  EXPECT_THAT(store_->visible, ElementsAre("a"));

  TxnRun run(sink_, {.attempt = 1, .restored_state = chk2});
  run.open();
  EXPECT_THAT(store_->commits.back(), ElementsAre("t0-1"));
  EXPECT_THAT(store_->visible, ElementsAre("a", "b"));
  EXPECT_THAT(store_->abort_lingering_calls.back(), ElementsAre("t0-1"));
  EXPECT_THAT(store_->aborted, UnorderedElementsAre("t0-2", "t0-3"));
  EXPECT_THAT(store_->prepared, IsEmpty());
  EXPECT_THAT(store_->open, IsEmpty());
  EXPECT_THAT(run.op().pending_checkpoint_ids(), IsEmpty());
  // The restored committables are not carried into the next checkpoint.
  run.write("e");
  std::string chk3 = run.snapshot(3);
  OperatorStateStore s;
  DataInput in(chk3);
  ASSERT_TRUE(s.restore(in).ok());
  EXPECT_EQ(s.get_union_list_state<TxnOperator::StateEntry>(TxnOperator::kStateName).get().size(), 1U);
  run.op().notify_checkpoint_complete(3);
  EXPECT_THAT(store_->visible, ElementsAre("a", "b", "e"));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, CommittingAgainAfterARestoreIsANoOp) {
  std::string chk1;
  {
    TxnRun run(sink_, {});
    run.open();
    run.write("a");
    chk1 = run.snapshot(1);
    run.op().notify_checkpoint_complete(1);  // committed; the task fails before checkpoint 2
  }
  TxnRun run(sink_, {.attempt = 1, .restored_state = chk1});
  run.open();
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0"), ElementsAre("t0-0")));
  EXPECT_EQ(store_->repeated_commits, 1);
  EXPECT_THAT(store_->visible, ElementsAre("a"));
  EXPECT_THAT(store_->aborted, IsEmpty());
}

TEST_F(TwoPhaseCommitSinkOperatorTest, ARestoreCommitsSeveralCheckpointsInIdOrder) {
  std::string chk3;
  {
    TxnRun run(sink_, {});
    run.open();
    run.write("a");
    run.snapshot(1);
    run.op().notify_checkpoint_aborted(1);
    run.write("b");
    run.snapshot(2);
    run.write("c");
    chk3 = run.snapshot(3);
  }
  TxnRun run(sink_, {.attempt = 1, .restored_state = chk3});
  run.open();
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0"), ElementsAre("t0-1"), ElementsAre("t0-2")));
  EXPECT_THAT(store_->visible, ElementsAre("a", "b", "c"));
  EXPECT_THAT(store_->abort_lingering_calls.back(), ElementsAre("t0-0", "t0-1", "t0-2"));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, AFreshStartAbortsWhatAPreviousRunLeft) {
  store_->open.insert("t0-7");
  store_->prepared.insert("t0-8");
  store_->prepared.insert("t1-3");  // another subtask's
  TxnRun run(sink_, {.parallelism = 2});
  run.open();
  EXPECT_THAT(store_->abort_lingering_calls, ElementsAre(IsEmpty()));
  EXPECT_THAT(store_->aborted, UnorderedElementsAre("t0-7", "t0-8"));
  EXPECT_THAT(store_->prepared, ElementsAre("t1-3"));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, AfterAChangeOfParallelismEachCommittableIsCommittedOnceAndNoneAborted) {
  std::vector<std::string> old;
  for (int s = 0; s < 2; ++s) {
    TxnRun run(sink_, {.subtask = s, .parallelism = 2});
    run.open();
    for (int k = 0; k < 4; ++k) {
      run.write("s" + std::to_string(s) + "r" + std::to_string(k));
      if (k < 3) run.snapshot(k + 1);
    }
    old.push_back(run.snapshot(4));  // 4 committables per old subtask, none committed
  }
  for (int p : {1, 3}) {
    auto store = std::make_shared<TxnStore>(*store_);
    auto sink = std::make_shared<TxnSink>(store);
    std::vector<std::unique_ptr<TxnRun>> runs;
    for (int s = 0; s < p; ++s) {
      runs.push_back(std::make_unique<TxnRun>(
          sink,
          TxnRun::Options{.subtask = s, .parallelism = p, .attempt = 1, .restored_state = redistribute(old, p, s)}));
      runs.back()->open();
    }
    std::vector<std::string> committed_ids;
    for (size_t i = store_->commits.size(); i < store->commits.size(); ++i)
      committed_ids.insert(committed_ids.end(), store->commits[i].begin(), store->commits[i].end());
    std::sort(committed_ids.begin(), committed_ids.end());
    EXPECT_THAT(committed_ids, ElementsAre("t0-0", "t0-1", "t0-2", "t0-3", "t1-0", "t1-1", "t1-2", "t1-3")) << p;
    EXPECT_EQ(store->repeated_commits, 0) << p;
    EXPECT_THAT(store->aborted, IsEmpty()) << p;
    EXPECT_THAT(store->prepared, IsEmpty()) << p;
    EXPECT_EQ(store->visible.size(), 8U) << p;
    // Every new subtask's abort_lingering saw every restored committable.
    for (size_t i = store_->abort_lingering_calls.size(); i < store->abort_lingering_calls.size(); ++i)
      EXPECT_EQ(store->abort_lingering_calls[i].size(), 8U) << p;
  }
}

TEST_F(TwoPhaseCommitSinkOperatorTest, WithoutCheckpointingFinishCommitsEverything) {
  TxnRun run(sink_, {.checkpointing = false});
  run.open();
  run.write("a");
  run.write("b");
  run.op().end_input();
  run.op().finish();
  EXPECT_THAT(store_->flushes, ElementsAre("true"));
  EXPECT_THAT(store_->visible, ElementsAre("a", "b"));
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0")));
  run.op().close();
}

TEST_F(TwoPhaseCommitSinkOperatorTest, WithCheckpointingTheFinalCheckpointCommitsWhatFinishLeft) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  run.snapshot(1);
  run.write("b");
  run.op().end_input();
  run.op().finish();
  EXPECT_THAT(store_->visible, IsEmpty());
  run.snapshot(2);
  EXPECT_THAT(store_->flushes, ElementsAre("false", "true"));
  run.op().notify_checkpoint_complete(2);
  EXPECT_THAT(store_->commits, ElementsAre(ElementsAre("t0-0"), ElementsAre("t0-1")));
  EXPECT_THAT(store_->visible, ElementsAre("a", "b"));
  run.op().close();
}

TEST_F(TwoPhaseCommitSinkOperatorTest, AFaultAfterPreCommitLeavesTheCommittablesPending) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  std::string chk1 = run.snapshot(1);
  fault::arm("sink.after-precommit:Sink: out", 0);
  EXPECT_THROW(run.op().notify_checkpoint_complete(1), OperatorException);
  EXPECT_EQ(fault::fired("sink.after-precommit:Sink: out"), 1);
  EXPECT_THAT(store_->visible, IsEmpty());
  EXPECT_THAT(run.op().pending_checkpoint_ids(), ElementsAre(1));
  // The restore commits it.
  TxnRun restored(sink_, {.attempt = 1, .restored_state = chk1});
  restored.open();
  EXPECT_THAT(store_->visible, ElementsAre("a"));
}

TEST_F(TwoPhaseCommitSinkOperatorTest, ACommitFailureFailsTheTaskNamingTheOperator) {
  TxnRun run(sink_, {});
  run.open();
  run.write("a");
  run.snapshot(1);
  store_->prepared.clear();  // the commit throws: never prepared
  try {
    run.op().notify_checkpoint_complete(1);
    FAIL() << "expected a throw";
  } catch (const OperatorException& e) {
    EXPECT_EQ(e.operator_name(), "Sink: out");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("t0-0"));
  }
  EXPECT_THAT(run.op().pending_checkpoint_ids(), ElementsAre(1));
}

// ---------------------------------------------------------------------------------------------------------
// SinkOperator (plain sinks, and two-phase-commit sinks passed as a plain Sink)

class RecordingSink final : public Sink<std::string> {
 public:
  explicit RecordingSink(std::shared_ptr<std::vector<std::string>> log) : log_(std::move(log)) {}
  std::unique_ptr<SinkWriter<std::string>> create_writer(RuntimeContext&) const override {
    return std::make_unique<Writer>(log_);
  }

 private:
  class Writer final : public SinkWriter<std::string> {
   public:
    explicit Writer(std::shared_ptr<std::vector<std::string>> log) : log_(std::move(log)) {}
    void write(const std::string& r, const SinkWriterContext&) override { log_->push_back("write " + r); }
    void flush(bool end_of_input) override { log_->push_back(end_of_input ? "flush end" : "flush"); }

   private:
    std::shared_ptr<std::vector<std::string>> log_;
  };
  std::shared_ptr<std::vector<std::string>> log_;
};

TEST(SinkOperatorTest, FlushesOnSnapshot) {
  auto log = std::make_shared<std::vector<std::string>>();
  OperatorRun<SinkOperator<std::string>> run(std::make_shared<const RecordingSink>(log), {});
  run.open();
  run.write("a");
  run.snapshot(1);
  run.write("b");
  run.op().finish();
  EXPECT_THAT(*log, ElementsAre("write a", "flush", "write b", "flush end"));
}

TEST(SinkOperatorTest, RunsATwoPhaseCommitSinkAtLeastOnceCommittingOnEveryFlush) {
  auto store = std::make_shared<TxnStore>();
  store->open.insert("t0-9");  // left by a previous run
  std::shared_ptr<const Sink<std::string>> sink = std::make_shared<TxnSink>(store);
  OperatorRun<SinkOperator<std::string>> run(sink, {});
  run.open();
  EXPECT_THAT(store->aborted, ElementsAre("t0-9"));
  run.write("a");
  run.snapshot(1);
  EXPECT_THAT(store->visible, ElementsAre("a"));
  run.write("b");
  run.op().finish();
  EXPECT_THAT(store->visible, ElementsAre("a", "b"));
}

// ---------------------------------------------------------------------------------------------------------
// DataStream::sink_to picks the operator from the sink's static type

TEST(SinkToTest, ATwoPhaseCommittingSinkGetsTheTwoPhaseCommitOperator) {
  static_assert(TwoPhaseCommittingSinkOf<TxnSink, std::string>);
  static_assert(TwoPhaseCommittingSinkOf<const TxnSink, std::string>);
  static_assert(!TwoPhaseCommittingSinkOf<RecordingSink, std::string>);
  static_assert(!TwoPhaseCommittingSinkOf<Sink<std::string>, std::string>);

  auto graph = std::make_shared<StreamGraph>(Configuration{});
  auto source = std::make_shared<LambdaOperatorFactory>([] { return std::unique_ptr<StreamOperatorBase>(); }, false);
  const int src = graph->add_node("src", source).id;
  DataStream<std::string> stream(graph, {detail::PendingInput{src, PartitionerKind::kForward, false, "",
                                                              std::make_shared<TypedEdgeOps<std::string>>()}});
  auto store = std::make_shared<TxnStore>();
  const int two_pc = stream.sink_to(std::make_shared<TxnSink>(store)).node_id();
  const int erased =
      stream.sink_to(std::shared_ptr<const Sink<std::string>>(std::make_shared<TxnSink>(store))).node_id();
  const int plain = stream.sink_to(std::make_shared<RecordingSink>(nullptr)).node_id();
  EXPECT_TRUE(graph->node(two_pc).is_sink);
  EXPECT_NE(dynamic_cast<TxnOperator*>(graph->node(two_pc).factory->create(nullptr).get()), nullptr);
  EXPECT_NE(dynamic_cast<SinkOperator<std::string>*>(graph->node(erased).factory->create(nullptr).get()), nullptr);
  EXPECT_NE(dynamic_cast<SinkOperator<std::string>*>(graph->node(plain).factory->create(nullptr).get()), nullptr);
}

}  // namespace
}  // namespace sluice
