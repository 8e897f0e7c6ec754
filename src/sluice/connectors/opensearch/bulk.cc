// The `_bulk` format of the OpenSearch sink: action encoding, response parsing, item classification, backoff,
// date-based index names and the versions of change events (opensearch_sink.h).
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>

#include "sluice/connectors/opensearch/opensearch_sink.h"

namespace sluice::opensearch {

namespace {

Error config_error(std::string message) {
  return Error(ErrorCode::kConfiguration, std::move(message));
}

// The first `n` bytes of `s` (for error messages about response bodies).
std::string head(std::string_view s, size_t n = 300) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + "...";
}

// The string field `key` of `e`, or "" when absent or not a string.
std::string_view string_field(simdjson::dom::element e, const char* key) {
  std::string_view v;
  if (e[key].get(v) != simdjson::SUCCESS) return {};
  return v;
}

bool needs_document(BulkOp op) noexcept {
  return op != BulkOp::kDelete;
}

}  // namespace

std::string_view bulk_op_name(BulkOp op) noexcept {
  switch (op) {
    case BulkOp::kIndex:
      return "index";
    case BulkOp::kCreate:
      return "create";
    case BulkOp::kDelete:
      return "delete";
    case BulkOp::kUpdate:
    case BulkOp::kUpsert:
      return "update";
  }
  return "index";
}

std::string_view version_type_name(VersionType type) noexcept {
  return type == VersionType::kExternalGte ? "external_gte" : "external";
}

Status append_bulk_action(const BulkAction& a, std::string& out) {
  if (a.index.empty()) return config_error("OpenSearch bulk action without an index");
  const bool update = a.op == BulkOp::kUpdate || a.op == BulkOp::kUpsert;
  if (a.id.empty() && (update || a.op == BulkOp::kDelete)) {
    return config_error(
        fmt::format("OpenSearch {} action on index '{}' without a document id", bulk_op_name(a.op), a.index));
  }
  if (update && a.version) {
    return config_error(fmt::format(
        "OpenSearch update action (index '{}', id '{}') with an external version: the cluster rejects versions on "
        "updates; use index actions with versions, or drop the version function",
        a.index, a.id));
  }
  if (needs_document(a.op) && a.document.empty()) {
    return config_error(fmt::format("OpenSearch {} action (index '{}', id '{}') without a document", bulk_op_name(a.op),
                                    a.index, a.id));
  }
  out += "{\"";
  out += bulk_op_name(a.op);
  out += "\":{\"_index\":";
  append_json_string(a.index, out);
  if (!a.id.empty()) {
    out += ",\"_id\":";
    append_json_string(a.id, out);
  }
  if (a.version) {
    out += ",\"version\":";
    out += std::to_string(*a.version);
    out += ",\"version_type\":\"";
    out += version_type_name(a.version_type);
    out += '"';
  }
  out += "}}\n";
  if (!needs_document(a.op)) return ok_status();
  if (update) {
    out += "{\"doc\":";
    out += a.document;
    out += a.op == BulkOp::kUpsert ? ",\"doc_as_upsert\":true}\n" : "}\n";
  } else {
    out += a.document;
    out += '\n';
  }
  return ok_status();
}

Result<BulkResponse> parse_bulk_response(std::string_view body) {
  auto bad = [&](std::string_view what) {
    return Error(ErrorCode::kConnector, fmt::format("unreadable _bulk response ({}): {}", what, head(body)));
  };
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto e = parser.parse(body.data(), body.size()).get(doc); e != simdjson::SUCCESS) {
    return bad(simdjson::error_message(e));
  }
  simdjson::dom::object root;
  if (doc.get(root) != simdjson::SUCCESS) return bad("not an object");
  BulkResponse r;
  bool errors = false;
  if (root["errors"].get(errors) != simdjson::SUCCESS) return bad("no \"errors\" flag");
  r.errors = errors;
  simdjson::dom::array items;
  auto items_field = root["items"];
  if (items_field.error() == simdjson::NO_SUCH_FIELD) return r;  // filtered away: nothing to report
  if (items_field.get(items) != simdjson::SUCCESS) return bad("\"items\" is not an array");
  r.items.reserve(items.size());
  for (simdjson::dom::element item : items) {
    simdjson::dom::object outer;
    if (item.get(outer) != simdjson::SUCCESS || outer.size() != 1) return bad("an item is not a one-key object");
    BulkItemResult res;
    for (auto field : outer) {
      res.op = std::string(field.key);
      simdjson::dom::object inner;
      if (field.value.get(inner) != simdjson::SUCCESS) return bad("an item's result is not an object");
      int64_t status = 0;
      if (inner["status"].get(status) != simdjson::SUCCESS) return bad("an item has no status");
      res.status = static_cast<int>(status);
      simdjson::dom::element err;
      if (inner["error"].get(err) == simdjson::SUCCESS) {
        // error is an object {type, reason, caused_by: {type, reason}}, or (rarely, old clusters) a string.
        std::string_view text;
        if (err.get(text) == simdjson::SUCCESS) {
          res.error = std::string(text);
        } else {
          const std::string_view type = string_field(err, "type");
          const std::string_view reason = string_field(err, "reason");
          res.error_type = std::string(type);
          res.error = fmt::format("{}: {}", type, reason);
          simdjson::dom::element cause;
          if (err["caused_by"].get(cause) == simdjson::SUCCESS) {
            res.error += fmt::format("; caused by {}: {}", string_field(cause, "type"), string_field(cause, "reason"));
          }
        }
      }
    }
    r.items.push_back(std::move(res));
  }
  return r;
}

bool is_retryable_status(int http_status) noexcept {
  return http_status == 429 || (http_status >= 500 && http_status <= 599);
}

ItemOutcome classify_item(const BulkItemResult& item, BulkOp op, bool versioned) noexcept {
  if (item.status >= 200 && item.status <= 299) return ItemOutcome::kSuccess;
  if (item.status == 404 && op == BulkOp::kDelete) return ItemOutcome::kSuccess;
  if (item.status == 409 && versioned && item.error_type == "version_conflict_engine_exception") {
    return ItemOutcome::kVersionConflict;
  }
  if (is_retryable_status(item.status)) return ItemOutcome::kRetry;
  return ItemOutcome::kFailed;
}

int64_t BackoffPolicy::delay_ms(int retry) const noexcept {
  const double cap = static_cast<double>(max.count());
  double d = static_cast<double>(initial.count());
  for (int i = 1; i < retry && d < cap; ++i)
    d *= std::max(multiplier, 1.0);
  return static_cast<int64_t>(std::min(d, cap));
}

std::optional<TimestampMs> Backoff::next_attempt() {
  if (retries_ >= policy_.max_retries) return std::nullopt;
  ++retries_;
  return clock_.now_ms() + policy_.delay_ms(retries_);
}

// ---- date-based index names ----

Result<DateIndexPattern> DateIndexPattern::parse(std::string_view pattern) {
  DateIndexPattern p;
  p.pattern_ = std::string(pattern);
  auto literal = [&p](std::string_view text) {
    if (text.empty()) return;
    if (!p.parts_.empty() && p.parts_.back().field == Field::kLiteral) {
      p.parts_.back().text += text;
    } else {
      p.parts_.push_back(Part{Field::kLiteral, std::string(text)});
    }
  };
  size_t i = 0;
  while (i < pattern.size()) {
    const size_t open = pattern.find('{', i);
    if (open == std::string_view::npos) {
      literal(pattern.substr(i));
      break;
    }
    literal(pattern.substr(i, open - i));
    const size_t close = pattern.find('}', open);
    if (close == std::string_view::npos) {
      return config_error(fmt::format("date index pattern '{}': '{{' at {} is not closed", pattern, open));
    }
    size_t j = open + 1;
    while (j < close) {
      const char c = pattern[j];
      size_t run = 1;
      while (j + run < close && pattern[j + run] == c)
        ++run;
      const std::string_view token = pattern.substr(j, run);
      if (token == "yyyy") {
        p.parts_.push_back(Part{Field::kYear4, {}});
      } else if (token == "yy") {
        p.parts_.push_back(Part{Field::kYear2, {}});
      } else if (token == "MM") {
        p.parts_.push_back(Part{Field::kMonth, {}});
      } else if (token == "dd") {
        p.parts_.push_back(Part{Field::kDay, {}});
      } else if (token == "HH") {
        p.parts_.push_back(Part{Field::kHour, {}});
      } else if (token == "mm") {
        p.parts_.push_back(Part{Field::kMinute, {}});
      } else if (token == "ss") {
        p.parts_.push_back(Part{Field::kSecond, {}});
      } else if (c == '.' || c == '-' || c == '_' || c == ' ') {
        literal(token);
      } else {
        return config_error(fmt::format(
            "date index pattern '{}': unknown field '{}' at {} (fields: yyyy yy MM dd HH mm ss; separators . - _)",
            pattern, token, j));
      }
      j += run;
    }
    i = close + 1;
  }
  return p;
}

void DateIndexPattern::format_to(TimestampMs ts_ms, std::string& out) const {
  using namespace std::chrono;
  const sys_time<milliseconds> tp{milliseconds(ts_ms)};
  const sys_days day = floor<days>(tp);
  const year_month_day ymd{day};
  const hh_mm_ss<milliseconds> hms{tp - day};
  auto two = [&out](unsigned v) {
    out.push_back(static_cast<char>('0' + (v / 10) % 10));
    out.push_back(static_cast<char>('0' + v % 10));
  };
  for (const Part& part : parts_) {
    switch (part.field) {
      case Field::kLiteral:
        out += part.text;
        break;
      case Field::kYear4:
        out += fmt::format("{:04d}", static_cast<int>(ymd.year()));
        break;
      case Field::kYear2:
        two(static_cast<unsigned>((static_cast<int>(ymd.year()) % 100 + 100) % 100));
        break;
      case Field::kMonth:
        two(static_cast<unsigned>(ymd.month()));
        break;
      case Field::kDay:
        two(static_cast<unsigned>(ymd.day()));
        break;
      case Field::kHour:
        two(static_cast<unsigned>(hms.hours().count()));
        break;
      case Field::kMinute:
        two(static_cast<unsigned>(hms.minutes().count()));
        break;
      case Field::kSecond:
        two(static_cast<unsigned>(hms.seconds().count()));
        break;
    }
  }
}

// ---- versions of change events ----

namespace {

bool parse_hex_u64(std::string_view s, uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

Result<int64_t> postgres_lsn_version(std::string_view lsn) {
  const size_t slash = lsn.find('/');
  uint64_t hi = 0;
  uint64_t lo = 0;
  if (slash == std::string_view::npos || !parse_hex_u64(lsn.substr(0, slash), hi) ||
      !parse_hex_u64(lsn.substr(slash + 1), lo) || hi > 0xffffffffULL || lo > 0xffffffffULL) {
    return config_error(fmt::format("'{}' is not a Postgres LSN (\"X/Y\", hex)", lsn));
  }
  const uint64_t v = (hi << 32) | lo;
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return config_error(fmt::format("Postgres LSN '{}' is beyond the range of an external version", lsn));
  }
  return static_cast<int64_t>(v);
}

Result<int64_t> mongodb_resume_token_version(std::string_view token_json) {
  Result<Value> token = Value::from_json(token_json);
  const Value* data = nullptr;
  if (token.ok() && token->is_object()) data = token->find("_data");
  if (data == nullptr || !data->is_string()) {
    return config_error(fmt::format("'{}' is not a MongoDB resume token ({{\"_data\": \"<hex>\"}})", token_json));
  }
  const std::string_view hex = data->as_string();
  uint64_t v = 0;
  bool ok = false;
  if (hex.size() <= 16) {
    ok = parse_hex_u64(hex, v);  // mongo-java-server: the BSON timestamp's value in hex
  } else if (hex.size() >= 18 && (hex.substr(0, 2) == "82")) {
    ok = parse_hex_u64(hex.substr(2, 16), v);  // KeyString: CType timestamp (130), then 8 bytes big-endian
  }
  if (!ok || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return config_error(fmt::format("MongoDB resume token '{}' holds no readable cluster time", token_json));
  }
  return static_cast<int64_t>(v);
}

Result<int64_t> change_event_version(const cdc::ChangeEvent& e) {
  Result<int64_t> v = [&]() -> Result<int64_t> {
    if (e.source.connector == "postgres") return postgres_lsn_version(e.source.position);
    if (e.source.connector == "mongodb") return mongodb_resume_token_version(e.source.position);
    return config_error(
        fmt::format("no external version for connector '{}': set a version function", e.source.connector));
  }();
  if (!v.ok()) {
    return Error(ErrorCode::kConfiguration, fmt::format("change event of {}.{} at position '{}': {}", e.source.database,
                                                        e.source.collection, e.source.position, v.error().message()));
  }
  return v;
}

std::string change_event_id(const cdc::ChangeEvent& e) {
  const Value& id = e.entity_id();
  if (id.is_string()) return std::string(id.as_string());
  return id.to_json();
}

BulkOp change_event_op(const cdc::ChangeEvent& e) noexcept {
  return e.op == cdc::ChangeOp::kDelete ? BulkOp::kDelete : BulkOp::kIndex;
}

// ---- options, batches, failed items ----

Status validate(const OpenSearchSinkOptions& o) {
  if (o.urls.empty()) return config_error("OpenSearchSink: no URL: call url(\"http://host:9200\")");
  for (const std::string& u : o.urls) {
    if (!u.starts_with("http://") && !u.starts_with("https://")) {
      return config_error(fmt::format("OpenSearchSink: URL '{}' is not http:// or https://", u));
    }
  }
  if (o.max_batch_actions < 1 || o.max_batch_bytes < 1) {
    return config_error("OpenSearchSink: batch limits (actions, bytes) must be at least 1");
  }
  if (o.max_pending_requests < 1) return config_error("OpenSearchSink: max_pending_requests must be at least 1");
  if (o.flush_interval.count() < 0) return config_error("OpenSearchSink: flush_interval must not be negative");
  if (o.backoff.multiplier < 1.0 || o.backoff.max_retries < 0 || o.backoff.initial.count() < 0 ||
      o.backoff.max < o.backoff.initial) {
    return config_error("OpenSearchSink: backoff needs multiplier >= 1, max_retries >= 0 and 0 <= initial <= max");
  }
  if (o.on_failed_item == BadRecordPolicy::kDeadLetter && o.dead_letter_path.empty()) {
    return config_error("OpenSearchSink: on_failed_item(kDeadLetter) needs a dead-letter file path");
  }
  if (!o.refresh.empty() && o.refresh != "true" && o.refresh != "false" && o.refresh != "wait_for") {
    return config_error(fmt::format("OpenSearchSink: refresh '{}' is not true, false or wait_for", o.refresh));
  }
  return ok_status();
}

Status BulkBatch::add(const BulkAction& action, std::string position) {
  const size_t begin = body.size();
  SLUICE_RETURN_IF_ERROR(append_bulk_action(action, body));
  if (body.size() > std::numeric_limits<uint32_t>::max()) {
    body.resize(begin);
    return Error(ErrorCode::kConfiguration, "OpenSearch bulk request beyond 4 GiB: lower max_batch_bytes");
  }
  BulkItemMeta meta;
  meta.begin = static_cast<uint32_t>(begin);
  meta.end = static_cast<uint32_t>(body.size());
  meta.op = action.op;
  meta.versioned = action.version.has_value();
  meta.position = std::move(position);
  items.push_back(std::move(meta));
  return ok_status();
}

std::string FailedItem::reason_code() const {
  // The cluster's error type ("mapper_parsing_exception: failed to parse ..."): a bounded set of identifiers.
  const std::string_view type = std::string_view(error).substr(0, error.find(':'));
  const bool identifier = !type.empty() && type.size() <= 80 && std::all_of(type.begin(), type.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
  });
  return identifier ? std::string(type) : fmt::format("status-{}", status);
}

Value FailedItem::to_dead_letter() const {
  Value v = Value::object();
  v.set("sink", Value::string("opensearch"));
  v.set("index", Value::string(index));
  v.set("id", Value::string(id));
  v.set("action", Value::string(action));
  v.set("version", version ? Value(*version) : Value());
  v.set("status", Value(static_cast<int64_t>(status)));
  v.set("reason", Value::string(reason_code()));
  v.set("error", Value::string(error));
  v.set("position", Value::string(position));
  v.set("document", Value::string(document));
  return v;
}

std::string FailedItem::describe() const {
  std::string s = fmt::format("index '{}', id '{}', action {}", index, id, action);
  if (version) s += fmt::format(", version {}", *version);
  if (!position.empty()) s += fmt::format(", position {}", position);
  s += fmt::format(", status {}: {}", status, error);
  return s;
}

namespace {

bool contains_decimal(const Value& v) {
  if (v.is_decimal()) return true;
  if (v.is_array()) {
    for (const Value& e : v.as_array()) {
      if (contains_decimal(e)) return true;
    }
  } else if (v.is_object()) {
    for (const auto& [k, e] : v.as_object()) {
      if (contains_decimal(e)) return true;
    }
  }
  return false;
}

void decimals_to_strings(Value& v) {
  if (v.is_decimal()) {
    v = Value(v.as_decimal().to_string());
  } else if (v.is_array()) {
    for (Value& e : v.as_array())
      decimals_to_strings(e);
  } else if (v.is_object()) {
    Value::Object& o = v.as_object();
    for (size_t i = 0; i < o.size(); ++i)
      decimals_to_strings(o.value_at(i));
  }
}

}  // namespace

void write_document(const Value& document, DecimalHandling handling, std::string& out) {
  // Copies only a document that holds a decimal.
  if (handling == DecimalHandling::kNumber || !contains_decimal(document)) {
    document.write_json(out);
    return;
  }
  Value copy = document;
  decimals_to_strings(copy);
  copy.write_json(out);
}

}  // namespace sluice::opensearch
