// Copyright 2026 The OrbiTE Authors
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// The OrbiTE transport's own threads: a bounded pool for the work that may
// wait on a peer or on TENT's metadata service (connects, segment lookups,
// submissions that need a round trip), and one timer thread that ends
// tasks at their deadline. Neither runs anything of TENT's threads.
#ifndef ORBITE_TENT_WORKERS_H_
#define ORBITE_TENT_WORKERS_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace mooncake {
namespace tent {

/// A pool of at most `max` threads, started as jobs find none idle; jobs
/// beyond that wait, in order. A job posted `urgent` goes before the
/// others (a segment lookup another job waits for).
class OrbiteWorkers {
   public:
    explicit OrbiteWorkers(size_t max);
    ~OrbiteWorkers();

    OrbiteWorkers(const OrbiteWorkers&) = delete;
    OrbiteWorkers& operator=(const OrbiteWorkers&) = delete;

    /// Runs `job` on a pool thread; false (not run) once stopping.
    bool post(std::function<void()> job, bool urgent = false);

    /// Runs nothing more (queued jobs are dropped unrun) and waits up to
    /// `patience` for the running ones; a thread still in its job then is
    /// left to end it on its own (it owns nothing of the pool). The number
    /// of threads left so.
    size_t stop(std::chrono::milliseconds patience);

    /// Threads started so far (at most `max`).
    size_t threads() const;

   private:
    struct State;
    static void run(std::shared_ptr<State> state);
    std::shared_ptr<State> state_;
};

/// One thread that runs each job at its time (jobs must not block).
class OrbiteTimer {
   public:
    OrbiteTimer();
    ~OrbiteTimer();

    OrbiteTimer(const OrbiteTimer&) = delete;
    OrbiteTimer& operator=(const OrbiteTimer&) = delete;

    /// Runs `job` at `when` (at once when it has passed).
    void at(std::chrono::steady_clock::time_point when,
            std::function<void()> job);

    /// Runs nothing more; joins the thread.
    void stop();

   private:
    void loop();
    std::mutex lock_;
    std::condition_variable changed_;
    std::multimap<std::chrono::steady_clock::time_point, std::function<void()>>
        jobs_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace tent
}  // namespace mooncake

#endif  // ORBITE_TENT_WORKERS_H_
