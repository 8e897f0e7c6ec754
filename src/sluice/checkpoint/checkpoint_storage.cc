// FileCheckpointStorage: locations (local paths and s3:// URIs), the job's chk-<n> and savepoint directories,
// _metadata (finalize, load), restore paths and the listing of completed checkpoints. Writing, reading and
// discarding are in the other checkpoint_*.cc files (checkpoint_storage_internals.h lists them).
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

#include "checkpoint_storage_internals.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/data_io.h"
#include "sluice/core/s3_client.h"

namespace sluice {
namespace fs = std::filesystem;

namespace checkpoint_storage_internal {

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

// --- object stores: a path is the text of an s3:// URI (see the header) ---

bool is_s3(const fs::path& p) {
  return is_s3_uri(p.native());
}

Result<S3Target> s3_target(const fs::path& p) {
  SLUICE_ASSIGN_OR_RETURN(auto client, S3Client::shared());
  SLUICE_ASSIGN_OR_RETURN(auto uri, S3Uri::parse(p.native()));
  return S3Target{std::move(client), std::move(uri)};
}

}  // namespace checkpoint_storage_internal

namespace {

Status fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("opening directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return io_error("fsyncing directory", dir, err);
  return ok_status();
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

// The chk-<n> "directories" under an s3:// job path, ascending n, with whether each has a _metadata object.
struct S3Checkpoint {
  int64_t id;
  fs::path path;
  bool complete;
};

Result<std::vector<S3Checkpoint>> s3_list_checkpoints(const fs::path& dir) {
  SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(dir));
  SLUICE_ASSIGN_OR_RETURN(auto listing, t.client->list(t.uri.bucket, t.prefix()));
  std::map<int64_t, bool> found;
  const std::string prefix = t.prefix();
  for (const S3Object& o : listing.objects) {
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

}  // namespace

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
    SLUICE_ASSIGN_OR_RETURN(auto uri, S3Uri::parse(location));
    return fs::path(uri.to_string());
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
  if (!is_plain_file_name(job_id)) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("job id '{}' cannot name a checkpoint directory (empty, '.', '..' or with '/')", job_id));
  }
  SLUICE_ASSIGN_OR_RETURN(auto base, parse_location(base_location));
  if (is_s3(base)) {
    auto client = S3Client::shared();  // a bad s3.* option fails here, at the job's start
    if (!client.ok()) return client.error();
    fs::path job_dir(base.native() + "/" + job_id);
    return FileCheckpointStorage(std::move(job_dir), std::move(job_id), std::make_shared<ObjectDeleter>());
  }
  fs::path job_dir = base / job_id;
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

Status FileCheckpointStorage::finalize_checkpoint(const fs::path& dir, const CheckpointMetadata& metadata) const {
  if (is_s3(dir)) {
    SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(dir));
    SLUICE_ASSIGN_OR_RETURN(auto there, t.client->exists(t.uri.bucket, t.child(kMetadataFileName)));
    if (there) {
      return Error(ErrorCode::kCheckpoint, fmt::format("{}/{} already exists: checkpoint {} was finalized before",
                                                       dir.string(), kMetadataFileName, metadata.checkpoint_id));
    }
    // One PUT: S3 makes an object visible whole or not at all, the rename of the file system case.
    return t.client->put_object(t.uri.bucket, t.child(kMetadataFileName), serialize_checkpoint_metadata(metadata));
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

fs::path FileCheckpointStorage::shared_dir_of(const fs::path& checkpoint_dir) {
  if (is_s3(checkpoint_dir)) return fs::path(checkpoint_dir.parent_path().native() + "/shared");
  return normalized(checkpoint_dir).parent_path() / "shared";
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
    SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(p));
    auto there = t.client->exists(t.uri.bucket, t.child(kMetadataFileName));
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
  SLUICE_ASSIGN_OR_RETURN(auto all, list_checkpoint_dirs(p, /*complete=*/false));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (has_metadata(it->path)) return it->path;
  }
  return Error(ErrorCode::kCheckpoint,
               fmt::format("restore path {} has no {} file and no chk-<n> subdirectory with a {} file ({} "
                           "chk-<n> directories without one: incomplete checkpoints); {}",
                           p.string(), kMetadataFileName, kMetadataFileName, all.size(), kExpected));
}

Result<CheckpointMetadata> FileCheckpointStorage::load_metadata(const fs::path& dir) {
  if (is_s3(dir)) {
    const std::string path = dir.native() + "/" + std::string(kMetadataFileName);
    SLUICE_ASSIGN_OR_RETURN(auto t, s3_target(dir));
    bool found = true;
    auto bytes = t.client->get_object(t.uri.bucket, t.child(kMetadataFileName), &found);
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
    SLUICE_ASSIGN_OR_RETURN(auto all, s3_list_checkpoints(job_dir_));
    std::vector<fs::path> paths;
    for (S3Checkpoint& c : all)
      if (c.complete) paths.push_back(std::move(c.path));
    return paths;
  }
  SLUICE_ASSIGN_OR_RETURN(auto found, list_checkpoint_dirs(job_dir_, /*complete=*/true));
  std::vector<fs::path> paths;
  paths.reserve(found.size());
  for (NumberedDir& d : found)
    paths.push_back(std::move(d.path));
  return paths;
}

Result<std::vector<FileCheckpointStorage::CheckpointDir>> FileCheckpointStorage::checkpoint_dirs() const {
  std::vector<CheckpointDir> out;
  if (is_s3(job_dir_)) {
    SLUICE_ASSIGN_OR_RETURN(auto all, s3_list_checkpoints(job_dir_));
    for (S3Checkpoint& c : all)
      out.push_back({c.id, std::move(c.path), c.complete});
    return out;
  }
  std::error_code ec;
  if (!fs::exists(job_dir_, ec)) return out;
  SLUICE_ASSIGN_OR_RETURN(auto found, list_checkpoint_dirs(job_dir_, /*complete=*/false));
  for (NumberedDir& d : found) {
    const bool complete = has_metadata(d.path);
    out.push_back({d.id, std::move(d.path), complete});
  }
  return out;
}

}  // namespace sluice
