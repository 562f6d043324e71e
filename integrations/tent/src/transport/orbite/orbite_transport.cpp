// Copyright 2026 The OrbiTE Authors
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// OrbiteTransport: see tent/transport/orbite/orbite_transport.h.
#include "tent/transport/orbite/orbite_transport.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <shared_mutex>
#include <sstream>

#include "orbite_workers.h"

namespace mooncake {
namespace tent {

namespace {

using Clock = std::chrono::steady_clock;

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

/// The keys of the JSON object `json` (its first level only); empty when
/// it is no object.
std::vector<std::string> topLevelKeys(const std::string& json) {
    std::vector<std::string> keys;
    size_t at = json.find_first_not_of(" \t\r\n");
    if (at == std::string::npos || json[at] != '{') return keys;
    int depth = 0;
    bool expect_key = false;
    for (size_t i = at; i < json.size(); ++i) {
        char c = json[i];
        if (c == '"') {
            size_t end = i + 1;
            std::string text;
            for (; end < json.size() && json[end] != '"'; ++end) {
                if (json[end] == '\\' && end + 1 < json.size()) ++end;
                text += json[end];
            }
            if (depth == 1 && expect_key) keys.push_back(text);
            expect_key = false;
            i = end;
        } else if (c == '{' || c == '[') {
            ++depth;
            expect_key = c == '{' && depth == 1;
        } else if (c == '}' || c == ']') {
            --depth;
        } else if (c == ',' && depth == 1) {
            expect_key = true;
        }
    }
    return keys;
}

/// Whether `name` is a valid OrbiTE engine name (1-64 of A-Z a-z 0-9 . _ -).
bool validName(const std::string& name) {
    return !name.empty() && name.size() <= 64 &&
           name.find_first_not_of(
               "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
               "abcdefghijklmnopqrstuvwxyz0123456789._-") == std::string::npos;
}

/// The IPv4 address of the host part of "host:port" (a name is resolved),
/// or "" when there is none.
std::string hostAddress(const std::string& addr) {
    size_t colon = addr.rfind(':');
    std::string host =
        colon == std::string::npos ? addr : addr.substr(0, colon);
    if (host.empty() || host.front() == '[') return "";
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) == 1) return host;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found)
        return "";
    char text[INET_ADDRSTRLEN] = {0};
    auto* sin = reinterpret_cast<sockaddr_in*>(found->ai_addr);
    std::string out =
        inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) ? text : "";
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

/// How a task OrbiTE refused or failed before it was sent ends: INVALID
/// when it was refused for what it asked, TIMEOUT when a deadline passed
/// (TENT treats it as final, as its own transports' timeouts), FAILED
/// otherwise (TENT may fail it over to another transport).
TransferStatusEnum endedAs(orbite::Status s) {
    if (refusedAsInvalid(s)) return INVALID;
    return s == orbite::Status::timed_out ? TIMEOUT : FAILED;
}

/// The region of `in` that holds all of `r`, or null.
const orbite::Region* regionOf(const std::vector<orbite::Region>& in,
                               const orbite::Request& r) {
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
    return k == orbite::MemoryKind::shared_host ||
           k == orbite::MemoryKind::cuda_ipc ||
           k == orbite::MemoryKind::mnnvl || k == orbite::MemoryKind::egm;
}

/// TENT's Notification as one OrbiTE message: its name travels in front
/// of its text ("tent-notification/1:LEN:" NAME MSG). A message from a
/// sender that does not frame it is taken whole, named by its sender.
constexpr char kNamed[] = "tent-notification/1:";

std::string frame(const Notification& n) {
    return kNamed + std::to_string(n.name.size()) + ":" + n.name + n.msg;
}

Notification unframe(std::string sender, std::string message) {
    const size_t prefix = sizeof(kNamed) - 1;
    if (message.compare(0, prefix, kNamed) == 0) {
        size_t colon = message.find(':', prefix);
        char* end = nullptr;
        unsigned long long len =
            colon == std::string::npos
                ? 0
                : std::strtoull(message.c_str() + prefix, &end, 10);
        if (colon != std::string::npos && end == message.c_str() + colon &&
            len <= message.size() - colon - 1)
            return Notification{message.substr(colon + 1, len),
                                message.substr(colon + 1 + len)};
    }
    return Notification{std::move(sender), std::move(message)};
}

/// OrbiTE's log lines go to glog, as TENT's own do.
void toGlog(uint32_t level, const char* message, void*) {
    switch (level) {
        case ORBITE_LOG_ERROR:
            LOG(ERROR) << "orbite: " << message;
            break;
        case ORBITE_LOG_WARN:
            LOG(WARNING) << "orbite: " << message;
            break;
        case ORBITE_LOG_INFO:
            LOG(INFO) << "orbite: " << message;
            break;
        default:
            VLOG(1) << "orbite: " << message;
            break;
    }
}

/// The time left until `deadline`, at least 1 ms (0 would mean the
/// engine's default to OrbiTE).
std::chrono::milliseconds left(Clock::time_point deadline) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    return std::max(ms, std::chrono::milliseconds(1));
}

}  // namespace

/// Closed at uninstall: a progress hook called later (from an OrbiTE
/// thread ending a batch) no longer reaches TENT.
struct OrbiteTransport::ProgressGate {
    std::shared_mutex lock;
    bool open = true;
};

/// TENT's progress hook of one sub-batch, shared with the hooks of its
/// OrbiTE batches (which own nothing else of the sub-batch).
struct OrbiteProgress {
    explicit OrbiteProgress(std::shared_ptr<OrbiteTransport::ProgressGate> g)
        : gate(std::move(g)) {}
    std::shared_ptr<OrbiteTransport::ProgressGate> gate;
    std::mutex lock;
    std::function<void(BatchID)> notify;
    BatchID id = 0;

    /// Calls TENT's hook (if set, and the transport is installed).
    void call() {
        std::function<void(BatchID)> f;
        BatchID batch;
        {
            std::lock_guard<std::mutex> g(lock);
            f = notify;
            batch = id;
        }
        if (!f) return;
        std::shared_lock<std::shared_mutex> open(gate->lock);
        if (gate->open) f(batch);
    }
};

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
/// for the pool, copied locally or directly, refused), or where its
/// outcome lives.
struct OrbiteTransport::Task {
    size_t length = 0;
    TransferStatusEnum fixed = PENDING;
    int batch = -1;  ///< index into Tasks::batches, -1: not submitted
    size_t index = 0;
    /// In a submission to OrbiTE right now: its deadline is OrbiTE's.
    bool sending = false;
    /// Not handed to OrbiTE by then, it ends TIMEOUT (never sent).
    Clock::time_point deadline{};

    /// Ends TIMEOUT if it still waits for the pool at `now`, past its
    /// deadline; true if it did. TIMEOUT, not FAILED: TENT fails a FAILED
    /// task over to its next transport, which (like TENT's own retry of
    /// the segment) waits TENT's RPC timeout for a target that does not
    /// answer; TIMEOUT is final in TENT, as its RDMA transport's.
    bool expire(Clock::time_point now) {
        if (fixed != PENDING || batch >= 0 || sending || now < deadline)
            return false;
        fixed = TIMEOUT;
        return true;
    }
};

/// A sub-batch's tasks, shared with the pool's jobs and the timer.
struct OrbiteTransport::Tasks {
    explicit Tasks(std::shared_ptr<ProgressGate> gate)
        : notifier(std::make_shared<OrbiteProgress>(std::move(gate))) {}
    std::mutex lock;
    std::vector<Task> tasks;
    std::vector<orbite::Batch> batches;
    /// Per batch: the target it went to, and that target's connection
    /// generation then.
    std::vector<std::pair<std::shared_ptr<Target>, uint64_t>> sent_to;
    std::shared_ptr<OrbiteProgress> notifier;

    void progress() { notifier->call(); }
};

struct OrbiteSubBatch final : Transport::SubBatch {
    OrbiteSubBatch(size_t max,
                   std::shared_ptr<OrbiteTransport::ProgressGate> gate)
        : max_size(max),
          tasks(std::make_shared<OrbiteTransport::Tasks>(std::move(gate))) {
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

/// A segment lookup through TENT's metadata service, run on the lookup
/// pool and waited for by connects until their deadline.
struct OrbiteTransport::Lookup {
    std::mutex lock;
    std::condition_variable finished;
    bool done = false;
    std::string endpoint;  ///< "" when none was found (see why)
    std::string why;
    std::string name;  ///< the segment's name
};

/// A target segment: its connection, and the tasks waiting for it.
struct OrbiteTransport::Target {
    /// Busy: a pool job is connecting, or submitting what needs a round
    /// trip with the peer; later submissions queue behind it.
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
    /// connection whose memory an IPC transport maps (null: none does).
    std::map<uint64_t, std::shared_ptr<orbite::Direct>> routes;
    /// Bumped at every connect: a failure seen on an older connection does
    /// not reset a newer one.
    uint64_t generation = 0;
    /// A connection was dropped since the last connect: the next one
    /// refreshes TENT's cached copies of the segment.
    bool dropped = false;
    /// Why the last connect failed ("" after a success).
    std::string why;
    /// How the tasks it could not send end: TIMEOUT when the last connect
    /// ran out of time (the lookup or the peer did not answer), else
    /// FAILED.
    TransferStatusEnum unsent = FAILED;
    /// The segment lookup in flight, if any.
    std::shared_ptr<Lookup> lookup;
    struct Waiting {
        std::shared_ptr<Tasks> tasks;
        std::vector<size_t> ids;
        std::vector<orbite::Request> reqs;
    };
    std::deque<Waiting> waiting;

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

    /// Forgets the connection (its peer left): the next connect looks the
    /// segment up again. `lock` held.
    void forgetLocked() {
        peer.reset();
        routes.clear();
        warm.clear();
        dropped = true;
    }

    /// Forgets the connection of `gen` if it is the current one and ready:
    /// the next use reconnects. `lock` held.
    void dropLocked(uint64_t gen) {
        if (state == Ready && generation == gen) {
            state = Idle;
            forgetLocked();
        }
    }
};

OrbiteTransport::OrbiteTransport() = default;

OrbiteTransport::~OrbiteTransport() { (void)uninstall(); }

Status OrbiteTransport::readConfig(const Config& conf, std::string& engine) {
    static const std::set<std::string> known = {
        "enable", "engine", "connect_timeout_ms", "unregister_timeout_ms",
        "threads"};
    std::string subtree;
    if (conf.dumpSubtree("transports/orbite", &subtree)) {
        for (const std::string& key : topLevelKeys(subtree)) {
            if (known.count(key)) continue;
            if (key == "config")
                LOG(WARNING) << "orbite_transport: transports/orbite/config "
                                "is not read; the engine's configuration is "
                                "transports/orbite/engine";
            else
                LOG(WARNING) << "orbite_transport: unknown key transports/"
                                "orbite/"
                             << key << " ignored (known: enable, engine, "
                             << "connect_timeout_ms, unregister_timeout_ms, "
                                "threads)";
        }
    }
    std::string sub;
    if (conf.dumpSubtree("transports/orbite/engine", &sub) && sub != "null") {
        engine = sub;
        // A string holds the object (tent_set_config stores strings).
        if (!sub.empty() && sub.front() == '"')
            engine = conf.get<std::string>("transports/orbite/engine", "{}");
    }
    connect_timeout_ = std::chrono::milliseconds(
        conf.get<int64_t>("transports/orbite/connect_timeout_ms", 5000));
    unregister_timeout_ = std::chrono::milliseconds(
        conf.get<int64_t>("transports/orbite/unregister_timeout_ms", 1000));
    int64_t threads = conf.get<int64_t>("transports/orbite/threads", 8);
    if (connect_timeout_.count() <= 0)
        return Status::InvalidArgument(
            "transports/orbite/connect_timeout_ms must be positive" LOC_MARK);
    if (unregister_timeout_.count() <= 0)
        return Status::InvalidArgument(
            "transports/orbite/unregister_timeout_ms must be "
            "positive" LOC_MARK);
    if (threads < 1 || threads > 1024)
        return Status::InvalidArgument(
            "transports/orbite/threads must be 1 to 1024" LOC_MARK);
    max_threads_ = static_cast<size_t>(threads);
    return Status::OK();
}

Status OrbiteTransport::install(std::string& local_segment_name,
                                std::shared_ptr<ControlService> metadata,
                                std::shared_ptr<Topology> local_topology,
                                std::shared_ptr<Config> conf) {
    if (engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is installed already" LOC_MARK);
    if (!metadata)
        return Status::InvalidArgument(
            "install needs the metadata service" LOC_MARK);
    std::string config = "{}";
    if (conf) CHECK_STATUS(readConfig(*conf, config));
    // Peers' notifications name this engine by the segment's name; its
    // listener binds where the segment's RPC server is reachable; a
    // notification carries TENT's name and message (TENT's C API allows
    // 256 and 4096 bytes).
    if (validName(local_segment_name))
        config = withKey(config, "name", "\"" + local_segment_name + "\"");
    auto local = metadata->segmentManager().getLocal();
    std::string host = local ? hostAddress(local->rpc_server_addr) : "";
    if (!host.empty()) config = withKey(config, "listen", "\"" + host + ":0\"");
    config = withKey(config, "notification_max_bytes", "8192");
    // OrbiTE's own log lines go to glog, for the whole process.
    static std::once_flag logging;
    std::call_once(logging,
                   [] { (void)orbite_set_log_callback(&toGlog, nullptr); });
    auto e = orbite::Engine::try_create(config);
    if (!e.ok())
        return Status::InvalidArgument(e.error().describe() + LOC_MARK);
    engine_.emplace(std::move(e).value());
    metadata_ = std::move(metadata);
    conf_ = std::move(conf);
    local_name_ = local_segment_name;
    (void)local_topology;
    gate_ = std::make_shared<ProgressGate>();
    jobs_ = std::make_unique<OrbiteWorkers>(max_threads_);
    lookups_ = std::make_unique<OrbiteWorkers>(max_threads_);
    timer_ = std::make_unique<OrbiteTimer>();
    // Host memory over SHM or TCP; GPU memory (and pinned host memory to or
    // from it) over NVLink or MNNVL.
    orbite::TransportSet t = engine_->try_transports().ok()
                                 ? engine_->transports()
                                 : orbite::TransportSet();
    caps = Capabilities{};
    caps.dram_to_dram = t.contains(orbite::Transport::tcp) ||
                        t.contains(orbite::Transport::shm);
    bool gpu = t.contains(orbite::Transport::nvlink) ||
               t.contains(orbite::Transport::mnnvl);
    caps.gpu_to_gpu = caps.dram_to_gpu = caps.gpu_to_dram = gpu;
    return Status::OK();
}

Status OrbiteTransport::uninstall() {
    if (!engine_) return Status::OK();
    {
        // No progress hook reaches TENT from now on (a batch ending while
        // the engine closes calls them).
        std::unique_lock<std::shared_mutex> g(gate_->lock);
        gate_->open = false;
    }
    // Calls the pool's jobs are in end with the engine's close (submissions
    // fenced, peers gone); a job then fails what waits.
    auto closed = engine_->close();
    // Jobs end within the connect timeout (a segment lookup is waited for
    // until then); lookups stuck in TENT's RPC are left to end on their own
    // (they hold only the metadata service and their own record).
    size_t stuck = jobs_->stop(connect_timeout_ + std::chrono::seconds(5));
    if (stuck)
        LOG(ERROR) << "orbite_transport: " << stuck
                   << " jobs did not end at uninstall";
    size_t lookups = lookups_->stop(std::chrono::milliseconds(100));
    if (lookups)
        LOG(WARNING) << "orbite_transport: " << lookups
                     << " segment lookups still wait for TENT's metadata "
                        "service; left to end on their own";
    timer_->stop();
    std::map<SegmentID, std::shared_ptr<Target>> targets;
    {
        std::lock_guard<std::mutex> g(targets_lock_);
        targets.swap(targets_);
    }
    for (auto& [id, t] : targets) {
        std::lock_guard<std::mutex> g(t->lock);
        t->forgetLocked();
        t->state = Target::Idle;
    }
    {
        std::lock_guard<std::mutex> g(buffers_lock_);
        retireLocked();
        buffers_.clear();
        retiring_.clear();
    }
    allocations_.clear();
    engine_.reset();
    if (!closed.ok()) return failed(closed.error());
    return Status::OK();
}

size_t OrbiteTransport::threads() const {
    return (jobs_ ? jobs_->threads() : 0) +
           (lookups_ ? lookups_->threads() : 0);
}

Status OrbiteTransport::allocateSubBatch(SubBatchRef& batch, size_t max_size) {
    if (!engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is not installed" LOC_MARK);
    batch = new OrbiteSubBatch(max_size, gate_);
    return Status::OK();
}

Status OrbiteTransport::freeSubBatch(SubBatchRef& batch) {
    auto* b = dynamic_cast<OrbiteSubBatch*>(batch);
    if (!b) return Status::InvalidArgument("not an OrbiTE sub-batch" LOC_MARK);
    {
        std::lock_guard<std::mutex> g(b->tasks->notifier->lock);
        b->tasks->notifier->notify = nullptr;
    }
    {
        // Tasks still waiting for the pool are dropped with it; submitted
        // ones are detached (OrbiTE never cancels them mid-copy).
        std::lock_guard<std::mutex> g(b->tasks->lock);
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
        if (addr < b.addr || r.length > b.length ||
            addr - b.addr > b.length - r.length)
            return nullptr;
        return &b;
    };
    const Buffer* a = within(src);
    const Buffer* b = within(dst);
    if (!a || !b || !a->host || !b->host) return false;
    void* to =
        r.opcode == Request::READ ? r.source : reinterpret_cast<void*>(dst);
    const void* from =
        r.opcode == Request::READ ? reinterpret_cast<void*>(dst) : r.source;
    std::memmove(to, from, r.length);
    return true;
}

Status OrbiteTransport::submitTransferTasks(
    SubBatchRef ref, const std::vector<Request>& requests) {
    if (!engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is not installed" LOC_MARK);
    auto* batch = dynamic_cast<OrbiteSubBatch*>(ref);
    if (!batch)
        return Status::InvalidArgument("not an OrbiTE sub-batch" LOC_MARK);
    std::shared_ptr<Tasks> tasks = batch->tasks;
    {
        std::lock_guard<std::mutex> g(tasks->notifier->lock);
        tasks->notifier->notify = batch->notify_progress;
        tasks->notifier->id = batch->progress_batch_id;
    }
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
                                           std::to_string(batch->max_size) +
                                           " tasks" LOC_MARK);
        // A task that must wait for the pool is not handed to OrbiTE later
        // than this (else it ends FAILED, never sent).
        Clock::time_point deadline = Clock::now() + connect_timeout_;
        for (const Request& r : requests) {
            size_t id = tasks->tasks.size();
            tasks->tasks.push_back(Task{r.length});
            tasks->tasks.back().deadline = deadline;
            if (r.target_id == LOCAL_SEGMENT_ID && copyLocally(r)) {
                tasks->tasks[id].fixed = COMPLETED;
                progressed = true;
                continue;
            }
            // Local device memory (or memory no local buffer holds: OrbiTE
            // says which) goes through the engine, to itself.
            auto w = std::find_if(
                per_target.begin(), per_target.end(),
                [&](const Work& w) { return w.target == r.target_id; });
            if (w == per_target.end()) {
                per_target.push_back(Work{r.target_id, {}, {}});
                w = per_target.end() - 1;
                w->ids.reserve(requests.size());
                w->reqs.reserve(requests.size());
            }
            w->ids.push_back(id);
            w->reqs.push_back(
                r.opcode == Request::READ
                    ? orbite::read_request(r.source, r.target_offset, r.length)
                    : orbite::write_request(r.source, r.target_offset,
                                            r.length));
        }
    }
    for (Work& w : per_target)
        dispatch(target(w.target), tasks, std::move(w.ids), std::move(w.reqs));
    if (progressed) tasks->progress();
    return Status::OK();
}

void OrbiteTransport::recordBatch(const std::shared_ptr<Tasks>& tasks,
                                  orbite::Batch batch,
                                  const std::vector<size_t>& ids,
                                  const std::shared_ptr<Target>& t,
                                  uint64_t gen) {
    // Its end wakes TENT's progress worker (hooked submissions fire then,
    // without the application polling). The hook holds only the notifier:
    // it may run on an OrbiTE thread, at once if the batch ended already.
    std::shared_ptr<OrbiteProgress> notifier = tasks->notifier;
    auto hooked = batch.try_on_end([notifier] { notifier->call(); });
    if (!hooked.ok())
        LOG(WARNING) << "orbite_transport: no progress hook on a batch: "
                     << hooked.error().describe();
    int index = static_cast<int>(tasks->batches.size());
    tasks->batches.push_back(std::move(batch));
    tasks->sent_to.emplace_back(t, gen);
    for (size_t k = 0; k < ids.size(); ++k) {
        Task& task = tasks->tasks[ids[k]];
        task.batch = index;
        task.index = k;
        // Cancelled while its submission was under way: cancelled in
        // OrbiTE now (unless it started, as any cancel).
        if (task.fixed == CANCELED)
            (void)tasks->batches.back().cancel_request(k);
    }
}

void OrbiteTransport::openRoutes(const std::shared_ptr<Target>& t,
                                 orbite::Peer& peer,
                                 const std::vector<orbite::Region>& regions,
                                 const std::vector<uint64_t>& reached,
                                 uint64_t gen) {
    std::set<uint64_t> unrouted;
    {
        std::lock_guard<std::mutex> g(t->lock);
        if (t->generation != gen) return;
        t->warm.insert(reached.begin(), reached.end());
        for (uint64_t id : reached)
            if (!t->routes.count(id)) unrouted.insert(id);
    }
    // A direct route to each region reached for the first time whose
    // memory an IPC transport maps: later tasks naming it skip the batch.
    std::map<uint64_t, std::shared_ptr<orbite::Direct>> opened;
    for (uint64_t id : unrouted) {
        auto g =
            std::find_if(regions.begin(), regions.end(),
                         [id](const orbite::Region& r) { return r.id == id; });
        std::shared_ptr<orbite::Direct>& route = opened[id];
        if (g == regions.end() || !mapsDirectly(g->kind)) continue;
        auto d = peer.try_direct(g->addr, g->length);
        if (d.ok())
            route = std::make_shared<orbite::Direct>(std::move(d).value());
    }
    std::lock_guard<std::mutex> g(t->lock);
    if (t->generation == gen) t->routes.insert(opened.begin(), opened.end());
}

bool OrbiteTransport::copyDirect(const std::shared_ptr<Target>& t, Tasks& tasks,
                                 std::vector<size_t>& ids,
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
            // a region not reached yet, through the pool, which submits it
            // and reports OrbiTE's outcome; the route is opened again once
            // a submission reaches the region. A peer that left is dropped:
            // the pool looks its segment up again.
            orbite::Status why = r.ok() ? r->status : r.status();
            std::lock_guard<std::mutex> g(t->lock);
            if (t->generation == gen) {
                t->routes.erase(region_ids[k]);
                t->warm.erase(region_ids[k]);
                if (peerGone(why)) t->dropLocked(gen);
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

void OrbiteTransport::dispatch(const std::shared_ptr<Target>& t,
                               const std::shared_ptr<Tasks>& tasks,
                               std::vector<size_t> ids,
                               std::vector<orbite::Request> reqs) {
    if (copyDirect(t, *tasks, ids, reqs)) tasks->progress();
    if (ids.empty()) return;
    std::unique_lock<std::mutex> g(t->lock);
    if (t->state == Target::Ready && t->warmFor(reqs)) {
        // Every request names a region reached before, which permits it:
        // submitted on this thread, nothing asked of the peer.
        std::shared_ptr<orbite::Peer> peer = t->peer;
        uint64_t gen = t->generation;
        g.unlock();
        auto submitted = peer->try_submit(reqs);
        if (submitted.ok() || !peerGone(submitted.status())) {
            {
                std::lock_guard<std::mutex> tg(tasks->lock);
                if (submitted.ok()) {
                    recordBatch(tasks, std::move(submitted).value(), ids, t,
                                gen);
                    return;
                }
                auto why = endedAs(submitted.status());
                for (size_t id : ids)
                    if (tasks->tasks[id].fixed == PENDING)
                        tasks->tasks[id].fixed = why;
            }
            LOG(WARNING) << "orbite_transport: segment " << t->id << ": "
                         << submitted.error().describe();
            tasks->progress();
            return;
        }
        // The peer left since the last use: the pool looks its segment up
        // again, connects to what serves it now and submits there.
        g.lock();
        t->dropLocked(gen);
    }
    t->waiting.push_back(Target::Waiting{tasks, ids, std::move(reqs)});
    // Failed at their deadline if still waiting then (whatever holds the
    // pool up): the timer's job holds nothing of the sub-batch alive.
    Clock::time_point deadline = Clock::now() + connect_timeout_;
    std::weak_ptr<Tasks> weak = tasks;
    timer_->at(deadline, [weak, ids] {
        std::shared_ptr<Tasks> tasks = weak.lock();
        if (!tasks) return;
        bool expired = false;
        {
            std::lock_guard<std::mutex> g(tasks->lock);
            Clock::time_point now = Clock::now();
            for (size_t id : ids) expired |= tasks->tasks[id].expire(now);
        }
        if (expired) tasks->progress();
    });
    if (t->state == Target::Busy) return;
    // Not connected: a pool job connects, then submits. Connected, but a
    // request names a region not reached yet (its import is opened with
    // the peer) or not known (the peer is asked for its regions): a pool
    // job submits, so that this call never waits for the peer.
    startJob(t, t->state == Target::Idle);
}

void OrbiteTransport::startJob(const std::shared_ptr<Target>& t,
                               bool reconnect) {
    t->state = Target::Busy;
    if (!jobs_->post([this, t, reconnect] { runJob(t, reconnect); })) {
        // Uninstalling: what waits ends at its deadline.
        t->state = Target::Idle;
        t->changed.notify_all();
    }
}

void OrbiteTransport::runJob(std::shared_ptr<Target> t, bool reconnect) {
    for (int round = 0;; ++round) {
        if (reconnect) connectTarget(t, Clock::now() + connect_timeout_);
        std::shared_ptr<orbite::Peer> peer;
        uint64_t gen;
        {
            std::lock_guard<std::mutex> g(t->lock);
            peer = t->peer;
            gen = t->generation;
        }
        if (drain(t, peer, gen) == Drained::Done) return;
        // The peer left before a submission was sent: look the segment up
        // again and submit to what serves it now, once; a peer that left
        // again at once fails what waits.
        reconnect = true;
        if (round == 0) continue;
        {
            std::lock_guard<std::mutex> g(t->lock);
            t->why = "the peer left again right after a reconnect";
            t->unsent = FAILED;
        }
        (void)drain(t, nullptr, gen);
        return;
    }
}

std::string OrbiteTransport::lookUp(const std::shared_ptr<Target>& t,
                                    Clock::time_point deadline,
                                    std::string& why, std::string& name,
                                    bool& late) {
    std::shared_ptr<Lookup> lookup;
    bool start = false;
    {
        std::lock_guard<std::mutex> g(t->lock);
        if (!t->lookup) {
            t->lookup = std::make_shared<Lookup>();
            start = true;
        }
        lookup = t->lookup;
    }
    if (start) {
        // On the lookup pool: TENT's metadata RPC waits TENT's RPC timeout
        // for a target that does not answer; this connect waits only until
        // its own deadline (a later connect waits for the same lookup).
        std::shared_ptr<ControlService> metadata = metadata_;
        SegmentID id = t->id;
        std::string local = local_name_, own = engine_->endpoint();
        std::weak_ptr<Target> weak = t;
        bool posted = lookups_->post(
            [lookup, metadata, id, local, own, weak] {
                std::string endpoint, why, name;
                // TENT's segment cache is per thread: this one's copy is
                // dropped, the segment read again.
                auto& segments = metadata->segmentManager();
                (void)segments.invalidateRemote(id);
                SegmentDescRef seg;
                Status s = segments.getRemoteCached(seg, id);
                if (!s.ok()) {
                    why = "segment " + std::to_string(id) + ": " +
                          std::string(s.message());
                } else if (seg->name == local) {
                    name = seg->name;
                    endpoint = own;
                } else if (seg->type != SegmentType::Memory) {
                    why = "segment " + seg->name + " is not a memory segment";
                } else {
                    name = seg->name;
                    Attrs attrs;
                    for (const BufferDesc& b : seg->getMemory().buffers) {
                        auto it = b.transport_attrs.find(ORBITE);
                        if (it != b.transport_attrs.end() &&
                            Attrs::decode(it->second, attrs))
                            break;
                    }
                    endpoint = attrs.endpoint;
                    if (endpoint.empty())
                        why = "segment " + seg->name + " has no OrbiTE buffer";
                }
                {
                    std::lock_guard<std::mutex> g(lookup->lock);
                    lookup->endpoint = endpoint;
                    lookup->why = why;
                    lookup->name = name;
                    lookup->done = true;
                }
                lookup->finished.notify_all();
                if (auto t = weak.lock()) {
                    std::lock_guard<std::mutex> g(t->lock);
                    if (t->lookup == lookup) t->lookup.reset();
                }
            },
            true);
        if (!posted) {
            std::lock_guard<std::mutex> g(t->lock);
            t->lookup.reset();
            why = "the transport is being uninstalled";
            return "";
        }
    }
    std::unique_lock<std::mutex> g(lookup->lock);
    if (!lookup->finished.wait_until(g, deadline,
                                     [&] { return lookup->done; })) {
        late = true;
        why = "segment " + std::to_string(t->id) +
              ": TENT's metadata service did not answer within "
              "transports/orbite/connect_timeout_ms (" +
              std::to_string(connect_timeout_.count()) + " ms)";
        return "";
    }
    why = lookup->why;
    name = lookup->name;
    return lookup->endpoint;
}

void OrbiteTransport::connectTarget(const std::shared_ptr<Target>& t,
                                    Clock::time_point deadline) {
    std::string why, name, endpoint;
    // Out of time (the lookup or the peer did not answer by `deadline`).
    bool late = false;
    if (t->id == LOCAL_SEGMENT_ID)
        endpoint = engine_->endpoint();
    else
        endpoint = lookUp(t, deadline, why, name, late);
    std::shared_ptr<orbite::Peer> peer;
    if (!endpoint.empty()) {
        auto p = engine_->try_connect(endpoint, left(deadline));
        if (p.ok()) {
            peer = std::make_shared<orbite::Peer>(std::move(p).value());
        } else {
            late = p.status() == orbite::Status::timed_out;
            why = "segment " + std::to_string(t->id) + " at " + endpoint +
                  ": " + p.error().describe();
        }
    }
    auto regions = std::make_shared<std::vector<orbite::Region>>();
    if (peer) {
        auto r = peer->try_regions();
        if (r.ok()) *regions = std::move(r).value();
    }
    bool refresh;
    {
        std::lock_guard<std::mutex> g(t->lock);
        ++t->generation;
        t->peer = peer;
        t->regions = regions;
        t->warm.clear();
        t->routes.clear();
        t->why = why;
        t->unsent = late ? TIMEOUT : FAILED;
        refresh = peer && t->dropped;
        if (peer) t->dropped = false;
    }
    if (peer) {
        ++connects_;
        // A target that left and came back may serve other buffers now:
        // every thread's cached copy of the segment is read again.
        if (refresh && !name.empty())
            (void)metadata_->segmentManager().invalidateAllCacheForRemote(name);
    } else {
        LOG(WARNING) << "orbite_transport: " << why;
    }
}

OrbiteTransport::Drained OrbiteTransport::drain(
    const std::shared_ptr<Target>& t, const std::shared_ptr<orbite::Peer>& peer,
    uint64_t gen) {
    // Submit (or fail) what waits, in order, before anything submitted
    // after it: the state stays Busy until none is left.
    for (;;) {
        Target::Waiting w;
        std::shared_ptr<const std::vector<orbite::Region>> regions;
        std::string why;
        TransferStatusEnum unsent;
        {
            std::lock_guard<std::mutex> g(t->lock);
            if (t->waiting.empty()) {
                t->state = peer ? Target::Ready : Target::Idle;
                t->changed.notify_all();
                return Drained::Done;
            }
            w = std::move(t->waiting.front());
            t->waiting.pop_front();
            regions = t->regions;
            why = t->why;
            unsent = t->unsent;
        }
        Tasks& tasks = *w.tasks;
        bool progressed = false;
        // Tasks cancelled, expired (or whose sub-batch was freed) while they
        // waited are not sent; without a peer none is.
        std::vector<size_t> ids;
        std::vector<orbite::Request> reqs;
        {
            std::lock_guard<std::mutex> g(tasks.lock);
            Clock::time_point now = Clock::now();
            for (size_t k = 0; k < w.ids.size(); ++k) {
                Task& task = tasks.tasks[w.ids[k]];
                if (task.expire(now)) progressed = true;
                if (task.fixed != PENDING) continue;
                if (!peer) {
                    task.fixed = unsent;
                    progressed = true;
                    continue;
                }
                ids.push_back(w.ids[k]);
                reqs.push_back(w.reqs[k]);
            }
        }
        if (!peer && progressed)
            LOG(WARNING) << "orbite_transport: segment " << t->id << ": tasks "
                         << (unsent == TIMEOUT ? "TIMEOUT" : "FAILED") << ": "
                         << why;
        if (ids.empty()) {
            if (progressed) tasks.progress();
            continue;
        }
        // `regions` is what the peer published when last asked: a region it
        // registered since is not in it, and one it registered again may
        // have other rights. The peer is asked again before a request is
        // refused or sent to an address no known region holds (the engine
        // would ask within the submission).
        bool stale = false;
        for (const orbite::Request& r : reqs) {
            const orbite::Region* g = regionOf(*regions, r);
            stale |= !g || !permits(*g, r);
        }
        if (stale) {
            auto now = peer->try_regions();
            if (now.ok()) {
                regions = std::make_shared<const std::vector<orbite::Region>>(
                    std::move(now).value());
                std::lock_guard<std::mutex> g(t->lock);
                if (t->generation == gen) t->regions = regions;
            }
        }
        // What is still PENDING (and in time) goes to OrbiTE now; requests
        // the peer's regions forbid never do.
        std::vector<size_t> sent;
        std::vector<orbite::Request> sent_reqs;
        std::vector<uint64_t> reached;
        {
            std::lock_guard<std::mutex> g(tasks.lock);
            Clock::time_point now = Clock::now();
            for (size_t k = 0; k < ids.size(); ++k) {
                Task& task = tasks.tasks[ids[k]];
                if (task.expire(now)) progressed = true;
                if (task.fixed != PENDING) continue;
                const orbite::Region* region = regionOf(*regions, reqs[k]);
                if (region && !permits(*region, reqs[k])) {
                    task.fixed = INVALID;
                    progressed = true;
                    continue;
                }
                if (region) reached.push_back(region->id);
                task.sending = true;
                sent.push_back(ids[k]);
                sent_reqs.push_back(reqs[k]);
            }
        }
        if (sent.empty()) {
            if (progressed) tasks.progress();
            continue;
        }
        // Without the sub-batch's lock: the peer may take its time to
        // answer while TENT polls (or cancels) these tasks.
        auto submitted = peer->try_submit(sent_reqs);
        if (!submitted.ok() && peerGone(submitted.status())) {
            // Nothing was sent: these go first once the target is reached
            // again (the caller reconnects).
            {
                std::lock_guard<std::mutex> g(tasks.lock);
                for (size_t id : sent) tasks.tasks[id].sending = false;
            }
            {
                std::lock_guard<std::mutex> g(t->lock);
                t->waiting.push_front(Target::Waiting{w.tasks, std::move(sent),
                                                      std::move(sent_reqs)});
                t->forgetLocked();
            }
            if (progressed) tasks.progress();
            return Drained::PeerLeft;
        }
        // Routes first, then the batch: once TENT sees these tasks end, a
        // task naming a region they reached goes direct (a round trip per
        // region mapped for the first time; the tasks stay PENDING, in
        // their submission, meanwhile).
        if (submitted.ok() && !reached.empty())
            openRoutes(t, *peer, *regions, reached, gen);
        {
            std::lock_guard<std::mutex> g(tasks.lock);
            for (size_t id : sent) tasks.tasks[id].sending = false;
            if (submitted.ok()) {
                recordBatch(w.tasks, std::move(submitted).value(), sent, t,
                            gen);
            } else {
                // Refused before anything was sent (unregistered local
                // memory, an address no region holds, a region not
                // writable): INVALID; out of time: TIMEOUT; anything else
                // FAILED.
                auto status = endedAs(submitted.status());
                for (size_t id : sent)
                    if (tasks.tasks[id].fixed == PENDING)
                        tasks.tasks[id].fixed = status;
            }
        }
        if (!submitted.ok())
            LOG(WARNING) << "orbite_transport: segment " << t->id << ": "
                         << submitted.error().describe();
        tasks.progress();
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
    if (!batch)
        return Status::InvalidArgument("not an OrbiTE sub-batch" LOC_MARK);
    out.tasks = batch->tasks.get();
    out.guard = std::unique_lock<std::mutex>(out.tasks->lock);
    if (id < 0 || static_cast<size_t>(id) >= out.tasks->tasks.size())
        return Status::InvalidArgument("no task " + std::to_string(id) +
                                       " in this sub-batch" LOC_MARK);
    out.task = &out.tasks->tasks[id];
    return Status::OK();
}

}  // namespace

Status OrbiteTransport::getTransferStatus(SubBatchRef ref, int task_id,
                                          TransferStatus& status) {
    LockedTask locked;
    CHECK_STATUS(lockTask(ref, task_id, locked));
    Tasks& tasks = *locked.tasks;
    Task& t = *locked.task;
    // Still waiting for the pool past its deadline: FAILED now, whatever
    // holds the pool up (the timer says so too, to TENT's progress hook).
    if (t.fixed == PENDING && t.batch < 0) (void)t.expire(Clock::now());
    status = TransferStatus{t.fixed, t.fixed == COMPLETED ? t.length : 0};
    if (t.batch < 0) return Status::OK();
    auto r = tasks.batches[t.batch].try_result(t.index);
    if (!r.ok()) return failed(r.error());
    switch (r->status) {
        case orbite::Status::pending:
            status.s = PENDING;
            break;
        case orbite::Status::ok:
            status.s = COMPLETED;
            status.transferred_bytes = t.length;
            break;
        case orbite::Status::cancelled:
            status.s = CANCELED;
            break;
        case orbite::Status::timed_out:
            status.s = TIMEOUT;
            break;
        default:
            // Refused for what it asked (a READ-only region written, an
            // address outside the region), nothing moved: INVALID, as at
            // submit.
            status.s = refusedAsInvalid(r->status) &&
                               r->remote_effect == orbite::RemoteEffect::none
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
        // Still waiting for the pool (or in a submission under way, which
        // cancels it in OrbiTE when it records the batch).
        if (t.fixed == PENDING) t.fixed = CANCELED;
        return Status::OK();
    }
    // This task only; one that started runs to its outcome.
    auto r = tasks.batches[t.batch].cancel_request(t.index);
    return r.ok() ? Status::OK() : failed(r.error());
}

Status OrbiteTransport::allocateLocalMemory(void** addr, size_t size,
                                            MemoryOptions& options) {
    if (!engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is not installed" LOC_MARK);
    int device = cudaDevice(options.location);
    orbite::TransportSet t = engine_->transports();
    // GPU memory a peer can import: CUDA IPC memory where NVLink runs, MNNVL
    // memory otherwise; host memory a peer on this host can map (SHM).
    auto a = device < 0 ? orbite::Allocation::try_shared_host(size)
             : t.contains(orbite::Transport::nvlink) ||
                     !t.contains(orbite::Transport::mnnvl)
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
        return Status::InvalidArgument(
            "not memory this transport allocated" LOC_MARK);
    auto r = it->second.free();
    if (!r.ok()) return failed(r.error());  // still registered or exported
    allocations_.erase(it);
    return Status::OK();
}

Status OrbiteTransport::addMemoryBuffer(BufferDesc& desc,
                                        const MemoryOptions& options) {
    if (!engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is not installed" LOC_MARK);
    auto buffer = std::make_unique<Buffer>();
    void* addr = reinterpret_cast<void*>(static_cast<uintptr_t>(desc.addr));
    std::lock_guard<std::mutex> g(buffers_lock_);
    retireLocked();
    if (buffers_.count(desc.addr)) return Status::OK();  // registered already
    const std::string& location =
        desc.location.empty() || desc.location == kWildcardLocation
            ? options.location
            : desc.location;
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
    orbite::Access access =
        options.perm == kGlobalReadWrite  ? orbite::Access::read_write
        : options.perm == kGlobalReadOnly ? orbite::Access::read
                                          : orbite::Access::none;
    auto reg = engine_->try_register_memory(addr, desc.length, access);
    if (!reg.ok())
        return reg.status() == orbite::Status::invalid_argument
                   ? Status::AddressNotRegistered(reg.error().describe() +
                                                  LOC_MARK)
                   : failed(reg.error());
    buffer->registration = std::move(reg).value();
    buffer->addr = desc.addr;
    buffer->length = desc.length;
    buffer->host = device < 0;
    desc.transports.push_back(ORBITE);
    desc.transport_attrs[ORBITE] =
        Attrs{engine_->endpoint(), buffer->registration.id()}.encode();
    buffers_.emplace(desc.addr, std::move(buffer));
    return Status::OK();
}

void OrbiteTransport::retireLocked() {
    for (auto it = retiring_.begin(); it != retiring_.end();) {
        Buffer& b = **it;
        if (b.registration.unregister(std::chrono::milliseconds(1)).ok() &&
            (!b.adopted || b.adopted->free().ok())) {
            LOG(INFO) << "orbite_transport: buffer 0x" << std::hex << b.addr
                      << std::dec << " (" << b.length
                      << " bytes) unregistered at last";
            it = retiring_.erase(it);
        } else {
            ++it;
        }
    }
}

Status OrbiteTransport::removeMemoryBuffer(BufferDesc& desc) {
    std::lock_guard<std::mutex> g(buffers_lock_);
    retireLocked();
    auto it = buffers_.find(desc.addr);
    if (it == buffers_.end()) return Status::OK();
    std::unique_ptr<Buffer> b = std::move(it->second);
    buffers_.erase(it);
    // TENT forgets the buffer whatever this returns, on its own thread and
    // without a deadline: copies that still use it are waited for at most
    // unregister_timeout_ms; then it stays registered (never published or
    // used for local copies again) until they end, retried later.
    auto r = b->registration.unregister(unregister_timeout_);
    if (r.ok() && (!b->adopted || b->adopted->free().ok())) return Status::OK();
    std::string why =
        r.ok() ? "freeing the adopted allocation failed" : r.error().describe();
    LOG(WARNING) << "orbite_transport: buffer 0x" << std::hex << b->addr
                 << std::dec << " (" << b->length
                 << " bytes) stays registered with OrbiTE after "
                 << unregister_timeout_.count() << " ms: " << why
                 << "; retried at every registration change and at uninstall";
    retiring_.push_back(std::move(b));
    return Status::InternalError("unregister deferred: " + why + LOC_MARK);
}

Status OrbiteTransport::sendNotification(SegmentID target_id,
                                         const Notification& notify) {
    if (!engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is not installed" LOC_MARK);
    std::shared_ptr<Target> t = target(target_id);
    std::shared_ptr<orbite::Peer> peer;
    uint64_t gen;
    {
        // After every transfer submitted before it: wait for a connect in
        // progress (or start one) and for its queue to drain.
        std::unique_lock<std::mutex> g(t->lock);
        if (t->state == Target::Idle) startJob(t, true);
        auto until = Clock::now() + connect_timeout_ + std::chrono::seconds(5);
        t->changed.wait_until(g, until,
                              [&] { return t->state != Target::Busy; });
        if (t->state != Target::Ready)
            return Status::InternalError("segment " +
                                         std::to_string(target_id) +
                                         " unreachable: " + t->why + LOC_MARK);
        peer = t->peer;
        gen = t->generation;
    }
    // TENT's name travels in the message (the engine's own name is the
    // segment's only when that is a valid engine name).
    orbite::Result<void> r = peer->try_notify(frame(notify));
    if (!r.ok()) {
        if (peerGone(r.status())) {
            std::lock_guard<std::mutex> g(t->lock);
            t->dropLocked(gen);
        }
        return failed(r.error());
    }
    return Status::OK();
}

Status OrbiteTransport::receiveNotification(
    std::vector<Notification>& notify_list) {
    if (!engine_)
        return Status::InvalidArgument(
            "OrbiTE transport is not installed" LOC_MARK);
    for (;;) {
        auto n = engine_->try_take_notification(std::chrono::milliseconds(0));
        if (!n.ok()) {
            if (n.status() == orbite::Status::timed_out) return Status::OK();
            return failed(n.error());
        }
        notify_list.push_back(
            unframe(std::move(n.value().sender), std::move(n.value().msg)));
    }
}

}  // namespace tent
}  // namespace mooncake
