// The pipeline runner's checkpoints: find_latest_checkpoint (what `sluice run` resumes from, local or s3://)
// and the removal of checkpoints a newer run superseded.
#include "pipeline_runner_internals.h"

namespace sluice::pipeline {

namespace {

// A job directory's name: the 32 lowercase hex digits of a job id (local_cluster.cc). Savepoints
// ("savepoint-..."), the lock file and whatever else a user keeps in the storage never match.
bool is_job_id(std::string_view name) {
  return name.size() == 32 && name.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// find_latest_checkpoint() on s3://bucket/prefix: the same choice from one listing of the prefix (the newest
// _metadata of a chk-<n>, or a stopped job's savepoint, by the objects' LastModified; finished jobs skipped).
std::string find_latest_s3_checkpoint(const std::string& storage) {
  auto client = S3Client::shared();
  auto uri = S3Uri::parse(storage);
  if (!client.ok() || !uri.ok()) return {};
  const std::string prefix = uri->key.empty() ? std::string() : uri->key + "/";
  auto listing = (*client)->list(uri->bucket, prefix);
  if (!listing.ok()) {
    spdlog::warn("cannot list the checkpoint storage {}: {}", storage, listing.error().to_string());
    return {};
  }
  struct Job {
    bool finished = false;
    std::string stopped_key, best, best_time;
    int64_t best_id = -1;
  };
  std::map<std::string, Job> jobs;
  for (const S3Object& o : listing->objects) {
    std::string_view rest = std::string_view(o.key).substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || !is_job_id(rest.substr(0, slash))) continue;
    Job& job = jobs[std::string(rest.substr(0, slash))];
    std::string_view inside = rest.substr(slash + 1);
    if (inside == kFinishedMarker) job.finished = true;
    if (inside == kStoppedMarker) {
      job.stopped_key = o.key;
    }
    // Within a job the highest checkpoint id is the newest (ids only grow; LastModified has whole seconds on some
    // stores, and a subsumed checkpoint may not be deleted yet).
    const size_t chk_end = inside.find('/');
    const int64_t id = chk_end == std::string_view::npos
                           ? -1
                           : FileCheckpointStorage::checkpoint_id_of(fs::path(std::string(inside.substr(0, chk_end))));
    if (id >= 0 && inside.substr(chk_end + 1) == kMetadataFileName && id > job.best_id) {
      job.best = "s3://" + uri->bucket + "/" + o.key.substr(0, o.key.size() - kMetadataFileName.size() - 1);
      job.best_id = id;
    }
  }
  // Across jobs: the trigger time (ms) in each job's newest _metadata.
  for (auto& [name, job] : jobs) {
    if (job.best.empty() || job.finished) continue;
    auto meta = FileCheckpointStorage::load_metadata(job.best);
    job.best_time = meta.ok() ? fmt::format("{:020d}", meta->trigger_timestamp) : std::string();
    if (!meta.ok()) job.best.clear();
  }
  std::string best, best_time;
  for (auto& [id, job] : jobs) {
    if (job.finished) continue;
    if (!job.stopped_key.empty()) {
      auto savepoint = (*client)->get_object(uri->bucket, job.stopped_key);
      if (!savepoint.ok() || savepoint->empty()) continue;
      // The savepoint's trigger time; a savepoint that is gone sorts first and is reported by the caller.
      auto meta = FileCheckpointStorage::load_metadata(*savepoint);
      const std::string t = meta.ok() ? fmt::format("{:020d}", meta->trigger_timestamp) : std::string();
      if (best.empty() || t > best_time) {
        best = *savepoint;
        best_time = t;
      }
      continue;
    }
    if (!job.best.empty() && (best.empty() || job.best_time > best_time)) {
      best = job.best;
      best_time = job.best_time;
    }
  }
  return best;
}

// remove_superseded_checkpoints() on s3://bucket/prefix: deletes the objects of every other job prefix.
int remove_superseded_s3_checkpoints(const std::string& pipeline, const std::string& storage, const std::string& own,
                                     const std::string& kept_job_dir) {
  auto client = S3Client::shared();
  auto uri = S3Uri::parse(storage);
  if (!client.ok() || !uri.ok()) return 0;
  const std::string prefix = uri->key.empty() ? std::string() : uri->key + "/";
  auto listing = (*client)->list(uri->bucket, prefix, "/");
  if (!listing.ok()) {
    spdlog::warn("pipeline '{}': cannot list the checkpoint storage {} to remove superseded checkpoints: {}", pipeline,
                 storage, listing.error().to_string());
    return 0;
  }
  int removed = 0;
  for (const std::string& job_prefix : listing->common_prefixes) {
    std::string name = job_prefix.substr(prefix.size());
    if (!name.empty() && name.back() == '/') name.pop_back();
    if (name == own || name == kept_job_dir || !is_job_id(name)) continue;
    auto deleted = (*client)->delete_prefix(uri->bucket, job_prefix);
    if (!deleted.ok()) {
      spdlog::warn("pipeline '{}': cannot remove the superseded checkpoints in s3://{}/{}: {}", pipeline, uri->bucket,
                   job_prefix, deleted.error().to_string());
      continue;
    }
    ++removed;
  }
  if (removed > 0) {
    spdlog::info("pipeline '{}': removed the checkpoints of {} earlier job(s) from {} (superseded by job {})", pipeline,
                 removed, storage, own);
  }
  return removed;
}

}  // namespace

void mark_job_ended(const std::string& storage, const std::string& job_id, const std::vector<CheckpointStats>& stats,
                    const std::string& pipeline) {
  std::string stop_savepoint;
  for (const CheckpointStats& st : stats) {
    if (st.completed && st.type == "stop-with-savepoint") stop_savepoint = st.path;
  }
  const fs::path job_dir = fs::path(storage_path(storage)) / job_id;
  std::error_code ec;
  if (!is_s3_uri(storage)) fs::create_directories(job_dir, ec);
  const fs::path marker = job_dir / (stop_savepoint.empty() ? kFinishedMarker : kStoppedMarker);
  if (is_s3_uri(storage)) {
    auto client = S3Client::shared();
    auto uri = S3Uri::parse(marker.native());
    Status put = client.ok() && uri.ok() ? (*client)->put_object(uri->bucket, uri->key, stop_savepoint)
                                         : Status(client.ok() ? uri.error() : client.error());
    if (!put.ok()) {
      spdlog::warn("pipeline '{}': cannot write {}: {}", pipeline, marker.string(), put.error().to_string());
    }
  } else if (FILE* f = std::fopen(marker.c_str(), "w")) {
    if (!stop_savepoint.empty()) std::fputs(stop_savepoint.c_str(), f);
    if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) {
      spdlog::warn("pipeline '{}': cannot write {}: {}", pipeline, marker.string(), std::strerror(errno));
    }
    std::fclose(f);
  } else {
    spdlog::warn("pipeline '{}': cannot write {}: {}", pipeline, marker.string(), std::strerror(errno));
  }
  if (!stop_savepoint.empty()) {
    spdlog::info("pipeline '{}': stopped with the savepoint {}; the next run resumes from it", pipeline,
                 stop_savepoint);
  }
}

std::string find_latest_checkpoint(const std::string& storage) {
  if (is_s3_uri(storage)) return find_latest_s3_checkpoint(storage);
  const fs::path root = storage_path(storage);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  std::string best;
  fs::file_time_type best_time{};
  for (const auto& job : fs::directory_iterator(root, ec)) {
    if (!job.is_directory(ec) || fs::exists(job.path() / kFinishedMarker, ec)) continue;
    if (const fs::path stopped = job.path() / kStoppedMarker; fs::exists(stopped, ec)) {
      // A stopped job resumes from its savepoint (taken after its last checkpoint), wherever it was written.
      std::ifstream in(stopped);
      std::string savepoint;
      std::getline(in, savepoint);
      const auto t = fs::last_write_time(stopped, ec);
      if (ec || savepoint.empty()) {
        ec.clear();
        continue;
      }
      if (best.empty() || t > best_time) {
        best = savepoint;
        best_time = t;
      }
      continue;
    }
    for (const auto& chk : fs::directory_iterator(job.path(), ec)) {
      if (FileCheckpointStorage::checkpoint_id_of(chk.path()) < 0) continue;
      const fs::path meta = chk.path() / kMetadataFileName;
      const auto t = fs::last_write_time(meta, ec);
      if (ec) {
        ec.clear();
        continue;
      }
      if (best.empty() || t > best_time) {
        best = chk.path().string();
        best_time = t;
      }
    }
  }
  return best;
}

int PipelineRunner::remove_superseded_checkpoints() {
  if (s_->superseded_removed || s_->spec.pipeline.checkpoint_interval_ms <= 0) return 0;
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  if (!c) return 0;
  bool own_checkpoint = false;
  for (const CheckpointStats& st : c->checkpoint_stats())
    own_checkpoint = own_checkpoint || (st.completed && st.type == "checkpoint");
  if (!own_checkpoint) return 0;
  s_->superseded_removed = true;
  // This job's completed checkpoint is durable (its _metadata was synced before it counted as completed), so
  // the next run resumes from it: earlier jobs' checkpoints will never be restored by `sluice run` again.
  const fs::path root = storage_path(s_->config.get(options::kCheckpointDir));
  const std::string own = c->job_id();
  if (is_s3_uri(root.native())) {
    return remove_superseded_s3_checkpoints(s_->spec.pipeline.name, root.native(), own, s_->kept_job_dir);
  }
  std::vector<fs::path> superseded;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_ec;
    if (name == own || name == s_->kept_job_dir || !is_job_id(name) || !entry.is_directory(type_ec)) continue;
    superseded.push_back(entry.path());
  }
  if (ec) {
    spdlog::warn("pipeline '{}': cannot list the checkpoint storage {} to remove superseded checkpoints: {}",
                 s_->spec.pipeline.name, root.string(), ec.message());
    return 0;
  }
  int removed = 0;
  for (const fs::path& dir : superseded) {
    std::error_code rm_ec;
    fs::remove_all(dir, rm_ec);
    if (rm_ec) {
      spdlog::warn("pipeline '{}': cannot remove the superseded checkpoints in {}: {}", s_->spec.pipeline.name,
                   dir.string(), rm_ec.message());
      continue;
    }
    ++removed;
  }
  if (removed > 0) {
    spdlog::info("pipeline '{}': removed the checkpoints of {} earlier job(s) from {} (superseded by job {})",
                 s_->spec.pipeline.name, removed, root.string(), own);
  }
  return removed;
}

}  // namespace sluice::pipeline
