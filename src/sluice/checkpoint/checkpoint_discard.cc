// FileCheckpointStorage::discard and discard_shared_file: local directories removed at once, s3:// prefixes
// and objects handed to the ObjectDeleter's thread.
#include <spdlog/spdlog.h>

#include <exception>
#include <system_error>

#include "checkpoint_storage_internals.h"

namespace sluice {
namespace fs = std::filesystem;

void FileCheckpointStorage::discard(const fs::path& dir) const noexcept {
  try {
    if (is_s3(dir)) {
      auto t = s3_target(dir);
      if (!t.ok()) {
        spdlog::warn("discarding {} failed: {}", dir.string(), t.error().to_string());
        return;
      }
      const std::string name = dir.filename().string();
      const bool own_checkpoint = checkpoint_id_of(dir) >= 0 && dir.parent_path().native() == job_dir_.native();
      // No request here, under the coordinator's lock: the deleting thread checks that a savepoint has no
      // _metadata before it deletes anything of it.
      const bool failed_savepoint = name.starts_with("savepoint-");
      if (!own_checkpoint && !failed_savepoint) {
        spdlog::error(
            "not discarding {}: it is neither a chk-<n> location of job {} nor an incomplete savepoint location",
            dir.string(), job_id_);
        return;
      }
      if (deleter_ != nullptr) deleter_->enqueue(dir);
      return;
    }
    const fs::path abs = normalized(dir);
    const std::string name = abs.filename().string();
    const bool own_checkpoint = checkpoint_id_of(abs) >= 0 && abs.parent_path() == normalized(job_dir_);
    const bool failed_savepoint = name.starts_with("savepoint-") && !has_metadata(abs);
    if (!own_checkpoint && !failed_savepoint) {
      spdlog::error(
          "not discarding {}: it is neither a chk-<n> directory of job {} nor an incomplete savepoint directory",
          abs.string(), job_id_);
      return;
    }
    std::error_code ec;
    fs::remove_all(abs, ec);
    if (ec) spdlog::warn("discarding checkpoint directory {} failed: {}", abs.string(), ec.message());
  } catch (const std::exception& e) {
    spdlog::warn("discarding checkpoint directory {} failed: {}", dir.string(), e.what());
  }
}

void FileCheckpointStorage::discard_shared_file(const std::string& name) const noexcept {
  try {
    if (!is_plain_file_name(name)) {
      spdlog::error("not deleting shared file '{}': not a plain file name", name);
      return;
    }
    if (is_s3(job_dir_)) {
      if (deleter_ != nullptr) deleter_->enqueue_object(fs::path(job_dir_.native() + "/shared/" + name));
      return;
    }
    std::error_code ec;
    fs::remove(job_dir_ / "shared" / name, ec);
    if (ec) spdlog::warn("deleting the shared file {} failed: {}", (job_dir_ / "shared" / name).string(), ec.message());
  } catch (const std::exception& e) {
    spdlog::warn("deleting the shared file {} failed: {}", name, e.what());
  }
}

}  // namespace sluice
