// The FileSink's part files on S3: multipart uploads completed on commit (files.h, "On S3").
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <unordered_set>

#include "sluice/connectors/files.h"
#include "sluice/core/fault_points.h"

namespace sluice::detail {

namespace {

[[noreturn]] void throw_s3(std::string_view what, const Error& error) {
  throw SluiceException(Error(ErrorCode::kConnector, fmt::format("file sink: {}: {}", what, error.message())));
}

// The part of `key` after `<prefix>/` (all of it when the prefix is empty); nullopt when `key` is not directly under
// the prefix (deeper "directories" belong to someone else).
std::optional<std::string_view> name_under(std::string_view prefix, std::string_view key) {
  if (!prefix.empty()) {
    if (key.size() <= prefix.size() + 1 || !key.starts_with(prefix) || key[prefix.size()] != '/') return std::nullopt;
    key.remove_prefix(prefix.size() + 1);
  }
  if (key.find('/') != std::string_view::npos) return std::nullopt;
  return key;
}

// `<prefix>/part-<subtask>-` (the listing prefix of one subtask's part files), or `part-` for every subtask.
std::string part_prefix(std::string_view prefix, std::optional<int> subtask) {
  std::string p = prefix.empty() ? std::string() : std::string(prefix) + "/";
  p += "part-";
  if (subtask) p += fmt::format("{}-", *subtask);
  return p;
}

}  // namespace

std::shared_ptr<const S3Client> file_sink_s3_client(RuntimeContext& ctx) {
  if (const Configuration* config = ctx.job_configuration()) {
    Result<S3Options> options = S3Options::from_config(*config);
    if (!options.ok()) throw_s3("the s3.* options", options.error());
    return std::make_shared<const S3Client>(std::move(options).value());
  }
  Result<std::shared_ptr<const S3Client>> client = S3Client::shared();
  if (!client.ok()) throw_s3("the s3.* options", client.error());
  return std::move(client).value();
}

std::string s3_part_key(std::string_view prefix, int subtask, int64_t sequence, std::string_view extension) {
  return fmt::format("{}{}-{}.{}", part_prefix(prefix, std::nullopt), subtask, sequence, extension);
}

// ---------------------------------------------------------------------------------------------------------
// S3RollingPartFile

S3RollingPartFile::S3RollingPartFile(RuntimeContext& ctx, std::shared_ptr<const S3Client> client, S3Uri location,
                                     std::string extension, RollingPolicy policy)
    : clock_(ctx.clock()),
      sequence_state_(
          &ctx.operator_state().get_union_list_state<std::pair<int32_t, int64_t>>(RollingPartFile::kSequenceStateName)),
      client_(std::move(client)),
      location_(std::move(location)),
      extension_(std::move(extension)),
      policy_(policy),
      subtask_(ctx.subtask_index()),
      part_size_(static_cast<size_t>(std::max<int64_t>(client_->options().part_size, 1))) {
  policy_.part_size_bytes = std::max<int64_t>(policy_.part_size_bytes, 1);
  policy_.rollover_interval_ms = std::max<int64_t>(policy_.rollover_interval_ms, 1);
  policy_.inactivity_interval_ms = std::max<int64_t>(policy_.inactivity_interval_ms, 1);
  bool restored = false;
  for (const auto& [subtask, next] : sequence_state_->get()) {
    if (subtask != subtask_) continue;
    next_sequence_ = std::max(next_sequence_, next);
    restored = true;
  }
  if (!restored) {
    // A fresh start numbers its files after those of earlier jobs under the prefix (one listing); a restore takes
    // the number from the state.
    const std::string prefix = part_prefix(location_.key, subtask_);
    Result<S3Listing> listing = client_->list(location_.bucket, prefix);
    if (!listing.ok()) throw_s3(fmt::format("listing s3://{}/{}", location_.bucket, prefix), listing.error());
    for (const S3Object& o : listing->objects) {
      std::optional<std::string_view> name = name_under(location_.key, o.key);
      if (!name) continue;
      std::optional<PartFileName> p = parse_part_file_name(*name);
      if (p && !p->in_progress && p->subtask == subtask_ && p->sequence < std::numeric_limits<int64_t>::max()) {
        next_sequence_ = std::max(next_sequence_, p->sequence + 1);
      }
    }
  }
  sequence_state_->update({{subtask_, next_sequence_}});
}

void S3RollingPartFile::open_next() {
  // A key that holds an object already (a rerun into the same prefix, or a restore of an older checkpoint) is
  // skipped, so a commit never replaces a committed file: one HEAD per part file.
  for (;;) {
    key_ = s3_part_key(location_.key, subtask_, next_sequence_, extension_);
    Result<std::optional<S3Object>> head = client_->head_object(location_.bucket, key_);
    if (!head.ok()) throw_s3(fmt::format("opening part file s3://{}/{}", location_.bucket, key_), head.error());
    if (!head->has_value()) break;
    ++next_sequence_;
  }
  ++next_sequence_;
  open_ = true;
  upload_id_.clear();
  etags_.clear();
  buf_.clear();
  bytes_ = 0;
  opened_ms_ = last_write_ms_ = clock_.now_ms();
  records_since_check_ = 0;
}

void S3RollingPartFile::upload_part(size_t n) {
  throw_if_current_task_cancelled();  // a stale task uploads nothing more (core/cancellation.h)
  const std::string where = fmt::format("s3://{}/{}", location_.bucket, key_);
  if (upload_id_.empty()) {
    Result<std::string> id = client_->create_multipart_upload(location_.bucket, key_);
    if (!id.ok()) throw_s3("starting the multipart upload of part file " + where, id.error());
    upload_id_ = std::move(id).value();
  }
  const int number = static_cast<int>(etags_.size()) + 1;
  Result<std::string> etag =
      client_->upload_part(location_.bucket, key_, upload_id_, number, std::string_view(buf_).substr(0, n));
  if (!etag.ok()) throw_s3(fmt::format("uploading part {} of part file {}", number, where), etag.error());
  etags_.push_back(std::move(etag).value());
  buf_.erase(0, n);
  bytes_ += static_cast<int64_t>(n);
}

void S3RollingPartFile::after_record() {
  ++records_since_check_;
  if (bytes_ + static_cast<int64_t>(buf_.size()) >= policy_.part_size_bytes) {
    finish_in_progress();
    return;
  }
  if (buf_.size() >= part_size_) {
    upload_part(part_size_);
    check_intervals(clock_.now_ms());
  }
}

void S3RollingPartFile::flush(bool end_of_input) {
  if (end_of_input) finish_in_progress();
}

void S3RollingPartFile::check_intervals(TimestampMs now) {
  if (!open_) return;
  if (records_since_check_ > 0) {
    last_write_ms_ = now;
    records_since_check_ = 0;
  }
  if (now - opened_ms_ >= policy_.rollover_interval_ms || now - last_write_ms_ >= policy_.inactivity_interval_ms) {
    finish_in_progress();
  }
}

void S3RollingPartFile::finish_in_progress() {
  if (!open_) return;
  // The last part may be smaller than S3's 5 MiB minimum; a file always holds at least one record, so one part.
  if (!buf_.empty() || etags_.empty()) upload_part(buf_.size());
  finished_.push_back(
      FileCommittable{"", fmt::format("s3://{}/{}", location_.bucket, key_), std::move(upload_id_), std::move(etags_)});
  open_ = false;
  upload_id_.clear();
  etags_.clear();
  buf_.clear();
  bytes_ = 0;
  records_since_check_ = 0;
}

std::vector<FileCommittable> S3RollingPartFile::snapshot() {
  // What is buffered exists only here: the checkpoint finishes the file (Flink's OnCheckpointRollingPolicy).
  finish_in_progress();
  sequence_state_->update({{subtask_, next_sequence_}});
  std::vector<FileCommittable> out = std::move(finished_);
  finished_.clear();
  return out;
}

void S3RollingPartFile::discard() noexcept {
  auto abort = [&](const std::string& key, const std::string& upload_id) {
    if (upload_id.empty()) return;
    try {
      Status s = client_->abort_multipart_upload(location_.bucket, key, upload_id);
      if (!s.ok()) {
        spdlog::warn("file sink: aborting the upload of s3://{}/{} failed (the next start aborts it): {}",
                     location_.bucket, key, s.error().message());
      }
    } catch (const std::exception& e) {
      spdlog::warn("file sink: aborting the upload of s3://{}/{} failed: {}", location_.bucket, key, e.what());
    }
  };
  if (open_) abort(key_, upload_id_);
  open_ = false;
  upload_id_.clear();
  etags_.clear();
  buf_.clear();
  for (const FileCommittable& c : finished_) {
    Result<S3Uri> uri = S3Uri::parse(c.final_path);
    if (uri.ok()) abort(uri->key, c.upload_id);
  }
  finished_.clear();
}

// ---------------------------------------------------------------------------------------------------------
// S3FileCommitter

void S3FileCommitter::commit(std::vector<FileCommittable>& committables) {
  for (const FileCommittable& c : committables) {
    Result<S3Uri> uri = S3Uri::parse(c.final_path);
    if (!uri.ok() || c.upload_id.empty() || c.part_etags.empty()) {
      throw SluiceException(Error(
          ErrorCode::kConnector,
          fmt::format("file sink: the committable of '{}' is not a multipart upload on S3 (upload id '{}', {} parts): "
                      "the restored state was written by a file sink on a file system; a job's file sink cannot move "
                      "between a file system and S3 while keeping its state",
                      c.final_path, c.upload_id, c.part_etags.size())));
    }
    SLUICE_FAULT_POINT("files.s3.before-complete");
    Status done = client_->complete_multipart_upload(uri->bucket, uri->key, c.upload_id, c.part_etags);
    if (done.ok()) {
      SLUICE_FAULT_POINT("files.s3.after-complete");
      continue;
    }
    // Completed by an earlier commit? Then the key holds the object these parts make. (AWS answers NoSuchUpload
    // for an upload completed a while ago, moto an HTTP 500 for an upload it does not know.)
    Result<std::optional<S3Object>> head = client_->head_object(uri->bucket, uri->key);
    if (!head.ok()) throw_s3("committing part file " + c.final_path, done.error());
    const std::string expected = S3Client::multipart_etag(c.part_etags);
    if (head->has_value() && (*head)->etag == expected) continue;
    // Still open: the completion failed for another reason (the store is failing); the restore tries again.
    Result<std::vector<S3MultipartUpload>> open = client_->list_multipart_uploads(uri->bucket, uri->key);
    if (!open.ok()) throw_s3("committing part file " + c.final_path, done.error());
    if (std::any_of(open->begin(), open->end(),
                    [&](const S3MultipartUpload& u) { return u.key == uri->key && u.upload_id == c.upload_id; })) {
      throw_s3("committing part file " + c.final_path, done.error());
    }
    // Neither completed nor open: aborted (by hand, or a bucket lifecycle rule).
    throw SluiceException(Error(
        ErrorCode::kConnector,
        fmt::format("file sink: the pre-committed part file '{}' cannot be committed: S3 no longer knows its "
                    "multipart upload '{}' and the key {}: its records are lost (the upload was aborted, by hand or "
                    "by a bucket lifecycle rule such as AbortIncompleteMultipartUpload shorter than the job's "
                    "longest outage, or a consumer replaced the object). Restore from a later checkpoint or start the "
                    "job without its state",
                    c.final_path, c.upload_id,
                    head->has_value()
                        ? fmt::format("holds another object (ETag {}, expected {})", (*head)->etag, expected)
                        : std::string("holds no object"))));
  }
}

void S3FileCommitter::abort_lingering(RuntimeContext& ctx, const std::vector<FileCommittable>& restored_committables) {
  std::unordered_set<std::string> keep;
  for (const FileCommittable& c : restored_committables)
    keep.insert(c.upload_id);
  const int parallelism = std::max(ctx.parallelism(), 1);
  const int subtask = ctx.subtask_index();
  const std::string prefix = part_prefix(location_.key, std::nullopt);
  Result<std::vector<S3MultipartUpload>> uploads = client_->list_multipart_uploads(location_.bucket, prefix);
  if (!uploads.ok()) {
    throw_s3(fmt::format("listing the multipart uploads under s3://{}/{}", location_.bucket, prefix), uploads.error());
  }
  int64_t aborted = 0;
  for (const S3MultipartUpload& u : *uploads) {
    std::optional<std::string_view> name = name_under(location_.key, u.key);
    if (!name) continue;
    std::optional<PartFileName> p = parse_part_file_name(*name);
    if (!p || p->in_progress || p->subtask % parallelism != subtask || keep.contains(u.upload_id)) continue;
    Status s = client_->abort_multipart_upload(location_.bucket, u.key, u.upload_id);
    if (!s.ok()) throw_s3(fmt::format("aborting a lingering upload of s3://{}/{}", location_.bucket, u.key), s.error());
    ++aborted;
  }
  if (aborted > 0) {
    spdlog::info("file sink: subtask {} aborted {} multipart upload(s) that no checkpoint commits under s3://{}/{}",
                 subtask, aborted, location_.bucket, location_.key);
  }
}

}  // namespace sluice::detail
