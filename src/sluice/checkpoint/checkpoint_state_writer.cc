// FileCheckpointStorage::write_subtask_state: one subtask's state file, written and hashed (XXH3-64) to a local
// file (fsynced) or an S3 object, and the upload of new shared SST files of incremental snapshots.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <cctype>
#include <cerrno>
#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "checkpoint_storage_internals.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/data_io.h"
#include "sluice/core/s3_client.h"

namespace sluice {
namespace fs = std::filesystem;

namespace {

constexpr size_t kWriteBufferSize = 1 << 20;

// The uid as a file-name part: [A-Za-z0-9._-] kept, everything else '_', at most 64 characters.
std::string sanitize(std::string_view uid) {
  std::string s;
  for (char c : uid.substr(0, 64))
    s.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_');
  if (s.empty() || s[0] == '.') s.insert(s.begin(), '_');
  return s;
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

// The local copy of a state file (task-local recovery, task_local_state_store.h): written beside the primary as its
// bytes pass, into a temporary name renamed when the primary succeeded. Its failure (a full local disk) only drops
// the copy: the primary is what the checkpoint needs. Not fsynced: it serves restores after a process failure (the
// page cache survives it), and after a machine failure the checksum check refuses a partly written copy.
class LocalCopyFile {
 public:
  explicit LocalCopyFile(fs::path path) : path_(std::move(path)), temp_(path_.native() + ".inprogress") {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) drop(io_error("creating", temp_, errno));
  }
  LocalCopyFile(const LocalCopyFile&) = delete;
  LocalCopyFile& operator=(const LocalCopyFile&) = delete;
  ~LocalCopyFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      std::error_code ec;
      fs::remove(temp_, ec);
    }
  }

  void append(const void* data, size_t n) {
    if (fd_ < 0) return;
    if (buf_.size() + n > kWriteBufferSize) {
      flush();
      if (fd_ >= 0 && n >= kWriteBufferSize) {
        Status st = write_all(fd_, data, n, temp_);
        if (!st.ok()) drop(st.error());
        return;
      }
    }
    if (fd_ >= 0) buf_.write_bytes(data, n);
  }

  /// The primary is stored: the copy gets its final name. Returns whether a copy exists now.
  bool commit() {
    flush();
    if (fd_ < 0) return false;
    const int rc = ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    if (rc != 0) {
      fs::remove(temp_, ec);
      spdlog::warn("no local copy of state file {}: {}", path_.string(), io_error("closing", temp_, errno).message());
      return false;
    }
    fs::rename(temp_, path_, ec);
    if (ec) {
      spdlog::warn("no local copy of state file {}: {}", path_.string(), io_error("renaming", temp_, ec).message());
      fs::remove(temp_, ec);
      return false;
    }
    return true;
  }

 private:
  void flush() {
    if (fd_ < 0 || buf_.size() == 0) return;
    Status st = write_all(fd_, buf_.data(), buf_.size(), temp_);
    buf_.clear();
    if (!st.ok()) drop(st.error());
  }
  void drop(const Error& error) {
    spdlog::warn("no local copy of state file {} (the checkpoint goes on without it): {}", path_.string(),
                 error.message());
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
      std::error_code ec;
      fs::remove(temp_, ec);
    }
    buf_.clear();
  }

  fs::path path_;
  fs::path temp_;
  int fd_ = -1;
  DataOutput buf_;
};

// A state file writer (HashingFileWriter, HashingS3Writer) whose bytes also go to a local copy.
template <class Primary>
class WriterWithLocalCopy {
 public:
  WriterWithLocalCopy(Primary& primary, LocalCopyFile* copy) : primary_(primary), copy_(copy) {}
  Status append(const void* data, size_t n) {
    SLUICE_RETURN_IF_ERROR(primary_.append(data, n));
    if (copy_ != nullptr) copy_->append(data, n);
    return ok_status();
  }
  Status finish() { return primary_.finish(); }
  uint64_t size() const noexcept { return primary_.size(); }
  uint64_t digest() const noexcept { return primary_.digest(); }

 private:
  Primary& primary_;
  LocalCopyFile* copy_;
};

// Uploads the local SST file `path` into the job's shared directory `shared_dir` as `name` (fsynced file, or
// an S3 object), returning its size and XXH3-64.
Result<SharedStateFile> upload_shared_file(const fs::path& shared_dir, const std::string& name, const fs::path& path) {
  SharedStateFile shared;
  shared.name = name;
  uint64_t size = 0;
  if (is_s3(shared_dir)) {
    SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(shared_dir));
    HashingS3Writer writer(t.client, t.uri.bucket, t.child(name));
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
        SLUICE_ASSIGN_OR_RETURN(
            auto up, upload_shared_file(shared_dir, fmt::format("{}-{}-{}", name_prefix, random_hex(16), file), path));
        native.record_upload(file, up);
        uploaded += up.size;
        shared = std::move(up);
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

Result<OperatorSubtaskStateHandle> FileCheckpointStorage::write_subtask_state(
    const fs::path& dir, const std::string& uid, int subtask, const std::string& operator_state,
    const KeyedStateSnapshot* keyed, uint64_t* uploaded_bytes, const fs::path& local_copy_dir) const {
  OperatorSubtaskStateHandle handle;
  handle.subtask = subtask;
  // The local copy of a checkpoint's file (never a savepoint's), opened once the file's name is known.
  std::optional<LocalCopyFile> copy;
  const bool with_copy = !local_copy_dir.empty() && checkpoint_id_of(dir) >= 0;
  auto local_copy = [&]() -> LocalCopyFile* {
    if (!with_copy) return nullptr;
    copy.emplace(local_copy_dir / handle.file);
    return &*copy;
  };
  auto commit_copy = [&] {
    if (copy) copy->commit();
  };
  // Native (incremental) files only into checkpoints: savepoints stay canonical.
  bool native = keyed != nullptr && keyed->native() != nullptr && checkpoint_id_of(dir) >= 0;
  if (native) {
    // The asynchronous part of the native snapshot; when its files cannot be the captured state, the capture is
    // written canonically (write_key_group()) into this checkpoint instead.
    Result<bool> completed = keyed->native()->complete();
    if (!completed.ok()) {
      return completed.error().with_context(
          fmt::format("writing the state of operator '{}' subtask {}: the native snapshot", uid, subtask));
    }
    native = *completed;
  }
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
    WriterWithLocalCopy<HashingS3Writer> both(writer, local_copy());
    Status s = write_state_contents(both, handle, operator_state, keyed, shared, name_prefix, uploaded);
    report();
    if (!s.ok()) {
      writer.abort();
      return context(s.error());
    }
    commit_copy();
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
  WriterWithLocalCopy<HashingFileWriter> both(writer, local_copy());
  Status s = write_state_contents(both, handle, operator_state, keyed, shared, name_prefix, uploaded);
  report();
  if (!s.ok()) {
    std::error_code ec;
    fs::remove(path, ec);
    return context(s.error());
  }
  commit_copy();
  return handle;
}

}  // namespace sluice
