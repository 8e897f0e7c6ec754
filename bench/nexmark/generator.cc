#include "nexmark/generator.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/connectors/datagen.h"
#include "sluice/core/data_io.h"

namespace sluice::nexmark {
namespace {

// Small value sets keep the example queries finding results on small inputs (PersonGenerator).
constexpr std::array<std::string_view, 6> kUsStates{"AZ", "CA", "ID", "OR", "WA", "WY"};
constexpr std::array<std::string_view, 10> kUsCities{"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland",
                                                     "Bend",    "Redmond",     "Seattle",       "Kent",  "Cheyenne"};
constexpr std::array<std::string_view, 11> kFirstNames{"Peter", "Paul",  "Luke",  "John",   "Saul",  "Vicky",
                                                       "Kate",  "Julie", "Sarah", "Deiter", "Walter"};
constexpr std::array<std::string_view, 9> kLastNames{"Shultz", "Abrams", "Spencer", "White", "Bartels",
                                                     "Walton", "Smith",  "Jones",   "Noris"};
constexpr std::array<std::string_view, 4> kHotChannels{"Google", "Facebook", "Baidu", "Apple"};

/// Shortest random string (StringsGenerator.MIN_STRING_LENGTH).
constexpr int kMinStringLength = 3;
/// Serialized sizes the spec counts for the fixed-width part of each record, before `extra`.
constexpr int kFixedPersonBytes = 8;
constexpr int kFixedAuctionBytes = 8 + 8 + 8 + 8 + 8 + 8;
constexpr int kFixedBidBytes = 8 + 8 + 8 + 8;
/// Seeds of the channel URLs (fixed, so that every process derives the same ones).
constexpr uint64_t kHotUrlSeed = 0x6e65786d61726b01ULL;
constexpr uint64_t kChannelUrlSeed = 0x6e65786d61726b02ULL;
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;

/// Uniform in [0, bound) from 16 random bits (multiply-shift; bias below bound / 65536).
inline int from_16_bits(uint64_t bits16, int bound) {
  return static_cast<int>((bits16 * static_cast<uint64_t>(bound)) >> 16);
}

/// A random string of kMinStringLength..max_length-1 letters, each one `special` with probability 1/13,
/// trimmed of surrounding spaces (StringsGenerator.nextString). One 64-bit draw per character.
std::string next_string(EventRandom& rng, int max_length, char special = ' ') {
  int len = kMinStringLength + rng.next_int(max_length - kMinStringLength);
  std::string s(static_cast<size_t>(len), ' ');
  for (char& c : s) {
    const uint64_t r = rng.next_u64();
    c = from_16_bits(r & 0xFFFF, 13) == 0 ? special : static_cast<char>('a' + from_16_bits((r >> 16) & 0xFFFF, 26));
  }
  if (special == ' ') {
    const size_t first = s.find_first_not_of(' ');
    if (first == std::string::npos) return {};
    s.erase(s.find_last_not_of(' ') + 1);
    s.erase(0, first);
  }
  return s;
}

/// Four lowercase letters from 64 random bits, as a little-endian word: letter k is
/// from_16_bits(bits 16k..16k+15, 26). Two multiplies handle two 16-bit lanes each (a lane times 26 needs
/// 21 bits, so lanes 32 bits apart do not overlap).
inline uint32_t four_letters(uint64_t r) {
  constexpr uint64_t kLanes = 0x0000FFFF0000FFFFULL;
  const uint64_t even = (r & kLanes) * 26;
  const uint64_t odd = ((r >> 16) & kLanes) * 26;
  const auto l0 = static_cast<uint32_t>((even >> 16) & 0xFF);
  const auto l1 = static_cast<uint32_t>((odd >> 16) & 0xFF);
  const auto l2 = static_cast<uint32_t>((even >> 48) & 0xFF);
  const auto l3 = static_cast<uint32_t>((odd >> 48) & 0xFF);
  return (l0 | l1 << 8 | l2 << 16 | l3 << 24) + 0x61616161U;
}

/// `length` random lowercase letters (StringsGenerator.nextExactString), four per 64-bit draw.
std::string next_exact_string(EventRandom& rng, int length) {
  std::string s(static_cast<size_t>(length), 'a');
  char* p = s.data();
  const auto n = static_cast<size_t>(length);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint32_t word = four_letters(rng.next_u64());
    std::memcpy(p + i, &word, 4);
  }
  if (i < n) {
    const uint32_t word = four_letters(rng.next_u64());
    std::memcpy(p + i, &word, n - i);
  }
  return s;
}

/// A uniformly chosen element of `values`.
template <size_t N>
std::string_view pick(EventRandom& rng, const std::array<std::string_view, N>& values) {
  return values[static_cast<size_t>(rng.next_int(static_cast<int32_t>(N)))];
}

/// Java's Math.round(double) for the non-negative values used here.
int64_t java_round(double x) {
  return static_cast<int64_t>(std::floor(x + 0.5));
}

/// Padding so that current_size + padding averages desired_average_size, uniform within +-20%
/// (StringsGenerator.nextExtra).
std::string next_extra(EventRandom& rng, int current_size, int desired_average_size) {
  if (current_size > desired_average_size) return {};
  const int remaining = desired_average_size - current_size;
  const auto delta = static_cast<int32_t>(java_round(remaining * 0.2));
  const int min_size = remaining - delta;
  const int size = min_size + (delta == 0 ? 0 : rng.next_int(2 * delta));
  return next_exact_string(rng, size);
}

/// A price in cents, log-uniform between $1 and $1,000,000 (PriceGenerator.nextPrice).
int64_t next_price(EventRandom& rng) {
  return java_round(std::pow(10.0, rng.next_double() * 6.0) * 100.0);
}

/// "dddd dddd dddd dddd".
std::string next_credit_card(EventRandom& rng) {
  std::string s(19, ' ');
  for (int group = 0; group < 4; ++group) {
    int v = rng.next_int(10'000);
    for (int d = 3; d >= 0; --d) {
      s[static_cast<size_t>(group * 5 + d)] = static_cast<char>('0' + v % 10);
      v /= 10;
    }
  }
  return s;
}

/// Java's Integer.reverse followed by Math.abs (which leaves Integer.MIN_VALUE negative).
int64_t java_abs_reversed(int32_t v) {
  uint32_t x = static_cast<uint32_t>(v);
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    r = (r << 1) | (x & 1U);
    x >>= 1;
  }
  const auto signed_r = static_cast<int32_t>(r);
  return signed_r == std::numeric_limits<int32_t>::min() ? signed_r : (signed_r < 0 ? -signed_r : signed_r);
}

std::string base_url(EventRandom& rng) {
  std::string url = "https://www.nexmark.com/";
  for (int i = 0; i < 3; ++i) {
    url += next_string(rng, 5, '_');
    url += '/';
  }
  url += "item.htm?query=1";
  return url;
}

struct Channel {
  std::string name;
  std::string url;
};

/// The hot channels and the kNumChannels others with their URLs, derived once from fixed seeds.
struct ChannelTable {
  std::array<Channel, kHotChannels.size()> hot;
  std::vector<Channel> others;

  ChannelTable() : others(static_cast<size_t>(kNumChannels)) {
    for (size_t i = 0; i < hot.size(); ++i) {
      EventRandom rng(kHotUrlSeed, static_cast<int64_t>(i));
      hot[i] = Channel{std::string(kHotChannels[i]), base_url(rng)};
    }
    for (int c = 0; c < kNumChannels; ++c) {
      EventRandom rng(kChannelUrlSeed, c);
      Channel& ch = others[static_cast<size_t>(c)];
      ch.name = "channel-" + std::to_string(c);
      ch.url = base_url(rng);
      if (rng.next_int(10) > 0) ch.url += "&channel_id=" + std::to_string(java_abs_reversed(c));
    }
  }

  static const ChannelTable& instance() {
    static const ChannelTable table;
    return table;
  }
};

Status config_error(std::string what) {
  return Error(ErrorCode::kConfiguration, "nexmark config: " + what);
}

}  // namespace

Status NexmarkConfig::validate() const {
  if (events < 0) return config_error("events must be >= 0, got " + std::to_string(events));
  if (!(rate > 0) || !std::isfinite(rate)) {
    return config_error("rate (events per second of event time) must be a positive number, got " +
                        std::to_string(rate));
  }
  if (person_proportion < 1 || auction_proportion < 1 || bid_proportion < 1) {
    return config_error("person, auction and bid proportions must each be >= 1, got " +
                        std::to_string(person_proportion) + "/" + std::to_string(auction_proportion) + "/" +
                        std::to_string(bid_proportion));
  }
  if (hot_auction_ratio < 1 || hot_sellers_ratio < 1 || hot_bidders_ratio < 1) {
    return config_error("hot auction, seller and bidder ratios must each be >= 1");
  }
  if (num_active_people < 1 || num_in_flight_auctions < 1) {
    return config_error("num_active_people and num_in_flight_auctions must be >= 1");
  }
  if (avg_person_byte_size < 0 || avg_auction_byte_size < 0 || avg_bid_byte_size < 0) {
    return config_error("average byte sizes must be >= 0");
  }
  return ok_status();
}

EventRandom::EventRandom(uint64_t seed, int64_t event_number)
    : state_(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(event_number)))) {}

uint64_t EventRandom::next_u64() {
  const uint64_t r = splitmix64(state_);
  state_ += kGamma;
  return r;
}

int32_t EventRandom::next_int(int32_t bound) {
  // Lemire's multiply-shift: maps 32 random bits onto [0, bound).
  return static_cast<int32_t>(((next_u64() >> 32) * static_cast<uint64_t>(bound)) >> 32);
}

int64_t EventRandom::next_long(int64_t bound) {
  if (bound <= std::numeric_limits<int32_t>::max()) return next_int(static_cast<int32_t>(bound));
  return static_cast<int64_t>(next_u64() % static_cast<uint64_t>(bound));
}

double EventRandom::next_double() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

NexmarkGenerator::NexmarkGenerator(NexmarkConfig config)
    : config_(config), inter_event_delay_us_(1'000'000.0 / config.rate) {
  assert(config_.validate().ok());
}

TimestampMs NexmarkGenerator::timestamp(int64_t n) const {
  return config_.base_time_ms + static_cast<int64_t>(static_cast<double>(n) * inter_event_delay_us_) / 1000;
}

EventType NexmarkGenerator::type_of(int64_t n) const {
  const int64_t rem = n % config_.total_proportion();
  if (rem < config_.person_proportion) return EventType::kPerson;
  if (rem < config_.person_proportion + config_.auction_proportion) return EventType::kAuction;
  return EventType::kBid;
}

Event NexmarkGenerator::event(int64_t n) const {
  const TimestampMs ts = timestamp(n);
  EventRandom rng(config_.seed, n);
  switch (type_of(n)) {
    case EventType::kPerson:
      return Event{make_person(n, ts, rng)};
    case EventType::kAuction:
      return Event{make_auction(n, ts, rng)};
    case EventType::kBid:
      break;
  }
  return Event{make_bid(n, ts, rng)};
}

int64_t NexmarkGenerator::last_base0_person_id(int64_t n) const {
  const int64_t epoch = n / config_.total_proportion();
  int64_t offset = n % config_.total_proportion();
  // An auction or a bid: the last person of this epoch.
  if (offset >= config_.person_proportion) offset = config_.person_proportion - 1;
  return epoch * config_.person_proportion + offset;
}

int64_t NexmarkGenerator::last_base0_auction_id(int64_t n) const {
  int64_t epoch = n / config_.total_proportion();
  int64_t offset = n % config_.total_proportion();
  if (offset < config_.person_proportion) {
    // A person: the last auction of the previous epoch.
    --epoch;
    offset = config_.auction_proportion - 1;
  } else if (offset >= config_.person_proportion + config_.auction_proportion) {
    // A bid: the last auction of this epoch.
    offset = config_.auction_proportion - 1;
  } else {
    offset -= config_.person_proportion;
  }
  return epoch * config_.auction_proportion + offset;
}

int64_t NexmarkGenerator::next_base0_person_id(int64_t n, EventRandom& rng) const {
  // Only the last num_active_people persons (and a few ids ahead) sell and bid, so the density of
  // auctions and bids per person stays constant over long runs.
  const int64_t num_people = last_base0_person_id(n) + 1;
  const int64_t active = std::min<int64_t>(num_people, config_.num_active_people);
  return num_people - active + rng.next_long(active + kPersonIdLead);
}

int64_t NexmarkGenerator::next_base0_auction_id(int64_t n, EventRandom& rng) const {
  const int64_t max_auction = last_base0_auction_id(n);
  const int64_t min_auction = std::max<int64_t>(max_auction - config_.num_in_flight_auctions, 0);
  return min_auction + rng.next_long(max_auction - min_auction + 1 + kAuctionIdLead);
}

Person NexmarkGenerator::make_person(int64_t n, TimestampMs ts, EventRandom& rng) const {
  Person p;
  p.id = last_base0_person_id(n) + kFirstPersonId;
  const std::string_view first = pick(rng, kFirstNames);
  const std::string_view last = pick(rng, kLastNames);
  p.name.reserve(first.size() + 1 + last.size());
  p.name.append(first).append(1, ' ').append(last);
  p.email_address = next_string(rng, 7) + "@" + next_string(rng, 5) + ".com";
  p.credit_card = next_credit_card(rng);
  p.city = pick(rng, kUsCities);
  p.state = pick(rng, kUsStates);
  p.date_time = ts;
  const auto current_size = static_cast<int>(kFixedPersonBytes + p.name.size() + p.email_address.size() +
                                             p.credit_card.size() + p.city.size() + p.state.size());
  p.extra = next_extra(rng, current_size, config_.avg_person_byte_size);
  return p;
}

Auction NexmarkGenerator::make_auction(int64_t n, TimestampMs ts, EventRandom& rng) const {
  Auction a;
  a.id = last_base0_auction_id(n) + kFirstAuctionId;
  if (rng.next_int(config_.hot_sellers_ratio) > 0) {
    // A hot seller: the first person of the batch of the last kHotSellerBatch persons.
    a.seller = (last_base0_person_id(n) / kHotSellerBatch) * kHotSellerBatch;
  } else {
    a.seller = next_base0_person_id(n, rng);
  }
  a.seller += kFirstPersonId;
  a.category = kFirstCategoryId + rng.next_int(static_cast<int32_t>(kNumCategories));
  a.initial_bid = next_price(rng);
  // The auction lasts on average until num_in_flight_auctions more auctions have been created.
  const int64_t events_for_auctions =
      (static_cast<int64_t>(config_.num_in_flight_auctions) * config_.total_proportion()) / config_.auction_proportion;
  const int64_t horizon_ms = timestamp(n + events_for_auctions) - ts;
  a.date_time = ts;
  a.expires = ts + 1 + rng.next_long(std::max<int64_t>(horizon_ms * 2, 1));
  a.item_name = next_string(rng, 20);
  a.description = next_string(rng, 100);
  a.reserve = a.initial_bid + next_price(rng);
  const auto current_size = static_cast<int>(kFixedAuctionBytes + a.item_name.size() + a.description.size());
  a.extra = next_extra(rng, current_size, config_.avg_auction_byte_size);
  return a;
}

Bid NexmarkGenerator::make_bid(int64_t n, TimestampMs ts, EventRandom& rng) const {
  Bid b;
  if (rng.next_int(config_.hot_auction_ratio) > 0) {
    // A hot auction: the first of the batch of the last kHotAuctionBatch auctions.
    b.auction = (last_base0_auction_id(n) / kHotAuctionBatch) * kHotAuctionBatch;
  } else {
    b.auction = next_base0_auction_id(n, rng);
  }
  b.auction += kFirstAuctionId;
  if (rng.next_int(config_.hot_bidders_ratio) > 0) {
    // A hot bidder: the second person of the batch (so hot bidders and hot sellers differ).
    b.bidder = (last_base0_person_id(n) / kHotBidderBatch) * kHotBidderBatch + 1;
  } else {
    b.bidder = next_base0_person_id(n, rng);
  }
  b.bidder += kFirstPersonId;
  b.price = next_price(rng);
  const ChannelTable& channels = ChannelTable::instance();
  const Channel& ch = rng.next_int(kHotChannelsRatio) > 0
                          ? channels.hot[static_cast<size_t>(rng.next_int(static_cast<int32_t>(kHotChannels.size())))]
                          : channels.others[static_cast<size_t>(rng.next_int(kNumChannels))];
  b.channel = ch.name;
  b.url = ch.url;
  b.date_time = ts;
  b.extra = next_extra(rng, kFixedBidBytes, config_.avg_bid_byte_size);
  return b;
}

uint64_t checksum(std::span<const Event> events) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  DataOutput out(1024);
  for (const Event& e : events) {
    out.clear();
    serialize(e, out);
    XXH3_64bits_update(state.get(), out.data(), out.size());
  }
  return XXH3_64bits_digest(state.get());
}

uint64_t checksum(const NexmarkConfig& config, int64_t count) {
  const NexmarkGenerator gen(config);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  DataOutput out(1024);
  for (int64_t n = 0; n < count; ++n) {
    out.clear();
    serialize(gen.event(n), out);
    XXH3_64bits_update(state.get(), out.data(), out.size());
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace sluice::nexmark
