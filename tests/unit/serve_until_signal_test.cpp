// ServeUntilSignal, every serving command's lifetime: services serve on threads of their own, a
// stop signal (or a dependency gone) ends the wait, and they stop in the reverse order they
// started, each thread joined, even when a start-up step or a stop throws.
#include "app/serve_until_signal.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "app/signals.hpp"

namespace {

using idemsaga::app::ServeUntilSignal;

// What happened, in order, across the services' threads.
class Events {
 public:
  void Add(const std::string& e) {
    std::lock_guard lock(mu_);
    events_.push_back(e);
  }
  std::vector<std::string> All() {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> events_;
};

// A service whose Serve blocks until Stop, as a server's does.
class FakeService {
 public:
  FakeService(std::string name, Events& events) : name_(std::move(name)), events_(events) {}
  void Serve() {
    std::unique_lock lock(mu_);
    serving_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return stopped_; });
    events_.Add(name_ + " returned");
  }
  void Stop() {
    events_.Add("stop " + name_);
    std::lock_guard lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }
  void WaitServing() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return serving_; });
  }

 private:
  std::string name_;
  Events& events_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false;
  bool stopped_ = false;
};

class ServeUntilSignalTest : public ::testing::Test {
 protected:
  // Before any thread of the test starts, as main() does: only Wait() sees the signals.
  static void SetUpTestSuite() { idemsaga::app::BlockStopSignals(); }

  void Add(ServeUntilSignal& serving, FakeService& s) {
    serving.Add([&s] { s.Serve(); }, [&s] { s.Stop(); });
  }
};

TEST_F(ServeUntilSignalTest, ASigtermEndsTheWaitAndTheServicesStopInReverseOrder) {
  Events events;
  FakeService a("a", events), b("b", events), c("c", events);
  ServeUntilSignal serving("test");
  Add(serving, a);
  Add(serving, b);
  Add(serving, c);
  a.WaitServing();
  b.WaitServing();
  c.WaitServing();
  std::thread signaller([] { kill(getpid(), SIGTERM); });
  testing::internal::CaptureStdout();
  int sig = serving.Wait("test ready on http://127.0.0.1:1");
  std::string out = testing::internal::GetCapturedStdout();
  signaller.join();
  EXPECT_EQ(sig, SIGTERM);
  EXPECT_EQ(out, "test ready on http://127.0.0.1:1\n");
  EXPECT_TRUE(events.All().empty()) << "nothing stops before Stop()";
  serving.Stop();
  EXPECT_EQ(events.All(), (std::vector<std::string>{"stop c", "c returned", "stop b", "b returned",
                                                    "stop a", "a returned"}));
  serving.Stop();  // once
  EXPECT_EQ(events.All().size(), 6u);
}

TEST_F(ServeUntilSignalTest, ASigintEndsTheWaitToo) {
  Events events;
  FakeService a("a", events);
  ServeUntilSignal serving("test");
  Add(serving, a);
  std::thread signaller([] { kill(getpid(), SIGINT); });
  testing::internal::CaptureStdout();
  EXPECT_EQ(serving.Wait("ready"), SIGINT);
  testing::internal::GetCapturedStdout();
  signaller.join();
  serving.Stop();
  EXPECT_EQ(events.All(), (std::vector<std::string>{"stop a", "a returned"}));
}

TEST_F(ServeUntilSignalTest, ADependencyGoneEndsTheWaitWithZero) {
  Events events;
  FakeService a("a", events);
  ServeUntilSignal serving("test");
  Add(serving, a);
  std::atomic<int> asked{0};
  testing::internal::CaptureStdout();
  int sig = serving.Wait(
      "ready", [&] { return ++asked < 3; }, std::chrono::milliseconds(10));
  testing::internal::GetCapturedStdout();
  EXPECT_EQ(sig, 0);
  EXPECT_EQ(asked.load(), 3);
  serving.Stop();
  EXPECT_EQ(events.All(), (std::vector<std::string>{"stop a", "a returned"}));
}

TEST_F(ServeUntilSignalTest, AStartUpFailureStillStopsWhatStarted) {
  Events events;
  FakeService a("a", events);
  EXPECT_THROW(
      {
        ServeUntilSignal serving("test");
        Add(serving, a);
        throw std::runtime_error("a start-up check failed");
      },
      std::runtime_error);
  EXPECT_EQ(events.All(), (std::vector<std::string>{"stop a", "a returned"}));
}

TEST_F(ServeUntilSignalTest, AStopThatThrowsStillStopsTheRestThenRethrows) {
  Events events;
  FakeService a("a", events);
  ServeUntilSignal serving("test");
  Add(serving, a);
  serving.Add(nullptr, [&] {
    events.Add("stop b");
    throw std::runtime_error("b would not stop");
  });
  EXPECT_THROW(serving.Stop(), std::runtime_error);
  EXPECT_EQ(events.All(), (std::vector<std::string>{"stop b", "stop a", "a returned"}));
}

}  // namespace
