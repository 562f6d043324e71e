// Shim of TENT's tent/runtime/control_plane.h (see common/status.h): the
// metadata service through which transports reach segments.
#ifndef ORBITE_TENT_SHIM_CONTROL_PLANE_H
#define ORBITE_TENT_SHIM_CONTROL_PLANE_H

#include <memory>
#include <string>

#include "tent/runtime/segment.h"
#include "tent/runtime/segment_manager.h"

namespace mooncake {
namespace tent {

class TransferEngineImpl;

class ControlService {
   public:
    /// `type` must be "shim-dir"; `servers` is the shared directory. Shim
    /// only: the local segment's name and RPC address (TENT's engine sets
    /// them).
    ControlService(const std::string& type, const std::string& servers, TransferEngineImpl* impl,
                   const std::string& local_name, const std::string& rpc_server_addr = "");

    ControlService(const ControlService&) = delete;
    ControlService& operator=(const ControlService&) = delete;

    SegmentManager& segmentManager() { return *manager_; }

   private:
    std::unique_ptr<SegmentManager> manager_;
};

}  // namespace tent
}  // namespace mooncake

#endif
