// File connectors: a source reading files line by line (text lines, JSON lines) and a sink writing part files
// (DESIGN.md §8 "files").
//
// FileSource<T> (bounded). Paths are files, directories (every regular file directly inside whose name does
// not start with '.', in name order; subdirectories are not entered) or glob(3) patterns (`/data/in/*.jsonl`,
// expanded in sorted order; matching directories are expanded like directories). A file named twice is read once. Paths
// are resolved when the job starts: a missing path, or a pattern or directory that yields no file, fails the job at
// start with ErrorCode::kConnector naming the pattern. Each file is one split (FileSplit): byte offset and line number
// of the next line, so a checkpoint records exactly where each file's reading resumes. Splits are handed out one at a
// time to the reader subtask that asks (StaticSplitEnumerator), so a few large files do not all land on one subtask
// while others idle. A reader reads its file in 64 KiB chunks and emits at most 1024 lines per poll_next, which keeps
// its task responsive to checkpoints and cancellation. Lines end at '\n'; a "\r\n" ending is removed as a whole; the
// last line needs no newline. Lines are limited to max_line_bytes (default 16 MiB) so a file without
// newlines cannot exhaust memory; a longer line is a bad record.
//
// Formats (LineFormat<T>): text lines (T = std::string, every line is a record, empty ones too) and
// JSON lines (one JSON document per line, read with Value::from_json and, for typed records, from_value of
// json_mapping.h; blank lines are skipped). Custom formats pass their own LineFormat.
//
// Bad input (DESIGN.md §7): a line that does not decode fails the job (BadRecordPolicy::kFail, the default)
// with a SluiceException (ErrorCode::kConnector) whose message names the file, the line number, the byte
// offset, the reason and the line's first 80 bytes. With on_bad_record(BadRecordPolicy::kDeadLetter, path)
// it is instead appended to the dead-letter file as
//   {"source":"file","path":..,"line":..,"offset":..,"error":..,"record":"<the raw line>"}
// (plus "record_base64" with the exact bytes when the line is not valid UTF-8, since "record" then holds
// U+FFFD replacements), counted in stats()->bad_records, and reading goes on with the next line.
//
// FileSink<T> (a TwoPhaseCommittingSink, sink.h) writes text (to_display_string of each record, one per
// line, extension "txt") or JSON lines (to_json of each record, "jsonl") into a directory, created when
// missing. Writes are buffered (64 KiB).
//  * With checkpointing (RuntimeContext::is_checkpointing_enabled()) it is exactly-once by rename on commit,
//    like Flink's FileSink with a row format: subtask i writes a hidden in-progress file `.part-<i>-<n>.inprogress`
//    and finishes it by its RollingPolicy (at a size, an age, or a time without records; independent of
//    checkpoints): written, fsynced, closed, pending. A checkpoint (prepare_commit) fsyncs the in-progress file
//    and records its valid length in the operator state (the file goes on across checkpoints), fsyncs the
//    directory, and pre-commits the files finished since the previous checkpoint (each committable names a file
//    and its final name), all before the subtask acknowledges. The checkpoint's completion commits them: fsync,
//    rename to `part-<i>-<n>.<ext>`, fsync the directory (fault points "files.before-rename" and
//    "files.after-rename" around the rename, fault_points.h). The end of the input finishes the in-progress file,
//    so the final checkpoint commits everything. Only files whose names do not start with '.' are committed
//    output; readers list those (FileSource skips hidden files of a directory). No empty part files are made.
//    A restore reads only the operator state, never lists the directory (a fresh start lists it once for its first
//    sequence number, past every `part-<i>-*` there): the next sequence number <n> is in the state (a final name
//    that exists already is skipped with one stat() per name, so a commit never replaces a file); on restore the
//    committables of the restored checkpoint are committed again (a no-op for those already renamed), the recorded
//    in-progress file is truncated to its valid length and written on (after a lower parallelism p, those of old
//    subtasks j >= p with j % p == i are finished and committed with the next checkpoint), and abort_lingering deletes
//    what failed attempts wrote after the checkpoint by probing the names `.part-<j>-<n>.inprogress` from the recorded
//    next number on. One job per directory.
//  * Without checkpointing, subtask i writes `<directory>/part-<i>.<ext>` directly; flush() writes the
//    buffer and fsyncs the file (at the end of input); close() writes what is left, except in a
//    cancelled task (core/cancellation.h), which writes nothing more. The first attempt of a
//    subtask truncates its part file; a restarted attempt appends (at-least-once). Part files of subtasks
//    that no longer exist (a lower parallelism than a previous run) are left alone.
//  * On S3 (the directory is an `s3://bucket/prefix` URI; s3a:// and s3p:// too): the same exactly-once contract
//    with multipart uploads instead of renames, like Flink's S3 RecoverableWriter. Part file n of subtask i is a
//    multipart upload of the key `<prefix>/part-<i>-<n>.<ext>`, invisible to readers until completed. Its bytes
//    are buffered in memory and go up as parts of s3.multipart.part-size (S3's minimum 5 MiB; one part per
//    subtask in memory); the file is finished by the RollingPolicy and, since bytes not yet uploaded would not
//    survive a crash, at every checkpoint at the latest (Flink's OnCheckpointRollingPolicy): its last part is
//    uploaded and the upload, still open, is pre-committed (FileCommittable: key, upload id, part ETags, in the
//    operator state). The checkpoint's completion completes the uploads (CompleteMultipartUpload; fault points
//    "files.s3.before-complete" and "files.s3.after-complete"). A restore completes the restored checkpoint's
//    uploads again: one S3 no longer knows (NoSuchUpload) counts as committed when its key holds the object its
//    parts make (same multipart ETag), otherwise it fails the task naming the key (its records are lost). On every
//    start, fresh or restored, abort_lingering lists the multipart uploads under the prefix (ListMultipartUploads)
//    and aborts those of this subtask's keys (old subtasks j with j % parallelism == i) that the restored
//    checkpoint does not name: what crashed, failed or cancelled runs left. A fresh start lists `<prefix>/part-<i>-`
//    once for its first sequence number; a key that exists already is skipped (one HEAD per part file). Without
//    checkpointing the part files are uploaded the same way and committed at the end of the input. The s3.* keys
//    of the job configuration (else the process's S3Client) say where and how to reach the store. S3 errors fail
//    the task (kConnector, naming the key and the request); the restart strategy retries.
// Errors (cannot create or list the directory, open, write, sync, rename or delete) throw SluiceException
// (ErrorCode::kConnector) naming the path and strerror, which fails the task. Committing a committable whose
// in-progress and final files are both gone is an error too (kConnector, naming both files; the sink operator
// adds the checkpoint's id): its records are lost, or a reader moved the committed file away before a later
// checkpoint completed.
//
// Threading: sources and sinks are thread-safe factories, configured (on_bad_record, max_line_bytes) before
// they are handed to a job; readers and writers run on their task thread. BadRecordStats may be read from
// any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/sink.h"
#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/core/json_mapping.h"
#include "sluice/core/s3_client.h"
#include "sluice/core/type_serializer.h"
#include "sluice/core/value.h"
#include "sluice/state/operator_state.h"

namespace sluice {

/// One file to read and where reading resumes.
struct FileSplit {
  std::string path;
  int64_t offset = 0;  ///< byte offset of the next line to read
  int64_t line = 1;    ///< 1-based number of that line
  friend bool operator==(const FileSplit&, const FileSplit&) = default;
};
SLUICE_FIELDS(FileSplit, path, offset, line);

/// What a FileSink pre-commits at a checkpoint: on a file system a synced in-progress file and the name it gets on
/// commit; on S3 the multipart upload that holds the part file's bytes and the ETags of its parts.
struct FileCommittable {
  std::string in_progress_path;  ///< `<directory>/.part-<i>-<n>.inprogress`; empty on S3
  std::string final_path;        ///< `<directory>/part-<i>-<n>.<ext>`, or `s3://<bucket>/<prefix>/part-<i>-<n>.<ext>`
  std::string upload_id;         ///< on S3: the multipart upload of final_path's key; empty on a file system
  std::vector<std::string> part_etags;  ///< on S3: the ETags of parts 1..n, as UploadPart returned them
  friend bool operator==(const FileCommittable&, const FileCommittable&) = default;
};
SLUICE_FIELDS(FileCommittable, in_progress_path, final_path, upload_id, part_etags);

/// The serializer of a FileCommittable in the sink's operator state: the two paths, then, only for an S3
/// committable, the upload id and the ETags. A file-system committable is thus encoded as before S3 existed, so
/// checkpoints of earlier versions restore; reading relies on the committable ending its (length-delimited)
/// operator state element, as it does in the sink operator's (checkpoint id, committable) pairs.
template <>
struct TypeSerializer<FileCommittable> {
  static void serialize(const FileCommittable& v, DataOutput& out) {
    out.write_string(v.in_progress_path);
    out.write_string(v.final_path);
    if (v.upload_id.empty()) return;
    out.write_string(v.upload_id);
    ::sluice::serialize(v.part_etags, out);
  }
  static void deserialize(FileCommittable& target, DataInput& in) {
    in.read_string(target.in_progress_path);
    in.read_string(target.final_path);
    target.upload_id.clear();
    target.part_etags.clear();
    if (in.at_end()) return;
    in.read_string(target.upload_id);
    ::sluice::deserialize(target.part_etags, in);
  }
  static constexpr size_t min_encoded_size() { return 2; }
};

/// When a FileSink with checkpointing finishes its in-progress part file and starts the next (Flink's
/// DefaultRollingPolicy, with its defaults): once the file holds part_size_bytes, once it is older than
/// rollover_interval_ms, or once no record was written to it for inactivity_interval_ms. Independent of
/// checkpoints: a checkpoint commits the finished files and records how far the in-progress one is written.
/// The size is checked after every record; the intervals whenever the 64 KiB write buffer is written out and
/// at every checkpoint (so an interval ends at the first checkpoint after it is due). Values below 1 mean 1.
struct RollingPolicy {
  int64_t part_size_bytes = int64_t{128} << 20;  ///< 128 MiB
  int64_t rollover_interval_ms = 60'000;         ///< 1 min
  int64_t inactivity_interval_ms = 60'000;       ///< 1 min
  friend bool operator==(const RollingPolicy&, const RollingPolicy&) = default;
};

/// An in-progress part file as a checkpoint records it (Flink's resumable in-progress file): the restore
/// truncates it to valid_length and writes on.
struct InProgressPartFile {
  int64_t subtask = 0;           ///< the subtask that wrote it
  std::string in_progress_path;  ///< `<directory>/.part-<i>-<n>.inprogress`
  std::string final_path;        ///< `<directory>/part-<i>-<n>.<ext>`
  int64_t valid_length = 0;      ///< bytes the checkpoint covers
  friend bool operator==(const InProgressPartFile&, const InProgressPartFile&) = default;
};
SLUICE_FIELDS(InProgressPartFile, subtask, in_progress_path, final_path, valid_length);

/// How a line becomes a record of type T.
template <class T>
struct LineFormat {
  /// For error messages: "text lines", "JSON lines".
  std::string name;
  /// Skip lines that are empty or only spaces, tabs and '\r' instead of decoding them.
  bool skip_blank_lines = false;
  /// Decodes `line` (without its line ending) into `out` (default-constructed). Returns an error whose
  /// message is the reason the line is bad. Called on the reader's task thread.
  std::function<Status(std::string_view line, T& out)> decode;
};

/// Text lines: every line is a record (a std::string).
LineFormat<std::string> text_lines_format();

/// JSON lines: each non-blank line is one JSON document, read into T with from_json (json_mapping.h).
template <JsonMappable T>
LineFormat<T> json_lines_format() {
  return LineFormat<T>{"JSON lines", true, [](std::string_view line, T& out) { return from_json(line, out); }};
}

namespace detail {

/// Resolves files, directories and glob patterns to the files to read (see the file comment). Returns a
/// kConfiguration error when `patterns` is empty and a kConnector error naming the pattern when one yields
/// no file or cannot be read.
[[nodiscard]] Result<std::vector<std::string>> expand_file_paths(const std::vector<std::string>& patterns);

/// True when `line` is empty or holds only spaces, tabs and '\r'.
bool is_blank_line(std::string_view line) noexcept;

/// Reads the lines of one file from a byte offset, in chunks. Not thread-safe (one reader's task thread).
/// Errors (open, seek, read) throw SluiceException (kConnector) naming the path and strerror.
class LineReader {
 public:
  static constexpr size_t kChunkBytes = 64 * 1024;
  /// How many bytes of an over-long line next() keeps in Line::text.
  static constexpr size_t kLongLineHeadBytes = 4096;

  struct Line {
    std::string_view text;  ///< without "\n" / "\r\n"; valid until the next call to next() or close()
    int64_t bytes = 0;      ///< bytes the line occupies in the file, line ending included
    bool too_long = false;  ///< longer than max_line_bytes: `text` holds its first kLongLineHeadBytes
  };

  explicit LineReader(size_t max_line_bytes) : max_line_bytes_(max_line_bytes) {}
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  ~LineReader();

  /// Opens `path` and positions it at `offset` bytes.
  void open(const std::string& path, int64_t offset);
  bool is_open() const noexcept { return fd_ >= 0; }
  /// Reads the next line into `line`; returns false at the end of the file.
  bool next(Line& line);
  void close() noexcept;

 private:
  // Reads more bytes after end_; returns false at the end of the file.
  bool fill();
  // Consumes the rest of an over-long line up to and including its '\n'; returns the bytes consumed.
  int64_t skip_rest_of_line();

  size_t max_line_bytes_;
  std::string path_;
  int fd_ = -1;
  bool eof_ = false;
  std::vector<char> buf_;
  size_t begin_ = 0;  // start of the unread bytes in buf_
  size_t end_ = 0;    // end of the bytes read into buf_
  size_t scan_ = 0;   // bytes in [begin_, scan_) hold no '\n'
  std::string long_line_head_;
};

/// The error that fails a job on a bad line (kConnector; names path, line, offset, reason and an excerpt).
Error bad_line_error(std::string_view format_name, std::string_view path, int64_t line, int64_t offset,
                     std::string_view raw, std::string_view reason);

/// The dead-letter entry of a bad line (see the file comment); `reason_code` is a dead_letter_reason.
Value bad_line_entry(std::string_view path, int64_t line, int64_t offset, std::string_view raw, std::string_view reason,
                     std::string_view reason_code);

/// Logs (once per reader) that bad lines go to the dead-letter file.
void log_first_dead_letter(std::string_view path, int64_t line, const std::string& dead_letter_path);

/// Creates `directory` and its parents when missing; throws SluiceException (kConnector) on failure.
void create_output_directory(const std::string& directory);

/// A file written through a 64 KiB buffer with write(2). Not thread-safe (one writer's task thread).
/// Errors throw SluiceException (kConnector) naming the path and strerror.
class PartFileWriter {
 public:
  static constexpr size_t kBufferBytes = 64 * 1024;

  PartFileWriter() = default;
  PartFileWriter(const PartFileWriter&) = delete;
  PartFileWriter& operator=(const PartFileWriter&) = delete;
  /// Closes the file without writing the buffer (close() was not called: the task failed).
  ~PartFileWriter();

  /// Opens (creating) `path`, truncating it when `truncate`, else appending.
  void open(std::string path, bool truncate);
  bool is_open() const noexcept { return fd_ >= 0; }
  const std::string& path() const noexcept { return path_; }
  /// The buffer to append whole lines to; call write_if_full() after each line.
  std::string& buffer() noexcept { return buf_; }
  /// Writes the buffer once it holds kBufferBytes. Like every write below, throws TaskCancelledException instead
  /// when the calling task is cancelled or stale (core/cancellation.h): its work may be another attempt's now.
  void write_if_full() {
    if (buf_.size() >= kBufferBytes) checked_write_buffer();
  }
  /// Writes the buffer, then fsyncs the file.
  void flush_and_sync();
  /// Writes the buffer (no fsync).
  void flush() {
    if (fd_ >= 0) checked_write_buffer();
  }
  /// Writes the buffer and closes the file (idempotent); a cancelled or stale task's buffer is dropped instead.
  void close();
  /// Drops the buffer and closes the file without writing it (idempotent; errors ignored).
  void discard() noexcept;

 private:
  void checked_write_buffer() {
    throw_if_current_task_cancelled();
    write_buffer();
  }
  void write_buffer();

  std::string path_;
  int fd_ = -1;
  std::string buf_;
};

/// `<directory>/part-<subtask>.<extension>` (the file of a subtask without checkpointing).
std::string part_file_path(const std::string& directory, int subtask, std::string_view extension);

/// `<directory>/part-<subtask>-<sequence>.<extension>` (a committed file with checkpointing).
std::string part_file_path(const std::string& directory, int subtask, int64_t sequence, std::string_view extension);

/// `<directory>/.part-<subtask>-<sequence>.inprogress`: the in-progress file of a part (its name is fixed, so a
/// restore finds what a crashed attempt left by probing names instead of listing the directory).
std::string in_progress_file_path(const std::string& directory, int subtask, int64_t sequence);

/// `<directory>/.part-<subtask>-<sequence>.inprogress.<file_id>` (the name before rolling policies; still parsed).
std::string in_progress_file_path(const std::string& directory, int subtask, int64_t sequence,
                                  std::string_view file_id);

/// The parts of a FileSink file name with checkpointing: `part-<subtask>-<sequence>.<ext>` (committed) or
/// `.part-<subtask>-<sequence>.inprogress[.<id>]` (in progress).
struct PartFileName {
  bool in_progress = false;
  int subtask = 0;
  int64_t sequence = 0;
};

/// Parses a file name (no directory) written by a FileSink with checkpointing; nullopt for other names
/// (including the `part-<i>.<ext>` files written without checkpointing).
std::optional<PartFileName> parse_part_file_name(std::string_view name) noexcept;

/// One past the highest sequence number of subtask `subtask` among the part files (committed and in
/// progress) in `directory`; 0 when there is none or the directory does not exist. Lists the directory: used on
/// a fresh start only. Throws SluiceException (kConnector) when the directory cannot be listed.
int64_t next_part_sequence_in(const std::string& directory, int subtask);

/// The in-progress part file of one FileSink subtask with checkpointing and the part files it finished since
/// the last checkpoint, rolled by a RollingPolicy (see the file comment). Not thread-safe (the writer's task
/// thread). Errors throw SluiceException (kConnector).
class RollingPartFile {
 public:
  /// The operator union list state of (subtask, next sequence number) pairs.
  static constexpr const char* kSequenceStateName = "file-sink-next-part";
  /// The operator union list state of the in-progress files the checkpoint covers, with their valid lengths.
  static constexpr const char* kInProgressStateName = "file-sink-in-progress";

  /// Restores from the operator state only (the directory is listed only on a fresh start, for the first
  /// sequence number): the next sequence number of subtask ctx.subtask_index(), and the in-progress files of old
  /// subtasks j with j % parallelism == subtask, each truncated to the length the checkpoint recorded; this subtask's
  /// own one is written on, the others are finished and committed with the next checkpoint. Throws kConnector when a
  /// recorded in-progress file is missing (its records would be lost). `ctx` must outlive this object.
  RollingPartFile(RuntimeContext& ctx, std::string directory, std::string extension, RollingPolicy policy);
  RollingPartFile(const RollingPartFile&) = delete;
  RollingPartFile& operator=(const RollingPartFile&) = delete;
  /// Closes the in-progress file; deletes it and the finished files no checkpoint covers yet.
  ~RollingPartFile() { discard(); }

  /// The buffer to append whole lines to; opens the next in-progress file first when none is open. Call
  /// after_record() after each line.
  std::string& buffer() {
    if (!file_.is_open()) open_next();
    return file_.buffer();
  }
  /// After each line: writes the buffer when it is full (then checks the rollover and inactivity intervals)
  /// and finishes the part file once it reached part_size_bytes.
  void after_record();
  /// Writes the buffer to the in-progress file (no fsync); at the end of the input also finishes it, so the
  /// final checkpoint commits everything.
  void flush(bool end_of_input);
  /// At a checkpoint: finishes the in-progress file when an interval is due, syncs the in-progress file and
  /// records its valid length in the operator state, syncs the directory, and returns the part files finished
  /// since the previous checkpoint (their committables). Records the next sequence number.
  std::vector<FileCommittable> snapshot();
  /// Closes the in-progress file and deletes it (unless a checkpoint recorded it) and the finished files no
  /// checkpoint pre-committed; errors ignored.
  void discard() noexcept;
  /// The sequence number the next in-progress file gets.
  int64_t next_sequence() const noexcept { return next_sequence_; }

 private:
  void open_next();
  // Writes, syncs and closes the in-progress file; its committable joins finished_.
  void finish_in_progress();
  void check_intervals(TimestampMs now);

  const Clock& clock_;
  ListState<std::pair<int32_t, int64_t>>* sequence_state_;
  ListState<InProgressPartFile>* in_progress_state_;
  std::string directory_;
  std::string extension_;
  RollingPolicy policy_;
  int subtask_;
  int64_t next_sequence_ = 0;
  PartFileWriter file_;
  std::string final_path_;
  int64_t bytes_ = 0;                      // bytes of the in-progress file written so far, buffer included
  TimestampMs opened_ms_ = 0;              // when the in-progress file was opened (or resumed)
  TimestampMs last_write_ms_ = 0;          // the check that last saw a new record (buffer writes, checkpoints)
  int64_t records_since_check_ = 0;        // records written since that check
  bool recorded_ = false;                  // a checkpoint recorded the in-progress file: keep it on discard()
  bool directory_dirty_ = false;           // a file was created since the directory was last synced
  std::vector<FileCommittable> finished_;  // finished since the last checkpoint, not yet pre-committed
  std::vector<bool> finished_recorded_;    // per finished_ entry: a checkpoint recorded it while in progress
};

/// Commits FileCommittables by rename (see the file comment). Runs on one subtask's task thread. Errors
/// throw SluiceException (kConnector).
class FileCommitter final : public Committer<FileCommittable> {
 public:
  /// Commits into `directory`; `extension` is that of the final names ("txt", "jsonl").
  FileCommitter(std::string directory, std::string extension)
      : directory_(std::move(directory)), extension_(std::move(extension)) {}
  /// For each committable: fsync the in-progress file, rename it to its final name; then fsync the
  /// directories. A committable whose in-progress file is gone is already committed when its final file
  /// exists; when that is gone too it throws SluiceException (kConnector) naming both: the output is lost.
  void commit(std::vector<FileCommittable>& committables) override;
  /// Deletes the in-progress files that failed attempts left and the restored checkpoint does not name: for
  /// each old subtask j with j % parallelism == subtask, `.part-<j>-<n>.inprogress` for n from j's restored
  /// next sequence number up to the first name that does not exist. Probes names instead of listing the
  /// directory, so it costs the same with 10 or 10 million committed files. Nothing on a fresh start.
  void abort_lingering(RuntimeContext& ctx, const std::vector<FileCommittable>& restored_committables) override;

 private:
  std::string directory_;
  std::string extension_;
};

/// The S3 client of a FileSink on `s3://`: one built from the job's configuration (its s3.* keys, then the AWS
/// environment) when the context has one, else the process's (S3Client::shared). Throws SluiceException
/// (kConnector) on a bad s3.* option.
std::shared_ptr<const S3Client> file_sink_s3_client(RuntimeContext& ctx);

/// `<prefix>/part-<subtask>-<sequence>.<extension>` (or without `<prefix>/` when the prefix is empty): the key of a
/// FileSink part file on S3.
std::string s3_part_key(std::string_view prefix, int subtask, int64_t sequence, std::string_view extension);

/// The part files of one FileSink subtask on S3 (see the file comment): each is a multipart upload of its final
/// key, invisible until completed. Parts of S3Options::part_size go up as the buffer fills; a part file is finished
/// (its last part uploaded, the upload left open) by the RollingPolicy and, at the latest, at every checkpoint, since
/// the bytes of an unfinished part exist only in memory. Not thread-safe (the writer's task thread). Errors throw
/// SluiceException (kConnector) naming the key and the S3 request.
class S3RollingPartFile {
 public:
  /// Restores the next sequence number of subtask ctx.subtask_index() from the operator state
  /// (RollingPartFile::kSequenceStateName); a fresh start lists `<prefix>/part-<i>-` once instead. `ctx` must
  /// outlive this object.
  S3RollingPartFile(RuntimeContext& ctx, std::shared_ptr<const S3Client> client, S3Uri location, std::string extension,
                    RollingPolicy policy);
  S3RollingPartFile(const S3RollingPartFile&) = delete;
  S3RollingPartFile& operator=(const S3RollingPartFile&) = delete;
  /// Aborts the uploads no checkpoint pre-committed (best effort).
  ~S3RollingPartFile() { discard(); }

  /// The buffer to append whole lines to; opens the next part file first when none is open. Call after_record()
  /// after each line.
  std::string& buffer() {
    if (!open_) open_next();
    return buf_;
  }
  /// After each line: uploads a part once the buffer holds S3Options::part_size bytes (then checks the intervals),
  /// and finishes the part file once it reached part_size_bytes.
  void after_record();
  /// At the end of the input, finishes the part file (the final checkpoint commits it); otherwise nothing (the
  /// bytes of an unfinished part cannot be made durable without finishing the file).
  void flush(bool end_of_input);
  /// At a checkpoint: finishes the part file being written and returns the part files finished since the
  /// previous checkpoint (their uploads, open, as committables). Records the next sequence number.
  std::vector<FileCommittable> snapshot();
  /// Aborts the upload of the part file being written and of the finished ones no checkpoint pre-committed; errors
  /// are logged.
  void discard() noexcept;
  /// The sequence number the next part file gets.
  int64_t next_sequence() const noexcept { return next_sequence_; }

 private:
  void open_next();
  // Uploads the first `n` bytes of the buffer as the next part (creating the upload first).
  void upload_part(size_t n);
  // Uploads the rest of the buffer as the last part; the upload joins finished_.
  void finish_in_progress();
  void check_intervals(TimestampMs now);

  const Clock& clock_;
  ListState<std::pair<int32_t, int64_t>>* sequence_state_;
  std::shared_ptr<const S3Client> client_;
  S3Uri location_;
  std::string extension_;
  RollingPolicy policy_;
  int subtask_;
  size_t part_size_;
  int64_t next_sequence_ = 0;
  bool open_ = false;
  std::string key_;
  std::string upload_id_;
  std::vector<std::string> etags_;
  std::string buf_;
  int64_t bytes_ = 0;                      // bytes of the open part file uploaded so far
  TimestampMs opened_ms_ = 0;              // when the part file was opened
  TimestampMs last_write_ms_ = 0;          // the check that last saw a new record
  int64_t records_since_check_ = 0;        // records written since that check
  std::vector<FileCommittable> finished_;  // finished since the last checkpoint, not yet pre-committed
};

/// Commits S3 FileCommittables by CompleteMultipartUpload (see the file comment). Runs on one subtask's task
/// thread. Errors throw SluiceException (kConnector).
class S3FileCommitter final : public Committer<FileCommittable> {
 public:
  /// Commits into `location` (bucket and key prefix); `extension` is that of the part files.
  S3FileCommitter(std::shared_ptr<const S3Client> client, S3Uri location, std::string extension)
      : client_(std::move(client)), location_(std::move(location)), extension_(std::move(extension)) {}
  /// Completes each committable's upload with its recorded parts. An upload that S3 no longer knows (NoSuchUpload)
  /// is already committed when its key holds the object those parts make (same multipart ETag); otherwise it
  /// throws SluiceException (kConnector) naming the key: its records are lost.
  void commit(std::vector<FileCommittable>& committables) override;
  /// Aborts the multipart uploads under the prefix that belong to this subtask (keys `part-<j>-<n>.<ext>` with
  /// j % parallelism == subtask) and that the restored checkpoint does not name: what failed attempts, crashed or
  /// cancelled runs left. Lists the uploads of the prefix (ListMultipartUploads) on every start, fresh or restored.
  void abort_lingering(RuntimeContext& ctx, const std::vector<FileCommittable>& restored_committables) override;

 private:
  std::shared_ptr<const S3Client> client_;
  S3Uri location_;
  std::string extension_;
};

}  // namespace detail

/// A bounded source of the lines of files (see the file comment).
template <class T>
class FileSource final : public Source<T, FileSplit> {
 public:
  static constexpr int64_t kDefaultMaxLineBytes = int64_t{16} << 20;

  /// Reads `paths` (files, directories, glob patterns) with `format`.
  FileSource(std::vector<std::string> paths, LineFormat<T> format)
      : paths_(std::move(paths)), format_(std::move(format)) {}

  /// One std::string record per line.
  static std::shared_ptr<FileSource> text_lines(
      std::vector<std::string> paths) requires std::is_same_v<T, std::string> {
    return std::make_shared<FileSource>(std::move(paths), text_lines_format());
  }

  /// One record per non-blank line, parsed as JSON: a Value, or any JsonMappable type (SLUICE_FIELDS
  /// structs) through from_value.
  static std::shared_ptr<FileSource> json_lines(std::vector<std::string> paths) requires JsonMappable<T> {
    return std::make_shared<FileSource>(std::move(paths), json_lines_format<T>());
  }

  /// Sets what happens to lines that do not decode; kDeadLetter needs `dead_letter_path` (opened for
  /// appending, with its directories, when the job starts). Call before handing the source to a job.
  FileSource& on_bad_record(BadRecordPolicy policy, std::string dead_letter_path = "") {
    policy_ = policy;
    dead_letter_path_ = std::move(dead_letter_path);
    return *this;
  }

  /// Sets the longest line accepted (bytes, line ending excluded; at least 1). Call before starting a job.
  FileSource& max_line_bytes(int64_t bytes) {
    max_line_bytes_ = bytes < 1 ? 1 : bytes;
    return *this;
  }

  /// Counters shared by all readers of this source (across jobs that use it).
  const std::shared_ptr<BadRecordStats>& stats() const noexcept { return stats_; }
  const std::vector<std::string>& paths() const noexcept { return paths_; }

  Boundedness boundedness() const override { return Boundedness::kBounded; }

  /// Resolves the paths and opens the dead-letter file; throws SluiceException when either fails.
  std::unique_ptr<SplitEnumerator<FileSplit>> create_enumerator(SplitEnumeratorContext<FileSplit>& ctx) const override {
    std::vector<std::string> files = detail::expand_file_paths(paths_).value_or_throw();
    dead_letter_file();
    std::vector<FileSplit> splits;
    splits.reserve(files.size());
    for (std::string& f : files)
      splits.push_back(FileSplit{std::move(f), 0, 1});
    return std::make_unique<StaticSplitEnumerator<FileSplit>>(ctx, std::move(splits));
  }

  std::unique_ptr<SourceReader<T, FileSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(ctx, format_, policy_, dead_letter_file(), stats_,
                                    static_cast<size_t>(max_line_bytes_));
  }

 private:
  // The dead-letter file, opened once and shared by all readers; nullptr under kFail.
  std::shared_ptr<DeadLetterFile> dead_letter_file() const {
    if (policy_ != BadRecordPolicy::kDeadLetter) return nullptr;
    std::lock_guard lock(mu_);
    if (!dead_letter_) dead_letter_ = DeadLetterFile::open(dead_letter_path_).value_or_throw();
    return dead_letter_;
  }

  class Reader final : public SourceReader<T, FileSplit> {
   public:
    Reader(SourceReaderContext& ctx, LineFormat<T> format, BadRecordPolicy policy,
           std::shared_ptr<DeadLetterFile> dead_letter, std::shared_ptr<BadRecordStats> stats, size_t max_line_bytes)
        : ctx_(ctx),
          format_(std::move(format)),
          policy_(policy),
          dead_letter_(std::move(dead_letter)),
          stats_(std::move(stats)),
          lines_(max_line_bytes),
          max_line_bytes_(max_line_bytes) {}

    void start() override { ctx_.send_split_request(); }

    InputStatus poll_next(ReaderOutput<T>& out) override {
      if (splits_.empty()) return no_more_splits_ ? InputStatus::kEndOfInput : InputStatus::kNothingAvailable;
      FileSplit& split = splits_.front();
      if (!lines_.is_open()) lines_.open(split.path, split.offset);
      typename detail::LineReader::Line line;
      for (int n = 0; n < kBatch; ++n) {
        if (!lines_.next(line)) {
          finish_split();
          return InputStatus::kMoreAvailable;
        }
        const int64_t line_no = split.line;
        const int64_t offset = split.offset;
        split.offset += line.bytes;
        split.line += 1;
        if (line.too_long) {
          bad_line(split.path, line_no, offset, line.text,
                   "the line is longer than max_line_bytes (" + std::to_string(max_line_bytes_) +
                       " bytes); the record holds at most its first " +
                       std::to_string(detail::LineReader::kLongLineHeadBytes) + " bytes",
                   dead_letter_reason::kLineTooLong);
          continue;
        }
        if (format_.skip_blank_lines && detail::is_blank_line(line.text)) continue;
        T record{};
        Status st = format_.decode(line.text, record);
        if (!st.ok()) {
          bad_line(split.path, line_no, offset, line.text, st.error().message(), dead_letter_reason::kUndecodable);
          continue;
        }
        out.collect(std::move(record));
      }
      return InputStatus::kMoreAvailable;
    }

    void add_splits(std::vector<FileSplit> splits) override {
      for (FileSplit& s : splits)
        splits_.push_back(std::move(s));
    }
    void notify_no_more_splits() override { no_more_splits_ = true; }

    std::vector<FileSplit> snapshot_state(int64_t /*checkpoint_id*/) override {
      sync_dead_letters();
      return {splits_.begin(), splits_.end()};
    }

    void close() override {
      lines_.close();
      sync_dead_letters();
    }

   private:
    static constexpr int kBatch = 1024;

    void finish_split() {
      lines_.close();
      sync_dead_letters();
      splits_.pop_front();
      if (splits_.empty() && !no_more_splits_) ctx_.send_split_request();
    }

    void bad_line(const std::string& path, int64_t line_no, int64_t offset, std::string_view raw,
                  std::string_view reason, std::string_view reason_code) {
      if (policy_ == BadRecordPolicy::kFail) {
        throw SluiceException(detail::bad_line_error(format_.name, path, line_no, offset, raw, reason));
      }
      dead_letter_->append(detail::bad_line_entry(path, line_no, offset, raw, reason, reason_code)).value_or_throw();
      stats_->bad_records.fetch_add(1, std::memory_order_relaxed);
      if (!logged_) {
        detail::log_first_dead_letter(path, line_no, dead_letter_->path());
        logged_ = true;
      }
      unsynced_ = true;
    }

    void sync_dead_letters() {
      if (!unsynced_) return;
      unsynced_ = false;
      dead_letter_->sync().value_or_throw();
    }

    SourceReaderContext& ctx_;
    LineFormat<T> format_;
    BadRecordPolicy policy_;
    std::shared_ptr<DeadLetterFile> dead_letter_;
    std::shared_ptr<BadRecordStats> stats_;
    detail::LineReader lines_;
    size_t max_line_bytes_;
    std::deque<FileSplit> splits_;
    bool no_more_splits_ = false;
    bool logged_ = false;
    bool unsynced_ = false;
  };

  std::vector<std::string> paths_;
  LineFormat<T> format_;
  BadRecordPolicy policy_ = BadRecordPolicy::kFail;
  std::string dead_letter_path_;
  int64_t max_line_bytes_ = kDefaultMaxLineBytes;
  std::shared_ptr<BadRecordStats> stats_ = std::make_shared<BadRecordStats>();
  mutable std::mutex mu_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;
};

/// What a FileSink writes per record.
enum class FileSinkFormat {
  kText,       ///< to_display_string(record), one per line, in *.txt part files
  kJsonLines,  ///< to_json(record), one per line, in *.jsonl part files
};

/// Writes part files of each subtask into a directory; exactly-once with checkpointing (see the file
/// comment). A thread-safe factory.
template <class T>
class FileSink final : public TwoPhaseCommittingSink<T, FileCommittable> {
 public:
  FileSink(std::string directory, FileSinkFormat format) : directory_(std::move(directory)), format_(format) {}

  /// Text part files (*.txt).
  static std::shared_ptr<FileSink> text(std::string directory) {
    return std::make_shared<FileSink>(std::move(directory), FileSinkFormat::kText);
  }
  /// JSON-lines part files (*.jsonl).
  static std::shared_ptr<FileSink> json_lines(std::string directory) {
    return std::make_shared<FileSink>(std::move(directory), FileSinkFormat::kJsonLines);
  }

  /// Sets when part files roll (with checkpointing; see RollingPolicy). Call before handing the sink to a job.
  FileSink& rolling_policy(RollingPolicy policy) {
    policy_ = policy;
    return *this;
  }
  const RollingPolicy& rolling_policy() const noexcept { return policy_; }

  const std::string& directory() const noexcept { return directory_; }
  /// "txt" or "jsonl".
  std::string_view extension() const noexcept { return format_ == FileSinkFormat::kText ? "txt" : "jsonl"; }

  /// On a file system: creates the directory, then the writer: rolling in-progress files with checkpointing,
  /// `part-<i>.<ext>` (truncated on the first attempt) without. On S3: part files as multipart uploads, with or
  /// without checkpointing (without, they are committed at the end of the input).
  std::unique_ptr<PrecommittingSinkWriter<T, FileCommittable>> create_precommitting_writer(
      RuntimeContext& ctx) const override {
    if (is_s3_uri(directory_)) {
      return std::make_unique<Writer<detail::S3RollingPartFile>>(
          format_, std::make_unique<detail::S3RollingPartFile>(ctx, detail::file_sink_s3_client(ctx), s3_location(),
                                                               std::string(extension()), policy_));
    }
    detail::create_output_directory(directory_);
    if (ctx.is_checkpointing_enabled()) {
      return std::make_unique<Writer<detail::RollingPartFile>>(
          format_, std::make_unique<detail::RollingPartFile>(ctx, directory_, std::string(extension()), policy_));
    }
    return std::make_unique<Writer<detail::RollingPartFile>>(
        format_, detail::part_file_path(directory_, ctx.subtask_index(), extension()),
        /*truncate=*/ctx.attempt_number() == 0 && !ctx.is_restored());
  }

  /// On a file system: creates the directory and a FileCommitter for it. On S3: an S3FileCommitter.
  std::unique_ptr<Committer<FileCommittable>> create_committer(RuntimeContext& ctx) const override {
    if (is_s3_uri(directory_)) {
      return std::make_unique<detail::S3FileCommitter>(detail::file_sink_s3_client(ctx), s3_location(),
                                                       std::string(extension()));
    }
    detail::create_output_directory(directory_);
    return std::make_unique<detail::FileCommitter>(directory_, std::string(extension()));
  }

 private:
  // The bucket and prefix of an s3:// directory; throws SluiceException (kConnector) when it does not parse.
  S3Uri s3_location() const {
    Result<S3Uri> uri = S3Uri::parse(directory_);
    if (!uri.ok()) {
      throw SluiceException(Error(ErrorCode::kConnector, "file sink: " + uri.error().message()));
    }
    return std::move(uri).value();
  }

  // Parts: the rolling part files, local (RollingPartFile) or on S3 (S3RollingPartFile).
  template <class Parts>
  class Writer final : public PrecommittingSinkWriter<T, FileCommittable> {
   public:
    // Without checkpointing on a file system: one part file written directly.
    Writer(FileSinkFormat format, std::string path, bool truncate) : format_(format) {
      direct_.open(std::move(path), truncate);
    }
    // Rolling part files.
    Writer(FileSinkFormat format, std::unique_ptr<Parts> rolling) : format_(format), rolling_(std::move(rolling)) {}

    void write(const T& record, const SinkWriterContext&) override {
      std::string& buf = rolling_ ? rolling_->buffer() : direct_.buffer();
      if (format_ == FileSinkFormat::kText) {
        append_display_string(record, buf);
      } else {
        append_json(record, buf);
      }
      buf.push_back('\n');
      if (rolling_) {
        rolling_->after_record();
      } else {
        direct_.write_if_full();
      }
    }
    void flush(bool end_of_input) override {
      if (rolling_) {
        rolling_->flush(end_of_input);
      } else {
        direct_.flush_and_sync();
      }
    }
    std::vector<FileCommittable> prepare_commit() override {
      if (!rolling_) return {};
      return rolling_->snapshot();
    }
    void close() override {
      if (rolling_) {
        rolling_->discard();
      } else {
        direct_.close();
      }
    }

   private:
    FileSinkFormat format_;
    detail::PartFileWriter direct_;
    std::unique_ptr<Parts> rolling_;
  };

  std::string directory_;
  FileSinkFormat format_;
  RollingPolicy policy_;
};

namespace files {

/// A FileSource of text lines (one std::string per line).
inline std::shared_ptr<FileSource<std::string>> text_lines(std::vector<std::string> paths) {
  return FileSource<std::string>::text_lines(std::move(paths));
}

/// A FileSource of JSON lines read into T (Value by default, or a SLUICE_FIELDS struct).
template <JsonMappable T = Value>
std::shared_ptr<FileSource<T>> json_lines(std::vector<std::string> paths) {
  return FileSource<T>::json_lines(std::move(paths));
}

}  // namespace files
}  // namespace sluice
