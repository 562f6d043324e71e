// OrbiteTransport: see orbite_transport.h.
#include "orbite_transport.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace orbite_tent {

using tent::Status;

std::string BufferAttrs::encode() const {
  return "endpoint=" + endpoint + " region=" + std::to_string(region);
}

bool BufferAttrs::decode(const std::string &text, BufferAttrs &out) {
  std::istringstream in(text);
  std::string word;
  BufferAttrs a;
  while (in >> word) {
    if (word.rfind("endpoint=", 0) == 0) a.endpoint = word.substr(9);
    if (word.rfind("region=", 0) == 0) a.region = std::strtoull(word.c_str() + 7, nullptr, 10);
  }
  if (a.endpoint.empty() || a.region == 0) return false;
  out = a;
  return true;
}

/// A registered buffer: its registration, and the adoption record when the
/// memory is CUDA memory the stack allocated.
struct OrbiteTransport::Buffer {
  // Declared first, destroyed last: the record outlives the registration.
  std::optional<orbite::Allocation> adopted;
  orbite::Registration registration;
};

/// One task: where its outcome lives (an OrbiteTE batch and the request's
/// index in it), or why it never got there.
struct Task {
  std::size_t length = 0;
  int batch = -1;             ///< index into SubBatch::batches; -1: refused at submit
  std::size_t index = 0;
  tent::TransferStatusEnum refused = tent::TransferStatusEnum::FAILED;
};

struct OrbiteTransport::SubBatch final : tent::Transport::SubBatch {
  explicit SubBatch(std::size_t max) : max_size(max) { tasks.reserve(max); }
  std::size_t size() const override {
    std::lock_guard<std::mutex> g(lock);
    return tasks.size();
  }
  const std::size_t max_size;
  mutable std::mutex lock;
  std::vector<Task> tasks;
  std::vector<orbite::Batch> batches;
};

OrbiteTransport::OrbiteTransport() = default;

OrbiteTransport::~OrbiteTransport() { (void)uninstall(); }

static Status failed(const orbite::Failure &f) { return Status::InternalError(f.describe()); }

/// The engine's config with "name" set to the segment's name (how peers'
/// notifications name this one), unless the config names it already or
/// the segment's name is not a valid engine name (1-64 of A-Z a-z 0-9 . _ -).
static std::string named(const std::string &config_json, const std::string &segment) {
  bool valid = !segment.empty() && segment.size() <= 64 &&
               segment.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
                   std::string::npos;
  std::size_t open = config_json.find('{');
  if (!valid || config_json.find("\"name\"") != std::string::npos) return config_json;
  if (open == std::string::npos) return "{\"name\": \"" + segment + "\"}";
  std::size_t next = config_json.find_first_not_of(" \t\r\n", open + 1);
  bool empty = next != std::string::npos && config_json[next] == '}';
  return config_json.substr(0, open + 1) + "\"name\": \"" + segment + "\"" + (empty ? "" : ", ") +
         config_json.substr(open + 1);
}

Status OrbiteTransport::install(std::string &local_segment_name, std::shared_ptr<tent::ControlService> metadata,
                                const std::string &config_json) {
  auto e = orbite::Engine::try_create(named(config_json, local_segment_name));
  if (!e.ok()) return Status::InvalidArgument(e.error().describe());
  engine_.emplace(std::move(e).value());
  metadata_ = std::move(metadata);
  local_name_ = local_segment_name;
  // What this engine can move: host memory over SHM or TCP, GPU memory (and
  // pinned host memory to or from it) over NVLink or MNNVL.
  orbite::TransportSet t = engine_->try_transports().ok() ? engine_->transports() : orbite::TransportSet();
  caps = tent::Capabilities{};
  caps.dram_to_dram = t.contains(orbite::Transport::tcp) || t.contains(orbite::Transport::shm);
  bool gpu = t.contains(orbite::Transport::nvlink) || t.contains(orbite::Transport::mnnvl);
  caps.gpu_to_gpu = caps.dram_to_gpu = caps.gpu_to_dram = gpu;
  return Status::OK();
}

Status OrbiteTransport::uninstall() {
  if (!engine_) return Status::OK();
  {
    std::unique_lock<std::shared_mutex> g(peers_lock_);
    peers_.clear();
  }
  std::lock_guard<std::mutex> g(buffers_lock_);
  buffers_.clear();
  auto closed = engine_->close();
  allocations_.clear();
  engine_.reset();
  if (!closed.ok()) return failed(closed.error());
  return Status::OK();
}

Status OrbiteTransport::allocateSubBatch(SubBatchRef &batch, std::size_t max_size) {
  batch = new SubBatch(max_size);
  return Status::OK();
}

Status OrbiteTransport::freeSubBatch(SubBatchRef &batch) {
  delete static_cast<SubBatch *>(batch);
  batch = nullptr;
  return Status::OK();
}

orbite::Result<std::shared_ptr<orbite::Peer>> OrbiteTransport::peer_for(tent::SegmentID target, bool refresh) {
  if (!refresh) {
    std::shared_lock<std::shared_mutex> g(peers_lock_);
    auto it = peers_.find(target);
    if (it != peers_.end()) return it->second;
  }
  std::shared_ptr<const tent::SegmentDesc> seg;
  Status s = metadata_->getSegment(target, refresh, seg);
  if (!s.ok()) return orbite::Failure{orbite::Status::not_found, "getSegment", s.message()};
  BufferAttrs attrs;
  for (const tent::BufferDesc &b : seg->buffers) {
    auto it = b.transport_attrs.find(tent::TransportType::ORBITE);
    if (it != b.transport_attrs.end() && BufferAttrs::decode(it->second, attrs)) break;
  }
  if (attrs.endpoint.empty())
    return orbite::Failure{orbite::Status::not_found, "getSegment", "segment " + seg->name + " has no OrbiteTE buffer"};
  auto p = engine_->try_connect(attrs.endpoint);
  if (!p.ok()) return p.error();
  auto peer = std::make_shared<orbite::Peer>(std::move(p).value());
  std::unique_lock<std::shared_mutex> g(peers_lock_);
  auto [it, fresh] = peers_.try_emplace(target, peer);
  if (!fresh) {
    if (refresh) {
      it->second = peer;
    } else {
      (void)peer->disconnect();  // another thread connected first
      return it->second;
    }
  }
  return peer;
}

Status OrbiteTransport::sendNotification(tent::SegmentID target_id, const tent::Notification &notify) {
  if (!engine_) return Status::InvalidArgument("not installed");
  auto peer = peer_for(target_id, false);
  if (!peer.ok()) return failed(peer.error());
  // The sender's name is the engine's ("name" in the config); TENT's name
  // field travels in the message only if the caller put it there.
  orbite::Result<void> r = peer.value()->try_notify(notify.msg);
  if (!r.ok()) return failed(r.error());
  return Status::OK();
}

Status OrbiteTransport::receiveNotification(std::vector<tent::Notification> &notify_list) {
  if (!engine_) return Status::InvalidArgument("not installed");
  for (;;) {
    auto n = engine_->try_take_notification(std::chrono::milliseconds(0));
    if (!n.ok()) {
      if (n.status() == orbite::Status::timed_out) return Status::OK();
      return failed(n.error());
    }
    notify_list.push_back(tent::Notification{std::move(n.value().sender), std::move(n.value().msg)});
  }
}

void OrbiteTransport::forget_peer(tent::SegmentID target) {
  std::unique_lock<std::shared_mutex> g(peers_lock_);
  peers_.erase(target);
}

Status OrbiteTransport::submitTransferTasks(SubBatchRef ref, const std::vector<tent::Request> &requests) {
  auto *batch = static_cast<SubBatch *>(ref);
  std::lock_guard<std::mutex> g(batch->lock);
  if (batch->tasks.size() + requests.size() > batch->max_size)
    return Status::TooManyRequests("the sub-batch holds at most " + std::to_string(batch->max_size) + " tasks");
  // Group per target, in input order; task ids stay positional.
  std::map<tent::SegmentID, std::vector<std::size_t>> per_target;
  const std::size_t first = batch->tasks.size();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    per_target[requests[i].target_id].push_back(first + i);
    batch->tasks.push_back(Task{requests[i].length});
  }
  for (auto &[target, ids] : per_target) {
    std::vector<orbite::Request> reqs;
    reqs.reserve(ids.size());
    for (std::size_t id : ids) {
      const tent::Request &r = requests[id - first];
      reqs.push_back(r.opcode == tent::Request::READ ? orbite::read_request(r.source, r.target_offset, r.length)
                                                     : orbite::write_request(r.source, r.target_offset, r.length));
    }
    // A peer that left (or restarted) is looked up again once.
    orbite::Result<orbite::Batch> submitted = orbite::Failure{orbite::Status::unavailable, "", ""};
    bool reached = false;
    for (bool refresh : {false, true}) {
      auto peer = peer_for(target, refresh);
      if (!peer.ok()) {
        submitted = peer.error();
        continue;
      }
      reached = true;
      submitted = (*peer)->try_submit(reqs);
      bool gone = submitted.status() == orbite::Status::unavailable || submitted.status() == orbite::Status::stale_peer;
      if (!gone) break;
      forget_peer(target);
    }
    if (!submitted.ok()) {
      // An unreachable target fails these tasks; requests OrbiteTE refuses
      // before sending anything (unregistered local memory, a bad length,
      // an address no region holds) are INVALID. The other targets go on.
      std::fprintf(stderr, "orbite_transport: segment %llu: %s\n", static_cast<unsigned long long>(target),
                   submitted.error().describe().c_str());
      orbite::Status why = submitted.status();
      bool invalid = reached && (why == orbite::Status::invalid_argument || why == orbite::Status::not_found ||
                                 why == orbite::Status::out_of_range || why == orbite::Status::permission_denied);
      auto refused = invalid ? tent::TransferStatusEnum::INVALID : tent::TransferStatusEnum::FAILED;
      for (std::size_t id : ids) batch->tasks[id].refused = refused;
      continue;
    }
    int index = static_cast<int>(batch->batches.size());
    batch->batches.push_back(std::move(submitted).value());
    for (std::size_t k = 0; k < ids.size(); ++k) {
      batch->tasks[ids[k]].batch = index;
      batch->tasks[ids[k]].index = k;
    }
  }
  return Status::OK();
}

Status OrbiteTransport::getTransferStatus(SubBatchRef ref, int task_id, tent::TransferStatus &status) {
  auto *batch = static_cast<SubBatch *>(ref);
  std::lock_guard<std::mutex> g(batch->lock);
  if (task_id < 0 || static_cast<std::size_t>(task_id) >= batch->tasks.size())
    return Status::InvalidArgument("no task " + std::to_string(task_id) + " in this sub-batch");
  const Task &t = batch->tasks[task_id];
  status = tent::TransferStatus{};
  if (t.batch < 0) {
    status.s = t.refused;
    return Status::OK();
  }
  auto r = batch->batches[t.batch].try_result(t.index);
  if (!r.ok()) return failed(r.error());
  switch (r->status) {
    case orbite::Status::pending: status.s = tent::TransferStatusEnum::PENDING; break;
    case orbite::Status::ok:
      status.s = tent::TransferStatusEnum::COMPLETED;
      status.transferred_bytes = t.length;
      break;
    case orbite::Status::cancelled: status.s = tent::TransferStatusEnum::CANCELED; break;
    case orbite::Status::timed_out: status.s = tent::TransferStatusEnum::TIMEOUT; break;
    default: status.s = tent::TransferStatusEnum::FAILED; break;
  }
  return Status::OK();
}

Status OrbiteTransport::cancelTransferTask(SubBatchRef ref, int task_id) {
  auto *batch = static_cast<SubBatch *>(ref);
  std::lock_guard<std::mutex> g(batch->lock);
  if (task_id < 0 || static_cast<std::size_t>(task_id) >= batch->tasks.size())
    return Status::InvalidArgument("no task " + std::to_string(task_id) + " in this sub-batch");
  const Task &t = batch->tasks[task_id];
  if (t.batch < 0) return Status::OK();
  // OrbiteTE cancels per batch: every request of this task's batch (one
  // target's share of one submission) that has not started ends CANCELED.
  auto r = batch->batches[t.batch].cancel();
  return r.ok() ? Status::OK() : failed(r.error());
}

/// "cuda:N" -> N, or -1.
static int cuda_device(const std::string &location) {
  if (location.rfind("cuda:", 0) != 0) return -1;
  return std::atoi(location.c_str() + 5);
}

Status OrbiteTransport::allocateLocalMemory(void **addr, std::size_t size, tent::MemoryOptions &options) {
  if (!engine_) return Status::InvalidArgument("install first");
  int device = cuda_device(options.location);
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

Status OrbiteTransport::freeLocalMemory(void *addr, std::size_t) {
  std::lock_guard<std::mutex> g(buffers_lock_);
  auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(addr));
  if (it == allocations_.end()) return Status::InvalidArgument("not memory this transport allocated");
  auto r = it->second.free();
  if (!r.ok()) return failed(r.error());  // still registered or exported: kept
  allocations_.erase(it);
  return Status::OK();
}

Status OrbiteTransport::addMemoryBuffer(tent::BufferDesc &desc, const tent::MemoryOptions &options) {
  if (!engine_) return Status::InvalidArgument("install first");
  auto buffer = std::make_unique<Buffer>();
  void *addr = reinterpret_cast<void *>(static_cast<std::uintptr_t>(desc.addr));
  std::lock_guard<std::mutex> g(buffers_lock_);
  if (buffers_.count(desc.addr)) return Status::OK();  // registered already
  int device = cuda_device(desc.location.empty() ? options.location : desc.location);
  if (device >= 0 && !allocations_.count(desc.addr)) {
    // GPU memory the stack allocated (a caching allocator's segment): the
    // stack consents to peers reaching its whole allocation by handing it
    // to this transport.
    auto a = orbite::Allocation::try_cuda_adopt(addr, desc.length);
    if (!a.ok()) return failed(a.error());
    buffer->adopted.emplace(std::move(a).value());
  }
  auto reg = engine_->try_register_memory(addr, desc.length, orbite::Access::read_write);
  if (!reg.ok()) return reg.status() == orbite::Status::invalid_argument
                            ? Status::AddressNotRegistered(reg.error().describe())
                            : failed(reg.error());
  buffer->registration = std::move(reg).value();
  desc.transports.push_back(tent::TransportType::ORBITE);
  desc.transport_attrs[tent::TransportType::ORBITE] =
      BufferAttrs{engine_->endpoint(), buffer->registration.id()}.encode();
  buffers_.emplace(desc.addr, std::move(buffer));
  return Status::OK();
}

Status OrbiteTransport::removeMemoryBuffer(tent::BufferDesc &desc) {
  std::lock_guard<std::mutex> g(buffers_lock_);
  auto it = buffers_.find(desc.addr);
  if (it == buffers_.end()) return Status::OK();
  auto r = it->second->registration.unregister();
  if (!r.ok()) return failed(r.error());  // copies still use it: stays registered
  if (it->second->adopted) {
    auto f = it->second->adopted->free();
    if (!f.ok()) return failed(f.error());
  }
  buffers_.erase(it);
  return Status::OK();
}

}  // namespace orbite_tent
