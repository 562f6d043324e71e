// Shim of TENT's tent/runtime/segment_manager.h (see common/status.h).
// TENT keeps segments in a metadata service (etcd, redis, HTTP or P2P);
// the shim keeps them in a directory that the processes of a test share:
// synchronizeLocal writes DIR/NAME.segment (a temporary file renamed into
// place), getRemoteCached reads a remote one once and keeps it until
// invalidateRemote.
#ifndef ORBITE_TENT_SHIM_SEGMENT_MANAGER_H
#define ORBITE_TENT_SHIM_SEGMENT_MANAGER_H

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
    SegmentDescRef getLocal();
    Status updateLocal(const std::function<Status(SegmentDesc&)>& mutator);
    Status synchronizeLocal();

   private:
    std::string dir_;
    std::mutex lock_;
    SegmentDescRef local_;
    std::map<SegmentID, std::string> names_;
    std::map<SegmentID, SegmentDescRef> cache_;
    SegmentID next_id_ = 1;
};

}  // namespace tent
}  // namespace mooncake

#endif
