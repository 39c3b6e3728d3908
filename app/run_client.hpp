// The in-process client behind idemsaga::App::Start (include/idemsaga/app.hpp): the
// orchestrator the `orchestrator` command serves, published while it serves, and the
// adapter of the "start a run" use case (orchestrator/start_run.hpp) that runs on it.
//
// Thread-safe. The command publishes its Orchestrator once it is ready and withdraws it
// before destroying it; withdrawing waits for the client calls using it to return.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <shared_mutex>

#include "idemsaga/app.hpp"
#include "orchestrator/orchestrator.hpp"

namespace idemsaga::app {

class Serving {
 public:
  // Publishes `o`, or withdraws it (nullptr), waiting for the calls of With() using it.
  void Set(orchestrator::Orchestrator* o);
  // True once something is published, within `timeout`.
  bool WaitUntilSet(std::chrono::milliseconds timeout);
  // Runs `f(orchestrator)` while it stays published; false (and `f` not run) when nothing is.
  template <class F>
  bool With(F&& f) {
    std::shared_lock lock(mutex_);
    if (orchestrator_ == nullptr) return false;
    f(*orchestrator_);
    return true;
  }

 private:
  std::shared_mutex mutex_;
  std::condition_variable_any published_;
  orchestrator::Orchestrator* orchestrator_ = nullptr;
};

// Publishes an orchestrator for the scope's life.
class Published {
 public:
  Published(Serving& serving, orchestrator::Orchestrator& o) : serving_(serving) {
    serving_.Set(&o);
  }
  ~Published() { serving_.Set(nullptr); }
  Published(const Published&) = delete;
  Published& operator=(const Published&) = delete;

 private:
  Serving& serving_;
};

// App::Start: the run's first answer on a thread of its own, then its row until it ends.
std::shared_ptr<RunHandle::State> StartRun(std::shared_ptr<Serving> serving,
                                           const std::string& saga, const std::string& tenant,
                                           const std::string& key, nlohmann::json input);

}  // namespace idemsaga::app
