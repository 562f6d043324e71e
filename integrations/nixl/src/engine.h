// nixlOrbiteEngine: OrbiTE behind NIXL's backend interface (the ORBITE
// backend). One backend instance owns one OrbiTE engine, named after a
// random incarnation that its connection info and public data carry.
//
// What NIXL's agent may rely on (docs/nixl.md says it for users):
// - registerMem: DRAM is any host memory the application registers; VRAM
//   is device memory the stack allocated, adopted (orbite_cuda_adopt, whole
//   allocation shared) and moved over NVLink or MNNVL. OrbiTE's
//   transport_policy picks the transport of each transfer (AUTO).
// - loadRemoteConnInfo connects to the peer's engine and checks that it is
//   the incarnation the info names (its identity region, id and epoch);
//   loadRemoteMD checks that the registration (region id and epoch) is
//   live on that engine and that the descriptor lies inside it. Anything
//   else is a NIXL error, with the reason in NIXL's log.
// - prepXfer checks every descriptor against its registration and builds
//   OrbiTE's requests once; postXfer submits them (no per-descriptor work
//   beyond OrbiTE's own), with the notification when asked: it is
//   delivered after every byte of that transfer is in the peer's memory.
// - checkXfer reports OrbiTE's outcome: a peer gone or restarted is
//   NIXL_ERR_REMOTE_DISCONNECT (NIXL then invalidates its metadata).
// - releaseReqH never waits: a transfer in flight is cancelled; when some
//   of its requests had already started it returns an error and keeps the
//   handle, checkXfer reports the end (NIXL_ERR_CANCELED when requests
//   were cancelled), and a later release frees it. A finished handle can be
//   posted again.
// - The data path (prepXfer, postXfer, checkXfer, releaseReqH, genNotif)
//   may run on several threads at once, on different handles.
#ifndef ORBITE_NIXL_ENGINE_H
#define ORBITE_NIXL_ENGINE_H

#include <orbite.h>

#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "backend/backend_engine.h"
#include "metadata.h"
#include "params.h"

namespace orbite_nixl {

/// The OrbiTE engine, shared by everything that must not outlive it.
struct Core {
    orbite_engine *eng = nullptr;
    Options opts;
    ~Core();
};

/// A connected peer engine: one NIXL agent (or this agent itself).
struct Peer {
    std::shared_ptr<Core> core;
    std::string agent;
    uint64_t id = 0;  ///< OrbiTE peer id
    uint64_t incarnation = 0;
    std::string endpoint;
    std::mutex lock;                            ///< guards regions
    std::vector<orbite_region_info> regions;    ///< as last read from the peer
    ~Peer();
    /// Connects to the engine `conn` names, as the peer of `agent`; null
    /// with `why` set when it cannot be reached.
    static std::shared_ptr<Peer> open(const std::shared_ptr<Core> &core, const std::string &agent,
                                      const ConnInfo &conn, std::string &why);
    /// Whether the peer publishes region `id` of registration `epoch`
    /// holding [addr, addr+len); reads the peer's regions again once when
    /// the last reading does not say so. False with `why` set otherwise.
    bool publishes(uint64_t region, uint64_t epoch, uint64_t addr, uint64_t len, std::string &why);
    /// Reads the peer's regions (orbite_peer_regions); false with `why`.
    bool refresh(std::string &why);
};

}  // namespace orbite_nixl

class nixlOrbiteEngine : public nixlBackendEngine {
public:
    explicit nixlOrbiteEngine(const nixlBackendInitParams *init_params);
    ~nixlOrbiteEngine() override;

    bool supportsRemote() const override { return true; }
    bool supportsLocal() const override { return true; }
    bool supportsNotif() const override { return true; }
    nixl_mem_list_t getSupportedMems() const override { return {DRAM_SEG, VRAM_SEG}; }

    nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) override;
    nixl_status_t deregisterMem(nixlBackendMD *meta) override;
    nixl_status_t connect(const std::string &remote_agent) override;
    nixl_status_t disconnect(const std::string &remote_agent) override;
    nixl_status_t unloadMD(nixlBackendMD *input) override;

    nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                           nixlBackendReqH *&handle, const nixl_opt_b_args_t *opt_args = nullptr) const override;
    nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                           nixlBackendReqH *&handle, const nixl_opt_b_args_t *opt_args = nullptr) const override;
    nixl_status_t checkXfer(nixlBackendReqH *handle) const override;
    nixl_status_t releaseReqH(nixlBackendReqH *handle) const override;

    nixl_status_t getPublicData(const nixlBackendMD *meta, std::string &str) const override;
    nixl_status_t getConnInfo(std::string &str) const override;
    nixl_status_t loadRemoteConnInfo(const std::string &remote_agent, const std::string &remote_conn_info) override;
    nixl_status_t loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem, const std::string &remote_agent,
                               nixlBackendMD *&output) override;
    nixl_status_t loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) override;

    nixl_status_t getNotifs(notif_list_t &notif_list) override;
    nixl_status_t genNotif(const std::string &remote_agent, const std::string &msg) const override;

private:
    /// The peer of `agent` (this agent's own for its name), or null.
    std::shared_ptr<orbite_nixl::Peer> peerOf(const std::string &agent) const;
    /// Connects to `endpoint` and checks that it is incarnation `conn`.
    std::shared_ptr<orbite_nixl::Peer> connectTo(const std::string &agent, const orbite_nixl::ConnInfo &conn,
                                                 std::string &why) const;
    /// The epoch of this engine's region `region` (asked of itself).
    bool ownEpoch(uint64_t region, uint64_t &epoch, std::string &why) const;
    /// Frees adopted allocations whose free was refused before (exported).
    void retryRetained();

    std::shared_ptr<orbite_nixl::Core> core_;
    orbite_nixl::ConnInfo conn_;
    std::vector<unsigned char> identity_;  ///< the identity region's bytes
    std::shared_ptr<orbite_nixl::Peer> self_;

    mutable std::shared_mutex peers_lock_;
    std::map<std::string, std::shared_ptr<orbite_nixl::Peer>> peers_;

    std::mutex retained_lock_;
    std::vector<orbite_allocation *> retained_;
};

#endif
