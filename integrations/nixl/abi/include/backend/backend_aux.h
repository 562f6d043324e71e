// OrbiTE's declaration of NIXL's backend auxiliary types (backend_aux.h)
// for the pinned release: initialization parameters, the request handle and
// metadata bases, descriptors with metadata, optional arguments and the
// notification list. Layouts are checked below against offsets measured in
// the release's binaries (integrations/nixl/README.md, "ABI").
#ifndef ORBITE_NIXL_ABI_BACKEND_AUX_H
#define ORBITE_NIXL_ABI_BACKEND_AUX_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nixl_descriptors.h"
#include "nixl_types.h"

/// Notifications a backend hands to the agent: (sender agent, message).
typedef std::vector<std::pair<std::string, std::string>> notif_list_t;

/// What the agent passes to prepXfer/postXfer besides the descriptors.
struct nixlBackendOptionalArgs {
    nixl_blob_t notifMsg;   ///< the notification to deliver after the transfer
    bool hasNotif = false;  ///< whether to deliver it (an empty message counts)
    nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

namespace nixlTime {
using us_t = uint64_t;
}

/// Filled by the agent for each backend it creates.
class nixlBackendInitParams {
public:
    std::string localAgent;
    nixl_backend_t type;
    nixl_b_params_t *customParams = nullptr;
    bool enableProgTh = false;
    nixlTime::us_t pthrDelay = 0;
    nixl_thread_sync_t syncMode;
    bool enableTelemetry_ = false;
};

/// Base of a backend's transfer handle.
class nixlBackendReqH {
public:
    nixlBackendReqH() {}
    virtual ~nixlBackendReqH() {}
};

/// Base of a backend's memory metadata (local registrations and loaded
/// remote ones).
class nixlBackendMD {
protected:
    bool isPrivateMD;

public:
    explicit nixlBackendMD(bool isPrivate) : isPrivateMD(isPrivate) {}
    virtual ~nixlBackendMD() {}
};

/// A descriptor with the backend metadata of the region that holds it.
class nixlMetaDesc : public nixlBasicDesc {
public:
    nixlBackendMD *metadataP;
};

/// The same, naming the remote agent (memory views).
struct nixlRemoteMetaDesc : public nixlMetaDesc {
    std::string remoteAgent;
};

typedef nixlDescList<nixlMetaDesc> nixl_meta_dlist_t;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;

#ifdef ORBITE_NIXL_PINNED
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
// Offsets read off the release's binaries (README.md, "ABI"): the agent's
// createBackend fills nixlBackendInitParams, the bundled POSIX plugin's
// constructor reads it, and libnixl_build.so indexes descriptor lists.
static_assert(offsetof(nixlBackendInitParams, localAgent) == 0x00);
static_assert(offsetof(nixlBackendInitParams, type) == 0x20);
static_assert(offsetof(nixlBackendInitParams, customParams) == 0x40);
static_assert(offsetof(nixlBackendInitParams, enableTelemetry_) == 0x5c);
static_assert(sizeof(nixlBasicDesc) == 24);
static_assert(sizeof(nixlBlobDesc) == 56 && offsetof(nixlBlobDesc, metaInfo) == 24);
static_assert(sizeof(nixlMetaDesc) == 32 && offsetof(nixlMetaDesc, metadataP) == 24);
static_assert(sizeof(nixlRemoteMetaDesc) == 64);
static_assert(sizeof(nixlDescList<nixlMetaDesc>) == 40);
static_assert(offsetof(nixlBackendOptionalArgs, hasNotif) == 0x20);
static_assert(offsetof(nixlBackendOptionalArgs, customParam) == 0x28);
#pragma GCC diagnostic pop
#endif

#endif
