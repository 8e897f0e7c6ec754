package io.sluice.compare.queries;

import io.sluice.compare.model.Auction;
import io.sluice.compare.model.Bid;
import io.sluice.compare.model.Event;
import io.sluice.compare.model.Person;
import io.sluice.compare.queries.Results.Q1Result;
import io.sluice.compare.queries.Results.Q2Result;
import io.sluice.compare.queries.Results.Q3Auction;
import io.sluice.compare.queries.Results.Q3Result;
import io.sluice.compare.queries.Results.Q3Seller;
import io.sluice.compare.queries.Results.Q4Auction;
import io.sluice.compare.queries.Results.Q4Bid;
import io.sluice.compare.queries.Results.Q4Open;
import io.sluice.compare.queries.Results.Q4Result;
import io.sluice.compare.queries.Results.Q4Totals;
import io.sluice.compare.queries.Results.Q4Winner;
import io.sluice.compare.queries.Results.Q5PaneCount;
import io.sluice.compare.queries.Results.Q5Result;
import io.sluice.compare.queries.Results.Q7Candidate;
import io.sluice.compare.queries.Results.Q7Result;
import io.sluice.compare.queries.Results.Q8Person;
import io.sluice.compare.queries.Results.Q8Result;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.FilterFunction;
import org.apache.flink.api.common.functions.FlatMapFunction;
import org.apache.flink.api.common.functions.JoinFunction;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.ReduceFunction;
import org.apache.flink.api.common.functions.RichFilterFunction;
import org.apache.flink.api.common.functions.RichFlatMapFunction;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.streaming.api.functions.co.KeyedCoProcessFunction;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.SlidingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * The Nexmark queries on Flink's DataStream API, with the semantics of Sluice's bench/nexmark/queries.h
 * (nexmark-flink's SQL over the bounded input: once the final watermark has fired every timer and window,
 * the results are the SQL's rows), so both engines produce the same rows from the same events. Each query
 * takes the event stream (timestamped with each event's dateTime, with watermarks no later event violates)
 * and returns its result stream.
 *
 * <p>Written as a Flink user would for speed, and with the same plan as Sluice's: events projected onto
 * the few fields a query needs before its first shuffle; queries that read two record types split them
 * with one ProcessFunction and a side output (two filters on one stream would each see every event);
 * incremental aggregates in windows; keyed state and event-time timers where Sluice uses them.
 */
public final class Queries {
  private Queries() {}

  /** Query 1's dollar-to-euro rate in thousandths: nexmark-flink computes {@code 0.908 * price}. */
  public static final long DOLLAR_TO_EURO_E3 = 908;
  /** Query 2 keeps bids on every 123rd auction ({@code MOD(auction, 123) = 0}). */
  public static final long Q2_AUCTION_MODULUS = 123;
  /** Query 3 keeps auctions of this category. */
  public static final long Q3_CATEGORY = 10;
  /** Query 5's sliding windows: 10 s every 2 s. */
  public static final long Q5_WINDOW_MS = 10_000;
  public static final long Q5_SLIDE_MS = 2_000;
  /** Queries 7 and 8 use tumbling windows of 10 s. */
  public static final long Q7_WINDOW_MS = 10_000;
  public static final long Q8_WINDOW_MS = 10_000;

  /** The query names this class implements, in order. */
  public static final List<String> NAMES = List.of("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8");

  /**
   * Builds query {@code name} (q0, q1, q2, q3, q4, q5, q7 or q8) over {@code events}; the stream returned
   * carries its result rows (Sluice: the kQueries table of bench/sluice_bench.cc).
   */
  public static DataStream<?> build(String name, DataStream<Event> events) {
    switch (name) {
      case "q0":
        return query0(events);
      case "q1":
        return query1(events);
      case "q2":
        return query2(events);
      case "q3":
        return query3(events);
      case "q4":
        return query4(events);
      case "q5":
        return query5(events);
      case "q7":
        return query7(events);
      case "q8":
        return query8(events);
      default:
        throw new IllegalArgumentException("unknown query '" + name + "'; available: " + NAMES);
    }
  }

  // ---- query 0 ----

  /** Query 0, pass-through: every event unchanged, through an identity map (Sluice query0). */
  public static DataStream<Event> query0(DataStream<Event> events) {
    return events.map(new IdentityEvent()).name("Q0 Pass Through");
  }

  /** The identity map of query 0. */
  static final class IdentityEvent implements MapFunction<Event, Event> {
    @Override
    public Event map(Event e) {
      return e;
    }
  }

  // ---- query 1 ----

  /** Query 1, currency conversion: every bid as (auction, bidder, 908 * price, dateTime, extra) (Sluice query1). */
  public static DataStream<Q1Result> query1(DataStream<Event> events) {
    return events.filter(new IsBid()).name("Q1 Bids").map(new Q1Convert()).name("Q1 Currency Conversion");
  }

  /** Keeps bids. */
  static final class IsBid implements FilterFunction<Event> {
    @Override
    public boolean filter(Event e) {
      return e.type == Event.BID;
    }
  }

  /** Query 1's projection (Sluice Q1Convert): price_e3 = 908 * price, exact in a long. */
  static final class Q1Convert implements MapFunction<Event, Q1Result> {
    @Override
    public Q1Result map(Event e) {
      Bid b = e.bid;
      return new Q1Result(b.auction, b.bidder, b.price * DOLLAR_TO_EURO_E3, b.dateTime, b.extra);
    }
  }

  // ---- query 2 ----

  /** Query 2, selection: (auction, price) of the bids whose auction id is a multiple of 123 (Sluice query2). */
  public static DataStream<Q2Result> query2(DataStream<Event> events) {
    return events.filter(new Q2Selection()).name("Q2 Selection").map(new Q2Project()).name("Q2 Project");
  }

  /** Keeps bids on every 123rd auction. */
  static final class Q2Selection implements FilterFunction<Event> {
    @Override
    public boolean filter(Event e) {
      return e.type == Event.BID && e.bid.auction % Q2_AUCTION_MODULUS == 0;
    }
  }

  /** Projects a bid onto (auction, price). */
  static final class Q2Project implements MapFunction<Event, Q2Result> {
    @Override
    public Q2Result map(Event e) {
      return new Q2Result(e.bid.auction, e.bid.price);
    }
  }

  // ---- query 3 ----

  /**
   * Query 3, local item suggestion: (name, city, state, auction id) for every category-10 auction whose
   * seller lives in OR, ID or CA (Sluice query3). An unwindowed inner join, incremental: persons keyed by
   * id and auctions by seller meet in a KeyedCoProcessFunction that keeps the person and the auctions still
   * waiting for it. State grows with the persons matched, as the SQL's regular join without a state TTL.
   */
  public static DataStream<Q3Result> query3(DataStream<Event> events) {
    OutputTag<Q3Auction> auctionsTag = new OutputTag<>("q3-auctions", TypeInformation.of(Q3Auction.class));
    SingleOutputStreamOperator<Q3Seller> sellers =
        events.process(new Q3Split(auctionsTag)).name("Q3 Sellers and Auctions");
    DataStream<Q3Auction> auctions = sellers.getSideOutput(auctionsTag);
    return sellers
        .connect(auctions)
        .keyBy(p -> p.id, a -> a.seller, Types.LONG)
        .process(new Q3IncrementalJoin())
        .name("Q3 Incremental Join")
        .uid("q3-join");
  }

  /** Routes OR/ID/CA persons to the main output and category-10 auctions to the side output, projected. */
  static final class Q3Split extends ProcessFunction<Event, Q3Seller> {
    private final OutputTag<Q3Auction> auctions;

    Q3Split(OutputTag<Q3Auction> auctions) {
      this.auctions = auctions;
    }

    @Override
    public void processElement(Event e, Context ctx, Collector<Q3Seller> out) {
      if (e.type == Event.PERSON) {
        Person p = e.person;
        if (isQ3State(p.state)) {
          out.collect(new Q3Seller(p.id, p.name, p.city, p.state));
        }
      } else if (e.type == Event.AUCTION) {
        Auction a = e.auction;
        if (a.category == Q3_CATEGORY) {
          ctx.output(auctions, new Q3Auction(a.id, a.seller));
        }
      }
    }

    private static boolean isQ3State(String state) {
      return "OR".equals(state) || "ID".equals(state) || "CA".equals(state);
    }
  }

  /** Per person id: the person once seen (input 1) and the ids of auctions that came before it (input 2). */
  static final class Q3IncrementalJoin extends KeyedCoProcessFunction<Long, Q3Seller, Q3Auction, Q3Result> {
    private transient ValueState<Q3Seller> person;
    private transient ListState<Long> waiting;

    @Override
    public void open(OpenContext openContext) {
      person = getRuntimeContext().getState(new ValueStateDescriptor<>("person", Q3Seller.class));
      waiting = getRuntimeContext().getListState(new ListStateDescriptor<>("auctions-waiting", Types.LONG));
    }

    @Override
    public void processElement1(Q3Seller p, Context ctx, Collector<Q3Result> out) throws Exception {
      Iterable<Long> early = waiting.get();
      if (early != null) {
        for (long auction : early) {
          out.collect(new Q3Result(p.name, p.city, p.state, auction));
        }
        waiting.clear();
      }
      person.update(p);
    }

    @Override
    public void processElement2(Q3Auction a, Context ctx, Collector<Q3Result> out) throws Exception {
      Q3Seller p = person.value();
      if (p != null) {
        out.collect(new Q3Result(p.name, p.city, p.state, a.id));
      } else {
        waiting.add(a.id);
      }
    }
  }

  // ---- query 4 ----

  /**
   * Query 4, average closing price per category (Sluice query4). An auction's winning price is the highest
   * price among the bids on it with dateTime in [auction.dateTime, auction.expires] (both inclusive); an
   * auction without one has no winner. When the watermark passes an auction's expires, its winner goes to
   * a per-category running average, which emits (category, average of every winner so far) once per
   * expiry instant that closed auctions of the category.
   */
  public static DataStream<Q4Result> query4(DataStream<Event> events) {
    OutputTag<Q4Bid> bidsTag = new OutputTag<>("q4-bids", TypeInformation.of(Q4Bid.class));
    SingleOutputStreamOperator<Q4Auction> auctions =
        events.process(new Q4Split(bidsTag)).name("Q4 Auctions and Bids");
    DataStream<Q4Bid> bids = auctions.getSideOutput(bidsTag);
    DataStream<Q4Winner> winners = auctions
        .connect(bids)
        .keyBy(a -> a.id, b -> b.auction, Types.LONG)
        .process(new Q4WinningBid())
        .name("Q4 Winning Bids")
        .uid("q4-winning-bids");
    return winners
        .keyBy(w -> w.category, Types.LONG)
        .process(new Q4CategoryAverage())
        .name("Q4 Average Per Category")
        .uid("q4-average");
  }

  /** Routes auctions to the main output and bids to the side output, projected. */
  static final class Q4Split extends ProcessFunction<Event, Q4Auction> {
    private final OutputTag<Q4Bid> bids;

    Q4Split(OutputTag<Q4Bid> bids) {
      this.bids = bids;
    }

    @Override
    public void processElement(Event e, Context ctx, Collector<Q4Auction> out) {
      if (e.type == Event.BID) {
        Bid b = e.bid;
        ctx.output(bids, new Q4Bid(b.auction, b.price, b.dateTime));
      } else if (e.type == Event.AUCTION) {
        Auction a = e.auction;
        out.collect(new Q4Auction(a.id, a.category, a.dateTime, a.expires));
      }
    }
  }

  /**
   * Per auction id: the open auction with its best qualifying bid, closed by an event-time timer at its
   * expires (Sluice Q4WinningBid). Bids that arrive before their auction wait in a list; one that no auction
   * can still take is dropped when the watermark passes its dateTime (an auction it qualifies for starts at
   * or before it, so it has arrived by then). Bids after the close find no auction and leave the same way.
   */
  static final class Q4WinningBid extends KeyedCoProcessFunction<Long, Q4Auction, Q4Bid, Q4Winner> {
    private transient ValueState<Q4Open> open;
    private transient ListState<Q4Bid> early;

    @Override
    public void open(OpenContext openContext) {
      open = getRuntimeContext().getState(new ValueStateDescriptor<>("open-auction", Q4Open.class));
      early = getRuntimeContext().getListState(new ListStateDescriptor<>("bids-before-auction", Q4Bid.class));
    }

    @Override
    public void processElement1(Q4Auction a, Context ctx, Collector<Q4Winner> out) throws Exception {
      Q4Open state = new Q4Open(a);
      Iterable<Q4Bid> waiting = early.get();
      if (waiting != null) {
        for (Q4Bid b : waiting) {
          take(state, b);
        }
        early.clear();
      }
      open.update(state);
      ctx.timerService().registerEventTimeTimer(a.expires);
    }

    @Override
    public void processElement2(Q4Bid b, Context ctx, Collector<Q4Winner> out) throws Exception {
      Q4Open current = open.value();
      if (current != null) {
        if (qualifies(current.auction, b) && b.price > current.best) {
          // The state holds its own copy (this input's records are deserialized, never reused), so
          // updating it in place and writing it back is safe on any state backend.
          current.best = b.price;
          open.update(current);
        }
        return;
      }
      early.add(b);
      ctx.timerService().registerEventTimeTimer(b.dateTime);
    }

    @Override
    public void onTimer(long t, OnTimerContext ctx, Collector<Q4Winner> out) throws Exception {
      Q4Open current = open.value();
      if (current != null) {
        if (t != current.auction.expires) {
          return; // an early bid's timer; its bid was taken when the auction came
        }
        if (current.best != Q4Open.NO_WINNER) {
          out.collect(new Q4Winner(current.auction.category, current.best));
        }
        open.clear();
        return;
      }
      Iterable<Q4Bid> waiting = early.get();
      if (waiting == null) {
        return;
      }
      List<Q4Bid> keep = new ArrayList<>();
      for (Q4Bid b : waiting) {
        if (b.dateTime > t) {
          keep.add(b);
        }
      }
      if (keep.isEmpty()) {
        early.clear();
      } else {
        early.update(keep);
      }
    }

    private static boolean qualifies(Q4Auction a, Q4Bid b) {
      return b.dateTime >= a.dateTime && b.dateTime <= a.expires;
    }

    private static void take(Q4Open state, Q4Bid b) {
      if (qualifies(state.auction, b) && b.price > state.best) {
        state.best = b.price;
      }
    }
  }

  /**
   * Per category: the running totals of winning prices (Sluice Q4CategoryAverage). Winners wait per
   * timestamp until the watermark passes it, so each emitted average covers every auction that closed up
   * to that instant, whatever order the upstream subtasks' winners arrive in: the output is the same at
   * every parallelism.
   */
  static final class Q4CategoryAverage extends KeyedProcessFunction<Long, Q4Winner, Q4Result> {
    private transient ValueState<Q4Totals> totals;
    private transient MapState<Long, Q4Totals> pending;

    @Override
    public void open(OpenContext openContext) {
      totals = getRuntimeContext().getState(new ValueStateDescriptor<>("totals", Q4Totals.class));
      pending = getRuntimeContext().getMapState(
          new MapStateDescriptor<>("winners-by-time", Types.LONG, TypeInformation.of(Q4Totals.class)));
    }

    @Override
    public void processElement(Q4Winner w, Context ctx, Collector<Q4Result> out) throws Exception {
      long ts = ctx.timestamp();
      Q4Totals at = pending.get(ts);
      if (at == null) {
        at = new Q4Totals();
      }
      at.sum += w.price;
      ++at.count;
      pending.put(ts, at);
      ctx.timerService().registerEventTimeTimer(ts);
    }

    @Override
    public void onTimer(long t, OnTimerContext ctx, Collector<Q4Result> out) throws Exception {
      Q4Totals at = pending.get(t);
      if (at == null) {
        return;
      }
      pending.remove(t);
      Q4Totals total = totals.value();
      if (total == null) {
        total = new Q4Totals();
      }
      total.sum += at.sum;
      total.count += at.count;
      totals.update(total);
      out.collect(new Q4Result(ctx.getCurrentKey(), total.sum / total.count));
    }
  }

  // ---- query 5 ----

  /**
   * Query 5, hot items: for every sliding window of 10 s every 2 s, the auctions with the most bids in it,
   * all of them on a tie (Sluice query5). Every such window is the union of five 2 s panes, so each bid is
   * counted once, in its pane (a tumbling window), and the sliding windows add up per-auction pane counts
   * (Flink's SQL slices hopping windows the same way). A pane count carries the pane's last millisecond as
   * its timestamp, which lies in exactly the sliding windows of every bid in the pane. A filter chained to
   * the sliding window forwards only counts that reach the subtask's running maximum of their window.
   */
  public static DataStream<Q5Result> query5(DataStream<Event> events) {
    DataStream<Long> bids = events.flatMap(new Q5BidAuctions()).name("Q5 Bid Auctions");
    DataStream<Q5PaneCount> panes = bids
        .keyBy(a -> a, Types.LONG)
        .window(TumblingEventTimeWindows.of(Duration.ofMillis(Q5_SLIDE_MS)))
        .aggregate(new CountBids(), new PaneCount())
        .name("Q5 Bids Per Auction And Pane")
        .uid("q5-panes");
    DataStream<Q5Result> counts = panes
        .keyBy(p -> p.auction, Types.LONG)
        .window(SlidingEventTimeWindows.of(Duration.ofMillis(Q5_WINDOW_MS), Duration.ofMillis(Q5_SLIDE_MS)))
        .aggregate(new SumPaneCounts(), new AuctionWindowCount())
        .name("Q5 Bids Per Auction And Window")
        .uid("q5-counts")
        .filter(new Q5LocalMaxFilter())
        .name("Q5 Local Maxima");
    return counts
        .keyBy(c -> c.windowEnd, Types.LONG)
        .process(new Q5HotItems())
        .name("Q5 Hot Items")
        .uid("q5-hot-items");
  }

  /** The auction of every bid. */
  static final class Q5BidAuctions implements FlatMapFunction<Event, Long> {
    @Override
    public void flatMap(Event e, Collector<Long> out) {
      if (e.type == Event.BID) {
        out.collect(e.bid.auction);
      }
    }
  }

  /** Counts the bids of a pane (the SQL's COUNT(*)). */
  static final class CountBids implements AggregateFunction<Long, Long, Long> {
    @Override
    public Long createAccumulator() {
      return 0L;
    }

    @Override
    public Long add(Long auction, Long count) {
      return count + 1;
    }

    @Override
    public Long getResult(Long count) {
      return count;
    }

    @Override
    public Long merge(Long a, Long b) {
      return a + b;
    }
  }

  /** Emits (auction, count) for one auction's pane. */
  static final class PaneCount extends ProcessWindowFunction<Long, Q5PaneCount, Long, TimeWindow> {
    @Override
    public void process(Long auction, Context ctx, Iterable<Long> counts, Collector<Q5PaneCount> out) {
      out.collect(new Q5PaneCount(auction, counts.iterator().next()));
    }
  }

  /** Adds up the pane counts of a sliding window. */
  static final class SumPaneCounts implements AggregateFunction<Q5PaneCount, Long, Long> {
    @Override
    public Long createAccumulator() {
      return 0L;
    }

    @Override
    public Long add(Q5PaneCount pane, Long count) {
      return count + pane.count;
    }

    @Override
    public Long getResult(Long count) {
      return count;
    }

    @Override
    public Long merge(Long a, Long b) {
      return a + b;
    }
  }

  /** Emits (auction, count, window) for one auction's sliding window. */
  static final class AuctionWindowCount extends ProcessWindowFunction<Long, Q5Result, Long, TimeWindow> {
    @Override
    public void process(Long auction, Context ctx, Iterable<Long> counts, Collector<Q5Result> out) {
      TimeWindow w = ctx.window();
      out.collect(new Q5Result(auction, counts.iterator().next(), w.getStart(), w.getEnd()));
    }
  }

  /**
   * Forwards the window counts that reach this subtask's running maximum of their window, ties included
   * (Sluice Q5LocalMaxFilter): a count below it is below the window's maximum. Chained to the window
   * operator, so only a few counts per window cross the network to Q5HotItems.
   */
  static final class Q5LocalMaxFilter extends RichFilterFunction<Q5Result> {
    /** Per subtask, created when the subtask opens: a cache, not state. */
    private transient RunningMaxima maxima;

    @Override
    public void open(OpenContext openContext) {
      maxima = new RunningMaxima();
    }

    @Override
    public boolean filter(Q5Result c) {
      int slot = maxima.slot(c.windowEnd);
      if (c.num < maxima.max(slot)) {
        return false;
      }
      maxima.setMax(slot, c.num);
      return true;
    }
  }

  /**
   * Per window end: the highest count seen and the auctions that reach it; emits them when the watermark
   * passes the window (Sluice Q5HotItems). The counts carry the window's last millisecond as their
   * timestamp, and every upstream subtask emits its counts of a window before it forwards that watermark.
   */
  static final class Q5HotItems extends KeyedProcessFunction<Long, Q5Result, Q5Result> {
    private transient ValueState<Long> max;
    private transient ListState<Q5Result> leaders;

    @Override
    public void open(OpenContext openContext) {
      max = getRuntimeContext().getState(new ValueStateDescriptor<>("max-count", Types.LONG));
      leaders = getRuntimeContext().getListState(new ListStateDescriptor<>("leaders", Q5Result.class));
    }

    @Override
    public void processElement(Q5Result c, Context ctx, Collector<Q5Result> out) throws Exception {
      Long current = max.value();
      if (current == null) {
        ctx.timerService().registerEventTimeTimer(c.windowEnd - 1);
        current = 0L;
      }
      if (c.num > current) {
        max.update(c.num);
        leaders.update(List.of(c));
      } else if (c.num == current) {
        leaders.add(c);
      }
    }

    @Override
    public void onTimer(long t, OnTimerContext ctx, Collector<Q5Result> out) throws Exception {
      Iterable<Q5Result> all = leaders.get();
      if (all != null) {
        for (Q5Result r : all) {
          out.collect(r);
        }
      }
      leaders.clear();
      max.clear();
    }
  }

  // ---- query 7 ----

  /**
   * Query 7, highest bid: for every tumbling 10 s window [start, end), the bids whose price equals the
   * highest price of the window's bids and whose dateTime lies in [start, end] (the SQL's BETWEEN is
   * inclusive, so a bid at exactly end, the next window's first millisecond, matches too) (Sluice query7).
   * Each subtask forwards only the bids that reach its own running maximum of their window before the
   * shuffle, so almost nothing crosses the network; the output keeps extra, as the SQL does.
   */
  public static DataStream<Q7Result> query7(DataStream<Event> events) {
    return events
        .flatMap(new Q7LocalMaxFilter())
        .name("Q7 Local Maxima")
        .keyBy(c -> c.windowStart, Types.LONG)
        .process(new Q7HighestBid())
        .name("Q7 Highest Bids")
        .uid("q7-highest-bids");
  }

  /**
   * Forwards the bids that reach this subtask's running maximum of their window (ties included) and the
   * bids at a window's end that reach the previous window's running maximum (Sluice Q7LocalMaxFilter). A
   * bid below a running maximum is below the window's maximum, so it can never match. The maxima are a
   * cache, not state: after a restart, or for a window evicted from the cache, more bids pass, never fewer.
   */
  static final class Q7LocalMaxFilter extends RichFlatMapFunction<Event, Q7Candidate> {
    /** Per subtask, created when the subtask opens: a cache, not state. */
    private transient RunningMaxima maxima;

    @Override
    public void open(OpenContext openContext) {
      maxima = new RunningMaxima();
    }

    @Override
    public void flatMap(Event e, Collector<Q7Candidate> out) {
      if (e.type != Event.BID) {
        return;
      }
      Bid b = e.bid;
      long start = TimeWindow.getWindowStartWithOffset(b.dateTime, 0, Q7_WINDOW_MS);
      int slot = maxima.slot(start);
      if (b.price >= maxima.max(slot)) {
        maxima.setMax(slot, b.price);
        out.collect(candidate(start, false, b));
      }
      if (b.dateTime == start && b.price >= maxima.max(maxima.slot(start - Q7_WINDOW_MS))) {
        out.collect(candidate(start - Q7_WINDOW_MS, true, b));
      }
    }

    private static Q7Candidate candidate(long start, boolean boundary, Bid b) {
      return new Q7Candidate(start, boundary, new Q7Result(b.auction, b.price, b.bidder, b.dateTime, b.extra));
    }
  }

  /**
   * Per window start: the highest price among the window's candidates, the bids with it, and the boundary
   * bids; emits the matching ones when the watermark passes the window's end (the boundary bids are at the
   * end, so the window waits for them) (Sluice Q7HighestBid).
   */
  static final class Q7HighestBid extends KeyedProcessFunction<Long, Q7Candidate, Q7Result> {
    private transient ValueState<Long> max;
    private transient ListState<Q7Result> leaders;
    private transient ListState<Q7Result> boundary;

    @Override
    public void open(OpenContext openContext) {
      max = getRuntimeContext().getState(new ValueStateDescriptor<>("max-price", Types.LONG));
      leaders = getRuntimeContext().getListState(new ListStateDescriptor<>("highest-bids", Q7Result.class));
      boundary = getRuntimeContext().getListState(new ListStateDescriptor<>("bids-at-end", Q7Result.class));
    }

    @Override
    public void processElement(Q7Candidate c, Context ctx, Collector<Q7Result> out) throws Exception {
      long end = c.windowStart + Q7_WINDOW_MS;
      if (end <= ctx.timerService().currentWatermark()) {
        return; // the window has been emitted
      }
      ctx.timerService().registerEventTimeTimer(end);
      if (c.boundary) {
        boundary.add(c.bid);
        return;
      }
      Long current = max.value();
      if (current == null || c.bid.price > current) {
        max.update(c.bid.price);
        leaders.update(List.of(c.bid));
      } else if (c.bid.price == current) {
        leaders.add(c.bid);
      }
    }

    @Override
    public void onTimer(long t, OnTimerContext ctx, Collector<Q7Result> out) throws Exception {
      Long current = max.value();
      if (current != null) {
        for (Q7Result r : leaders.get()) {
          out.collect(r);
        }
        Iterable<Q7Result> atEnd = boundary.get();
        if (atEnd != null) {
          for (Q7Result r : atEnd) {
            if (r.price == current) {
              out.collect(r);
            }
          }
        }
      }
      max.clear();
      leaders.clear();
      boundary.clear();
    }
  }

  // ---- query 8 ----

  /**
   * Query 8, monitor new users: (person id, name, window start) for every person who registered in a
   * tumbling 10 s window in which they also created at least one auction, one row per person and window
   * (Sluice query8). The distinct sellers of each window (a window reduce per seller, the SQL's GROUP BY
   * seller, window) are joined with the persons by Flink's window join on id = seller.
   */
  public static DataStream<Q8Result> query8(DataStream<Event> events) {
    OutputTag<Long> sellersTag = new OutputTag<>("q8-sellers", Types.LONG);
    SingleOutputStreamOperator<Q8Person> persons =
        events.process(new Q8Split(sellersTag)).name("Q8 Persons and Sellers");
    // The distinct sellers of each window, stamped with the window's last millisecond, so the join below
    // puts them in the same window.
    DataStream<Long> sellers = persons
        .getSideOutput(sellersTag)
        .keyBy(s -> s, Types.LONG)
        .window(TumblingEventTimeWindows.of(Duration.ofMillis(Q8_WINDOW_MS)))
        .reduce(new FirstSeller())
        .name("Q8 Distinct Sellers")
        .uid("q8-sellers");
    return persons
        .join(sellers)
        .where(p -> p.id, Types.LONG)
        .equalTo(s -> s, Types.LONG)
        .window(TumblingEventTimeWindows.of(Duration.ofMillis(Q8_WINDOW_MS)))
        .apply(new Q8Join(), TypeInformation.of(Q8Result.class))
        .name("Q8 Join")
        .uid("q8-join");
  }

  /** Routes persons to the main output and auctions' sellers to the side output, projected. */
  static final class Q8Split extends ProcessFunction<Event, Q8Person> {
    private final OutputTag<Long> sellers;

    Q8Split(OutputTag<Long> sellers) {
      this.sellers = sellers;
    }

    @Override
    public void processElement(Event e, Context ctx, Collector<Q8Person> out) {
      if (e.type == Event.PERSON) {
        Person p = e.person;
        out.collect(new Q8Person(p.id, p.name, p.dateTime));
      } else if (e.type == Event.AUCTION) {
        ctx.output(sellers, e.auction.seller);
      }
    }
  }

  /** Keeps one seller per key and window. */
  static final class FirstSeller implements ReduceFunction<Long> {
    @Override
    public Long reduce(Long first, Long second) {
      return first;
    }
  }

  /** A person joined with a seller of the same window. */
  static final class Q8Join implements JoinFunction<Q8Person, Long, Q8Result> {
    @Override
    public Q8Result join(Q8Person p, Long seller) {
      return new Q8Result(p.id, p.name, TimeWindow.getWindowStartWithOffset(p.dateTime, 0, Q8_WINDOW_MS));
    }
  }

  // ---- shared ----

  /**
   * The running maxima of a few groups (window starts or ends), for filters that forward only what can
   * still be a group's maximum (Sluice RunningMaxima). A cache, not state: a new group replaces the one
   * with the smallest id, and an evicted or unknown group reads as NONE, so a filter built on it forwards
   * more, never less.
   */
  static final class RunningMaxima {
    static final long NONE = Long.MIN_VALUE;
    private static final int SLOTS = 8;
    private final long[] groups = new long[SLOTS];
    private final long[] maxima = new long[SLOTS];

    RunningMaxima() {
      Arrays.fill(groups, NONE);
      Arrays.fill(maxima, NONE);
    }

    /** The slot of {@code group}, claimed (with maximum NONE) from the smallest group if it has none. */
    int slot(long group) {
      int oldest = 0;
      for (int i = 0; i < SLOTS; ++i) {
        if (groups[i] == group) {
          return i;
        }
        if (groups[i] < groups[oldest]) {
          oldest = i;
        }
      }
      groups[oldest] = group;
      maxima[oldest] = NONE;
      return oldest;
    }

    /** The running maximum in {@code slot} (NONE when unknown). */
    long max(int slot) {
      return maxima[slot];
    }

    /** Raises (or sets) the running maximum in {@code slot}. */
    void setMax(int slot, long max) {
      maxima[slot] = max;
    }
  }
}
