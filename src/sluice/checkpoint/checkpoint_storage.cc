#include "sluice/checkpoint/checkpoint_storage.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>
#include <utility>

#include "sluice/core/data_io.h"
#include "sluice/core/s3_client.h"

namespace sluice {
namespace fs = std::filesystem;

namespace {

constexpr char kStateFileMagic[4] = {'S', 'L', 'S', 'F'};
constexpr size_t kStateFileHeaderSize = sizeof(kStateFileMagic) + 1;  // magic + varint version (< 128)
constexpr size_t kWriteBufferSize = 1 << 20;
constexpr size_t kReadChunkSize = 1 << 20;
constexpr int kCreateAttempts = 16;

Error io_error(std::string_view what, const fs::path& path, int err) {
  return Error(ErrorCode::kCheckpoint, fmt::format("{} {}: {}", what, path.string(), std::strerror(err)));
}

Error io_error(std::string_view what, const fs::path& path, const std::error_code& ec) {
  return Error(ErrorCode::kCheckpoint, fmt::format("{} {}: {}", what, path.string(), ec.message()));
}

// `n` random lower-case hex digits. Only uniqueness matters (file and directory names), so each thread has
// its own generator seeded from the OS, the clock and the thread.
std::string random_hex(int n) {
  thread_local std::mt19937_64 rng = [] {
    std::random_device device;
    std::seed_seq seed{static_cast<uint64_t>(device()), static_cast<uint64_t>(device()),
                       static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
                       static_cast<uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()))};
    return std::mt19937_64(seed);
  }();
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(static_cast<size_t>(n), '0');
  for (char& c : s)
    c = kDigits[rng() & 0xf];
  return s;
}

// The uid as a file-name part: [A-Za-z0-9._-] kept, everything else '_', at most 64 characters.
std::string sanitize(std::string_view uid) {
  std::string s;
  for (char c : uid.substr(0, 64))
    s.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_');
  if (s.empty() || s[0] == '.') s.insert(s.begin(), '_');
  return s;
}

// Strips trailing separators so that filename() and parent_path() see the last component.
fs::path normalized(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) abs = p;
  abs = abs.lexically_normal();
  if (abs.filename().empty() && abs.has_parent_path() && abs != abs.root_path()) abs = abs.parent_path();
  return abs;
}

bool has_metadata(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kMetadataFileName, ec);
}

Status write_all(int fd, const void* data, size_t n, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("writing", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return ok_status();
}

Status fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("opening directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return io_error("fsyncing directory", dir, err);
  return ok_status();
}

// A new file written through a buffer and hashed on the way (XXH3-64 of every byte), then fsynced.
class HashingFileWriter {
 public:
  HashingFileWriter() : hash_(XXH3_createState()) {
    if (hash_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(hash_);
  }
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;
  ~HashingFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    XXH3_freeState(hash_);
  }

  /// Creates `path` exclusively; returns EEXIST as a distinguishable errno via `err`.
  Status create(const fs::path& path, int& err) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    err = fd_ < 0 ? errno : 0;
    if (fd_ < 0) return io_error("creating", path, err);
    return ok_status();
  }

  Status append(const void* data, size_t n) {
    XXH3_64bits_update(hash_, data, n);
    size_ += n;
    if (buf_.size() + n > kWriteBufferSize) {
      SLUICE_RETURN_IF_ERROR(flush());
      if (n >= kWriteBufferSize) return write_all(fd_, data, n, path_);
    }
    buf_.write_bytes(data, n);
    return ok_status();
  }

  Status finish() {
    SLUICE_RETURN_IF_ERROR(flush());
    if (::fsync(fd_) != 0) return io_error("fsyncing", path_, errno);
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return io_error("closing", path_, errno);
    return ok_status();
  }

  uint64_t size() const noexcept { return size_; }
  uint64_t digest() const noexcept { return XXH3_64bits_digest(hash_); }

 private:
  Status flush() {
    SLUICE_RETURN_IF_ERROR(write_all(fd_, buf_.data(), buf_.size(), path_));
    buf_.clear();
    return ok_status();
  }

  XXH3_state_t* hash_;
  fs::path path_;
  int fd_ = -1;
  DataOutput buf_;
  uint64_t size_ = 0;
};

Error state_file_error(const fs::path& path, const std::string& what) {
  return Error(ErrorCode::kState, fmt::format("state file {}: {}", path.string(), what));
}

// Checks a state file's hash and header against `handle` (its size was checked before).
Status check_state_file_contents(const fs::path& path, const OperatorSubtaskStateHandle& handle, uint64_t actual,
                                 std::string_view header) {
  if (actual != handle.checksum) {
    return state_file_error(
        path, fmt::format("checksum mismatch: expected {:016x} (from the metadata), actual {:016x} (the file "
                          "is corrupted)",
                          handle.checksum, actual));
  }
  if (header.size() < kStateFileHeaderSize || std::memcmp(header.data(), kStateFileMagic, sizeof(kStateFileMagic)) != 0)
    return state_file_error(path, "is not a Sluice state file (magic \"SLSF\" missing)");
  if (static_cast<uint8_t>(header[sizeof(kStateFileMagic)]) != kStateFileVersion) {
    return state_file_error(path,
                            fmt::format("format version {} is not supported (this Sluice reads version {})",
                                        static_cast<uint8_t>(header[sizeof(kStateFileMagic)]), kStateFileVersion));
  }
  return ok_status();
}

// Opens a state file and checks its size against `handle`; the fd is closed by `closer`.
Result<int> open_state_file(const fs::path& path, const OperatorSubtaskStateHandle& handle, uint64_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return state_file_error(path, "is missing (the checkpoint directory is incomplete)");
    return state_file_error(path, fmt::format("cannot be opened: {}", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Error e = state_file_error(path, fmt::format("cannot be read: {}", std::strerror(errno)));
    ::close(fd);
    return e;
  }
  size = static_cast<uint64_t>(st.st_size);
  if (size != handle.file_size) {
    ::close(fd);
    return state_file_error(
        path, fmt::format("{}: the metadata records {} bytes, the file has {} bytes",
                          size < handle.file_size ? "is truncated" : "has an unexpected size", handle.file_size, size));
  }
  return fd;
}

// Streams a state file through XXH3 and checks it against `handle`, keeping nothing.
Status check_state_file(const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  const fs::path path = dir / handle.file;
  uint64_t actual_size = 0;
  auto opened = open_state_file(path, handle, actual_size);
  if (!opened.ok()) return opened.error();
  int fd = *opened;
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> hash(XXH3_createState(), XXH3_freeState);
  if (hash == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(hash.get());
  std::string chunk(std::min<uint64_t>(kReadChunkSize, actual_size), '\0');
  uint64_t done = 0;
  char header[kStateFileHeaderSize] = {};
  while (done < actual_size) {
    size_t want = std::min<uint64_t>(chunk.size(), actual_size - done);
    ssize_t r = ::read(fd, chunk.data(), want);
    if (r < 0) {
      if (errno == EINTR) continue;
      return state_file_error(path, fmt::format("cannot be read: {}", std::strerror(errno)));
    }
    if (r == 0) {
      return state_file_error(
          path, fmt::format("is truncated: the metadata records {} bytes, read only {}", handle.file_size, done));
    }
    for (uint64_t i = done; i < kStateFileHeaderSize && i < done + static_cast<uint64_t>(r); ++i)
      header[i] = chunk[i - done];
    XXH3_64bits_update(hash.get(), chunk.data(), static_cast<size_t>(r));
    done += static_cast<uint64_t>(r);
  }
  return check_state_file_contents(path, handle, XXH3_64bits_digest(hash.get()),
                                   std::string_view(header, std::min<uint64_t>(actual_size, kStateFileHeaderSize)));
}

struct NumberedDir {
  int64_t id;
  fs::path path;
};

// The chk-<n> subdirectories of `dir`, ascending n; `complete` keeps only those with a _metadata.
Result<std::vector<NumberedDir>> list_checkpoint_dirs(const fs::path& dir, bool complete) {
  std::vector<NumberedDir> found;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return io_error("listing", dir, ec);
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    int64_t id = FileCheckpointStorage::checkpoint_id_of(it->path());
    std::error_code type_ec;
    if (id < 0 || !it->is_directory(type_ec)) continue;
    if (complete && !has_metadata(it->path())) continue;
    found.push_back({id, it->path()});
  }
  if (ec) return io_error("listing", dir, ec);
  std::sort(found.begin(), found.end(), [](const NumberedDir& a, const NumberedDir& b) { return a.id < b.id; });
  return found;
}

// --- object stores: a path is the text of an s3:// URI (see the header) ---

bool is_s3(const fs::path& p) {
  return is_s3_uri(p.native());
}

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

Result<S3Target> s3_target(const fs::path& p) {
  auto client = S3Client::shared();
  if (!client.ok()) return client.error();
  auto uri = S3Uri::parse(p.native());
  if (!uri.ok()) return uri.error();
  return S3Target{std::move(*client), std::move(*uri)};
}

// Writes through S3ObjectWriter, hashing every byte (XXH3-64) as HashingFileWriter does.
class HashingS3Writer {
 public:
  HashingS3Writer(std::shared_ptr<const S3Client> client, std::string bucket, std::string key)
      : writer_(std::move(client), std::move(bucket), std::move(key)), hash_(XXH3_createState()) {
    if (hash_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(hash_);
  }
  HashingS3Writer(const HashingS3Writer&) = delete;
  HashingS3Writer& operator=(const HashingS3Writer&) = delete;
  ~HashingS3Writer() { XXH3_freeState(hash_); }

  Status append(const void* data, size_t n) {
    XXH3_64bits_update(hash_, data, n);
    size_ += n;
    return writer_.append(data, n);
  }
  Status finish() { return writer_.finish(); }
  void abort() noexcept { writer_.abort(); }
  uint64_t size() const noexcept { return size_; }
  uint64_t digest() const noexcept { return XXH3_64bits_digest(hash_); }

 private:
  S3ObjectWriter writer_;
  XXH3_state_t* hash_;
  uint64_t size_ = 0;
};

// The chk-<n> "directories" under an s3:// job path, ascending n, with whether each has a _metadata object.
struct S3Checkpoint {
  int64_t id;
  fs::path path;
  bool complete;
};

Result<std::vector<S3Checkpoint>> s3_list_checkpoints(const fs::path& dir) {
  auto t = s3_target(dir);
  if (!t.ok()) return t.error();
  auto listing = t->client->list(t->uri.bucket, t->prefix());
  if (!listing.ok()) return listing.error();
  std::map<int64_t, bool> found;
  const std::string prefix = t->prefix();
  for (const S3Object& o : listing->objects) {
    std::string_view rest = std::string_view(o.key).substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos) continue;
    const int64_t id = FileCheckpointStorage::checkpoint_id_of(fs::path(std::string(rest.substr(0, slash))));
    if (id < 0) continue;
    found[id] = found[id] || rest.substr(slash + 1) == kMetadataFileName;
  }
  std::vector<S3Checkpoint> out;
  for (const auto& [id, complete] : found)
    out.push_back({id, fs::path(dir.native() + "/chk-" + std::to_string(id)), complete});
  return out;
}

// Downloads a state file and checks it against `handle` (size, XXH3-64, header).
Result<std::shared_ptr<const StateFileBytes>> s3_read_state_file(const fs::path& dir,
                                                                 const OperatorSubtaskStateHandle& handle) {
  const fs::path path = fs::path(dir.native() + "/" + handle.file);
  auto t = s3_target(dir);
  if (!t.ok()) return t.error();
  bool found = true;
  auto bytes = t->client->get_object(t->uri.bucket, t->child(handle.file), &found);
  if (!bytes.ok()) return state_file_error(path, fmt::format("cannot be read: {}", bytes.error().message()));
  if (!found) return state_file_error(path, "is missing (the checkpoint is incomplete)");
  if (bytes->size() != handle.file_size) {
    return state_file_error(path,
                            fmt::format("{}: the metadata records {} bytes, the object has {} bytes",
                                        bytes->size() < handle.file_size ? "is truncated" : "has an unexpected size",
                                        handle.file_size, bytes->size()));
  }
  SLUICE_RETURN_IF_ERROR(check_state_file_contents(path, handle, XXH3_64bits(bytes->data(), bytes->size()),
                                                   std::string_view(*bytes).substr(0, kStateFileHeaderSize)));
  return std::make_shared<const StateFileBytes>(std::move(*bytes));
}

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

// Uploads the local SST file `path` into the job's shared directory `shared_dir` as `name` (fsynced file, or
// an S3 object), returning its size and XXH3-64.
Result<SharedStateFile> upload_shared_file(const fs::path& shared_dir, const std::string& name, const fs::path& path) {
  SharedStateFile shared;
  shared.name = name;
  uint64_t size = 0;
  if (is_s3(shared_dir)) {
    auto t = s3_target(shared_dir);
    if (!t.ok()) return t.error();
    HashingS3Writer writer(t->client, t->uri.bucket, t->child(name));
    Status st = stream_local_file(path, size, [&](const char* data, size_t n) { return writer.append(data, n); });
    if (st.ok()) st = writer.finish();
    if (!st.ok()) {
      writer.abort();
      return st.error().with_context("uploading " + path.string() + " into " + shared_dir.string());
    }
    shared.size = writer.size();
    shared.checksum = writer.digest();
    return shared;
  }
  HashingFileWriter writer;
  const fs::path target = shared_dir / name;
  int err = 0;
  SLUICE_RETURN_IF_ERROR(writer.create(target, err));
  Status st = stream_local_file(path, size, [&](const char* data, size_t n) { return writer.append(data, n); });
  if (st.ok()) st = writer.finish();
  if (!st.ok()) {
    std::error_code ec;
    fs::remove(target, ec);
    return st.error().with_context("uploading " + path.string() + " into " + shared_dir.string());
  }
  shared.size = writer.size();
  shared.checksum = writer.digest();
  return shared;
}

// The native files of an incremental snapshot: SST files the backend uploaded before are referenced, new ones
// uploaded into `shared_dir`, the others (MANIFEST, CURRENT, OPTIONS) appended to the state file.
template <class Writer>
Status write_native_files(Writer& writer, OperatorSubtaskStateHandle& handle, const NativeKeyedStateSnapshot& native,
                          const fs::path& shared_dir, const std::string& name_prefix, uint64_t& uploaded) {
  NativeKeyedStateHandle& out = handle.native.emplace();
  out.key_group_start = native.key_group_range().start();
  out.key_group_end = native.key_group_range().end();
  for (const std::string& file : native.files()) {
    NativeFileHandle f;
    f.local_name = file;
    const fs::path path = native.directory() / file;
    if (NativeKeyedStateSnapshot::is_shared_file(file)) {
      std::optional<SharedStateFile> shared = native.uploaded_before(file);
      if (!shared) {
        auto up = upload_shared_file(shared_dir, fmt::format("{}-{}-{}", name_prefix, random_hex(16), file), path);
        if (!up.ok()) return up.error();
        native.record_upload(file, *up);
        uploaded += up->size;
        shared = std::move(*up);
      }
      f.shared_name = shared->name;
      f.size = shared->size;
      f.checksum = shared->checksum;
    } else {
      f.offset = writer.size();
      Status st = stream_local_file(path, f.size, [&](const char* data, size_t n) { return writer.append(data, n); });
      if (!st.ok()) return st;
    }
    out.files.push_back(std::move(f));
  }
  return ok_status();
}

// The state file's body (header, operator state, key groups, native files) through `writer` (HashingFileWriter
// or HashingS3Writer), filling the handle's offsets. `shared_dir` empty: no native files (a savepoint).
template <class Writer>
Status write_state_contents(Writer& writer, OperatorSubtaskStateHandle& handle, const std::string& operator_state,
                            const KeyedStateSnapshot* keyed, const fs::path& shared_dir, const std::string& name_prefix,
                            uint64_t& uploaded) {
  try {
    DataOutput header;
    header.write_bytes(kStateFileMagic, sizeof(kStateFileMagic));
    header.write_varint(kStateFileVersion);
    SLUICE_RETURN_IF_ERROR(writer.append(header.data(), header.size()));
    handle.operator_state_offset = writer.size();
    handle.operator_state_length = operator_state.size();
    SLUICE_RETURN_IF_ERROR(writer.append(operator_state.data(), operator_state.size()));
    if (keyed != nullptr) {
      const NativeKeyedStateSnapshot* native = shared_dir.empty() ? nullptr : keyed->native();
      const KeyGroupRange range = keyed->key_group_range();
      DataOutput bytes;
      for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
        bytes.clear();
        if (native != nullptr) {
          keyed->write_key_group_beside_native(KeyGroup{kg}, bytes);
        } else {
          keyed->write_key_group(KeyGroup{kg}, bytes);
        }
        if (bytes.size() == 0) continue;
        handle.key_groups.push_back(KeyGroupHandle{kg, writer.size(), bytes.size()});
        SLUICE_RETURN_IF_ERROR(writer.append(bytes.data(), bytes.size()));
      }
      if (native != nullptr) {
        SLUICE_RETURN_IF_ERROR(write_native_files(writer, handle, *native, shared_dir, name_prefix, uploaded));
      }
    }
    SLUICE_RETURN_IF_ERROR(writer.finish());
  } catch (const SluiceException& e) {
    return e.error();
  } catch (const std::exception& e) {
    return Error(ErrorCode::kState, fmt::format("the keyed state snapshot threw: {}", e.what()));
  }
  handle.file_size = writer.size();
  handle.checksum = writer.digest();
  return ok_status();
}

}  // namespace

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

Result<fs::path> FileCheckpointStorage::parse_location(std::string_view location) {
  auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!location.empty() && blank(location.front()))
    location.remove_prefix(1);
  while (!location.empty() && blank(location.back()))
    location.remove_suffix(1);
  if (location.empty()) {
    return Error(ErrorCode::kConfiguration,
                 "the checkpoint storage location is empty: pass file:///absolute/path or a plain path");
  }
  std::string_view path = location;
  if (is_s3_uri(location)) {
    auto uri = S3Uri::parse(location);
    if (!uri.ok()) return uri.error();
    return fs::path(uri->to_string());
  }
  if (size_t sep = location.find("://"); sep != std::string_view::npos) {
    std::string scheme(location.substr(0, sep));
    std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (scheme != "file") {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("unsupported storage scheme '{}' in '{}': Sluice stores checkpoints and savepoints "
                               "on a local or mounted file system or in S3 (s3://bucket/prefix); use "
                               "file:///absolute/path, a plain path or s3://bucket/prefix",
                               scheme, location));
    }
    path = location.substr(sep + 3);
    if (path.starts_with("localhost/")) path.remove_prefix(std::string_view("localhost").size());
    if (!path.starts_with('/')) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("file URI '{}' names a host or a relative path; write file:///absolute/path "
                               "(three slashes)",
                               location));
    }
  } else if (location.starts_with("file:/")) {
    path = location.substr(5);  // "file:/abs/path", as Java's File.toURI() writes it
  }
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(path), ec);
  if (ec) return Error(ErrorCode::kConfiguration, fmt::format("cannot resolve '{}': {}", location, ec.message()));
  return normalized(abs);
}

Result<FileCheckpointStorage> FileCheckpointStorage::create(std::string_view base_location, std::string job_id) {
  if (job_id.empty() || job_id == "." || job_id == ".." || job_id.find('/') != std::string::npos ||
      job_id.find('\0') != std::string::npos) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("job id '{}' cannot name a checkpoint directory (empty, '.', '..' or with '/')", job_id));
  }
  auto base = parse_location(base_location);
  if (!base.ok()) return base.error();
  if (is_s3(*base)) {
    auto client = S3Client::shared();  // a bad s3.* option fails here, at the job's start
    if (!client.ok()) return client.error();
    fs::path job_dir(base->native() + "/" + job_id);
    return FileCheckpointStorage(std::move(job_dir), std::move(job_id), std::make_shared<ObjectDeleter>());
  }
  fs::path job_dir = *base / job_id;
  std::error_code ec;
  fs::create_directories(job_dir / "shared", ec);
  if (ec) return io_error("creating the checkpoint directory", job_dir / "shared", ec);
  return FileCheckpointStorage(std::move(job_dir), std::move(job_id));
}

fs::path FileCheckpointStorage::checkpoint_dir(int64_t id) const {
  return job_dir_ / ("chk-" + std::to_string(id));
}

int64_t FileCheckpointStorage::checkpoint_id_of(const fs::path& dir) noexcept {
  fs::path p = dir;
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  constexpr std::string_view kPrefix = "chk-";
  if (name.size() <= kPrefix.size() || !std::string_view(name).starts_with(kPrefix)) return -1;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return -1;
  int64_t id = -1;
  auto [ptr, err] = std::from_chars(first, last, id);
  if (err != std::errc() || ptr != last) return -1;
  return id;
}

Result<fs::path> FileCheckpointStorage::init_checkpoint(int64_t id) const {
  if (id < 0) return Error(ErrorCode::kConfiguration, fmt::format("checkpoint id {} is negative", id));
  fs::path dir = checkpoint_dir(id);
  // On s3:// nothing to create, and nothing to check: this runs under the coordinator's lock, so it makes no
  // request. Ids only grow within a job id (a restored job has a new job id) and an aborted checkpoint's objects
  // are discarded, so chk-<id> of this job is empty; finalize_checkpoint() still refuses an existing _metadata.
  if (is_s3(dir)) return dir;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (has_metadata(dir)) {
      return Error(ErrorCode::kCheckpoint,
                   fmt::format("checkpoint directory {} already holds a completed checkpoint {}; checkpoint ids "
                               "must continue after the restored one",
                               dir.string(), id));
    }
    spdlog::warn("removing the incomplete checkpoint directory {} left by an earlier attempt", dir.string());
    fs::remove_all(dir, ec);
    if (ec) return io_error("removing the incomplete checkpoint directory", dir, ec);
  }
  fs::create_directories(dir, ec);
  if (ec) return io_error("creating the checkpoint directory", dir, ec);
  return dir;
}

Result<OperatorSubtaskStateHandle> FileCheckpointStorage::write_subtask_state(const fs::path& dir,
                                                                              const std::string& uid, int subtask,
                                                                              const std::string& operator_state,
                                                                              const KeyedStateSnapshot* keyed,
                                                                              uint64_t* uploaded_bytes) const {
  OperatorSubtaskStateHandle handle;
  handle.subtask = subtask;
  // Native (incremental) files only into checkpoints: savepoints stay canonical.
  const bool native = keyed != nullptr && keyed->native() != nullptr && checkpoint_id_of(dir) >= 0;
  const fs::path shared = !native      ? fs::path()
                          : is_s3(dir) ? fs::path(dir.parent_path().native() + "/shared")
                                       : dir.parent_path() / "shared";
  const std::string name_prefix = fmt::format("{}-{}", sanitize(uid), subtask);
  uint64_t uploaded = 0;
  auto report = [&] {
    if (uploaded_bytes != nullptr) *uploaded_bytes = uploaded;
  };
  auto context = [&](const Error& error) {
    return error.with_context(fmt::format("writing the state of operator '{}' subtask {}", uid, subtask));
  };
  if (is_s3(dir)) {
    // A random suffix of 16 hex digits: an object PUT never fails on an existing name, so uniqueness is by chance.
    handle.file = fmt::format("{}-{}-{}", sanitize(uid), subtask, random_hex(16));
    auto t = s3_target(dir);
    if (!t.ok()) return context(t.error());
    HashingS3Writer writer(t->client, t->uri.bucket, t->child(handle.file));
    Status s = write_state_contents(writer, handle, operator_state, keyed, shared, name_prefix, uploaded);
    report();
    if (!s.ok()) {
      writer.abort();
      return context(s.error());
    }
    return handle;
  }
  HashingFileWriter writer;
  fs::path path;
  for (int attempt = 0;; ++attempt) {
    handle.file = fmt::format("{}-{}-{}", sanitize(uid), subtask, random_hex(8));
    path = dir / handle.file;
    int err = 0;
    Status created = writer.create(path, err);
    if (created.ok()) break;
    if (err != EEXIST || attempt + 1 == kCreateAttempts) return created.error();
  }
  Status s = write_state_contents(writer, handle, operator_state, keyed, shared, name_prefix, uploaded);
  report();
  if (!s.ok()) {
    std::error_code ec;
    fs::remove(path, ec);
    return context(s.error());
  }
  return handle;
}

Status FileCheckpointStorage::finalize_checkpoint(const fs::path& dir, const CheckpointMetadata& metadata) const {
  if (is_s3(dir)) {
    auto t = s3_target(dir);
    if (!t.ok()) return t.error();
    auto there = t->client->exists(t->uri.bucket, t->child(kMetadataFileName));
    if (!there.ok()) return there.error();
    if (*there) {
      return Error(ErrorCode::kCheckpoint, fmt::format("{}/{} already exists: checkpoint {} was finalized before",
                                                       dir.string(), kMetadataFileName, metadata.checkpoint_id));
    }
    // One PUT: S3 makes an object visible whole or not at all, the rename of the file system case.
    return t->client->put_object(t->uri.bucket, t->child(kMetadataFileName), serialize_checkpoint_metadata(metadata));
  }
  const fs::path target = dir / kMetadataFileName;
  std::error_code ec;
  if (fs::exists(target, ec)) {
    return Error(ErrorCode::kCheckpoint, fmt::format("{} already exists: checkpoint {} was finalized before",
                                                     target.string(), metadata.checkpoint_id));
  }
  const std::string bytes = serialize_checkpoint_metadata(metadata);
  const fs::path temp = dir / fmt::format("{}.inprogress-{}", kMetadataFileName, random_hex(8));
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("creating", temp, errno);
  auto fail = [&](Error error) -> Error {
    if (fd >= 0) ::close(fd);
    std::error_code remove_ec;
    fs::remove(temp, remove_ec);
    return error;
  };
  Status s = write_all(fd, bytes.data(), bytes.size(), temp);
  if (!s.ok()) return fail(s.error());
  if (::fsync(fd) != 0) return fail(io_error("fsyncing", temp, errno));
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) return fail(io_error("closing", temp, errno));
  if (::rename(temp.c_str(), target.c_str()) != 0) return fail(io_error("renaming to", target, errno));
  SLUICE_RETURN_IF_ERROR(fsync_dir(dir));
  const fs::path abs = normalized(dir);
  if (abs.has_parent_path()) SLUICE_RETURN_IF_ERROR(fsync_dir(abs.parent_path()));
  return ok_status();
}

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
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
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

fs::path FileCheckpointStorage::shared_dir_of(const fs::path& checkpoint_dir) {
  if (is_s3(checkpoint_dir)) return fs::path(checkpoint_dir.parent_path().native() + "/shared");
  return normalized(checkpoint_dir).parent_path() / "shared";
}

namespace {

fs::path shared_path(const fs::path& checkpoint_dir, const std::string& name) {
  const fs::path shared = FileCheckpointStorage::shared_dir_of(checkpoint_dir);
  if (is_s3(shared)) return fs::path(shared.native() + "/" + name);
  return shared / name;
}

Error shared_file_error(const fs::path& path, const std::string& what) {
  return Error(ErrorCode::kState, fmt::format("shared state file {}: {}", path.string(), what));
}

}  // namespace

Status FileCheckpointStorage::verify_shared_file(const fs::path& checkpoint_dir, const NativeFileHandle& file) {
  const fs::path path = shared_path(checkpoint_dir, file.shared_name);
  if (is_s3(path)) {
    auto t = s3_target(path);
    if (!t.ok()) return t.error();
    auto there = t->client->exists(t->uri.bucket, t->uri.key);
    if (!there.ok()) return shared_file_error(path, "cannot be checked: " + there.error().message());
    if (!*there) return shared_file_error(path, "is missing (deleted while a checkpoint still references it?)");
    return ok_status();
  }
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> hash(XXH3_createState(), XXH3_freeState);
  if (hash == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(hash.get());
  uint64_t size = 0;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return shared_file_error(path, "is missing (deleted while a checkpoint still references it?)");
  Status st = stream_local_file(path, size, [&](const char* data, size_t n) {
    XXH3_64bits_update(hash.get(), data, n);
    return ok_status();
  });
  if (!st.ok()) return shared_file_error(path, st.error().message());
  if (size != file.size)
    return shared_file_error(path, fmt::format("the metadata records {} bytes, the file has {}", file.size, size));
  const uint64_t actual = XXH3_64bits_digest(hash.get());
  if (actual != file.checksum) {
    return shared_file_error(
        path,
        fmt::format("checksum mismatch: expected {:016x} (from the metadata), actual {:016x}", file.checksum, actual));
  }
  return ok_status();
}

Status FileCheckpointStorage::materialize_native(const fs::path& checkpoint_dir, const NativeKeyedStateHandle& native,
                                                 const StateFileBytes& state_file, const fs::path& target) {
  const std::string_view bytes = state_file.view();
  for (const NativeFileHandle& f : native.files) {
    const fs::path out = target / f.local_name;
    if (f.shared_name.empty()) {
      if (f.offset > bytes.size() || f.size > bytes.size() - f.offset)
        return Error(ErrorCode::kState, fmt::format("native file {} lies outside its state file", f.local_name));
      int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return io_error("creating", out, errno).with_context("restoring a rocksdb database");
      Status st = write_all(fd, bytes.data() + f.offset, f.size, out);
      ::close(fd);
      if (!st.ok()) return st;
      continue;
    }
    const fs::path from = shared_path(checkpoint_dir, f.shared_name);
    if (is_s3(from)) {
      auto t = s3_target(from);
      if (!t.ok()) return t.error();
      bool found = true;
      auto got = t->client->get_object(t->uri.bucket, t->uri.key, &found);
      if (!got.ok()) return shared_file_error(from, "cannot be read: " + got.error().message());
      if (!found) return shared_file_error(from, "is missing");
      if (got->size() != f.size)
        return shared_file_error(from,
                                 fmt::format("the metadata records {} bytes, the object has {}", f.size, got->size()));
      const uint64_t actual = XXH3_64bits(got->data(), got->size());
      if (actual != f.checksum)
        return shared_file_error(
            from, fmt::format("checksum mismatch: expected {:016x}, actual {:016x}", f.checksum, actual));
      int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return io_error("creating", out, errno);
      Status st = write_all(fd, got->data(), got->size(), out);
      ::close(fd);
      if (!st.ok()) return st;
      continue;
    }
    // Size and checksum here, where the file is used: a JobManager checks only that it exists with its size.
    SLUICE_RETURN_IF_ERROR(verify_shared_file(checkpoint_dir, f));
    std::error_code ec;
    // SST files are immutable and RocksDB only ever unlinks them: a hard link shares the bytes safely.
    fs::create_hard_link(from, out, ec);
    if (ec) {
      ec.clear();
      fs::copy_file(from, out, fs::copy_options::overwrite_existing, ec);
      if (ec) return shared_file_error(from, "cannot be copied to " + out.string() + ": " + ec.message());
    }
  }
  return ok_status();
}

Result<fs::path> FileCheckpointStorage::init_savepoint(std::string_view target_dir_uri, int64_t id) const {
  if (target_dir_uri.empty()) {
    return Error(ErrorCode::kConfiguration,
                 "no savepoint directory: set execution.checkpointing.savepoint-dir or pass a target directory");
  }
  auto target = parse_location(target_dir_uri);
  if (!target.ok()) return target.error().with_context("savepoint target");
  const std::string prefix = fmt::format("savepoint-{}-", std::string_view(job_id_).substr(0, 6));
  if (is_s3(*target)) {
    fs::path dir(target->native() + "/" + prefix + random_hex(12));
    spdlog::info("savepoint {} of job {} goes to {}", id, job_id_, dir.string());
    return dir;
  }
  std::error_code ec;
  fs::create_directories(*target, ec);
  if (ec) return io_error("creating the savepoint target directory", *target, ec);
  for (int attempt = 0; attempt < kCreateAttempts; ++attempt) {
    fs::path dir = *target / (prefix + random_hex(12));
    if (fs::create_directory(dir, ec)) {
      spdlog::info("savepoint {} of job {} goes to {}", id, job_id_, dir.string());
      return dir;
    }
    if (ec) return io_error("creating the savepoint directory", dir, ec);
  }
  return Error(ErrorCode::kCheckpoint,
               fmt::format("could not create a new savepoint directory in {}", target->string()));
}

Result<fs::path> FileCheckpointStorage::resolve_restore_path(std::string_view uri) {
  auto parsed = parse_location(uri);
  if (!parsed.ok()) return parsed.error().with_context("execution.state-recovery.path");
  const fs::path& p = *parsed;
  constexpr std::string_view kExpected =
      "expected a checkpoint or savepoint directory (with a _metadata file), a _metadata file, or a job "
      "directory with chk-<n> subdirectories";
  if (is_s3(p)) {
    if (p.filename() == kMetadataFileName) return p.parent_path();
    auto t = s3_target(p);
    if (!t.ok()) return t.error();
    auto there = t->client->exists(t->uri.bucket, t->child(kMetadataFileName));
    if (!there.ok()) return there.error().with_context("execution.state-recovery.path");
    if (*there) return p;
    auto all = s3_list_checkpoints(p);
    if (!all.ok()) return all.error().with_context("execution.state-recovery.path");
    for (auto it = all->rbegin(); it != all->rend(); ++it) {
      if (it->complete) return it->path;
    }
    return Error(ErrorCode::kCheckpoint,
                 fmt::format("restore path {} has no {} object and no chk-<n> prefix with one ({} chk-<n> prefixes "
                             "without one: incomplete checkpoints); {}",
                             p.string(), kMetadataFileName, all->size(), kExpected));
  }
  std::error_code ec;
  fs::file_status st = fs::status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return Error(ErrorCode::kCheckpoint, fmt::format("restore path {} cannot be read: {}", p.string(), ec.message()));
  }
  if (!fs::exists(st)) {
    return Error(ErrorCode::kCheckpoint, fmt::format("restore path {} does not exist ({})", p.string(), kExpected));
  }
  if (fs::is_regular_file(st)) {
    if (p.filename() == kMetadataFileName) return p.parent_path();
    return Error(ErrorCode::kCheckpoint, fmt::format("restore path {} is a file but not a {} file ({})", p.string(),
                                                     kMetadataFileName, kExpected));
  }
  if (!fs::is_directory(st)) {
    return Error(ErrorCode::kCheckpoint,
                 fmt::format("restore path {} is neither a file nor a directory ({})", p.string(), kExpected));
  }
  if (has_metadata(p)) return p;
  auto all = list_checkpoint_dirs(p, /*complete=*/false);
  if (!all.ok()) return all.error();
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    if (has_metadata(it->path)) return it->path;
  }
  return Error(ErrorCode::kCheckpoint,
               fmt::format("restore path {} has no {} file and no chk-<n> subdirectory with a {} file ({} "
                           "chk-<n> directories without one: incomplete checkpoints); {}",
                           p.string(), kMetadataFileName, kMetadataFileName, all->size(), kExpected));
}

Result<CheckpointMetadata> FileCheckpointStorage::load_metadata(const fs::path& dir) {
  if (is_s3(dir)) {
    const std::string path = dir.native() + "/" + std::string(kMetadataFileName);
    auto t = s3_target(dir);
    if (!t.ok()) return t.error();
    bool found = true;
    auto bytes = t->client->get_object(t->uri.bucket, t->child(kMetadataFileName), &found);
    if (!bytes.ok()) {
      return Error(ErrorCode::kState,
                   fmt::format("checkpoint metadata {}: cannot be read: {}", path, bytes.error().message()));
    }
    if (!found) {
      return Error(ErrorCode::kState,
                   fmt::format("checkpoint metadata {}: is missing (not a completed checkpoint or savepoint)", path));
    }
    return deserialize_checkpoint_metadata(*bytes, path);
  }
  const fs::path path = dir / kMetadataFileName;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return Error(ErrorCode::kState,
                 fmt::format("checkpoint metadata file {}: {}", path.string(),
                             err == ENOENT ? std::string("is missing (not a completed checkpoint or savepoint)")
                                           : fmt::format("cannot be opened: {}", std::strerror(err))));
  }
  std::string bytes;
  std::array<char, 64 * 1024> chunk;
  for (;;) {
    ssize_t r = ::read(fd, chunk.data(), chunk.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return Error(ErrorCode::kState,
                   fmt::format("checkpoint metadata file {}: cannot be read: {}", path.string(), std::strerror(err)));
    }
    if (r == 0) break;
    bytes.append(chunk.data(), static_cast<size_t>(r));
  }
  ::close(fd);
  return deserialize_checkpoint_metadata(bytes, path.string());
}

Result<std::vector<fs::path>> FileCheckpointStorage::completed_checkpoints() const {
  if (is_s3(job_dir_)) {
    auto all = s3_list_checkpoints(job_dir_);
    if (!all.ok()) return all.error();
    std::vector<fs::path> paths;
    for (S3Checkpoint& c : *all)
      if (c.complete) paths.push_back(std::move(c.path));
    return paths;
  }
  auto found = list_checkpoint_dirs(job_dir_, /*complete=*/true);
  if (!found.ok()) return found.error();
  std::vector<fs::path> paths;
  paths.reserve(found->size());
  for (NumberedDir& d : *found)
    paths.push_back(std::move(d.path));
  return paths;
}

Result<std::vector<FileCheckpointStorage::CheckpointDir>> FileCheckpointStorage::checkpoint_dirs() const {
  std::vector<CheckpointDir> out;
  if (is_s3(job_dir_)) {
    auto all = s3_list_checkpoints(job_dir_);
    if (!all.ok()) return all.error();
    for (S3Checkpoint& c : *all)
      out.push_back({c.id, std::move(c.path), c.complete});
    return out;
  }
  std::error_code ec;
  if (!fs::exists(job_dir_, ec)) return out;
  auto found = list_checkpoint_dirs(job_dir_, /*complete=*/false);
  if (!found.ok()) return found.error();
  for (NumberedDir& d : *found) {
    const bool complete = has_metadata(d.path);
    out.push_back({d.id, std::move(d.path), complete});
  }
  return out;
}

StateFileBytes::~StateFileBytes() {
  if (mapped_ && size_ > 0) ::munmap(const_cast<void*>(data_), size_);
}

Result<std::shared_ptr<const StateFileBytes>> FileCheckpointStorage::read_state_file(
    const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  if (is_s3(dir)) return s3_read_state_file(dir, handle);
  const fs::path path = dir / handle.file;
  uint64_t size = 0;
  auto opened = open_state_file(path, handle, size);
  if (!opened.ok()) return opened.error();
  int fd = *opened;
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  if (size == 0) {
    return check_state_file_contents(path, handle, XXH3_64bits(nullptr, 0), {}).error();
  }
  // MAP_POPULATE maps the whole file up front (from the page cache when warm) instead of taking a page
  // fault per 4 KiB during the checksum and the decoding.
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (data == MAP_FAILED) return state_file_error(path, fmt::format("cannot be mapped: {}", std::strerror(errno)));
  auto bytes = std::make_shared<const StateFileBytes>(data, size);
  std::string_view view = bytes->view();
  SLUICE_RETURN_IF_ERROR(check_state_file_contents(path, handle, XXH3_64bits(view.data(), view.size()),
                                                   view.substr(0, kStateFileHeaderSize)));
  return bytes;
}

Status FileCheckpointStorage::verify_state_file(const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  if (is_s3(dir)) {
    auto bytes = s3_read_state_file(dir, handle);
    return bytes.ok() ? ok_status() : Status(bytes.error());
  }
  return check_state_file(dir, handle);
}

namespace {

// The size of a file or object without reading it: a stat, or one HEAD request. nullopt when it does not exist.
Result<std::optional<uint64_t>> stored_size(const fs::path& path) {
  if (is_s3(path)) {
    auto t = s3_target(path);
    if (!t.ok()) return t.error();
    auto head = t->client->head_object(t->uri.bucket, t->uri.key);
    if (!head.ok()) return head.error();
    if (!*head) return std::optional<uint64_t>();
    return std::optional<uint64_t>(static_cast<uint64_t>((*head)->size));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<uint64_t>();
    return io_error("reading the size of", path, errno);
  }
  return std::optional<uint64_t>(static_cast<uint64_t>(st.st_size));
}

std::string size_mismatch(uint64_t expected, uint64_t actual) {
  return fmt::format("{}: the metadata records {} bytes, the stored file has {} bytes",
                     actual < expected ? "is truncated" : "has an unexpected size", expected, actual);
}

}  // namespace

Status FileCheckpointStorage::check_state_file_size(const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  const fs::path path = is_s3(dir) ? fs::path(dir.native() + "/" + handle.file) : dir / handle.file;
  auto size = stored_size(path);
  if (!size.ok()) return state_file_error(path, "cannot be checked: " + size.error().message());
  if (!*size) return state_file_error(path, "is missing (the checkpoint is incomplete)");
  if (**size != handle.file_size) return state_file_error(path, size_mismatch(handle.file_size, **size));
  return ok_status();
}

Status FileCheckpointStorage::check_shared_file_size(const fs::path& checkpoint_dir, const NativeFileHandle& file) {
  const fs::path path = shared_path(checkpoint_dir, file.shared_name);
  auto size = stored_size(path);
  if (!size.ok()) return shared_file_error(path, "cannot be checked: " + size.error().message());
  if (!*size) return shared_file_error(path, "is missing (deleted while a checkpoint still references it?)");
  if (**size != file.size) return shared_file_error(path, size_mismatch(file.size, **size));
  return ok_status();
}

}  // namespace sluice
