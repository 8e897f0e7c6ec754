package io.sluice.compare;

import com.dynatrace.hash4j.hashing.HashStream64;
import com.dynatrace.hash4j.hashing.Hashing;
import io.sluice.compare.model.Auction;
import io.sluice.compare.model.Bid;
import io.sluice.compare.model.Event;
import io.sluice.compare.model.Person;
import java.util.Arrays;

/**
 * The generator checksum: XXH3-64 (seed 0) over the canonical serialization of events (each event's
 * TypeSerializer&lt;Event&gt; bytes, docs/serialization.md, in order). A port of bench/nexmark/generator.cc
 * checksum, the reference that proves this generator equals the C++ one.
 *
 * <p>Each event is serialized into one reused buffer and fed to hash4j's streaming XXH3-64 (equal to the
 * reference XXH3_64bits of the concatenated bytes), so memory stays flat however many events (about 197
 * bytes each with the default config) are hashed.
 */
public final class Checksum {
  private Checksum() {}

  /** The checksum of events 0..count-1 of {@code config} (C++ checksum(config, count)). */
  public static long of(NexmarkConfig config, long count) {
    NexmarkGenerator gen = new NexmarkGenerator(config);
    HashStream64 hash = Hashing.xxh3_64().hashStream();
    Sink sink = new Sink(1024);
    Event e = new Event();
    for (long n = 0; n < count; ++n) {
      gen.eventInto(n, e);
      sink.size = 0;
      serialize(e, sink);
      hash.putBytes(sink.buf, 0, sink.size);
    }
    return hash.getAsLong();
  }

  /** The checksum of {@code events} in order (C++ checksum(span)). */
  public static long of(Iterable<Event> events) {
    HashStream64 hash = Hashing.xxh3_64().hashStream();
    Sink sink = new Sink(1024);
    for (Event e : events) {
      sink.size = 0;
      serialize(e, sink);
      hash.putBytes(sink.buf, 0, sink.size);
    }
    return hash.getAsLong();
  }

  /** The canonical bytes of one event (its TypeSerializer&lt;Event&gt; encoding). */
  public static byte[] serialize(Event e) {
    Sink sink = new Sink(256);
    serialize(e, sink);
    return Arrays.copyOf(sink.buf, sink.size);
  }

  /**
   * Appends the canonical bytes of {@code e}: the variant index as a varint, then the record's fields in
   * SLUICE_FIELDS order (bench/nexmark/model.h), int64 as 8 little-endian bytes, strings as varint length
   * plus bytes (ASCII, so one byte per char).
   */
  static void serialize(Event e, Sink out) {
    out.varint(e.type);
    switch (e.type) {
      case Event.PERSON: {
        Person p = e.person;
        out.int64(p.id);
        out.string(p.name);
        out.string(p.emailAddress);
        out.string(p.creditCard);
        out.string(p.city);
        out.string(p.state);
        out.int64(p.dateTime);
        out.string(p.extra);
        return;
      }
      case Event.AUCTION: {
        Auction a = e.auction;
        out.int64(a.id);
        out.string(a.itemName);
        out.string(a.description);
        out.int64(a.initialBid);
        out.int64(a.reserve);
        out.int64(a.dateTime);
        out.int64(a.expires);
        out.int64(a.seller);
        out.int64(a.category);
        out.string(a.extra);
        return;
      }
      case Event.BID: {
        Bid b = e.bid;
        out.int64(b.auction);
        out.int64(b.bidder);
        out.int64(b.price);
        out.string(b.channel);
        out.string(b.url);
        out.int64(b.dateTime);
        out.string(b.extra);
        return;
      }
      default:
        throw new IllegalArgumentException("event type " + e.type);
    }
  }

  /** A growable byte array with the encodings of docs/serialization.md. */
  static final class Sink {
    byte[] buf;
    int size;

    Sink(int capacity) {
      buf = new byte[Math.max(capacity, 16)];
    }

    private void ensure(int more) {
      if (buf.length - size >= more) return;
      buf = Arrays.copyOf(buf, Math.max(buf.length * 2, size + more));
    }

    /** Unsigned LEB128. */
    void varint(long v) {
      ensure(10);
      while ((v & ~0x7FL) != 0) {
        buf[size++] = (byte) ((v & 0x7F) | 0x80);
        v >>>= 7;
      }
      buf[size++] = (byte) v;
    }

    /** Fixed 8 bytes, little-endian. */
    void int64(long v) {
      ensure(8);
      for (int i = 0; i < 8; ++i) buf[size++] = (byte) (v >>> (8 * i));
    }

    /** Varint length, then the bytes (the strings are ASCII). */
    void string(String s) {
      int len = s.length();
      varint(len);
      ensure(len);
      for (int i = 0; i < len; ++i) buf[size++] = (byte) s.charAt(i);
    }
  }
}
