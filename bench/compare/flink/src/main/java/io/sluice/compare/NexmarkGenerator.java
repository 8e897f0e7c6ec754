package io.sluice.compare;

import io.sluice.compare.model.Event;
import java.io.Serializable;

/**
 * Event number n to one Person, Auction or Bid: a bit-exact port of bench/nexmark/generator.cc, so both
 * engines compute on identical events (proved by {@link Checksum}). Immutable after construction; thread-safe.
 */
public final class NexmarkGenerator implements Serializable {
  private static final long serialVersionUID = 1L;

  private final NexmarkConfig config;

  public NexmarkGenerator(NexmarkConfig config) {
    this.config = config;
  }

  public NexmarkConfig config() {
    return config;
  }

  /** Event number n (>= 0); depends only on the config and n. */
  public Event event(long n) {
    Event e = new Event();
    eventInto(n, e);
    return e;
  }

  /** Writes event n into {@code out} (reusing its record objects when of the same type). */
  public void eventInto(long n, Event out) {
    throw new UnsupportedOperationException("being ported");
  }

  /** The event time of event n, ms since epoch. */
  public long timestamp(long n) {
    throw new UnsupportedOperationException("being ported");
  }
}
