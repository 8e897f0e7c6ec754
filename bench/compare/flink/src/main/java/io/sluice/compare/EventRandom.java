package io.sluice.compare;

/**
 * A SplitMix64 random stream, one per event, seeded from (seed, event number): a bit-exact port of
 * bench/nexmark/generator.h EventRandom. Java longs stand for the C++ uint64_t values; every operation
 * below gives the same 64 bits as its unsigned C++ counterpart. Not thread-safe (one per event).
 */
public final class EventRandom {
  /** The SplitMix64 increment (the golden ratio in 64-bit fixed point). */
  static final long GAMMA = 0x9E3779B97F4A7C15L;

  private long state;

  /** The stream of event {@code eventNumber} under {@code seed} (C++ EventRandom(seed, event_number)). */
  public EventRandom(long seed, long eventNumber) {
    state = splitmix64(seed ^ splitmix64(eventNumber));
  }

  /** SplitMix64's mixer: a port of include/sluice/connectors/datagen.h splitmix64. */
  public static long splitmix64(long x) {
    x += GAMMA;
    x = (x ^ (x >>> 30)) * 0xBF58476D1CE4E5B9L;
    x = (x ^ (x >>> 27)) * 0x94D049BB133111EBL;
    return x ^ (x >>> 31);
  }

  /** The next 64 random bits (C++ next_u64). */
  public long nextU64() {
    long r = splitmix64(state);
    state += GAMMA;
    return r;
  }

  /** Uniform in [0, bound), bound > 0 (C++ next_int: Lemire's multiply-shift on the high 32 bits). */
  public int nextInt(int bound) {
    // (high 32 bits) * bound < 2^63, so the signed product equals the unsigned one.
    return (int) (((nextU64() >>> 32) * bound) >>> 32);
  }

  /** Uniform in [0, bound), bound > 0 (C++ next_long). */
  public long nextLong(long bound) {
    if (bound <= Integer.MAX_VALUE) return nextInt((int) bound);
    return Long.remainderUnsigned(nextU64(), bound);
  }

  /** Uniform in [0, 1) from the high 53 bits (C++ next_double). */
  public double nextDouble() {
    // The shifted value has at most 53 bits, so the conversion is exact, as in C++.
    return (double) (nextU64() >>> 11) * 0x1.0p-53;
  }
}
