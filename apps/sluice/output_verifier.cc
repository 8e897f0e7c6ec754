#include "output_verifier.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <climits>

#include "sluice/core/value.h"

namespace sluice::cli {

namespace {

/// A scalar's text (a key or an id may be a string or a number).
std::optional<std::string> scalar_text(const Value& v) {
  if (v.is_string()) return std::string(v.as_string());
  if (v.is_int64()) return std::to_string(v.as_int64());
  if (v.is_bool()) return v.as_bool() ? "true" : "false";
  if (v.is_null() || v.is_array() || v.is_object()) return std::nullopt;
  std::string out;
  v.write_json(out);
  return out;
}

std::optional<int64_t> integer(const Value& v) {
  if (v.is_int64()) return v.as_int64();
  if (v.is_string()) {
    const std::string_view s = v.as_string();
    int64_t out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return out;
  }
  return std::nullopt;
}

}  // namespace

void OutputVerifier::example(std::string text) {
  if (report_.examples.size() < max_examples_) report_.examples.push_back(std::move(text));
}

void OutputVerifier::add(std::string_view json, const std::string& where) {
  ++report_.records;
  auto parsed = Value::from_json(json);
  if (!parsed.ok()) {
    ++report_.unreadable;
    example(fmt::format("unreadable record at {}: {}", where, parsed.error().message()));
    return;
  }
  const Value& record = *parsed;
  auto field = [&](const std::string& path, std::string_view what) -> const Value* {
    const Value* v = record.at_path(path);
    if (v == nullptr || v->is_null()) {
      ++report_.unreadable;
      example(fmt::format("record at {} has no {} field '{}': {}", where, what, path, json.substr(0, 200)));
    }
    return v == nullptr || v->is_null() ? nullptr : v;
  };
  std::optional<std::string> key;
  std::optional<int64_t> seq;
  if (!fields_.key_field.empty() && !fields_.seq_field.empty()) {
    const Value* k = field(fields_.key_field, "key");
    if (k == nullptr) return;
    const Value* s = field(fields_.seq_field, "sequence");
    if (s == nullptr) return;
    key = scalar_text(*k);
    seq = integer(*s);
    if (!key || !seq) {
      ++report_.unreadable;
      example(fmt::format("record at {}: key '{}' must be a scalar and sequence '{}' an integer: {}", where,
                          fields_.key_field, fields_.seq_field, json.substr(0, 200)));
      return;
    }
  }
  std::string id;
  if (!fields_.id_field.empty()) {
    const Value* v = field(fields_.id_field, "id");
    if (v == nullptr) return;
    auto text = scalar_text(*v);
    if (!text) {
      ++report_.unreadable;
      example(fmt::format("record at {}: id '{}' is not a scalar", where, fields_.id_field));
      return;
    }
    id = std::move(*text);
  } else {
    id = *key + "\x1f" + std::to_string(*seq);  // without an id field, (key, seq) identifies an event
  }
  const bool first_sighting = ids_.insert(id).second;
  if (!first_sighting) {
    ++report_.duplicated;
    example(fmt::format("duplicate at {}: id {}{}", where, fields_.id_field.empty() ? "(key, seq) " : "",
                        fields_.id_field.empty() ? fmt::format("({}, {})", *key, *seq) : id));
  }
  if (!key) return;
  KeyState& ks = keys_[*key];
  if (first_sighting && *seq < ks.max_seq) {
    ++report_.out_of_order;
    example(fmt::format("out of order at {}: key {} seq {} after seq {}", where, *key, *seq, ks.max_seq));
  }
  ks.max_seq = std::max(ks.max_seq, *seq);
  ks.seqs.insert(*seq);
}

VerifyReport OutputVerifier::report() {
  VerifyReport r = report_;
  r.distinct_ids = static_cast<int64_t>(ids_.size());
  r.keys = static_cast<int64_t>(keys_.size());
  r.missing = 0;
  r.keys_with_gaps = 0;
  for (const auto& [key, ks] : keys_) {
    const int64_t lo = fields_.seq_start.value_or(*std::min_element(ks.seqs.begin(), ks.seqs.end()));
    const int64_t hi = fields_.seq_end.value_or(ks.max_seq);
    int64_t present = 0;
    for (int64_t s : ks.seqs)
      if (s >= lo && s <= hi) ++present;
    const int64_t missing = hi >= lo ? (hi - lo + 1) - present : 0;
    if (missing <= 0) continue;
    r.missing += missing;
    ++r.keys_with_gaps;
    if (r.examples.size() < max_examples_) {
      // Name the first missing sequence numbers of this key.
      std::vector<int64_t> absent;
      for (int64_t s = lo; s <= hi && absent.size() < 5 && s - lo < 10'000'000; ++s)
        if (ks.seqs.count(s) == 0) absent.push_back(s);
      r.examples.push_back(
          fmt::format("key {}: {} of seq {}..{} missing, first: {}", key, missing, lo, hi, fmt::join(absent, ", ")));
    }
  }
  return r;
}

}  // namespace sluice::cli
