// The print sink: one line per record on stdout or stderr, like Flink's DataStream.print() / PrintSink.
//
// Line format (Flink's): "<prefix><record>\n" where the record is to_display_string(record) (strings as
// they are, numbers plainly, everything else as compact JSON; json_mapping.h) and the prefix is
//   parallelism > 1:  "N> "         or "identifier:N> "   (N = subtask index + 1)
//   parallelism 1:    ""            or "identifier> "
// A record whose text contains newlines spans several lines.
//
// Each line is written with one fwrite under a process-wide mutex and then flushed, so lines of different
// subtasks (and of different PrintSinks on the same stream) never interleave and appear at once, even when
// stdout is a pipe. That costs a system call per record: the print sink is for examples and debugging.
// Errors: a failed write (closed stdout, full disk behind a redirect) throws SluiceException
// (ErrorCode::kConnector) naming the stream and the OS reason, which fails the task.
//
// Thread-safety: PrintSink is an immutable, thread-safe factory; each writer runs on its task thread.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "sluice/api/sink.h"
#include "sluice/core/error.h"
#include "sluice/core/json_mapping.h"

namespace sluice {

/// Which standard stream a PrintSink writes to.
enum class PrintTarget { kStdout, kStderr };

namespace detail {
/// Serializes the print sinks' writes process-wide.
inline std::mutex& print_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace detail

/// Prints every record as one line (see the file comment).
template <class T>
class PrintSink final : public Sink<T> {
 public:
  /// Prints to stdout or stderr, prefixing lines with `identifier` when it is not empty.
  explicit PrintSink(std::string identifier = "", PrintTarget target = PrintTarget::kStdout)
      : identifier_(std::move(identifier)),
        stream_(target == PrintTarget::kStdout ? stdout : stderr),
        stream_name_(target == PrintTarget::kStdout ? "stdout" : "stderr") {}

  /// Prints to `stream`, which is not owned and must stay open while any writer exists (tests pass a
  /// temporary file here).
  PrintSink(std::string identifier, std::FILE* stream)
      : identifier_(std::move(identifier)), stream_(stream), stream_name_("the print stream") {}

  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const override {
    std::string prefix = identifier_;
    if (ctx.parallelism() > 1) {
      if (!prefix.empty()) prefix.push_back(':');
      prefix += std::to_string(ctx.subtask_index() + 1);
    }
    if (!prefix.empty()) prefix += "> ";
    return std::make_unique<Writer>(std::move(prefix), stream_, stream_name_);
  }

 private:
  class Writer final : public SinkWriter<T> {
   public:
    Writer(std::string prefix, std::FILE* stream, const char* stream_name)
        : prefix_(std::move(prefix)), stream_(stream), stream_name_(stream_name) {}

    void write(const T& record, const SinkWriterContext&) override {
      line_.assign(prefix_);
      append_display_string(record, line_);
      line_.push_back('\n');
      std::lock_guard lock(detail::print_mutex());
      if (std::fwrite(line_.data(), 1, line_.size(), stream_) != line_.size() || std::fflush(stream_) != 0) {
        fail();
      }
    }
    void flush(bool /*end_of_input*/) override {
      std::lock_guard lock(detail::print_mutex());
      if (std::fflush(stream_) != 0) fail();
    }

   private:
    [[noreturn]] void fail() const {
      const int err = errno;
      throw SluiceException(Error(ErrorCode::kConnector, std::string("print sink: writing to ") + stream_name_ +
                                                             " failed: " + std::strerror(err)));
    }

    std::string prefix_;
    std::FILE* stream_;
    const char* stream_name_;
    std::string line_;  // reused for every record
  };

  std::string identifier_;
  std::FILE* stream_;
  const char* stream_name_;
};

/// A sink printing to stdout (or stderr), as Flink's print() / print(identifier).
template <class T>
std::shared_ptr<PrintSink<T>> print_sink(std::string identifier = "", PrintTarget target = PrintTarget::kStdout) {
  return std::make_shared<PrintSink<T>>(std::move(identifier), target);
}

}  // namespace sluice
