#include "sluice/state/rocksdb_incremental.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <system_error>
#include <utility>

#include "sluice/core/error.h"

namespace sluice {

namespace fs = std::filesystem;

std::optional<SharedStateFile> RocksDBUploadLedger::find(std::string_view file) const {
  std::lock_guard lock(mu_);
  auto it = files_.find(file);
  if (it == files_.end()) return std::nullopt;
  return it->second;
}

void RocksDBUploadLedger::record(std::string_view file, const SharedStateFile& shared) {
  std::lock_guard lock(mu_);
  files_.insert_or_assign(std::string(file), shared);
}

void RocksDBUploadLedger::retain_only(const std::vector<std::string>& live) {
  std::set<std::string_view> keep(live.begin(), live.end());
  std::lock_guard lock(mu_);
  std::erase_if(files_, [&](const auto& entry) { return !keep.contains(entry.first); });
}

size_t RocksDBUploadLedger::size() const {
  std::lock_guard lock(mu_);
  return files_.size();
}

RocksDBNativeSnapshot::RocksDBNativeSnapshot(std::shared_ptr<RocksDBInstance> db, fs::path dir, KeyGroupRange range,
                                             std::shared_ptr<RocksDBUploadLedger> ledger, bool synchronous)
    : db_(std::move(db)), dir_(std::move(dir)), range_(range), ledger_(std::move(ledger)) {
  std::error_code ec;
  fs::remove_all(dir_, ec);  // a leftover of an earlier capture that failed
  if (!ledger_->synchronous_capture_requested() && !synchronous) start_ = db_->begin_checkpoint(dir_);
  if (start_ == nullptr) {
    files_ = db_->create_checkpoint(dir_);
    synchronous_ = true;
  }
}

Result<bool> RocksDBNativeSnapshot::complete() const {
  std::lock_guard lock(mu_);
  if (completed_) return *completed_;
  if (synchronous_) {
    ledger_->retain_only(files_);
    ledger_->synchronous_capture_completed();
    completed_.emplace(true);
    return *completed_;
  }
  try {
    std::optional<std::vector<std::string>> files = db_->finish_checkpoint(*start_, kFlushTimeout);
    if (files) {
      files_ = std::move(*files);
      ledger_->retain_only(files_);
      completed_.emplace(true);
    } else {
      ledger_->request_synchronous_capture();
      spdlog::warn(
          "rocksdb state backend {}: a memtable filled with writes after the barrier was flushed before the "
          "checkpoint's files were linked; this checkpoint is written in full (canonically) instead, and the next "
          "capture flushes synchronously",
          db_->directory().string());
      completed_.emplace(false);
    }
  } catch (const SluiceException& e) {
    completed_.emplace(e.error());
  }
  start_.reset();  // releases the snapshot: compactions may drop what only it kept
  return *completed_;
}

RocksDBNativeSnapshot::~RocksDBNativeSnapshot() {
  start_.reset();  // waits for a link into dir_ on RocksDB's flush thread (a capture that was never completed)
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (ec)
    spdlog::warn("rocksdb state backend: cannot remove the checkpoint directory {}: {}", dir_.string(), ec.message());
}

std::string rocksdb_key_group_begin(int32_t kg) {
  std::string s;
  s.push_back(static_cast<char>((kg >> 8) & 0xff));
  s.push_back(static_cast<char>(kg & 0xff));
  return s;
}

namespace {

Status fresh_dir(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) {
    return Error(ErrorCode::kState, fmt::format("rocksdb state backend: cannot create the restore directory {}: {}",
                                                dir.string(), ec.message()));
  }
  return ok_status();
}

}  // namespace

Result<std::shared_ptr<RocksDBInstance>> restore_native_database(const fs::path& working_dir, KeyGroupRange range,
                                                                 const std::vector<NativeKeyedStateRestore>& sources,
                                                                 const RocksDBMemoryOptions& memory) {
  try {
    const std::string begin = rocksdb_key_group_begin(range.start());
    const std::string end = rocksdb_key_group_begin(range.end() + 1);
    // The base is the database sharing the most key groups with `range` (as Flink's RocksDB rescaling picks its
    // initial database), of two alike the smaller (less to clip): it is opened in place and clipped, the others'
    // entries in `range` are ingested. Taking a base only when it covered all of `range` copied everything for
    // 2 -> 1 and the middle subtask of 2 -> 3.
    const NativeKeyedStateRestore* base = nullptr;
    int32_t base_overlap = 0;
    for (const auto& s : sources) {
      const int32_t overlap =
          std::min(s.key_groups.end(), range.end()) - std::max(s.key_groups.start(), range.start()) + 1;
      if (overlap > base_overlap ||
          (overlap > 0 && overlap == base_overlap && s.key_groups.size() < base->key_groups.size())) {
        base = &s;
        base_overlap = overlap;
      }
    }
    using Clock = std::chrono::steady_clock;
    const auto ms_since = [](Clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
    };
    const auto started = Clock::now();
    std::string phases;  // for the debug log: where a slow restore spent its time
    std::shared_ptr<RocksDBInstance> db;
    if (base != nullptr) {
      SLUICE_RETURN_IF_ERROR(fresh_dir(working_dir));
      SLUICE_RETURN_IF_ERROR(base->materialize(working_dir));
      phases += fmt::format("base {} materialized {} ms", base->key_groups.to_string(), ms_since(started));
      auto t = Clock::now();
      db = RocksDBInstance::open_existing(working_dir, memory);
      phases += fmt::format(", opened {} ms", ms_since(t));
      t = Clock::now();
      if (!(base->key_groups == range)) db->clip_to_range(begin, end);
      phases += fmt::format(", clipped {} ms", ms_since(t));
    } else {
      db = RocksDBInstance::open(working_dir, memory);
    }
    int n = 0;
    for (const auto& s : sources) {
      if (&s == base) continue;
      const int32_t first = std::max(s.key_groups.start(), range.start());
      const int32_t last = std::min(s.key_groups.end(), range.end());
      if (first > last) continue;
      const fs::path tmp = working_dir.string() + fmt::format(".restore-{}", n++);
      auto t = Clock::now();
      SLUICE_RETURN_IF_ERROR(fresh_dir(tmp));
      Status st = s.materialize(tmp);
      if (!st.ok()) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        return st.error();
      }
      // The instance removes `tmp` when it goes.
      phases += fmt::format("; {} materialized {} ms", s.key_groups.to_string(), ms_since(t));
      t = Clock::now();
      std::shared_ptr<RocksDBInstance> other = RocksDBInstance::open_existing(tmp, memory);
      phases += fmt::format(", opened {} ms", ms_since(t));
      t = Clock::now();
      db->copy_range_from(*other, rocksdb_key_group_begin(first), rocksdb_key_group_begin(last + 1));
      phases += fmt::format(", key groups {}-{} ingested {} ms", first, last, ms_since(t));
      t = Clock::now();
      other.reset();
      phases += fmt::format(", closed {} ms", ms_since(t));
    }
    spdlog::debug("rocksdb state backend: key groups {} restored in {} ms ({})", range.to_string(), ms_since(started),
                  phases);
    return db;
  } catch (const SluiceException& e) {
    return e.error().with_context("restoring the rocksdb state of key groups " + range.to_string() +
                                  " from an incremental checkpoint");
  }
}

}  // namespace sluice
