// OrbiteTransport: see tent/transport/orbite/orbite_transport.h.
#include "tent/transport/orbite/orbite_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

namespace mooncake {
namespace tent {

namespace {

/// The attributes OrbiTE publishes for a buffer:
/// "endpoint=IP:port region=N".
struct Attrs {
    std::string endpoint;
    uint64_t region = 0;

    std::string encode() const {
        return "endpoint=" + endpoint + " region=" + std::to_string(region);
    }
    static bool decode(const std::string& text, Attrs& out) {
        std::istringstream in(text);
        std::string word;
        Attrs a;
        while (in >> word) {
            if (word.rfind("endpoint=", 0) == 0) a.endpoint = word.substr(9);
            if (word.rfind("region=", 0) == 0)
                a.region = std::strtoull(word.c_str() + 7, nullptr, 10);
        }
        if (a.endpoint.empty() || a.region == 0) return false;
        out = a;
        return true;
    }
};

Status failed(const orbite::Failure& f) {
    return Status::InternalError(f.describe());
}

/// "cuda:N" -> N, or -1 for any other location.
int cudaDevice(const std::string& location) {
    if (location.rfind("cuda:", 0) != 0) return -1;
    return std::atoi(location.c_str() + 5);
}

/// `json` (an object) with `"key": value` added unless it names `key`.
std::string withKey(const std::string& json, const std::string& key,
                    const std::string& value) {
    if (json.find("\"" + key + "\"") != std::string::npos) return json;
    size_t open = json.find('{');
    if (open == std::string::npos) return "{\"" + key + "\": " + value + "}";
    size_t next = json.find_first_not_of(" \t\r\n", open + 1);
    bool empty = next != std::string::npos && json[next] == '}';
    return json.substr(0, open + 1) + "\"" + key + "\": " + value +
           (empty ? "" : ", ") + json.substr(open + 1);
}

/// Whether `name` is a valid OrbiTE engine name (1-64 of A-Z a-z 0-9 . _ -).
bool validName(const std::string& name) {
    return !name.empty() && name.size() <= 64 &&
           name.find_first_not_of(
               "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
               std::string::npos;
}

/// The IPv4 address of the host part of "host:port" (a name is resolved),
/// or "" when there is none.
std::string hostAddress(const std::string& addr) {
    size_t colon = addr.rfind(':');
    std::string host = colon == std::string::npos ? addr : addr.substr(0, colon);
    if (host.empty() || host.front() == '[') return "";
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) == 1) return host;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) return "";
    char text[INET_ADDRSTRLEN] = {0};
    auto* sin = reinterpret_cast<sockaddr_in*>(found->ai_addr);
    std::string out = inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) ? text : "";
    freeaddrinfo(found);
    return out;
}

bool peerGone(orbite::Status s) {
    return s == orbite::Status::unavailable || s == orbite::Status::stale_peer;
}

/// A request refused before anything moved because of what it asked
/// (memory not registered, outside a region, not permitted).
bool refusedAsInvalid(orbite::Status s) {
    return s == orbite::Status::invalid_argument ||
           s == orbite::Status::not_found ||
           s == orbite::Status::out_of_range ||
           s == orbite::Status::permission_denied;
}

/// The region of `in` that holds all of `r`, or null.
const orbite::Region* regionOf(const std::vector<orbite::Region>& in, const orbite::Request& r) {
    const orbite::Region* found = nullptr;
    for (const orbite::Region& g : in)
        if (g.contains(r.remote_addr, r.length)) found = &g;
    return found;
}

/// Whether `region` may be asked `r` (a WRITE needs a writable region).
bool permits(const orbite::Region& region, const orbite::Request& r) {
    return r.opcode == ORBITE_OP_WRITE ? region.writable() : region.readable();
}

/// Whether an IPC transport maps a peer's memory of kind `k` (a direct
/// route can reach it); plain host memory moves over TCP only.
bool mapsDirectly(orbite::MemoryKind k) {
    return k == orbite::MemoryKind::shared_host || k == orbite::MemoryKind::cuda_ipc ||
           k == orbite::MemoryKind::mnnvl || k == orbite::MemoryKind::egm;
}

}  // namespace

/// A registered buffer: its registration, and the adoption record when the
/// memory is CUDA memory the stack allocated.
struct OrbiteTransport::Buffer {
    // Declared first, destroyed last: the record outlives the registration.
    std::optional<orbite::Allocation> adopted;
    orbite::Registration registration;
    uint64_t addr = 0;
    uint64_t length = 0;
    bool host = true;
};

/// One task: its fixed status while it is not in an OrbiTE batch (waiting
/// for a connect, copied locally, refused), or where its outcome lives.
struct OrbiteTransport::Task {
    size_t length = 0;
    TransferStatusEnum fixed = PENDING;
    int batch = -1;  ///< index into Tasks::batches, -1: not submitted
    size_t index = 0;
};

/// A sub-batch's tasks, shared with the connector threads.
struct OrbiteTransport::Tasks {
    std::mutex lock;
    std::vector<Task> tasks;
    std::vector<orbite::Batch> batches;
    /// Per batch: the target it went to, and that target's connection
    /// generation then.
    std::vector<std::pair<std::shared_ptr<Target>, uint64_t>> sent_to;
    /// TENT's progress hook, copied from the sub-batch (null once freed).
    std::function<void(BatchID)> notify;
    BatchID notify_id = 0;

    /// Calls TENT's progress hook (outside `lock`).
    void progress() {
        std::function<void(BatchID)> f;
        BatchID id;
        {
            std::lock_guard<std::mutex> g(lock);
            f = notify;
            id = notify_id;
        }
        if (f) f(id);
    }
};

struct OrbiteSubBatch final : Transport::SubBatch {
    explicit OrbiteSubBatch(size_t max)
        : max_size(max), tasks(std::make_shared<OrbiteTransport::Tasks>()) {
        // Room for a sub-batch of TENT's usual size, made once.
        size_t room = std::min<size_t>(max, 64);
        tasks->tasks.reserve(room);
        tasks->batches.reserve(room);
        tasks->sent_to.reserve(room);
    }
    size_t size() const override {
        std::lock_guard<std::mutex> g(tasks->lock);
        return tasks->tasks.size();
    }
    const size_t max_size;
    std::shared_ptr<OrbiteTransport::Tasks> tasks;
};

/// A target segment: its connection, and the tasks waiting for it.
struct OrbiteTransport::Target {
    /// Busy: a connector thread is connecting, or submitting what needs a
    /// round trip with the peer; later submissions queue behind it.
    enum State { Idle, Busy, Ready };
    explicit Target(SegmentID segment) : id(segment) {}
    const SegmentID id;
    std::mutex lock;
    std::condition_variable changed;
    State state = Idle;
    std::shared_ptr<orbite::Peer> peer;
    /// The regions the peer published when it was connected: what each
    /// may be asked (a READ-only region is never written) and whether
    /// SHM can reach it.
    std::shared_ptr<const std::vector<orbite::Region>> regions;
    /// The regions (by id) a submission on this connection has reached:
    /// the engine holds what reaching them again needs (an SHM, NVLink or
    /// MNNVL import, cached), so a submission naming only these is made
    /// on the caller's thread without a round trip to the peer.
    std::set<uint64_t> warm;
    /// Direct routes (orbite_direct_open) to the regions reached on this
    /// connection whose memory an IPC transport maps (null: none does):
    /// their tasks are copied on the caller's thread, each ending before
    /// submitTransferTasks returns, with no OrbiTE batch.
    std::map<uint64_t, std::shared_ptr<orbite::Direct>> routes;
    /// Bumped at every connect: a failure seen on an older connection does
    /// not reset a newer one.
    uint64_t generation = 0;
    /// Why the last connect failed ("" after a success).
    std::string why;
    struct Waiting {
        std::shared_ptr<Tasks> tasks;
        std::vector<size_t> ids;
        std::vector<orbite::Request> reqs;
    };
    std::vector<Waiting> waiting;
    std::thread connector;

    /// Whether every request of `reqs` names a region this connection has
    /// reached and may be asked of it: then submitting them needs no round
    /// trip to the peer. `lock` held.
    bool warmFor(const std::vector<orbite::Request>& reqs) const {
        for (const orbite::Request& r : reqs) {
            const orbite::Region* g = regionOf(*regions, r);
            if (!g || !permits(*g, r) || !warm.count(g->id)) return false;
        }
        return true;
    }

    /// Forgets the connection of `gen` (its peer left): the next use
    /// reconnects. `lock` held.
    void dropLocked(uint64_t gen) {
        if (state == Ready && generation == gen) {
            state = Idle;
            peer.reset();
            routes.clear();
        }
    }
};

OrbiteTransport::OrbiteTransport() = default;

OrbiteTransport::~OrbiteTransport() { (void)uninstall(); }

Status OrbiteTransport::install(std::string& local_segment_name,
                                std::shared_ptr<ControlService> metadata,
                                std::shared_ptr<Topology> local_topology,
                                std::shared_ptr<Config> conf) {
    if (engine_) return Status::InvalidArgument("OrbiTE transport is installed already" LOC_MARK);
    if (!metadata) return Status::InvalidArgument("install needs the metadata service" LOC_MARK);
    std::string config = "{}";
    if (conf) {
        std::string sub;
        if (conf->dumpSubtree("transports/orbite/engine", &sub) && sub != "null") config = sub;
        connect_timeout_ = std::chrono::milliseconds(
            conf->get<int64_t>("transports/orbite/connect_timeout_ms", 5000));
        if (connect_timeout_.count() <= 0)
            return Status::InvalidArgument(
                "transports/orbite/connect_timeout_ms must be positive" LOC_MARK);
    }
    // Peers' notifications name this engine by the segment's name; its
    // listener binds where the segment's RPC server is reachable.
    if (validName(local_segment_name))
        config = withKey(config, "name", "\"" + local_segment_name + "\"");
    auto local = metadata->segmentManager().getLocal();
    std::string host = local ? hostAddress(local->rpc_server_addr) : "";
    if (!host.empty()) config = withKey(config, "listen", "\"" + host + ":0\"");
    auto e = orbite::Engine::try_create(config);
    if (!e.ok()) return Status::InvalidArgument(e.error().describe() + LOC_MARK);
    engine_.emplace(std::move(e).value());
    metadata_ = std::move(metadata);
    conf_ = std::move(conf);
    local_name_ = local_segment_name;
    (void)local_topology;
    // Host memory over SHM or TCP; GPU memory (and pinned host memory to or
    // from it) over NVLink or MNNVL.
    orbite::TransportSet t = engine_->try_transports().ok() ? engine_->transports()
                                                           : orbite::TransportSet();
    caps = Capabilities{};
    caps.dram_to_dram = t.contains(orbite::Transport::tcp) || t.contains(orbite::Transport::shm);
    bool gpu = t.contains(orbite::Transport::nvlink) || t.contains(orbite::Transport::mnnvl);
    caps.gpu_to_gpu = caps.dram_to_gpu = caps.gpu_to_dram = gpu;
    return Status::OK();
}

Status OrbiteTransport::uninstall() {
    if (!engine_) return Status::OK();
    std::map<SegmentID, std::shared_ptr<Target>> targets;
    {
        std::lock_guard<std::mutex> g(targets_lock_);
        targets.swap(targets_);
    }
    // Connects end within their timeout; what waits for them fails.
    for (auto& [id, t] : targets) {
        std::thread th;
        {
            std::lock_guard<std::mutex> g(t->lock);
            th = std::move(t->connector);
        }
        if (th.joinable()) th.join();
        std::lock_guard<std::mutex> g(t->lock);
        t->peer.reset();
        t->state = Target::Idle;
    }
    {
        std::lock_guard<std::mutex> g(buffers_lock_);
        retireLocked();
        buffers_.clear();
        retiring_.clear();
    }
    auto closed = engine_->close();
    allocations_.clear();
    engine_.reset();
    if (!closed.ok()) return failed(closed.error());
    return Status::OK();
}

Status OrbiteTransport::allocateSubBatch(SubBatchRef& batch, size_t max_size) {
    batch = new OrbiteSubBatch(max_size);
    return Status::OK();
}

Status OrbiteTransport::freeSubBatch(SubBatchRef& batch) {
    auto* b = dynamic_cast<OrbiteSubBatch*>(batch);
    if (!b) return Status::InvalidArgument("not an OrbiTE sub-batch" LOC_MARK);
    {
        // Tasks still waiting for a connect are dropped with it; submitted
        // ones are detached (OrbiTE never cancels them mid-copy).
        std::lock_guard<std::mutex> g(b->tasks->lock);
        b->tasks->notify = nullptr;
        for (Task& t : b->tasks->tasks)
            if (t.batch < 0 && t.fixed == PENDING) t.fixed = CANCELED;
    }
    delete b;
    batch = nullptr;
    return Status::OK();
}

std::shared_ptr<OrbiteTransport::Target> OrbiteTransport::target(SegmentID id) {
    std::lock_guard<std::mutex> g(targets_lock_);
    auto& t = targets_[id];
    if (!t) t = std::make_shared<Target>(id);
    return t;
}

bool OrbiteTransport::copyLocally(const Request& r) {
    uint64_t src = reinterpret_cast<uintptr_t>(r.source);
    uint64_t dst = r.target_offset;
    std::lock_guard<std::mutex> g(buffers_lock_);
    auto within = [&](uint64_t addr) -> const Buffer* {
        auto it = buffers_.upper_bound(addr);
        if (it == buffers_.begin()) return nullptr;
        --it;
        const Buffer& b = *it->second;
        if (addr < b.addr || r.length > b.length || addr - b.addr > b.length - r.length) return nullptr;
        return &b;
    };
    const Buffer* a = within(src);
    const Buffer* b = within(dst);
    if (!a || !b || !a->host || !b->host) return false;
    void* to = r.opcode == Request::READ ? r.source : reinterpret_cast<void*>(dst);
    const void* from = r.opcode == Request::READ ? reinterpret_cast<void*>(dst) : r.source;
    std::memmove(to, from, r.length);
    return true;
}

Status OrbiteTransport::submitTransferTasks(SubBatchRef ref, const std::vector<Request>& requests) {
    if (!engine_) return Status::InvalidArgument("OrbiTE transport is not installed" LOC_MARK);
    auto* batch = dynamic_cast<OrbiteSubBatch*>(ref);
    if (!batch) return Status::InvalidArgument("not an OrbiTE sub-batch" LOC_MARK);
    std::shared_ptr<Tasks> tasks = batch->tasks;
    // Per target, in order of first use (mostly one).
    struct Work {
        SegmentID target;
        std::vector<size_t> ids;
        std::vector<orbite::Request> reqs;
    };
    std::vector<Work> per_target;
    bool progressed = false;
    {
        std::lock_guard<std::mutex> g(tasks->lock);
        if (tasks->tasks.size() + requests.size() > batch->max_size)
            return Status::TooManyRequests("the sub-batch holds at most " +
                                           std::to_string(batch->max_size) + " tasks" LOC_MARK);
        tasks->notify = batch->notify_progress;
        tasks->notify_id = batch->progress_batch_id;
        for (const Request& r : requests) {
            size_t id = tasks->tasks.size();
            tasks->tasks.push_back(Task{r.length});
            if (r.target_id == LOCAL_SEGMENT_ID && copyLocally(r)) {
                tasks->tasks[id].fixed = COMPLETED;
                progressed = true;
                continue;
            }
            // Local device memory (or memory no local buffer holds: OrbiTE
            // says which) goes through the engine, to itself.
            auto w = std::find_if(per_target.begin(), per_target.end(),
                                  [&](const Work& w) { return w.target == r.target_id; });
            if (w == per_target.end()) {
                per_target.push_back(Work{r.target_id, {}, {}});
                w = per_target.end() - 1;
                w->ids.reserve(requests.size());
                w->reqs.reserve(requests.size());
            }
            w->ids.push_back(id);
            w->reqs.push_back(r.opcode == Request::READ
                               ? orbite::read_request(r.source, r.target_offset, r.length)
                               : orbite::write_request(r.source, r.target_offset, r.length));
        }
    }
    for (Work& w : per_target) dispatch(target(w.target), tasks, std::move(w.ids), std::move(w.reqs));
    if (progressed) tasks->progress();
    return Status::OK();
}

OrbiteTransport::Sent OrbiteTransport::send(std::vector<size_t>& ids, std::vector<orbite::Request>& reqs,
                                            orbite::Peer& peer,
                                            std::shared_ptr<const std::vector<orbite::Region>> regions,
                                            const std::shared_ptr<Target>& t, uint64_t gen, bool may_ask) {
    // One OrbiTE batch. Under AUTO the engine moves what SHM (or NVLink,
    // MNNVL) can reach over it and the rest (plain host memory of the peer)
    // over TCP, when the two parts do not depend on each other.
    Sent out;
    if (!may_ask) {
        // On the caller's thread every request names a region reached
        // before, which permits it (Target::warmFor): sent as they are,
        // nothing asked.
        out.submitted.emplace(peer.try_submit(reqs));
        out.ids = std::move(ids);
        return out;
    }
    // `regions` is what the peer published when last asked: a region it
    // registered since is not in it, and one it registered again may have
    // other rights. The peer is asked again before a request is refused or
    // sent to an address no known region holds (the engine would ask
    // within the submission); the answer serves later submissions too.
    bool stale = false;
    for (const orbite::Request& r : reqs) {
        const orbite::Region* g = regionOf(*regions, r);
        stale |= !g || !permits(*g, r);
    }
    if (stale) {
        auto now = peer.try_regions();
        if (now.ok()) {
            regions = std::make_shared<const std::vector<orbite::Region>>(std::move(now).value());
            std::lock_guard<std::mutex> g(t->lock);
            if (t->generation == gen) t->regions = regions;
        }
    }
    std::vector<orbite::Request> sent_reqs;
    std::vector<uint64_t> reached;
    for (size_t k = 0; k < ids.size(); ++k) {
        const orbite::Request& r = reqs[k];
        const orbite::Region* region = regionOf(*regions, r);
        if (region && !permits(*region, r)) {
            // Never sent: the peer published this region without that right.
            out.refused.push_back(ids[k]);
            continue;
        }
        if (region) reached.push_back(region->id);
        out.ids.push_back(ids[k]);
        sent_reqs.push_back(r);
    }
    if (out.ids.empty()) return out;
    out.submitted.emplace(peer.try_submit(sent_reqs));
    if (out.submitted->ok() && !reached.empty()) {
        std::set<uint64_t> unrouted;
        {
            std::lock_guard<std::mutex> g(t->lock);
            if (t->generation != gen) return out;
            t->warm.insert(reached.begin(), reached.end());
            for (uint64_t id : reached)
                if (!t->routes.count(id)) unrouted.insert(id);
        }
        // A direct route to each region reached for the first time whose
        // memory an IPC transport maps (a round trip each, on this
        // connector thread): later tasks naming it skip the batch.
        std::map<uint64_t, std::shared_ptr<orbite::Direct>> opened;
        for (uint64_t id : unrouted) {
            auto g = std::find_if(regions->begin(), regions->end(),
                                  [id](const orbite::Region& r) { return r.id == id; });
            std::shared_ptr<orbite::Direct>& route = opened[id];
            if (g == regions->end() || !mapsDirectly(g->kind)) continue;
            auto d = peer.try_direct(g->addr, g->length);
            if (d.ok()) route = std::make_shared<orbite::Direct>(std::move(d).value());
        }
        std::lock_guard<std::mutex> g(t->lock);
        if (t->generation == gen) t->routes.insert(opened.begin(), opened.end());
    }
    return out;
}

bool OrbiteTransport::record(Tasks& tasks, Sent& sent, const std::shared_ptr<Target>& t, uint64_t gen) {
    for (size_t id : sent.refused) tasks.tasks[id].fixed = INVALID;
    if (!sent.submitted) return true;
    orbite::Result<orbite::Batch>& submitted = *sent.submitted;
    if (!submitted.ok()) {
        // Nothing was sent: the caller reconnects and submits again.
        if (peerGone(submitted.status())) return false;
        // Requests OrbiTE refuses before sending anything (unregistered
        // local memory, an address no region holds, a region not writable)
        // are INVALID; an unreachable target fails them.
        std::fprintf(stderr, "orbite_transport: segment %llu: %s\n",
                     static_cast<unsigned long long>(t->id), submitted.error().describe().c_str());
        auto why = refusedAsInvalid(submitted.status()) ? INVALID : FAILED;
        for (size_t id : sent.ids) tasks.tasks[id].fixed = why;
        return true;
    }
    int index = static_cast<int>(tasks.batches.size());
    tasks.batches.push_back(std::move(submitted).value());
    tasks.sent_to.emplace_back(t, gen);
    for (size_t k = 0; k < sent.ids.size(); ++k) {
        Task& task = tasks.tasks[sent.ids[k]];
        task.batch = index;
        task.index = k;
        // Cancelled while its submission was under way: cancelled in
        // OrbiTE now (unless it started, as any cancel).
        if (task.fixed == CANCELED) (void)tasks.batches.back().cancel_request(k);
    }
    return true;
}

bool OrbiteTransport::copyDirect(const std::shared_ptr<Target>& t, Tasks& tasks, std::vector<size_t>& ids,
                                 std::vector<orbite::Request>& reqs) {
    std::vector<std::shared_ptr<orbite::Direct>> routes(reqs.size());
    std::vector<uint64_t> region_ids(reqs.size(), 0);
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(t->lock);
        // Only when nothing waits for the target: a task never overtakes
        // one submitted before it.
        if (t->state != Target::Ready || t->routes.empty()) return false;
        gen = t->generation;
        bool any = false;
        for (size_t k = 0; k < reqs.size(); ++k) {
            const orbite::Region* region = regionOf(*t->regions, reqs[k]);
            if (!region || !permits(*region, reqs[k])) continue;
            auto it = t->routes.find(region->id);
            if (it == t->routes.end() || !it->second) continue;
            routes[k] = it->second;
            region_ids[k] = region->id;
            any = true;
        }
        if (!any) return false;
    }
    std::vector<size_t> completed;
    size_t kept = 0;
    for (size_t k = 0; k < reqs.size(); ++k) {
        if (routes[k]) {
            auto r = routes[k]->try_copy(reqs[k]);
            if (r.ok() && r->ok()) {
                completed.push_back(ids[k]);
                continue;
            }
            // Refused or failed (the region unregistered, the peer gone,
            // local memory OrbiTE does not hold): the task goes the way of
            // a region not reached yet, through a connector thread, which
            // submits it and reports OrbiTE's outcome; the route is opened
            // again once a submission reaches the region.
            std::lock_guard<std::mutex> g(t->lock);
            if (t->generation == gen) {
                t->routes.erase(region_ids[k]);
                t->warm.erase(region_ids[k]);
            }
        }
        ids[kept] = ids[k];
        reqs[kept] = reqs[k];
        ++kept;
    }
    ids.resize(kept);
    reqs.resize(kept);
    if (completed.empty()) return false;
    direct_copies_ += completed.size();
    std::lock_guard<std::mutex> g(tasks.lock);
    for (size_t id : completed) tasks.tasks[id].fixed = COMPLETED;
    return true;
}

void OrbiteTransport::dispatch(const std::shared_ptr<Target>& t, const std::shared_ptr<Tasks>& tasks,
                               std::vector<size_t> ids, std::vector<orbite::Request> reqs) {
    if (copyDirect(t, *tasks, ids, reqs)) tasks->progress();
    if (ids.empty()) return;
    std::thread finished;
    {
        std::unique_lock<std::mutex> g(t->lock);
        if (t->state == Target::Ready && t->warmFor(reqs)) {
            std::shared_ptr<orbite::Peer> peer = t->peer;
            std::shared_ptr<const std::vector<orbite::Region>> regions = t->regions;
            uint64_t gen = t->generation;
            g.unlock();
            Sent sent = send(ids, reqs, *peer, regions, t, gen, false);
            {
                std::lock_guard<std::mutex> tg(tasks->lock);
                if (record(*tasks, sent, t, gen)) return;
            }
            // The peer left since the last use: reconnect (reading its
            // segment again) and submit then.
            ids = std::move(sent.ids);
            g.lock();
            t->dropLocked(gen);
        }
        t->waiting.push_back(Target::Waiting{tasks, std::move(ids), std::move(reqs)});
        if (t->state == Target::Busy) return;
        // Not connected: a connector thread connects, then submits. Connected,
        // but a request names a region not reached yet (its import is opened
        // with the peer) or not known (the peer is asked for its regions): a
        // connector thread submits, so that this call never waits for the
        // peer; later submissions queue behind it, in order.
        bool reconnect = t->state == Target::Idle;
        t->state = Target::Busy;
        finished = std::move(t->connector);
        t->connector = std::thread([this, t, reconnect] { connect(t, reconnect); });
    }
    if (finished.joinable()) finished.join();
}

void OrbiteTransport::connect(std::shared_ptr<Target> t, bool reconnect) {
    std::shared_ptr<orbite::Peer> peer;
    uint64_t gen;
    if (!reconnect) {
        // Connected: submit what waits (see dispatch).
        {
            std::lock_guard<std::mutex> g(t->lock);
            peer = t->peer;
            gen = t->generation;
        }
        drain(t, peer, gen);
        return;
    }
    std::string endpoint;
    std::string why;
    if (t->id == LOCAL_SEGMENT_ID) {
        endpoint = engine_->endpoint();
    } else {
        // A connector is a fresh thread: TENT's per-thread segment cache
        // reads the segment from the metadata service again.
        auto& segments = metadata_->segmentManager();
        (void)segments.invalidateRemote(t->id);
        SegmentDescRef seg;
        Status s = segments.getRemoteCached(seg, t->id);
        if (!s.ok()) {
            why = "segment " + std::to_string(t->id) + ": " + std::string(s.message());
        } else if (seg->name == local_name_) {
            endpoint = engine_->endpoint();
        } else {
            Attrs attrs;
            for (const BufferDesc& b : seg->getMemory().buffers) {
                auto it = b.transport_attrs.find(ORBITE);
                if (it != b.transport_attrs.end() && Attrs::decode(it->second, attrs)) break;
            }
            endpoint = attrs.endpoint;
            if (endpoint.empty()) why = "segment " + seg->name + " has no OrbiTE buffer";
        }
    }
    if (!endpoint.empty()) {
        auto p = engine_->try_connect(endpoint, connect_timeout_);
        if (p.ok())
            peer = std::make_shared<orbite::Peer>(std::move(p).value());
        else
            why = p.error().describe();
    }
    auto regions = std::make_shared<std::vector<orbite::Region>>();
    if (peer) {
        auto r = peer->try_regions();
        if (r.ok()) *regions = std::move(r).value();
    }
    {
        std::lock_guard<std::mutex> g(t->lock);
        gen = ++t->generation;
        t->peer = peer;
        t->regions = regions;
        t->warm.clear();
        t->routes.clear();
        t->why = why;
    }
    drain(t, peer, gen);
}

void OrbiteTransport::drain(const std::shared_ptr<Target>& t, const std::shared_ptr<orbite::Peer>& peer,
                            uint64_t gen) {
    // Submit (or fail) what waits, in order, before anything submitted
    // after it: the state stays Busy until none is left.
    for (;;) {
        std::vector<Target::Waiting> waiting;
        {
            std::lock_guard<std::mutex> g(t->lock);
            if (t->waiting.empty()) {
                t->state = peer ? Target::Ready : Target::Idle;
                t->changed.notify_all();
                return;
            }
            waiting.swap(t->waiting);
        }
        for (Target::Waiting& w : waiting) {
            std::shared_ptr<const std::vector<orbite::Region>> regions;
            std::string why;
            {
                std::lock_guard<std::mutex> g(t->lock);
                regions = t->regions;
                why = t->why;
            }
            // Tasks cancelled (or whose sub-batch was freed) while they
            // waited are not sent.
            std::vector<size_t> ids;
            std::vector<orbite::Request> reqs;
            {
                std::lock_guard<std::mutex> g(w.tasks->lock);
                for (size_t k = 0; k < w.ids.size(); ++k) {
                    if (w.tasks->tasks[w.ids[k]].fixed != PENDING) continue;
                    ids.push_back(w.ids[k]);
                    reqs.push_back(w.reqs[k]);
                }
                if (!peer) {
                    std::fprintf(stderr, "orbite_transport: segment %llu: %s\n",
                                 static_cast<unsigned long long>(t->id), why.c_str());
                    for (size_t id : ids) w.tasks->tasks[id].fixed = FAILED;
                    ids.clear();
                }
            }
            if (!ids.empty()) {
                // Sent without the sub-batch's lock: the peer may take its
                // time to answer while TENT polls (or cancels) these tasks.
                Sent sent = send(ids, reqs, *peer, regions, t, gen, true);
                std::lock_guard<std::mutex> g(w.tasks->lock);
                if (!record(*w.tasks, sent, t, gen)) {
                    for (size_t id : sent.ids)
                        if (w.tasks->tasks[id].fixed == PENDING && w.tasks->tasks[id].batch < 0)
                            w.tasks->tasks[id].fixed = FAILED;
                }
            }
            w.tasks->progress();
        }
    }
}

namespace {

/// A sub-batch's tasks, locked, and one task of them.
struct LockedTask {
    std::unique_lock<std::mutex> guard;
    OrbiteTransport::Tasks* tasks = nullptr;
    OrbiteTransport::Task* task = nullptr;
};

/// Locks `ref`'s tasks and finds task `id`, or says why not.
Status lockTask(Transport::SubBatchRef ref, int id, LockedTask& out) {
    auto* batch = dynamic_cast<OrbiteSubBatch*>(ref);
    if (!batch) return Status::InvalidArgument("not an OrbiTE sub-batch" LOC_MARK);
    out.tasks = batch->tasks.get();
    out.guard = std::unique_lock<std::mutex>(out.tasks->lock);
    if (id < 0 || static_cast<size_t>(id) >= out.tasks->tasks.size())
        return Status::InvalidArgument("no task " + std::to_string(id) + " in this sub-batch" LOC_MARK);
    out.task = &out.tasks->tasks[id];
    return Status::OK();
}

}  // namespace

Status OrbiteTransport::getTransferStatus(SubBatchRef ref, int task_id, TransferStatus& status) {
    LockedTask locked;
    CHECK_STATUS(lockTask(ref, task_id, locked));
    Tasks& tasks = *locked.tasks;
    const Task& t = *locked.task;
    status = TransferStatus{t.fixed, t.fixed == COMPLETED ? t.length : 0};
    if (t.batch < 0) return Status::OK();
    auto r = tasks.batches[t.batch].try_result(t.index);
    if (!r.ok()) return failed(r.error());
    switch (r->status) {
        case orbite::Status::pending: status.s = PENDING; break;
        case orbite::Status::ok:
            status.s = COMPLETED;
            status.transferred_bytes = t.length;
            break;
        case orbite::Status::cancelled: status.s = CANCELED; break;
        case orbite::Status::timed_out: status.s = TIMEOUT; break;
        default:
            // Refused for what it asked (a READ-only region written, an
            // address outside the region), nothing moved: INVALID, as at
            // submit.
            status.s = refusedAsInvalid(r->status) && r->remote_effect == orbite::RemoteEffect::none
                           ? INVALID
                           : FAILED;
            if (peerGone(r->status)) {
                // The target left: its next use reconnects.
                auto& [target, gen] = tasks.sent_to[t.batch];
                std::lock_guard<std::mutex> tg(target->lock);
                target->dropLocked(gen);
            }
            break;
    }
    return Status::OK();
}

Status OrbiteTransport::cancelTransferTask(SubBatchRef ref, int task_id) {
    LockedTask locked;
    CHECK_STATUS(lockTask(ref, task_id, locked));
    Tasks& tasks = *locked.tasks;
    Task& t = *locked.task;
    if (t.batch < 0) {
        if (t.fixed == PENDING) t.fixed = CANCELED;  // still waiting for a connect
        return Status::OK();
    }
    // This task only; one that started runs to its outcome.
    auto r = tasks.batches[t.batch].cancel_request(t.index);
    return r.ok() ? Status::OK() : failed(r.error());
}

Status OrbiteTransport::allocateLocalMemory(void** addr, size_t size, MemoryOptions& options) {
    if (!engine_) return Status::InvalidArgument("OrbiTE transport is not installed" LOC_MARK);
    int device = cudaDevice(options.location);
    orbite::TransportSet t = engine_->transports();
    // GPU memory a peer can import: CUDA IPC memory where NVLink runs, MNNVL
    // memory otherwise; host memory a peer on this host can map (SHM).
    auto a = device < 0 ? orbite::Allocation::try_shared_host(size)
             : t.contains(orbite::Transport::nvlink) || !t.contains(orbite::Transport::mnnvl)
                 ? orbite::Allocation::try_cuda_ipc(device, size)
                 : orbite::Allocation::try_mnnvl(device, size);
    if (!a.ok()) return failed(a.error());
    *addr = a->data();
    std::lock_guard<std::mutex> g(buffers_lock_);
    allocations_.emplace(a->address(), std::move(a).value());
    return Status::OK();
}

Status OrbiteTransport::freeLocalMemory(void* addr, size_t) {
    std::lock_guard<std::mutex> g(buffers_lock_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == allocations_.end())
        return Status::InvalidArgument("not memory this transport allocated" LOC_MARK);
    auto r = it->second.free();
    if (!r.ok()) return failed(r.error());  // still registered or exported: kept
    allocations_.erase(it);
    return Status::OK();
}

Status OrbiteTransport::addMemoryBuffer(BufferDesc& desc, const MemoryOptions& options) {
    if (!engine_) return Status::InvalidArgument("OrbiTE transport is not installed" LOC_MARK);
    auto buffer = std::make_unique<Buffer>();
    void* addr = reinterpret_cast<void*>(static_cast<uintptr_t>(desc.addr));
    std::lock_guard<std::mutex> g(buffers_lock_);
    retireLocked();
    if (buffers_.count(desc.addr)) return Status::OK();  // registered already
    const std::string& location =
        desc.location.empty() || desc.location == kWildcardLocation ? options.location : desc.location;
    int device = cudaDevice(location);
    if (device >= 0 && !allocations_.count(desc.addr)) {
        // GPU memory the stack allocated (a caching allocator's segment):
        // handing it to this transport is the stack's consent to peers
        // reaching that allocation.
        auto a = orbite::Allocation::try_cuda_adopt(addr, desc.length);
        if (!a.ok()) return failed(a.error());
        buffer->adopted.emplace(std::move(a).value());
    }
    // What peers may do: kGlobalReadOnly read it, kLocalReadWrite nothing.
    orbite::Access access = options.perm == kGlobalReadWrite ? orbite::Access::read_write
                            : options.perm == kGlobalReadOnly ? orbite::Access::read
                                                              : orbite::Access::none;
    auto reg = engine_->try_register_memory(addr, desc.length, access);
    if (!reg.ok())
        return reg.status() == orbite::Status::invalid_argument
                   ? Status::AddressNotRegistered(reg.error().describe() + LOC_MARK)
                   : failed(reg.error());
    buffer->registration = std::move(reg).value();
    buffer->addr = desc.addr;
    buffer->length = desc.length;
    buffer->host = device < 0;
    desc.transports.push_back(ORBITE);
    desc.transport_attrs[ORBITE] = Attrs{engine_->endpoint(), buffer->registration.id()}.encode();
    buffers_.emplace(desc.addr, std::move(buffer));
    return Status::OK();
}

void OrbiteTransport::retireLocked() {
    for (auto it = retiring_.begin(); it != retiring_.end();) {
        Buffer& b = **it;
        if (b.registration.unregister(std::chrono::milliseconds(1)).ok() &&
            (!b.adopted || b.adopted->free().ok()))
            it = retiring_.erase(it);
        else
            ++it;
    }
}

Status OrbiteTransport::removeMemoryBuffer(BufferDesc& desc) {
    std::lock_guard<std::mutex> g(buffers_lock_);
    retireLocked();
    auto it = buffers_.find(desc.addr);
    if (it == buffers_.end()) return Status::OK();
    std::unique_ptr<Buffer> b = std::move(it->second);
    buffers_.erase(it);
    // TENT forgets the buffer whatever this returns: one that copies still
    // use stays registered only until they end (retried later), and is
    // never published or used for local copies again.
    auto r = b->registration.unregister();
    if (r.ok() && (!b->adopted || b->adopted->free().ok())) return Status::OK();
    std::string why = r.ok() ? "freeing the adopted allocation failed" : r.error().describe();
    retiring_.push_back(std::move(b));
    return Status::InternalError("unregister deferred: " + why + LOC_MARK);
}

Status OrbiteTransport::sendNotification(SegmentID target_id, const Notification& notify) {
    if (!engine_) return Status::InvalidArgument("OrbiTE transport is not installed" LOC_MARK);
    std::shared_ptr<Target> t = target(target_id);
    std::shared_ptr<orbite::Peer> peer;
    std::thread finished;
    {
        // After every transfer submitted before it: wait for a connect in
        // progress (or start one) and for its queue to drain.
        std::unique_lock<std::mutex> g(t->lock);
        if (t->state == Target::Idle) {
            t->state = Target::Busy;
            finished = std::move(t->connector);
            t->connector = std::thread([this, t] { connect(t, true); });
        }
        auto until = std::chrono::steady_clock::now() + connect_timeout_ + std::chrono::seconds(5);
        t->changed.wait_until(g, until, [&] { return t->state != Target::Busy; });
        if (t->state != Target::Ready)
            return Status::InternalError("segment " + std::to_string(target_id) +
                                         " unreachable: " + t->why + LOC_MARK);
        peer = t->peer;
    }
    if (finished.joinable()) finished.join();
    // The sender's name is the engine's (the local segment's); TENT's name
    // field travels only if the caller put it in the message.
    orbite::Result<void> r = peer->try_notify(notify.msg);
    if (!r.ok()) return failed(r.error());
    return Status::OK();
}

Status OrbiteTransport::receiveNotification(std::vector<Notification>& notify_list) {
    if (!engine_) return Status::InvalidArgument("OrbiTE transport is not installed" LOC_MARK);
    for (;;) {
        auto n = engine_->try_take_notification(std::chrono::milliseconds(0));
        if (!n.ok()) {
            if (n.status() == orbite::Status::timed_out) return Status::OK();
            return failed(n.error());
        }
        notify_list.push_back(Notification{std::move(n.value().sender), std::move(n.value().msg)});
    }
}

}  // namespace tent
}  // namespace mooncake
