package io.sluice.compare;

import io.sluice.compare.model.Event;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.apache.flink.api.connector.source.ReaderOutput;
import org.apache.flink.api.connector.source.SourceReader;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.core.io.InputStatus;

/**
 * Generates the events of its splits in order, one block of {@link NexmarkSource#BLOCK} events per {@link
 * #pollNext} call, at full speed (no rate limit: the rate only spaces event time), each with its event
 * timestamp (Sluice: bench/nexmark/source.h NexmarkSource::Reader). Runs on the source task's thread.
 *
 * <p>One Event is reused for every record (the generator also reuses its Person/Auction/Bid objects):
 * the job runs with object reuse on, so the records go down the operator chain by reference, and every
 * query's first operator either drops the event (q0's sink only counts it) or copies the fields it keeps
 * into a new record (strings are immutable, so copying their references is safe). No operator chained to
 * the source keeps the Event itself.
 */
public final class NexmarkSourceReader implements SourceReader<Event, NexmarkSourceSplit> {
  private final SourceReaderContext ctx;
  private final NexmarkGenerator generator;
  private final Deque<NexmarkSourceSplit> splits = new ArrayDeque<>();
  private final Event scratch = new Event();
  private boolean noMoreSplits = false;
  /** Completed when a split or the end of splits arrives while the reader waits for one. */
  private CompletableFuture<Void> available = new CompletableFuture<>();

  /** A reader over {@code generator}'s events; it asks the enumerator for its split when it starts. */
  public NexmarkSourceReader(SourceReaderContext ctx, NexmarkGenerator generator) {
    this.ctx = ctx;
    this.generator = generator;
  }

  @Override
  public void start() {
    ctx.sendSplitRequest();
  }

  @Override
  public InputStatus pollNext(ReaderOutput<Event> out) {
    NexmarkSourceSplit s = splits.peek();
    if (s == null) {
      return noMoreSplits ? InputStatus.END_OF_INPUT : InputStatus.NOTHING_AVAILABLE;
    }
    final long stop = s.blockEnd();
    for (long n = s.next; n < stop; ++n) {
      generator.eventInto(n, scratch);
      out.collect(scratch, generator.timestamp(n));
    }
    s.next = s.nextBlock();
    if (s.next >= s.end) {
      splits.poll();
      if (splits.isEmpty() && !noMoreSplits) {
        ctx.sendSplitRequest();
      }
    }
    return splits.isEmpty() && noMoreSplits ? InputStatus.END_OF_INPUT : InputStatus.MORE_AVAILABLE;
  }

  @Override
  public List<NexmarkSourceSplit> snapshotState(long checkpointId) {
    List<NexmarkSourceSplit> out = new ArrayList<>(splits.size());
    for (NexmarkSourceSplit s : splits) {
      out.add(s.copy());
    }
    return out;
  }

  @Override
  public CompletableFuture<Void> isAvailable() {
    if (!splits.isEmpty() || noMoreSplits) {
      return CompletableFuture.completedFuture(null);
    }
    if (available.isDone()) {
      available = new CompletableFuture<>();
    }
    return available;
  }

  @Override
  public void addSplits(List<NexmarkSourceSplit> added) {
    for (NexmarkSourceSplit s : added) {
      if (s.stride <= 0 || s.stride % NexmarkSource.BLOCK != 0) {
        throw new IllegalArgumentException(
            "nexmark source: a split's stride must be a positive multiple of the block size, got " + s.stride);
      }
      if (s.next < s.end) {
        splits.add(s);
      }
    }
    // An empty split (fewer events than readers times BLOCK) is dropped: ask for the next one, or the
    // enumerator's "no more splits", or this reader would wait forever (as bench/nexmark/source.h).
    if (splits.isEmpty() && !noMoreSplits) {
      ctx.sendSplitRequest();
    }
    available.complete(null);
  }

  @Override
  public void notifyNoMoreSplits() {
    noMoreSplits = true;
    available.complete(null);
  }

  @Override
  public void close() {}
}
