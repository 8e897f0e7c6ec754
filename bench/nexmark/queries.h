// The Nexmark queries written with the DataStream API. Each takes the event stream and returns its result
// stream, so a test attaches a collecting sink and the benchmark a discarding one.
//
// Queries 0-2 are stateless; 3-8 need keyed state, timers and windows and will join them here in the same
// shape (a function from DataStream<Event> to the query's result stream).
#pragma once

#include <cstdint>
#include <string>

#include "nexmark/model.h"
#include "sluice/api/data_stream.h"

namespace sluice::nexmark {

/// The dollar-to-euro rate of query 1 in thousandths: nexmark-flink computes `0.908 * price`, a
/// DECIMAL(23, 3).
inline constexpr int64_t kDollarToEuroE3 = 908;
/// Query 2 keeps bids on every kQ2AuctionModulus-th auction (`MOD(auction, 123) = 0`).
inline constexpr int64_t kQ2AuctionModulus = 123;

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

/// Query 0, pass-through: every event unchanged, through an identity map. Measures the source, the
/// chain and the sink.
DataStream<Event> query0(DataStream<Event> events);

/// Query 1, currency conversion: every bid as (auction, bidder, 0.908 * price, date_time, extra).
DataStream<Q1Result> query1(DataStream<Event> events);

/// Query 2, selection: (auction, price) of the bids whose auction id is a multiple of 123.
DataStream<Q2Result> query2(DataStream<Event> events);

}  // namespace sluice::nexmark
