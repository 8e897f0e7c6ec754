package io.sluice.compare.model;

/** An item put up for auction (bench/nexmark/model.h Auction). Money in cents, times in ms since epoch. */
public class Auction {
  public long id;
  public String itemName;
  public String description;
  public long initialBid;
  public long reserve;
  public long dateTime;
  public long expires;
  public long seller;
  public long category;
  public String extra;

  public Auction() {}
}
