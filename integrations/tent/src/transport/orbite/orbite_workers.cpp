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

#include "orbite_workers.h"

#include <utility>
#include <vector>

namespace mooncake {
namespace tent {

/// What the pool's threads share; each holds it, so a thread left in its
/// job at stop() outlives the pool safely.
struct OrbiteWorkers::State {
    explicit State(size_t limit) : max(limit ? limit : 1) {}
    const size_t max;
    std::mutex lock;
    std::condition_variable work;  ///< a job was posted, or stopping
    std::condition_variable idle;  ///< a job ended
    std::deque<std::function<void()>> jobs;
    std::vector<std::thread> threads;
    size_t waiting = 0;  ///< threads waiting for a job
    size_t running = 0;  ///< threads in a job
    bool stopping = false;
};

OrbiteWorkers::OrbiteWorkers(size_t max)
    : state_(std::make_shared<State>(max)) {}

OrbiteWorkers::~OrbiteWorkers() { stop(std::chrono::milliseconds(0)); }

bool OrbiteWorkers::post(std::function<void()> job, bool urgent) {
    std::lock_guard<std::mutex> g(state_->lock);
    if (state_->stopping) return false;
    if (urgent)
        state_->jobs.push_front(std::move(job));
    else
        state_->jobs.push_back(std::move(job));
    // A thread for it unless one waits for work (or the pool is full).
    if (state_->waiting < state_->jobs.size() &&
        state_->threads.size() < state_->max)
        state_->threads.emplace_back(run, state_);
    else
        state_->work.notify_one();
    return true;
}

void OrbiteWorkers::run(std::shared_ptr<State> s) {
    std::unique_lock<std::mutex> g(s->lock);
    for (;;) {
        ++s->waiting;
        s->work.wait(g, [&] { return s->stopping || !s->jobs.empty(); });
        --s->waiting;
        if (s->stopping) return;
        std::function<void()> job = std::move(s->jobs.front());
        s->jobs.pop_front();
        ++s->running;
        g.unlock();
        job();
        job = nullptr;  // what it held goes before the pool hears of it
        g.lock();
        --s->running;
        s->idle.notify_all();
    }
}

size_t OrbiteWorkers::stop(std::chrono::milliseconds patience) {
    std::vector<std::thread> threads;
    size_t left;
    {
        std::unique_lock<std::mutex> g(state_->lock);
        state_->stopping = true;
        state_->jobs.clear();
        state_->work.notify_all();
        state_->idle.wait_for(g, patience,
                              [&] { return state_->running == 0; });
        left = state_->running;
        threads.swap(state_->threads);
    }
    // Threads in a job when the patience ran out end it on their own; the
    // others are past their last job and are joined.
    for (std::thread& t : threads)
        if (left)
            t.detach();
        else
            t.join();
    return left;
}

size_t OrbiteWorkers::threads() const {
    std::lock_guard<std::mutex> g(state_->lock);
    return state_->threads.size();
}

OrbiteTimer::OrbiteTimer() : thread_([this] { loop(); }) {}

OrbiteTimer::~OrbiteTimer() { stop(); }

void OrbiteTimer::at(std::chrono::steady_clock::time_point when,
                     std::function<void()> job) {
    std::lock_guard<std::mutex> g(lock_);
    if (stopping_) return;
    bool first = jobs_.empty() || when < jobs_.begin()->first;
    jobs_.emplace(when, std::move(job));
    if (first) changed_.notify_one();
}

void OrbiteTimer::stop() {
    {
        std::lock_guard<std::mutex> g(lock_);
        stopping_ = true;
        jobs_.clear();
        changed_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
}

void OrbiteTimer::loop() {
    std::unique_lock<std::mutex> g(lock_);
    while (!stopping_) {
        if (jobs_.empty()) {
            changed_.wait(g);
            continue;
        }
        auto next = jobs_.begin()->first;
        if (std::chrono::steady_clock::now() < next) {
            changed_.wait_until(g, next);
            continue;
        }
        std::function<void()> job = std::move(jobs_.begin()->second);
        jobs_.erase(jobs_.begin());
        g.unlock();
        job();
        job = nullptr;
        g.lock();
    }
}

}  // namespace tent
}  // namespace mooncake
