// MongoCdcEnumerator (mongodb_cdc_enumerator.h).
#include "mongodb_cdc_enumerator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "mongodb_cdc_internals.h"

namespace sluice {
namespace mongodb_cdc_internal {

namespace {

class MongoCdcEnumerator final : public SplitEnumerator<MongoCollectionSplit> {
 public:
  MongoCdcEnumerator(SplitEnumeratorContext<MongoCollectionSplit>& ctx, const detail::MongoCdcSourceSettings& s,
                     std::unique_ptr<mongodb::MongoDriver> driver)
      : ctx_(ctx), s_(s), driver_(std::move(driver)) {
    if (!s.collection_pattern.empty()) pattern_.emplace(s.collection_pattern, std::regex::ECMAScript);
  }

  void start() override {
    Status st = discover(/*initial=*/!restored_);
    if (!st.ok()) {
      if (!restored_) throw SluiceException(st.error());
      spdlog::warn("{} ({}): discovery after the restore failed, retrying periodically: {}", kRole, s_.describe(),
                   st.error().to_string());
    }
    if (discovery_enabled()) {
      // listCollections runs off the coordinator's lock (a server that does not answer would otherwise hold up
      // checkpoints for the socket timeout); the names are applied under it, without network calls. The work
      // owns a reference to the driver, the enumerator's only user of it after start().
      ctx_.call_async(
          [this, driver = driver_, db = s_.database, what = s_.describe()]() -> std::function<void()> {
            std::vector<std::string> all;
            mongodb::DriverError e;
            if (!driver->list_collections(db, all, e)) {
              spdlog::warn(
                  "{} ({}): collection discovery failed: listing the collections of database '{}' failed: "
                  "{} (code {})",
                  kRole, what, db, e.message, e.code);
              return nullptr;
            }
            return [this, all = std::move(all)] {
              if (!driver_) return;
              Status r = apply_discovered(all, /*initial=*/false);
              if (!r.ok())
                spdlog::warn("{} ({}): collection discovery failed: {}", kRole, s_.describe(), r.error().to_string());
            };
          },
          s_.discovery_interval_ms);
    }
  }

  void handle_split_request(int /*subtask*/) override {}

  void add_splits_back(std::vector<MongoCollectionSplit> splits, int subtask) override {
    registered_.erase(subtask);
    for (MongoCollectionSplit& sp : splits) {
      assigned_.erase(sp.split_id());
      add_pending(std::move(sp));
    }
    for (int r : registered_)
      assign_pending(r);
  }

  void add_reader(int subtask) override {
    registered_.insert(subtask);
    assign_pending(subtask);
    if (!discovery_enabled()) ctx_.signal_no_more_splits(subtask);
  }

  std::vector<MongoCollectionSplit> snapshot_state(int64_t /*checkpoint_id*/) override {
    std::vector<MongoCollectionSplit> out;
    for (const auto& [owner, splits] : pending_)
      out.insert(out.end(), splits.begin(), splits.end());
    for (const std::string& id : assigned_) {
      MongoCollectionSplit m;
      const size_t dot = id.find('.');
      m.database = id.substr(0, dot);
      m.collection = id.substr(dot + 1);
      m.assigned = true;
      out.push_back(std::move(m));
    }
    return out;
  }

  void restore_state(std::vector<MongoCollectionSplit> splits) override {
    restored_ = true;
    pending_.clear();
    assigned_.clear();
    for (MongoCollectionSplit& sp : splits) {
      if (sp.assigned) {
        assigned_.insert(sp.split_id());
      } else {
        add_pending(std::move(sp));
      }
    }
  }

  void close() override { driver_.reset(); }

 private:
  bool discovery_enabled() const { return pattern_.has_value() && s_.discovery_interval_ms > 0; }

  Status discover(bool initial) {
    std::vector<std::string> all;
    if (pattern_) {
      mongodb::DriverError e;
      if (!driver_->list_collections(s_.database, all, e)) {
        return Error(ErrorCode::kConnector,
                     fmt::format("{}: listing the collections of database '{}' failed: {} (code {})", kRole,
                                 s_.database, e.message, e.code));
      }
    }
    return apply_discovered(all, initial);
  }

  // `all`: the collection names listCollections returned (ignored without a pattern). Network calls only for
  // start mode latest, which only the initial discovery uses.
  Status apply_discovered(const std::vector<std::string>& all, bool initial) {
    std::vector<std::string> names;
    if (pattern_) {
      for (const std::string& n : all) {
        if (!n.starts_with("system.") && std::regex_match(n, *pattern_)) names.push_back(n);
      }
    } else {
      names = s_.collections;
    }
    std::sort(names.begin(), names.end());
    std::set<std::string> known = assigned_;
    for (const auto& [owner, splits] : pending_) {
      for (const auto& sp : splits)
        known.insert(sp.split_id());
    }
    std::vector<std::string> fresh;
    for (const std::string& n : names) {
      if (known.count(s_.database + "." + n) == 0) fresh.push_back(n);
    }
    if (fresh.empty()) return ok_status();
    // Collections found later (or after a restore) are snapshotted: their documents predate discovery.
    const MongoStartMode mode = initial ? s_.start_mode : MongoStartMode::kInitial;
    MongoClusterTime now = 0;
    if (mode == MongoStartMode::kLatest) {
      mongodb::DriverError e;
      if (!driver_->cluster_time(s_.database, now, e)) {
        return Error(ErrorCode::kConnector,
                     fmt::format("{}: reading the cluster time of '{}' for start mode latest failed: {} (code {})",
                                 kRole, s_.uri, e.message, e.code));
      }
    }
    for (const std::string& n : fresh) {
      MongoCollectionSplit sp;
      sp.database = s_.database;
      sp.collection = n;
      switch (mode) {
        case MongoStartMode::kInitial:
          sp.snapshot_pending = true;
          break;
        case MongoStartMode::kLatest:
          sp.start_at = now + 1;  // the next increment: only changes after now
          break;
        case MongoStartMode::kTimestamp:
          sp.start_at = mongo_cluster_time(static_cast<uint32_t>(s_.start_timestamp_ms / 1000), 0);
          break;
        case MongoStartMode::kResumeToken: {
          const std::string& json = s_.resume_tokens.at(n);
          bson_error_t e;
          BsonPtr doc(
              bson_new_from_json(reinterpret_cast<const uint8_t*>(json.data()), static_cast<ssize_t>(json.size()), &e));
          if (!doc)
            return Error(ErrorCode::kConfiguration,
                         fmt::format("{}: bad resume token of '{}': {}", kRole, n, e.message));
          sp.resume_token.assign(reinterpret_cast<const char*>(bson_get_data(doc.get())), doc->len);
          break;
        }
      }
      add_pending(std::move(sp));
    }
    spdlog::info("{} ({}): {} new collection(s) [{}], start mode {}", kRole, s_.describe(), fresh.size(),
                 fmt::join(fresh, ", "), mongo_start_mode_name(mode));
    for (int r : registered_)
      assign_pending(r);
    return ok_status();
  }

  void add_pending(MongoCollectionSplit sp) {
    sp.assigned = false;
    const int owner = mongodb::collection_split_owner(sp.split_id(), std::max(1, ctx_.current_parallelism()));
    pending_[owner].push_back(std::move(sp));
  }

  void assign_pending(int subtask) {
    auto it = pending_.find(subtask);
    if (it == pending_.end()) return;
    std::vector<MongoCollectionSplit> splits = std::move(it->second);
    pending_.erase(it);
    for (MongoCollectionSplit& sp : splits) {
      assigned_.insert(sp.split_id());
      ctx_.assign_split(std::move(sp), subtask);
    }
  }

  SplitEnumeratorContext<MongoCollectionSplit>& ctx_;
  detail::MongoCdcSourceSettings s_;
  std::shared_ptr<mongodb::MongoDriver> driver_;
  std::optional<std::regex> pattern_;
  bool restored_ = false;
  std::set<std::string> assigned_;
  std::map<int, std::vector<MongoCollectionSplit>> pending_;
  std::set<int> registered_;
};

}  // namespace

std::unique_ptr<SplitEnumerator<MongoCollectionSplit>> make_mongo_cdc_enumerator(
    SplitEnumeratorContext<MongoCollectionSplit>& ctx, const detail::MongoCdcSourceSettings& settings,
    std::unique_ptr<mongodb::MongoDriver> driver) {
  return std::make_unique<MongoCdcEnumerator>(ctx, settings, std::move(driver));
}

}  // namespace mongodb_cdc_internal
}  // namespace sluice
