package io.sluice.compare.model;

/** A bid on an auction (bench/nexmark/model.h Bid). Price in cents, time in ms since epoch. */
public class Bid {
  public long auction;
  public long bidder;
  public long price;
  public String channel;
  public String url;
  public long dateTime;
  public String extra;

  public Bid() {}
}
