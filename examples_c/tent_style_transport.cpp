// tent_style_transport: liborbite behind a TENT-style transport interface.
//
// TENT-style stacks drive each transport through the same small interface:
// install / uninstall, add and remove memory buffers, allocate a sub-batch,
// submit transfer tasks into it, poll task status. This file shows that
// interface implemented on liborbite's C ABI, so such a stack can drop
// OrbiTE in as its NVLink / MNNVL (or TCP / SHM) transport. The main()
// below runs it between two engines on loopback.
#include <orbite.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <chrono>
#include <string>
#include <vector>

namespace tent_style {

enum class OpCode { kRead, kWrite };
enum class TaskState { kPending, kCompleted, kFailed };

struct Request {
  OpCode opcode;
  void *source;            // local buffer
  uint64_t target_offset;  // absolute address in the remote segment
  size_t length;
};

struct TaskStatus {
  TaskState state;
  orbite_status status;   // exact outcome from liborbite
  uint32_t remote_effect; // ORBITE_REMOTE_EFFECT_*
};

// The abstract transport a TENT-style engine talks to.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual void install(const std::string &config_json) = 0;
  virtual void uninstall() = 0;
  virtual void addMemoryBuffer(void *addr, size_t length, bool remote_read, bool remote_write) = 0;
  virtual void removeMemoryBuffer(void *addr) = 0;
  virtual int allocateSubBatch() = 0;
  virtual void freeSubBatch(int sub_batch) = 0;
  virtual void submitTransferTasks(int sub_batch, const std::string &segment, const std::vector<Request> &tasks) = 0;
  virtual TaskStatus getTransferStatus(int sub_batch, size_t task_id) = 0;
};

// Throws with liborbite's own words when a call fails.
static void check(orbite_status s, const char *what) {
  if (s != ORBITE_STATUS_OK)
    throw std::runtime_error(std::string(what) + ": " + orbite_status_name(s) + ": " + orbite_last_error());
}

class OrbiteTransport final : public Transport {
 public:
  ~OrbiteTransport() override { uninstall(); }

  void install(const std::string &config_json) override {
    check(orbite_engine_new(config_json.c_str(), &engine_), "orbite_engine_new");
  }

  void uninstall() override {
    if (!engine_) return;
    for (auto &sb : sub_batches_)
      for (orbite_batch *b : sb.second.batches) orbite_batch_free(b);
    sub_batches_.clear();
    orbite_close(engine_, 10000);  // releases imports before waiting for exports
    orbite_engine_free(engine_);
    engine_ = nullptr;
  }

  std::string endpoint() const {
    char buf[128];
    size_t len = 0;
    check(orbite_engine_endpoint(engine_, buf, sizeof buf, &len), "orbite_engine_endpoint");
    return buf;
  }

  void addMemoryBuffer(void *addr, size_t length, bool remote_read, bool remote_write) override {
    uint32_t access = (remote_read ? ORBITE_ACCESS_READ : 0u) | (remote_write ? ORBITE_ACCESS_WRITE : 0u);
    uint64_t region = 0;
    check(orbite_register_memory(engine_, addr, length, access, &region), "orbite_register_memory");
    regions_[addr] = region;
  }

  void removeMemoryBuffer(void *addr) override {
    auto it = regions_.find(addr);
    if (it == regions_.end()) return;
    check(orbite_unregister_memory(engine_, it->second, 0), "orbite_unregister_memory");
    regions_.erase(it);
  }

  int allocateSubBatch() override {
    int id = next_sub_batch_++;
    sub_batches_[id] = SubBatch{};
    return id;
  }

  void freeSubBatch(int sub_batch) override {
    auto it = sub_batches_.find(sub_batch);
    if (it == sub_batches_.end()) return;
    for (orbite_batch *b : it->second.batches) orbite_batch_free(b);  // detaches, never cancels mid-copy
    sub_batches_.erase(it);
  }

  // A "segment" is the peer's endpoint; connections are made once and reused.
  void submitTransferTasks(int sub_batch, const std::string &segment, const std::vector<Request> &tasks) override {
    SubBatch &sb = sub_batches_.at(sub_batch);
    uint64_t peer = peerFor(segment);
    std::vector<orbite_request> reqs;
    reqs.reserve(tasks.size());
    for (const Request &t : tasks)
      reqs.push_back(orbite_request{static_cast<uint32_t>(t.opcode == OpCode::kRead ? ORBITE_OP_READ : ORBITE_OP_WRITE),
                                    static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.source)), t.target_offset,
                                    static_cast<uint64_t>(t.length)});
    orbite_submit_options opts{ORBITE_TRANSPORT_AUTO, 0};
    orbite_batch *batch = nullptr;
    check(orbite_submit(engine_, peer, reqs.data(), reqs.size(), &opts, &batch), "orbite_submit");
    for (size_t i = 0; i < tasks.size(); i++) sb.task_index.push_back({sb.batches.size(), i});
    sb.batches.push_back(batch);
    sb.sizes.push_back(tasks.size());
  }

  TaskStatus getTransferStatus(int sub_batch, size_t task_id) override {
    SubBatch &sb = sub_batches_.at(sub_batch);
    auto where = sb.task_index.at(task_id);
    orbite_batch *b = sb.batches[where.first];
    orbite_batch_poll(b);  // OK, PENDING or TRANSFER_FAILED; the per-task result is below
    std::vector<orbite_request_result> res(sb.sizes[where.first]);
    check(orbite_batch_results(b, res.data(), res.size()), "orbite_batch_results");
    const orbite_request_result &r = res[where.second];
    TaskState st = r.status == ORBITE_STATUS_PENDING ? TaskState::kPending
                   : r.status == ORBITE_STATUS_OK    ? TaskState::kCompleted
                                                     : TaskState::kFailed;
    return TaskStatus{st, r.status, r.remote_effect};
  }

 private:
  struct SubBatch {
    std::vector<orbite_batch *> batches;
    std::vector<size_t> sizes;
    std::vector<std::pair<size_t, size_t>> task_index;  // task id -> (batch, request)
  };

  uint64_t peerFor(const std::string &segment) {
    auto it = peers_.find(segment);
    if (it != peers_.end()) return it->second;
    uint64_t peer = 0;
    check(orbite_connect(engine_, segment.c_str(), 10000, &peer), "orbite_connect");
    peers_[segment] = peer;
    return peer;
  }

  orbite_engine *engine_ = nullptr;
  std::map<void *, uint64_t> regions_;
  std::map<std::string, uint64_t> peers_;
  std::map<int, SubBatch> sub_batches_;
  int next_sub_batch_ = 1;
};

}  // namespace tent_style

int main() {
  using namespace tent_style;
  try {
    std::vector<uint8_t> remote(1 << 20), local(1 << 20, 0);
    for (size_t i = 0; i < remote.size(); i++) remote[i] = static_cast<uint8_t>(i * 3);

    OrbiteTransport source, requester;
    source.install("{}");
    requester.install("{}");
    source.addMemoryBuffer(remote.data(), remote.size(), true, true);
    requester.addMemoryBuffer(local.data(), local.size(), false, false);

    int sb = requester.allocateSubBatch();
    std::vector<Request> tasks;
    for (size_t off = 0; off < remote.size(); off += 64 * 1024)
      tasks.push_back(Request{OpCode::kRead, local.data() + off,
                              static_cast<uint64_t>(reinterpret_cast<uintptr_t>(remote.data() + off)), 64 * 1024});
    requester.submitTransferTasks(sb, source.endpoint(), tasks);

    size_t done = 0;
    for (size_t t = 0; t < tasks.size(); t++) {
      TaskStatus st;
      // Poll as a TENT-style engine does, yielding the CPU between polls.
      while ((st = requester.getTransferStatus(sb, t)).state == TaskState::kPending)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      done += st.state == TaskState::kCompleted;
    }
    requester.freeSubBatch(sb);
    bool same = std::memcmp(local.data(), remote.data(), local.size()) == 0;
    std::printf("tent-style transport: %zu/%zu tasks completed, bytes %s\n", done, tasks.size(),
                same ? "identical" : "DIFFER");
    requester.removeMemoryBuffer(local.data());
    source.removeMemoryBuffer(remote.data());
    requester.uninstall();
    source.uninstall();
    return (done == tasks.size() && same) ? 0 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
