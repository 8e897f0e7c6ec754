package io.sluice.compare;

import java.math.BigDecimal;

/**
 * Prints the generator checksum of events 0..N-1 in the format of {@code sluice-bench nexmark-checksum}
 * (bench/sluice_bench.cc run_nexmark_checksum), so a script can compare the two lines:
 * {@code nexmark checksum: events N, rate R, seed S: <16 hex digits>}.
 *
 * <p>Usage: {@code ChecksumMain --events N [--seed S] [--rate R]}. Also prints the generation time to stderr.
 */
public final class ChecksumMain {
  private ChecksumMain() {}

  /** Parses the options, computes {@link Checksum#of(NexmarkConfig, long)} and prints the line. */
  public static void main(String[] args) {
    NexmarkConfig config = new NexmarkConfig();
    long events = config.events;
    for (int i = 0; i < args.length; ++i) {
      String arg = args[i];
      if (i + 1 >= args.length) usage("missing value for " + arg);
      String value = args[++i];
      switch (arg) {
        case "-n":
        case "--events":
          events = Long.parseLong(value);
          break;
        case "--seed":
          // The C++ seed is a uint64_t.
          config.seed = value.startsWith("-") ? Long.parseLong(value) : Long.parseUnsignedLong(value);
          break;
        case "-r":
        case "--rate":
          config.rate = Double.parseDouble(value);
          break;
        default:
          usage("unknown option " + arg);
      }
    }
    config.events = events;
    long start = System.nanoTime();
    long sum;
    try {
      sum = Checksum.of(config, events);
    } catch (IllegalArgumentException ex) {
      System.err.println("error: " + ex.getMessage());
      System.exit(2);
      return;
    }
    double seconds = (System.nanoTime() - start) / 1e9;
    System.out.printf("nexmark checksum: events %d, rate %s, seed %s: %016x%n", events, formatDouble(config.rate),
        Long.toUnsignedString(config.seed), sum);
    System.err.printf("generated and hashed %d events in %.3f s%n", events, seconds);
  }

  /**
   * A finite positive double as fmt's "{}" prints it: the shortest digits that round-trip, in plain
   * decimal when the decimal exponent is in [-4, 16), else as d[.ddd]e+XX / e-XX (at least two exponent
   * digits). Java 17's Double.toString gives the round-trip digits (it may print one digit more than the
   * shortest in rare cases, which does not occur for ordinary rates).
   */
  static String formatDouble(double v) {
    BigDecimal d = new BigDecimal(Double.toString(v)).stripTrailingZeros();
    String digits = d.unscaledValue().abs().toString();
    int exponent = digits.length() - 1 - d.scale();
    if (exponent >= -4 && exponent < 16) return d.toPlainString();
    String mantissa = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
    String sign = v < 0 ? "-" : "";
    return String.format("%s%se%s%02d", sign, mantissa, exponent < 0 ? "-" : "+", Math.abs(exponent));
  }

  private static void usage(String why) {
    System.err.println("error: " + why);
    System.err.println("usage: ChecksumMain --events N [--seed S] [--rate R]");
    System.exit(2);
  }
}
