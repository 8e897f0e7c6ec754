package io.sluice.compare.kafka;

import com.sun.management.OperatingSystemMXBean;
import io.sluice.compare.model.Bid;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.graph.StreamGraph;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;

/**
 * Nexmark query 1 from Kafka to Kafka on Flink: the Flink half of {@code sluice-bench nexmark-kafka-q1}
 * (bench/nexmark_kafka_bench.h), with the same options and the same JSON result line.
 *
 * <pre>
 * java -cp "target/sluice-compare-flink.jar:target/lib/*" io.sluice.compare.kafka.KafkaQ1Bench \
 *     --bootstrap HOST:PORT --input BIDS --output OUT [--parallelism 2] [--checkpoint-interval-ms 10000] \
 *     [--warmup-records 1000000] [--format json]
 * </pre>
 *
 * <p>The job: a bounded KafkaSource of the input (earliest offsets to the latest ones seen at start,
 * read_committed), Jackson to {@link Bid} in the source's deserializer, a map to {@link Q1Row} ({@code price =
 * 908 * price / 1000}, exact), Jackson to JSON, and a KafkaSink at-least-once keyed by the auction id as decimal
 * text (the Kafka client's default partitioner: murmur2 of the key, as librdkafka's murmur2_random on the Sluice
 * side). Checkpoints every --checkpoint-interval-ms (default storage: the JobManager's memory; the state is
 * a few offsets), object reuse on, parallelism P, a local MiniCluster in this JVM.
 *
 * <p>A MiniCluster (one TaskManager, P slots) starts first, then a warm-up job runs the same query over the
 * first --warmup-records records (default 1,000,000) into {@code OUT-warmup}, so the JIT has compiled the hot
 * path; both are outside the measurement (as NexmarkBench excludes its warm-up). Measured around the second
 * job (submission to FINISHED): wall time, process CPU time (every JVM thread: the job, the Kafka clients, JIT
 * and GC), peak RSS (VmHWM of /proc/self/status, the process's whole life, warm-up included) and, after the
 * job, the output topic's record count (sum of end minus start offsets). Checkpoints after the input ended are
 * off: the bounded job ends when its sink has flushed, as the Sluice job does. The producer's batch.size is
 * librdkafka's default (1,000,000 bytes) instead of the Java client's 16 KiB.
 *
 * <p>The output topic is created (before the clock starts) with the input's partition count when missing.
 */
public final class KafkaQ1Bench {
  private KafkaQ1Bench() {}

  private static final class Options {
    String bootstrap = System.getenv("KAFKA_BOOTSTRAP_SERVERS");
    String input;
    String output;
    int parallelism = 2;
    long checkpointIntervalMs = 10_000;
    long warmupRecords = 1_000_000;
    String format = "text";
  }

  /** Bid to query 1 row: the price converted exactly, the padding shared, not copied. */
  private static final class ToQ1 implements MapFunction<Bid, Q1Row> {
    private static final long serialVersionUID = 1L;
    private static final long DOLLAR_TO_EURO_E3 = 908;

    @Override
    public Q1Row map(Bid bid) {
      return new Q1Row(
          bid.auction,
          bid.bidder,
          BigDecimal.valueOf(DOLLAR_TO_EURO_E3 * bid.price, 3),
          bid.dateTime,
          bid.extra);
    }
  }

  /** Runs the benchmark; exits 1 when the job fails or the output holds fewer records than were read. */
  public static void main(String[] args) throws Exception {
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
    Options o = parse(args);

    long records;
    int partitions;
    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, o.bootstrap);
    try (Admin admin = Admin.create(adminProps)) {
      TopicDescription input =
          admin.describeTopics(List.of(o.input)).allTopicNames().get().get(o.input);
      partitions = input.partitions().size();
      records = recordCount(admin, o.input, partitions);
      createTopic(admin, o.output, partitions);
    }

    Configuration conf = new Configuration();
    conf.set(PipelineOptions.OBJECT_REUSE, true);
    // Every type has a Flink serializer: no silent fallback to Kryo (as NexmarkBench).
    conf.set(PipelineOptions.GENERIC_TYPES, false);
    conf.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofMillis(o.checkpointIntervalMs));
    conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "jobmanager");
    // A bounded job would otherwise wait for one more periodic checkpoint after its input ends (up to the
    // interval); the at-least-once sink flushes at the end of input anyway, and Sluice ends right there too.
    conf.set(CheckpointingOptions.ENABLE_CHECKPOINTS_AFTER_TASKS_FINISH, false);
    conf.set(RestOptions.BIND_PORT, "0");
    MiniClusterConfiguration clusterConf =
        new MiniClusterConfiguration.Builder()
            .setConfiguration(conf)
            .setNumTaskManagers(1)
            .setNumSlotsPerTaskManager(o.parallelism)
            .build();

    double wall;
    double cpu;
    long warmupRecords = Math.min(o.warmupRecords, records);
    MiniCluster cluster = new MiniCluster(clusterConf);
    try {
      // The MiniCluster starts, and a warm-up job over the first records compiles the hot path, before the
      // clock (as NexmarkBench): the figures are the steady state of a running Flink.
      cluster.start();
      if (warmupRecords > 0) {
        Map<TopicPartition, Long> warmupEnd;
        try (Admin admin = Admin.create(adminProps)) {
          warmupEnd = startOffsetsPlus(admin, o.input, partitions, (warmupRecords + partitions - 1) / partitions);
          createTopic(admin, o.output + "-warmup", partitions);
        }
        cluster.executeJobBlocking(
            jobGraph(conf, o, OffsetsInitializer.offsets(warmupEnd), o.output + "-warmup", "warm-up"));
      }
      JobGraph job = jobGraph(conf, o, OffsetsInitializer.latest(), o.output, "nexmark-kafka-q1");
      OperatingSystemMXBean os = (OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
      long cpu0 = os.getProcessCpuTime();
      long start = System.nanoTime();
      cluster.executeJobBlocking(job);
      wall = (System.nanoTime() - start) / 1e9;
      cpu = (os.getProcessCpuTime() - cpu0) / 1e9;
    } finally {
      cluster.close();
    }
    double rssMib = peakRssMib();

    long outputRecords;
    try (Admin admin = Admin.create(adminProps)) {
      outputRecords = recordCount(admin, o.output, partitions);
    }
    double n = records;
    if (o.format.equals("json")) {
      System.out.printf(
          Locale.ROOT,
          "{\"benchmark\":\"nexmark-kafka-q1\",\"engine\":\"flink\",\"records\":%d,\"parallelism\":%d,"
              + "\"checkpoint_interval_ms\":%d,\"warmup_records\":%d,\"wall_seconds\":%.6f,"
              + "\"cpu_seconds\":%.6f,\"records_per_second\":%.0f,\"cpu_seconds_per_million\":%.3f,"
              + "\"peak_rss_mib\":%.1f,\"output_records\":%d}%n",
          records, o.parallelism, o.checkpointIntervalMs, warmupRecords, wall, cpu, n / wall, cpu * 1e6 / n,
          rssMib, outputRecords);
    } else {
      System.out.printf(
          Locale.ROOT,
          "nexmark-kafka-q1 (flink): %d records, parallelism %d, checkpoints every %d ms, warm-up %d "
              + "records: wall %.3f s, %.0f records/s, cpu %.3f s (%.3f s per million), peak RSS %.1f MiB, "
              + "output topic %d records%n",
          records, o.parallelism, o.checkpointIntervalMs, warmupRecords, wall, n / wall, cpu, cpu * 1e6 / n,
          rssMib, outputRecords);
    }
    if (outputRecords < records) {
      System.err.printf(
          "error: the output topic %s holds %d records, fewer than the %d read%n",
          o.output, outputRecords, records);
      System.exit(1);
    }
    // The Kafka clients' and MiniCluster's leftover threads must not keep the JVM alive.
    System.exit(0);
  }

  /** The query-1 job from {@code input} up to {@code stop} into {@code output}, as a JobGraph. */
  private static JobGraph jobGraph(
      Configuration conf, Options o, OffsetsInitializer stop, String output, String name) {
    StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
    env.setParallelism(o.parallelism);
    String suffix = ProcessHandle.current().pid() + "-" + System.nanoTime();
    KafkaSource<Bid> source =
        KafkaSource.<Bid>builder()
            .setBootstrapServers(o.bootstrap)
            .setTopics(o.input)
            .setGroupId("flink-nexmark-q1-" + suffix)
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setBounded(stop)
            .setProperty("isolation.level", "read_committed")
            .setValueOnlyDeserializer(new BidJsonDeserializationSchema())
            .build();
    KafkaSink<Q1Row> sink =
        KafkaSink.<Q1Row>builder()
            .setBootstrapServers(o.bootstrap)
            .setDeliveryGuarantee(DeliveryGuarantee.AT_LEAST_ONCE)
            // librdkafka's batch size on the Sluice side (the Java client's default is 16 KiB); linger.ms is
            // 5 on both.
            .setProperty("batch.size", "1000000")
            .setRecordSerializer(
                KafkaRecordSerializationSchema.<Q1Row>builder()
                    .setTopic(output)
                    .setKeySerializationSchema(
                        (Q1Row row) -> Long.toString(row.auction).getBytes(StandardCharsets.US_ASCII))
                    .setValueSerializationSchema(new Q1RowJsonSerializationSchema())
                    .build())
            .build();
    env.fromSource(source, WatermarkStrategy.noWatermarks(), "Kafka bids")
        .uid("kafka-source")
        .map(new ToQ1())
        .name("Q1 currency conversion")
        .uid("q1")
        .sinkTo(sink)
        .name("Kafka Q1")
        .uid("kafka-sink");
    StreamGraph graph = env.getStreamGraph();
    graph.setJobName(name);
    return graph.getJobGraph();
  }

  /** Creates {@code topic} with {@code partitions} partitions unless it exists. */
  private static void createTopic(Admin admin, String topic, int partitions)
      throws InterruptedException, ExecutionException {
    try {
      admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
    } catch (ExecutionException e) {
      if (!(e.getCause() instanceof TopicExistsException)) {
        throw e;
      }
    }
  }

  /** Per partition of {@code topic}: its earliest offset plus {@code n}, at most its end offset. */
  private static Map<TopicPartition, Long> startOffsetsPlus(Admin admin, String topic, int partitions, long n)
      throws InterruptedException, ExecutionException {
    Map<TopicPartition, OffsetSpec> earliest = new java.util.HashMap<>();
    Map<TopicPartition, OffsetSpec> latest = new java.util.HashMap<>();
    for (int p = 0; p < partitions; p++) {
      earliest.put(new TopicPartition(topic, p), OffsetSpec.earliest());
      latest.put(new TopicPartition(topic, p), OffsetSpec.latest());
    }
    Map<TopicPartition, ListOffsetsResultInfo> lo = admin.listOffsets(earliest).all().get();
    Map<TopicPartition, ListOffsetsResultInfo> hi = admin.listOffsets(latest).all().get();
    Map<TopicPartition, Long> out = new java.util.HashMap<>();
    for (TopicPartition tp : lo.keySet()) {
      out.put(tp, Math.min(lo.get(tp).offset() + n, hi.get(tp).offset()));
    }
    return out;
  }

  /** Sum over the partitions of end offset minus start offset. */
  private static long recordCount(Admin admin, String topic, int partitions)
      throws InterruptedException, ExecutionException {
    List<TopicPartition> tps = new ArrayList<>();
    for (int p = 0; p < partitions; p++) {
      tps.add(new TopicPartition(topic, p));
    }
    Map<TopicPartition, ListOffsetsResultInfo> earliest =
        admin
            .listOffsets(
                tps.stream().collect(Collectors.toMap(Function.identity(), tp -> OffsetSpec.earliest())))
            .all()
            .get();
    Map<TopicPartition, ListOffsetsResultInfo> latest =
        admin
            .listOffsets(
                tps.stream().collect(Collectors.toMap(Function.identity(), tp -> OffsetSpec.latest())))
            .all()
            .get();
    long total = 0;
    for (TopicPartition tp : tps) {
      total += latest.get(tp).offset() - earliest.get(tp).offset();
    }
    return total;
  }

  /** VmHWM of /proc/self/status in MiB (the peak resident set size so far; Linux only). */
  private static double peakRssMib() throws IOException {
    for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
      if (line.startsWith("VmHWM:")) {
        String kib = line.substring("VmHWM:".length()).trim().split("\\s+")[0];
        return Long.parseLong(kib) / 1024.0;
      }
    }
    return -1;
  }

  private static Options parse(String[] args) {
    Options o = new Options();
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (i + 1 >= args.length) {
        usage("missing value of " + a);
      }
      String v = args[++i];
      switch (a) {
        case "--bootstrap" -> o.bootstrap = v;
        case "--input" -> o.input = v;
        case "--output" -> o.output = v;
        case "--parallelism", "-p" -> o.parallelism = Integer.parseInt(v);
        case "--checkpoint-interval-ms" -> o.checkpointIntervalMs = Long.parseLong(v);
        case "--warmup-records" -> o.warmupRecords = Long.parseLong(v);
        case "--format" -> o.format = v;
        default -> usage("unknown option " + a);
      }
    }
    if (o.bootstrap == null || o.bootstrap.isEmpty()) {
      usage("no broker: pass --bootstrap or set KAFKA_BOOTSTRAP_SERVERS");
    }
    if (o.input == null || o.output == null) {
      usage("--input and --output are required");
    }
    if (!o.format.equals("text") && !o.format.equals("json")) {
      usage("--format is text or json");
    }
    if (o.parallelism < 1 || o.checkpointIntervalMs < 1 || o.warmupRecords < 0) {
      usage("--parallelism and --checkpoint-interval-ms must be positive");
    }
    return o;
  }

  private static void usage(String error) {
    System.err.println("error: " + error);
    System.err.println(
        "usage: KafkaQ1Bench --bootstrap HOST:PORT --input TOPIC --output TOPIC [--parallelism 2]"
            + " [--checkpoint-interval-ms 10000] [--format text|json]");
    System.exit(2);
  }
}
