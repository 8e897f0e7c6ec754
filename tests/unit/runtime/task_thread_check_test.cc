// The task's "task thread only" services are checked (core/thread_checker.h): an operator that registers a
// processing-time timer from a thread of its own, instead of posting a mail, aborts the process naming
// Task::register_processing_timer where asserts are on (the debug, asan and tsan presets; CI's TSan stage). From
// the task thread, the same registration works. Release builds (NDEBUG) compile the check out.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "sluice/api/operator.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

// Registers one processing-time timer for each record, from the task thread or from a thread of its own.
class TimerRegisteringOperator final : public OneInputOperator<int64_t>, OutputOf<int64_t> {
 public:
  explicit TimerRegisteringOperator(bool from_own_thread) : from_own_thread_(from_own_thread) {}
  void process_element(int64_t&& record, TimestampMs ts) override {
    auto fired = fired_;
    auto register_timer = [this, fired] {
      services_->register_processing_timer(services_->processing_clock().now_ms(),
                                           [fired](TimestampMs) { fired->fetch_add(1); });
    };
    if (from_own_thread_) {
      std::thread(register_timer).join();  // the mistake: TaskServices is task thread only
    } else {
      register_timer();
    }
    typed(main_output_)->collect(std::move(record), ts);
  }
  void finish() override { typed(main_output_)->collect(fired_->load(), kNoTimestamp); }

 private:
  bool from_own_thread_;
  std::shared_ptr<std::atomic<int64_t>> fired_ = std::make_shared<std::atomic<int64_t>>(0);
};

template <class T>
struct OperatorAdder : DataStream<T> {
  explicit OperatorAdder(const DataStream<T>& s) : DataStream<T>(s) {}
  template <class U, class Make>
  DataStream<U> add(std::string name, Make make) {
    return this->template transform<U>(std::move(name), false, std::move(make));
  }
};

JobResult run_job(bool from_own_thread, std::shared_ptr<testing::CollectedRecords<int64_t>> out) {
  StreamEnvironment env;
  env.set_parallelism(1);
  OperatorAdder<int64_t>(env.from_source(datagen::sequence(1, 20), "n"))
      .add<int64_t>("Timers", [from_own_thread] { return std::make_unique<TimerRegisteringOperator>(from_own_thread); })
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(out));
  return env.execute();
}

TEST(TaskThreadCheckTest, TimersRegisteredOnTheTaskThreadFire) {
  auto out = std::make_shared<testing::CollectedRecords<int64_t>>();
  JobResult r = run_job(false, out);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  const std::vector<int64_t> all = out->all();
  ASSERT_EQ(all.size(), 21u);
  EXPECT_LE(all.back(), 20);  // timers due at once fire between records; the count at finish
}

TEST(TaskThreadCheckDeathTest, ATimerRegisteredFromAnotherThreadAbortsNamingTheService) {
#ifdef NDEBUG
  GTEST_SKIP() << "the check is compiled out under NDEBUG (release); the debug, asan and tsan presets run it";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_job(true, std::make_shared<testing::CollectedRecords<int64_t>>()),
               "Task::register_processing_timer \\(TaskServices, task thread only\\) called on a thread that does "
               "not own it");
#endif
}

}  // namespace
}  // namespace sluice
