// Shim of TENT's tent/runtime/segment.h (see common/status.h): a segment's
// description as the adapter reads it, buffers under getMemory().
#ifndef ORBITE_TENT_SHIM_SEGMENT_H
#define ORBITE_TENT_SHIM_SEGMENT_H

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "tent/common/types.h"
#include "tent/runtime/topology.h"

namespace mooncake {
namespace tent {

struct BufferDesc {
    uint64_t addr;
    uint64_t length;
    std::string location;
    std::vector<TransportType> transports;
    std::unordered_map<TransportType, std::string> transport_attrs;
    int ref_count{0};
    std::string shm_path;
    bool internal{false};
};

struct MemorySegmentDesc {
    Topology topology;
    std::unordered_map<std::string, std::string> device_attrs;
    std::vector<BufferDesc> buffers;
};

struct FileSegmentDesc {};

enum class SegmentType { Memory, File };

struct SegmentDesc {
    std::string name;
    SegmentType type;
    std::string machine_id;
    std::string rpc_server_addr;
    std::variant<MemorySegmentDesc, FileSegmentDesc> detail;

    const MemorySegmentDesc& getMemory() const { return std::get<MemorySegmentDesc>(detail); }
};

using SegmentDescRef = std::shared_ptr<SegmentDesc>;

}  // namespace tent
}  // namespace mooncake

#endif
