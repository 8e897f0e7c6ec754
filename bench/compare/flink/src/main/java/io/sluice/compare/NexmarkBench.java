package io.sluice.compare;

import io.sluice.compare.model.Event;
import io.sluice.compare.queries.Queries;
import java.io.IOException;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.graph.StreamGraph;

/**
 * Runs one Nexmark query on Flink over generated events into a discarding sink and prints one line, in
 * the key set of Sluice's {@code sluice-bench nexmark} (bench/sluice_bench.cc run_nexmark) plus "engine"
 * and "warmup_events":
 *
 * <pre>
 * java -Xms1g -Xmx1g -cp "target/sluice-compare-flink.jar:target/lib/*" io.sluice.compare.NexmarkBench \
 *     --query q5 --events 10000000 --parallelism 2 [--rate 10000] [--seed 0] [--checkpoint-interval-ms 0] \
 *     [--warmup-events N] [--format json|text]
 * </pre>
 *
 * <p>One local MiniCluster (one TaskManager with P slots) lives in this JVM for both runs: first a warm-up
 * run of the same query over --warmup-events events (default min(events, 2,000,000)) so the JIT has
 * compiled the hot paths, excluded from the figures; then the measured run. Wall and CPU time cover the
 * measured job only, from submission to its result, as Sluice's cover its execute(); CPU time is the
 * process's ({@code OperatingSystemMXBean.getProcessCpuTime()}), so it includes the JVM's GC and JIT
 * threads, work the JVM does for the job. Peak RSS is VmHWM from /proc/self/status: the peak over the
 * whole process life, including the MiniCluster and the warm-up run.
 */
public final class NexmarkBench {
  private NexmarkBench() {}

  /** The command line options (Sluice: NexmarkOptions of bench/sluice_bench.cc, plus Flink's extras). */
  static final class Options {
    String query;
    long events = 10_000_000L;
    int parallelism = 1;
    double rate = 10_000;
    long seed = 0;
    long checkpointIntervalMs = 0;
    /** state.backend.type: hashmap (heap objects) or rocksdb (Flink's RocksDB backend, managed memory). */
    String stateBackend = "hashmap";
    // state.backend.rocksdb.timer-service.factory (Flink's default: ROCKSDB)
    String timerService = "rocksdb";
    long warmupEvents = -1;
    String format = "text";
  }

  /** Parses the options, runs the warm-up and measured jobs and prints the measured run's line. */
  public static void main(String[] args) throws Exception {
    // Before any logger exists: slf4j-simple reads its level once, when the first logger is created.
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
    Options opt;
    try {
      opt = parse(args);
    } catch (IllegalArgumentException e) {
      System.err.println("error: " + e.getMessage());
      System.exit(2);
      return;
    }
    long warmup = opt.warmupEvents >= 0 ? opt.warmupEvents : Math.min(opt.events, 2_000_000L);

    Configuration conf = new Configuration();
    // hashmap state backend (heap objects; Flink 2.x's default) unless --state-backend rocksdb, and checkpoints
    // kept in the JobManager's memory: nothing is written to disk, as with Sluice's in-memory checkpoint storage.
    conf.set(StateBackendOptions.STATE_BACKEND, opt.stateBackend);
    conf.set(ConfigOptions.key("state.backend.rocksdb.timer-service.factory").stringType().noDefaultValue(),
        opt.timerService.toUpperCase(java.util.Locale.ROOT));
    conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "jobmanager");
    conf.set(ExecutionOptions.RUNTIME_MODE, RuntimeExecutionMode.STREAMING);
    // Every record and state type must have a Flink serializer (POJO, basic type): no silent fallback to
    // Kryo, which would make Flink slower than it need be.
    conf.set(PipelineOptions.GENERIC_TYPES, false);
    // A free port, so concurrent runs on one machine do not collide (the REST endpoint is otherwise unused).
    conf.set(RestOptions.BIND_PORT, "0");

    MiniClusterConfiguration clusterConf = new MiniClusterConfiguration.Builder()
        .setConfiguration(conf)
        .setNumTaskManagers(1)
        .setNumSlotsPerTaskManager(opt.parallelism)
        .build();
    Measurement m;
    MiniCluster cluster = new MiniCluster(clusterConf);
    try {
      cluster.start();
      if (warmup > 0) {
        run(cluster, conf, opt, warmup);
        // Collect the warm-up run's garbage now rather than during the measured run.
        System.gc();
      }
      m = run(cluster, conf, opt, opt.events);
    } finally {
      cluster.closeAsync().get();
    }
    double peakRssMib = peakRssKib() / 1024.0;
    double eventsD = (double) opt.events;
    if (opt.format.equals("json")) {
      System.out.println(String.format(Locale.ROOT,
          "{\"benchmark\":\"nexmark\",\"engine\":\"flink\",\"query\":\"%s\",\"events\":%d,\"parallelism\":%d,"
              + "\"rate\":%s,\"warmup_events\":%d,\"wall_seconds\":%.6f,\"cpu_seconds\":%.6f,"
              + "\"events_per_second\":%.0f,\"events_per_cpu_second\":%.0f,\"peak_rss_mib\":%.1f,"
              + "\"output_records\":%d,\"gc_seconds\":%.3f}",
          opt.query, opt.events, opt.parallelism, number(opt.rate), warmup, m.wallSeconds, m.cpuSeconds,
          eventsD / m.wallSeconds, eventsD / m.cpuSeconds, peakRssMib, m.outputRecords, m.gcSeconds));
    } else {
      System.out.println(String.format(Locale.ROOT,
          "nexmark flink %s: events %d, parallelism %d, warm-up events %d, wall %.3f s, %.0f events/s, cpu %.3f s, "
              + "%.0f events/cpu-s, peak RSS %.1f MiB, output records %d",
          opt.query, opt.events, opt.parallelism, warmup, m.wallSeconds, eventsD / m.wallSeconds, m.cpuSeconds,
          eventsD / m.cpuSeconds, peakRssMib, m.outputRecords));
    }
    System.exit(0);
  }

  /** What one measured job took and produced. */
  static final class Measurement {
    double wallSeconds;
    double cpuSeconds;
    /** Time the JVM's collectors report for the measured job (summed over collectors; may overlap wall). */
    double gcSeconds;
    long outputRecords;
  }

  /** Milliseconds of collection every garbage collector of this JVM reports so far. */
  private static long gcMillis() {
    long total = 0;
    for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
      total += Math.max(0, gc.getCollectionTime());
    }
    return total;
  }

  /** Builds the query over {@code events} events into the counting sink and runs it on {@code cluster}. */
  static Measurement run(MiniCluster cluster, Configuration conf, Options opt, long events) throws Exception {
    NexmarkConfig config = new NexmarkConfig();
    config.events = events;
    config.rate = opt.rate;
    config.seed = opt.seed;

    StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
    env.setParallelism(opt.parallelism);
    // Chained operators hand records over by reference, without copies (see NexmarkSourceReader).
    env.getConfig().enableObjectReuse();
    if (opt.checkpointIntervalMs > 0) {
      env.enableCheckpointing(opt.checkpointIntervalMs);
    }
    // Monotonous timestamps: each reader's timestamps never decrease (one split per reader, its blocks in
    // order), so the watermark max-timestamp - 1, emitted every auto-watermark interval (200 ms by
    // default), is one no later record of the reader violates. Sluice emits timestamp(next) - 1 after
    // every block instead; both are exact, so the results are the same, and this is what a Flink user
    // would write. The end of input brings the final watermark (Long.MAX_VALUE) either way.
    DataStream<Event> source = env
        .fromSource(new NexmarkSource(config), WatermarkStrategy.<Event>forMonotonousTimestamps(), "Nexmark")
        .uid("nexmark-source");
    sinkTo(Queries.build(opt.query, source));

    StreamGraph graph = env.getStreamGraph();
    graph.setJobName("nexmark " + opt.query);
    JobGraph job = graph.getJobGraph();
    CountingSink.TOTAL.set(0);
    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    long gcBefore = gcMillis();
    long cpuBefore = os.getProcessCpuTime();
    long start = System.nanoTime();
    cluster.executeJobBlocking(job);
    long end = System.nanoTime();
    long cpuAfter = os.getProcessCpuTime();
    long gcAfter = gcMillis();

    Measurement m = new Measurement();
    m.wallSeconds = (end - start) * 1e-9;
    m.cpuSeconds = (cpuAfter - cpuBefore) * 1e-9;
    m.gcSeconds = (gcAfter - gcBefore) * 1e-3;
    m.outputRecords = CountingSink.TOTAL.get();
    return m;
  }

  private static <T> void sinkTo(DataStream<T> results) {
    results.sinkTo(new CountingSink<T>()).name("Discard").uid("discard");
  }

  /**
   * A sink that writes nothing and counts the records it gets (Sluice: DiscardingSink of
   * bench/sluice_bench.cc). Each writer counts in a plain field and adds its count to {@link #TOTAL} at the
   * end of input (and on close, for whatever came after): the MiniCluster runs every subtask in this JVM,
   * so a static counter sums across subtasks, which is the simplest way with Sink v2, whose writers have no
   * accumulators.
   */
  static final class CountingSink<T> implements Sink<T> {
    private static final long serialVersionUID = 1L;
    /** The records every writer of the current job has counted. */
    static final AtomicLong TOTAL = new AtomicLong();

    @Override
    public SinkWriter<T> createWriter(WriterInitContext context) {
      return new Writer<>();
    }

    /** Counts records, adds the count to TOTAL at the end of input and on close. */
    static final class Writer<T> implements SinkWriter<T> {
      private long count = 0;

      @Override
      public void write(T element, Context context) {
        ++count;
      }

      @Override
      public void flush(boolean endOfInput) {
        if (endOfInput) {
          publish();
        }
      }

      @Override
      public void close() {
        publish();
      }

      private void publish() {
        TOTAL.addAndGet(count);
        count = 0;
      }
    }
  }

  /** The process's peak resident set (VmHWM) in KiB, or 0 where /proc is unavailable. */
  static long peakRssKib() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
        if (line.startsWith("VmHWM:")) {
          return Long.parseLong(line.substring(6).trim().split("\\s+")[0]);
        }
      }
    } catch (IOException | NumberFormatException e) {
      return 0;
    }
    return 0;
  }

  /** A double as Sluice's fmt prints it: an integral value without a decimal point. */
  static String number(double v) {
    if (v == Math.rint(v) && Math.abs(v) < 1e15) {
      return Long.toString((long) v);
    }
    return Double.toString(v);
  }

  /** Parses the command line; throws IllegalArgumentException on a bad option, exits on --help. */
  static Options parse(String[] args) {
    Options opt = new Options();
    for (int i = 0; i < args.length; ++i) {
      String arg = args[i];
      if (arg.equals("-h") || arg.equals("--help")) {
        System.out.println("usage: NexmarkBench --query " + String.join("|", Queries.NAMES)
            + " [--events N] [--parallelism P] [--rate R] [--seed S] [--checkpoint-interval-ms MS]"
            + " [--warmup-events N] [--format json|text] [--state-backend hashmap|rocksdb]"
            + " [--timer-service heap|rocksdb]");
        System.exit(0);
      }
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException("option " + arg + " needs a value");
      }
      String value = args[++i];
      try {
        switch (arg) {
          case "-q":
          case "--query":
            opt.query = value;
            break;
          case "-n":
          case "--events":
            opt.events = Long.parseLong(value);
            break;
          case "-p":
          case "--parallelism":
            opt.parallelism = Integer.parseInt(value);
            break;
          case "-r":
          case "--rate":
            opt.rate = Double.parseDouble(value);
            break;
          case "--seed":
            opt.seed = Long.parseUnsignedLong(value);
            break;
          case "--checkpoint-interval-ms":
            opt.checkpointIntervalMs = Long.parseLong(value);
            break;
          case "--warmup-events":
            opt.warmupEvents = Long.parseLong(value);
            break;
          case "--format":
            opt.format = value;
            break;
          case "--state-backend":
            if (!value.equals("hashmap") && !value.equals("rocksdb")) {
              throw new IllegalArgumentException("--state-backend must be hashmap or rocksdb, got " + value);
            }
            opt.stateBackend = value;
            break;
          case "--timer-service":
            if (!value.equals("heap") && !value.equals("rocksdb")) {
              throw new IllegalArgumentException("--timer-service must be heap or rocksdb, got " + value);
            }
            opt.timerService = value;
            break;
          default:
            throw new IllegalArgumentException("unknown option " + arg);
        }
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException("option " + arg + ": not a number: " + value);
      }
    }
    if (opt.query == null || !Queries.NAMES.contains(opt.query)) {
      throw new IllegalArgumentException("--query must be one of " + Queries.NAMES + ", got " + opt.query);
    }
    if (opt.events <= 0) {
      throw new IllegalArgumentException("--events must be > 0");
    }
    if (opt.parallelism <= 0) {
      throw new IllegalArgumentException("--parallelism must be > 0");
    }
    if (opt.rate <= 0) {
      throw new IllegalArgumentException("--rate must be > 0");
    }
    if (!opt.format.equals("json") && !opt.format.equals("text")) {
      throw new IllegalArgumentException("--format must be json or text");
    }
    return opt;
  }
}
