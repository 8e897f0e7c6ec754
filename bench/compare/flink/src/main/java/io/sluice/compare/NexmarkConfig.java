package io.sluice.compare;

import java.io.Serializable;

/** What to generate: the fields and defaults of bench/nexmark/generator.h NexmarkConfig. */
public class NexmarkConfig implements Serializable {
  private static final long serialVersionUID = 1L;

  public long events = 10_000_000L;
  /** Events per second of event time. */
  public double rate = 10_000;
  /** Event time of event 0, ms since epoch (2023-01-01T00:00:00Z). */
  public long baseTimeMs = 1_672_531_200_000L;
  public long seed = 0;

  public int personProportion = 1;
  public int auctionProportion = 3;
  public int bidProportion = 46;

  public int avgPersonByteSize = 200;
  public int avgAuctionByteSize = 500;
  public int avgBidByteSize = 100;

  public int hotAuctionRatio = 2;
  public int hotSellersRatio = 4;
  public int hotBiddersRatio = 4;

  public int numActivePeople = 1000;
  public int numInFlightAuctions = 100;

  public int totalProportion() {
    return personProportion + auctionProportion + bidProportion;
  }
}
