// The Nexmark queries written with the DataStream API. Each takes the event stream and returns its result
// stream, so a test attaches a collecting sink and the benchmark a discarding one.
//
// The semantics are those of nexmark-flink's SQL (nexmark-flink/src/main/resources/queries/q*.sql), run over
// a bounded input: a query's results, once the input ends and the final watermark has fired every timer and
// window, are the rows the SQL computes over the same events. Queries 3-8 need event time: the event stream
// must carry each event's date_time as its timestamp and watermarks no later event violates, as
// NexmarkSource emits them. Where the SQL result is an updating one (q4's averages) the query emits one
// update per event-time instant, so results are the same at every parallelism.
//
// Every query projects events onto the few fields it needs before its first shuffle, and the queries that
// read two record types split them with one process function and a side output rather than two filters
// (two consumers of one stream would copy every event).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "nexmark/model.h"
#include "sluice/api/data_stream.h"

namespace sluice::nexmark {

/// The dollar-to-euro rate of query 1 in thousandths: nexmark-flink computes `0.908 * price`, a
/// DECIMAL(23, 3).
inline constexpr int64_t kDollarToEuroE3 = 908;
/// Query 2 keeps bids on every kQ2AuctionModulus-th auction (`MOD(auction, 123) = 0`).
inline constexpr int64_t kQ2AuctionModulus = 123;
/// Query 3 keeps auctions of this category (`A.category = 10`) ...
inline constexpr int64_t kQ3Category = 10;
/// ... whose seller lives in one of these states (`P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA'`).
inline constexpr std::string_view kQ3States[] = {"OR", "ID", "CA"};
/// Query 5 counts bids in windows of kQ5WindowMs every kQ5SlideMs (`HOP(..., INTERVAL '2' SECOND,
/// INTERVAL '10' SECOND)`).
inline constexpr int64_t kQ5WindowMs = 10'000;
inline constexpr int64_t kQ5SlideMs = 2'000;
/// Queries 7 and 8 use tumbling windows of this size (`TUMBLE(..., INTERVAL '10' SECOND)`).
inline constexpr int64_t kQ7WindowMs = 10'000;
inline constexpr int64_t kQ8WindowMs = 10'000;

/// A row of query 1: a bid with its price converted to euros.
struct Q1Result {
  int64_t auction = 0;
  int64_t bidder = 0;
  /// kDollarToEuroE3 * the bid's price: euro cents scaled by 1000, i.e. the exact unscaled value of the
  /// DECIMAL(23, 3) `0.908 * price` (euro cents = price_e3 / 1000).
  int64_t price_e3 = 0;
  TimestampMs date_time = 0;
  std::string extra;
  friend auto operator<=>(const Q1Result&, const Q1Result&) = default;
};
SLUICE_FIELDS(Q1Result, auction, bidder, price_e3, date_time, extra);

/// A row of query 2.
struct Q2Result {
  int64_t auction = 0;
  int64_t price = 0;  ///< cents
  friend auto operator<=>(const Q2Result&, const Q2Result&) = default;
};
SLUICE_FIELDS(Q2Result, auction, price);

/// A row of query 3: a seller in OR, ID or CA and one of their category-10 auctions.
struct Q3Result {
  std::string name;
  std::string city;
  std::string state;
  int64_t id = 0;  ///< Auction::id
  friend auto operator<=>(const Q3Result&, const Q3Result&) = default;
};
SLUICE_FIELDS(Q3Result, name, city, state, id);

/// A row of query 4: the average winning price of a category's closed auctions so far.
struct Q4Result {
  int64_t category = 0;
  /// Cents, truncated: the SQL's AVG over a BIGINT column is a BIGINT (sum / count in integer arithmetic).
  int64_t average = 0;
  friend auto operator<=>(const Q4Result&, const Q4Result&) = default;
};
SLUICE_FIELDS(Q4Result, category, average);

/// A row of query 5: an auction with the most bids of a sliding window (all of them on a tie).
struct Q5Result {
  int64_t auction = 0;
  int64_t num = 0;  ///< bids on the auction in the window
  TimestampMs window_start = 0;
  TimestampMs window_end = 0;  ///< exclusive
  friend auto operator<=>(const Q5Result&, const Q5Result&) = default;
};
SLUICE_FIELDS(Q5Result, auction, num, window_start, window_end);

/// A row of query 7: a bid with the highest price of a tumbling window.
struct Q7Result {
  int64_t auction = 0;
  int64_t price = 0;  ///< cents
  int64_t bidder = 0;
  TimestampMs date_time = 0;
  std::string extra;
  friend auto operator<=>(const Q7Result&, const Q7Result&) = default;
};
SLUICE_FIELDS(Q7Result, auction, price, bidder, date_time, extra);

/// A row of query 8: a person who registered and created an auction in the same tumbling window.
struct Q8Result {
  int64_t id = 0;  ///< Person::id
  std::string name;
  TimestampMs window_start = 0;
  friend auto operator<=>(const Q8Result&, const Q8Result&) = default;
};
SLUICE_FIELDS(Q8Result, id, name, window_start);

/// Query 0, pass-through: every event unchanged, through an identity map. Measures the source, the
/// chain and the sink.
DataStream<Event> query0(DataStream<Event> events);

/// Query 1, currency conversion: every bid as (auction, bidder, 0.908 * price, date_time, extra).
DataStream<Q1Result> query1(DataStream<Event> events);

/// Query 2, selection: (auction, price) of the bids whose auction id is a multiple of 123.
DataStream<Q2Result> query2(DataStream<Event> events);

/// Query 3, local item suggestion: (name, city, state, auction id) for every category-10 auction whose
/// seller lives in OR, ID or CA. An unwindowed inner join, incremental: persons keyed by id and auctions by
/// seller meet in a KeyedCoProcessFunction that keeps the person and the auctions still waiting for their
/// person, and emits each pair as soon as both sides have arrived. Its state grows with the persons
/// matched, as the SQL's regular join does without a state TTL.
DataStream<Q3Result> query3(DataStream<Event> events);

/// Query 4, average closing price per category. An auction's winning price is the highest price among
/// the bids on it whose date_time lies in [auction.date_time, auction.expires] (both inclusive, SQL
/// BETWEEN); an auction without such a bid has no winner. When the watermark passes an auction's expires,
/// its winner (category, price) goes to a per-category running average, which emits (category, average of
/// every winner so far) once per expiry instant that closed auctions of the category. The last row per
/// category is the SQL's result.
DataStream<Q4Result> query4(DataStream<Event> events);

/// Query 5, hot items: for every sliding window of 10 s every 2 s, the auctions with the most bids in it
/// (every auction that reaches the maximum count), with the count and the window. Bids are counted per
/// auction in 2 s panes first; the sliding windows add up pane counts, and each window subtask forwards only
/// the counts that reach its own running maximum of their window to the per-window maximum.
DataStream<Q5Result> query5(DataStream<Event> events);

/// Query 7, highest bid: for every tumbling 10 s window [start, end), the bids whose price equals the
/// highest price of the window's bids and whose date_time lies in [start, end] — the SQL's BETWEEN is
/// inclusive, so a bid at exactly `end` (the next window's first millisecond) matches too. Each subtask
/// forwards only the bids that reach its own running maximum of their window before the shuffle, so almost
/// nothing crosses the network.
DataStream<Q7Result> query7(DataStream<Event> events);

/// Query 8, monitor new users: (person id, name, window start) for every person who registered in a
/// tumbling 10 s window in which they also created at least one auction — one row per person and window,
/// however many auctions (the SQL groups both sides by window before joining). A window join of persons
/// with the distinct sellers of each window.
DataStream<Q8Result> query8(DataStream<Event> events);

}  // namespace sluice::nexmark
