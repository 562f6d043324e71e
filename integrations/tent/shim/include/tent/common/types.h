// Shim of TENT's tent/common/types.h (see status.h): requests, statuses,
// memory options and the transport enumeration, with TENT's names. ORBITE
// is the enumerator TENT adds for OrbiTE (docs/tent-integration.md).
#ifndef ORBITE_TENT_SHIM_TYPES_H
#define ORBITE_TENT_SHIM_TYPES_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace mooncake {
namespace tent {

using BatchID = uint64_t;
using SegmentID = uint64_t;

static constexpr uint8_t PRIO_HIGH = 0;
static constexpr uint8_t PRIO_MEDIUM = 1;
static constexpr uint8_t PRIO_LOW = 2;

struct Notification {
    std::string name;
    std::string msg;
};

#ifndef LOCAL_SEGMENT_ID
#define LOCAL_SEGMENT_ID (0ull)
#endif

enum TransportType : int {
    UNSPEC = 0,
    RDMA,
    MNNVL,
    SHM,
    NVLINK,
    GDS,
    IOURING,
    TCP,
    AscendDirect,
    SUNRISE_LINK,
    TPU,
    UB,
    MPCOMM,
    ORBITE,
    kNumTransportTypes,
};

enum class IntentType : int {
    INTENT_UNSPEC = 0,
    FOREGROUND_GET,
    BACKGROUND_PREFETCH,
    MIGRATION,
    CHECKPOINT,
    WEIGHT_LOADING,
    STAGING_INTERNAL,
};

struct Request {
    enum OpCode { READ, WRITE };
    OpCode opcode;
    void* source;
    SegmentID target_id;
    uint64_t target_offset;
    size_t length;
    int priority = PRIO_HIGH;
    std::optional<std::string> policy_name;
    TransportType transport_hint = UNSPEC;
    uint64_t deadline_ns = 0;
    IntentType intent_type = IntentType::INTENT_UNSPEC;
};

enum TransferStatusEnum { INITIAL, PENDING, INVALID, CANCELED, COMPLETED, TIMEOUT, FAILED };

struct TransferStatus {
    TransferStatusEnum s;
    size_t transferred_bytes;
};

enum Permission {
    kLocalReadWrite,
    kGlobalReadOnly,
    kGlobalReadWrite,
};

using Location = std::string;
const static std::string kWildcardLocation = "*";

struct MemoryOptions {
    Location location = kWildcardLocation;
    Permission perm = kGlobalReadWrite;
    TransportType type = UNSPEC;
    std::string shm_path = "";
    size_t shm_offset = 0;
    bool internal = false;
};

}  // namespace tent
}  // namespace mooncake

#endif
