package io.sluice.compare;

import io.sluice.compare.model.Event;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.connector.source.Boundedness;
import org.apache.flink.api.connector.source.Source;
import org.apache.flink.api.connector.source.SourceReader;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.connector.source.SplitEnumerator;
import org.apache.flink.api.connector.source.SplitEnumeratorContext;
import org.apache.flink.api.java.typeutils.ResultTypeQueryable;
import org.apache.flink.core.io.SimpleVersionedSerializer;

/**
 * The Nexmark generator as a bounded FLIP-27 source, dealing events as Sluice's NexmarkSource
 * (bench/nexmark/source.h) does: events 0..events-1 in blocks of {@link #BLOCK}, round robin, so with p
 * readers reader i generates blocks i, i + p, i + 2p, ... (one split per reader, split i to subtask i).
 * All readers move through event time together, at most about p blocks apart. Each record carries its event
 * timestamp ({@link NexmarkGenerator#timestamp}); the watermarks come from the job's WatermarkStrategy (see
 * {@link NexmarkBench}). Event n depends only on the config and n, so the events are the same at every
 * parallelism and on both engines.
 */
public final class NexmarkSource
    implements Source<Event, NexmarkSourceSplit, List<NexmarkSourceSplit>>, ResultTypeQueryable<Event> {
  private static final long serialVersionUID = 1L;

  /** Events per block: a reader generates one block per pollNext call (Sluice: NexmarkSource::kBlock). */
  public static final int BLOCK = 1024;

  private final NexmarkConfig config;

  /** A source of {@code config.events} events (> 0: the source is bounded). */
  public NexmarkSource(NexmarkConfig config) {
    if (config.events <= 0) {
      throw new IllegalArgumentException("nexmark source: events must be > 0 (the source is bounded)");
    }
    this.config = config;
  }

  /** The splits for {@code parallelism} readers: split i holds blocks i, i + p, i + 2p, ... of the events. */
  public List<NexmarkSourceSplit> splits(int parallelism) {
    List<NexmarkSourceSplit> out = new ArrayList<>();
    for (int i = 0; i < parallelism; ++i) {
      out.add(new NexmarkSourceSplit(i, Math.min((long) i * BLOCK, config.events), config.events,
          (long) parallelism * BLOCK));
    }
    return out;
  }

  @Override
  public Boundedness getBoundedness() {
    return Boundedness.BOUNDED;
  }

  @Override
  public SplitEnumerator<NexmarkSourceSplit, List<NexmarkSourceSplit>> createEnumerator(
      SplitEnumeratorContext<NexmarkSourceSplit> ctx) {
    Map<Integer, Deque<NexmarkSourceSplit>> pending = new TreeMap<>();
    for (NexmarkSourceSplit s : splits(ctx.currentParallelism())) {
      pending.computeIfAbsent(s.index(), k -> new ArrayDeque<>()).add(s);
    }
    return new Enumerator(ctx, pending);
  }

  @Override
  public SplitEnumerator<NexmarkSourceSplit, List<NexmarkSourceSplit>> restoreEnumerator(
      SplitEnumeratorContext<NexmarkSourceSplit> ctx, List<NexmarkSourceSplit> unassigned) {
    // Unassigned splits go round robin over the (possibly new) readers, as Sluice's restore_state does.
    Map<Integer, Deque<NexmarkSourceSplit>> pending = new TreeMap<>();
    int p = Math.max(1, ctx.currentParallelism());
    for (int i = 0; i < unassigned.size(); ++i) {
      pending.computeIfAbsent(i % p, k -> new ArrayDeque<>()).add(unassigned.get(i));
    }
    return new Enumerator(ctx, pending);
  }

  @Override
  public SimpleVersionedSerializer<NexmarkSourceSplit> getSplitSerializer() {
    return new SplitSerializer();
  }

  @Override
  public SimpleVersionedSerializer<List<NexmarkSourceSplit>> getEnumeratorCheckpointSerializer() {
    return new SplitListSerializer();
  }

  @Override
  public SourceReader<Event, NexmarkSourceSplit> createReader(SourceReaderContext ctx) {
    return new NexmarkSourceReader(ctx, new NexmarkGenerator(config));
  }

  @Override
  public TypeInformation<Event> getProducedType() {
    return TypeInformation.of(Event.class);
  }

  /**
   * Gives split i to reader subtask i whenever it asks (Sluice: NexmarkSource::Enumerator). A first-come
   * enumerator could hand a fast reader a second split that starts earlier in event time than the
   * watermark it already emitted, making every record of that split late; splits given back after a
   * failure go to the subtask that had them.
   */
  static final class Enumerator implements SplitEnumerator<NexmarkSourceSplit, List<NexmarkSourceSplit>> {
    private final SplitEnumeratorContext<NexmarkSourceSplit> ctx;
    private final Map<Integer, Deque<NexmarkSourceSplit>> pending;

    Enumerator(SplitEnumeratorContext<NexmarkSourceSplit> ctx, Map<Integer, Deque<NexmarkSourceSplit>> pending) {
      this.ctx = ctx;
      this.pending = pending;
    }

    @Override
    public void start() {}

    @Override
    public void handleSplitRequest(int subtask, String requesterHostname) {
      Deque<NexmarkSourceSplit> mine = pending.get(subtask);
      if (mine == null || mine.isEmpty()) {
        ctx.signalNoMoreSplits(subtask);
        return;
      }
      ctx.assignSplit(mine.poll(), subtask);
    }

    @Override
    public void addSplitsBack(List<NexmarkSourceSplit> splits, int subtask) {
      for (NexmarkSourceSplit s : splits) {
        pending.computeIfAbsent(subtask, k -> new ArrayDeque<>()).add(s);
      }
    }

    @Override
    public void addReader(int subtask) {
      // Readers ask for their split themselves (NexmarkSourceReader.start), so nothing to do here.
    }

    @Override
    public List<NexmarkSourceSplit> snapshotState(long checkpointId) {
      List<NexmarkSourceSplit> out = new ArrayList<>();
      for (Deque<NexmarkSourceSplit> splits : pending.values()) {
        for (NexmarkSourceSplit s : splits) {
          out.add(s.copy());
        }
      }
      return out;
    }

    @Override
    public void close() {}
  }

  /** A split as (index, next, end, stride). */
  static final class SplitSerializer implements SimpleVersionedSerializer<NexmarkSourceSplit> {
    @Override
    public int getVersion() {
      return 1;
    }

    @Override
    public byte[] serialize(NexmarkSourceSplit s) throws IOException {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream(28);
      try (DataOutputStream out = new DataOutputStream(bytes)) {
        write(s, out);
      }
      return bytes.toByteArray();
    }

    @Override
    public NexmarkSourceSplit deserialize(int version, byte[] serialized) throws IOException {
      try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(serialized))) {
        return read(in);
      }
    }

    static void write(NexmarkSourceSplit s, DataOutputStream out) throws IOException {
      out.writeInt(s.index());
      out.writeLong(s.next);
      out.writeLong(s.end);
      out.writeLong(s.stride);
    }

    static NexmarkSourceSplit read(DataInputStream in) throws IOException {
      int index = in.readInt();
      long next = in.readLong();
      long end = in.readLong();
      long stride = in.readLong();
      return new NexmarkSourceSplit(index, next, end, stride);
    }
  }

  /** The enumerator's checkpoint: the unassigned splits, count first. */
  static final class SplitListSerializer implements SimpleVersionedSerializer<List<NexmarkSourceSplit>> {
    @Override
    public int getVersion() {
      return 1;
    }

    @Override
    public byte[] serialize(List<NexmarkSourceSplit> splits) throws IOException {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      try (DataOutputStream out = new DataOutputStream(bytes)) {
        out.writeInt(splits.size());
        for (NexmarkSourceSplit s : splits) {
          SplitSerializer.write(s, out);
        }
      }
      return bytes.toByteArray();
    }

    @Override
    public List<NexmarkSourceSplit> deserialize(int version, byte[] serialized) throws IOException {
      try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(serialized))) {
        int n = in.readInt();
        List<NexmarkSourceSplit> out = new ArrayList<>(n);
        for (int i = 0; i < n; ++i) {
          out.add(SplitSerializer.read(in));
        }
        return out;
      }
    }
  }
}
