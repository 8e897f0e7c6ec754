// FileCheckpointStorage's reading side: state files read (mapped locally, downloaded from S3) and checked against
// their handles (size, XXH3-64, header), shared files verified and materialized for a native restore.
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <system_error>
#include <utility>

#include "checkpoint_storage_internals.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/s3_client.h"

namespace sluice {
namespace fs = std::filesystem;

namespace {

constexpr size_t kStateFileHeaderSize = sizeof(kStateFileMagic) + 1;  // magic + varint version (< 128)
// A state file larger than this is mapped without MAP_POPULATE and hashed in windows (read_state_file()).
constexpr uint64_t kPopulateLimit = 64 << 20;
constexpr size_t kHashWindow = 16 << 20;

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

// Maps the state file open as `fd` (`size` bytes, > 0) and checks it against `handle` (XXH3-64, header). The
// mapping outlives the fd.
Result<std::shared_ptr<const StateFileBytes>> map_state_file(const fs::path& path, int fd, uint64_t size,
                                                             const OperatorSubtaskStateHandle& handle) {
  // MAP_POPULATE maps a small file up front (from the page cache when warm) instead of taking a page fault per
  // 4 KiB during the checksum and the decoding. A large one is hashed window by window, each window's pages
  // dropped from the mapping behind the hash (they are clean file pages: a later read faults them in again),
  // so a state file larger than memory can be restored (a rocksdb backend decodes it key group by key group).
  const bool large = size > kPopulateLimit;
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | (large ? 0 : MAP_POPULATE), fd, 0);
  if (data == MAP_FAILED) return state_file_error(path, fmt::format("cannot be mapped: {}", std::strerror(errno)));
  auto bytes = std::make_shared<const StateFileBytes>(data, size);
  std::string_view view = bytes->view();
  uint64_t actual = 0;
  if (!large) {
    actual = XXH3_64bits(view.data(), view.size());
  } else {
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> hash(XXH3_createState(), XXH3_freeState);
    if (hash == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(hash.get());
    for (size_t at = 0; at < size; at += kHashWindow) {
      const size_t n = std::min(kHashWindow, size - at);
      char* window = static_cast<char*>(data) + at;
      ::madvise(window, n, MADV_WILLNEED);
      XXH3_64bits_update(hash.get(), window, n);
      ::madvise(window, n, MADV_DONTNEED);  // window is page-aligned (the mapping's start plus 16 MiB steps)
    }
    actual = XXH3_64bits_digest(hash.get());
  }
  SLUICE_RETURN_IF_ERROR(check_state_file_contents(path, handle, actual, view.substr(0, kStateFileHeaderSize)));
  return bytes;
}

// Streams a state file through XXH3 and checks it against `handle`, keeping nothing.
Status check_state_file(const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  const fs::path path = dir / handle.file;
  uint64_t actual_size = 0;
  SLUICE_ASSIGN_OR_RETURN(auto opened, open_state_file(path, handle, actual_size));
  int fd = opened;
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

// Downloads a state file and checks it against `handle` (size, XXH3-64, header).
Result<std::shared_ptr<const StateFileBytes>> s3_read_state_file(const fs::path& dir,
                                                                 const OperatorSubtaskStateHandle& handle) {
  const fs::path path = fs::path(dir.native() + "/" + handle.file);
  SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(dir));
  bool found = true;
  if (handle.file_size > kPopulateLimit) {
    // Too large to hold in memory (a savepoint of state larger than memory): downloaded into an unlinked file
    // under the temp directory and mapped as a local file, so only the pages in use are resident.
    const fs::path temp_dir = fs::temp_directory_path();
    std::string temp = (temp_dir / "sluice-state-XXXXXX").string();
    int fd = ::mkostemp(temp.data(), O_CLOEXEC);
    if (fd < 0) {
      return state_file_error(path, fmt::format("cannot be downloaded: no temporary file under {}: {}",
                                                temp_dir.string(), std::strerror(errno)));
    }
    ::unlink(temp.c_str());  // its blocks are freed when the mapping and the fd are gone
    struct statfs fs_info {};
    if (::fstatfs(fd, &fs_info) == 0 && fs_info.f_type == TMPFS_MAGIC) {
      spdlog::warn(
          "state file {} ({} bytes) is downloaded into {}, which is tmpfs: the file takes memory; set "
          "TMPDIR to a directory on disk",
          path.string(), handle.file_size, temp_dir.string());
    }
    std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
    auto written = t.client->get_object_to_file(t.uri.bucket, t.child(handle.file), fd, &found);
    if (!written.ok()) return state_file_error(path, fmt::format("cannot be read: {}", written.error().message()));
    if (!found) return state_file_error(path, "is missing (the checkpoint is incomplete)");
    if (*written != handle.file_size) {
      return state_file_error(path, fmt::format("{}: the metadata records {} bytes, the object has {} bytes",
                                                *written < handle.file_size ? "is truncated" : "has an unexpected size",
                                                handle.file_size, *written));
    }
    return map_state_file(path, fd, *written, handle);
  }
  auto bytes = t.client->get_object(t.uri.bucket, t.child(handle.file), &found);
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

fs::path shared_path(const fs::path& checkpoint_dir, const std::string& name) {
  const fs::path shared = FileCheckpointStorage::shared_dir_of(checkpoint_dir);
  if (is_s3(shared)) return fs::path(shared.native() + "/" + name);
  return shared / name;
}

Error shared_file_error(const fs::path& path, const std::string& what) {
  return Error(ErrorCode::kState, fmt::format("shared state file {}: {}", path.string(), what));
}

// The size of a file or object without reading it: a stat, or one HEAD request. nullopt when it does not exist.
Result<std::optional<uint64_t>> stored_size(const fs::path& path) {
  if (is_s3(path)) {
    SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(path));
    SLUICE_ASSIGN_OR_RETURN(auto head, t.client->head_object(t.uri.bucket, t.uri.key));
    if (!head) return std::optional<uint64_t>();
    return std::optional<uint64_t>(static_cast<uint64_t>(head->size));
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

Status FileCheckpointStorage::verify_shared_file(const fs::path& checkpoint_dir, const NativeFileHandle& file) {
  const fs::path path = shared_path(checkpoint_dir, file.shared_name);
  if (is_s3(path)) {
    SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(path));
    auto there = t.client->exists(t.uri.bucket, t.uri.key);
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
      SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(from));
      bool found = true;
      auto got = t.client->get_object(t.uri.bucket, t.uri.key, &found);
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

StateFileBytes::~StateFileBytes() {
  if (mapped_ && size_ > 0) ::munmap(const_cast<void*>(data_), size_);
}

Result<std::shared_ptr<const StateFileBytes>> FileCheckpointStorage::read_state_file(
    const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  if (is_s3(dir)) return s3_read_state_file(dir, handle);
  const fs::path path = dir / handle.file;
  uint64_t size = 0;
  SLUICE_ASSIGN_OR_RETURN(auto opened, open_state_file(path, handle, size));
  int fd = opened;
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  if (size == 0) {
    return check_state_file_contents(path, handle, XXH3_64bits(nullptr, 0), {}).error();
  }
  return map_state_file(path, fd, size, handle);
}

Status FileCheckpointStorage::verify_state_file(const fs::path& dir, const OperatorSubtaskStateHandle& handle) {
  if (is_s3(dir)) {
    auto bytes = s3_read_state_file(dir, handle);
    return bytes.ok() ? ok_status() : Status(bytes.error());
  }
  return check_state_file(dir, handle);
}

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
