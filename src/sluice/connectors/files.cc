#include "sluice/connectors/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <system_error>
#include <unordered_set>

#include "sluice/core/assign_or_return.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {

namespace {

[[noreturn]] void throw_io(std::string_view who, std::string_view what, std::string_view path, int err) {
  throw SluiceException(
      Error(ErrorCode::kConnector, fmt::format("{}: {} '{}' failed: {}", who, what, path, std::strerror(err))));
}

bool has_glob_magic(std::string_view pattern) noexcept {
  return pattern.find_first_of("*?[") != std::string_view::npos;
}

// Appends the regular files directly inside `dir` whose names do not start with '.', sorted by name. Returns a
// kConnector error when the directory cannot be listed.
Status list_directory(const std::string& dir, std::vector<std::string>& out) {
  std::error_code ec;
  std::vector<std::string> found;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    // Hidden files are not data: a FileSink's in-progress files start with '.'.
    if (it->path().filename().string().starts_with('.')) continue;
    if (it->is_regular_file(type_ec)) found.push_back(it->path().string());
  }
  if (ec) {
    return Error(ErrorCode::kConnector, fmt::format("file source: cannot list directory '{}': {}", dir, ec.message()));
  }
  std::sort(found.begin(), found.end());
  out.insert(out.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
  return ok_status();
}

// Expands a glob(3) pattern into its sorted matches. Returns a kConnector error naming the pattern when
// nothing matches or a directory cannot be read.
Result<std::vector<std::string>> glob_pattern(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> matches;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i)
      matches.emplace_back(g.gl_pathv[i]);
  }
  const int err = errno;
  globfree(&g);
  switch (rc) {
    case 0:
      return matches;
    case GLOB_NOMATCH:
      return Error(
          ErrorCode::kConnector,
          fmt::format("file source: no file matches the pattern '{}'; check the path and the pattern", pattern));
    case GLOB_ABORTED:
      return Error(ErrorCode::kConnector, fmt::format("file source: reading a directory for the pattern '{}' "
                                                      "failed: {}",
                                                      pattern, std::strerror(err)));
    default:
      return Error(ErrorCode::kConnector, fmt::format("file source: expanding the pattern '{}' failed", pattern));
  }
}

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t max) noexcept {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80)
    --cut;
  return s.substr(0, cut);
}

}  // namespace

LineFormat<std::string> text_lines_format() {
  return LineFormat<std::string>{"text lines", false, [](std::string_view line, std::string& out) {
                                   out.assign(line);
                                   return ok_status();
                                 }};
}

namespace detail {

Result<std::vector<std::string>> expand_file_paths(const std::vector<std::string>& patterns) {
  if (patterns.empty()) {
    return Error(ErrorCode::kConfiguration, "file source: no paths given; pass files, directories or glob patterns");
  }
  std::vector<std::string> files;
  std::unordered_set<std::string> seen;
  for (const std::string& pattern : patterns) {
    const bool is_glob = has_glob_magic(pattern);
    std::vector<std::string> candidates;
    if (is_glob) {
      SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> matches, glob_pattern(pattern));
      candidates = std::move(matches);
    } else {
      candidates.push_back(pattern);
    }
    std::vector<std::string> found;
    for (const std::string& c : candidates) {
      struct stat st {};
      if (::stat(c.c_str(), &st) != 0) {
        return Error(ErrorCode::kConnector,
                     fmt::format("file source: cannot read '{}'{}: {}", c,
                                 is_glob ? fmt::format(" (matched by '{}')", pattern) : "", std::strerror(errno)));
      }
      if (S_ISDIR(st.st_mode)) {
        SLUICE_RETURN_IF_ERROR(list_directory(c, found));
      } else if (S_ISREG(st.st_mode)) {
        found.push_back(c);
      } else if (!is_glob) {
        return Error(ErrorCode::kConnector,
                     fmt::format("file source: '{}' is neither a regular file nor a directory", c));
      }
    }
    if (found.empty()) {
      return Error(ErrorCode::kConnector,
                   fmt::format("file source: '{}' yields no regular file to read (an empty directory, or only "
                               "special files match)",
                               pattern));
    }
    for (std::string& f : found) {
      if (seen.insert(f).second) files.push_back(std::move(f));
    }
  }
  return files;
}

bool is_blank_line(std::string_view line) noexcept {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// ---------------------------------------------------------------------------------------------------------
// LineReader

LineReader::~LineReader() {
  close();
}

void LineReader::open(const std::string& path, int64_t offset) {
  close();
  path_ = path;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_io("file source", "opening", path, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_io("file source", "reading the size of", path, errno);
  if (offset > st.st_size) {
    throw SluiceException(
        Error(ErrorCode::kConnector,
              fmt::format("file source: '{}' has {} bytes, fewer than the offset {} where reading resumes: the file "
                          "was truncated or replaced since the checkpoint",
                          path, static_cast<int64_t>(st.st_size), offset)));
  }
  if (offset > 0 && ::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) {
    throw_io("file source", "seeking in", path, errno);
  }
  eof_ = false;
  begin_ = end_ = scan_ = 0;
  if (buf_.size() < kChunkBytes) buf_.resize(kChunkBytes);
}

void LineReader::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  begin_ = end_ = scan_ = 0;
  // A buffer grown for a long line shrinks back, so one long line does not pin its memory.
  if (buf_.size() > kChunkBytes) {
    buf_.resize(kChunkBytes);
    buf_.shrink_to_fit();
  }
}

bool LineReader::fill() {
  if (eof_) return false;
  if (begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    scan_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
  for (;;) {
    const ssize_t n = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("file source", "reading", path_, errno);
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    end_ += static_cast<size_t>(n);
    return true;
  }
}

int64_t LineReader::skip_rest_of_line() {
  int64_t skipped = static_cast<int64_t>(end_ - begin_);
  begin_ = end_ = scan_ = 0;
  while (fill()) {
    const void* nl = std::memchr(buf_.data(), '\n', end_);
    if (nl != nullptr) {
      const size_t pos = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data());
      skipped += static_cast<int64_t>(pos + 1);
      begin_ = scan_ = pos + 1;
      return skipped;
    }
    skipped += static_cast<int64_t>(end_);
    begin_ = end_ = scan_ = 0;
  }
  return skipped;
}

bool LineReader::next(Line& line) {
  line.too_long = false;
  for (;;) {
    if (scan_ < end_) {
      const void* nl = std::memchr(buf_.data() + scan_, '\n', end_ - scan_);
      if (nl != nullptr) {
        const size_t pos = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data());
        size_t len = pos - begin_;
        line.bytes = static_cast<int64_t>(len + 1);
        if (len > 0 && buf_[pos - 1] == '\r') --len;
        if (len > max_line_bytes_) {
          long_line_head_.assign(buf_.data() + begin_, std::min(len, kLongLineHeadBytes));
          line.text = long_line_head_;
          line.too_long = true;
        } else {
          line.text = std::string_view(buf_.data() + begin_, len);
        }
        begin_ = scan_ = pos + 1;
        return true;
      }
      scan_ = end_;
    }
    // No '\n' in [begin_, end_). One byte more than the limit may still be the '\r' of "\r\n".
    if (end_ - begin_ > max_line_bytes_ + 1) {
      long_line_head_.assign(buf_.data() + begin_, std::min(end_ - begin_, kLongLineHeadBytes));
      line.bytes = skip_rest_of_line();
      line.text = long_line_head_;
      line.too_long = true;
      return true;
    }
    if (!fill()) {
      if (begin_ == end_) return false;
      // The last line has no newline.
      const size_t len = end_ - begin_;
      line.bytes = static_cast<int64_t>(len);
      if (len > max_line_bytes_) {
        long_line_head_.assign(buf_.data() + begin_, std::min(len, kLongLineHeadBytes));
        line.text = long_line_head_;
        line.too_long = true;
      } else {
        line.text = std::string_view(buf_.data() + begin_, len);
      }
      begin_ = scan_ = end_;
      return true;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Bad lines

Error bad_line_error(std::string_view format_name, std::string_view path, int64_t line, int64_t offset,
                     std::string_view raw, std::string_view reason) {
  constexpr size_t kExcerptBytes = 80;
  std::string excerpt;
  const std::string_view head = utf8_prefix(raw, kExcerptBytes);
  append_json_string(head, excerpt);
  if (head.size() < raw.size()) excerpt += "...";
  // A restart reads the same line again and fails the same way: restarting would loop for ever (the default
  // restart strategy never gives up), so the job fails at once naming the line.
  return mark_non_recoverable(
      Error(ErrorCode::kConnector,
            fmt::format("file source: bad record in '{}' at line {} (byte offset {}), read as {}: {}; the line "
                        "starts with {}. Fix the input, or divert bad lines to a dead-letter file with "
                        "on_bad_record(BadRecordPolicy::kDeadLetter, path) (in a pipeline file: set "
                        "pipeline.dead-letter)",
                        path, line, offset, format_name, reason, excerpt)),
      "a restart reads the same line again");
}

Value bad_line_entry(std::string_view path, int64_t line, int64_t offset, std::string_view raw, std::string_view reason,
                     std::string_view reason_code) {
  Value entry = Value::object({{"source", Value("file")},
                               {"path", Value(path)},
                               {"line", Value(line)},
                               {"offset", Value(offset)},
                               {"reason", Value(reason_code)},
                               {"error", Value(reason)},
                               {"record", Value(raw)}});
  // JSON strings hold UTF-8 text only: keep the exact bytes of a line that is not valid UTF-8.
  if (!simdjson::validate_utf8(raw.data(), raw.size())) entry.set("record_base64", Value::bytes(raw));
  return entry;
}

void log_first_dead_letter(std::string_view path, int64_t line, const std::string& dead_letter_path) {
  spdlog::warn(
      "file source: line {} of '{}' could not be read and went to the dead-letter file '{}'; further bad lines "
      "of this reader go there without a log line (count: BadRecordStats::bad_records)",
      line, path, dead_letter_path);
}

// ---------------------------------------------------------------------------------------------------------
// Sink files

void create_output_directory(const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  // Several subtasks create the same directory at once: losing that race is not an error.
  if (ec && !std::filesystem::is_directory(directory)) {
    throw SluiceException(Error(ErrorCode::kConnector,
                                fmt::format("file sink: cannot create directory '{}': {}", directory, ec.message())));
  }
}

std::string part_file_path(const std::string& directory, int subtask, std::string_view extension) {
  return (std::filesystem::path(directory) / fmt::format("part-{}.{}", subtask, extension)).string();
}

PartFileWriter::~PartFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void PartFileWriter::open(std::string path, bool truncate) {
  path_ = std::move(path);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : O_APPEND), 0644);
  if (fd_ < 0) throw_io("file sink", "opening", path_, errno);
  buf_.reserve(kBufferBytes + kBufferBytes / 4);
}

void PartFileWriter::write_buffer() {
  const char* p = buf_.data();
  size_t left = buf_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("file sink", "writing", path_, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  buf_.clear();
}

void PartFileWriter::flush_and_sync() {
  if (fd_ < 0) return;
  checked_write_buffer();
  if (::fsync(fd_) != 0) throw_io("file sink", "syncing", path_, errno);
}

void PartFileWriter::close() {
  if (fd_ < 0) return;
  // A cancelled or stale task writes nothing more (Flink's cancel never calls finish()): its JobManager may have
  // given its work to another attempt already (a TaskManager declared lost and woken up, a failover), whose
  // output this buffer would land in. Whatever was flushed before stays; the buffer (at most kBufferBytes, records
  // since the last write) is dropped, as a restart replays them anyway.
  if (current_task_cancelled()) {
    discard();
    return;
  }
  write_buffer();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_io("file sink", "closing", path_, errno);
}

void PartFileWriter::discard() noexcept {
  buf_.clear();
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
}

// ---------------------------------------------------------------------------------------------------------
// Part files with checkpointing (exactly-once by rename on commit)

namespace {

// Parses a non-negative decimal integer at the start of `s` and removes it; false when there is none.
template <class Int>
bool consume_number(std::string_view& s, Int& out) noexcept {
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  if (ec != std::errc() || ptr == s.data() || out < 0) return false;
  s.remove_prefix(static_cast<size_t>(ptr - s.data()));
  return true;
}

// Calls fn(name) for each entry of `directory`; nothing when it does not exist. Throws kConnector when it
// cannot be listed.
template <class Fn>
void for_each_name_in(const std::string& directory, Fn&& fn) {
  std::error_code ec;
  std::filesystem::directory_iterator it(directory, ec), end;
  if (ec == std::errc::no_such_file_or_directory) return;
  for (; !ec && it != end; it.increment(ec))
    fn(it->path().filename().string());
  if (ec) {
    throw SluiceException(Error(ErrorCode::kConnector,
                                fmt::format("file sink: cannot list directory '{}': {}", directory, ec.message())));
  }
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io("file sink", "opening the directory", directory, errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw_io("file sink", "syncing the directory", directory, err);
  }
  ::close(fd);
}

std::string parent_directory(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

// The in-progress file of `c` is gone: it was committed before (its rename happened, then a crash came before
// the checkpoint's commit was done), or it is lost. A lost file is lost output: fail the job rather than count it
// as committed.
void check_already_committed(const FileCommittable& c) {
  struct stat st {};
  if (::stat(c.final_path.c_str(), &st) == 0) return;
  if (errno != ENOENT) throw_io("file sink", "reading the status of", c.final_path, errno);
  throw SluiceException(Error(
      ErrorCode::kConnector,
      fmt::format("file sink: the pre-committed part file '{}' is missing and its final file '{}' does not exist "
                  "either: its records are lost (the file was deleted, or the file system lost it in a crash). If "
                  "a consumer moves committed files away, restore from a checkpoint taken after this one or start "
                  "the job without its state",
                  c.in_progress_path, c.final_path)));
}

}  // namespace

std::string part_file_path(const std::string& directory, int subtask, int64_t sequence, std::string_view extension) {
  return (std::filesystem::path(directory) / fmt::format("part-{}-{}.{}", subtask, sequence, extension)).string();
}

std::string in_progress_file_path(const std::string& directory, int subtask, int64_t sequence) {
  return (std::filesystem::path(directory) / fmt::format(".part-{}-{}.inprogress", subtask, sequence)).string();
}

std::string in_progress_file_path(const std::string& directory, int subtask, int64_t sequence,
                                  std::string_view file_id) {
  return (std::filesystem::path(directory) / fmt::format(".part-{}-{}.inprogress.{}", subtask, sequence, file_id))
      .string();
}

std::optional<PartFileName> parse_part_file_name(std::string_view name) noexcept {
  PartFileName parsed;
  parsed.in_progress = name.starts_with('.');
  if (parsed.in_progress) name.remove_prefix(1);
  if (!name.starts_with("part-")) return std::nullopt;
  name.remove_prefix(5);
  if (!consume_number(name, parsed.subtask) || !name.starts_with('-')) return std::nullopt;
  name.remove_prefix(1);
  if (!consume_number(name, parsed.sequence) || !name.starts_with('.')) return std::nullopt;
  name.remove_prefix(1);
  if (parsed.in_progress) {
    // `.inprogress` (fixed names), or `.inprogress.<id>` (names of earlier versions, still in old checkpoints).
    if (name != "inprogress" && (!name.starts_with("inprogress.") || name.size() == 11)) return std::nullopt;
  } else if (name.empty()) {
    return std::nullopt;
  }
  return parsed;
}

int64_t next_part_sequence_in(const std::string& directory, int subtask) {
  int64_t next = 0;
  for_each_name_in(directory, [&](const std::string& name) {
    std::optional<PartFileName> p = parse_part_file_name(name);
    if (p && p->subtask == subtask && p->sequence < std::numeric_limits<int64_t>::max()) {
      next = std::max(next, p->sequence + 1);
    }
  });
  return next;
}

namespace {

// Truncates the in-progress file of `f` to its recorded valid length and syncs it. Throws kConnector when it is
// missing: the records the checkpoint covers would be lost.
void truncate_to_valid_length(const InProgressPartFile& f) {
  const int fd = ::open(f.in_progress_path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) throw_io("file sink", "opening", f.in_progress_path, errno);
    struct stat st {};
    const bool committed = ::stat(f.final_path.c_str(), &st) == 0;
    throw SluiceException(Error(
        ErrorCode::kConnector,
        fmt::format("file sink: the in-progress part file '{}' that the restored checkpoint recorded ({} bytes) is "
                    "missing{}; restore the latest checkpoint, or start the job without its state",
                    f.in_progress_path, f.valid_length,
                    committed ? fmt::format(": it was finished and committed as '{}' after that checkpoint, so the "
                                            "checkpoint is older than the output",
                                            f.final_path)
                              : " and was never committed: its records are lost")));
  }
  if (::ftruncate(fd, static_cast<off_t>(f.valid_length)) != 0 || ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw_io("file sink", fmt::format("truncating to {} bytes", f.valid_length), f.in_progress_path, err);
  }
  ::close(fd);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

RollingPartFile::RollingPartFile(RuntimeContext& ctx, std::string directory, std::string extension,
                                 RollingPolicy policy)
    : clock_(ctx.clock()),
      sequence_state_(&ctx.operator_state().get_union_list_state<std::pair<int32_t, int64_t>>(kSequenceStateName)),
      in_progress_state_(&ctx.operator_state().get_union_list_state<InProgressPartFile>(kInProgressStateName)),
      directory_(std::move(directory)),
      extension_(std::move(extension)),
      policy_(policy),
      subtask_(ctx.subtask_index()) {
  policy_.part_size_bytes = std::max<int64_t>(policy_.part_size_bytes, 1);
  policy_.rollover_interval_ms = std::max<int64_t>(policy_.rollover_interval_ms, 1);
  policy_.inactivity_interval_ms = std::max<int64_t>(policy_.inactivity_interval_ms, 1);
  // The directory may have just been created: make its own entry durable before any checkpoint names a file in it.
  sync_directory(parent_directory(directory_));
  bool restored = false;
  for (const auto& [subtask, next] : sequence_state_->get()) {
    if (subtask != subtask_) continue;
    next_sequence_ = std::max(next_sequence_, next);
    restored = true;
  }
  // A fresh start (no state for this subtask) lists the directory once, so its numbers follow those of earlier
  // jobs' files there; a restore (every restart) does not: its numbers come from the state.
  if (!restored) next_sequence_ = next_part_sequence_in(directory_, subtask_);
  const int parallelism = std::max(ctx.parallelism(), 1);
  const TimestampMs now = clock_.now_ms();
  for (const InProgressPartFile& f : in_progress_state_->get()) {
    if (f.subtask % parallelism != subtask_) continue;
    truncate_to_valid_length(f);
    if (f.subtask == subtask_ && !file_.is_open()) {
      // Flink's FileSink resumes the in-progress file of a row format: write on after the valid length.
      file_.open(f.in_progress_path, /*truncate=*/false);
      final_path_ = f.final_path;
      bytes_ = f.valid_length;
      opened_ms_ = last_write_ms_ = now;
      recorded_ = true;
    } else {
      // An old subtask's file after a change of parallelism: finished now, committed with the next checkpoint.
      finished_.push_back(FileCommittable{f.in_progress_path, f.final_path});
      finished_recorded_.push_back(true);
    }
  }
  sequence_state_->update({{subtask_, next_sequence_}});
  in_progress_state_->clear();
}

void RollingPartFile::open_next() {
  // Names come from the state, not from listing the directory: skip a final name that exists already (a rerun
  // into the same directory, or a restore of an older checkpoint), so a commit never replaces a committed file.
  while (exists(part_file_path(directory_, subtask_, next_sequence_, extension_)))
    ++next_sequence_;
  const int64_t sequence = next_sequence_++;
  final_path_ = part_file_path(directory_, subtask_, sequence, extension_);
  file_.open(in_progress_file_path(directory_, subtask_, sequence), /*truncate=*/true);
  bytes_ = 0;
  opened_ms_ = last_write_ms_ = clock_.now_ms();
  recorded_ = false;
  directory_dirty_ = true;
}

void RollingPartFile::after_record() {
  ++records_since_check_;
  const int64_t buffered = static_cast<int64_t>(file_.buffer().size());
  if (bytes_ + buffered >= policy_.part_size_bytes) {
    finish_in_progress();
    return;
  }
  if (buffered >= static_cast<int64_t>(PartFileWriter::kBufferBytes)) {
    file_.flush();
    bytes_ += buffered;
    // The clock is read here and at checkpoints, not per record.
    check_intervals(clock_.now_ms());
  }
}

void RollingPartFile::flush(bool end_of_input) {
  if (!file_.is_open()) return;
  const int64_t buffered = static_cast<int64_t>(file_.buffer().size());
  if (buffered > 0) {
    file_.flush();
    bytes_ += buffered;
  }
  if (end_of_input) finish_in_progress();
}

void RollingPartFile::check_intervals(TimestampMs now) {
  if (!file_.is_open()) return;
  // A record since the previous check counts as written now: the inactivity interval is measured from the check
  // that saw the last record.
  if (records_since_check_ > 0) {
    last_write_ms_ = now;
    records_since_check_ = 0;
  }
  if (now - opened_ms_ >= policy_.rollover_interval_ms || now - last_write_ms_ >= policy_.inactivity_interval_ms) {
    finish_in_progress();
  }
}

void RollingPartFile::finish_in_progress() {
  if (!file_.is_open()) return;
  records_since_check_ = 0;
  file_.flush_and_sync();
  file_.close();
  finished_.push_back(FileCommittable{file_.path(), final_path_});
  finished_recorded_.push_back(recorded_);
  bytes_ = 0;
  recorded_ = false;
}

std::vector<FileCommittable> RollingPartFile::snapshot() {
  flush(/*end_of_input=*/false);
  check_intervals(clock_.now_ms());
  std::vector<InProgressPartFile> in_progress;
  if (file_.is_open()) {
    file_.flush_and_sync();  // Flink's persist(): the recorded length is durable
    in_progress.push_back(InProgressPartFile{subtask_, file_.path(), final_path_, bytes_});
    recorded_ = true;
  }
  // The files' data is durable; their names must be too before the checkpoint that names them is acknowledged,
  // or a machine crash could lose the directory entry of a file the completed checkpoint commits or resumes.
  if (directory_dirty_) {
    sync_directory(directory_);
    directory_dirty_ = false;
  }
  sequence_state_->update({{subtask_, next_sequence_}});
  in_progress_state_->update(std::move(in_progress));
  std::vector<FileCommittable> out = std::move(finished_);
  finished_.clear();
  finished_recorded_.clear();
  return out;
}

void RollingPartFile::discard() noexcept {
  if (file_.is_open()) {
    file_.discard();
    // A file a checkpoint recorded is resumed by the restore: keep it.
    if (!recorded_) ::unlink(file_.path().c_str());
  }
  for (size_t i = 0; i < finished_.size(); ++i) {
    if (!finished_recorded_[i]) ::unlink(finished_[i].in_progress_path.c_str());
  }
  finished_.clear();
  finished_recorded_.clear();
}

void FileCommitter::commit(std::vector<FileCommittable>& committables) {
  std::vector<std::string> directories;
  for (const FileCommittable& c : committables) {
    const int fd = ::open(c.in_progress_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) throw_io("file sink", "opening", c.in_progress_path, errno);
      check_already_committed(c);
      continue;
    }
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      throw_io("file sink", "syncing", c.in_progress_path, err);
    }
    ::close(fd);
    SLUICE_FAULT_POINT("files.before-rename");
    if (::rename(c.in_progress_path.c_str(), c.final_path.c_str()) != 0) {
      if (errno != ENOENT) {
        throw_io("file sink", fmt::format("renaming to '{}'", c.final_path), c.in_progress_path, errno);
      }
      check_already_committed(c);
      continue;
    }
    SLUICE_FAULT_POINT("files.after-rename");
    std::string dir = parent_directory(c.final_path);
    if (std::find(directories.begin(), directories.end(), dir) == directories.end()) directories.push_back(dir);
  }
  for (const std::string& dir : directories)
    sync_directory(dir);
}

void FileCommitter::abort_lingering(RuntimeContext& ctx, const std::vector<FileCommittable>& restored_committables) {
  std::unordered_set<std::string> keep;
  for (const FileCommittable& c : restored_committables)
    keep.insert(c.in_progress_path);
  const int parallelism = std::max(ctx.parallelism(), 1);
  const int subtask = ctx.subtask_index();
  auto& sequences =
      ctx.operator_state().get_union_list_state<std::pair<int32_t, int64_t>>(RollingPartFile::kSequenceStateName);
  int64_t deleted = 0;
  for (const auto& [old_subtask, next] : sequences.get()) {
    if (old_subtask % parallelism != subtask) continue;
    // A failed attempt numbered its files on from the restored next sequence number, skipping names whose final
    // file existed: probe those names until neither exists.
    for (int64_t n = next;; ++n) {
      const std::string in_progress = in_progress_file_path(directory_, old_subtask, n);
      const bool present = exists(in_progress);
      if (!present && !exists(part_file_path(directory_, old_subtask, n, extension_))) break;
      if (!present || keep.contains(in_progress)) continue;
      if (::unlink(in_progress.c_str()) != 0 && errno != ENOENT) throw_io("file sink", "deleting", in_progress, errno);
      ++deleted;
    }
  }
  if (deleted > 0) {
    spdlog::info("file sink: subtask {} deleted {} in-progress file(s) of a failed attempt in '{}'", subtask, deleted,
                 directory_);
  }
}

}  // namespace detail
}  // namespace sluice
