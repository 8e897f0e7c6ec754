// Private to src/sluice/checkpoint/: what the files of FileCheckpointStorage share: the state file format's
// constants, the I/O errors, s3:// targets, streaming a local file, and the ObjectDeleter of discarded s3://
// prefixes. checkpoint_storage.cc holds the layout, metadata and restore paths (and the shared helpers'
// definitions), checkpoint_state_writer.cc writes state files (local and S3, shared SST uploads),
// checkpoint_state_reader.cc reads and verifies them, checkpoint_discard.cc discards checkpoints. Not installed;
// checkpoint_storage.h describes the layout.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/core/s3_client.h"

namespace sluice {
namespace fs = std::filesystem;

namespace checkpoint_storage_internal {

constexpr char kStateFileMagic[4] = {'S', 'L', 'S', 'F'};

constexpr size_t kReadChunkSize = 1 << 20;

constexpr int kCreateAttempts = 16;

Error io_error(std::string_view what, const fs::path& path, int err);

Error io_error(std::string_view what, const fs::path& path, const std::error_code& ec);

// `n` random lower-case hex digits. Only uniqueness matters (file and directory names), so each thread has
// its own generator seeded from the OS, the clock and the thread.
std::string random_hex(int n);

// Strips trailing separators so that filename() and parent_path() see the last component.
fs::path normalized(const fs::path& p);

bool has_metadata(const fs::path& dir);

Status write_all(int fd, const void* data, size_t n, const fs::path& path);

// --- object stores: a path is the text of an s3:// URI (see the header) ---

bool is_s3(const fs::path& p);

// The client and the bucket/key of an s3:// path.
struct S3Target {
  std::shared_ptr<const S3Client> client;
  S3Uri uri;
  // The key of `name` inside this "directory".
  std::string child(std::string_view name) const {
    return uri.key.empty() ? std::string(name) : uri.key + "/" + std::string(name);
  }
  std::string prefix() const { return uri.key.empty() ? std::string() : uri.key + "/"; }
};

Result<S3Target> s3_target(const fs::path& p);

// Streams the local file `path` through `sink(data, n)` in chunks; kCheckpoint naming the file on errors.
template <class Sink>
Status stream_local_file(const fs::path& path, uint64_t& size, Sink sink) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("opening", path, errno);
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  std::string chunk(kReadChunkSize, '\0');
  size = 0;
  for (;;) {
    ssize_t r = ::read(fd, chunk.data(), chunk.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error("reading", path, errno);
    }
    if (r == 0) break;
    SLUICE_RETURN_IF_ERROR(sink(chunk.data(), static_cast<size_t>(r)));
    size += static_cast<uint64_t>(r);
  }
  return ok_status();
}

}  // namespace checkpoint_storage_internal

using checkpoint_storage_internal::has_metadata;
using checkpoint_storage_internal::io_error;
using checkpoint_storage_internal::is_s3;
using checkpoint_storage_internal::kCreateAttempts;
using checkpoint_storage_internal::kReadChunkSize;
using checkpoint_storage_internal::kStateFileMagic;
using checkpoint_storage_internal::normalized;
using checkpoint_storage_internal::random_hex;
using checkpoint_storage_internal::s3_target;
using checkpoint_storage_internal::S3Target;
using checkpoint_storage_internal::stream_local_file;
using checkpoint_storage_internal::write_all;

// Deletes discarded s3:// prefixes one after the other on its own thread; the destructor finishes the queue (each
// deletion bounded by the client's retries) and joins.
class FileCheckpointStorage::ObjectDeleter {
 public:
  ObjectDeleter() : thread_([this] { run(); }) {}
  ~ObjectDeleter() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  ObjectDeleter(const ObjectDeleter&) = delete;
  ObjectDeleter& operator=(const ObjectDeleter&) = delete;

  void enqueue(fs::path dir) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back({std::move(dir), false});
    }
    cv_.notify_all();
  }
  /// Deletes the one object `path` (a shared file).
  void enqueue_object(fs::path path) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back({std::move(path), true});
    }
    cv_.notify_all();
  }

 private:
  void run() {
    pthread_setname_np(pthread_self(), "sluice-s3-del");
    for (;;) {
      fs::path dir;
      bool object = false;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        dir = std::move(queue_.front().first);
        object = queue_.front().second;
        queue_.pop_front();
      }
      auto t = s3_target(dir);
      if (object) {
        Status st = t.ok() ? t->client->delete_object(t->uri.bucket, t->uri.key) : Status(t.error());
        if (!st.ok())
          spdlog::warn("deleting the shared file {} failed (it stays): {}", dir.string(), st.error().to_string());
        continue;
      }
      if (t.ok() && dir.filename().string().starts_with("savepoint-")) {
        auto completed = t->client->exists(t->uri.bucket, t->child(kMetadataFileName));
        if (!completed.ok() || *completed) {
          spdlog::error("not discarding {}: it is a completed savepoint, or its _metadata cannot be checked{}",
                        dir.string(), completed.ok() ? "" : ": " + completed.error().to_string());
          continue;
        }
      }
      Result<int64_t> deleted = t.ok() ? t->client->delete_prefix(t->uri.bucket, t->prefix()) : t.error();
      if (!deleted.ok()) {
        spdlog::warn("discarding {} failed (its objects stay in the bucket): {}", dir.string(),
                     deleted.error().to_string());
      } else {
        spdlog::debug("discarded {} ({} objects)", dir.string(), *deleted);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<fs::path, bool>> queue_;  // path, single object
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sluice
