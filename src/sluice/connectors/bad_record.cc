#include "sluice/connectors/bad_record.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>

#include "sluice/connectors/dead_letter_counts.h"

namespace sluice {

namespace {

Error io_error(std::string_view what, const std::string& path, int err) {
  return Error(ErrorCode::kConnector,
               fmt::format("dead-letter file '{}': {} failed: {}", path, what, std::strerror(err)));
}

// Appended records by path and reason (dead_letters_appended()). Never shrinks: a process writes to few files,
// and the reasons are few codes.
std::mutex& counts_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::map<std::string, int64_t>, std::less<>>& counts() {
  static std::map<std::string, std::map<std::string, int64_t>, std::less<>> m;
  return m;
}
void count_appended(const std::string& path, std::string_view reason) {
  std::lock_guard lock(counts_mutex());
  auto& by_reason = counts()[path];
  auto it = by_reason.find(std::string(reason));
  if (it == by_reason.end()) it = by_reason.emplace(std::string(reason), 0).first;
  ++it->second;
}
std::string_view reason_of(const Value& entry) {
  const Value* r = entry.is_object() ? entry.find("reason") : nullptr;
  return r != nullptr && r->is_string() && !r->as_string().empty() ? r->as_string() : dead_letter_reason::kUnspecified;
}

}  // namespace

int64_t dead_letters_appended(const std::string& path) {
  std::lock_guard lock(counts_mutex());
  auto it = counts().find(path);
  int64_t n = 0;
  if (it != counts().end()) {
    for (const auto& [reason, count] : it->second)
      n += count;
  }
  return n;
}

std::map<std::string, int64_t> dead_letters_appended_by_reason(const std::string& path) {
  std::lock_guard lock(counts_mutex());
  auto it = counts().find(path);
  return it == counts().end() ? std::map<std::string, int64_t>{} : it->second;
}

std::string_view bad_record_policy_name(BadRecordPolicy policy) noexcept {
  switch (policy) {
    case BadRecordPolicy::kFail:
      return "fail";
    case BadRecordPolicy::kDeadLetter:
      return "dead-letter";
  }
  return "unknown";
}

Result<std::shared_ptr<DeadLetterFile>> DeadLetterFile::open(std::string path) {
  if (path.empty()) {
    return Error(ErrorCode::kConfiguration,
                 "the dead-letter policy needs a dead-letter file path: pass one with "
                 "on_bad_record(BadRecordPolicy::kDeadLetter, path)");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec && !std::filesystem::is_directory(parent)) {
      return Error(ErrorCode::kConnector, fmt::format("dead-letter file '{}': cannot create directory '{}': {}", path,
                                                      parent.string(), ec.message()));
    }
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("open", path, errno);
  return std::shared_ptr<DeadLetterFile>(new DeadLetterFile(std::move(path), fd));
}

DeadLetterFile::~DeadLetterFile() {
  ::close(fd_);
}

Status DeadLetterFile::write_line_locked() {
  const char* p = line_.data();
  size_t left = line_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("write", path_, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return ok_status();
}

Status DeadLetterFile::append(const Value& entry) {
  std::lock_guard lock(mu_);
  line_.clear();
  entry.write_json(line_);
  line_.push_back('\n');
  Status st = write_line_locked();
  if (st.ok()) count_appended(path_, reason_of(entry));
  return st;
}

Status DeadLetterFile::append_line(std::string_view json_line, std::string_view reason) {
  std::lock_guard lock(mu_);
  line_.assign(json_line);
  line_.push_back('\n');
  Status st = write_line_locked();
  if (st.ok()) count_appended(path_, reason.empty() ? dead_letter_reason::kUnspecified : reason);
  return st;
}

Status DeadLetterFile::sync() {
  std::lock_guard lock(mu_);
  if (::fdatasync(fd_) != 0) return io_error("fdatasync", path_, errno);
  return ok_status();
}

}  // namespace sluice
