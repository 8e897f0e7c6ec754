// The sink interfaces (the model of Flink's Sink V2).
//
// * Sink<T> creates one SinkWriter per parallel subtask. Run by SinkOperator: flush(false) when a checkpoint
//   is taken ("flush on snapshot": at-least-once), flush(true) at the end of a bounded input.
// * TwoPhaseCommittingSink<T, CommT> (Flink's TwoPhaseCommittingSink) creates a PrecommittingSinkWriter and a
//   Committer. Run by TwoPhaseCommitSinkOperator (sink_operator.h), which gives exactly-once output when
//   checkpointing is enabled (DESIGN.md §7): at checkpoint n the writer pre-commits what it wrote
//   (prepare_commit() returns committables: a file to rename, a transaction to commit), the operator keeps
//   them in its operator state, and commits them once checkpoint n completes; a restore commits what the
//   restored checkpoint pre-committed and aborts what a failed run left behind (Committer::abort_lingering).
//   Without checkpointing everything is pre-committed and committed at the end of the input.
//
// DataStream::sink_to picks the operator from the static type of the sink: a shared_ptr to a type derived
// from TwoPhaseCommittingSink gets the two-phase-commit operator; a type-erased shared_ptr<const Sink<T>>
// gets SinkOperator, which runs a two-phase-commit sink through its create_writer() (at-least-once: every
// flush commits at once).
//
// Threading: sinks are factories shared by all subtasks (thread-safe, configured before the job starts);
// writers and committers belong to one subtask and run only on its task thread.
#pragma once

#include <concepts>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/functions.h"

namespace sluice {

/// The context of one SinkWriter::write call.
class SinkWriterContext {
 public:
  virtual ~SinkWriterContext() = default;
  /// The record's event timestamp, or kNoTimestamp.
  virtual TimestampMs timestamp() const = 0;
  /// The subtask's current watermark.
  virtual TimestampMs current_watermark() const = 0;
};

/// Writes records of one subtask. Not thread-safe; runs on the task thread.
template <class T>
class SinkWriter {
 public:
  virtual ~SinkWriter() = default;
  /// Writes (or buffers) one record. May throw to fail the task.
  virtual void write(const T& record, const SinkWriterContext& ctx) = 0;
  /// Makes everything written so far durable/visible per the sink's guarantee. `end_of_input` is true on the
  /// final flush of a bounded job. May throw to fail the task.
  virtual void flush(bool end_of_input) = 0;
  /// Releases resources; called on success, failure and cancellation.
  virtual void close() {}

  /// No timer wanted (next_timer_ms()).
  static constexpr TimestampMs kNoTimer = std::numeric_limits<TimestampMs>::max();
  /// The processing time (ms since the epoch, on the job's Clock) at which the writer wants
  /// on_processing_time() called, or kNoTimer (Flink gives a sink writer its ProcessingTimeService for this).
  /// The sink operator asks after every write() and on_processing_time(), and registers a timer on the task
  /// thread, so a writer that buffers can write an idle stream's records after a delay instead of waiting for
  /// the next record. Called on the task thread; must be cheap (it is asked once per record).
  virtual TimestampMs next_timer_ms() const { return kNoTimer; }
  /// Called on the task thread once the time next_timer_ms() asked for has come (`now_ms` on the job's Clock).
  /// May throw to fail the task.
  virtual void on_processing_time(TimestampMs /*now_ms*/) {}
};

/// A factory of writers. Thread-safe.
template <class T>
class Sink {
 public:
  using RecordType = T;
  virtual ~Sink() = default;
  /// Creates the writer of subtask `ctx.subtask_index()`. Called on the task thread in the operator's open()
  /// (after its operator state was restored); may throw to fail the task.
  virtual std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const = 0;
};

/// The writer of a two-phase-commit sink (Flink's PrecommittingSinkWriter). Not thread-safe; runs on the task
/// thread.
template <class T, class CommT>
class PrecommittingSinkWriter : public SinkWriter<T> {
 public:
  /// Pre-commits everything written since the previous call and returns what commits it: called at every
  /// checkpoint right after flush(false) (after flush(true) at the end of the input), and once at the end of
  /// the input without checkpointing. What is returned must survive a process crash as it is (data synced,
  /// transaction prepared) but stay invisible to readers until Committer::commit. Empty when nothing was
  /// written. May throw to fail the task (the checkpoint is then declined).
  virtual std::vector<CommT> prepare_commit() = 0;
};

/// Makes pre-committed data visible (Flink's Committer). Belongs to one subtask; runs on its task thread.
template <class CommT>
class Committer {
 public:
  virtual ~Committer() = default;
  /// Commits `committables`, in order; called only once the checkpoint that pre-committed them completed, or
  /// at the end of the input without checkpointing. Must be idempotent: after a restore a committable may be
  /// committed again, and committing an already committed one is a no-op. After a change of parallelism a
  /// subtask may commit committables another subtask pre-committed. Throws to fail the task (the committables
  /// stay in the operator state and are committed again after the restore).
  virtual void commit(std::vector<CommT>& committables) = 0;
  /// Cleans up what a previous run of this subtask left behind and will never commit: in-progress files,
  /// open transactions of this subtask's prefix, except those in `restored_committables` (every committable
  /// of the restored checkpoint, of all old subtasks; empty on a fresh start). Called once in the operator's
  /// open(), after the restored committables were committed and before the writer is created. Throws to fail
  /// the task.
  virtual void abort_lingering(RuntimeContext& /*ctx*/, const std::vector<CommT>& /*restored_committables*/) {}
};

/// A sink with exactly-once output through two-phase commit (see the file comment). CommT needs a
/// TypeSerializer (a SLUICE_FIELDS struct, sluice/core/type_serializer.h): committables are kept in the
/// operator state between pre-commit and commit. Thread-safe factory.
template <class T, class CommT>
class TwoPhaseCommittingSink : public Sink<T> {
 public:
  using CommittableType = CommT;

  /// Creates the writer of subtask `ctx.subtask_index()`; called in the operator's open() after the
  /// committer's abort_lingering(). May throw to fail the task.
  virtual std::unique_ptr<PrecommittingSinkWriter<T, CommT>> create_precommitting_writer(RuntimeContext& ctx) const = 0;
  /// Creates the committer of subtask `ctx.subtask_index()`; called first in the operator's open(). May throw
  /// to fail the task.
  virtual std::unique_ptr<Committer<CommT>> create_committer(RuntimeContext& ctx) const = 0;

  /// For the plain SinkOperator (the sink passed as shared_ptr<const Sink<T>>): a writer that aborts what a
  /// previous run left (abort_lingering with no committables), then commits at once everything each flush()
  /// pre-commits. At-least-once; the two-phase-commit operator never calls it.
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const override {
    std::unique_ptr<Committer<CommT>> committer = create_committer(ctx);
    committer->abort_lingering(ctx, {});
    return std::make_unique<AutoCommittingWriter>(create_precommitting_writer(ctx), std::move(committer));
  }

 private:
  class AutoCommittingWriter final : public SinkWriter<T> {
   public:
    AutoCommittingWriter(std::unique_ptr<PrecommittingSinkWriter<T, CommT>> writer,
                         std::unique_ptr<Committer<CommT>> committer)
        : writer_(std::move(writer)), committer_(std::move(committer)) {}
    void write(const T& record, const SinkWriterContext& ctx) override { writer_->write(record, ctx); }
    void flush(bool end_of_input) override {
      writer_->flush(end_of_input);
      std::vector<CommT> committables = writer_->prepare_commit();
      if (!committables.empty()) committer_->commit(committables);
    }
    void close() override { writer_->close(); }

   private:
    std::unique_ptr<PrecommittingSinkWriter<T, CommT>> writer_;
    std::unique_ptr<Committer<CommT>> committer_;
  };
};

/// True when S (cv-qualifiers ignored) derives from TwoPhaseCommittingSink<T, S::CommittableType>.
template <class S, class T>
concept TwoPhaseCommittingSinkOf = requires {
  typename std::remove_cv_t<S>::CommittableType;
}
&&std::derived_from<std::remove_cv_t<S>, TwoPhaseCommittingSink<T, typename std::remove_cv_t<S>::CommittableType>>;

}  // namespace sluice
