#include "nexmark/queries.h"

#include <utility>

namespace sluice::nexmark {

DataStream<Event> query0(DataStream<Event> events) {
  return events.map([](Event e) { return e; }).name("Q0 Pass Through");
}

DataStream<Q1Result> query1(DataStream<Event> events) {
  return events.filter([](const Event& e) { return e.is_bid(); })
      .name("Q1 Bids")
      .map([](Event e) {
        Bid& b = e.bid();
        return Q1Result{b.auction, b.bidder, b.price * kDollarToEuroE3, b.date_time, std::move(b.extra)};
      })
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

}  // namespace sluice::nexmark
