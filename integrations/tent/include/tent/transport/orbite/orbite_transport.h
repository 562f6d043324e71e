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

// OrbiteTransport: OrbiTE (liborbite) behind TENT's Transport interface.
//
// One OrbiteTransport owns one OrbiTE engine. install() reads TENT's config
// under "transports/orbite/": "engine" (the engine's configuration, an
// object in OrbiTE's format, or a string holding one), "connect_timeout_ms"
// (5000), "unregister_timeout_ms" (1000) and "threads" (8); any other key
// there is warned about (glog) and ignored. Unless "engine" says otherwise
// the engine is named after the local segment and listens on the host of
// the segment's RPC address. Buffers TENT registers are published in the
// local segment with the engine's endpoint (transport_attrs[ORBITE]). A
// request names its target segment; the adapter groups each submission per
// target and submits one OrbiTE batch per target, over which the engine
// picks NVLink, MNNVL, SHM or TCP (its transport_policy).
//
// What TENT's engine may rely on:
// - submitTransferTasks never waits for a peer or for TENT's metadata
//   service: what needs a round trip (a connect with its segment lookup, a
//   region not reached yet or not known) runs on the adapter's own threads
//   (a pool of at most "threads"), the tasks PENDING meanwhile, later
//   submissions to that target queued behind in order.
// - Deadlines: a task not handed to OrbiTE within connect_timeout_ms of its
//   submission (the target's segment lookup or the target not answering)
//   ends TIMEOUT then, never sent: final in TENT, as its own transports'
//   timeouts (a FAILED task is failed over, and TENT's retry waits its RPC
//   timeout for such a target). One whose connect failed otherwise
//   (refused, the segment gone or without an ORBITE buffer) ends FAILED,
//   so TENT may fail it over. The segment lookup through TENT's metadata
//   service is bounded by the same deadline. Once handed to OrbiTE, the
//   engine's default_timeout_ms bounds it. No task stays PENDING past its
//   deadline.
// - A target that left (killed, restarted) is dropped: the next task to it
//   looks the segment up again and connects to whatever serves it now
//   (TENT's cached copies of the segment are refreshed then); tasks whose
//   submission found the peer gone before anything was sent go there too.
// - Every OrbiTE batch that ends calls the sub-batch's notifyProgress, so
//   TENT's progress worker fires hooked submissions without polling.
// - LOCAL_SEGMENT_ID (and the local segment named by id) is served by a
//   local copy between registered host buffers.
// - Buffers registered kGlobalReadOnly are readable by peers and never
//   writable; kLocalReadWrite ones are not reachable by peers at all.
// - cancelTransferTask cancels that task only (orbite_batch_cancel_request);
//   one that already started runs to its outcome.
// - A task naming a region a submission reached before, whose memory an
//   IPC transport maps (SHM, NVLink, MNNVL), is copied within
//   submitTransferTasks through a direct route (orbite_direct_copy),
//   COMPLETED when the call returns; one whose copy fails goes through the
//   pool and ends as OrbiTE says.
// - Notifications ride OrbiTE's: in order per sender, after every transfer
//   submitted to the target before them has ended there; TENT's
//   Notification.name travels with the message.
// - removeMemoryBuffer waits at most unregister_timeout_ms for copies of
//   the buffer; one still in use stays registered (unpublished) and is
//   retried at every registration change and at uninstall (logged).
// All methods may be called from several threads at once.
#ifndef ORBITE_TENT_TRANSPORT_H_
#define ORBITE_TENT_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <orbite.hpp>
#include <string>
#include <vector>

#include "tent/common/config.h"
#include "tent/runtime/transport.h"

namespace mooncake {
namespace tent {

class OrbiteWorkers;
class OrbiteTimer;

class OrbiteTransport : public Transport {
   public:
    OrbiteTransport();
    ~OrbiteTransport() override;

    Status install(std::string& local_segment_name,
                   std::shared_ptr<ControlService> metadata,
                   std::shared_ptr<Topology> local_topology,
                   std::shared_ptr<Config> conf = nullptr) override;
    Status uninstall() override;

    Status allocateSubBatch(SubBatchRef& batch, size_t max_size) override;
    Status freeSubBatch(SubBatchRef& batch) override;
    Status submitTransferTasks(
        SubBatchRef batch, const std::vector<Request>& request_list) override;
    Status getTransferStatus(SubBatchRef batch, int task_id,
                             TransferStatus& status) override;
    bool supportsCancellation() const override { return true; }
    Status cancelTransferTask(SubBatchRef batch, int task_id) override;

    Status allocateLocalMemory(void** addr, size_t size,
                               MemoryOptions& options) override;
    Status freeLocalMemory(void* addr, size_t size) override;
    Status addMemoryBuffer(BufferDesc& desc,
                           const MemoryOptions& options) override;
    Status removeMemoryBuffer(BufferDesc& desc) override;

    bool supportNotification() const override { return true; }
    Status sendNotification(SegmentID target_id,
                            const Notification& notify) override;
    /// Appends every notification received so far (does not wait).
    Status receiveNotification(std::vector<Notification>& notify_list) override;

    const char* getName() const override { return "orbite"; }

    /// The engine after install (for its stats), or null.
    orbite::Engine* engine() { return engine_ ? &*engine_ : nullptr; }
    /// Tasks copied through direct routes so far (no OrbiTE batch).
    uint64_t directCopies() const { return direct_copies_.load(); }
    /// Connections made to targets so far (first connects and reconnects).
    uint64_t connects() const { return connects_.load(); }
    /// Threads the adapter's pools started so far (bounded by "threads").
    size_t threads() const;

    struct Task;
    struct Tasks;
    struct Target;
    struct Buffer;
    struct Lookup;
    struct ProgressGate;

   private:
    /// The target record for `id` (made on first use).
    std::shared_ptr<Target> target(SegmentID id);
    /// Hands tasks `ids` of `tasks` to `t`: copied directly or submitted
    /// at once when they need no round trip; otherwise queued for a pool
    /// job (which connects first when needed), with their deadline.
    void dispatch(const std::shared_ptr<Target>& t,
                  const std::shared_ptr<Tasks>& tasks, std::vector<size_t> ids,
                  std::vector<orbite::Request> reqs);
    /// Starts a pool job for `t` (`t->lock` held, `t` made Busy).
    void startJob(const std::shared_ptr<Target>& t, bool reconnect);
    /// The pool job: with `reconnect`, looks the segment up and connects;
    /// then submits (or fails) what waits for `t`, reconnecting once when
    /// the peer turns out gone before a submission was sent.
    void runJob(std::shared_ptr<Target> t, bool reconnect);
    /// Looks `t`'s segment up (bounded by `deadline`) and connects; the
    /// outcome goes into `t` (a null peer and why when it failed).
    void connectTarget(const std::shared_ptr<Target>& t,
                       std::chrono::steady_clock::time_point deadline);
    /// The endpoint serving `t`'s segment, asked of TENT's metadata service
    /// on the lookup pool, waited for until `deadline`; "" with `why` (and
    /// `late` set when the deadline passed first).
    std::string lookUp(const std::shared_ptr<Target>& t,
                       std::chrono::steady_clock::time_point deadline,
                       std::string& why, std::string& segment_name, bool& late);
    /// What drain() came to.
    enum class Drained { Done, PeerLeft };
    /// Submits (or, without `peer`, fails) what waits for `t`, in order,
    /// until nothing does (then `t` is Ready, or Idle without a peer), or
    /// until a submission finds the peer gone before anything was sent
    /// (PeerLeft: what was not sent is queued again, first, `t` Busy).
    Drained drain(const std::shared_ptr<Target>& t,
                  const std::shared_ptr<orbite::Peer>& peer, uint64_t gen);
    /// Records `batch` for tasks `ids` of `tasks` (`tasks.lock` held): a
    /// task cancelled meanwhile is cancelled in OrbiTE; the batch's end
    /// calls TENT's progress hook.
    void recordBatch(const std::shared_ptr<Tasks>& tasks, orbite::Batch batch,
                     const std::vector<size_t>& ids,
                     const std::shared_ptr<Target>& t, uint64_t gen);
    /// Opens direct routes to the regions of `reached` not routed yet whose
    /// memory an IPC transport maps (a round trip each; pool job only).
    void openRoutes(const std::shared_ptr<Target>& t, orbite::Peer& peer,
                    const std::vector<orbite::Region>& regions,
                    const std::vector<uint64_t>& reached, uint64_t gen);
    /// Copies the tasks of `ids` (`reqs`) whose region has a direct route
    /// on this thread, each ending here; true when any completed. They
    /// leave `ids` and `reqs`; the others stay, in order, with those whose
    /// copy failed (their route dropped: they go through the pool).
    bool copyDirect(const std::shared_ptr<Target>& t, Tasks& tasks,
                    std::vector<size_t>& ids,
                    std::vector<orbite::Request>& reqs);
    /// Copies a local task between registered host buffers.
    bool copyLocally(const Request& r);
    /// Retries unregistering buffers TENT removed while copies still used
    /// them (buffers_lock_ held).
    void retireLocked();
    /// Reads the keys under transports/orbite (warning about unknown ones).
    Status readConfig(const Config& conf, std::string& engine_config);

    std::optional<orbite::Engine> engine_;
    std::shared_ptr<ControlService> metadata_;
    std::shared_ptr<Config> conf_;
    std::string local_name_;
    std::chrono::milliseconds connect_timeout_{5000};
    std::chrono::milliseconds unregister_timeout_{1000};
    size_t max_threads_ = 8;
    /// Connects and submissions needing a round trip (they use this
    /// object); segment lookups (they use only TENT's metadata service and
    /// their own record, so one stuck in TENT's RPC may outlive uninstall).
    std::unique_ptr<OrbiteWorkers> jobs_, lookups_;
    /// Ends tasks still waiting at their deadline.
    std::unique_ptr<OrbiteTimer> timer_;
    /// Closed at uninstall: no progress hook reaches TENT after it.
    std::shared_ptr<ProgressGate> gate_;

    std::mutex buffers_lock_;
    /// Registered buffers, by address.
    std::map<uint64_t, std::unique_ptr<Buffer>> buffers_;
    /// Buffers TENT removed whose unregister has not succeeded yet: still
    /// registered with OrbiTE, no longer published, retried on every
    /// registration change and at uninstall.
    std::vector<std::unique_ptr<Buffer>> retiring_;
    /// Memory allocated through allocateLocalMemory, by address.
    std::map<uint64_t, orbite::Allocation> allocations_;

    std::atomic<uint64_t> direct_copies_{0};
    std::atomic<uint64_t> connects_{0};

    std::mutex targets_lock_;
    std::map<SegmentID, std::shared_ptr<Target>> targets_;
};

}  // namespace tent
}  // namespace mooncake

#endif  // ORBITE_TENT_TRANSPORT_H_
