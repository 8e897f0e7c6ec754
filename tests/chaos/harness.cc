#include "chaos/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>

#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"

extern char** environ;

namespace sluice::chaos {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using sluice::testing::poll_until;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail(const fs::path& p, size_t lines) {
  const std::string text = read_file(p);
  size_t pos = text.size();
  for (size_t n = 0; n <= lines && pos > 0; ++n) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) {
      pos = 0;
      break;
    }
  }
  return text.substr(pos);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1))
    ++n;
  return n;
}

double chaos_scale() {
  const char* s = std::getenv("SLUICE_CHAOS_SCALE");
  const double v = s != nullptr && *s != '\0' ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}

fs::path make_test_dir(const std::string& prefix) {
  fs::path dir = fs::temp_directory_path() / sluice::testing::unique_name(prefix);
  fs::create_directories(dir);
  return dir;
}

void keep_or_remove(const fs::path& dir, bool failed) {
  if (dir.empty()) return;
  if (failed) {
    std::cout << "kept " << dir << " (logs, checkpoints, output) for inspection\n";
    return;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::string pipeline_section(const std::string& name, const fs::path& checkpoints, const std::string& interval,
                             const std::string& delivery, const std::string& extra, int parallelism) {
  return "pipeline:\n  name: " + name + "\n  parallelism: " + std::to_string(parallelism) +
         "\n  checkpoint: { interval: " + interval + ", storage: \"" + checkpoints.string() +
         "\" }\n  delivery: " + delivery + "\n" + extra + "  http: { port: 0 }\n";
}

std::string kafka_events_sink(const std::string& bootstrap, const std::string& topic) {
  return "  events: { type: kafka, bootstrap-servers: \"" + bootstrap + "\", topic: " + topic + ", key: entity }\n";
}

// ---------------------------------------------------------------------------------------------------------------

SluiceProcess::SluiceProcess(std::string name, fs::path pipeline_file, fs::path log_dir)
    : name_(std::move(name)), file_(std::move(pipeline_file)), log_dir_(std::move(log_dir)) {}

SluiceProcess::~SluiceProcess() {
  kill_now();
}

fs::path SluiceProcess::log_for(int start) const {
  return log_dir_ / (name_ + "-" + std::to_string(start) + ".log");
}

::testing::AssertionResult SluiceProcess::start(const std::string& fault_points) {
  log_ = log_for(starts_);
  ++starts_;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const char* other = std::getenv("SLUICE_CHAOS_BINARY");
  const std::string binary = other != nullptr && *other != '\0' ? other : SLUICE_BINARY;
  const std::string file = file_.string();
  char* argv[] = {const_cast<char*>(binary.c_str()), const_cast<char*>("run"), const_cast<char*>(file.c_str()),
                  nullptr};
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("SLUICE_FAULT_POINTS=")) env_strings.emplace_back(*e);
  }
  if (!fault_points.empty()) env_strings.push_back("SLUICE_FAULT_POINTS=" + fault_points);
  std::vector<char*> envp;
  for (std::string& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  const int rc = posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    pid_ = -1;
    return ::testing::AssertionFailure() << "posix_spawn " << binary << ": " << std::strerror(rc);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SluiceProcess::wait_log(const std::function<bool(const std::string&)>& pred,
                                                   const std::string& what, std::chrono::milliseconds deadline) {
  bool exited = false;
  const bool ok = poll_until(
      [&] {
        if (!alive()) {
          exited = true;
          return true;
        }
        return pred(read_file(log_));
      },
      deadline);
  if (exited) {
    return ::testing::AssertionFailure() << name_ << " exited (status " << status_ << ") before " << what << "\n"
                                         << tail(log_);
  }
  if (!ok) return ::testing::AssertionFailure() << name_ << ": no " << what << " before the deadline\n" << tail(log_);
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SluiceProcess::wait_running(size_t checkpoints, std::chrono::milliseconds deadline) {
  return wait_log(
      [&](const std::string& log) {
        return log.find("' started:") != std::string::npos && count_of(log, "completed checkpoint") >= checkpoints;
      },
      "job start and " + std::to_string(checkpoints) + " completed checkpoint(s)", deadline);
}

bool SluiceProcess::wait_exit(std::chrono::milliseconds deadline) {
  return poll_until([&] { return !alive(); }, deadline);
}

bool SluiceProcess::alive() {
  if (pid_ <= 0) return false;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = st;
    pid_ = -1;
    return false;
  }
  return true;
}

void SluiceProcess::kill_now() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status_, 0);
  pid_ = -1;
}

void SluiceProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  if (!poll_until([&] { return !alive(); }, 20s)) kill_now();
}

std::string SluiceProcess::all_logs() const {
  std::string out;
  for (int i = 0; i < starts_; ++i)
    out += read_file(log_for(i));
  return out;
}

std::string SluiceProcess::tails(size_t lines) const {
  std::string out;
  for (int i = 0; i < starts_; ++i)
    out += "---- " + log_for(i).string() + " (tail) ----\n" + tail(log_for(i), lines) + "\n";
  return out;
}

// ---------------------------------------------------------------------------------------------------------------

std::optional<Value> json_object(const KafkaRecord& r, const std::string& topic) {
  Result<Value> v = Value::from_json(r.value);
  if (!v.ok() || !v->is_object()) {
    ADD_FAILURE() << "not a JSON object in " << topic << " at " << r.partition << "/" << r.offset << ": " << r.value;
    return std::nullopt;
  }
  return std::move(*v);
}

CommittedReader::CommittedReader(const std::string& bootstrap, std::string topic, int partitions, OnRecord on_record)
    : topic_(std::move(topic)), partitions_(partitions), on_record_(std::move(on_record)) {
  namespace kafka = sluice::testing::kafka;
  consumer_ = kafka::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", bootstrap},
                                                     {"group.id", sluice::testing::unique_name("chaos-reader")},
                                                     {"isolation.level", "read_committed"},
                                                     {"enable.auto.commit", "false"},
                                                     {"enable.partition.eof", "true"}});
  next_.assign(static_cast<size_t>(partitions_), 0);
  if (!consumer_) return;
  kafka::PartitionList list(rd_kafka_topic_partition_list_new(partitions_));
  for (int p = 0; p < partitions_; ++p)
    rd_kafka_topic_partition_list_add(list.get(), topic_.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  EXPECT_EQ(rd_kafka_assign(consumer_.get(), list.get()), RD_KAFKA_RESP_ERR_NO_ERROR);
}

CommittedReader::~CommittedReader() = default;

bool CommittedReader::poll(std::chrono::milliseconds wait) {
  testing::kafka::Message m(rd_kafka_consumer_poll(consumer_.get(), static_cast<int>(wait.count())));
  if (!m) return false;
  if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
    at_end_.insert(m->partition);
    return false;
  }
  if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) return false;  // transient: librdkafka retries
  at_end_.erase(m->partition);
  if (m->partition >= 0 && m->partition < partitions_) next_[static_cast<size_t>(m->partition)] = m->offset + 1;
  KafkaRecord r;
  r.partition = m->partition;
  r.offset = m->offset;
  if (m->key != nullptr) r.key.assign(static_cast<const char*>(m->key), m->key_len);
  if (m->payload != nullptr) r.value.assign(static_cast<const char*>(m->payload), m->len);
  r.tombstone = m->payload == nullptr;
  ++count_;
  on_record_(r);
  return true;
}

void CommittedReader::read_for(std::chrono::milliseconds d) {
  if (!consumer_) return;
  const auto end = Clock::now() + d;
  while (Clock::now() < end)
    poll(100ms);
}

bool CommittedReader::drain(std::chrono::milliseconds deadline, std::chrono::milliseconds quiet) {
  if (!consumer_) return false;
  const auto end = Clock::now() + deadline;
  auto last_record = Clock::now();
  while (static_cast<int>(at_end_.size()) < partitions_ || Clock::now() - last_record < quiet) {
    if (Clock::now() > end) return false;
    if (poll(100ms)) last_record = Clock::now();
  }
  return true;
}

bool CommittedReader::drain_to_watermarks(std::chrono::milliseconds deadline) {
  if (!consumer_) return false;
  std::vector<int64_t> high(static_cast<size_t>(partitions_), 0);
  for (int p = 0; p < partitions_; ++p) {
    int64_t lo = 0;
    if (rd_kafka_query_watermark_offsets(consumer_.get(), topic_.c_str(), p, &lo, &high[static_cast<size_t>(p)],
                                         10000) != RD_KAFKA_RESP_ERR_NO_ERROR)
      return false;
  }
  const auto end = Clock::now() + deadline;
  auto done = [&] {
    for (size_t p = 0; p < high.size(); ++p)
      if (next_[p] < high[p]) return false;
    return true;
  };
  while (!done()) {
    if (Clock::now() > end) return false;
    poll(200ms);
  }
  return true;
}

size_t count_duplicates(const std::vector<std::string>& ids) {
  std::map<std::string, size_t> n;
  for (const std::string& id : ids)
    ++n[id];
  size_t duplicates = 0;
  for (const auto& [id, k] : n)
    duplicates += k - 1;
  return duplicates;
}

}  // namespace sluice::chaos
