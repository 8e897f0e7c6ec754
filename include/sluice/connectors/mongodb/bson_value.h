// BSON <-> Value: the document mapping of the MongoDB connector (DESIGN.md §4: "BSON and JSON convert to and
// from it without loss").
//
// Value has no kinds for several BSON types. Those become one-field objects in the shape of MongoDB Extended
// JSON v2 (canonical mode), so that `Value::to_json()` of a mapped document reads as Extended JSON and
// value_to_bson() turns them back into the same BSON type:
//
//   BSON type                       Value
//   double                          double
//   string                          string
//   document                        object (field order kept)
//   array                           array
//   binary, subtype 0 (generic)     bytes
//   binary, other subtypes          {"$binary": {"base64": "<base64>", "subType": "<2 hex digits>"}}
//   undefined                       {"$undefined": true}
//   ObjectId                        {"$oid": "<24 lower-case hex digits>"}
//   bool                            bool
//   datetime (ms)                   timestamp (µs = ms * 1000); beyond ±292 000 years, where that overflows:
//                                   {"$date": {"$numberLong": "<ms>"}}
//   null                            null
//   regex                           {"$regularExpression": {"pattern": "...", "options": "..."}} (options kept
//                                   as stored: order and unknown letters; libbson's writer would sort/drop them)
//   DBPointer                       {"$dbPointer": {"$ref": "<ns>", "$id": {"$oid": "..."}}}
//   JavaScript code                 {"$code": "..."} (a NUL inside is kept, as in symbols and code with scope)
//   symbol                          {"$symbol": "..."}
//   code with scope                 {"$code": "...", "$scope": {...}}
//   int32                           int64 (default: the width is not kept), or with
//                                   Int32Mapping::kTagged {"$numberInt": "<n>"} (width kept)
//   timestamp (internal)            {"$timestamp": {"t": <seconds>, "i": <increment>}} (both int64)
//   int64                           int64
//   Decimal128, finite              decimal (34 digits fit Value's 38; the exponent is kept as the scale, so
//                                   1.50 stays 1.50); -0 and NaN/±Infinity: {"$numberDecimal": "<text>"}
//   minKey / maxKey                 {"$minKey": 1} / {"$maxKey": 1}
//
// value_to_bson() inverts the table: each wrapper object above (exactly those field names, well-formed)
// becomes its BSON type, any other object a document; Value int64 -> int64, bytes -> binary subtype 0,
// timestamp -> datetime (µs floored to ms: a timestamp not from BSON loses its sub-millisecond part),
// decimal -> Decimal128 (a kSerialization error when it has more than 34 digits or its exponent is outside
// Decimal128's range). So bson -> Value -> bson gives back the same bytes, except that int32 becomes int64
// under the default Int32Mapping::kInt64. A user document whose field names look like a wrapper (e.g. a
// sub-document {"$oid": "<24 hex>"}) is read back as that type; MongoDB reserves `$`-prefixed names, so real
// data does not hit this.
//
// Errors: bson_to_value() returns kSerialization for corrupt BSON (bad lengths, truncation, a missing
// terminator, invalid UTF-8 in a string, key, code, symbol or regex); value_to_bson() for values BSON cannot hold
// (a key or a regex pattern/options with a NUL byte, a non-object at the top level, a decimal Decimal128 cannot
// represent exactly).
// Thread-safety: free functions without shared state.
#pragma once

#include <bson/bson.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice::mongodb {

/// How BSON int32 maps to Value (see the file comment).
enum class Int32Mapping {
  kInt64,   ///< int32 -> int64: values exact, the width is not kept (value_to_bson writes int64)
  kTagged,  ///< int32 -> {"$numberInt": "<n>"}: the width survives a round trip
};

/// Options of bson_to_value().
struct BsonToValueOptions {
  Int32Mapping int32 = Int32Mapping::kInt64;
};

/// Converts a BSON document to a Value object. Errors: kSerialization naming the field path and the problem
/// for corrupt or non-UTF-8 input.
[[nodiscard]] Result<Value> bson_to_value(const bson_t& doc, const BsonToValueOptions& options = {});

/// Converts `len` bytes of BSON (one document) to a Value object; validates lengths and structure first.
/// Errors: kSerialization.
[[nodiscard]] Result<Value> bson_to_value(const uint8_t* data, size_t len, const BsonToValueOptions& options = {});

/// Converts the value an iterator points at (any BSON type) to a Value. Errors: kSerialization.
[[nodiscard]] Result<Value> bson_iter_to_value(const bson_iter_t& iter, const BsonToValueOptions& options = {});

/// Appends `value` (an object) as the fields of `out` (an initialised, empty or partly built bson_t).
/// Errors: kSerialization (see the file comment); `out` may then hold some fields.
[[nodiscard]] Status append_value_fields(const Value& object, bson_t& out);

/// Appends one field `key` = `value` to `out`. Errors: kSerialization.
[[nodiscard]] Status append_value(bson_t& out, std::string_view key, const Value& value);

/// Converts a Value object to a BSON document (the raw bytes of a bson_t). Errors: kSerialization.
[[nodiscard]] Result<std::string> value_to_bson(const Value& object);

/// Canonical Extended JSON text of a BSON document (for positions and messages); "" when `len` is 0 or the
/// bytes are not BSON.
std::string bson_to_canonical_json(const uint8_t* data, size_t len);
/// Same for a bson_t.
std::string bson_to_canonical_json(const bson_t& doc);

}  // namespace sluice::mongodb
