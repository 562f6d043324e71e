// Shim of TENT's tent/runtime/transport.h (see common/status.h): the
// interface every TENT transport implements, with TENT's signatures.
#ifndef ORBITE_TENT_SHIM_TRANSPORT_H
#define ORBITE_TENT_SHIM_TRANSPORT_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tent/common/config.h"
#include "tent/common/status.h"
#include "tent/common/types.h"
#include "tent/runtime/control_plane.h"
#include "tent/runtime/topology.h"

namespace mooncake {
namespace tent {

struct Capabilities {
    bool dram_to_dram = false;
    bool dram_to_gpu = false;
    bool gpu_to_dram = false;
    bool gpu_to_gpu = false;
    bool dram_to_file = false;
    bool gpu_to_file = false;
};

class Transport {
   public:
    struct SubBatch {
        SubBatch() : device_mask(~0ULL) {}
        virtual ~SubBatch() {}
        virtual size_t size() const = 0;
        void notifyProgress() {
            if (notify_progress) notify_progress(progress_batch_id);
        }

        uint64_t device_mask;
        std::string qp_pool;
        BatchID progress_batch_id{0};
        std::function<void(BatchID)> notify_progress;
    };

    using SubBatchRef = SubBatch*;

    Transport() = default;
    virtual ~Transport() = default;

    virtual Status install(std::string& local_segment_name, std::shared_ptr<ControlService> metadata,
                           std::shared_ptr<Topology> local_topology, std::shared_ptr<Config> conf = nullptr) {
        return Status::OK();
    }
    virtual Status uninstall() { return Status::OK(); }
    virtual const Capabilities capabilities() const { return caps; }
    virtual Status allocateSubBatch(SubBatchRef& batch, size_t max_size) {
        return Status::NotImplemented("allocateSubBatch not implemented" LOC_MARK);
    }
    virtual Status freeSubBatch(SubBatchRef& batch) {
        return Status::NotImplemented("freeSubBatch not implemented" LOC_MARK);
    }
    virtual Status submitTransferTasks(SubBatchRef batch, const std::vector<Request>& request_list) {
        return Status::NotImplemented("submitTransferTasks not implemented" LOC_MARK);
    }
    virtual Status getTransferStatus(SubBatchRef batch, int task_id, TransferStatus& status) {
        return Status::NotImplemented("getTransferStatus not implemented" LOC_MARK);
    }
    virtual bool supportsCancellation() const { return false; }
    virtual Status cancelTransferTask(SubBatchRef batch, int task_id) {
        return Status::NotImplemented("cancelTransferTask not implemented" LOC_MARK);
    }
    virtual Status allocateLocalMemory(void** addr, size_t size, MemoryOptions& options) {
        return Status::NotImplemented("the shim has no platform allocator" LOC_MARK);
    }
    virtual Status freeLocalMemory(void* addr, size_t size) {
        return Status::NotImplemented("the shim has no platform allocator" LOC_MARK);
    }
    virtual bool warmupMemory(void* addr, size_t length) { return false; }
    virtual Status addMemoryBuffer(BufferDesc& desc, const MemoryOptions& options) {
        return Status::NotImplemented("addMemoryBuffer not implemented" LOC_MARK);
    }
    virtual Status addMemoryBuffer(std::vector<BufferDesc>& desc_list, const MemoryOptions& options) {
        for (auto& desc : desc_list) {
            CHECK_STATUS(addMemoryBuffer(desc, options));
        }
        return Status::OK();
    }
    virtual Status removeMemoryBuffer(BufferDesc& desc) {
        return Status::NotImplemented("removeMemoryBuffer not implemented" LOC_MARK);
    }
    virtual bool supportNotification() const { return false; }
    virtual Status sendNotification(SegmentID target_id, const Notification& notify) {
        return Status::NotImplemented("sendNotification not implemented" LOC_MARK);
    }
    virtual Status receiveNotification(std::vector<Notification>& notify_list) {
        return Status::NotImplemented("receiveNotification not implemented" LOC_MARK);
    }
    virtual const char* getName() const { return "<generic>"; }
    virtual double getEstimatedBandwidth() const { return -1.0; }

   protected:
    Capabilities caps;
};

}  // namespace tent
}  // namespace mooncake

#endif
