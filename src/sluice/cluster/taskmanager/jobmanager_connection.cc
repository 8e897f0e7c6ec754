#include "sluice/cluster/taskmanager/jobmanager_connection.h"

#include <algorithm>

namespace sluice {

JobManagerConnection::JobManagerConnection(HeartbeatOptions heartbeat, RegistrationBackoff backoff)
    : own_heartbeat_(heartbeat), heartbeat_(heartbeat), backoff_(backoff) {}

JobManagerConnection::Action JobManagerConnection::next_action(TimestampMs now_ms) const {
  Action a;
  switch (state_) {
    case State::kRefused:
      a.kind = Action::Kind::kStop;
      return a;
    case State::kRegistering:
      if (now_ms >= next_attempt_ms_) {
        a.kind = Action::Kind::kRegister;
        a.deadline_ms = heartbeat_.timeout_ms;  // an attempt never waits longer than a heartbeat timeout
      } else {
        a.wait_until_ms = next_attempt_ms_;
      }
      return a;
    case State::kRegistered: {
      const TimestampMs lost_at = last_reply_ms_ + heartbeat_.timeout_ms;
      if (now_ms >= next_heartbeat_ms_) {
        a.kind = Action::Kind::kHeartbeat;
        // A call lasts at most one interval, so the calls that observe a silent JobManager start every
        // interval (check_jobmanager counts their start times) and the last one ends by the time it would be
        // declared lost.
        a.deadline_ms =
            now_ms >= lost_at ? heartbeat_.interval_ms : std::min<int64_t>(heartbeat_.interval_ms, lost_at - now_ms);
      } else {
        a.wait_until_ms = std::min(next_heartbeat_ms_, lost_at);
      }
      return a;
    }
  }
  return a;
}

void JobManagerConnection::on_registered(std::string registration_id, std::string jobmanager_id, HeartbeatOptions jm,
                                         TimestampMs now_ms) {
  state_ = State::kRegistered;
  registration_id_ = std::move(registration_id);
  jobmanager_id_ = std::move(jobmanager_id);
  heartbeat_ = own_heartbeat_;
  if (jm.interval_ms > 0 && jm.timeout_ms > jm.interval_ms) heartbeat_ = jm;
  failed_attempts_ = 0;
  ++registrations_;
  last_reply_ms_ = now_ms;
  last_failure_ms_ = 0;
  next_heartbeat_ms_ = now_ms + heartbeat_.interval_ms;
}

int64_t JobManagerConnection::on_registration_failed(TimestampMs now_ms) {
  ++failed_attempts_;
  int64_t wait = backoff_.initial_ms;
  for (int i = 1; i < failed_attempts_ && wait < backoff_.max_ms; ++i)
    wait *= 2;
  wait = std::min(wait, backoff_.max_ms);
  next_attempt_ms_ = now_ms + wait;
  return wait;
}

void JobManagerConnection::on_refused() {
  state_ = State::kRefused;
  registration_id_.clear();
}

void JobManagerConnection::on_heartbeat_ok(TimestampMs now_ms) {
  if (state_ != State::kRegistered) return;
  last_reply_ms_ = std::max(last_reply_ms_, now_ms);
  next_heartbeat_ms_ = now_ms + heartbeat_.interval_ms;
}

void JobManagerConnection::on_heartbeat_failed(TimestampMs sent_ms) {
  if (state_ != State::kRegistered) return;
  last_failure_ms_ = std::max(last_failure_ms_, sent_ms);
  next_heartbeat_ms_ = sent_ms + heartbeat_.interval_ms;
}

void JobManagerConnection::heartbeat_now(TimestampMs now_ms) {
  if (state_ != State::kRegistered) return;
  next_heartbeat_ms_ = std::min(next_heartbeat_ms_, now_ms);
}

void JobManagerConnection::on_registration_unknown(TimestampMs now_ms) {
  if (state_ != State::kRegistered) return;
  reregister(now_ms);
}

void JobManagerConnection::on_tasks_fenced(TimestampMs now_ms) {
  if (state_ != State::kRegistered) return;
  reregister(now_ms);
}

bool JobManagerConnection::check_jobmanager(TimestampMs now_ms) {
  if (state_ != State::kRegistered || now_ms - last_reply_ms_ < heartbeat_.timeout_ms) return false;
  // Silence must have been observed, not slept through: a heartbeat sent within the last interval before the
  // timeout failed. A process that was paused (SIGSTOP, a suspended VM) past the timeout asks once first, and
  // learns from the answer whether its registration is stale or the JobManager is gone.
  if (last_failure_ms_ < last_reply_ms_ + heartbeat_.timeout_ms - heartbeat_.interval_ms) return false;
  ++losses_;
  reregister(now_ms);
  return true;
}

void JobManagerConnection::reregister(TimestampMs now_ms) {
  state_ = State::kRegistering;
  registration_id_.clear();
  failed_attempts_ = 0;
  next_attempt_ms_ = now_ms;  // the first attempt at once, then the backoff
}

}  // namespace sluice
