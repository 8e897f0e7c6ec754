#include "nexmark/generator.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sluice/connectors/datagen.h"
#include "sluice/core/data_io.h"

namespace sluice::nexmark {
namespace {

__extension__ typedef unsigned __int128 Uint128;

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

/// The longest string append_string makes (its max_length bound, exclusive).
constexpr int kMaxRandomStringLength = 128;

/// One character of a random string from 16 random bits v: `special` when v * 13 < 2^16 (probability
/// 5042 / 65536, 1/13 to four digits), else a letter from the rest of the range (uniform to 1 part in 2^16).
inline char random_char(uint64_t v, char special) {
  const uint64_t t = v * 13;
  // Computed either way (unsigned, so the wrap below 2^16 is defined) to let the compiler select, not branch.
  const auto letter = static_cast<char>('a' + ((t - 0x10000) * 26) / (12 * 0x10000));
  return t < 0x10000 ? special : letter;
}

/// Appends a random string of kMinStringLength..max_length-1 characters, each one `special` with
/// probability 1/13, trimmed of surrounding spaces (StringsGenerator.nextString). Four characters per
/// 64-bit draw (Java draws twice per character).
void append_string(std::string& out, EventRandom& rng, int max_length, char special = ' ') {
  assert(max_length > kMinStringLength && max_length <= kMaxRandomStringLength);
  const int len = kMinStringLength + rng.next_int(max_length - kMinStringLength);
  std::array<char, kMaxRandomStringLength + 3> buf;
  for (int i = 0; i < len; i += 4) {
    const uint64_t r = rng.next_u64();
    for (int k = 0; k < 4; ++k)
      buf[static_cast<size_t>(i + k)] = random_char((r >> (16 * k)) & 0xFFFF, special);
  }
  int first = 0;
  int last = len;
  if (special == ' ') {
    while (first < last && buf[static_cast<size_t>(first)] == ' ')
      ++first;
    while (last > first && buf[static_cast<size_t>(last - 1)] == ' ')
      --last;
  }
  out.append(buf.data() + first, static_cast<size_t>(last - first));
}

/// Four lowercase letters from 64 random bits, as a little-endian word: letter k is
/// ((bits 16k..16k+15) * 26) >> 16. Two multiplies handle two 16-bit lanes each (a lane times 26 needs
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
std::string next_exact_string(EventRandom& rng, size_t length) {
  std::string s(length, 'a');
  char* p = s.data();
  size_t i = 0;
  for (; i + 4 <= length; i += 4) {
    const uint32_t word = four_letters(rng.next_u64());
    std::memcpy(p + i, &word, 4);
  }
  if (i < length) {
    const uint32_t word = four_letters(rng.next_u64());
    std::memcpy(p + i, &word, length - i);
  }
  return s;
}

/// A uniformly chosen element of `values`.
template <size_t N>
std::string_view pick(EventRandom& rng, const std::array<std::string_view, N>& values) {
  return values[static_cast<size_t>(rng.next_int(static_cast<int32_t>(N)))];
}

/// The `extra` pool: paddings start at an offset uniform in [0, kExtraPoolOffsets), so the pool holds that
/// many letters plus the longest padding. 64 KiB keeps it in L2 while two paddings of the same length
/// coincide only when their offsets do (probability 2^-16).
constexpr uint64_t kExtraPoolOffsets = uint64_t{1} << 16;
constexpr uint64_t kExtraPoolSeed = 0x6e65786d61726b03ULL;

/// Java's Math.round(double) for the non-negative values used here.
int64_t java_round(double x) {
  return static_cast<int64_t>(std::floor(x + 0.5));
}

/// The half-width of the uniform padding length around `remaining` bytes (20%, StringsGenerator.nextExtra).
int32_t extra_delta(int remaining) {
  return static_cast<int32_t>(java_round(remaining * 0.2));
}

/// Sets `out` to padding so that current_size + padding averages desired_average_size, its length uniform
/// in [remaining - delta, remaining + delta) with delta 20% of remaining (StringsGenerator.nextExtra).
/// One draw: its high 32 bits choose the length exactly as next_int(2 * delta) would, its low 32 bits the
/// offset of the slice in `pool`.
void assign_extra(std::string& out, EventRandom& rng, const std::string& pool, int current_size,
                  int desired_average_size) {
  if (current_size > desired_average_size) {
    out.clear();
    return;
  }
  const int remaining = desired_average_size - current_size;
  const int32_t delta = extra_delta(remaining);
  const uint64_t r = rng.next_u64();
  const auto spread = static_cast<uint64_t>(2 * delta);
  const auto size = static_cast<size_t>(remaining - delta) + static_cast<size_t>(((r >> 32) * spread) >> 32);
  const size_t offset = static_cast<size_t>(((r & 0xFFFFFFFFULL) * kExtraPoolOffsets) >> 32);
  assert(offset + size <= pool.size());
  out.assign(pool.data() + offset, size);
}

/// The pool for `config`: kExtraPoolOffsets letters plus the longest padding any record type can take.
std::shared_ptr<const std::string> make_extra_pool(const NexmarkConfig& config) {
  const int max_average =
      std::max({config.avg_person_byte_size, config.avg_auction_byte_size, config.avg_bid_byte_size, 0});
  const auto longest = static_cast<size_t>(max_average + extra_delta(max_average) + 1);
  EventRandom rng(config.seed ^ kExtraPoolSeed, 0);
  return std::make_shared<const std::string>(next_exact_string(rng, kExtraPoolOffsets + longest));
}

/// 10^(6u) for u in [0, 1): 2^y with y = 6u log2(10) < 20, as 2^floor(y) (exact, from a table) times
/// 2^(f - 1/2) sqrt(2) for the fraction f, the middle factor by its Taylor series to degree 12 (relative
/// error below 1e-15 for |f - 1/2| <= 1/2). Plain double arithmetic, so the result does not depend on the
/// C library's pow or exp (which cost ~120 instructions a call here, this ~30).
double pow10_6u(double u) {
  constexpr double kSixLog2Ten = 19.931568569324174;  // 6 log2(10)
  constexpr double kLn2 = 0.6931471805599453;
  constexpr double kSqrt2 = 1.4142135623730951;
  static constexpr std::array<double, 21> kPowersOfTwo = [] {
    std::array<double, 21> p{};
    double v = 1;
    for (double& x : p) {
      x = v;
      v *= 2;
    }
    return p;
  }();
  const double y = u * kSixLog2Ten;
  const auto k = static_cast<int>(y);
  const double x = (y - k - 0.5) * kLn2;  // 2^(f - 1/2) = e^x, |x| <= ln(2) / 2
  // e^x = sum of x^n / n! for n = 0..12, in Horner form from 1/12! down.
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
  return kPowersOfTwo[static_cast<size_t>(k)] * kSqrt2 * series;
}

/// A price in cents, log-uniform between $1 and $1,000,000 (PriceGenerator.nextPrice: 10^(6u) dollars).
int64_t next_price(EventRandom& rng) {
  return java_round(pow10_6u(rng.next_double()) * 100.0);
}

/// Sets `out` to "dddd dddd dddd dddd".
void assign_credit_card(std::string& out, EventRandom& rng) {
  out.assign(19, ' ');
  for (int group = 0; group < 4; ++group) {
    int v = rng.next_int(10'000);
    for (int d = 3; d >= 0; --d) {
      out[static_cast<size_t>(group * 5 + d)] = static_cast<char>('0' + v % 10);
      v /= 10;
    }
  }
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
    append_string(url, rng, 5, '_');
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
    : config_(config),
      inter_event_delay_us_(1'000'000.0 / config.rate),
      events_for_auctions_((static_cast<int64_t>(config.num_in_flight_auctions) * config.total_proportion()) /
                           config.auction_proportion),
      // total_proportion() >= 3 (each proportion >= 1), so the ceiling fits in 64 bits.
      epoch_multiplier_(std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(config.total_proportion()) + 1),
      extra_pool_(make_extra_pool(config)) {
  assert(config_.validate().ok());
}

TimestampMs NexmarkGenerator::timestamp(int64_t n) const {
  return config_.base_time_ms + static_cast<int64_t>(static_cast<double>(n) * inter_event_delay_us_) / 1000;
}

NexmarkGenerator::Position NexmarkGenerator::position(int64_t n) const {
  int64_t epoch;
  if (n >= 0 && n <= std::numeric_limits<uint32_t>::max()) {
    epoch = static_cast<int64_t>((static_cast<Uint128>(epoch_multiplier_) * static_cast<uint64_t>(n)) >> 64);
  } else {
    epoch = n / config_.total_proportion();
  }
  return Position{n, epoch, n - epoch * config_.total_proportion()};
}

EventType NexmarkGenerator::type_of(int64_t n) const {
  return type_at(position(n));
}

EventType NexmarkGenerator::type_at(const Position& at) const {
  if (at.offset < config_.person_proportion) return EventType::kPerson;
  if (at.offset < config_.person_proportion + config_.auction_proportion) return EventType::kAuction;
  return EventType::kBid;
}

namespace {
/// The record of type R that `e` holds, switching `e` to a fresh R when it holds another type.
template <class R>
R& holding(Event& e) {
  if (R* r = std::get_if<R>(&e.payload)) return *r;
  return e.payload.emplace<R>();
}
}  // namespace

Event NexmarkGenerator::event(int64_t n) const {
  Event e;
  event_into(n, e);
  return e;
}

void NexmarkGenerator::event_into(int64_t n, Event& out) const {
  const TimestampMs ts = timestamp(n);
  const Position at = position(n);
  EventRandom rng(config_.seed, n);
  switch (type_at(at)) {
    case EventType::kPerson:
      make_person(at, ts, rng, holding<Person>(out));
      return;
    case EventType::kAuction:
      make_auction(at, ts, rng, holding<Auction>(out));
      return;
    case EventType::kBid:
      make_bid(at, ts, rng, holding<Bid>(out));
      return;
  }
}

int64_t NexmarkGenerator::last_base0_person_id(int64_t n) const {
  return last_person(position(n));
}

int64_t NexmarkGenerator::last_base0_auction_id(int64_t n) const {
  return last_auction(position(n));
}

int64_t NexmarkGenerator::next_base0_person_id(int64_t n, EventRandom& rng) const {
  return next_person(position(n), rng);
}

int64_t NexmarkGenerator::next_base0_auction_id(int64_t n, EventRandom& rng) const {
  return next_auction(position(n), rng);
}

int64_t NexmarkGenerator::last_person(const Position& at) const {
  // An auction or a bid: the last person of this epoch.
  const int64_t offset = std::min<int64_t>(at.offset, config_.person_proportion - 1);
  return at.epoch * config_.person_proportion + offset;
}

int64_t NexmarkGenerator::last_auction(const Position& at) const {
  int64_t epoch = at.epoch;
  int64_t offset = at.offset;
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

int64_t NexmarkGenerator::next_person(const Position& at, EventRandom& rng) const {
  // Only the last num_active_people persons (and a few ids ahead) sell and bid, so the density of
  // auctions and bids per person stays constant over long runs.
  const int64_t num_people = last_person(at) + 1;
  const int64_t active = std::min<int64_t>(num_people, config_.num_active_people);
  return num_people - active + rng.next_long(active + kPersonIdLead);
}

int64_t NexmarkGenerator::next_auction(const Position& at, EventRandom& rng) const {
  const int64_t max_auction = last_auction(at);
  const int64_t min_auction = std::max<int64_t>(max_auction - config_.num_in_flight_auctions, 0);
  return min_auction + rng.next_long(max_auction - min_auction + 1 + kAuctionIdLead);
}

void NexmarkGenerator::make_person(const Position& at, TimestampMs ts, EventRandom& rng, Person& p) const {
  p.id = last_person(at) + kFirstPersonId;
  const std::string_view first = pick(rng, kFirstNames);
  const std::string_view last = pick(rng, kLastNames);
  p.name.assign(first).append(1, ' ').append(last);
  p.email_address.clear();
  append_string(p.email_address, rng, 7);
  p.email_address += '@';
  append_string(p.email_address, rng, 5);
  p.email_address += ".com";
  assign_credit_card(p.credit_card, rng);
  p.city.assign(pick(rng, kUsCities));
  p.state.assign(pick(rng, kUsStates));
  p.date_time = ts;
  const auto current_size = static_cast<int>(kFixedPersonBytes + p.name.size() + p.email_address.size() +
                                             p.credit_card.size() + p.city.size() + p.state.size());
  assign_extra(p.extra, rng, *extra_pool_, current_size, config_.avg_person_byte_size);
}

void NexmarkGenerator::make_auction(const Position& at, TimestampMs ts, EventRandom& rng, Auction& a) const {
  a.id = last_auction(at) + kFirstAuctionId;
  if (rng.next_int(config_.hot_sellers_ratio) > 0) {
    // A hot seller: the first person of the batch of the last kHotSellerBatch persons.
    a.seller = (last_person(at) / kHotSellerBatch) * kHotSellerBatch;
  } else {
    a.seller = next_person(at, rng);
  }
  a.seller += kFirstPersonId;
  a.category = kFirstCategoryId + rng.next_int(static_cast<int32_t>(kNumCategories));
  a.initial_bid = next_price(rng);
  // The auction lasts on average until num_in_flight_auctions more auctions have been created.
  const int64_t horizon_ms = timestamp(at.n + events_for_auctions_) - ts;
  a.date_time = ts;
  a.expires = ts + 1 + rng.next_long(std::max<int64_t>(horizon_ms * 2, 1));
  a.item_name.clear();
  append_string(a.item_name, rng, 20);
  a.description.clear();
  append_string(a.description, rng, 100);
  a.reserve = a.initial_bid + next_price(rng);
  const auto current_size = static_cast<int>(kFixedAuctionBytes + a.item_name.size() + a.description.size());
  assign_extra(a.extra, rng, *extra_pool_, current_size, config_.avg_auction_byte_size);
}

void NexmarkGenerator::make_bid(const Position& at, TimestampMs ts, EventRandom& rng, Bid& b) const {
  if (rng.next_int(config_.hot_auction_ratio) > 0) {
    // A hot auction: the first of the batch of the last kHotAuctionBatch auctions.
    b.auction = (last_auction(at) / kHotAuctionBatch) * kHotAuctionBatch;
  } else {
    b.auction = next_auction(at, rng);
  }
  b.auction += kFirstAuctionId;
  if (rng.next_int(config_.hot_bidders_ratio) > 0) {
    // A hot bidder: the second person of the batch (so hot bidders and hot sellers differ).
    b.bidder = (last_person(at) / kHotBidderBatch) * kHotBidderBatch + 1;
  } else {
    b.bidder = next_person(at, rng);
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
  assign_extra(b.extra, rng, *extra_pool_, kFixedBidBytes, config_.avg_bid_byte_size);
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
