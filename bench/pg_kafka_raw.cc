// pg-kafka-raw: the raw reference of bench/compare's CDC scenario (docs/benchmarks.md, "Postgres -> Kafka side by
// side"): libpq reads pgoutput from a logical replication slot and librdkafka produces every change, with no
// engine in between. It is the ceiling that `sluice run` and Debezium Server are compared with.
//
//   pg-kafka-raw stream --conninfo URL --slot S --publication P --bootstrap HOST:PORT --topic T --count N
//   pg-kafka-raw offsets --bootstrap HOST:PORT --topic T      # prints the sum of the topic's high watermarks
//   pg-kafka-raw count --bootstrap HOST:PORT --topic T        # records a read_committed consumer sees (1 partition)
//   pg-kafka-raw create-topic --bootstrap HOST:PORT --topic T # one partition (the bench's broker auto-creates none)
//   pg-kafka-raw write --conninfo URL --insert-sql SQL --first-id A --count N --txn-rows R --rate C --out FILE
//   pg-kafka-raw visible --bootstrap HOST:PORT --topic T --first-id A --count N --out FILE [--timeout S]
//
// `write` and `visible` are the steady-rate variant's load and clock (bench/compare/cdc --rate): `write` runs SQL
// (an INSERT with $1 and $2, the first and last id of a transaction) once per transaction of R rows, open loop on a
// schedule of C rows per second from its start, and writes `first_id last_id commit_us` per transaction to FILE,
// commit_us being the wall clock (CLOCK_REALTIME, microseconds) when the COMMIT returned. `visible` reads T from the
// beginning with a read_committed consumer until every id of A .. A+N-1 has arrived, and writes
// `id receive_us create_ms` per record (duplicates included) to FILE, the id being the
// first integer-valued "id" field of the record's JSON value and create_ms the record's CreateTime (the producer's
// wall clock when it was produced; -1 when the topic keeps LogAppendTime); both run on the machine of the tool
// under test, so their wall clocks are one clock.
//
// `stream` runs START_REPLICATION SLOT S LOGICAL 0/0 (proto_version '1', publication_names 'P') on a replication
// connection, decodes Relation/Insert/Update/Delete messages itself (a few dozen lines: Sluice's decoder builds
// `Value` rows, which is engine work this reference leaves out on purpose), and produces each change as a JSON
// object of the new row's columns (the old key's for a delete) keyed by a JSON object of the primary key's columns.
// Producer settings are those of Sluice's KafkaSink at-least-once (kafka_sink_settings.cc:
// enable.idempotence=true, acks=all, partitioner murmur2_random, librdkafka's defaults otherwise: linger.ms 5,
// batch.size 1,000,000). It stops after N changes are acknowledged by the broker, confirms the slot's position and
// prints one JSON line: changes, seconds, cpu_seconds (getrusage, user+system), peak_rss_mib.
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <sys/resource.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "pg-kafka-raw: %s\n", what.c_str());
  std::exit(2);
}

struct Column {
  std::string name;
  uint32_t type = 0;
  bool key = false;
};

struct Relation {
  std::vector<Column> columns;
};

/// Big-endian reader over one pgoutput message; dies on a truncated message.
class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  uint8_t u8() { return static_cast<uint8_t>(*take(1)); }
  uint16_t u16() {
    const auto* b = reinterpret_cast<const unsigned char*>(take(2));
    return static_cast<uint16_t>(b[0] << 8 | b[1]);
  }
  uint32_t u32() {
    const auto* b = reinterpret_cast<const unsigned char*>(take(4));
    return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
  }
  uint64_t u64() { return uint64_t{u32()} << 32 | u32(); }
  std::string_view cstr() {
    const void* z = std::memchr(p_, 0, static_cast<size_t>(end_ - p_));
    if (z == nullptr) die("truncated pgoutput message (string)");
    std::string_view s(p_, static_cast<size_t>(static_cast<const char*>(z) - p_));
    p_ += s.size() + 1;
    return s;
  }
  std::string_view bytes(size_t n) { return {take(n), n}; }

 private:
  const char* take(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) die("truncated pgoutput message");
    const char* r = p_;
    p_ += n;
    return r;
  }
  const char* p_;
  const char* end_;
};

bool is_number_type(uint32_t oid) {
  return oid == 20 || oid == 21 || oid == 23 || oid == 26 || oid == 700 || oid == 701 || oid == 1700;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

/// Decodes one TupleData into `value` (all columns) and `key` (the replica-identity columns) as JSON objects.
void decode_tuple(Reader& r, const Relation& rel, std::string& value, std::string& key) {
  const uint16_t n = r.u16();
  if (n != rel.columns.size()) die("tuple column count differs from its relation");
  value.assign("{");
  key.assign("{");
  for (uint16_t i = 0; i < n; ++i) {
    const Column& col = rel.columns[i];
    std::string_view text;
    const uint8_t kind = r.u8();
    bool null = false;
    if (kind == 't') {
      text = r.bytes(r.u32());
    } else if (kind == 'n' || kind == 'u') {
      null = true;  // 'u': an unchanged TOAST value, not sent
    } else {
      die("unknown tuple column kind");
    }
    for (std::string* out : {&value, &key}) {
      if (out == &key && !col.key) continue;
      if (out->size() > 1) *out += ',';
      append_json_string(*out, col.name);
      *out += ':';
      if (null) {
        *out += "null";
      } else if (is_number_type(col.type)) {
        *out += text;
      } else if (col.type == 16) {
        *out += text == "t" ? "true" : "false";
      } else {
        append_json_string(*out, text);
      }
    }
  }
  value += '}';
  key += '}';
}

struct Flags {
  std::string conninfo, slot, publication, bootstrap, topic, insert_sql, out;
  int64_t count = 0;
  int64_t first_id = 1;
  int64_t txn_rows = 100;
  double rate = 2000;      // rows per second
  double timeout_s = 300;  // visible: give up after this long without the last record
};

std::string arg(int& i, int argc, char** argv) {
  if (i + 1 >= argc) die(std::string("missing value after ") + argv[i]);
  return argv[++i];
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--conninfo")
      f.conninfo = arg(i, argc, argv);
    else if (a == "--slot")
      f.slot = arg(i, argc, argv);
    else if (a == "--publication")
      f.publication = arg(i, argc, argv);
    else if (a == "--bootstrap")
      f.bootstrap = arg(i, argc, argv);
    else if (a == "--topic")
      f.topic = arg(i, argc, argv);
    else if (a == "--count")
      f.count = std::stoll(arg(i, argc, argv));
    else if (a == "--insert-sql")
      f.insert_sql = arg(i, argc, argv);
    else if (a == "--out")
      f.out = arg(i, argc, argv);
    else if (a == "--first-id")
      f.first_id = std::stoll(arg(i, argc, argv));
    else if (a == "--txn-rows")
      f.txn_rows = std::stoll(arg(i, argc, argv));
    else if (a == "--rate")
      f.rate = std::stod(arg(i, argc, argv));
    else if (a == "--timeout")
      f.timeout_s = std::stod(arg(i, argc, argv));
    else
      die("unknown option " + a);
  }
  return f;
}

rd_kafka_conf_t* producer_conf(const std::string& bootstrap) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  const std::pair<const char*, std::string> props[] = {{"bootstrap.servers", bootstrap},
                                                       {"enable.idempotence", "true"},
                                                       {"acks", "all"},
                                                       {"partitioner", "murmur2_random"}};
  for (const auto& [k, v] : props)
    if (rd_kafka_conf_set(conf, k, v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) die(err);
  return conf;
}

int64_t g_acked = 0;

void on_delivery(rd_kafka_t*, const rd_kafka_message_t* m, void*) {
  if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) die(std::string("delivery failed: ") + rd_kafka_err2str(m->err));
  ++g_acked;
}

int offsets(const Flags& f) {
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, producer_conf(f.bootstrap), err, sizeof err);
  if (rk == nullptr) die(err);
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk, f.topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  if (rd_kafka_metadata(rk, 0, t, &md, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("metadata of " + f.topic);
  int64_t sum = 0;
  for (int i = 0; i < md->topic_cnt; ++i)
    for (int p = 0; p < md->topics[i].partition_cnt; ++p) {
      int64_t lo = 0, hi = 0;
      if (rd_kafka_query_watermark_offsets(rk, f.topic.c_str(), md->topics[i].partitions[p].id, &lo, &hi, 10000) !=
          RD_KAFKA_RESP_ERR_NO_ERROR)
        die("watermarks of " + f.topic);
      sum += hi;
    }
  rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(t);
  rd_kafka_destroy(rk);
  std::printf("%lld\n", static_cast<long long>(sum));
  return 0;
}

int create_topic(const Flags& f) {
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, producer_conf(f.bootstrap), err, sizeof err);
  if (rk == nullptr) die(err);
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(f.topic.c_str(), 1, 1, err, sizeof err);
  if (nt == nullptr) die(err);
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &nt, 1, nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000);
  if (ev == nullptr) die("CreateTopics timed out");
  const rd_kafka_CreateTopics_result_t* res = rd_kafka_event_CreateTopics_result(ev);
  if (res == nullptr) die(std::string("CreateTopics: ") + rd_kafka_event_error_string(ev));
  size_t n = 0;
  const rd_kafka_topic_result_t** results = rd_kafka_CreateTopics_result_topics(res, &n);
  for (size_t i = 0; i < n; ++i) {
    const rd_kafka_resp_err_t e = rd_kafka_topic_result_error(results[i]);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
      die("create " + f.topic + ": " + rd_kafka_err2str(e));
  }
  rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(nt);
  rd_kafka_destroy(rk);
  return 0;
}

/// A read_committed consumer of the topic's partition 0 from its beginning, with `extra` set on it.
rd_kafka_t* read_committed_consumer(const Flags& f, const char* group,
                                    std::initializer_list<std::pair<const char*, const char*>> extra) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  const std::pair<const char*, std::string> props[] = {{"bootstrap.servers", f.bootstrap},
                                                       {"group.id", group},
                                                       {"enable.auto.commit", "false"},
                                                       {"isolation.level", "read_committed"}};
  for (const auto& [k, v] : props)
    if (rd_kafka_conf_set(conf, k, v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) die(err);
  for (const auto& [k, v] : extra)
    if (rd_kafka_conf_set(conf, k, v, err, sizeof err) != RD_KAFKA_CONF_OK) die(err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (rk == nullptr) die(err);
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(parts, f.topic.c_str(), 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
  if (rd_kafka_assign(rk, parts) != RD_KAFKA_RESP_ERR_NO_ERROR) die("assign");
  rd_kafka_topic_partition_list_destroy(parts);
  return rk;
}

int count(const Flags& f) {
  rd_kafka_t* rk = read_committed_consumer(f, "pg-kafka-raw-count", {{"enable.partition.eof", "true"}});
  int64_t n = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  for (;;) {
    if (std::chrono::steady_clock::now() > deadline) die("count: no end of partition within 5 minutes");
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 1000);
    if (m == nullptr) continue;
    const rd_kafka_resp_err_t e = m->err;
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR) ++n;
    rd_kafka_message_destroy(m);
    if (e == RD_KAFKA_RESP_ERR__PARTITION_EOF) break;
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) die(std::string("consume: ") + rd_kafka_err2str(e));
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  std::printf("%lld\n", static_cast<long long>(n));
  return 0;
}

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

FILE* open_out(const std::string& path) {
  FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) die("cannot write " + path);
  return out;
}

int write(const Flags& f) {
  PGconn* c = PQconnectdb(f.conninfo.c_str());
  if (PQstatus(c) != CONNECTION_OK) die(PQerrorMessage(c));
  // A walsender sends only WAL that is flushed. With synchronous_commit off (scripts/services/postgres sets it for
  // speed) a COMMIT returns before its flush and the WAL writer flushes up to wal_writer_delay (200 ms) later: that
  // wait, not the tool, would be the latency measured. Production commits are synchronous.
  PGresult* set = PQexec(c, "SET synchronous_commit = on");
  if (PQresultStatus(set) != PGRES_COMMAND_OK) die(PQerrorMessage(c));
  PQclear(set);
  FILE* out = open_out(f.out);
  const auto t0 = std::chrono::steady_clock::now();
  const auto per_txn = std::chrono::duration<double>(static_cast<double>(f.txn_rows) / f.rate);
  double max_behind_ms = 0;
  int64_t txn = 0;
  for (int64_t first = f.first_id; first < f.first_id + f.count; first += f.txn_rows, ++txn) {
    // Open loop: transaction k starts at t0 + k * R / C whatever the previous ones took, so a slow database shows
    // as lateness (reported) instead of a lower rate.
    const auto due = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(per_txn * txn);
    const auto now = std::chrono::steady_clock::now();
    if (now < due)
      std::this_thread::sleep_until(due);
    else
      max_behind_ms = std::max(max_behind_ms, std::chrono::duration<double, std::milli>(now - due).count());
    const int64_t last = std::min(first + f.txn_rows, f.first_id + f.count) - 1;
    const std::string a = std::to_string(first), b = std::to_string(last);
    const char* params[] = {a.c_str(), b.c_str()};
    PGresult* r = PQexecParams(c, f.insert_sql.c_str(), 2, nullptr, params, nullptr, nullptr, 0);
    const int64_t committed = wall_us();
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die(f.insert_sql + ": " + PQerrorMessage(c));
    PQclear(r);
    std::fprintf(out, "%lld %lld %lld\n", static_cast<long long>(first), static_cast<long long>(last),
                 static_cast<long long>(committed));
  }
  std::fclose(out);
  PQfinish(c);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"rows\": %lld, \"seconds\": %.3f, \"max_behind_schedule_ms\": %.1f}\n",
              static_cast<long long>(f.count), secs, max_behind_ms);
  return 0;
}

/// The first integer value of a field named exactly "id" in a JSON text; -1 when there is none. Not a JSON parser:
/// the three tools' values are flat enough (Sluice: a string "id" first, the row's numeric one in "payload";
/// Debezium: "after"; raw: the row).
int64_t first_numeric_id(std::string_view v) {
  for (size_t at = v.find("\"id\":"); at != std::string_view::npos; at = v.find("\"id\":", at + 5)) {
    size_t i = at + 5;
    while (i < v.size() && v[i] == ' ')
      ++i;
    if (i < v.size() && v[i] >= '0' && v[i] <= '9') {
      int64_t id = 0;
      for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i)
        id = id * 10 + (v[i] - '0');
      return id;
    }
  }
  return -1;
}

int visible(const Flags& f) {
  rd_kafka_t* rk = read_committed_consumer(f, "pg-kafka-raw-visible", {{"fetch.wait.max.ms", "100"}});
  FILE* out = open_out(f.out);
  // Done when every id of [first_id, first_id + count) has arrived: a duplicate (at-least-once) is written to
  // FILE too, but does not stand in for a missing row.
  std::vector<bool> seen(static_cast<size_t>(f.count), false);
  int64_t n = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.timeout_s);
  while (n < f.count) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fclose(out);
      die("visible: " + std::to_string(n) + " of " + std::to_string(f.count) + " rows arrived within the timeout");
    }
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 100);
    if (m == nullptr) continue;
    const int64_t received = wall_us();
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      const int64_t id = first_numeric_id(std::string_view(static_cast<const char*>(m->payload), m->len));
      rd_kafka_timestamp_type_t type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
      const int64_t created_ms = rd_kafka_message_timestamp(m, &type);
      std::fprintf(out, "%lld %lld %lld\n", static_cast<long long>(id), static_cast<long long>(received),
                   static_cast<long long>(type == RD_KAFKA_TIMESTAMP_CREATE_TIME ? created_ms : -1));
      if (id >= f.first_id && id < f.first_id + f.count && !seen[static_cast<size_t>(id - f.first_id)]) {
        seen[static_cast<size_t>(id - f.first_id)] = true;
        ++n;
      }
    } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      die(std::string("consume: ") + rd_kafka_err2str(m->err));
    }
    rd_kafka_message_destroy(m);
  }
  std::fclose(out);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return 0;
}

void send_status(PGconn* c, uint64_t lsn) {
  char buf[1 + 8 + 8 + 8 + 8 + 1];
  auto put64 = [&](int at, uint64_t v) {
    for (int i = 0; i < 8; ++i)
      buf[at + i] = static_cast<char>(v >> (56 - 8 * i));
  };
  buf[0] = 'r';
  put64(1, lsn);
  put64(9, lsn);
  put64(17, lsn);
  put64(25, 0);
  buf[33] = 0;
  if (PQputCopyData(c, buf, sizeof buf) != 1 || PQflush(c) != 0) die(PQerrorMessage(c));
}

int stream(const Flags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  char err[512];
  rd_kafka_conf_t* conf = producer_conf(f.bootstrap);
  rd_kafka_conf_set_dr_msg_cb(conf, &on_delivery);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) die(err);
  rd_kafka_topic_t* topic = rd_kafka_topic_new(rk, f.topic.c_str(), nullptr);

  std::string conninfo = f.conninfo;
  conninfo += conninfo.find("://") != std::string::npos
                  ? (conninfo.find('?') == std::string::npos ? "?replication=database" : "&replication=database")
                  : " replication=database";
  PGconn* c = PQconnectdb(conninfo.c_str());
  if (PQstatus(c) != CONNECTION_OK) die(PQerrorMessage(c));
  const std::string cmd = "START_REPLICATION SLOT " + f.slot + " LOGICAL 0/0 (proto_version '1', publication_names '" +
                          f.publication + "')";
  PGresult* r = PQexec(c, cmd.c_str());
  if (PQresultStatus(r) != PGRES_COPY_BOTH) die(cmd + ": " + PQerrorMessage(c));
  PQclear(r);

  std::unordered_map<uint32_t, Relation> relations;
  std::string value, key;
  int64_t produced = 0;
  uint64_t last_lsn = 0;
  while (produced < f.count) {
    char* buf = nullptr;
    const int n = PQgetCopyData(c, &buf, 0);
    if (n < 0) die(std::string("replication stream ended: ") + PQerrorMessage(c));
    Reader msg(buf, static_cast<size_t>(n));
    const uint8_t kind = msg.u8();
    if (kind == 'k') {  // keepalive: wal_end, time, reply requested
      msg.u64();
      msg.u64();
      if (msg.u8() != 0) send_status(c, 0);
    } else if (kind == 'w') {
      msg.u64();
      last_lsn = msg.u64();
      msg.u64();
      const uint8_t tag = msg.u8();
      if (tag == 'R') {
        const uint32_t oid = msg.u32();
        msg.cstr();
        msg.cstr();
        msg.u8();
        Relation& rel = relations[oid];
        rel.columns.clear();
        const uint16_t ncols = msg.u16();
        for (uint16_t i = 0; i < ncols; ++i) {
          Column col;
          col.key = (msg.u8() & 1) != 0;
          col.name = msg.cstr();
          col.type = msg.u32();
          msg.u32();
          rel.columns.push_back(std::move(col));
        }
      } else if (tag == 'I' || tag == 'U' || tag == 'D') {
        const auto it = relations.find(msg.u32());
        if (it == relations.end()) die("change for an unknown relation");
        uint8_t t = msg.u8();
        if (tag == 'U' && (t == 'K' || t == 'O')) {  // old key/row: skip it, the new tuple follows
          decode_tuple(msg, it->second, value, key);
          t = msg.u8();
        }
        decode_tuple(msg, it->second, value, key);
        if (tag == 'D') value = "null";
        for (;;) {
          const rd_kafka_resp_err_t e =
              rd_kafka_producev(rk, RD_KAFKA_V_RKT(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_KEY(key.data(), key.size()),
                                RD_KAFKA_V_VALUE(value.data(), tag == 'D' ? 0 : value.size()), RD_KAFKA_V_END);
          if (e == RD_KAFKA_RESP_ERR_NO_ERROR) break;
          if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) die(std::string("produce: ") + rd_kafka_err2str(e));
          rd_kafka_poll(rk, 10);
        }
        ++produced;
        if ((produced & 1023) == 0) rd_kafka_poll(rk, 0);
      }
      // 'B', 'C', 'O', 'Y', 'T', 'M': nothing to produce.
    }
    PQfreemem(buf);
  }
  if (rd_kafka_flush(rk, 120000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("flush timed out");
  if (g_acked != produced) die("not every change was acknowledged");
  send_status(c, last_lsn);
  PQfinish(c);
  rd_kafka_topic_destroy(topic);
  rd_kafka_destroy(rk);

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  std::printf("{\"changes\": %lld, \"seconds\": %.3f, \"cpu_seconds\": %.3f, \"peak_rss_mib\": %.1f}\n",
              static_cast<long long>(produced), secs, cpu, static_cast<double>(ru.ru_maxrss) / 1024.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2)
    die("usage: pg-kafka-raw stream|offsets|count|create-topic|write|visible [options] (see the header of "
        "bench/pg_kafka_raw.cc)");
  const std::string mode = argv[1];
  const Flags f = parse(argc, argv);
  if (mode == "write") {
    if (f.conninfo.empty() || f.insert_sql.empty() || f.out.empty() || f.count <= 0 || f.txn_rows <= 0 || f.rate <= 0)
      die("write needs --conninfo, --insert-sql, --out, --count > 0, --txn-rows > 0 and --rate > 0");
    return write(f);
  }
  if (f.bootstrap.empty() || f.topic.empty()) die("--bootstrap and --topic are required");
  if (mode == "offsets") return offsets(f);
  if (mode == "create-topic") return create_topic(f);
  if (mode == "count") return count(f);
  if (mode == "visible") {
    if (f.out.empty() || f.count <= 0) die("visible needs --out and --count > 0");
    return visible(f);
  }
  if (mode != "stream") die("unknown mode " + mode);
  if (f.conninfo.empty() || f.slot.empty() || f.publication.empty() || f.count <= 0)
    die("stream needs --conninfo, --slot, --publication and --count > 0");
  return stream(f);
}
