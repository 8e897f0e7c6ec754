package io.sluice.compare;

import org.apache.flink.api.connector.source.SourceSplit;

/**
 * The event numbers of one reader (Sluice: bench/nexmark/source.h NexmarkSplit): blocks of {@link
 * NexmarkSource#BLOCK} consecutive numbers whose starts are {@code stride} apart (a multiple of the block),
 * from {@code next} (advanced by the reader as it emits) up to {@code end} (exclusive).
 */
public final class NexmarkSourceSplit implements SourceSplit {
  private final int index;
  /** The first event number not yet emitted; mutable, the reader's position. */
  long next;
  final long end;
  final long stride;

  /** Split {@code index} of the source, holding the blocks from {@code next} every {@code stride} before {@code end}. */
  public NexmarkSourceSplit(int index, long next, long end, long stride) {
    this.index = index;
    this.next = next;
    this.end = end;
    this.stride = stride;
  }

  /** The split's number (reader i of p gets split i). */
  public int index() {
    return index;
  }

  @Override
  public String splitId() {
    return "nexmark-" + index;
  }

  /** A copy at the current position: what a checkpoint keeps while the reader moves on. */
  public NexmarkSourceSplit copy() {
    return new NexmarkSourceSplit(index, next, end, stride);
  }

  /** The end (exclusive, within the split's end) of the block that holds {@code next}. */
  long blockEnd() {
    return Math.min(end, (next / NexmarkSource.BLOCK + 1) * NexmarkSource.BLOCK);
  }

  /** The first event of the split's block after the one that holds {@code next}. */
  long nextBlock() {
    return next / NexmarkSource.BLOCK * NexmarkSource.BLOCK + stride;
  }

  @Override
  public String toString() {
    return "NexmarkSourceSplit{index=" + index + ", next=" + next + ", end=" + end + ", stride=" + stride + "}";
  }
}
