#include "sluice/pipeline/domain_event.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <memory>
#include <stdexcept>

namespace sluice::pipeline {

namespace {

// SHA-1 fetched once and one digest context per thread: OpenSSL 3 looks the algorithm up in its provider
// table on every EVP_DigestInit_ex given EVP_sha1() and allocates a fresh context with EVP_MD_CTX_new, which
// together cost more than hashing a CDC event's name (about 2,500 of 6,300 instructions, callgrind).
const EVP_MD* sha1() {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA1", nullptr);  // lives as long as the process
  if (md == nullptr) throw SluiceException(Error(ErrorCode::kInternal, "uuid_v5: OpenSSL has no SHA-1"));
  return md;
}

struct DigestContextDeleter {
  void operator()(EVP_MD_CTX* ctx) const noexcept { EVP_MD_CTX_free(ctx); }
};

EVP_MD_CTX* thread_digest_context() {
  thread_local std::unique_ptr<EVP_MD_CTX, DigestContextDeleter> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr) throw std::bad_alloc();
  return ctx.get();
}

}  // namespace

std::string uuid_v5(const std::array<uint8_t, 16>& name_space, std::string_view name) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = thread_digest_context();
  const bool ok = EVP_DigestInit_ex(ctx, sha1(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, name_space.data(), name_space.size()) == 1 &&
                  EVP_DigestUpdate(ctx, name.data(), name.size()) == 1 && EVP_DigestFinal_ex(ctx, digest, &len) == 1;
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
  name += fmt::format_int(source.sequence).str();
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
  // Built field by field with moves: Value::object's initializer list holds const values, so it would copy the
  // payload (the whole row) and the source once more for every event.
  Value src = Value::object();
  Value::Object& s = src.as_object();
  s.reserve(6);
  s.set("connector", Value(change.source.connector));
  s.set("db", Value(change.source.database));
  s.set("collection", Value(change.source.collection));
  s.set("position", Value(change.source.position));
  s.set("sequence", Value(change.source.sequence));
  s.set("snapshot", Value(change.source.snapshot));
  Value event = Value::object();
  Value::Object& e = event.as_object();
  e.reserve(7);
  e.set("id", Value(event_id(change.source, entity, type)));
  e.set("type", Value(type));
  e.set("entity", entity);
  e.set("occurred_at", Value::timestamp_micros(occurred_at_micros));
  e.set("op", Value(cdc::to_string(change.op)));
  e.set("payload", std::move(payload));
  e.set("source", std::move(src));
  return event;
}

}  // namespace sluice::pipeline
