package io.sluice.compare;

import io.sluice.compare.model.Auction;
import io.sluice.compare.model.Bid;
import io.sluice.compare.model.Event;
import io.sluice.compare.model.Person;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;

/**
 * Event number n to one Person, Auction or Bid: a bit-exact port of bench/nexmark/generator.cc
 * NexmarkGenerator, so both engines compute on identical events (proved by {@link Checksum}). Java longs
 * stand for the C++ uint64_t values where the C++ is unsigned; every step gives the same bits. Immutable
 * after construction, so one instance may be shared by any number of threads (Flink source readers).
 */
public final class NexmarkGenerator implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Ids start at these offsets so that queries find matches even on small inputs (generator.h). */
  public static final long FIRST_PERSON_ID = 1000;
  public static final long FIRST_AUCTION_ID = 1000;
  public static final long FIRST_CATEGORY_ID = 10;
  public static final long NUM_CATEGORIES = 5;
  public static final long PERSON_ID_LEAD = 10;
  public static final long AUCTION_ID_LEAD = 10;
  public static final long HOT_SELLER_BATCH = 100;
  public static final long HOT_BIDDER_BATCH = 100;
  public static final long HOT_AUCTION_BATCH = 100;
  public static final int HOT_CHANNELS_RATIO = 2;
  public static final int NUM_CHANNELS = 10_000;

  private static final String[] US_STATES = {"AZ", "CA", "ID", "OR", "WA", "WY"};
  private static final String[] US_CITIES = {
    "Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"
  };
  private static final String[] FIRST_NAMES = {
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"
  };
  private static final String[] LAST_NAMES = {
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"
  };
  private static final String[] HOT_CHANNELS = {"Google", "Facebook", "Baidu", "Apple"};
  /** "first last" for every pair, built once: Java strings are immutable, so sharing them costs nothing. */
  private static final String[][] FULL_NAMES = fullNames();

  private static final int MIN_STRING_LENGTH = 3;
  private static final int FIXED_PERSON_BYTES = 8;
  private static final int FIXED_AUCTION_BYTES = 8 + 8 + 8 + 8 + 8 + 8;
  private static final int FIXED_BID_BYTES = 8 + 8 + 8 + 8;
  private static final long HOT_URL_SEED = 0x6e65786d61726b01L;
  private static final long CHANNEL_URL_SEED = 0x6e65786d61726b02L;
  private static final long EXTRA_POOL_SEED = 0x6e65786d61726b03L;
  private static final int MAX_RANDOM_STRING_LENGTH = 128;
  /** Scratch for one random string plus the up to 3 letters a four-per-draw fill writes past its end. */
  private static final int SCRATCH_BYTES = MAX_RANDOM_STRING_LENGTH + 8;
  private static final long EXTRA_POOL_OFFSETS = 1L << 16;

  private static final double SIX_LOG2_TEN = 19.931568569324174;
  private static final double LN2 = 0.6931471805599453;
  private static final double SQRT2 = 1.4142135623730951;
  private static final double[] POWERS_OF_TWO = powersOfTwo();

  /** A private copy, so that callers mutating their NexmarkConfig cannot change this generator. */
  private final NexmarkConfig config;
  private final long seed;
  private final long baseTimeMs;
  private final int personProportion;
  private final int auctionProportion;
  private final int totalProportion;
  private final double interEventDelayUs;
  /** Events it takes to create numInFlightAuctions auctions (an auction's average lifetime). */
  private final long eventsForAuctions;
  /** ceil(2^64 / total proportion), for the multiply-high division of C++ position(). */
  private final long epochMultiplier;
  /** Random letters that paddings are sliced from; derived from the config, so rebuilt on deserialization. */
  private final transient String extraPool;

  /** A generator for {@code config}, which must pass C++ NexmarkConfig::validate (checked here). */
  public NexmarkGenerator(NexmarkConfig config) {
    validate(config);
    this.config = copy(config);
    this.seed = config.seed;
    this.baseTimeMs = config.baseTimeMs;
    this.personProportion = config.personProportion;
    this.auctionProportion = config.auctionProportion;
    this.totalProportion = config.totalProportion();
    this.interEventDelayUs = 1_000_000.0 / config.rate;
    this.eventsForAuctions = ((long) config.numInFlightAuctions * totalProportion) / auctionProportion;
    // total >= 3, so the ceiling fits in 64 bits (and even below 2^63).
    this.epochMultiplier = Long.divideUnsigned(-1L, totalProportion) + 1;
    this.extraPool = makeExtraPool(config);
  }

  /** A copy of the config this generator was built with. */
  public NexmarkConfig config() {
    return copy(config);
  }

  /** Event number n (>= 0); depends only on the config and n (C++ event). */
  public Event event(long n) {
    Event e = new Event();
    eventInto(n, e);
    return e;
  }

  /**
   * Writes event n into {@code out}, equal to {@link #event}: a port of C++ event_into. When {@code out}
   * already holds a record of the same type that record object is refilled, so a reused Event allocates
   * only the record's new strings.
   */
  public void eventInto(long n, Event out) {
    final long ts = timestamp(n);
    final long epoch = epochOf(n);
    final long offset = n - epoch * totalProportion;
    final EventRandom rng = new EventRandom(seed, n);
    switch (typeAt(offset)) {
      case Event.PERSON: {
        Person p = out.type == Event.PERSON && out.person != null ? out.person : new Person();
        out.type = Event.PERSON;
        out.person = p;
        out.auction = null;
        out.bid = null;
        makePerson(epoch, offset, ts, rng, p);
        return;
      }
      case Event.AUCTION: {
        Auction a = out.type == Event.AUCTION && out.auction != null ? out.auction : new Auction();
        out.type = Event.AUCTION;
        out.person = null;
        out.auction = a;
        out.bid = null;
        makeAuction(n, epoch, offset, ts, rng, a);
        return;
      }
      default: {
        Bid b = out.type == Event.BID && out.bid != null ? out.bid : new Bid();
        out.type = Event.BID;
        out.person = null;
        out.auction = null;
        out.bid = b;
        makeBid(epoch, offset, ts, rng, b);
      }
    }
  }

  /** The event time of event n, ms since epoch: base + floor(n * inter-event delay us) / 1000 (C++ timestamp). */
  public long timestamp(long n) {
    return baseTimeMs + (long) ((double) n * interEventDelayUs) / 1000;
  }

  /** The type of event n ({@link Event#PERSON}, AUCTION or BID), from n modulo the total proportion (C++ type_of). */
  public byte typeOf(long n) {
    return typeAt(n - epochOf(n) * totalProportion);
  }

  /** The last base-0 person id created at or before event n (C++ last_base0_person_id). */
  public long lastBase0PersonId(long n) {
    long epoch = epochOf(n);
    return lastPerson(epoch, n - epoch * totalProportion);
  }

  /** The last base-0 auction id created at or before event n, -1 before the first (C++ last_base0_auction_id). */
  public long lastBase0AuctionId(long n) {
    long epoch = epochOf(n);
    return lastAuction(epoch, n - epoch * totalProportion);
  }

  /** A random active person at event n, or up to PERSON_ID_LEAD ahead (C++ next_base0_person_id). */
  public long nextBase0PersonId(long n, EventRandom rng) {
    long epoch = epochOf(n);
    return nextPerson(epoch, n - epoch * totalProportion, rng);
  }

  /** A random auction in flight at event n, or up to AUCTION_ID_LEAD ahead (C++ next_base0_auction_id). */
  public long nextBase0AuctionId(long n, EventRandom rng) {
    long epoch = epochOf(n);
    return nextAuction(epoch, n - epoch * totalProportion, rng);
  }

  // ---- Position and id spaces (C++ position, type_at, last_person, last_auction, next_person, next_auction).

  /** n / total proportion, truncated as C++ integer division; a multiply for 0 <= n < 2^32 as in C++. */
  private long epochOf(long n) {
    if (n >= 0 && n <= 0xFFFFFFFFL) {
      // Unsigned high half of epochMultiplier * n: both are below 2^63 here, so the signed high half is it.
      return Math.multiplyHigh(epochMultiplier, n);
    }
    return n / totalProportion;
  }

  private byte typeAt(long offset) {
    if (offset < personProportion) return Event.PERSON;
    if (offset < personProportion + auctionProportion) return Event.AUCTION;
    return Event.BID;
  }

  private long lastPerson(long epoch, long offset) {
    // An auction or a bid: the last person of this epoch.
    return epoch * personProportion + Math.min(offset, personProportion - 1);
  }

  private long lastAuction(long epoch, long offset) {
    if (offset < personProportion) {
      // A person: the last auction of the previous epoch.
      --epoch;
      offset = auctionProportion - 1;
    } else if (offset >= personProportion + auctionProportion) {
      // A bid: the last auction of this epoch.
      offset = auctionProportion - 1;
    } else {
      offset -= personProportion;
    }
    return epoch * auctionProportion + offset;
  }

  private long nextPerson(long epoch, long offset, EventRandom rng) {
    long numPeople = lastPerson(epoch, offset) + 1;
    long active = Math.min(numPeople, config.numActivePeople);
    return numPeople - active + rng.nextLong(active + PERSON_ID_LEAD);
  }

  private long nextAuction(long epoch, long offset, EventRandom rng) {
    long maxAuction = lastAuction(epoch, offset);
    long minAuction = Math.max(maxAuction - config.numInFlightAuctions, 0);
    return minAuction + rng.nextLong(maxAuction - minAuction + 1 + AUCTION_ID_LEAD);
  }

  // ---- Records (C++ make_person, make_auction, make_bid): the draws in exactly the C++ order.

  private void makePerson(long epoch, long offset, long ts, EventRandom rng, Person p) {
    p.id = lastPerson(epoch, offset) + FIRST_PERSON_ID;
    int first = rng.nextInt(FIRST_NAMES.length);
    int last = rng.nextInt(LAST_NAMES.length);
    p.name = FULL_NAMES[first][last];
    byte[] buf = new byte[SCRATCH_BYTES];
    int end = appendString(buf, 0, rng, 7, (byte) ' ');
    buf[end++] = '@';
    end = appendString(buf, end, rng, 5, (byte) ' ');
    buf[end++] = '.';
    buf[end++] = 'c';
    buf[end++] = 'o';
    buf[end++] = 'm';
    p.emailAddress = ascii(buf, end);
    p.creditCard = creditCard(buf, rng);
    p.city = US_CITIES[rng.nextInt(US_CITIES.length)];
    p.state = US_STATES[rng.nextInt(US_STATES.length)];
    p.dateTime = ts;
    int currentSize = FIXED_PERSON_BYTES + p.name.length() + p.emailAddress.length() + p.creditCard.length()
        + p.city.length() + p.state.length();
    p.extra = extra(rng, currentSize, config.avgPersonByteSize);
  }

  private void makeAuction(long n, long epoch, long offset, long ts, EventRandom rng, Auction a) {
    a.id = lastAuction(epoch, offset) + FIRST_AUCTION_ID;
    long seller;
    if (rng.nextInt(config.hotSellersRatio) > 0) {
      // A hot seller: the first person of the batch of the last HOT_SELLER_BATCH persons.
      seller = (lastPerson(epoch, offset) / HOT_SELLER_BATCH) * HOT_SELLER_BATCH;
    } else {
      seller = nextPerson(epoch, offset, rng);
    }
    a.seller = seller + FIRST_PERSON_ID;
    a.category = FIRST_CATEGORY_ID + rng.nextInt((int) NUM_CATEGORIES);
    a.initialBid = nextPrice(rng);
    // The auction lasts on average until numInFlightAuctions more auctions have been created.
    long horizonMs = timestamp(n + eventsForAuctions) - ts;
    a.dateTime = ts;
    a.expires = ts + 1 + rng.nextLong(Math.max(horizonMs * 2, 1));
    byte[] buf = new byte[SCRATCH_BYTES];
    a.itemName = ascii(buf, appendString(buf, 0, rng, 20, (byte) ' '));
    a.description = ascii(buf, appendString(buf, 0, rng, 100, (byte) ' '));
    a.reserve = a.initialBid + nextPrice(rng);
    int currentSize = FIXED_AUCTION_BYTES + a.itemName.length() + a.description.length();
    a.extra = extra(rng, currentSize, config.avgAuctionByteSize);
  }

  private void makeBid(long epoch, long offset, long ts, EventRandom rng, Bid b) {
    long auction;
    if (rng.nextInt(config.hotAuctionRatio) > 0) {
      // A hot auction: the first of the batch of the last HOT_AUCTION_BATCH auctions.
      auction = (lastAuction(epoch, offset) / HOT_AUCTION_BATCH) * HOT_AUCTION_BATCH;
    } else {
      auction = nextAuction(epoch, offset, rng);
    }
    b.auction = auction + FIRST_AUCTION_ID;
    long bidder;
    if (rng.nextInt(config.hotBiddersRatio) > 0) {
      // A hot bidder: the second person of the batch (so hot bidders and hot sellers differ).
      bidder = (lastPerson(epoch, offset) / HOT_BIDDER_BATCH) * HOT_BIDDER_BATCH + 1;
    } else {
      bidder = nextPerson(epoch, offset, rng);
    }
    b.bidder = bidder + FIRST_PERSON_ID;
    b.price = nextPrice(rng);
    ChannelTable channels = ChannelTable.INSTANCE;
    if (rng.nextInt(HOT_CHANNELS_RATIO) > 0) {
      int c = rng.nextInt(HOT_CHANNELS.length);
      b.channel = channels.hotNames[c];
      b.url = channels.hotUrls[c];
    } else {
      int c = rng.nextInt(NUM_CHANNELS);
      b.channel = channels.otherNames[c];
      b.url = channels.otherUrls[c];
    }
    b.dateTime = ts;
    b.extra = extra(rng, FIXED_BID_BYTES, config.avgBidByteSize);
  }

  // ---- Strings (C++ random_char, append_string, four_letters, next_exact_string, assign_extra, ...).

  /**
   * One character of a random string from 16 random bits v (C++ random_char): {@code special} when
   * v * 13 < 2^16, else a letter from the rest of the range.
   */
  private static byte randomChar(long v, byte special) {
    long t = v * 13;
    if (t < 0x10000) return special;
    return (byte) ('a' + ((t - 0x10000) * 26) / (12 * 0x10000));
  }

  /**
   * Writes a random string of MIN_STRING_LENGTH..maxLength-1 characters at {@code buf[pos]}, trimmed of
   * surrounding spaces when {@code special} is a space, and returns its end (C++ append_string). Four
   * characters per draw; the last draw may write up to 3 bytes past the string, which buf must have room for.
   */
  private static int appendString(byte[] buf, int pos, EventRandom rng, int maxLength, byte special) {
    int len = MIN_STRING_LENGTH + rng.nextInt(maxLength - MIN_STRING_LENGTH);
    for (int i = 0; i < len; i += 4) {
      long r = rng.nextU64();
      for (int k = 0; k < 4; ++k) buf[pos + i + k] = randomChar((r >>> (16 * k)) & 0xFFFF, special);
    }
    int first = pos;
    int last = pos + len;
    if (special == ' ') {
      while (first < last && buf[first] == ' ') ++first;
      while (last > first && buf[last - 1] == ' ') --last;
    }
    if (first > pos) System.arraycopy(buf, first, buf, pos, last - first);
    return pos + (last - first);
  }

  /** The first {@code length} bytes of {@code buf} (ASCII) as a String. */
  private static String ascii(byte[] buf, int length) {
    return new String(buf, 0, length, StandardCharsets.ISO_8859_1);
  }

  /**
   * {@code length} random lowercase letters, four per draw, letter k of a draw being
   * ((bits 16k..16k+15) * 26) >> 16 (C++ next_exact_string with four_letters, whose little-endian word puts
   * lane k at byte k).
   */
  private static byte[] nextExactLetters(EventRandom rng, int length) {
    byte[] s = new byte[length];
    for (int i = 0; i < length; i += 4) {
      long r = rng.nextU64();
      for (int k = 0; k < 4 && i + k < length; ++k) {
        s[i + k] = (byte) ('a' + ((((r >>> (16 * k)) & 0xFFFF) * 26) >>> 16));
      }
    }
    return s;
  }

  /** Java's Math.round for the non-negative values used here, as C++ java_round computes it. */
  private static long javaRound(double x) {
    return (long) Math.floor(x + 0.5);
  }

  /** The half-width of the padding length around {@code remaining} bytes (C++ extra_delta). */
  private static int extraDelta(int remaining) {
    return (int) javaRound(remaining * 0.2);
  }

  /**
   * Padding so that currentSize + padding averages desiredAverageSize (C++ assign_extra): one draw whose
   * high 32 bits choose the length in [remaining - delta, remaining + delta) and low 32 bits the pool offset.
   */
  private String extra(EventRandom rng, int currentSize, int desiredAverageSize) {
    if (currentSize > desiredAverageSize) return "";
    int remaining = desiredAverageSize - currentSize;
    int delta = extraDelta(remaining);
    long r = rng.nextU64();
    long spread = 2L * delta;
    // The C++ products are uint64_t, so they wrap like Java's; the shifts are logical.
    int size = (int) ((remaining - delta) + (((r >>> 32) * spread) >>> 32));
    int offset = (int) (((r & 0xFFFFFFFFL) * EXTRA_POOL_OFFSETS) >>> 32);
    return extraPool.substring(offset, offset + size);
  }

  /** EXTRA_POOL_OFFSETS letters plus the longest padding any record type can take (C++ make_extra_pool). */
  private static String makeExtraPool(NexmarkConfig config) {
    int maxAverage = Math.max(
        Math.max(config.avgPersonByteSize, config.avgAuctionByteSize), Math.max(config.avgBidByteSize, 0));
    int longest = maxAverage + extraDelta(maxAverage) + 1;
    EventRandom rng = new EventRandom(config.seed ^ EXTRA_POOL_SEED, 0);
    byte[] letters = nextExactLetters(rng, (int) EXTRA_POOL_OFFSETS + longest);
    return new String(letters, StandardCharsets.ISO_8859_1);
  }

  /** "dddd dddd dddd dddd" (C++ assign_credit_card), built in {@code buf}. */
  private static String creditCard(byte[] buf, EventRandom rng) {
    for (int group = 0; group < 4; ++group) {
      int v = rng.nextInt(10_000);
      for (int d = 3; d >= 0; --d) {
        buf[group * 5 + d] = (byte) ('0' + v % 10);
        v /= 10;
      }
      if (group < 3) buf[group * 5 + 4] = ' ';
    }
    return ascii(buf, 19);
  }

  /**
   * 10^(6u) for u in [0, 1) (C++ pow10_6u): 2^floor(y) times 2^(f - 1/2) sqrt(2) by a degree-12 Taylor
   * series, y = 6u log2(10). The same double operations in the same order as the C++ (which is built
   * without FMA contraction), so the same bits.
   */
  static double pow10By6u(double u) {
    double y = u * SIX_LOG2_TEN;
    int k = (int) y;
    double x = (y - k - 0.5) * LN2;
    double series = 1. / 479001600;
    series = series * x + 1. / 39916800;
    series = series * x + 1. / 3628800;
    series = series * x + 1. / 362880;
    series = series * x + 1. / 40320;
    series = series * x + 1. / 5040;
    series = series * x + 1. / 720;
    series = series * x + 1. / 120;
    series = series * x + 1. / 24;
    series = series * x + 1. / 6;
    series = series * x + 1. / 2;
    series = series * x + 1;
    series = series * x + 1;
    return POWERS_OF_TWO[k] * SQRT2 * series;
  }

  /** A price in cents, log-uniform between $1 and $1,000,000 (C++ next_price). */
  private static long nextPrice(EventRandom rng) {
    return javaRound(pow10By6u(rng.nextDouble()) * 100.0);
  }

  /** Integer.reverse then Math.abs, which leaves Integer.MIN_VALUE negative (C++ java_abs_reversed). */
  static long javaAbsReversed(int v) {
    return Math.abs(Integer.reverse(v));
  }

  /** "https://www.nexmark.com/" + three random path parts + "item.htm?query=1" (C++ base_url). */
  private static String baseUrl(EventRandom rng) {
    byte[] buf = new byte[SCRATCH_BYTES];
    byte[] prefix = "https://www.nexmark.com/".getBytes(StandardCharsets.ISO_8859_1);
    System.arraycopy(prefix, 0, buf, 0, prefix.length);
    int end = prefix.length;
    for (int i = 0; i < 3; ++i) {
      end = appendString(buf, end, rng, 5, (byte) '_');
      buf[end++] = '/';
    }
    return ascii(buf, end) + "item.htm?query=1";
  }

  /** The hot channels and the NUM_CHANNELS others with their URLs, from fixed seeds (C++ ChannelTable). */
  private static final class ChannelTable {
    static final ChannelTable INSTANCE = new ChannelTable();

    final String[] hotNames = new String[HOT_CHANNELS.length];
    final String[] hotUrls = new String[HOT_CHANNELS.length];
    final String[] otherNames = new String[NUM_CHANNELS];
    final String[] otherUrls = new String[NUM_CHANNELS];

    private ChannelTable() {
      for (int i = 0; i < HOT_CHANNELS.length; ++i) {
        hotNames[i] = HOT_CHANNELS[i];
        hotUrls[i] = baseUrl(new EventRandom(HOT_URL_SEED, i));
      }
      for (int c = 0; c < NUM_CHANNELS; ++c) {
        EventRandom rng = new EventRandom(CHANNEL_URL_SEED, c);
        otherNames[c] = "channel-" + c;
        String url = baseUrl(rng);
        if (rng.nextInt(10) > 0) url += "&channel_id=" + javaAbsReversed(c);
        otherUrls[c] = url;
      }
    }
  }

  private static String[][] fullNames() {
    String[][] names = new String[FIRST_NAMES.length][LAST_NAMES.length];
    for (int f = 0; f < FIRST_NAMES.length; ++f) {
      for (int l = 0; l < LAST_NAMES.length; ++l) names[f][l] = FIRST_NAMES[f] + " " + LAST_NAMES[l];
    }
    return names;
  }

  private static double[] powersOfTwo() {
    double[] p = new double[21];
    double v = 1;
    for (int i = 0; i < p.length; ++i) {
      p[i] = v;
      v *= 2;
    }
    return p;
  }

  /** The checks of C++ NexmarkConfig::validate, as IllegalArgumentException naming the field. */
  private static void validate(NexmarkConfig c) {
    if (c.events < 0) throw invalid("events must be >= 0, got " + c.events);
    if (!(c.rate > 0) || Double.isInfinite(c.rate)) {
      throw invalid("rate (events per second of event time) must be a positive number, got " + c.rate);
    }
    if (c.personProportion < 1 || c.auctionProportion < 1 || c.bidProportion < 1) {
      throw invalid("person, auction and bid proportions must each be >= 1, got " + c.personProportion + "/"
          + c.auctionProportion + "/" + c.bidProportion);
    }
    if (c.hotAuctionRatio < 1 || c.hotSellersRatio < 1 || c.hotBiddersRatio < 1) {
      throw invalid("hot auction, seller and bidder ratios must each be >= 1");
    }
    if (c.numActivePeople < 1 || c.numInFlightAuctions < 1) {
      throw invalid("numActivePeople and numInFlightAuctions must be >= 1");
    }
    if (c.avgPersonByteSize < 0 || c.avgAuctionByteSize < 0 || c.avgBidByteSize < 0) {
      throw invalid("average byte sizes must be >= 0");
    }
  }

  private static IllegalArgumentException invalid(String what) {
    return new IllegalArgumentException("nexmark config: " + what);
  }

  private static NexmarkConfig copy(NexmarkConfig c) {
    NexmarkConfig d = new NexmarkConfig();
    d.events = c.events;
    d.rate = c.rate;
    d.baseTimeMs = c.baseTimeMs;
    d.seed = c.seed;
    d.personProportion = c.personProportion;
    d.auctionProportion = c.auctionProportion;
    d.bidProportion = c.bidProportion;
    d.avgPersonByteSize = c.avgPersonByteSize;
    d.avgAuctionByteSize = c.avgAuctionByteSize;
    d.avgBidByteSize = c.avgBidByteSize;
    d.hotAuctionRatio = c.hotAuctionRatio;
    d.hotSellersRatio = c.hotSellersRatio;
    d.hotBiddersRatio = c.hotBiddersRatio;
    d.numActivePeople = c.numActivePeople;
    d.numInFlightAuctions = c.numInFlightAuctions;
    return d;
  }

  /** Rebuilds the transient pool (derived from the config) on deserialization, by reconstructing. */
  private Object readResolve() {
    return new NexmarkGenerator(config);
  }
}
