#include "sluice/checkpoint/task_local_state_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <system_error>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/checkpoint/checkpoint_storage.h"

namespace sluice {
namespace fs = std::filesystem;

namespace {

void remove_logged(const fs::path& dir) noexcept {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) spdlog::warn("cannot remove the local state copies in {}: {}", dir.string(), ec.message());
}

}  // namespace

fs::path TaskLocalStateStore::checkpoint_dir(const std::string& job_id, int64_t checkpoint_id) const {
  return root_ / job_id / fmt::format("chk-{}", checkpoint_id);
}

Result<fs::path> TaskLocalStateStore::init_checkpoint(const std::string& job_id, int64_t checkpoint_id) const {
  if (!is_plain_file_name(job_id) || checkpoint_id < 0) {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("local state copies: job id '{}' / checkpoint {} cannot name a directory", job_id, checkpoint_id));
  }
  fs::path dir = checkpoint_dir(job_id, checkpoint_id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return Error(ErrorCode::kCheckpoint,
                 fmt::format("cannot create the local state copy directory {}: {}", dir.string(), ec.message()));
  }
  return dir;
}

std::optional<fs::path> TaskLocalStateStore::find(const fs::path& primary_checkpoint_dir,
                                                  const std::string& file) const {
  fs::path primary = primary_checkpoint_dir;
  if (primary.filename().empty()) primary = primary.parent_path();
  const int64_t id = FileCheckpointStorage::checkpoint_id_of(primary);
  const std::string job_id = primary.parent_path().filename().string();
  if (id < 0 || !is_plain_file_name(job_id) || !is_plain_file_name(file)) return std::nullopt;
  fs::path copy = checkpoint_dir(job_id, id) / file;
  std::error_code ec;
  if (!fs::is_regular_file(copy, ec)) return std::nullopt;
  return copy;
}

void TaskLocalStateStore::confirm_checkpoint(const std::string& job_id, int64_t checkpoint_id) const noexcept {
  if (!is_plain_file_name(job_id) || checkpoint_id < 0) return;
  std::error_code ec;
  // Only a checkpoint with copies here subsumes the older copies: a savepoint's completion (no copies) must not
  // remove those of the latest checkpoint, which a failover restores.
  if (!fs::is_directory(checkpoint_dir(job_id, checkpoint_id), ec)) return;
  std::vector<fs::path> older;
  for (fs::directory_iterator it(root_ / job_id, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t id = FileCheckpointStorage::checkpoint_id_of(it->path());
    if (id >= 0 && id < checkpoint_id) older.push_back(it->path());
  }
  for (const fs::path& dir : older)
    remove_logged(dir);
}

void TaskLocalStateStore::abort_checkpoint(const std::string& job_id, int64_t checkpoint_id) const noexcept {
  if (!is_plain_file_name(job_id) || checkpoint_id < 0) return;
  remove_logged(checkpoint_dir(job_id, checkpoint_id));
}

}  // namespace sluice
