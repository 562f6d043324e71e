// Shim of TENT's tent/runtime/segment_manager.h (see common/status.h).
// TENT keeps segments in a metadata service (etcd, redis, HTTP or P2P);
// the shim keeps them in a directory that the processes of a test share:
// synchronizeLocal writes DIR/NAME.segment (a temporary file renamed into
// place), getRemoteCached reads a remote one once per thread and keeps it
// until invalidateRemote (that thread's copy) or invalidateAllCacheForRemote
// (every thread's), as TENT's thread-local cache does.
#ifndef ORBITE_TENT_SHIM_SEGMENT_MANAGER_H
#define ORBITE_TENT_SHIM_SEGMENT_MANAGER_H

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "tent/common/status.h"
#include "tent/runtime/segment.h"

namespace mooncake {
namespace tent {

class SegmentManager {
   public:
    /// Shim only: segments live under `dir`; this process's is `local_name`.
    SegmentManager(std::string dir, std::string local_name, std::string rpc_server_addr);

    SegmentManager(const SegmentManager&) = delete;
    SegmentManager& operator=(const SegmentManager&) = delete;

    Status openRemote(SegmentID& handle, const std::string& segment_name);
    Status closeRemote(SegmentID handle);
    Status getRemoteCached(SegmentDescRef& desc, SegmentID handle);
    Status invalidateRemote(SegmentID handle);
    Status invalidateAllCacheForRemote(const std::string& segment_name);
    SegmentDescRef getLocal();
    Status updateLocal(const std::function<Status(SegmentDesc&)>& mutator);
    Status synchronizeLocal();

   private:
    std::string dir_;
    std::mutex lock_;
    SegmentDescRef local_;
    std::map<SegmentID, std::string> names_;
    SegmentID next_id_ = 1;
    const uint64_t id_;  ///< tells this manager's per-thread copies apart
    std::atomic<uint64_t> version_{0};
};

}  // namespace tent
}  // namespace mooncake

#endif
