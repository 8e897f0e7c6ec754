#include "sluice/pipeline/domain_event.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <stdexcept>

namespace sluice::pipeline {

std::string uuid_v5(const std::array<uint8_t, 16>& name_space, std::string_view name) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) throw std::bad_alloc();
  const bool ok = EVP_DigestInit_ex(ctx, EVP_sha1(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, name_space.data(), name_space.size()) == 1 &&
                  EVP_DigestUpdate(ctx, name.data(), name.size()) == 1 && EVP_DigestFinal_ex(ctx, digest, &len) == 1;
  EVP_MD_CTX_free(ctx);
  if (!ok || len < 16) throw SluiceException(Error(ErrorCode::kInternal, "uuid_v5: OpenSSL SHA-1 failed"));
  digest[6] = static_cast<unsigned char>((digest[6] & 0x0f) | 0x50);  // version 5
  digest[8] = static_cast<unsigned char>((digest[8] & 0x3f) | 0x80);  // RFC 4122 variant
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

std::string event_id(const cdc::SourceInfo& source, const Value& entity, std::string_view type) {
  std::string name;
  name.reserve(128);
  constexpr char kSep = '\x1f';
  name += source.connector;
  name += kSep;
  name += source.database;
  name += kSep;
  name += source.collection;
  name += kSep;
  name += source.position;
  name += kSep;
  name += fmt::format("{}", source.sequence);
  name += kSep;
  entity.write_json(name);
  name += kSep;
  name += type;
  return uuid_v5(kEventIdNamespace, name);
}

std::string default_event_type(const cdc::ChangeEvent& change) {
  std::string_view table = change.source.collection;
  if (const size_t dot = table.rfind('.'); dot != std::string_view::npos) table.remove_prefix(dot + 1);
  std::string_view what = "created";
  switch (change.op) {
    case cdc::ChangeOp::kCreate:
      what = "created";
      break;
    case cdc::ChangeOp::kUpdate:
      what = "updated";
      break;
    case cdc::ChangeOp::kDelete:
      what = "deleted";
      break;
    case cdc::ChangeOp::kRead:
      what = "read";
      break;
  }
  return fmt::format("{}.{}", table, what);
}

Value make_domain_event(const cdc::ChangeEvent& change, const Value& entity, std::string type, Value payload,
                        int64_t occurred_at_micros) {
  Value src = Value::object({{"connector", Value(change.source.connector)},
                             {"db", Value(change.source.database)},
                             {"collection", Value(change.source.collection)},
                             {"position", Value(change.source.position)},
                             {"sequence", Value(change.source.sequence)},
                             {"snapshot", Value(change.source.snapshot)}});
  std::string id = event_id(change.source, entity, type);
  return Value::object({{"id", Value(id)},
                        {"type", Value(type)},
                        {"entity", entity},
                        {"occurred_at", Value::timestamp_micros(occurred_at_micros)},
                        {"op", Value(cdc::to_string(change.op))},
                        {"payload", std::move(payload)},
                        {"source", std::move(src)}});
}

}  // namespace sluice::pipeline
