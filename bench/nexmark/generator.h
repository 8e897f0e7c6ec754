// The Nexmark event generator: event number n -> one Person, Auction or Bid, deterministically.
//
// Follows the generator of the Nexmark specification as Apache Beam (sdks/java/testing/nexmark) and
// nexmark-flink implement it (GeneratorConfig, PersonGenerator, AuctionGenerator, BidGenerator,
// PriceGenerator, StringsGenerator): the same proportions, id spaces, hot keys, active windows, auction
// lengths, string shapes and record sizes. Three deliberate differences, two for reproducibility and one
// for speed:
//  * Randomness comes from a SplitMix64 stream seeded by (seed, n), so event n is the same whatever the
//    parallelism or split layout (Java's generators draw from java.util.Random; nexmark-flink's is
//    unseeded), and the hot channels' URLs are derived from fixed seeds instead of a fresh Random.
//  * Event time is one global timeline: timestamp(n) = base_time_ms + floor(n * 1e6 / rate) / 1000, with
//    integer division as in GeneratorConfig.timestampForEvent. (nexmark-flink gives each of its
//    numEventGenerators its own timeline with a rate divided among them.)
//  * The `extra` padding is a slice of a pool of random letters built once per generator from the seed,
//    at a random offset: one 64-bit draw per record picks both its length (the same uniform +-20% law as
//    StringsGenerator.nextExtra) and its offset. Java draws every letter; that was most of the cost of an
//    event, and the padding only has to have the right size (see README.md).
// So the event stream equals the Java one in distribution, not byte for byte.
//
// Thread-safety: a NexmarkGenerator is immutable after construction; event() may be called from any
// thread concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "nexmark/model.h"
#include "sluice/core/error.h"

namespace sluice::nexmark {

/// Ids start at these offsets so that queries find matches even on small inputs (GeneratorConfig).
inline constexpr int64_t kFirstPersonId = 1000;
inline constexpr int64_t kFirstAuctionId = 1000;
inline constexpr int64_t kFirstCategoryId = 10;
/// Auction categories are kFirstCategoryId + [0, kNumCategories).
inline constexpr int64_t kNumCategories = 5;
/// How many not-yet-created person / auction ids a random choice may reach ahead of the last one.
inline constexpr int64_t kPersonIdLead = 10;
inline constexpr int64_t kAuctionIdLead = 10;
/// Hot sellers, bidders and auctions are the first of each batch of this many ids.
inline constexpr int64_t kHotSellerBatch = 100;
inline constexpr int64_t kHotBidderBatch = 100;
inline constexpr int64_t kHotAuctionBatch = 100;
/// A bid comes from a hot channel with probability 1 - 1/kHotChannelsRatio, else from one of
/// kNumChannels others.
inline constexpr int kHotChannelsRatio = 2;
inline constexpr int kNumChannels = 10'000;

/// 2023-01-01T00:00:00Z: the default time of event 0, fixed so that runs are reproducible.
inline constexpr TimestampMs kDefaultBaseTimeMs = 1'672'531'200'000;

/// What to generate. Defaults are those of NexmarkConfiguration (Beam and nexmark-flink).
struct NexmarkConfig {
  /// Number of events, numbered 0..events-1. Must be > 0 for a NexmarkSource.
  int64_t events = 10'000'000;
  /// Events per second of event time: the inter-event delay is 1e6 / rate microseconds.
  double rate = 10'000;
  /// Event time of event 0, ms since epoch.
  TimestampMs base_time_ms = kDefaultBaseTimeMs;
  /// Seeds every event's random stream.
  uint64_t seed = 0;

  /// Of every person + auction + bid events, this many are persons, auctions, bids (in that order).
  int person_proportion = 1;
  int auction_proportion = 3;
  int bid_proportion = 46;

  /// Average serialized sizes in bytes the `extra` padding aims at.
  int avg_person_byte_size = 200;
  int avg_auction_byte_size = 500;
  int avg_bid_byte_size = 100;

  /// A bid is for the hot auction with probability 1 - 1/hot_auction_ratio; an auction is by the hot
  /// seller with probability 1 - 1/hot_sellers_ratio; a bid is by the hot bidder with probability
  /// 1 - 1/hot_bidders_ratio.
  int hot_auction_ratio = 2;
  int hot_sellers_ratio = 4;
  int hot_bidders_ratio = 4;

  /// Random sellers and bidders are drawn from the last num_active_people persons (plus kPersonIdLead).
  int num_active_people = 1000;
  /// Random bids go to the last num_in_flight_auctions auctions (plus kAuctionIdLead); auctions last
  /// about as long as it takes to create that many more.
  int num_in_flight_auctions = 100;

  int total_proportion() const { return person_proportion + auction_proportion + bid_proportion; }

  /// Checks ranges: events >= 0, rate > 0, proportions, ratios and sizes positive. The error
  /// (kConfiguration) names the field.
  Status validate() const;
};

/// A SplitMix64 random stream (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014), one per event, seeded from (seed, event number).
class EventRandom {
 public:
  EventRandom(uint64_t seed, int64_t event_number);
  uint64_t next_u64();
  /// Uniform in [0, bound); bound > 0 (Java's Random.nextInt(bound)).
  int32_t next_int(int32_t bound);
  /// Uniform in [0, bound); bound > 0 (LongGenerator.nextLong).
  int64_t next_long(int64_t bound);
  /// Uniform in [0, 1).
  double next_double();

 private:
  uint64_t state_;
};

/// Generates events by number. Construct with a config that validate()s.
class NexmarkGenerator {
 public:
  explicit NexmarkGenerator(NexmarkConfig config);

  const NexmarkConfig& config() const { return config_; }

  /// Event number n (>= 0); depends only on the config and n.
  Event event(int64_t n) const;
  /// Writes event number n into `out`, equal to event(n). When `out` already holds a record of the same
  /// type its strings are assigned in place, so a reused Event costs no allocation once its strings have
  /// grown (a source reader's hot path).
  void event_into(int64_t n, Event& out) const;
  /// The event time of event n: base_time_ms + floor(n * inter_event_delay_us) / 1000.
  TimestampMs timestamp(int64_t n) const;
  /// The type of event n, from n modulo the total proportion.
  EventType type_of(int64_t n) const;

  // The id spaces (base 0, i.e. without kFirstPersonId / kFirstAuctionId), as in the specification.

  /// The last person id created at or before event n (the id of event n if it is a person).
  int64_t last_base0_person_id(int64_t n) const;
  /// The last auction id created at or before event n (-1 before the first auction).
  int64_t last_base0_auction_id(int64_t n) const;
  /// A random person among the active ones at event n, or up to kPersonIdLead ahead.
  int64_t next_base0_person_id(int64_t n, EventRandom& rng) const;
  /// A random auction among those in flight at event n, or up to kAuctionIdLead ahead.
  int64_t next_base0_auction_id(int64_t n, EventRandom& rng) const;

 private:
  /// Event n split into its epoch (n / total proportion) and its offset within the epoch, computed once
  /// per event, without a division for n < 2^32 (a 64-bit division costs tens of cycles).
  struct Position {
    int64_t n;
    int64_t epoch;
    int64_t offset;
  };
  Position position(int64_t n) const;
  EventType type_at(const Position& at) const;
  int64_t last_person(const Position& at) const;
  int64_t last_auction(const Position& at) const;
  int64_t next_person(const Position& at, EventRandom& rng) const;
  int64_t next_auction(const Position& at, EventRandom& rng) const;

  void make_person(const Position& at, TimestampMs ts, EventRandom& rng, Person& p) const;
  void make_auction(const Position& at, TimestampMs ts, EventRandom& rng, Auction& a) const;
  void make_bid(const Position& at, TimestampMs ts, EventRandom& rng, Bid& b) const;

  NexmarkConfig config_;
  double inter_event_delay_us_;
  /// Events it takes to create num_in_flight_auctions auctions (an auction's average lifetime).
  int64_t events_for_auctions_;
  /// ceil(2^64 / total proportion): n / total is the high half of n * this for n < 2^32 (Lemire, Kaser and
  /// Kurz, "Faster remainder by direct computation", 2019), a multiply instead of a division.
  uint64_t epoch_multiplier_;
  /// Random letters that `extra` paddings are sliced from; immutable, shared by copies of the generator.
  std::shared_ptr<const std::string> extra_pool_;
};

/// XXH3-64 over the canonical serialization of events: each event's TypeSerializer<Event> bytes
/// (docs/serialization.md, format version kSerializationFormatVersion) in order. The reference for
/// comparing generators and runs.
uint64_t checksum(std::span<const Event> events);
/// The checksum of events 0..count-1 of `config` (generated here, in order).
uint64_t checksum(const NexmarkConfig& config, int64_t count);

}  // namespace sluice::nexmark
