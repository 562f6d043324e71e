// OrbiTE's declaration of NIXL's types (nixl_types.h) for the pinned NIXL
// release (integrations/nixl/NIXL_RELEASE), written from NIXL's documented
// backend interface (docs/BackendGuide.md) and checked against the release's
// binaries (integrations/nixl/README.md, "ABI"). Only what a backend plugin
// sees is declared; names and types are NIXL's so that symbols mangle as
// NIXL's do (tests/abi_check.py compares the vtables).
#ifndef ORBITE_NIXL_ABI_NIXL_TYPES_H
#define ORBITE_NIXL_ABI_NIXL_TYPES_H

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

/// Memory kinds. The values are the ones the release's Python bindings
/// report (DRAM_SEG 0 ... FILE_SEG 4).
enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };

/// Transfer direction, seen from the initiator (NIXL_READ 0, NIXL_WRITE 1).
enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

/// Status codes (values as the release's bindings report them).
enum nixl_status_t {
    NIXL_IN_PROG = 1,
    NIXL_SUCCESS = 0,
    NIXL_ERR_NOT_POSTED = -1,
    NIXL_ERR_INVALID_PARAM = -2,
    NIXL_ERR_BACKEND = -3,
    NIXL_ERR_NOT_FOUND = -4,
    NIXL_ERR_MISMATCH = -5,
    NIXL_ERR_NOT_ALLOWED = -6,
    NIXL_ERR_REPOST_ACTIVE = -7,
    NIXL_ERR_UNKNOWN = -8,
    NIXL_ERR_NOT_SUPPORTED = -9,
    NIXL_ERR_REMOTE_DISCONNECT = -10,
    NIXL_ERR_CANCELED = -11,
    NIXL_ERR_NO_TELEMETRY = -12
};

/// The agent's locking mode (NONE 0, STRICT 1, RW 2).
enum class nixl_thread_sync_t {
    NIXL_THREAD_SYNC_NONE,
    NIXL_THREAD_SYNC_STRICT,
    NIXL_THREAD_SYNC_RW,
    NIXL_THREAD_SYNC_DEFAULT = NIXL_THREAD_SYNC_NONE,
};

/// How a cost estimate was made (estimateXferCost).
enum class nixl_cost_t { ANALYTICAL_BACKEND = 0 };

using nixl_backend_t = std::string;
/// Bytes (may hold NUL).
using nixl_blob_t = std::string;
using nixl_mem_list_t = std::vector<nixl_mem_t>;
/// A backend's custom parameters: key -> value, both strings.
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH = void *;

/// The agent's optional arguments; a backend only names the type (in the
/// signature of estimateXferCost), so it stays incomplete here.
struct nixlAgentOptionalArgs;
using nixl_opt_args_t = nixlAgentOptionalArgs;

#endif
