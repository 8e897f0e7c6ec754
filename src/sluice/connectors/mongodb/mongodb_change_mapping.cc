// A change stream document as a cdc::ChangeEvent (mongodb::map_change_document), the filter that resumes a snapshot
// after an _id across BSON's order of types, and the owner rule of collection splits.
#include <fmt/format.h>
#include <mongoc/mongoc.h>

#include <string>
#include <string_view>

#include "mongodb_cdc_internals.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/assign_or_return.h"

namespace sluice {

using mongodb_cdc_internal::cluster_time_ms;
using mongodb_cdc_internal::describe_cluster_time;

namespace mongodb {

namespace {

// MongoDB's order of BSON types when it compares or sorts values of different types (numbers compare with each
// other, strings with symbols).
int bson_type_rank(int type) noexcept {
  switch (type) {
    case BSON_TYPE_MINKEY:
      return 0;
    case BSON_TYPE_UNDEFINED:
    case BSON_TYPE_NULL:
      return 1;
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DECIMAL128:
      return 2;
    case BSON_TYPE_UTF8:
    case BSON_TYPE_SYMBOL:
      return 3;
    case BSON_TYPE_DOCUMENT:
      return 4;
    case BSON_TYPE_ARRAY:
      return 5;
    case BSON_TYPE_BINARY:
      return 6;
    case BSON_TYPE_OID:
      return 7;
    case BSON_TYPE_BOOL:
      return 8;
    case BSON_TYPE_DATE_TIME:
      return 9;
    case BSON_TYPE_TIMESTAMP:
      return 10;
    case BSON_TYPE_REGEX:
      return 11;
    case BSON_TYPE_DBPOINTER:
      return 12;
    case BSON_TYPE_CODE:
      return 13;
    case BSON_TYPE_CODEWSCOPE:
      return 14;
    case BSON_TYPE_MAXKEY:
      return 15;
    default:
      return 16;
  }
}

}  // namespace

void scan_after_filter(const bson_t& after_id, bson_t& filter) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, &after_id, "_id")) return;
  const int rank = bson_type_rank(bson_iter_type(&it));
  bson_t any;
  bson_append_array_begin(&filter, "$or", 3, &any);
  int n = 0;
  auto clause = [&](auto&& append_condition) {
    const std::string idx = std::to_string(n++);
    bson_t c;
    bson_t cond;
    bson_append_document_begin(&any, idx.c_str(), static_cast<int>(idx.size()), &c);
    bson_append_document_begin(&c, "_id", 3, &cond);
    append_condition(cond);
    bson_append_document_end(&c, &cond);
    bson_append_document_end(&any, &c);
  };
  clause([&](bson_t& cond) { bson_append_iter(&cond, "$gt", 3, &it); });
  // The types a document's _id can have: not arrays, regexes or undefined (servers refuse them), nor the
  // deprecated DBPointer, JavaScript code and symbol (symbols compare as strings, in the $gt clause; the emulator
  // rejects a $type of the others: docs/cdc.md says such _ids are not supported by a resumed snapshot).
  static constexpr int kIdTypes[] = {BSON_TYPE_DOUBLE, BSON_TYPE_UTF8,      BSON_TYPE_DOCUMENT,  BSON_TYPE_BINARY,
                                     BSON_TYPE_OID,    BSON_TYPE_BOOL,      BSON_TYPE_DATE_TIME, BSON_TYPE_NULL,
                                     BSON_TYPE_INT32,  BSON_TYPE_TIMESTAMP, BSON_TYPE_INT64,     BSON_TYPE_DECIMAL128,
                                     BSON_TYPE_MAXKEY};
  for (const int t : kIdTypes) {
    if (bson_type_rank(t) > rank) clause([&](bson_t& cond) { bson_append_int32(&cond, "$type", 5, t); });
  }
  bson_append_array_end(&filter, &any);
}

int collection_split_owner(std::string_view split_id, int parallelism) noexcept {
  uint32_t h = 0;
  for (const char c : split_id)
    h = 31 * h + static_cast<uint32_t>(static_cast<unsigned char>(c));
  const uint32_t hash31 = h * 31u;
  return static_cast<int>(static_cast<int64_t>(hash31 & 0x7FFFFFFFu) % std::max(1, parallelism));
}

Result<MappedChange> map_change_document(const bson_t& change, const MongoCollectionSplit& split,
                                         const BsonToValueOptions& options) {
  MappedChange out;
  bson_iter_t it;
  std::string op;
  if (bson_iter_init_find(&it, &change, "operationType") && BSON_ITER_HOLDS_UTF8(&it))
    op = bson_iter_utf8(&it, nullptr);
  if (op.empty()) return Error(ErrorCode::kSerialization, "change document without operationType");
  uint32_t t = 0;
  uint32_t i = 0;
  if (bson_iter_init_find(&it, &change, "clusterTime") && BSON_ITER_HOLDS_TIMESTAMP(&it)) {
    bson_iter_timestamp(&it, &t, &i);
  }
  out.cluster_time = mongo_cluster_time(t, i);

  if (op == "drop" || op == "rename" || op == "dropDatabase" || op == "invalidate") {
    out.kind = MappedChange::Kind::kEndOfStream;
    out.what = op;
    if (op == "rename" && bson_iter_init_find(&it, &change, "to") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
      bson_iter_t to;
      std::string db;
      std::string coll;
      if (bson_iter_recurse(&it, &to)) {
        while (bson_iter_next(&to)) {
          if (BSON_ITER_HOLDS_UTF8(&to) && std::string_view(bson_iter_key(&to)) == "db")
            db = bson_iter_utf8(&to, nullptr);
          if (BSON_ITER_HOLDS_UTF8(&to) && std::string_view(bson_iter_key(&to)) == "coll")
            coll = bson_iter_utf8(&to, nullptr);
        }
      }
      out.what = fmt::format("rename to '{}.{}'", db, coll);
    }
    out.what += fmt::format(" at {}", describe_cluster_time(out.cluster_time));
    return out;
  }
  cdc::ChangeEvent& e = out.event;
  if (op == "insert") {
    e.op = cdc::ChangeOp::kCreate;
  } else if (op == "update" || op == "replace") {
    e.op = cdc::ChangeOp::kUpdate;
  } else if (op == "delete") {
    e.op = cdc::ChangeOp::kDelete;
  } else {
    out.kind = MappedChange::Kind::kSkip;
    out.what = op;
    return out;
  }
  // The resume token (the change's _id) becomes the position.
  if (bson_iter_init_find(&it, &change, "_id") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    uint32_t len = 0;
    const uint8_t* data = nullptr;
    bson_iter_document(&it, &len, &data);
    e.source.position = bson_to_canonical_json(data, len);
  }
  if (e.source.position.empty())
    return Error(ErrorCode::kSerialization, "change document without a resume token (_id)");

  auto sub = [&](const char* name, Value& target) -> Status {
    bson_iter_t f;
    if (!bson_iter_init_find(&f, &change, name)) return ok_status();
    if (BSON_ITER_HOLDS_NULL(&f)) return ok_status();
    if (!BSON_ITER_HOLDS_DOCUMENT(&f)) {
      return Error(ErrorCode::kSerialization, fmt::format("change document field '{}' is not a document", name));
    }
    SLUICE_ASSIGN_OR_RETURN(Value v, bson_iter_to_value(f, options));
    target = std::move(v);
    return ok_status();
  };
  Value document_key;
  SLUICE_RETURN_IF_ERROR(sub("documentKey", document_key));
  if (e.op != cdc::ChangeOp::kDelete) SLUICE_RETURN_IF_ERROR(sub("fullDocument", e.after));
  SLUICE_RETURN_IF_ERROR(sub("fullDocumentBeforeChange", e.before));
  const Value* id = document_key.is_object() ? document_key.find("_id") : nullptr;
  // Servers whose documentKey lacks _id (the emulator puts the update specification there): take it from
  // fullDocument. An update whose document is gone has after = null.
  if (id == nullptr && e.after.is_object()) id = e.after.find("_id");
  if (id == nullptr) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("{} change without a document _id (documentKey {}, fullDocument {})", op,
                             document_key.to_json(), e.after.is_null() ? "null" : "without _id"));
  }
  e.key = Value::object({{"_id", *id}});
  if (e.after.is_object() && e.after.find("_id") == nullptr) e.after = Value::null();  // a delta, not a document
  if (bson_iter_init_find(&it, &change, "txnNumber") && (BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_INT32(&it))) {
    e.source.txn_id = bson_iter_as_int64(&it);
  }
  e.source.connector = "mongodb";
  e.source.database = split.database;
  e.source.collection = split.collection;
  e.source.ts_ms = cluster_time_ms(out.cluster_time);
  e.source.snapshot = split.overlap_until != 0 && out.cluster_time <= split.overlap_until;
  return out;
}

}  // namespace mongodb

}  // namespace sluice
