package io.sluice.compare.queries;

/**
 * The result rows of the queries (Sluice: bench/nexmark/queries.h Q1Result ... Q8Result), and the small
 * records the queries project events onto before a shuffle. All are Flink POJOs (public fields, public
 * no-argument constructor), so Flink serializes them with its PojoSerializer rather than Kryo.
 */
public final class Results {
  private Results() {}

  /** A row of query 1: a bid with its price converted to euros (Sluice Q1Result). */
  public static class Q1Result {
    public long auction;
    public long bidder;
    /** 908 * the bid's price: the exact unscaled value of the SQL's DECIMAL(23, 3) {@code 0.908 * price}. */
    public long priceE3;
    public long dateTime;
    public String extra;

    public Q1Result() {}

    public Q1Result(long auction, long bidder, long priceE3, long dateTime, String extra) {
      this.auction = auction;
      this.bidder = bidder;
      this.priceE3 = priceE3;
      this.dateTime = dateTime;
      this.extra = extra;
    }
  }

  /** A row of query 2 (Sluice Q2Result). */
  public static class Q2Result {
    public long auction;
    /** Cents. */
    public long price;

    public Q2Result() {}

    public Q2Result(long auction, long price) {
      this.auction = auction;
      this.price = price;
    }
  }

  /** A person of OR, ID or CA, as query 3 needs it (Sluice Q3Seller). */
  public static class Q3Seller {
    public long id;
    public String name;
    public String city;
    public String state;

    public Q3Seller() {}

    public Q3Seller(long id, String name, String city, String state) {
      this.id = id;
      this.name = name;
      this.city = city;
      this.state = state;
    }
  }

  /** A category-10 auction, as query 3 needs it (Sluice Q3Auction). */
  public static class Q3Auction {
    public long id;
    public long seller;

    public Q3Auction() {}

    public Q3Auction(long id, long seller) {
      this.id = id;
      this.seller = seller;
    }
  }

  /** A row of query 3: a seller in OR, ID or CA and one of their category-10 auctions (Sluice Q3Result). */
  public static class Q3Result {
    public String name;
    public String city;
    public String state;
    /** The auction's id. */
    public long id;

    public Q3Result() {}

    public Q3Result(String name, String city, String state, long id) {
      this.name = name;
      this.city = city;
      this.state = state;
      this.id = id;
    }
  }

  /** An auction, as query 4 needs it (Sluice Q4Auction). */
  public static class Q4Auction {
    public long id;
    public long category;
    public long dateTime;
    public long expires;

    public Q4Auction() {}

    public Q4Auction(long id, long category, long dateTime, long expires) {
      this.id = id;
      this.category = category;
      this.dateTime = dateTime;
      this.expires = expires;
    }
  }

  /** A bid, as query 4 needs it (Sluice Q4Bid). */
  public static class Q4Bid {
    public long auction;
    public long price;
    public long dateTime;

    public Q4Bid() {}

    public Q4Bid(long auction, long price, long dateTime) {
      this.auction = auction;
      this.price = price;
      this.dateTime = dateTime;
    }
  }

  /** An open auction and its best qualifying price so far, NO_WINNER before the first (Sluice Q4Open). */
  public static class Q4Open {
    public static final long NO_WINNER = -1;
    public Q4Auction auction;
    public long best = NO_WINNER;

    public Q4Open() {}

    public Q4Open(Q4Auction auction) {
      this.auction = auction;
    }
  }

  /** The winning price of a closed auction, emitted at its expires (Sluice Q4Winner). */
  public static class Q4Winner {
    public long category;
    public long price;

    public Q4Winner() {}

    public Q4Winner(long category, long price) {
      this.category = category;
      this.price = price;
    }
  }

  /** A sum and count of winning prices (Sluice Q4Totals). */
  public static class Q4Totals {
    public long sum;
    public long count;

    public Q4Totals() {}
  }

  /** A row of query 4: the average winning price of a category's closed auctions so far (Sluice Q4Result). */
  public static class Q4Result {
    public long category;
    /** Cents, truncated: the SQL's AVG over a BIGINT column is a BIGINT. */
    public long average;

    public Q4Result() {}

    public Q4Result(long category, long average) {
      this.category = category;
      this.average = average;
    }
  }

  /** The bids on one auction in one 2 s pane (Sluice Q5PaneCount). */
  public static class Q5PaneCount {
    public long auction;
    public long count;

    public Q5PaneCount() {}

    public Q5PaneCount(long auction, long count) {
      this.auction = auction;
      this.count = count;
    }
  }

  /** A row of query 5: an auction with the most bids of a sliding window (Sluice Q5Result). */
  public static class Q5Result {
    public long auction;
    /** Bids on the auction in the window. */
    public long num;
    public long windowStart;
    /** Exclusive. */
    public long windowEnd;

    public Q5Result() {}

    public Q5Result(long auction, long num, long windowStart, long windowEnd) {
      this.auction = auction;
      this.num = num;
      this.windowStart = windowStart;
      this.windowEnd = windowEnd;
    }
  }

  /** A row of query 7: a bid with the highest price of a tumbling window (Sluice Q7Result). */
  public static class Q7Result {
    public long auction;
    /** Cents. */
    public long price;
    public long bidder;
    public long dateTime;
    public String extra;

    public Q7Result() {}

    public Q7Result(long auction, long price, long bidder, long dateTime, String extra) {
      this.auction = auction;
      this.price = price;
      this.bidder = bidder;
      this.dateTime = dateTime;
      this.extra = extra;
    }
  }

  /**
   * A bid that may be the highest of the window starting at windowStart: a member of the window, or
   * (boundary) a bid at exactly the window's end, which the SQL's inclusive BETWEEN also matches (Sluice
   * Q7Candidate).
   */
  public static class Q7Candidate {
    public long windowStart;
    public boolean boundary;
    public Q7Result bid;

    public Q7Candidate() {}

    public Q7Candidate(long windowStart, boolean boundary, Q7Result bid) {
      this.windowStart = windowStart;
      this.boundary = boundary;
      this.bid = bid;
    }
  }

  /** A person, as query 8 needs it (Sluice Q8Person). */
  public static class Q8Person {
    public long id;
    public String name;
    public long dateTime;

    public Q8Person() {}

    public Q8Person(long id, String name, long dateTime) {
      this.id = id;
      this.name = name;
      this.dateTime = dateTime;
    }
  }

  /** A row of query 8: a person who registered and created an auction in the same window (Sluice Q8Result). */
  public static class Q8Result {
    public long id;
    public String name;
    public long windowStart;

    public Q8Result() {}

    public Q8Result(long id, String name, long windowStart) {
      this.id = id;
      this.name = name;
      this.windowStart = windowStart;
    }
  }
}
