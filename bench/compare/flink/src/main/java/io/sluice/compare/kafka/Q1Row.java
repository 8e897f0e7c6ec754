package io.sluice.compare.kafka;

import com.fasterxml.jackson.annotation.JsonPropertyOrder;
import java.math.BigDecimal;

/**
 * A row of Nexmark query 1 (bench/nexmark/queries.h Q1Result): a bid with its price converted to euros.
 *
 * <p>{@code price} is the exact DECIMAL(23, 3) value {@code 0.908 * price}: {@code BigDecimal.valueOf(908 *
 * price, 3)}, written as plain text with exactly three decimals ({@code 1234 -> 1120.472}), as the Sluice side
 * writes it. The property order is the output's field order.
 */
@JsonPropertyOrder({"auction", "bidder", "price", "dateTime", "extra"})
public class Q1Row {
  public long auction;
  public long bidder;
  public BigDecimal price;
  public long dateTime;
  public String extra;

  public Q1Row() {}

  public Q1Row(long auction, long bidder, BigDecimal price, long dateTime, String extra) {
    this.auction = auction;
    this.bidder = bidder;
    this.price = price;
    this.dateTime = dateTime;
    this.extra = extra;
  }
}
