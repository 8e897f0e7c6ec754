package io.sluice.compare.kafka;

import com.sun.management.OperatingSystemMXBean;
import io.sluice.compare.model.Bid;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
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
 *     [--format json]
 * </pre>
 *
 * <p>The job: a bounded KafkaSource of the input (earliest offsets to the latest ones seen at start,
 * read_committed), Jackson to {@link Bid} in the source's deserializer, a map to {@link Q1Row} ({@code price =
 * 908 * price / 1000}, exact), Jackson to JSON, and a KafkaSink at-least-once keyed by the auction id as decimal
 * text (the Kafka client's default partitioner: murmur2 of the key, as librdkafka's murmur2_random on the Sluice
 * side). Checkpoints every --checkpoint-interval-ms (default storage: the JobManager's memory; the state is
 * a few offsets), object reuse on, parallelism P, a local MiniCluster in this JVM.
 *
 * <p>Measured around {@code execute()} (MiniCluster start to FINISHED, as the Sluice side measures its
 * mini-cluster): wall time, process CPU time (every JVM thread: the job, the Kafka clients, JIT and GC), peak RSS
 * (VmHWM of /proc/self/status, the process's whole life) and, after the job, the output topic's record count
 * (sum of end minus start offsets). There is no warm-up pass: a Kafka job is one long run, the JIT compiles the
 * hot path during its first seconds, and the figures include that.
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
      try {
        admin.createTopics(List.of(new NewTopic(o.output, partitions, (short) 1))).all().get();
      } catch (ExecutionException e) {
        if (!(e.getCause() instanceof TopicExistsException)) {
          throw e;
        }
      }
    }

    Configuration conf = new Configuration();
    conf.set(PipelineOptions.OBJECT_REUSE, true);
    StreamExecutionEnvironment env =
        StreamExecutionEnvironment.createLocalEnvironment(o.parallelism, conf);
    env.enableCheckpointing(o.checkpointIntervalMs);

    String suffix = ProcessHandle.current().pid() + "-" + System.currentTimeMillis();
    KafkaSource<Bid> source =
        KafkaSource.<Bid>builder()
            .setBootstrapServers(o.bootstrap)
            .setTopics(o.input)
            .setGroupId("flink-nexmark-q1-" + suffix)
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setBounded(OffsetsInitializer.latest())
            .setProperty("isolation.level", "read_committed")
            .setValueOnlyDeserializer(new BidJsonDeserializationSchema())
            .build();
    KafkaSink<Q1Row> sink =
        KafkaSink.<Q1Row>builder()
            .setBootstrapServers(o.bootstrap)
            .setDeliveryGuarantee(DeliveryGuarantee.AT_LEAST_ONCE)
            .setRecordSerializer(
                KafkaRecordSerializationSchema.<Q1Row>builder()
                    .setTopic(o.output)
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

    OperatingSystemMXBean os =
        (OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    long cpu0 = os.getProcessCpuTime();
    long start = System.nanoTime();
    JobExecutionResult result = env.execute("nexmark-kafka-q1");
    double wall = (System.nanoTime() - start) / 1e9;
    double cpu = (os.getProcessCpuTime() - cpu0) / 1e9;
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
              + "\"checkpoint_interval_ms\":%d,\"wall_seconds\":%.3f,\"cpu_seconds\":%.3f,"
              + "\"records_per_second\":%.0f,\"cpu_seconds_per_million\":%.3f,\"peak_rss_mib\":%.1f,"
              + "\"output_records\":%d}%n",
          records, o.parallelism, o.checkpointIntervalMs, wall, cpu, n / wall, cpu * 1e6 / n, rssMib,
          outputRecords);
    } else {
      System.out.printf(
          Locale.ROOT,
          "nexmark-kafka-q1 (flink): %d records, parallelism %d, checkpoints every %d ms: wall %.3f s, "
              + "%.0f records/s, cpu %.3f s (%.3f s per million), peak RSS %.1f MiB, output topic %d "
              + "records (job %s, %d ms net runtime)%n",
          records, o.parallelism, o.checkpointIntervalMs, wall, n / wall, cpu, cpu * 1e6 / n, rssMib,
          outputRecords, result.getJobID(), result.getNetRuntime());
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
    if (o.parallelism < 1 || o.checkpointIntervalMs < 1) {
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
