// The MongoDB source without a server: change documents -> envelopes (map_change_document), and the reader
// driven through an injected driver (the driver boundary of mongodb_cdc_source.h). The emulator used by the
// integration test cannot produce error 286 (history lost), so that path, 280 and 260 are tested here: the
// fake driver's change stream fails with the server's code as libmongoc would report it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/clock.h"
#include "sluice/operators/source_operator.h"

namespace sluice {
namespace {

using mongodb::MappedChange;

/// Owns a bson_t built by BCON_NEW.
struct Doc {
  bson_t* b;
  explicit Doc(bson_t* d) : b(d) {}
  ~Doc() { bson_destroy(b); }
  Doc(const Doc&) = delete;
  Doc& operator=(const Doc&) = delete;
  std::string bytes() const { return std::string(reinterpret_cast<const char*>(bson_get_data(b)), b->len); }
};

constexpr uint32_t kT = 1'796'000'000;  // cluster time seconds of the changes below

MongoCollectionSplit orders_split() {
  MongoCollectionSplit s;
  s.database = "shop";
  s.collection = "orders";
  return s;
}

std::string token_hex(uint32_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "82%08x%08x", kT, i);
  return buf;
}

/// A change document as a server sends it (operationType, clusterTime i, documentKey {_id: id}, ...).
std::string change(const char* op, uint32_t i, int32_t id, std::optional<int32_t> full_v = std::nullopt) {
  const std::string tok = token_hex(i);
  Doc d(BCON_NEW("_id", "{", "_data", BCON_UTF8(tok.c_str()), "}", "operationType", BCON_UTF8(op), "clusterTime",
                 BCON_TIMESTAMP(kT, i), "ns", "{", "db", BCON_UTF8("shop"), "coll", BCON_UTF8("orders"), "}"));
  if (std::strcmp(op, "drop") != 0 && std::strcmp(op, "invalidate") != 0) {
    bson_t key;
    BSON_APPEND_DOCUMENT_BEGIN(d.b, "documentKey", &key);
    BSON_APPEND_INT32(&key, "_id", id);
    bson_append_document_end(d.b, &key);
  }
  if (full_v) {
    bson_t full;
    BSON_APPEND_DOCUMENT_BEGIN(d.b, "fullDocument", &full);
    BSON_APPEND_INT32(&full, "_id", id);
    BSON_APPEND_INT32(&full, "v", *full_v);
    bson_append_document_end(d.b, &full);
  }
  return d.bytes();
}

Result<MappedChange> map(const std::string& bytes, const MongoCollectionSplit& split = orders_split()) {
  bson_t doc;
  EXPECT_TRUE(bson_init_static(&doc, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  return mongodb::map_change_document(doc, split);
}

TEST(MongoChangeMappingTest, GoldenEnvelopesForInsertUpdateReplaceDelete) {
  Result<MappedChange> ins = map(change("insert", 1, 7, 1));
  ASSERT_TRUE(ins.ok()) << ins.error().to_string();
  EXPECT_EQ(ins->kind, MappedChange::Kind::kEvent);
  EXPECT_EQ(ins->event.to_value().to_json(),
            R"({"op":"c","key":{"_id":7},"before":null,"after":{"_id":7,"v":1},"source":{"connector":"mongodb",)"
            R"("db":"shop","collection":"orders","position":"{ \"_data\" : \")" +
                token_hex(1) + R"(\" }","ts_ms":1796000000000,"snapshot":false}})");
  Result<MappedChange> upd = map(change("update", 2, 7, 2));
  ASSERT_TRUE(upd.ok());
  EXPECT_EQ(upd->event.op, cdc::ChangeOp::kUpdate);
  EXPECT_EQ(upd->event.after.to_json(), R"({"_id":7,"v":2})");
  Result<MappedChange> rep = map(change("replace", 3, 7, 3));
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->event.op, cdc::ChangeOp::kUpdate);
  Result<MappedChange> del = map(change("delete", 4, 7));
  ASSERT_TRUE(del.ok());
  EXPECT_EQ(del->event.to_value().to_json(),
            R"({"op":"d","key":{"_id":7},"before":null,"after":null,"source":{"connector":"mongodb",)"
            R"("db":"shop","collection":"orders","position":"{ \"_data\" : \")" +
                token_hex(4) + R"(\" }","ts_ms":1796000000000,"snapshot":false}})");
  // An update whose document is gone by the time of the lookup: after = null, key from documentKey.
  Result<MappedChange> gone = map(change("update", 5, 8));
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->event.after.is_null());
  EXPECT_EQ(gone->event.key.to_json(), R"({"_id":8})");
}

TEST(MongoChangeMappingTest, PreImagesTxnNumberAndEmulatorDocumentKeys) {
  Doc d(BCON_NEW("_id", "{", "_data", BCON_UTF8("00"), "}", "operationType", BCON_UTF8("update"), "clusterTime",
                 BCON_TIMESTAMP(kT, 9), "txnNumber", BCON_INT64(42),
                 // mongo-java-server puts the update specification in documentKey
                 "documentKey", "{", "$set", "{", "v", BCON_INT32(5), "}", "}", "fullDocument", "{", "_id",
                 BCON_UTF8("k"), "v", BCON_INT32(5), "}", "fullDocumentBeforeChange", "{", "_id", BCON_UTF8("k"), "v",
                 BCON_INT32(4), "}"));
  Result<MappedChange> m = map(d.bytes());
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->event.key.to_json(), R"({"_id":"k"})");
  EXPECT_EQ(m->event.before.to_json(), R"({"_id":"k","v":4})");
  EXPECT_EQ(m->event.source.txn_id, 42);
  // Without any _id the change is a bad record.
  Doc no_id(BCON_NEW("_id", "{", "_data", BCON_UTF8("01"), "}", "operationType", BCON_UTF8("update"), "documentKey",
                     "{", "$set", "{", "v", BCON_INT32(5), "}", "}", "fullDocument", "{", "v", BCON_INT32(5), "}"));
  Result<MappedChange> bad = map(no_id.bytes());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("without a document _id"), std::string::npos) << bad.error().message();
  Doc no_op(BCON_NEW("_id", "{", "_data", BCON_UTF8("02"), "}"));
  EXPECT_FALSE(map(no_op.bytes()).ok());
}

TEST(MongoChangeMappingTest, DropRenameInvalidateEndTheStreamOtherDdlIsSkipped) {
  for (const char* op : {"drop", "invalidate", "dropDatabase"}) {
    Result<MappedChange> m = map(change(op, 10, 0));
    ASSERT_TRUE(m.ok()) << op;
    EXPECT_EQ(m->kind, MappedChange::Kind::kEndOfStream) << op;
    EXPECT_NE(m->what.find(op), std::string::npos) << m->what;
  }
  Doc rename(BCON_NEW("_id", "{", "_data", BCON_UTF8("03"), "}", "operationType", BCON_UTF8("rename"), "clusterTime",
                      BCON_TIMESTAMP(kT, 11), "to", "{", "db", BCON_UTF8("shop"), "coll", BCON_UTF8("orders_old"),
                      "}"));
  Result<MappedChange> r = map(rename.bytes());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, MappedChange::Kind::kEndOfStream);
  EXPECT_NE(r->what.find("rename to 'shop.orders_old'"), std::string::npos) << r->what;
  Result<MappedChange> idx = map(change("createIndexes", 12, 0));
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->kind, MappedChange::Kind::kSkip);
}

TEST(MongoChangeMappingTest, OverlapWithTheSnapshotIsMarked) {
  MongoCollectionSplit s = orders_split();
  s.overlap_until = mongo_cluster_time(kT, 5);
  EXPECT_TRUE(map(change("insert", 5, 1, 1), s)->event.source.snapshot);
  EXPECT_FALSE(map(change("insert", 6, 1, 1), s)->event.source.snapshot);
}

TEST(MongoChangeMappingTest, SplitOwnerSpreadsCollections) {
  EXPECT_EQ(mongodb::collection_split_owner("shop.orders", 1), 0);
  std::set<int> owners;
  for (int i = 0; i < 64; ++i)
    owners.insert(mongodb::collection_split_owner("shop.c" + std::to_string(i), 4));
  EXPECT_EQ(owners.size(), 4u);
  // Stable: the Kafka rule for partition 0 (Java String.hashCode * 31 & 0x7FFFFFFF, mod parallelism).
  EXPECT_EQ(mongodb::collection_split_owner("a", 7), static_cast<int>((97u * 31u & 0x7FFFFFFFu) % 7u));
}

// ---------------------------------------------------------------------------------------------------------
// The reader behind an injected driver

/// What the fake deployment holds: one collection's documents, its change log, and errors to inject.
struct FakeServer {
  std::vector<std::string> documents;  // raw BSON, for scans
  std::vector<std::string> changes;    // raw BSON change documents, in cluster-time order
  MongoClusterTime now = mongo_cluster_time(kT, 100);
  /// The next watch() fails at its first next() with this server code (history lost: 286).
  std::optional<uint32_t> fail_next_watch;
  std::vector<std::string> watch_options;  // Extended JSON of each watch's options
  int scans = 0;
  /// The _id (int) each scan resumed after (-1: from the start).
  std::vector<int64_t> scans_after;
  /// listCollections: the names, and (when set) a gate every call after the first waits on.
  std::vector<std::string> collections = {"orders"};
  std::atomic<int> lists{0};
  std::optional<std::shared_future<void>> block_lists;
  std::promise<void> list_blocked;
};

class FakeStream final : public mongodb::ChangeStreamCursor {
 public:
  FakeStream(std::shared_ptr<FakeServer> server, size_t start, std::optional<uint32_t> error)
      : server_(std::move(server)), pos_(start), error_(error) {}
  ~FakeStream() override { clear(); }
  const bson_t* next() override {
    if (error_) return nullptr;
    if (pos_ >= server_->changes.size()) return nullptr;
    clear();
    // The driver's buffer: overwritten by the next call, so a reader that kept a pointer would see garbage.
    buf_ = server_->changes[pos_++];
    bson_init_static(&doc_, reinterpret_cast<const uint8_t*>(buf_.data()), buf_.size());
    have_ = true;
    return &doc_;
  }
  bool error(mongodb::DriverError& out) const override {
    if (!error_) return false;
    out.domain = MONGOC_ERROR_SERVER;
    out.code = *error_;
    out.message = *error_ == 286
                      ? "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
                      : "injected";
    return true;
  }
  const bson_t* resume_token() const override { return nullptr; }

 private:
  void clear() {
    if (have_) std::memset(buf_.data(), 0xEE, buf_.size());
    have_ = false;
  }
  std::shared_ptr<FakeServer> server_;
  size_t pos_;
  std::optional<uint32_t> error_;
  std::string buf_;
  bson_t doc_{};
  bool have_ = false;
};

int64_t int_id(const bson_t& doc) {
  bson_iter_t it;
  return bson_iter_init_find(&it, &doc, "_id") ? bson_iter_as_int64(&it) : -1;
}

class FakeScan final : public mongodb::DocumentCursor {
 public:
  FakeScan(std::vector<std::string> docs, int64_t after) {
    for (std::string& d : docs) {
      bson_t b;
      bson_init_static(&b, reinterpret_cast<const uint8_t*>(d.data()), d.size());
      if (int_id(b) > after) docs_.push_back(std::move(d));
    }
  }
  const bson_t* next() override {
    if (pos_ >= docs_.size()) return nullptr;
    const std::string& b = docs_[pos_++];
    bson_init_static(&doc_, reinterpret_cast<const uint8_t*>(b.data()), b.size());
    return &doc_;
  }
  bool error(mongodb::DriverError&) const override { return false; }

 private:
  std::vector<std::string> docs_;
  size_t pos_ = 0;
  bson_t doc_{};
};

MongoClusterTime time_of(const std::string& change_bytes) {
  bson_t doc;
  bson_init_static(&doc, reinterpret_cast<const uint8_t*>(change_bytes.data()), change_bytes.size());
  bson_iter_t it;
  uint32_t t = 0;
  uint32_t i = 0;
  if (bson_iter_init_find(&it, &doc, "clusterTime")) bson_iter_timestamp(&it, &t, &i);
  return mongo_cluster_time(t, i);
}

std::string id_of(const std::string& change_bytes) {
  bson_t doc;
  bson_init_static(&doc, reinterpret_cast<const uint8_t*>(change_bytes.data()), change_bytes.size());
  bson_iter_t it;
  uint32_t len = 0;
  const uint8_t* data = nullptr;
  if (bson_iter_init_find(&it, &doc, "_id")) bson_iter_document(&it, &len, &data);
  return std::string(reinterpret_cast<const char*>(data), len);
}

class FakeDriver final : public mongodb::MongoDriver {
 public:
  explicit FakeDriver(std::shared_ptr<FakeServer> s) : s_(std::move(s)) {}
  std::unique_ptr<mongodb::ChangeStreamCursor> watch(const std::string&, const std::string&,
                                                     const bson_t& options) override {
    s_->watch_options.push_back(mongodb::bson_to_canonical_json(options));
    std::optional<uint32_t> err = std::exchange(s_->fail_next_watch, std::nullopt);
    size_t start = s_->changes.size();
    bson_iter_t it;
    if (bson_iter_init_find(&it, &options, "resumeAfter")) {
      uint32_t len = 0;
      const uint8_t* data = nullptr;
      bson_iter_document(&it, &len, &data);
      const std::string token(reinterpret_cast<const char*>(data), len);
      for (size_t i = 0; i < s_->changes.size(); ++i) {
        if (id_of(s_->changes[i]) == token) start = i + 1;
      }
    } else if (bson_iter_init_find(&it, &options, "startAtOperationTime")) {
      uint32_t t = 0;
      uint32_t i = 0;
      bson_iter_timestamp(&it, &t, &i);
      start = 0;
      while (start < s_->changes.size() && time_of(s_->changes[start]) < mongo_cluster_time(t, i))
        ++start;
    }
    return std::make_unique<FakeStream>(s_, start, err);
  }
  std::unique_ptr<mongodb::DocumentCursor> scan(const std::string&, const std::string&, int,
                                                const bson_t* after_id) override {
    ++s_->scans;
    const int64_t after = after_id != nullptr ? int_id(*after_id) : -1;
    s_->scans_after.push_back(after);
    return std::make_unique<FakeScan>(s_->documents, after);
  }
  bool cluster_time(const std::string&, MongoClusterTime& out, mongodb::DriverError&) override {
    out = s_->now;
    return true;
  }
  bool list_collections(const std::string&, std::vector<std::string>& out, mongodb::DriverError&) override {
    if (s_->lists.fetch_add(1) > 0 && s_->block_lists) {
      s_->list_blocked.set_value();
      s_->block_lists->wait();  // a server that does not answer
    }
    out = s_->collections;
    return true;
  }

 private:
  std::shared_ptr<FakeServer> s_;
};

class Context final : public SourceReaderContext {
 public:
  int subtask_index() const override { return 0; }
  int parallelism() const override { return 1; }
  void send_split_request() override {}
  void wakeup() override {}
  void wakeup_at(TimestampMs) override {}
  const Clock& clock() const override { return clock_; }

 private:
  ManualClock clock_{1'796'000'000'000};
};

class Output final : public ReaderOutput<cdc::ChangeEvent> {
 public:
  void collect(cdc::ChangeEvent&& r) override { events.push_back(std::move(r)); }
  void collect(cdc::ChangeEvent&& r, TimestampMs) override { events.push_back(std::move(r)); }
  void emit_watermark(TimestampMs) override {}
  void release_output_for_split(const std::string& id) override { released.push_back(id); }
  std::vector<cdc::ChangeEvent> events;
  std::vector<std::string> released;
};

std::string doc_bytes(int32_t id, int32_t v) {
  Doc d(BCON_NEW("_id", BCON_INT32(id), "v", BCON_INT32(v)));
  return d.bytes();
}

class MongoReaderTest : public ::testing::Test {
 protected:
  std::unique_ptr<SourceReader<cdc::ChangeEvent, MongoCollectionSplit>> reader(MongoOnHistoryLost on_lost,
                                                                               MongoOnDrop on_drop = MongoOnDrop::kFail,
                                                                               int32_t batch_size = 1024) {
    source_ = MongoCdcSource::builder()
                  .database("shop")
                  .collections({"orders"})
                  .on_history_lost(on_lost)
                  .on_drop(on_drop)
                  .batch_size(batch_size)
                  .driver_factory([s = server_]() -> Result<std::unique_ptr<mongodb::MongoDriver>> {
                    return std::unique_ptr<mongodb::MongoDriver>(std::make_unique<FakeDriver>(s));
                  })
                  .build();
    return source_->create_reader(ctx_);
  }
  /// Polls until `n` events arrived or 1000 polls passed.
  void poll_until(SourceReader<cdc::ChangeEvent, MongoCollectionSplit>& r, size_t n) {
    for (int i = 0; i < 1000 && out_.events.size() < n; ++i)
      r.poll_next(out_);
  }
  /// A split restored from a checkpoint whose token is the change at increment `i`.
  MongoCollectionSplit split_at(uint32_t i) {
    MongoCollectionSplit s = orders_split();
    Doc tok(BCON_NEW("_data", BCON_UTF8(token_hex(i).c_str())));
    s.resume_token = tok.bytes();
    s.token_time_ms = int64_t{kT} * 1000;
    return s;
  }
  /// A split that streams from the first change.
  static MongoCollectionSplit split_from_start() {
    MongoCollectionSplit s = orders_split();
    s.start_at = mongo_cluster_time(kT, 0);
    return s;
  }

  std::shared_ptr<FakeServer> server_ = std::make_shared<FakeServer>();
  std::shared_ptr<MongoCdcSource> source_;
  Context ctx_;
  Output out_;
};

TEST_F(MongoReaderTest, ResumesAfterTheCheckpointedTokenAndCopiesIt) {
  for (uint32_t i = 1; i <= 5; ++i)
    server_->changes.push_back(change("insert", i, static_cast<int32_t>(i), 0));
  auto r = reader(MongoOnHistoryLost::kFail);
  r->add_splits({split_at(2)});
  poll_until(*r, 3);
  ASSERT_EQ(out_.events.size(), 3u);
  EXPECT_EQ(out_.events[0].key.to_json(), R"({"_id":3})");
  EXPECT_NE(server_->watch_options.at(0).find("resumeAfter"), std::string::npos) << server_->watch_options.at(0);
  // The checkpointed token is the last change's _id, intact although the driver reused its buffer.
  std::vector<MongoCollectionSplit> state = r->snapshot_state(1);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].resume_token, id_of(server_->changes[4]));
  EXPECT_EQ(state[0].token_time_ms, int64_t{kT} * 1000);
  EXPECT_EQ(source_->metrics()->events.load(), 3);
  EXPECT_EQ(source_->metrics()->positions().at("shop.orders"), out_.events.back().source.position);
}

TEST_F(MongoReaderTest, HistoryLostFailsNamingCollectionTimeAndRemedy) {
  for (uint32_t code : {286u, 280u, 260u}) {
    SCOPED_TRACE(code);
    server_->fail_next_watch = code;
    auto r = reader(MongoOnHistoryLost::kFail);
    r->add_splits({split_at(2)});
    try {
      r->poll_next(out_);
      FAIL() << "expected the history-lost error";
    } catch (const SluiceException& e) {
      const std::string msg = e.error().message();
      EXPECT_EQ(e.error().code(), ErrorCode::kConnector);
      EXPECT_NE(msg.find("'shop.orders'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("2026-11-30T00:53:20"), std::string::npos) << msg;  // the token's cluster time (kT), ISO-8601
      EXPECT_NE(msg.find(token_hex(2)), std::string::npos) << msg;
      EXPECT_NE(msg.find("Remedy"), std::string::npos) << msg;
      EXPECT_NE(msg.find("initial"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(code)), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(source_->metrics()->history_lost.load(), 1);  // per source instance: the last one
}

TEST_F(MongoReaderTest, HistoryLostWithResnapshotScansAgainAndMarksItsEvents) {
  for (uint32_t i = 1; i <= 3; ++i)
    server_->changes.push_back(change("insert", i, static_cast<int32_t>(i), 0));
  server_->documents = {doc_bytes(1, 0), doc_bytes(2, 0), doc_bytes(3, 0)};
  server_->now = mongo_cluster_time(kT, 3);  // the snapshot's resume point: the last change, inclusive
  server_->fail_next_watch = 286;
  auto r = reader(MongoOnHistoryLost::kResnapshot);
  r->add_splits({split_at(1)});
  poll_until(*r, 4);  // 3 snapshot reads + the overlapping change at increment 3
  ASSERT_EQ(out_.events.size(), 4u);
  EXPECT_EQ(server_->scans, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out_.events[static_cast<size_t>(i)].op, cdc::ChangeOp::kRead);
    EXPECT_TRUE(out_.events[static_cast<size_t>(i)].source.snapshot);
  }
  EXPECT_EQ(out_.events[3].op, cdc::ChangeOp::kCreate);
  EXPECT_TRUE(out_.events[3].source.snapshot) << "a stream event overlapping the re-snapshot is marked";
  EXPECT_NE(server_->watch_options.back().find("startAtOperationTime"), std::string::npos);
  server_->changes.push_back(change("insert", 200, 4, 0));  // after the snapshot's end (now = 3)
  server_->now = mongo_cluster_time(kT, 150);
  poll_until(*r, 5);
  ASSERT_EQ(out_.events.size(), 5u);
  EXPECT_FALSE(out_.events[4].source.snapshot);
  EXPECT_EQ(source_->metrics()->resnapshots.load(), 1);
  EXPECT_EQ(source_->metrics()->history_lost.load(), 1);
}

TEST_F(MongoReaderTest, DropFailsOrEndsTheSplit) {
  server_->changes = {change("insert", 1, 1, 0), change("drop", 2, 0), change("invalidate", 3, 0)};
  {
    auto r = reader(MongoOnHistoryLost::kFail, MongoOnDrop::kFail);
    r->add_splits({split_from_start()});
    try {
      poll_until(*r, 10);
      FAIL() << "expected the drop to fail the job";
    } catch (const SluiceException& e) {
      EXPECT_NE(e.error().message().find("'shop.orders'"), std::string::npos) << e.error().message();
      EXPECT_NE(e.error().message().find("drop"), std::string::npos) << e.error().message();
    }
  }
  out_.events.clear();
  auto r = reader(MongoOnHistoryLost::kFail, MongoOnDrop::kEndSplit);
  r->add_splits({split_from_start()});
  r->notify_no_more_splits();
  InputStatus st = InputStatus::kMoreAvailable;
  for (int i = 0; i < 10 && st != InputStatus::kEndOfInput; ++i)
    st = r->poll_next(out_);
  EXPECT_EQ(st, InputStatus::kEndOfInput);
  EXPECT_EQ(out_.events.size(), 1u);
  EXPECT_EQ(out_.released, std::vector<std::string>{"shop.orders"});
  EXPECT_TRUE(r->snapshot_state(1).empty());
}

TEST_F(MongoReaderTest, OtherStreamErrorsFailTheTask) {
  server_->fail_next_watch = 13;  // Unauthorized
  auto r = reader(MongoOnHistoryLost::kResnapshot);
  r->add_splits({split_from_start()});
  EXPECT_THROW(r->poll_next(out_), SluiceException);
  EXPECT_EQ(source_->metrics()->resnapshots.load(), 0);
}

// Exactly-once needs the checkpointed position to be exactly after the last change handed to the job: the
// stream's token of that change, not the batch's post-batch token while changes of the batch are unread.
class PostBatchTokenDriver final : public mongodb::MongoDriver {
 public:
  explicit PostBatchTokenDriver(std::shared_ptr<FakeServer> s) : inner_(s), s_(std::move(s)) {}
  /// A stream whose resume_token() is always the token after the whole log (a server's postBatchResumeToken
  /// as soon as the batch was fetched).
  class Stream final : public mongodb::ChangeStreamCursor {
   public:
    Stream(std::unique_ptr<mongodb::ChangeStreamCursor> inner, std::string pbrt)
        : inner_(std::move(inner)), pbrt_(std::move(pbrt)) {
      bson_init_static(&token_, reinterpret_cast<const uint8_t*>(pbrt_.data()), pbrt_.size());
    }
    const bson_t* next() override { return inner_->next(); }
    bool error(mongodb::DriverError& out) const override { return inner_->error(out); }
    const bson_t* resume_token() const override { return &token_; }

   private:
    std::unique_ptr<mongodb::ChangeStreamCursor> inner_;
    std::string pbrt_;
    bson_t token_{};
  };
  std::unique_ptr<mongodb::ChangeStreamCursor> watch(const std::string& db, const std::string& coll,
                                                     const bson_t& options) override {
    return std::make_unique<Stream>(inner_.watch(db, coll, options), id_of(s_->changes.back()));
  }
  std::unique_ptr<mongodb::DocumentCursor> scan(const std::string& db, const std::string& coll, int n,
                                                const bson_t* after) override {
    return inner_.scan(db, coll, n, after);
  }
  bool cluster_time(const std::string& db, MongoClusterTime& out, mongodb::DriverError& e) override {
    return inner_.cluster_time(db, out, e);
  }
  bool list_collections(const std::string& db, std::vector<std::string>& out, mongodb::DriverError& e) override {
    return inner_.list_collections(db, out, e);
  }

 private:
  FakeDriver inner_;
  std::shared_ptr<FakeServer> s_;
};

TEST_F(MongoReaderTest, CheckpointMidBatchHoldsTheLastEmittedTokenAndARestoreEmitsTheRestOnce) {
  for (uint32_t i = 1; i <= 5; ++i)
    server_->changes.push_back(change("insert", i, static_cast<int32_t>(i), 0));
  auto make = [&] {
    source_ = MongoCdcSource::builder()
                  .database("shop")
                  .collections({"orders"})
                  .batch_size(2)
                  .driver_factory([s = server_]() -> Result<std::unique_ptr<mongodb::MongoDriver>> {
                    return std::unique_ptr<mongodb::MongoDriver>(std::make_unique<PostBatchTokenDriver>(s));
                  })
                  .build();
    return source_->create_reader(ctx_);
  };
  auto r = make();
  r->add_splits({split_from_start()});
  r->poll_next(out_);
  ASSERT_EQ(out_.events.size(), 2u);
  std::vector<MongoCollectionSplit> state = r->snapshot_state(1);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].resume_token, id_of(server_->changes[1]))
      << "the checkpoint must hold the token of the last change emitted, not the batch's post-batch token";
  r->close();

  // The restored reader emits changes 3, 4, 5: none of the first two again, none lost.
  out_.events.clear();
  auto restored = make();
  restored->add_splits(std::move(state));
  poll_until(*restored, 10);
  ASSERT_EQ(out_.events.size(), 3u);
  for (size_t k = 0; k < 3; ++k)
    EXPECT_EQ(out_.events[k].key.to_json(), fmt::format(R"({{"_id":{}}})", k + 3));
  // Drained: an empty batch may adopt the post-batch token (everything before it was emitted).
  EXPECT_EQ(restored->snapshot_state(2).at(0).resume_token, id_of(server_->changes[4]));
}

TEST_F(MongoReaderTest, SnapshotInterruptedByACheckpointResumesAfterTheLastEmittedIdAtTheSameResumePoint) {
  for (int32_t id = 1; id <= 10; ++id)
    server_->documents.push_back(doc_bytes(id, 0));
  server_->now = mongo_cluster_time(kT, 5);  // T0 of the snapshot
  server_->changes = {change("update", 6, 2, 1), change("insert", 7, 11, 0)};
  auto r = reader(MongoOnHistoryLost::kFail, MongoOnDrop::kFail, /*batch_size=*/4);
  MongoCollectionSplit fresh = orders_split();
  fresh.snapshot_pending = true;
  r->add_splits({fresh});
  r->poll_next(out_);
  ASSERT_EQ(out_.events.size(), 4u);  // documents 1..4
  std::vector<MongoCollectionSplit> state = r->snapshot_state(1);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_TRUE(state[0].snapshot_pending);
  EXPECT_EQ(state[0].start_at, mongo_cluster_time(kT, 5));
  r->close();

  // The restore (a later cluster time now) goes on after _id 4 and streams from the first T0: the update of
  // document 2 at increment 6 (after T0, before the restore) is not lost.
  out_.events.clear();
  server_->now = mongo_cluster_time(kT, 50);
  auto restored = reader(MongoOnHistoryLost::kFail, MongoOnDrop::kFail, 4);
  restored->add_splits(std::move(state));
  poll_until(*restored, 8);
  ASSERT_EQ(out_.events.size(), 8u);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(out_.events[k].op, cdc::ChangeOp::kRead);
    EXPECT_EQ(out_.events[k].key.to_json(), fmt::format(R"({{"_id":{}}})", k + 5)) << "a document emitted twice";
  }
  EXPECT_EQ(server_->scans_after.back(), 4);
  EXPECT_EQ(out_.events[6].key.to_json(), R"({"_id":2})");
  EXPECT_EQ(out_.events[6].op, cdc::ChangeOp::kUpdate);
  EXPECT_EQ(out_.events[7].key.to_json(), R"({"_id":11})");
  EXPECT_NE(server_->watch_options.back().find(
                R"("startAtOperationTime" : { "$timestamp" : { "t" : 1796000000, "i" : 5 } })"),
            std::string::npos)
      << server_->watch_options.back();
  EXPECT_FALSE(restored->snapshot_state(2).at(0).snapshot_pending);
  EXPECT_TRUE(restored->snapshot_state(2).at(0).snapshot_last_id.empty());
}

TEST(MongoScanAfterTest, TheFilterCrossesBsonTypeBrackets) {
  Doc after(BCON_NEW("_id", BCON_INT32(7)));
  bson_t filter = BSON_INITIALIZER;
  mongodb::scan_after_filter(*after.b, filter);
  const std::string json = mongodb::bson_to_canonical_json(filter);
  bson_destroy(&filter);
  // $gt 7 within the numbers, and every type MongoDB sorts after numbers (strings 2, ObjectId 7, maxKey 127),
  // but not the other number types (1 double, 16 int, 18 long, 19 decimal) nor null (10).
  EXPECT_NE(json.find(R"("$gt" : { "$numberInt" : "7" })"), std::string::npos) << json;
  for (int t : {2, 3, 7, 8, 9, 127})
    EXPECT_NE(json.find(fmt::format(R"("$type" : {{ "$numberInt" : "{}" }})", t)), std::string::npos) << t << json;
  for (int t : {1, 10, 16, 18, 19})
    EXPECT_EQ(json.find(fmt::format(R"("$type" : {{ "$numberInt" : "{}" }})", t)), std::string::npos) << t << json;
}

// A server that does not answer listCollections must not hold up checkpoints: discovery runs off the source
// coordinator's lock (call_async), as the Kafka source's partition discovery does.
TEST(MongoEnumeratorTest, CheckpointCompletesWhileCollectionDiscoveryBlocks) {
  auto server = std::make_shared<FakeServer>();
  std::promise<void> release;
  server->block_lists = release.get_future().share();
  std::future<void> blocked = server->list_blocked.get_future();
  auto source = MongoCdcSource::builder()
                    .database("shop")
                    .collection_pattern("orders.*")
                    .discovery_interval(std::chrono::milliseconds(1))
                    .driver_factory([server]() -> Result<std::unique_ptr<mongodb::MongoDriver>> {
                      return std::unique_ptr<mongodb::MongoDriver>(std::make_unique<FakeDriver>(server));
                    })
                    .build();
  SourceCoordinator<cdc::ChangeEvent, MongoCollectionSplit> coordinator(*source, /*parallelism=*/1, nullptr);
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "no periodic discovery ran";
  auto checkpoint = std::async(std::launch::async, [&] {
    bool injected = false;
    std::string state = coordinator.checkpoint(1, [&] { injected = true; });
    return injected && !state.empty();
  });
  const bool completed = checkpoint.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  server->collections = {"orders", "orders_2"};
  release.set_value();  // unblock before asserting, so a failure does not hang the test
  ASSERT_TRUE(completed) << "the checkpoint waited for listCollections under the coordinator's lock";
  EXPECT_TRUE(checkpoint.get());
  coordinator.close();
}

// poll_interval 0 asked an idle reader to be polled again at once: a core busy for a quiet collection.
TEST(MongoCdcSourceBuilderTest, APollIntervalUnderOneMillisecondIsRejected) {
  auto r = MongoCdcSource::builder()
               .uri("mongodb://127.0.0.1:1")
               .database("shop")
               .collections({"orders"})
               .poll_interval(std::chrono::milliseconds(0))
               .try_build();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("poll_interval must be at least 1 ms"), std::string::npos) << r.error().message();
  EXPECT_TRUE(MongoCdcSource::builder()
                  .uri("mongodb://127.0.0.1:1")
                  .database("shop")
                  .collections({"orders"})
                  .poll_interval(std::chrono::milliseconds(1))
                  .try_build()
                  .ok());
}

}  // namespace
}  // namespace sluice
