// See engine.h.
#include "engine.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "nixl_process.h"

using orbite_nixl::ConnInfo;
using orbite_nixl::Core;
using orbite_nixl::Peer;
using orbite_nixl::PublicData;
using orbite_nixl::Severity;

namespace {

constexpr uint32_t kNoteTimeoutMs = 0;  // the engine's default_timeout_ms

std::string hex(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

/// "<what>: <OrbiTE's message> (<status name>)", read on the failing thread.
std::string orbiteFailure(const std::string &what, orbite_status st) {
    return what + ": " + orbite_last_error() + " (" + orbite_status_name(st) + ")";
}

void logError(const std::string &m) { orbite_nixl::log(Severity::error, m); }

/// A peer gone or not the one known any more: NIXL then invalidates the
/// agent's metadata, and a reload reaches the live engine.
nixl_status_t toNixl(orbite_status st) {
    switch (st) {
        case ORBITE_STATUS_OK: return NIXL_SUCCESS;
        case ORBITE_STATUS_PENDING: return NIXL_IN_PROG;
        case ORBITE_STATUS_UNAVAILABLE:
        case ORBITE_STATUS_STALE_PEER: return NIXL_ERR_REMOTE_DISCONNECT;
        case ORBITE_STATUS_NOT_FOUND: return NIXL_ERR_NOT_FOUND;
        case ORBITE_STATUS_NULL_ARGUMENT:
        case ORBITE_STATUS_INVALID_ARGUMENT:
        case ORBITE_STATUS_OUT_OF_RANGE:
        case ORBITE_STATUS_PERMISSION_DENIED: return NIXL_ERR_INVALID_PARAM;
        case ORBITE_STATUS_NOT_SUPPORTED: return NIXL_ERR_NOT_SUPPORTED;
        case ORBITE_STATUS_CANCELLED: return NIXL_ERR_CANCELED;
        default: return NIXL_ERR_BACKEND;
    }
}

uint64_t randomIncarnation() {
    std::random_device rd;
    uint64_t v = 0;
    while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return v;
}

/// Registration metadata of this engine.
struct LocalMD : nixlBackendMD {
    static constexpr uint64_t kTag = 0x4f5242544c4d4431ull;  // "ORBTLMD1"
    uint64_t tag = kTag;
    uint64_t region = 0, epoch = 0, addr = 0, len = 0;
    nixl_mem_t mem = DRAM_SEG;
    orbite_allocation *adopted = nullptr;  ///< VRAM: the adoption record
    LocalMD() : nixlBackendMD(true) {}
};

/// A peer's registration as loaded (or this engine's own, for local
/// transfers).
struct RemoteMD : nixlBackendMD {
    static constexpr uint64_t kTag = 0x4f524254524d4431ull;  // "ORBTRMD1"
    uint64_t tag = kTag;
    std::shared_ptr<Peer> peer;
    uint64_t region = 0, epoch = 0, addr = 0, len = 0;
    nixl_mem_t mem = DRAM_SEG;
    RemoteMD() : nixlBackendMD(false) {}
};

/// A prepared transfer: OrbiTE's requests, built once, and the batch of
/// its latest post.
struct Handle : nixlBackendReqH {
    std::shared_ptr<Peer> peer;
    std::vector<orbite_request> requests;
    std::mutex lock;
    orbite_batch *batch = nullptr;
    bool cancel_asked = false;     ///< releaseReqH cancelled the latest post
    bool release_refused = false;  ///< releaseReqH failed once for the latest post
    bool reported = false;      ///< the latest post's failure is logged
    ~Handle() override { orbite_batch_free(batch); }
};

template<class MD> const MD *as(const nixlBackendMD *m) {
    auto *p = static_cast<const MD *>(m);
    return p && p->tag == MD::kTag ? p : nullptr;
}

/// Requests of `batch` that ended CANCELLED and that have not ended.
void countOutcomes(orbite_batch *batch, size_t n, size_t &cancelled, size_t &pending, orbite_status &first_failure) {
    std::vector<orbite_request_result> r(n);
    cancelled = pending = 0;
    first_failure = ORBITE_STATUS_OK;
    if (orbite_batch_results(batch, r.data(), n) != ORBITE_STATUS_OK) return;
    for (const auto &x : r) {
        if (x.status == ORBITE_STATUS_CANCELLED) ++cancelled;
        else if (x.status == ORBITE_STATUS_PENDING) ++pending;
        else if (x.status != ORBITE_STATUS_OK && first_failure == ORBITE_STATUS_OK) first_failure = x.status;
    }
}

}  // namespace

// ---- Core, Peer -----------------------------------------------------------

orbite_nixl::Core::~Core() { orbite_engine_free(eng); }

orbite_nixl::Peer::~Peer() {
    if (!core || !id) return;
    // A peer with requests still in flight (a transfer released while
    // running) is disconnected once they end, off this thread: the data
    // path never waits for it.
    if (orbite_disconnect(core->eng, id, 1) == ORBITE_STATUS_TIMED_OUT)
        std::thread([core = core, id = id] { orbite_disconnect(core->eng, id, 0); }).detach();
}

std::shared_ptr<Peer> orbite_nixl::Peer::open(const std::shared_ptr<Core> &core, const std::string &agent,
                                              const ConnInfo &conn, std::string &why) {
    auto peer = std::make_shared<Peer>();
    peer->core = core;
    peer->agent = agent;
    peer->incarnation = conn.incarnation;
    peer->endpoint = conn.endpoint;
    if (orbite_status st = orbite_connect(core->eng, conn.endpoint.c_str(), core->opts.connect_timeout_ms, &peer->id);
        st != ORBITE_STATUS_OK) {
        peer->id = 0;
        why = orbiteFailure("cannot connect to agent '" + agent + "' at " + conn.endpoint, st);
        return nullptr;
    }
    return peer;
}

bool orbite_nixl::Peer::refresh(std::string &why) {
    std::vector<orbite_region_info> got(16);
    for (;;) {
        size_t count = 0;
        orbite_status st = orbite_peer_regions(core->eng, id, got.data(), got.size(), &count);
        if (st == ORBITE_STATUS_BUFFER_TOO_SMALL) {
            got.resize(count);
            continue;
        }
        if (st != ORBITE_STATUS_OK) {
            why = orbiteFailure("cannot read the regions of agent '" + agent + "' (" + endpoint + ")", st);
            return false;
        }
        got.resize(count);
        std::lock_guard<std::mutex> g(lock);
        regions = std::move(got);
        return true;
    }
}

bool orbite_nixl::Peer::publishes(uint64_t region, uint64_t epoch, uint64_t addr, uint64_t len, std::string &why) {
    // len 0: any range of the region (the identity region).
    auto holds = [&] {
        std::lock_guard<std::mutex> g(lock);
        for (const auto &r : regions)
            if (r.id == region && r.epoch == epoch)
                return len == 0 || (addr >= r.addr && len <= r.length && addr - r.addr <= r.length - len);
        return false;
    };
    if (holds()) return true;
    if (!refresh(why)) return false;
    if (holds()) return true;
    why = "agent '" + agent + "' (" + endpoint + ") does not publish region " + std::to_string(region) +
          " of epoch " + hex(epoch) + (len ? " holding 0x" + hex(addr) + "+" + std::to_string(len) : "") +
          ": the registration is stale (unregistered, registered again, or its engine restarted); load the "
          "agent's metadata again";
    return false;
}

// ---- the engine ---------------------------------------------------------------

nixlOrbiteEngine::nixlOrbiteEngine(const nixlBackendInitParams *init_params) : nixlBackendEngine(init_params) {
#ifdef ORBITE_NIXL_PINNED
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
    // The protected members, where the release's agent reads them
    // (abi/include/backend/backend_engine.h).
    static_assert(offsetof(nixlOrbiteEngine, initErr) == 0xa0);
    static_assert(offsetof(nixlOrbiteEngine, localAgent) == 0xa8);
    static_assert(offsetof(nixlOrbiteEngine, enableTelemetry_) == 0xc8);
#pragma GCC diagnostic pop
#endif
    auto fail = [&](const std::string &why) {
        logError("cannot start the ORBITE backend of agent '" + localAgent + "': " + why);
        initErr = true;
    };
    auto core = std::make_shared<Core>();
    std::string why;
    if (!orbite_nixl::buildOptions(getCustomParams(), core->opts, why)) {
        fail(why);
        return;
    }
    conn_.incarnation = randomIncarnation();
    // OrbiTE engine names are [A-Za-z0-9._-]{1,64}: the incarnation, not the
    // agent name (which rides in each notification).
    std::string config = core->opts.config_json;
    config.insert(1, "\"name\":\"nixl-" + hex(conn_.incarnation) + "\"" + (config.size() > 2 ? "," : ""));
    if (orbite_status st = orbite_engine_new(config.c_str(), &core->eng); st != ORBITE_STATUS_OK) {
        fail(orbiteFailure("the OrbiTE engine did not start (config " + config + ")", st));
        return;
    }
    core_ = core;
    char ep[256];
    size_t ep_len = 0;
    if (orbite_status st = orbite_engine_endpoint(core_->eng, ep, sizeof ep, &ep_len); st != ORBITE_STATUS_OK) {
        fail(orbiteFailure("no endpoint", st));
        return;
    }
    conn_.endpoint.assign(ep, ep_len);
    // The identity region: what a peer looks for after connecting to prove
    // that the engine at the endpoint is this incarnation.
    identity_.assign(64, 0);
    std::memcpy(identity_.data(), &conn_.incarnation, sizeof conn_.incarnation);
    if (orbite_status st = orbite_register_memory(core_->eng, identity_.data(), identity_.size(), ORBITE_ACCESS_READ,
                                                  &conn_.identity_region);
        st != ORBITE_STATUS_OK) {
        fail(orbiteFailure("cannot register the identity region", st));
        return;
    }
    // This engine reached as a peer: local transfers, and the epochs of its
    // own registrations.
    self_ = Peer::open(core_, localAgent, conn_, why);
    if (!self_) {
        fail(why);
        return;
    }
    if (!ownEpoch(conn_.identity_region, conn_.identity_epoch, why)) {
        fail(why);
        return;
    }
}

nixlOrbiteEngine::~nixlOrbiteEngine() {
    {
        std::unique_lock<std::shared_mutex> g(peers_lock_);
        peers_.clear();
    }
    self_.reset();
    if (core_ && conn_.identity_region) orbite_unregister_memory(core_->eng, conn_.identity_region, 1000);
    retryRetained();
    if (!retained_.empty())
        logError(std::to_string(retained_.size()) +
                 " adopted VRAM allocations stay recorded at shutdown (a peer still imports them)");
}

void nixlOrbiteEngine::retryRetained() {
    std::lock_guard<std::mutex> g(retained_lock_);
    retained_.erase(std::remove_if(retained_.begin(), retained_.end(),
                                   [](orbite_allocation *a) { return orbite_allocation_free(a) == ORBITE_STATUS_OK; }),
                    retained_.end());
}

bool nixlOrbiteEngine::ownEpoch(uint64_t region, uint64_t &epoch, std::string &why) const {
    if (!self_->refresh(why)) return false;
    std::lock_guard<std::mutex> g(self_->lock);
    for (const auto &r : self_->regions)
        if (r.id == region) {
            epoch = r.epoch;
            return true;
        }
    why = "region " + std::to_string(region) + " is not among this engine's own";
    return false;
}

nixl_status_t nixlOrbiteEngine::registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) {
    auto md = std::make_unique<LocalMD>();
    md->addr = mem.addr;
    md->len = mem.len;
    md->mem = nixl_mem;
    void *ptr = reinterpret_cast<void *>(mem.addr);
    if (nixl_mem == VRAM_SEG) {
        if (orbite_status st = orbite_cuda_adopt(ptr, mem.len, ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION, &md->adopted);
            st != ORBITE_STATUS_OK) {
            logError(orbiteFailure("cannot adopt VRAM 0x" + hex(mem.addr) + "+" + std::to_string(mem.len) +
                                       " of device " + std::to_string(mem.devId),
                                   st));
            return toNixl(st);
        }
    } else if (nixl_mem != DRAM_SEG) {
        logError("the ORBITE backend moves DRAM and VRAM only, not memory type " + std::to_string(nixl_mem));
        return NIXL_ERR_NOT_SUPPORTED;
    }
    orbite_status st =
        orbite_register_memory(core_->eng, ptr, mem.len, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &md->region);
    if (st != ORBITE_STATUS_OK) {
        logError(orbiteFailure("cannot register 0x" + hex(mem.addr) + "+" + std::to_string(mem.len), st));
        if (md->adopted && orbite_allocation_free(md->adopted) != ORBITE_STATUS_OK) {
            std::lock_guard<std::mutex> g(retained_lock_);
            retained_.push_back(md->adopted);
        }
        return toNixl(st);
    }
    std::string why;
    if (!ownEpoch(md->region, md->epoch, why)) {
        logError("cannot read the epoch of a new registration: " + why);
        deregisterMem(md.release());
        return NIXL_ERR_BACKEND;
    }
    out = md.release();
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::deregisterMem(nixlBackendMD *meta) {
    const LocalMD *md = as<LocalMD>(meta);
    if (!md) {
        logError("deregisterMem: not an ORBITE registration");
        return NIXL_ERR_INVALID_PARAM;
    }
    std::unique_ptr<const LocalMD> own(md);
    nixl_status_t ret = NIXL_SUCCESS;
    if (orbite_status st = orbite_unregister_memory(core_->eng, md->region, 0); st != ORBITE_STATUS_OK) {
        logError(orbiteFailure("cannot unregister region " + std::to_string(md->region), st));
        ret = toNixl(st);
    }
    if (md->adopted && orbite_allocation_free(md->adopted) != ORBITE_STATUS_OK) {
        // Still exported to a peer: the record stays, freed later.
        std::lock_guard<std::mutex> g(retained_lock_);
        retained_.push_back(md->adopted);
    }
    retryRetained();
    return ret;
}

nixl_status_t nixlOrbiteEngine::getPublicData(const nixlBackendMD *meta, std::string &str) const {
    const LocalMD *md = as<LocalMD>(meta);
    if (!md) return NIXL_ERR_INVALID_PARAM;
    str = orbite_nixl::encode(PublicData{conn_.incarnation, md->region, md->epoch, md->addr, md->len,
                                         static_cast<uint32_t>(md->mem)});
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::getConnInfo(std::string &str) const {
    str = orbite_nixl::encode(conn_);
    return NIXL_SUCCESS;
}

std::shared_ptr<Peer> nixlOrbiteEngine::peerOf(const std::string &agent) const {
    if (agent == localAgent) return self_;
    std::shared_lock<std::shared_mutex> g(peers_lock_);
    auto it = peers_.find(agent);
    return it == peers_.end() ? nullptr : it->second;
}

std::shared_ptr<Peer> nixlOrbiteEngine::connectTo(const std::string &agent, const ConnInfo &conn,
                                                  std::string &why) const {
    auto peer = Peer::open(core_, agent, conn, why);
    if (!peer || !peer->refresh(why)) return nullptr;
    std::string stale;
    if (!peer->publishes(conn.identity_region, conn.identity_epoch, 0, 0, stale)) {
        why = "the engine at " + conn.endpoint + " is not the one agent '" + agent + "' described (incarnation " +
              hex(conn.incarnation) + "): it restarted, or another took its address; fetch the agent's metadata again";
        return nullptr;
    }
    return peer;
}

nixl_status_t nixlOrbiteEngine::loadRemoteConnInfo(const std::string &remote_agent,
                                                   const std::string &remote_conn_info) {
    std::string why;
    auto conn = orbite_nixl::decodeConnInfo(remote_conn_info, why);
    if (!conn) {
        logError("connection info of agent '" + remote_agent + "': " + why);
        return NIXL_ERR_MISMATCH;
    }
    auto peer = connectTo(remote_agent, *conn, why);
    if (!peer) {
        logError(why);
        return NIXL_ERR_REMOTE_DISCONNECT;
    }
    std::unique_lock<std::shared_mutex> g(peers_lock_);
    peers_[remote_agent] = std::move(peer);
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem,
                                             const std::string &remote_agent, nixlBackendMD *&output) {
    auto peer = remote_agent == localAgent ? nullptr : peerOf(remote_agent);
    if (!peer) {
        logError("metadata of unknown agent '" + remote_agent + "': its connection info was not loaded");
        return NIXL_ERR_NOT_FOUND;
    }
    std::string why;
    auto pd = orbite_nixl::decodePublicData(input.metaInfo, why);
    if (!pd) {
        logError("registration of agent '" + remote_agent + "': " + why);
        return NIXL_ERR_MISMATCH;
    }
    if (pd->incarnation != peer->incarnation) {
        logError("a registration of agent '" + remote_agent + "' names engine incarnation " + hex(pd->incarnation) +
                 ", but the agent's connection info names " + hex(peer->incarnation) +
                 ": the metadata mixes two runs of the agent; fetch it again");
        return NIXL_ERR_MISMATCH;
    }
    if (pd->mem != static_cast<uint32_t>(nixl_mem) || input.addr < pd->addr || input.len > pd->len ||
        input.addr - pd->addr > pd->len - input.len) {
        logError("a registration of agent '" + remote_agent + "' describes 0x" + hex(pd->addr) + "+" +
                 std::to_string(pd->len) + " (memory type " + std::to_string(pd->mem) + "), not 0x" +
                 hex(input.addr) + "+" + std::to_string(input.len) + " (memory type " + std::to_string(nixl_mem) + ")");
        return NIXL_ERR_MISMATCH;
    }
    if (!peer->publishes(pd->region, pd->epoch, pd->addr, pd->len, why)) {
        logError(why);
        return NIXL_ERR_MISMATCH;
    }
    auto md = std::make_unique<RemoteMD>();
    md->peer = std::move(peer);
    md->region = pd->region;
    md->epoch = pd->epoch;
    md->addr = pd->addr;
    md->len = pd->len;
    md->mem = nixl_mem;
    output = md.release();
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) {
    const LocalMD *l = as<LocalMD>(input);
    if (!l) return NIXL_ERR_INVALID_PARAM;
    auto md = std::make_unique<RemoteMD>();
    md->peer = self_;
    md->region = l->region;
    md->epoch = l->epoch;
    md->addr = l->addr;
    md->len = l->len;
    md->mem = l->mem;
    output = md.release();
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::unloadMD(nixlBackendMD *input) {
    const RemoteMD *md = as<RemoteMD>(input);
    if (!md) return NIXL_ERR_INVALID_PARAM;
    delete md;
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::connect(const std::string &remote_agent) {
    if (peerOf(remote_agent)) return NIXL_SUCCESS;
    logError("connect: unknown agent '" + remote_agent + "': load its metadata first");
    return NIXL_ERR_NOT_FOUND;
}

nixl_status_t nixlOrbiteEngine::disconnect(const std::string &remote_agent) {
    std::shared_ptr<Peer> gone;  // disconnected once no handle holds it
    std::unique_lock<std::shared_mutex> g(peers_lock_);
    auto it = peers_.find(remote_agent);
    if (it != peers_.end()) {
        gone = std::move(it->second);
        peers_.erase(it);
    }
    g.unlock();
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                         const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                         nixlBackendReqH *&handle, const nixl_opt_b_args_t *) const {
    const int n = local.descCount();
    if (n == 0 || n != remote.descCount()) {
        logError("prepXfer: " + std::to_string(n) + " local and " + std::to_string(remote.descCount()) +
                 " remote descriptors");
        return NIXL_ERR_INVALID_PARAM;
    }
    if (operation != NIXL_READ && operation != NIXL_WRITE) return NIXL_ERR_INVALID_PARAM;
    const uint32_t opcode = operation == NIXL_READ ? ORBITE_OP_READ : ORBITE_OP_WRITE;
    auto h = std::make_unique<Handle>();
    h->requests.resize(static_cast<size_t>(n));
    const RemoteMD *last_r = nullptr;
    const LocalMD *last_l = nullptr;
    for (int i = 0; i < n; ++i) {
        const nixlMetaDesc &l = local[i];
        const nixlMetaDesc &r = remote[i];
        if (r.metadataP != last_r) {
            last_r = as<RemoteMD>(r.metadataP);
            if (!last_r) {
                logError("prepXfer: remote descriptor " + std::to_string(i) + " has no ORBITE metadata");
                return NIXL_ERR_INVALID_PARAM;
            }
            if (!h->peer) {
                h->peer = last_r->peer;
                if (h->peer->agent != remote_agent) {
                    logError("prepXfer: descriptors of agent '" + h->peer->agent + "' in a transfer to '" +
                             remote_agent + "'");
                    return NIXL_ERR_INVALID_PARAM;
                }
            } else if (last_r->peer != h->peer) {
                logError("prepXfer: remote descriptor " + std::to_string(i) + " belongs to another run of agent '" +
                         remote_agent + "' than descriptor 0 (its metadata was loaded again in between)");
                return NIXL_ERR_INVALID_PARAM;
            }
        }
        if (l.metadataP != last_l) {
            last_l = as<LocalMD>(l.metadataP);
            if (!last_l) {
                logError("prepXfer: local descriptor " + std::to_string(i) + " has no ORBITE registration");
                return NIXL_ERR_INVALID_PARAM;
            }
        }
        // Each range inside the registration that NIXL matched it with.
        if (l.len != r.len || l.len == 0 || r.addr < last_r->addr || r.len > last_r->len ||
            r.addr - last_r->addr > last_r->len - r.len || l.addr < last_l->addr || l.len > last_l->len ||
            l.addr - last_l->addr > last_l->len - l.len) {
            logError("prepXfer: descriptor " + std::to_string(i) + " (local 0x" + hex(l.addr) + "+" +
                     std::to_string(l.len) + ", remote 0x" + hex(r.addr) + "+" + std::to_string(r.len) +
                     ") lies outside its registration (local 0x" + hex(last_l->addr) + "+" +
                     std::to_string(last_l->len) + ", remote 0x" + hex(last_r->addr) + "+" +
                     std::to_string(last_r->len) + ")");
            return NIXL_ERR_INVALID_PARAM;
        }
        h->requests[static_cast<size_t>(i)] = orbite_request{opcode, l.addr, r.addr, l.len};
    }
    handle = h.release();
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::postXfer(const nixl_xfer_op_t &, const nixl_meta_dlist_t &, const nixl_meta_dlist_t &,
                                         const std::string &remote_agent, nixlBackendReqH *&handle,
                                         const nixl_opt_b_args_t *opt_args) const {
    auto *h = static_cast<Handle *>(handle);
    if (!h) return NIXL_ERR_INVALID_PARAM;
    std::lock_guard<std::mutex> g(h->lock);
    if (h->batch) {
        if (orbite_batch_poll(h->batch) == ORBITE_STATUS_PENDING) return NIXL_ERR_REPOST_ACTIVE;
        orbite_batch_free(h->batch);
        h->batch = nullptr;
    }
    h->cancel_asked = false;
    h->release_refused = false;
    h->reported = false;
    const orbite_submit_options so{core_->opts.transport, core_->opts.timeout_ms};
    orbite_status st;
    if (opt_args && opt_args->hasNotif) {
        const std::string note = orbite_nixl::encodeNotification(localAgent, opt_args->notifMsg);
        st = orbite_submit_notify(core_->eng, h->peer->id, h->requests.data(), h->requests.size(), &so, note.data(),
                                  note.size(), &h->batch);
    } else {
        st = orbite_submit(core_->eng, h->peer->id, h->requests.data(), h->requests.size(), &so, &h->batch);
    }
    if (st != ORBITE_STATUS_OK) {
        h->batch = nullptr;
        logError(orbiteFailure("cannot post a transfer of " + std::to_string(h->requests.size()) +
                                   " descriptors to agent '" + remote_agent + "'",
                               st));
        return toNixl(st);
    }
    return NIXL_IN_PROG;
}

nixl_status_t nixlOrbiteEngine::checkXfer(nixlBackendReqH *handle) const {
    auto *h = static_cast<Handle *>(handle);
    if (!h) return NIXL_ERR_INVALID_PARAM;
    std::lock_guard<std::mutex> g(h->lock);
    if (!h->batch) return NIXL_ERR_NOT_POSTED;
    orbite_status st = orbite_batch_poll(h->batch);
    if (st == ORBITE_STATUS_PENDING) return NIXL_IN_PROG;
    if (st == ORBITE_STATUS_OK) return NIXL_SUCCESS;
    const std::string message = orbite_last_error();
    size_t cancelled = 0, pending = 0;
    orbite_status first = ORBITE_STATUS_OK;
    countOutcomes(h->batch, h->requests.size(), cancelled, pending, first);
    if (first == ORBITE_STATUS_OK && cancelled > 0 && h->cancel_asked) return NIXL_ERR_CANCELED;
    const nixl_status_t ret = first == ORBITE_STATUS_OK ? NIXL_ERR_BACKEND : toNixl(first);
    if (!h->reported) {
        h->reported = true;
        logError("a transfer of " + std::to_string(h->requests.size()) + " descriptors to agent '" + h->peer->agent +
                 "' failed: " + message + " (" + orbite_status_name(first == ORBITE_STATUS_OK ? st : first) + ")");
    }
    return ret;
}

nixl_status_t nixlOrbiteEngine::releaseReqH(nixlBackendReqH *handle) const {
    auto *h = static_cast<Handle *>(handle);
    if (!h) return NIXL_SUCCESS;
    {
        std::lock_guard<std::mutex> g(h->lock);
        if (h->batch && orbite_batch_poll(h->batch) == ORBITE_STATUS_PENDING) {
            // Requests that have not started end CANCELLED (nothing of them
            // moves); started ones run to their outcome.
            orbite_batch_cancel(h->batch);
            h->cancel_asked = true;
            if (orbite_batch_poll(h->batch) == ORBITE_STATUS_PENDING) {
                size_t cancelled = 0, pending = 0;
                orbite_status first = ORBITE_STATUS_OK;
                countOutcomes(h->batch, h->requests.size(), cancelled, pending, first);
                if (!h->release_refused) {
                    // NIXL's contract (BackendGuide): a release that could
                    // not abort everything fails, and the handle stays.
                    h->release_refused = true;
                    orbite_nixl::log(Severity::warning,
                                     "release of a transfer to agent '" + h->peer->agent + "' in flight: " +
                                         std::to_string(h->requests.size()) + " descriptors, " +
                                         std::to_string(cancelled) + " cancelled so far, " + std::to_string(pending) +
                                         " still in flight (those not started end cancelled as the engine gets to "
                                         "them); the handle stays: release it again later");
                    return NIXL_ERR_REPOST_ACTIVE;
                }
                // Released again (NIXL frees its handle now whatever we say):
                // the batch is detached, never waited for.
                orbite_nixl::log(Severity::warning,
                                 "release of a transfer to agent '" + h->peer->agent + "' again while " +
                                     std::to_string(pending) +
                                     " of its descriptors still run: they finish detached, and their bytes may "
                                     "still reach the buffers after this release");
            }
        }
    }
    delete h;
    return NIXL_SUCCESS;
}

nixl_status_t nixlOrbiteEngine::getNotifs(notif_list_t &notif_list) {
    char sender[128];
    std::string buf(4096, '\0');
    for (;;) {
        size_t len = 0;
        orbite_status st =
            orbite_notification_take(core_->eng, 0, sender, sizeof sender, buf.data(), buf.size(), &len);
        if (st == ORBITE_STATUS_TIMED_OUT) return NIXL_SUCCESS;
        if (st == ORBITE_STATUS_BUFFER_TOO_SMALL) {
            buf.resize(std::max(len, buf.size()));
            continue;
        }
        if (st != ORBITE_STATUS_OK) {
            logError(orbiteFailure("cannot take notifications", st));
            return NIXL_ERR_BACKEND;
        }
        std::string agent, msg;
        if (orbite_nixl::decodeNotification(std::string_view(buf.data(), len), agent, msg)) {
            notif_list.emplace_back(std::move(agent), std::move(msg));
        } else {
            // Not sent by an ORBITE backend (an OrbiTE application): its
            // engine name stands for the agent.
            notif_list.emplace_back(sender, std::string(buf.data(), len));
        }
    }
}

nixl_status_t nixlOrbiteEngine::genNotif(const std::string &remote_agent, const std::string &msg) const {
    auto peer = peerOf(remote_agent);
    if (!peer) {
        logError("genNotif: unknown agent '" + remote_agent + "': load its metadata first");
        return NIXL_ERR_NOT_FOUND;
    }
    const std::string note = orbite_nixl::encodeNotification(localAgent, msg);
    if (orbite_status st = orbite_notify(core_->eng, peer->id, note.data(), note.size(), kNoteTimeoutMs);
        st != ORBITE_STATUS_OK) {
        logError(orbiteFailure("cannot notify agent '" + remote_agent + "'", st));
        return toNixl(st);
    }
    return NIXL_SUCCESS;
}
