#include "nexmark/queries.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/connected_streams.h"
#include "sluice/api/joins.h"
#include "sluice/api/keyed_process_function.h"
#include "sluice/api/windowed_stream.h"
#include "sluice/state/state.h"

namespace sluice::nexmark {
namespace {

using std::chrono::milliseconds;

// The state interfaces, so each query runs on either backend (state.backend.type: hashmap or rocksdb).
template <class T>
using KeyedValue = ValueState<T>;
template <class T>
using KeyedList = ListState<T>;

/// Routes each event to the main output, the side output `tag`, or nowhere: `route(event, main, side)`
/// calls `main.collect(...)` or `side(...)` with the event's projection. One operator reads every event
/// once, where two filters on the same stream would each get a copy of it.
template <class Main, class Side, class Route>
class SplitEvents final : public ProcessFunction<Event, Main> {
 public:
  SplitEvents(OutputTag<Side> tag, Route route) : tag_(std::move(tag)), route_(std::move(route)) {}
  void process_element(const Event& e, typename ProcessFunction<Event, Main>::Context& ctx,
                       Collector<Main>& out) override {
    route_(e, out, [&](Side side) { ctx.output(tag_, std::move(side)); });
  }

 private:
  OutputTag<Side> tag_;
  Route route_;
};

/// The main and the side stream of a SplitEvents.
template <class Main, class Side>
struct SplitStreams {
  DataStream<Main> main;
  DataStream<Side> side;
};

template <class Main, class Side, class Route>
SplitStreams<Main, Side> split_events(DataStream<Event> events, const std::string& name, Route route) {
  OutputTag<Side> tag(name + "-side");
  DataStream<Main> main = events.process(SplitEvents<Main, Side, Route>(tag, std::move(route)));
  main.name(name);
  return {main, main.template get_side_output<Side>(tag)};
}

/// The running maxima of a few groups (window starts or ends), for filters that forward only what can still
/// be a group's maximum. A cache, not state: a new group replaces the one with the smallest id, and an
/// evicted or unknown group reads as kNone, so a filter built on it forwards more, never less.
class RunningMaxima {
 public:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();

  /// The running maximum of `group` (kNone when unknown), to read and raise.
  int64_t& of(int64_t group) {
    Slot* oldest = &slots_[0];
    for (Slot& s : slots_) {
      if (s.group == group) return s.max;
      if (s.group < oldest->group) oldest = &s;
    }
    *oldest = Slot{group, kNone};
    return oldest->max;
  }

 private:
  struct Slot {
    int64_t group = kNone;
    int64_t max = kNone;
  };
  std::array<Slot, 8> slots_{};
};

/// Identity for q0: moves the event through (a by-value lambda would move it twice).
struct IdentityEvent {
  Event operator()(Event&& e) const { return std::move(e); }
  Event operator()(const Event& e) const { return e; }
};

/// Query 1's projection: moves the bid's `extra` out of the event and leaves the rest (a by-value lambda
/// would move every string of the event).
struct Q1Convert {
  Q1Result operator()(Event&& e) const {
    Bid& b = e.bid();
    return Q1Result{b.auction, b.bidder, b.price * kDollarToEuroE3, b.date_time, std::move(b.extra)};
  }
  Q1Result operator()(const Event& e) const {
    const Bid& b = e.bid();
    return Q1Result{b.auction, b.bidder, b.price * kDollarToEuroE3, b.date_time, b.extra};
  }
};

// ---- query 3 ----

/// A person of OR, ID or CA, as query 3 needs it.
struct Q3Seller {
  int64_t id = 0;
  std::string name;
  std::string city;
  std::string state;
};
SLUICE_FIELDS(Q3Seller, id, name, city, state);

/// A category-10 auction, as query 3 needs it.
struct Q3Auction {
  int64_t id = 0;
  int64_t seller = 0;
};
SLUICE_FIELDS(Q3Auction, id, seller);

bool is_q3_state(const std::string& state) {
  return std::find(std::begin(kQ3States), std::end(kQ3States), state) != std::end(kQ3States);
}

/// Per person id: the person once seen (input 1), and the ids of auctions that arrived before it (input 2).
class Q3IncrementalJoin final : public KeyedCoProcessFunction<int64_t, Q3Seller, Q3Auction, Q3Result> {
 public:
  void open(RuntimeContext&) override {
    person_ = &keyed_state().get_state(ValueStateDescriptor<Q3Seller>{"person"});
    waiting_ = &keyed_state().get_state(ListStateDescriptor<int64_t>{"auctions-waiting"});
  }
  void process_element1(const Q3Seller& p, Context&, Collector<Q3Result>& out) override {
    for (int64_t auction : waiting_->get())
      out.collect(Q3Result{p.name, p.city, p.state, auction});
    waiting_->clear();
    person_->update(p);
  }
  void process_element2(const Q3Auction& a, Context&, Collector<Q3Result>& out) override {
    if (person_->has_value()) {
      const Q3Seller& p = person_->value();
      out.collect(Q3Result{p.name, p.city, p.state, a.id});
    } else {
      waiting_->add(a.id);
    }
  }

 private:
  KeyedValue<Q3Seller>* person_ = nullptr;
  KeyedList<int64_t>* waiting_ = nullptr;
};

// ---- query 4 ----

/// An auction, as query 4 needs it.
struct Q4Auction {
  int64_t id = 0;
  int64_t category = 0;
  TimestampMs date_time = 0;
  TimestampMs expires = 0;
};
SLUICE_FIELDS(Q4Auction, id, category, date_time, expires);

/// A bid, as query 4 needs it.
struct Q4Bid {
  int64_t auction = 0;
  int64_t price = 0;
  TimestampMs date_time = 0;
};
SLUICE_FIELDS(Q4Bid, auction, price, date_time);

/// An open auction and the best qualifying price so far (kNoWinner before the first).
struct Q4Open {
  static constexpr int64_t kNoWinner = -1;
  Q4Auction auction;
  int64_t best = kNoWinner;
};
SLUICE_FIELDS(Q4Open, auction, best);

/// The winning price of a closed auction, emitted at its expires.
struct Q4Winner {
  int64_t category = 0;
  int64_t price = 0;
};
SLUICE_FIELDS(Q4Winner, category, price);

/// A sum and count of winning prices.
struct Q4Totals {
  int64_t sum = 0;
  int64_t count = 0;
};
SLUICE_FIELDS(Q4Totals, sum, count);

/// Per auction id: the open auction with its best qualifying bid, closed by an event-time timer at its
/// expires. Bids that arrive before their auction wait in a list; one that no auction can still take is
/// dropped when the watermark passes its date_time (an auction it qualifies for starts at or before it,
/// so it has arrived by then). Bids after the close find no auction and leave the same way.
class Q4WinningBid final : public KeyedCoProcessFunction<int64_t, Q4Auction, Q4Bid, Q4Winner> {
 public:
  void open(RuntimeContext&) override {
    open_ = &keyed_state().get_state(ValueStateDescriptor<Q4Open>{"open-auction"});
    early_ = &keyed_state().get_state(ListStateDescriptor<Q4Bid>{"bids-before-auction"});
  }
  void process_element1(const Q4Auction& a, Context& ctx, Collector<Q4Winner>&) override {
    Q4Open state{a, Q4Open::kNoWinner};
    const std::vector<Q4Bid>& early = early_->get();
    if (!early.empty()) {
      for (const Q4Bid& b : early)
        take(state, b);
      early_->clear();
    }
    open_->update(state);
    ctx.timer_service().register_event_time_timer(a.expires);
  }
  void process_element2(const Q4Bid& b, Context& ctx, Collector<Q4Winner>&) override {
    if (open_->has_value()) {
      const Q4Open& current = open_->value();
      if (qualifies(current.auction, b) && b.price > current.best) {
        Q4Open updated = current;
        updated.best = b.price;
        open_->update(updated);
      }
      return;
    }
    early_->add(b);
    ctx.timer_service().register_event_time_timer(b.date_time);
  }
  void on_timer(TimestampMs t, OnTimerContext&, Collector<Q4Winner>& out) override {
    if (open_->has_value()) {
      const Q4Open current = open_->value();
      if (t != current.auction.expires) return;  // an early bid's timer; its bid was taken at the auction
      if (current.best != Q4Open::kNoWinner) out.collect(Q4Winner{current.auction.category, current.best});
      open_->clear();
      return;
    }
    std::vector<Q4Bid> keep;
    for (const Q4Bid& b : early_->get()) {
      if (b.date_time > t) keep.push_back(b);
    }
    early_->update(std::move(keep));
  }

 private:
  static bool qualifies(const Q4Auction& a, const Q4Bid& b) {
    return b.date_time >= a.date_time && b.date_time <= a.expires;
  }
  static void take(Q4Open& state, const Q4Bid& b) {
    if (qualifies(state.auction, b) && b.price > state.best) state.best = b.price;
  }

  KeyedValue<Q4Open>* open_ = nullptr;
  KeyedList<Q4Bid>* early_ = nullptr;
};

/// Per category: the running totals of winning prices; winners wait per timestamp until the watermark
/// passes it, so each emitted average covers every auction that closed up to that instant, whatever order
/// the upstream subtasks' winners arrive in.
class Q4CategoryAverage final : public KeyedProcessFunction<int64_t, Q4Winner, Q4Result> {
 public:
  void open(RuntimeContext&) override {
    totals_ = &keyed_state().get_state(ValueStateDescriptor<Q4Totals>{"totals"});
    pending_ = &keyed_state().get_state(MapStateDescriptor<TimestampMs, Q4Totals>{"winners-by-time"});
  }
  void process_element(const Q4Winner& w, Context& ctx, Collector<Q4Result>&) override {
    const TimestampMs ts = ctx.timestamp();
    Q4Totals at = pending_->get(ts).value_or(Q4Totals{});
    at.sum += w.price;
    ++at.count;
    pending_->put(ts, at);
    ctx.timer_service().register_event_time_timer(ts);
  }
  void on_timer(TimestampMs t, OnTimerContext& ctx, Collector<Q4Result>& out) override {
    const std::optional<Q4Totals> at = pending_->get(t);
    if (!at) return;
    pending_->remove(t);
    Q4Totals totals = totals_->value();
    totals.sum += at->sum;
    totals.count += at->count;
    totals_->update(totals);
    out.collect(Q4Result{ctx.current_key(), totals.sum / totals.count});
  }

 private:
  KeyedValue<Q4Totals>* totals_ = nullptr;
  MapState<TimestampMs, Q4Totals>* pending_ = nullptr;
};

// ---- query 5 ----

static_assert(kQ5WindowMs % kQ5SlideMs == 0, "query 5 builds its sliding windows from whole panes");

/// Counts the bids of a window (the SQL's COUNT(*)).
class CountBids final : public AggregateFunction<int64_t, int64_t, int64_t> {
 public:
  int64_t create_accumulator() override { return 0; }
  void add(const int64_t&, int64_t& count) override { ++count; }
  int64_t get_result(const int64_t& count) override { return count; }
  int64_t merge(int64_t a, const int64_t& b) override { return a + b; }
};

/// The bids on one auction in one pane (a slide-sized tumbling window).
struct Q5PaneCount {
  int64_t auction = 0;
  int64_t count = 0;
};
SLUICE_FIELDS(Q5PaneCount, auction, count);

/// Emits (auction, count) for one auction's pane.
class PaneCount final : public ProcessWindowFunction<int64_t, Q5PaneCount, int64_t, TimeWindow> {
 public:
  void process(const int64_t& auction, Context&, const std::vector<int64_t>& counts,
               Collector<Q5PaneCount>& out) override {
    out.collect(Q5PaneCount{auction, counts.front()});
  }
};

/// Adds up the pane counts of a sliding window.
class SumPaneCounts final : public AggregateFunction<Q5PaneCount, int64_t, int64_t> {
 public:
  int64_t create_accumulator() override { return 0; }
  void add(const Q5PaneCount& pane, int64_t& count) override { count += pane.count; }
  int64_t get_result(const int64_t& count) override { return count; }
  int64_t merge(int64_t a, const int64_t& b) override { return a + b; }
};

/// Emits (auction, count, window) for one auction's window.
class AuctionWindowCount final : public ProcessWindowFunction<int64_t, Q5Result, int64_t, TimeWindow> {
 public:
  void process(const int64_t& auction, Context& ctx, const std::vector<int64_t>& counts,
               Collector<Q5Result>& out) override {
    out.collect(Q5Result{auction, counts.front(), ctx.window().start, ctx.window().end});
  }
};

/// Forwards the window counts that reach this subtask's running maximum of their window (ties included):
/// a count below it is below the window's maximum. Chained to the window operator, so only a few counts
/// per window cross the network to Q5HotItems.
class Q5LocalMaxFilter final : public FilterFunction<Q5Result> {
 public:
  bool filter(const Q5Result& c) override {
    int64_t& max = maxima_.of(c.window_end);
    if (c.num < max) return false;
    max = c.num;
    return true;
  }

 private:
  RunningMaxima maxima_;
};

/// Per window end: the highest count seen and the auctions that reach it; emits them when the watermark
/// passes the window (its counts carry the window's last millisecond as their timestamp, and every
/// upstream subtask emits its counts of a window before it forwards that watermark).
class Q5HotItems final : public KeyedProcessFunction<int64_t, Q5Result, Q5Result> {
 public:
  void open(RuntimeContext&) override {
    max_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"max-count", 0});
    leaders_ = &keyed_state().get_state(ListStateDescriptor<Q5Result>{"leaders"});
  }
  void process_element(const Q5Result& c, Context& ctx, Collector<Q5Result>&) override {
    const int64_t max = max_->value();
    if (max == 0) ctx.timer_service().register_event_time_timer(c.window_end - 1);
    if (c.num > max) {
      max_->update(c.num);
      leaders_->update({c});
    } else if (c.num == max) {
      leaders_->add(c);
    }
  }
  void on_timer(TimestampMs, OnTimerContext&, Collector<Q5Result>& out) override {
    for (const Q5Result& r : leaders_->get())
      out.collect(r);
    leaders_->clear();
    max_->clear();
  }

 private:
  KeyedValue<int64_t>* max_ = nullptr;
  KeyedList<Q5Result>* leaders_ = nullptr;
};

// ---- query 7 ----

/// A bid that may be the highest of the window starting at window_start: a member of the window, or
/// (boundary) a bid at exactly the window's end, which the SQL's inclusive BETWEEN also matches.
struct Q7Candidate {
  TimestampMs window_start = 0;
  bool boundary = false;
  Q7Result bid;
};
SLUICE_FIELDS(Q7Candidate, window_start, boundary, bid);

/// Forwards the bids that reach this subtask's running maximum of their window (ties included) and the
/// bids at a window's end that reach the previous window's running maximum. A bid below a running maximum
/// is below the window's maximum, so it can never match; what passes is about ln(bids per window) per
/// window and subtask. The maxima are a cache, not state: after a restart, or for a window evicted from
/// the cache, more bids pass, never fewer, so results do not change.
class Q7LocalMaxFilter final : public FlatMapFunction<Event, Q7Candidate> {
 public:
  void flat_map(const Event& e, Collector<Q7Candidate>& out) override {
    if (!e.is_bid()) return;
    const Bid& b = e.bid();
    const TimestampMs start = TimeWindow::window_start(b.date_time, 0, kQ7WindowMs);
    int64_t& max = maxima_.of(start);
    if (b.price >= max) {
      max = b.price;
      out.collect(candidate(start, false, b));
    }
    if (b.date_time == start && b.price >= maxima_.of(start - kQ7WindowMs)) {
      out.collect(candidate(start - kQ7WindowMs, true, b));
    }
  }

 private:
  static Q7Candidate candidate(TimestampMs start, bool boundary, const Bid& b) {
    return Q7Candidate{start, boundary, Q7Result{b.auction, b.price, b.bidder, b.date_time, b.extra}};
  }

  RunningMaxima maxima_;
};

/// Per window start: the highest price among the window's candidates, the bids with it, and the boundary
/// bids; emits the matching ones when the watermark passes the window's end (the boundary bids are at the
/// end, so the window waits for them).
class Q7HighestBid final : public KeyedProcessFunction<int64_t, Q7Candidate, Q7Result> {
 public:
  void open(RuntimeContext&) override {
    max_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"max-price", kNone});
    leaders_ = &keyed_state().get_state(ListStateDescriptor<Q7Result>{"highest-bids"});
    boundary_ = &keyed_state().get_state(ListStateDescriptor<Q7Result>{"bids-at-end"});
  }
  void process_element(const Q7Candidate& c, Context& ctx, Collector<Q7Result>&) override {
    const TimestampMs end = c.window_start + kQ7WindowMs;
    if (end <= ctx.timer_service().current_watermark()) return;  // the window has been emitted
    ctx.timer_service().register_event_time_timer(end);
    if (c.boundary) {
      boundary_->add(c.bid);
      return;
    }
    const int64_t max = max_->value();
    if (c.bid.price > max) {
      max_->update(c.bid.price);
      leaders_->update({c.bid});
    } else if (c.bid.price == max) {
      leaders_->add(c.bid);
    }
  }
  void on_timer(TimestampMs, OnTimerContext&, Collector<Q7Result>& out) override {
    const int64_t max = max_->value();
    if (max != kNone) {
      for (const Q7Result& r : leaders_->get())
        out.collect(r);
      for (const Q7Result& r : boundary_->get()) {
        if (r.price == max) out.collect(r);
      }
    }
    max_->clear();
    leaders_->clear();
    boundary_->clear();
  }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  KeyedValue<int64_t>* max_ = nullptr;
  KeyedList<Q7Result>* leaders_ = nullptr;
  KeyedList<Q7Result>* boundary_ = nullptr;
};

// ---- query 8 ----

/// A person, as query 8 needs it.
struct Q8Person {
  int64_t id = 0;
  std::string name;
  TimestampMs date_time = 0;
};
SLUICE_FIELDS(Q8Person, id, name, date_time);

}  // namespace

DataStream<Event> query0(DataStream<Event> events) {
  return events.map(IdentityEvent{}).name("Q0 Pass Through");
}

DataStream<Q1Result> query1(DataStream<Event> events) {
  return events.filter([](const Event& e) { return e.is_bid(); })
      .name("Q1 Bids")
      .map(Q1Convert{})
      .name("Q1 Currency Conversion");
}

DataStream<Q2Result> query2(DataStream<Event> events) {
  return events.filter([](const Event& e) { return e.is_bid() && e.bid().auction % kQ2AuctionModulus == 0; })
      .name("Q2 Selection")
      .map([](const Event& e) {
        return Q2Result{e.bid().auction, e.bid().price};
      })
      .name("Q2 Project");
}

DataStream<Q3Result> query3(DataStream<Event> events) {
  auto route = [](const Event& e, Collector<Q3Seller>& sellers, auto auctions) {
    if (e.is_person()) {
      const Person& p = e.person();
      if (is_q3_state(p.state)) sellers.collect(Q3Seller{p.id, p.name, p.city, p.state});
    } else if (e.is_auction()) {
      const Auction& a = e.auction();
      if (a.category == kQ3Category) auctions(Q3Auction{a.id, a.seller});
    }
  };
  auto split = split_events<Q3Seller, Q3Auction>(std::move(events), "Q3 Sellers and Auctions", route);
  auto person_id = [](const Q3Seller& p) { return p.id; };
  auto seller = [](const Q3Auction& a) { return a.seller; };
  return key_by(split.main.connect(split.side), person_id, seller)
      .process(Q3IncrementalJoin{})
      .name("Q3 Incremental Join")
      .uid("q3-join");
}

DataStream<Q4Result> query4(DataStream<Event> events) {
  auto route = [](const Event& e, Collector<Q4Auction>& auctions, auto bids) {
    if (e.is_bid()) {
      const Bid& b = e.bid();
      bids(Q4Bid{b.auction, b.price, b.date_time});
    } else if (e.is_auction()) {
      const Auction& a = e.auction();
      auctions.collect(Q4Auction{a.id, a.category, a.date_time, a.expires});
    }
  };
  auto split = split_events<Q4Auction, Q4Bid>(std::move(events), "Q4 Auctions and Bids", route);
  auto auction_id = [](const Q4Auction& a) { return a.id; };
  auto bid_auction = [](const Q4Bid& b) { return b.auction; };
  auto winners = key_by(split.main.connect(split.side), auction_id, bid_auction)
                     .process(Q4WinningBid{})
                     .name("Q4 Winning Bids")
                     .uid("q4-winning-bids");
  return winners.key_by([](const Q4Winner& w) { return w.category; })
      .process(Q4CategoryAverage{})
      .name("Q4 Average Per Category")
      .uid("q4-average");
}

DataStream<Q5Result> query5(DataStream<Event> events) {
  auto bids = events
                  .flat_map<int64_t>([](const Event& e, Collector<int64_t>& out) {
                    if (e.is_bid()) out.collect(e.bid().auction);
                  })
                  .name("Q5 Bid Auctions");
  // Every 10 s window sliding by 2 s is the union of five 2 s panes, so each bid is counted once, in its
  // pane, and the sliding windows add up per-auction pane counts (a handful per auction and pane instead of
  // five window updates per bid; Flink's window aggregation slices hopping windows the same way). A pane
  // count carries the pane's last millisecond as its timestamp, which falls in exactly the sliding windows
  // of every bid in the pane.
  auto panes = bids.key_by([](const int64_t& auction) { return auction; })
                   .window(TumblingEventTimeWindows::of(milliseconds(kQ5SlideMs)))
                   .aggregate(CountBids{}, PaneCount{})
                   .name("Q5 Bids Per Auction And Pane")
                   .uid("q5-panes");
  auto counts = panes.key_by([](const Q5PaneCount& p) { return p.auction; })
                    .window(SlidingEventTimeWindows::of(milliseconds(kQ5WindowMs), milliseconds(kQ5SlideMs)))
                    .aggregate(SumPaneCounts{}, AuctionWindowCount{})
                    .name("Q5 Bids Per Auction And Window")
                    .uid("q5-counts")
                    .filter(Q5LocalMaxFilter{})
                    .name("Q5 Local Maxima");
  return counts.key_by([](const Q5Result& c) { return c.window_end; })
      .process(Q5HotItems{})
      .name("Q5 Hot Items")
      .uid("q5-hot-items");
}

DataStream<Q7Result> query7(DataStream<Event> events) {
  return events.flat_map(Q7LocalMaxFilter{})
      .name("Q7 Local Maxima")
      .key_by([](const Q7Candidate& c) { return c.window_start; })
      .process(Q7HighestBid{})
      .name("Q7 Highest Bids")
      .uid("q7-highest-bids");
}

DataStream<Q8Result> query8(DataStream<Event> events) {
  auto route = [](const Event& e, Collector<Q8Person>& persons, auto sellers) {
    if (e.is_person()) {
      const Person& p = e.person();
      persons.collect(Q8Person{p.id, p.name, p.date_time});
    } else if (e.is_auction()) {
      sellers(e.auction().seller);
    }
  };
  auto split = split_events<Q8Person, int64_t>(std::move(events), "Q8 Persons and Sellers", route);
  // The distinct sellers of each window (the SQL's GROUP BY seller, window), stamped with the window's
  // last millisecond, so the join below puts them in the same window.
  auto sellers = split.side.key_by([](const int64_t& seller) { return seller; })
                     .window(TumblingEventTimeWindows::of(milliseconds(kQ8WindowMs)))
                     .reduce([](const int64_t& first, const int64_t&) { return first; })
                     .name("Q8 Distinct Sellers")
                     .uid("q8-sellers");
  return join(split.main, sellers)
      .where([](const Q8Person& p) { return p.id; })
      .equal_to([](const int64_t& seller) { return seller; })
      .window(TumblingEventTimeWindows::of(milliseconds(kQ8WindowMs)))
      .apply([](const Q8Person& p, const int64_t&) {
        return Q8Result{p.id, p.name, TimeWindow::window_start(p.date_time, 0, kQ8WindowMs)};
      })
      .name("Q8 Join")
      .uid("q8-join");
}

}  // namespace sluice::nexmark
