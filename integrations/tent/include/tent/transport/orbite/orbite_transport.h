// OrbiteTransport: OrbiTE (liborbite) behind TENT's Transport interface.
//
// One OrbiteTransport owns one OrbiTE engine. install() reads the engine's
// configuration from TENT's config under "transports/orbite/engine" (an
// object in OrbiTE's config format, docs/config.md) and binds the engine's
// listener to the host of the local segment's RPC address unless that
// config names "listen". Buffers TENT registers are published in the local
// segment with the engine's endpoint (transport_attrs[ORBITE]). A request
// names its target segment; the adapter groups each submission per target
// and submits one OrbiTE batch per target, over which the engine picks
// NVLink, MNNVL, SHM or TCP (its transport_policy).
//
// What TENT's engine may rely on:
// - submitTransferTasks never waits for a connect or a handshake: tasks for
//   a target not connected yet stay PENDING while a connector thread
//   reaches it, and end FAILED when it cannot within
//   "transports/orbite/connect_timeout_ms" (default 5000). Tasks naming a
//   region of a connected target not reached before (its import opened
//   with the peer) or not known (registered since: the peer is asked) are
//   submitted by a connector thread too, so a frozen peer holds only them.
// - LOCAL_SEGMENT_ID (and the local segment named by id) is served by a
//   local copy between registered host buffers.
// - A dead target's tasks end FAILED (OrbiTE's exact per-request outcome),
//   so TENT fails over; its next submission reconnects, reading the
//   segment again.
// - Buffers registered kGlobalReadOnly are readable by peers and never
//   writable; kLocalReadWrite ones are not reachable by peers at all.
// - cancelTransferTask cancels that task only (orbite_batch_cancel_request);
//   one that already started runs to its outcome.
// - A task naming a region a submission reached before, whose memory an
//   IPC transport maps (SHM, NVLink, MNNVL), is copied within
//   submitTransferTasks through a direct route (orbite_direct_copy), as
//   TENT's SHM transport copies: COMPLETED when the call returns. Its
//   outcome is still OrbiTE's: a copy that fails (the region unregistered,
//   the peer gone) sends the task through a connector thread, which
//   submits it and reports what OrbiTE says.
// - Notifications ride OrbiTE's: in order per sender, after every transfer
//   submitted to the target before them has ended there.
// All methods may be called from several threads at once.
#ifndef ORBITE_TENT_TRANSPORT_H_
#define ORBITE_TENT_TRANSPORT_H_

#include <orbite.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tent/common/config.h"
#include "tent/runtime/transport.h"

namespace mooncake {
namespace tent {

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
    Status submitTransferTasks(SubBatchRef batch,
                               const std::vector<Request>& request_list) override;
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

   public:
    struct Task;
    struct Tasks;
    struct Target;
    struct Buffer;

   private:
    /// The target record for `id` (made on first use).
    std::shared_ptr<Target> target(SegmentID id);
    /// Hands tasks `ids` of `tasks` to `t`: submitted at once when it is
    /// connected and they name only regions reached before; otherwise
    /// queued for a connector thread (which connects first when needed).
    void dispatch(const std::shared_ptr<Target>& t,
                  const std::shared_ptr<Tasks>& tasks,
                  std::vector<size_t> ids, std::vector<orbite::Request> reqs);
    /// What sending some tasks to a target came to: made without the
    /// tasks' lock, recorded under it.
    struct Sent {
        std::vector<size_t> ids;      ///< the tasks sent, in batch order
        std::vector<size_t> refused;  ///< tasks the peer's regions forbid
        /// The OrbiTE batch, or why not; empty when nothing was sent.
        std::optional<orbite::Result<orbite::Batch>> submitted;
    };
    /// Sends tasks `ids` (`reqs`) to `peer` as one OrbiTE batch (see the
    /// .cpp), without the tasks' lock: requests the peer's regions forbid
    /// are left out (refused). With `may_ask` (a connector thread) the
    /// peer's regions are read again first when `regions` does not hold
    /// or permit a request.
    Sent send(std::vector<size_t>& ids, std::vector<orbite::Request>& reqs,
              orbite::Peer& peer,
              std::shared_ptr<const std::vector<orbite::Region>> regions,
              const std::shared_ptr<Target>& t, uint64_t gen, bool may_ask);
    /// Records `sent` in `tasks` (`tasks.lock` held): refused ones
    /// INVALID, sent ones their batch (or why it failed); a task cancelled
    /// meanwhile is cancelled in OrbiTE. False when the peer had left
    /// before anything was sent (the sent tasks stay PENDING, unrecorded).
    bool record(Tasks& tasks, Sent& sent, const std::shared_ptr<Target>& t,
                uint64_t gen);
    /// The connector thread's body: with `reconnect`, looks `t` up and
    /// connects; then submits or fails what waits for it.
    void connect(std::shared_ptr<Target> t, bool reconnect);
    /// Submits (or, without `peer`, fails) what waits for `t`, in order,
    /// until nothing does; then `t` is Ready (Idle without a peer).
    void drain(const std::shared_ptr<Target>& t,
               const std::shared_ptr<orbite::Peer>& peer, uint64_t gen);
    /// Copies the tasks of `ids` (`reqs`) whose region has a direct route
    /// on this thread, each ending here; true when any completed. They
    /// leave `ids` and `reqs`; the others stay, in order, with those whose
    /// copy failed (their route dropped: they go through a connector).
    bool copyDirect(const std::shared_ptr<Target>& t, Tasks& tasks,
                    std::vector<size_t>& ids, std::vector<orbite::Request>& reqs);
    /// Copies a local task between registered host buffers.
    bool copyLocally(const Request& r);
    /// Retries unregistering buffers TENT removed while copies still used
    /// them (buffers_lock_ held).
    void retireLocked();

    std::optional<orbite::Engine> engine_;
    std::shared_ptr<ControlService> metadata_;
    std::shared_ptr<Config> conf_;
    std::string local_name_;
    std::chrono::milliseconds connect_timeout_{5000};

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

    std::mutex targets_lock_;
    std::map<SegmentID, std::shared_ptr<Target>> targets_;
};

}  // namespace tent
}  // namespace mooncake

#endif  // ORBITE_TENT_TRANSPORT_H_
