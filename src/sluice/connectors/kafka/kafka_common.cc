#include "sluice/connectors/kafka/kafka_common.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <thread>

#include "sluice/core/assign_or_return.h"
#include "sluice/core/redact.h"

namespace sluice::kafka {

namespace {

// librdkafka calls this from its internal threads (spdlog's default logger is thread-safe).
void log_to_spdlog(const rd_kafka_t* rk, int level, const char* facility, const char* message) {
  const char* name = rk != nullptr ? rd_kafka_name(rk) : "rdkafka";
  spdlog::level::level_enum lvl = spdlog::level::debug;
  if (level <= 3) {
    lvl = spdlog::level::err;
  } else if (level == 4) {
    lvl = spdlog::level::warn;
  } else if (level <= 6) {
    lvl = spdlog::level::info;
  }
  spdlog::log(lvl, "librdkafka {} [{}]: {}", name, facility, redact_secrets(message));
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

}  // namespace

bool is_secret_property(std::string_view key) noexcept {
  return is_secret_key(key) || contains(key, "password") || contains(key, "secret") || contains(key, "sasl.jaas") ||
         contains(key, "sasl.oauthbearer.config") || key.ends_with(".pem") || key.ends_with("ssl.key") ||
         key == "ssl_key";
}

std::string printable_property_value(std::string_view key, std::string_view value) {
  return is_secret_property(key) ? std::string("<redacted>") : std::string(value);
}

std::string kafka_error_text(rd_kafka_resp_err_t err) {
  return fmt::format("{}: {}", rd_kafka_err2name(err), rd_kafka_err2str(err));
}

std::string kafka_error_text(const rd_kafka_error_t* error) {
  if (error == nullptr) return {};
  return fmt::format("{}: {}", rd_kafka_error_name(error), rd_kafka_error_string(error));
}

Error kafka_error(ErrorCode code, std::string_view context, rd_kafka_resp_err_t err) {
  return Error(code, fmt::format("{}: {}", context, kafka_error_text(err)));
}

bool is_permanent_kafka_error(rd_kafka_resp_err_t err) noexcept {
  switch (err) {
    case RD_KAFKA_RESP_ERR__FATAL:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR__SSL:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__NOT_CONFIGURED:
    case RD_KAFKA_RESP_ERR__FENCED:
    case RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
    case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
      return true;
    default:
      return false;
  }
}

Result<KafkaConfPtr> make_kafka_conf(const KafkaProperties& properties, std::string_view role) {
  KafkaConfPtr conf(rd_kafka_conf_new());
  std::array<char, 512> errstr{};
  for (const auto& [key, value] : properties) {
    if (rd_kafka_conf_set(conf.get(), key.c_str(), value.c_str(), errstr.data(), errstr.size()) != RD_KAFKA_CONF_OK) {
      // librdkafka's reason may quote the value: a secret one must not reach the message.
      std::string reason = redact_secrets(errstr.data());
      if (is_secret_property(key) && !value.empty()) {
        for (size_t at = reason.find(value); at != std::string::npos; at = reason.find(value, at))
          reason.replace(at, value.size(), "<redacted>");
      }
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{}: invalid client property '{}' = '{}': {} (properties are librdkafka's, see its "
                               "CONFIGURATION.md)",
                               role, key, printable_property_value(key, value), reason));
    }
  }
  rd_kafka_conf_set_log_cb(conf.get(), &log_to_spdlog);
  return conf;
}

Result<KafkaClientPtr> make_kafka_client(rd_kafka_type_t type, KafkaConfPtr conf, std::string_view role) {
  std::array<char, 512> errstr{};
  rd_kafka_t* rk = rd_kafka_new(type, conf.get(), errstr.data(), errstr.size());
  if (rk == nullptr) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: cannot create the Kafka {}: {}", role,
                             type == RD_KAFKA_PRODUCER ? "producer" : "consumer", redact_secrets(errstr.data())));
  }
  conf.release();  // owned by rk now
  return KafkaClientPtr(rk);
}

void KafkaPermanentErrorCapture::install(rd_kafka_conf_t* conf) {
  rd_kafka_conf_set_opaque(conf, this);
  rd_kafka_conf_set_error_cb(conf, &KafkaPermanentErrorCapture::error_cb);
}

std::string KafkaPermanentErrorCapture::get() const {
  std::lock_guard lock(mu_);
  return error_;
}

void KafkaPermanentErrorCapture::error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
  auto* self = static_cast<KafkaPermanentErrorCapture*>(opaque);
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  std::string text;
  if (code == RD_KAFKA_RESP_ERR__FATAL) {
    char buf[512];
    const rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf, sizeof buf);
    text = fmt::format("{}: {}", rd_kafka_err2name(orig), buf);
  } else if (is_permanent_kafka_error(code)) {
    text = fmt::format("{}: {}", rd_kafka_err2name(code), reason);
  } else {
    spdlog::debug("librdkafka {}: {}: {}", rd_kafka_name(rk), rd_kafka_err2name(code), redact_secrets(reason));
    return;
  }
  std::lock_guard lock(self->mu_);
  if (self->error_.empty()) self->error_ = redact_secrets(text);
}

Result<std::vector<KafkaTopicInfo>> fetch_topic_metadata(rd_kafka_t* rk, const std::vector<std::string>& topics,
                                                         std::chrono::milliseconds timeout,
                                                         std::string_view bootstrap_servers,
                                                         const std::function<std::string()>& permanent_error) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  rd_kafka_resp_err_t last = RD_KAFKA_RESP_ERR__TIMED_OUT;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    // One attempt waits at most 5 s, so a broker that becomes reachable is seen soon.
    const int attempt_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 100, 5000));
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t err = rd_kafka_metadata(rk, /*all_topics=*/1, nullptr, &md, attempt_ms);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      KafkaMetadataPtr owned(md);
      std::vector<KafkaTopicInfo> out;
      auto info_of = [](const rd_kafka_metadata_topic_t& t) { return KafkaTopicInfo{t.topic, t.partition_cnt, t.err}; };
      if (topics.empty()) {
        out.reserve(static_cast<size_t>(md->topic_cnt));
        for (int i = 0; i < md->topic_cnt; ++i)
          out.push_back(info_of(md->topics[i]));
      } else {
        for (const std::string& name : topics) {
          KafkaTopicInfo info{name, 0, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART};
          for (int i = 0; i < md->topic_cnt; ++i) {
            if (name == md->topics[i].topic) info = info_of(md->topics[i]);
          }
          out.push_back(std::move(info));
        }
      }
      return out;
    }
    last = err;
    if (is_permanent_kafka_error(err)) {
      return kafka_error(ErrorCode::kConnector,
                         fmt::format("the Kafka cluster at '{}' refused the metadata request", bootstrap_servers), err);
    }
    if (permanent_error) {
      rd_kafka_poll(rk, 0);  // serves the error callback
      if (std::string why = permanent_error(); !why.empty()) {
        return Error(ErrorCode::kConnector,
                     fmt::format("the Kafka cluster at '{}' refused the client: {}; check the security settings "
                                 "(security.protocol, sasl.*, ssl.*)",
                                 bootstrap_servers, why));
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    // rd_kafka_metadata returns at once while no broker connection is up: do not spin.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(
        100, std::max<int64_t>(
                 0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
                        .count()))));
  }
  return Error(ErrorCode::kConnector,
               fmt::format("cannot reach the Kafka cluster at '{}' within {} ms: {}; check bootstrap.servers, the "
                           "security settings and that the brokers run",
                           bootstrap_servers, timeout.count(), kafka_error_text(last)));
}

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Result<std::unique_ptr<KafkaLivenessProbe>> KafkaLivenessProbe::start(rd_kafka_type_t type, KafkaProperties properties,
                                                                      std::chrono::milliseconds timeout,
                                                                      std::string who, std::function<void()> on_failure,
                                                                      ConnectionWatch watch) {
  if (type == RD_KAFKA_PRODUCER) {
    properties.erase("transactional.id");
    properties.erase("transaction.timeout.ms");
    properties["enable.idempotence"] = "false";  // no InitProducerId round trip
  } else {
    properties.erase("group.id");  // a client outside any group: it never joins or commits
    properties.erase("group.instance.id");
    properties["enable.auto.commit"] = "false";
  }
  properties["client.id"] = "sluice-liveness-probe";
  const std::string bootstrap = properties.count("bootstrap.servers") ? properties["bootstrap.servers"] : "";
  SLUICE_ASSIGN_OR_RETURN(KafkaConfPtr conf, make_kafka_conf(properties, who));
  std::unique_ptr<KafkaLivenessProbe> probe(
      new KafkaLivenessProbe(timeout, std::move(who), bootstrap, std::move(on_failure), std::move(watch)));
  rd_kafka_conf_set_opaque(conf.get(), probe.get());
  rd_kafka_conf_set_error_cb(conf.get(), &KafkaLivenessProbe::error_cb);
  SLUICE_ASSIGN_OR_RETURN(KafkaClientPtr client, make_kafka_client(type, std::move(conf), probe->who_));
  probe->client_ = std::move(client);
  probe->thread_ = std::thread([p = probe.get()] { p->run(); });
  return probe;
}

KafkaLivenessProbe::KafkaLivenessProbe(std::chrono::milliseconds timeout, std::string who, std::string bootstrap,
                                       std::function<void()> on_failure, ConnectionWatch watch)
    : watch_(std::move(watch)),
      timeout_(timeout),
      who_(std::move(who)),
      bootstrap_(std::move(bootstrap)),
      on_failure_(std::move(on_failure)),
      last_answer_ns_(steady_ns()) {}

KafkaLivenessProbe::~KafkaLivenessProbe() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watch_.board) watch_.board->remove(watch_.subtask);
}

void KafkaLivenessProbe::error_cb(rd_kafka_t* /*rk*/, int err, const char* reason, void* opaque) {
  auto* self = static_cast<KafkaLivenessProbe*>(opaque);
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  std::lock_guard lock(self->mu_);
  // "all brokers down" says more than the transport error of one of them that usually comes with it.
  if (code != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && self->client_error_.starts_with("all brokers down")) return;
  self->client_error_ = code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN
                            ? fmt::format("all brokers down ({})", reason)
                            : fmt::format("{}: {}", rd_kafka_err2name(code), reason);
}

void KafkaLivenessProbe::run() {
  // Watching a source's connection needs rounds shorter than kDisconnectedAfter; failure alone does not.
  auto interval =
      std::clamp<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(100), std::chrono::seconds(5));
  int request_ms = static_cast<int>(std::clamp<int64_t>(timeout_.count() / 2, 500, 5000));
  if (watch_.board) {
    interval = timeout_.count() > 0 ? std::min<std::chrono::milliseconds>(interval, std::chrono::seconds(1))
                                    : std::chrono::milliseconds(std::chrono::seconds(1));
    request_ms = std::min(request_ms, 2500);
    if (timeout_.count() <= 0) request_ms = 2500;
    watch_.board->set_connected(watch_.subtask, steady_ns() / 1'000'000);
  }
  bool failed = false;
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    rd_kafka_poll(client_.get(), 0);  // serves error_cb
    const auto sent = std::chrono::steady_clock::now();
    const rd_kafka_metadata_t* md = nullptr;
    // No topic: the broker answers with the cluster's brokers only (all_topics=0 and no topic handle). On a
    // client that never used a topic the request names none.
    const rd_kafka_resp_err_t err = rd_kafka_metadata(client_.get(), /*all_topics=*/0, nullptr, &md, request_ms);
    if (md != nullptr) rd_kafka_metadata_destroy(md);
    rd_kafka_poll(client_.get(), 0);
    lock.lock();
    const int64_t now_ns = steady_ns();
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      last_answer_ns_.store(now_ns, std::memory_order_relaxed);
      failed = false;
      client_error_.clear();
      if (watch_.board) watch_.board->set_connected(watch_.subtask, now_ns / 1'000'000);
    } else {
      last_error_ = kafka_error_text(err);
      const int64_t last_answer_ns = last_answer_ns_.load(std::memory_order_relaxed);
      const int64_t silent_ms = (now_ns - last_answer_ns) / 1'000'000;
      if (watch_.board && silent_ms > kDisconnectedAfter.count()) {
        watch_.board->set_disconnected(watch_.subtask, last_answer_ns / 1'000'000,
                                       fmt::format("no broker of '{}' answers: {}", bootstrap_,
                                                   client_error_.empty() ? last_error_ : client_error_));
      }
      if (!failed && timeout_.count() > 0 && silent_ms > timeout_.count()) {
        failed = true;
        if (on_failure_) {
          lock.unlock();
          on_failure_();
          lock.lock();
        }
      }
    }
    // rd_kafka_metadata returns at once while no connection is up: wait out the interval from the send.
    cv_.wait_until(lock, sent + interval, [this] { return stop_; });
  }
}

std::optional<std::string> KafkaLivenessProbe::failure() const {
  if (timeout_.count() <= 0) return std::nullopt;
  const int64_t silent_ms = (steady_ns() - last_answer_ns_.load(std::memory_order_relaxed)) / 1'000'000;
  if (silent_ms <= timeout_.count()) return std::nullopt;
  std::string last;
  {
    std::lock_guard lock(mu_);
    last = last_error_.empty() ? std::string("no answer") : last_error_;
  }
  return fmt::format(
      "{}: no broker of '{}' answered for {} ms (liveness timeout {} ms; last: {}): is the Kafka cluster down, "
      "paused or unreachable from here?",
      who_, bootstrap_, silent_ms, timeout_.count(), last);
}

}  // namespace sluice::kafka
