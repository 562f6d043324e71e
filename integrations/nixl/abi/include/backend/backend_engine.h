// OrbiTE's declaration of NIXL's backend engine base class
// (backend/backend_engine.h) for the pinned release. The virtual functions
// are declared in the release's vtable order and with its signatures:
// tests/abi_check.py compares this class's vtable, symbol by symbol, with
// the one in the release's own POSIX plugin. The data members have the
// release's layout (checked below): the agent reads getInitErr(),
// getType() and getCustomParams() through its own inline copies.
#ifndef ORBITE_NIXL_ABI_BACKEND_ENGINE_H
#define ORBITE_NIXL_ABI_BACKEND_ENGINE_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backend_aux.h"
#include "nixl_types.h"

/// A telemetry event a backend may queue (this plugin queues none); only
/// its type matters here, as the element of the queue below.
enum class nixl_telemetry_event_type_t : uint32_t {};
struct nixlTelemetryEvent {
    nixl_telemetry_event_type_t eventType_;
    uint64_t value_;
};

class nixlBackendEngine {
private:
    nixl_backend_t backendType;
    nixl_b_params_t customParams;
    std::vector<nixlTelemetryEvent> telemetryEvents_;
    std::mutex telemetryEventsMutex_;

protected:
    bool initErr = false;
    const std::string localAgent;
    const bool enableTelemetry_;

public:
    explicit nixlBackendEngine(const nixlBackendInitParams *init_params)
        : backendType(init_params->type),
          customParams(*init_params->customParams),
          localAgent(init_params->localAgent),
          enableTelemetry_(init_params->enableTelemetry_) {}

    nixlBackendEngine(nixlBackendEngine &&) = delete;
    nixlBackendEngine(const nixlBackendEngine &) = delete;
    void operator=(nixlBackendEngine &&) = delete;
    void operator=(const nixlBackendEngine &) = delete;

    virtual ~nixlBackendEngine() = default;

    bool getInitErr() const noexcept { return initErr; }
    const nixl_backend_t &getType() const noexcept { return backendType; }
    const nixl_b_params_t &getCustomParams() const noexcept { return customParams; }

    // Capabilities.
    virtual bool supportsRemote() const = 0;
    virtual bool supportsLocal() const = 0;
    virtual bool supportsNotif() const = 0;
    virtual nixl_mem_list_t getSupportedMems() const = 0;

    // Local registrations.
    virtual nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                                      nixlBackendMD *&out) = 0;
    virtual nixl_status_t deregisterMem(nixlBackendMD *meta) = 0;

    // Connections to agents whose connection info was loaded.
    virtual nixl_status_t connect(const std::string &remote_agent) = 0;
    virtual nixl_status_t disconnect(const std::string &remote_agent) = 0;

    virtual nixl_status_t unloadMD(nixlBackendMD *input) = 0;

    // The data path: const, called from several threads at once (on
    // different handles).
    virtual nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                   nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                   nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t checkXfer(nixlBackendReqH *handle) const = 0;
    virtual nixl_status_t releaseReqH(nixlBackendReqH *handle) const = 0;

    // Memory views (device-initiated transfers); not supported by default.
    virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t &, nixlMemViewH &,
                                      const nixl_opt_b_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t prepMemView(const nixl_meta_dlist_t &, nixlMemViewH &,
                                      const nixl_opt_b_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual void releaseMemView(nixlMemViewH) const {}

    // Remote operation: public data of a registration, connection info,
    // and loading both from a peer.
    virtual nixl_status_t getPublicData(const nixlBackendMD *, std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t getConnInfo(std::string &) const { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t loadRemoteConnInfo(const std::string &, const std::string &) {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t loadRemoteMD(const nixlBlobDesc &, const nixl_mem_t &, const std::string &,
                                       nixlBackendMD *&) {
        return NIXL_ERR_BACKEND;
    }

    // Local operation: a registration used as a transfer target.
    virtual nixl_status_t loadLocalMD(nixlBackendMD *, nixlBackendMD *&) { return NIXL_ERR_BACKEND; }

    // Notifications.
    virtual nixl_status_t getNotifs(notif_list_t &) { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t genNotif(const std::string &, const std::string &) const {
        return NIXL_ERR_BACKEND;
    }

    // Optional.
    virtual nixl_status_t queryMem(const nixl_reg_dlist_t &, std::vector<nixl_query_resp_t> &) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t &, const nixl_meta_dlist_t &,
                                           const nixl_meta_dlist_t &, const std::string &,
                                           nixlBackendReqH *const &, std::chrono::microseconds &,
                                           std::chrono::microseconds &, nixl_cost_t &,
                                           const nixl_opt_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
};

#ifdef ORBITE_NIXL_PINNED
// The release's layout (README.md, "ABI"): the agent tests initErr at 0xa0
// after creating a backend; the POSIX plugin's constructor stores the base
// members up to 0xc8 and its own from 0xd0. The protected members' offsets
// are checked where they are reachable, in the OrbiTE engine's source.
static_assert(sizeof(nixlBackendEngine) == 0xd0);
static_assert(sizeof(nixlBackendInitParams) == 0x60);
#endif

#endif
