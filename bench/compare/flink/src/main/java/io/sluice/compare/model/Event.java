package io.sluice.compare.model;

/**
 * One Nexmark event: exactly one of person, auction, bid is non-null, and {@code type} says which (0, 1, 2:
 * the variant index of bench/nexmark/model.h Event). A POJO, so Flink serializes it with its PojoSerializer.
 */
public class Event {
  public static final byte PERSON = 0;
  public static final byte AUCTION = 1;
  public static final byte BID = 2;

  public byte type;
  public Person person;
  public Auction auction;
  public Bid bid;

  public Event() {}

  /** The event time of the record it carries, ms since epoch. */
  public long dateTime() {
    switch (type) {
      case PERSON:
        return person.dateTime;
      case AUCTION:
        return auction.dateTime;
      default:
        return bid.dateTime;
    }
  }
}
