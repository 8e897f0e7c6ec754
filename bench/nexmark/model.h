// The Nexmark data model: an online auction site's people, auctions and bids, and the Event that carries
// one of them (the model of the Nexmark benchmark as Apache Beam and nexmark-flink define it).
//
// Units: every date_time and expires is milliseconds since the Unix epoch (TimestampMs); money
// (initial_bid, reserve, price) is integer US cents, as the specification's longs. Ids start at the
// offsets of generator.h (kFirstPersonId, kFirstAuctionId, kFirstCategoryId). `extra` pads a record to
// the configured average size.
//
// All types are plain values with TypeSerializers (SLUICE_FIELDS); Event is a std::variant so that it
// serializes as one index byte plus the one record it holds, and a reused Event decodes a record of the
// same type in place.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "sluice/core/clock.h"
#include "sluice/core/type_serializer.h"

namespace sluice::nexmark {

/// A person who registers to sell or bid.
struct Person {
  int64_t id = 0;
  std::string name;
  std::string email_address;
  std::string credit_card;
  std::string city;
  std::string state;
  TimestampMs date_time = 0;
  std::string extra;
  friend auto operator<=>(const Person&, const Person&) = default;
};
SLUICE_FIELDS(Person, id, name, email_address, credit_card, city, state, date_time, extra);

/// An item put up for auction by a seller (a Person id).
struct Auction {
  int64_t id = 0;
  std::string item_name;
  std::string description;
  int64_t initial_bid = 0;  ///< cents
  int64_t reserve = 0;      ///< cents
  TimestampMs date_time = 0;
  TimestampMs expires = 0;
  int64_t seller = 0;    ///< Person::id
  int64_t category = 0;  ///< in [kFirstCategoryId, kFirstCategoryId + kNumCategories)
  std::string extra;
  friend auto operator<=>(const Auction&, const Auction&) = default;
};
SLUICE_FIELDS(Auction, id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra);

/// A bid by a person (bidder) on an auction.
struct Bid {
  int64_t auction = 0;  ///< Auction::id
  int64_t bidder = 0;   ///< Person::id
  int64_t price = 0;    ///< cents
  std::string channel;  ///< where the bid came from: a hot channel ("Google", ...) or "channel-<n>"
  std::string url;
  TimestampMs date_time = 0;
  std::string extra;
  friend auto operator<=>(const Bid&, const Bid&) = default;
};
SLUICE_FIELDS(Bid, auction, bidder, price, channel, url, date_time, extra);

/// Which record an Event carries (the variant index; stable, part of the serialized form).
enum class EventType : uint8_t { kPerson = 0, kAuction = 1, kBid = 2 };

/// One Nexmark event: exactly one of Person, Auction, Bid.
struct Event {
  std::variant<Person, Auction, Bid> payload;

  EventType type() const { return static_cast<EventType>(payload.index()); }
  bool is_person() const { return payload.index() == 0; }
  bool is_auction() const { return payload.index() == 1; }
  bool is_bid() const { return payload.index() == 2; }
  /// The record; the event must hold that type (std::bad_variant_access otherwise).
  const Person& person() const { return std::get<Person>(payload); }
  const Auction& auction() const { return std::get<Auction>(payload); }
  const Bid& bid() const { return std::get<Bid>(payload); }
  Bid& bid() { return std::get<Bid>(payload); }
  /// The event time of the record it carries (ms since epoch).
  TimestampMs date_time() const {
    return std::visit([](const auto& r) { return r.date_time; }, payload);
  }
  friend auto operator<=>(const Event&, const Event&) = default;
};
SLUICE_FIELDS(Event, payload);

}  // namespace sluice::nexmark
