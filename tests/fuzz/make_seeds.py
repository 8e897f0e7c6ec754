#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the cases of the unit tests
and the examples; files named finding-* are the inputs of past findings, kept as they are. Run it again after changing it; the seeds are committed (small files), this script only
documents where they come from. Needs python3-pymongo (scripts/setup) for the BSON seeds."""
import hashlib
import json
import pathlib
import re
import struct

import bson
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
import datetime

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def write(target, seeds):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        if not old.name.startswith("finding-"):  # inputs of past findings stay (regressions replayed in CI)
            old.unlink()
    for s in seeds:
        if isinstance(s, str):
            s = s.encode()
        (d / hashlib.sha1(s).hexdigest()[:16]).write_bytes(s)


def change(op, key, before, after, pos="0/1A", seq=0, connector="postgres"):
    return json.dumps({"op": op, "key": key, "before": before, "after": after,
                       "source": {"connector": connector, "db": "payments", "collection": "public.charges",
                                  "position": pos, "ts_ms": 1790000000000, "snapshot": op == "r",
                                  "txn_id": 42, "sequence": seq}})


CHANGES = [
    change("c", {"id": "ch_1"}, None, {"id": "ch_1", "status": "created", "amount": 101}),
    change("u", {"id": 7}, {"id": 7, "amount": 50}, {"id": 7, "amount": 150, "price": "12.50",
                                                   "tags": ["a", "b"], "ts": "2024-03-05T14:07:09.123Z"}, seq=3),
    change("d", {"id": "ch_2"}, {"id": "ch_2"}, None, pos="0/2A", seq=42),
    change("r", {"_id": {"$oid": "65e6f0a1b2c3d4e5f6a7b8c9"}}, None,
           {"_id": {"$oid": "65e6f0a1b2c3d4e5f6a7b8c9"}, "n": {"$numberDecimal": "1.50"}}, connector="mongodb"),
]

JSON = CHANGES + [
    "null", "true", "-0", "1e308", "-1e-999", "123456789012345678901234567890", "1.5e-7", '"h\\u00e9\\ud83d\\ude00"',
    '{"a":{"b":[1,2.5,{"c":null}]},"d":"x\\ny"}', "[[[[[[[[]]]]]]]]", '{"k":1,"k":2}', "0.57777777777777777e17", "12345678901234567890.123", '{"price":12.50,"n":-9223372036854775808}',
]

# docs/value.md, "Binary encoding": examples and a few more.
def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def svarint(n):
    return varint((n << 1) ^ (n >> 63) if n >= 0 else ((-n - 1) << 1) | 1)


def string(s):
    b = s.encode()
    return b"\x06" + varint(len(b)) + b


VALUES = [b"\x03\x01", b"\x03\xAC\x02", b"\x05\x04\xF9\x01", b"\x06\x02ab", b"\x09\x02\x03\x02\x00",
          b"\x0A\x01\x01k\x02", b"\x04" + struct.pack("<d", -0.0), b"\x08" + svarint(1709647629123456),
          b"\x07\x03\x00\x01\x02",
          b"\x0A\x02" + varint(2) + b"id" + b"\x03" + svarint(7) + varint(4) + b"tags" + b"\x09\x02" + string("a")
          + string("b")]
CODEC = [b"\x00" + v for v in VALUES] + [b"\x01" + b"\x00" * 12, b"\x02\x02\x01a\x01b", b"\x03\x01\x01k\x03"]

# pgoutput, protocol version 1 (Postgres docs, "Logical Replication Message Formats"), framed by a 2-byte length.
def cstr(s):
    return s.encode() + b"\x00"


def relation(relid, name, cols, identity=b"d"):
    out = b"R" + struct.pack(">I", relid) + cstr("public") + cstr(name) + identity + struct.pack(">H", len(cols))
    for flags, cname, oid in cols:
        out += bytes([flags]) + cstr(cname) + struct.pack(">Ii", oid, -1)
    return out


def tuple_data(values):
    out = struct.pack(">H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "<toast>":
            out += b"u"
        else:
            b = v.encode()
            out += b"t" + struct.pack(">I", len(b)) + b
    return out


def frame(*msgs):
    return b"".join(struct.pack(">H", len(m)) + m for m in msgs)


COLS = [(1, "id", 23), (0, "status", 25), (0, "amount", 1700), (0, "ts", 1184), (0, "doc", 3802), (0, "tags", 1009)]
ROW = ["1", "paid", "12.50", "2024-03-05 14:07:09.123456+00", '{"a": [1, 2]}', '{a,"b c",NULL}']
BEGIN = b"B" + struct.pack(">QqI", 0x16B3748, 762972549123456, 742)
COMMIT = b"C" + b"\x00" + struct.pack(">QQq", 0x16B3748, 0x16B3778, 762972549123456)
PGOUTPUT = [
    frame(BEGIN, relation(16384, "charges", COLS), b"I" + struct.pack(">I", 16384) + b"N" + tuple_data(ROW), COMMIT),
    frame(relation(16385, "t", COLS[:2], b"f"),
          b"U" + struct.pack(">I", 16385) + b"O" + tuple_data(["1", "old"]) + b"N" + tuple_data(["2", "<toast>"]),
          b"D" + struct.pack(">I", 16385) + b"O" + tuple_data(["2", None])),
    frame(b"Y" + struct.pack(">I", 90000) + cstr("public") + cstr("mood"),
          b"O" + struct.pack(">Q", 0x16B3748) + cstr("origin"),
          b"T" + struct.pack(">IB", 1, 1) + struct.pack(">I", 16384),
          b"M" + b"\x01" + struct.pack(">Q", 0x16B3748) + cstr("prefix") + struct.pack(">I", 3) + b"abc"),
]

# decode_text_value: the first byte indexes kOids in pg_text_value_fuzz.cc.
OID_INDEX = {16: 0, 17: 1, 20: 4, 23: 6, 25: 7, 114: 9, 700: 10, 701: 11, 1082: 14, 1114: 16, 1184: 17,
             1700: 19, 2950: 20, 3802: 21, 1007: 22, 1009: 23, 1022: 24, 1231: 25, 1115: 26}
TEXT_VALUES = [(16, "t"), (16, "f"), (17, "\\x0102ff"), (20, "-9223372036854775808"), (23, "2147483647"),
               (25, "h\u00e9llo"), (114, '{"a": [1, 2.5, null]}'), (700, "NaN"), (701, "-Infinity"),
               (701, "1.5e-7"), (1082, "2024-03-05"), (1082, "infinity"), (1114, "2024-03-05 14:07:09.123456"),
               (1184, "2024-03-05 14:07:09+05:30"), (1184, "-infinity"), (1700, "12.50"), (1700, "-0.000001"),
               (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), (3802, '{"k": {"n": 1}}'), (1007, "{1,2,NULL}"),
               (1007, "{{1,2},{3,4}}"), (1009, '{a,"b \\"c\\"",NULL}'), (1022, "{1.5,NaN}"), (1231, "{1.50,2}"),
               (1115, '{"2024-03-05 14:07:09"}')]
PG_TEXT = [bytes([OID_INDEX[oid]]) + text.encode() for oid, text in TEXT_VALUES]

BSON = [bson.encode(d) for d in [
    {"_id": ObjectId("65e6f0a1b2c3d4e5f6a7b8c9"), "name": "Alice", "n": 1, "big": Int64(2**40), "x": 1.5},
    {"d": datetime.datetime(2024, 3, 5, 14, 7, 9, 123000), "dec": Decimal128("1.50"), "nan": Decimal128("NaN"),
     "re": Regex("^a.*", "imsx"), "code": Code("function() { return 1; }"), "scope": Code("x", {"x": 1}),
     "bin": Binary(b"\x00\x01", 0), "uuid": Binary(b"0123456789abcdef", 4), "ts": Timestamp(1709647629, 3),
     "min": MinKey(), "max": MaxKey(), "arr": [1, "two", None, True, {"k": []}], "ref": DBRef("c", 1)},
]]

EXPR_TEST = (ROOT / "tests/unit/pipeline/expression_test.cc").read_text()
# The C++ string literals of the test cases, unescaped to their bytes.
EXPRESSIONS = sorted(set(m.encode().decode("unicode_escape").encode("latin-1")
                         for m in re.findall(r'^\s*\{"((?:[^"\\]|\\.)+)",', EXPR_TEST, re.M)))
EXPRESSIONS = [e for e in EXPRESSIONS if len(e) < 300][:150]
EXPRESSIONS.append(("after.amount * 2 AS doubled, UPPER(after.name) AS name\n" + CHANGES[1]).encode())

SPECS = [(ROOT / "examples" / f).read_text() for f in ("quickstart.yaml", "cdc-to-kafka-and-search.yaml")]
SPECS.append("""pipeline:
  name: test
  checkpoint: { interval: 100ms, storage: "/tmp/x/checkpoints" }
  dead-letter: { type: files, path: "/tmp/x/dlq" }
source:
  type: files
  path: /tmp/x/in
transform:
  - match: "payments.public.charges"
    filter: "after.amount > 100"
    key: id
    event:
      type: "CASE op WHEN 'd' THEN 'charge.deleted' ELSE 'charge.' || after.status END"
      payload: "after.id, after.amount AS amount_cents"
sink:
  events: { type: files, path: "/tmp/x/out" }
""")

write("json_value_fuzz", JSON)
write("change_event_fuzz", CHANGES)
write("value_codec_fuzz", CODEC)
write("pgoutput_fuzz", PGOUTPUT)
write("pg_text_value_fuzz", PG_TEXT)
write("bson_value_fuzz", BSON)
write("expression_fuzz", EXPRESSIONS)
write("pipeline_spec_fuzz", SPECS)
