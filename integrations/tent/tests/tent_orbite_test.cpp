// tent_orbite_test: the OrbiTE transport for TENT (OrbiteTransport), driven
// as TENT's engine drives a transport, between two processes on loopback.
//
//   tent_orbite_test --transport tcp|shm|nvlink|mnnvl --case CASE [--device D] [--size BYTES]
//
// The initiator (this process) starts the target (the same program with
// --role target); they share a segment directory (the shim's metadata
// service). The target allocates buffers A and B through
// allocateLocalMemory (on cuda:D for nvlink/mnnvl), allocates a third, C,
// itself as a stack's caching allocator would (adopted when handed over), a
// fourth, D, registered kGlobalReadOnly, and publishes its segment. Cases:
//   transfer     four threads READ and WRITE every buffer in slices; a task
//                for an unknown segment FAILS, one from unregistered memory
//                is INVALID; a notification arrives after the WRITEs landed;
//                the copies ran on the transport asked for (and device D).
//   local        LOCAL_SEGMENT_ID READ and WRITE between local buffers end
//                COMPLETED on return, with their bytes; unregistered local
//                memory is INVALID.
//   readonly     a WRITE into D is INVALID and D keeps its bytes; a READ of
//                D completes.
//   cancel       one task of 64 is cancelled; the other 63 complete with
//                their bytes.
//   unreachable  a segment whose endpoint never answers: submit returns at
//                once with the task PENDING; it ends TIMEOUT (final in
//                TENT: no failover) at the connect deadline.
//   killed       the target is killed after a first READ; later tasks end
//                FAILED, and nothing hangs.
//   frozen       once connected (A read), the target registers a fifth
//                buffer, E, and is stopped (SIGSTOP): READs of B (not
//                reached yet) and of E (a region the initiator has not
//                seen) return at once with their tasks PENDING; once the
//                target runs again they complete with their bytes.
//   restart      with the adapter's defaults (over SHM: no engine config at
//                all), the target is killed and a new one started on the
//                same segment, three times: the first READ of the new
//                target's A, submitted once it serves, completes with the
//                new target's bytes, and the initiator's own cached copy of
//                the segment names the new buffers.
//   deadline     once connected, the target registers E and is stopped: a
//                READ of E and a READ of A behind it end TIMEOUT at the
//                connect deadline (1.5 s, the engine's own timeout 60 s),
//                and TENT's progress hook says so without any poll.
//   progress     once connected, WRITEs over TCP with TENT's progress hook
//                set and no poll: the hook fires when each batch ends, and
//                the task is COMPLETED then.
//   unregister   (SHM) the target READs the initiator's second buffer, so
//                its engine holds an idle import of it, and is stopped:
//                removeMemoryBuffer returns within unregister_timeout_ms
//                (1 s), saying the unregister was deferred; once the
//                target runs again the buffer is unregistered at a later
//                registration change and its memory can be freed.
//   lookup       no target: the segment's record is a FIFO nobody writes,
//                so TENT's metadata lookup never returns (as TENT's RPC
//                waits for a stopped target): two READs end TIMEOUT at the
//                connect deadline (1.5 s), and uninstall finds no pool job
//                stuck (only the lookup, left to end on its own).
// Exit 0 when everything held, 1 otherwise.
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "tent/transport/orbite/orbite_transport.h"

namespace {

using namespace mooncake::tent;

struct Options {
  std::string transport = "tcp";
  std::string test = "transfer";
  std::string role = "initiator";
  std::string store;
  int device = 0;
  std::size_t size = 4u << 20;
  /// Which incarnation of the target this is (A holds pattern 1 + 16 * epoch).
  int epoch = 0;
};

int fail(const std::string &why) {
  std::fprintf(stderr, "tent_orbite_test: %s\n", why.c_str());
  return 1;
}

std::uint8_t pattern(unsigned seed, std::size_t i) { return static_cast<std::uint8_t>(i * 31u + seed * 7u + (i >> 12)); }

/// The driver, loaded at run time, for filling and checking device memory
/// (and for the stack's own allocation): no CUDA toolkit needed to build.
struct Cuda {
  using init_t = int (*)(unsigned);
  using get_t = int (*)(int *, int);
  using retain_t = int (*)(void **, int);
  using set_t = int (*)(void *);
  using memcpy_t = int (*)(unsigned long long, unsigned long long, std::size_t);
  using sync_t = int (*)();
  using alloc_t = int (*)(unsigned long long *, std::size_t);
  using free_t = int (*)(unsigned long long);
  memcpy_t copy = nullptr;
  sync_t sync = nullptr;
  alloc_t alloc = nullptr;
  free_t release = nullptr;
  void *lib = nullptr;

  // CUDA VMM, as a stack's own cuMemCreate pool uses it (the driver's
  // struct layouts: allocation properties, access descriptors).
  struct Location { int type, id; };
  struct Prop { int type, handle_types; Location location; void *win32; unsigned char flags[8]; };
  struct Access { Location location; int flags; };
  template <class F>
  F sym(const char *name) const { return reinterpret_cast<F>(dlsym(lib, name)); }

  /// `size` bytes of VMM device memory on `device`, exportable as POSIX fds,
  /// mapped and accessible to that device; 0 on failure.
  unsigned long long vmm_alloc(int device, std::size_t size) const {
    Prop prop{1 /* pinned */, 1 /* POSIX fd */, {1 /* device */, device}, nullptr, {}};
    unsigned long long handle = 0, va = 0;
    auto create = sym<int (*)(unsigned long long *, std::size_t, const Prop *, unsigned long long)>("cuMemCreate");
    auto reserve = sym<int (*)(unsigned long long *, std::size_t, std::size_t, unsigned long long, unsigned long long)>(
        "cuMemAddressReserve");
    auto map = sym<int (*)(unsigned long long, std::size_t, std::size_t, unsigned long long, unsigned long long)>("cuMemMap");
    auto access = sym<int (*)(unsigned long long, std::size_t, const Access *, std::size_t)>("cuMemSetAccess");
    auto release_handle = sym<int (*)(unsigned long long)>("cuMemRelease");
    Access a{{1, device}, 3 /* read-write */};
    if (!create || !reserve || !map || !access || !release_handle || create(&handle, size, &prop, 0) ||
        reserve(&va, size, 0, 0, 0) || map(va, size, 0, handle, 0) || access(va, size, &a, 1))
      return 0;
    release_handle(handle);  // the mapping keeps the allocation
    return va;
  }
  bool vmm_free(unsigned long long va, std::size_t size) const {
    auto unmap = sym<int (*)(unsigned long long, std::size_t)>("cuMemUnmap");
    auto free_range = sym<int (*)(unsigned long long, std::size_t)>("cuMemAddressFree");
    return unmap && free_range && unmap(va, size) == 0 && free_range(va, size) == 0;
  }

  /// Binds device `device`'s primary context on this thread.
  bool open(int device) {
    void *h = lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return false;
    auto init = reinterpret_cast<init_t>(dlsym(h, "cuInit"));
    auto get = reinterpret_cast<get_t>(dlsym(h, "cuDeviceGet"));
    auto retain = reinterpret_cast<retain_t>(dlsym(h, "cuDevicePrimaryCtxRetain"));
    auto set = reinterpret_cast<set_t>(dlsym(h, "cuCtxSetCurrent"));
    copy = reinterpret_cast<memcpy_t>(dlsym(h, "cuMemcpy"));
    sync = reinterpret_cast<sync_t>(dlsym(h, "cuCtxSynchronize"));
    alloc = reinterpret_cast<alloc_t>(dlsym(h, "cuMemAlloc_v2"));
    release = reinterpret_cast<free_t>(dlsym(h, "cuMemFree_v2"));
    void *ctx = nullptr;
    int dev = 0;
    return init && get && retain && set && copy && sync && alloc && release && init(0) == 0 &&
           get(&dev, device) == 0 && retain(&ctx, dev) == 0 && set(ctx) == 0;
  }
};

/// Local bytes at `p` (device memory through the driver when `gpu`).
struct Memory {
  Cuda *cuda = nullptr;  // null: host memory
  void put(void *p, const std::vector<std::uint8_t> &v) const {
    if (!cuda) {
      std::memcpy(p, v.data(), v.size());
    } else if (cuda->copy(reinterpret_cast<std::uintptr_t>(p), reinterpret_cast<std::uintptr_t>(v.data()), v.size()) ||
               cuda->sync()) {
      std::fprintf(stderr, "tent_orbite_test: cuMemcpy failed\n");
      std::exit(1);
    }
  }
  std::vector<std::uint8_t> get(const void *p, std::size_t n) const {
    std::vector<std::uint8_t> v(n);
    if (!cuda) {
      std::memcpy(v.data(), p, n);
    } else if (cuda->copy(reinterpret_cast<std::uintptr_t>(v.data()), reinterpret_cast<std::uintptr_t>(p), n) ||
               cuda->sync()) {
      std::fprintf(stderr, "tent_orbite_test: cuMemcpy failed\n");
      std::exit(1);
    }
    return v;
  }
};

std::vector<std::uint8_t> pattern_bytes(unsigned seed, std::size_t n, std::size_t from = 0) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern(seed, from + i);
  return v;
}

std::string engine_config(const Options &o) {
  // The adapter's defaults: nothing under transports/orbite/engine.
  if (o.test == "restart" && o.transport == "shm") return "{}";
  // The engine's own deadline far beyond the adapter's connect deadline.
  if (o.test == "deadline") return R"({"transport_policy": ["tcp"], "default_timeout_ms": 60000})";
  if (o.transport == "nvlink") return R"({"nvlink": true, "nvlink_cache_entries": 8})";
  if (o.transport == "mnnvl") return R"({"mnnvl": {"handle_type": "posix_fd"}, "nvlink_cache_entries": 8})";
  // SHM carries what both sides allocated shareable; the adopted host
  // buffer C is the stack's plain memory, which only TCP reaches.
  if (o.transport == "shm") return R"({"transport_policy": ["shm", "tcp"]})";
  return R"({"transport_policy": ["tcp"]})";
}

bool gpu(const Options &o) { return o.transport == "nvlink" || o.transport == "mnnvl"; }

std::string location(const Options &o) { return gpu(o) ? "cuda:" + std::to_string(o.device) : "cpu:0"; }

/// TENT's config for the transport: the engine's under transports/orbite.
std::shared_ptr<Config> tent_config(const Options &o, int connect_timeout_ms = 5000, const std::string &extra = "") {
  auto c = std::make_shared<Config>();
  std::string text = R"({"transports": {"orbite": {"enable": true, "connect_timeout_ms": )" +
                     std::to_string(connect_timeout_ms) + extra + R"(, "engine": )" + engine_config(o) + "}}}";
  if (!c->load(text).ok()) {
    std::fprintf(stderr, "tent_orbite_test: bad config %s\n", text.c_str());
    std::exit(1);
  }
  return c;
}

std::string line_from(FILE *f) {
  char buf[512];
  if (!std::fgets(buf, sizeof buf, f)) return "";
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

/// What TENT's engine does on registration: each transport fills the
/// descriptor, then the local segment is updated and published.
Status register_buffers(OrbiteTransport &t, ControlService &meta, std::vector<BufferDesc> &descs,
                        const std::vector<MemoryOptions> &opts) {
  for (std::size_t i = 0; i < descs.size(); ++i) CHECK_STATUS(t.addMemoryBuffer(descs[i], opts[i]));
  CHECK_STATUS(meta.segmentManager().updateLocal([&](SegmentDesc &seg) {
    auto &mem = std::get<MemorySegmentDesc>(seg.detail);
    for (auto &d : descs) mem.buffers.push_back(d);
    return Status::OK();
  }));
  return meta.segmentManager().synchronizeLocal();
}

/// A TENT request (its optional fields left at their defaults).
Request req(Request::OpCode op, void *local, SegmentID target, std::uint64_t offset, std::size_t length) {
  Request r{};
  r.opcode = op;
  r.source = local;
  r.target_id = target;
  r.target_offset = offset;
  r.length = length;
  return r;
}

BufferDesc desc_of(void *p, std::size_t n, const std::string &loc) {
  BufferDesc d{};
  d.addr = reinterpret_cast<std::uintptr_t>(p);
  d.length = n;
  d.location = loc;
  return d;
}

// ---- target ---------------------------------------------------------------

TransferStatus settle(OrbiteTransport &t, Transport::SubBatchRef batch, int id);

int target(const Options &o) {
  Cuda cuda;
  if (gpu(o) && !cuda.open(o.device)) return fail("no CUDA driver (libcuda.so.1)");
  Memory mem{gpu(o) ? &cuda : nullptr};
  auto meta = std::make_shared<ControlService>("shim-dir", o.store, nullptr, "target", "127.0.0.1:12001");
  OrbiteTransport t;
  std::string name = "target";
  if (auto s = t.install(name, meta, std::make_shared<Topology>(), tent_config(o)); !s.ok())
    return fail("install: " + s.ToString());
  MemoryOptions rw{location(o)};
  MemoryOptions ro{location(o), kGlobalReadOnly};
  void *a = nullptr, *b = nullptr, *d = nullptr;
  for (void **p : {&a, &b, &d})
    if (auto s = t.allocateLocalMemory(p, o.size, rw); !s.ok()) return fail("allocateLocalMemory: " + s.ToString());
  // The stack's own allocation (a caching allocator's segment: cudaMalloc
  // memory for NVLink, a cuMemCreate pool for MNNVL), larger than the
  // buffer handed over: the buffer is a sub-range of it.
  unsigned long long stack = 0;
  std::vector<std::uint8_t> host_stack;
  if (o.transport == "mnnvl") {
    if (!(stack = cuda.vmm_alloc(o.device, 2 * o.size))) return fail("cuMemCreate pool");
  } else if (gpu(o)) {
    if (cuda.alloc(&stack, 2 * o.size)) return fail("cuMemAlloc");
  } else {
    host_stack.resize(2 * o.size);
    stack = reinterpret_cast<std::uintptr_t>(host_stack.data());
  }
  void *c = reinterpret_cast<void *>(stack + o.size / 2);
  mem.put(a, pattern_bytes(1 + 16 * o.epoch, o.size));
  mem.put(b, std::vector<std::uint8_t>(o.size, 0));
  mem.put(c, pattern_bytes(3, o.size));
  mem.put(d, pattern_bytes(5, o.size));
  std::vector<BufferDesc> descs = {desc_of(a, o.size, location(o)), desc_of(b, o.size, location(o)),
                                   desc_of(c, o.size, location(o)), desc_of(d, o.size, location(o))};
  if (auto s = register_buffers(t, *meta, descs, {rw, rw, rw, ro}); !s.ok()) return fail("register: " + s.ToString());
  std::printf("ready %llu %llu %llu %llu\n", static_cast<unsigned long long>(descs[0].addr),
              static_cast<unsigned long long>(descs[1].addr), static_cast<unsigned long long>(descs[2].addr),
              static_cast<unsigned long long>(descs[3].addr));
  std::fflush(stdout);
  int rc = 0;
  void *grown = nullptr;
  for (std::string cmd; !(cmd = line_from(stdin)).empty();) {
    if (cmd == "verify") {
      // The initiator said its WRITEs are in place (sendNotification); they
      // are, the moment the notification is here.
      std::vector<Notification> told;
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (told.empty() && std::chrono::steady_clock::now() < until) {
        if (!t.receiveNotification(told).ok()) break;
        std::this_thread::yield();
      }
      // B holds pattern 2 (WRITEs of the initiator); C's second half pattern 4.
      bool ok = told.size() == 1 && told[0].msg == "writes done" && told[0].name == "initiator:app/1" &&
                mem.get(b, o.size) == pattern_bytes(2, o.size) &&
                mem.get(static_cast<char *>(c) + o.size / 2, o.size / 2) == pattern_bytes(4, o.size / 2);
      std::printf("verified %s\n", ok ? "ok" : "bad");
      std::fflush(stdout);
    } else if (cmd == "grow") {
      // A buffer registered after the initiator connected (pattern 6).
      if (auto s = t.allocateLocalMemory(&grown, o.size, rw); !s.ok())
        return fail("allocateLocalMemory: " + s.ToString());
      mem.put(grown, pattern_bytes(6, o.size));
      std::vector<BufferDesc> more = {desc_of(grown, o.size, location(o))};
      if (auto s = register_buffers(t, *meta, more, {rw}); !s.ok()) return fail("register: " + s.ToString());
      descs.push_back(more[0]);
      std::printf("grown %llu\n", static_cast<unsigned long long>(more[0].addr));
      std::fflush(stdout);
    } else if (cmd.rfind("pull ", 0) == 0) {
      // READs 4096 bytes of the initiator's buffer at ADDR into B: this
      // engine then holds an import of it (idle, cached).
      unsigned long long at = std::strtoull(cmd.c_str() + 5, nullptr, 10);
      SegmentID from = 0;
      meta->segmentManager().openRemote(from, "initiator");
      Transport::SubBatchRef pulled = nullptr;
      t.allocateSubBatch(pulled, 1);
      t.submitTransferTasks(pulled, {req(Request::READ, b, from, at, 4096)});
      bool ok = settle(t, pulled, 0).s == COMPLETED && mem.get(b, 4096) == pattern_bytes(2, 4096);
      t.freeSubBatch(pulled);
      std::printf("pulled %s\n", ok ? "ok" : "bad");
      std::fflush(stdout);
    } else if (cmd == "verify-readonly") {
      std::printf("verified %s\n", mem.get(d, o.size) == pattern_bytes(5, o.size) ? "ok" : "bad");
      std::fflush(stdout);
    } else if (cmd == "exit") {
      break;
    }
  }
  for (auto &desc : descs)
    if (auto s = t.removeMemoryBuffer(desc); !s.ok()) rc = fail("removeMemoryBuffer: " + s.ToString());
  for (void *p : {a, b, d, grown})
    if (p)
      if (auto s = t.freeLocalMemory(p, o.size); !s.ok()) rc = fail("freeLocalMemory: " + s.ToString());
  if (auto s = t.uninstall(); !s.ok()) rc = fail("uninstall: " + s.ToString());
  if (o.transport == "mnnvl" ? !cuda.vmm_free(stack, 2 * o.size) : gpu(o) && cuda.release(stack))
    rc = fail("freeing the stack's allocation");
  return rc;
}

// ---- initiator ------------------------------------------------------------

/// Polls task `id` until it is terminal (bounded); its status.
TransferStatus settle(OrbiteTransport &t, Transport::SubBatchRef batch, int id) {
  TransferStatus st{PENDING, 0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    if (!t.getTransferStatus(batch, id, st).ok()) return TransferStatus{INITIAL, 0};
    if (st.s != PENDING || std::chrono::steady_clock::now() > deadline) return st;
    std::this_thread::yield();
  }
}

const char *name_of(TransferStatusEnum s) {
  switch (s) {
    case INITIAL: return "INITIAL";
    case PENDING: return "PENDING";
    case INVALID: return "INVALID";
    case CANCELED: return "CANCELED";
    case COMPLETED: return "COMPLETED";
    case TIMEOUT: return "TIMEOUT";
    case FAILED: return "FAILED";
  }
  return "?";
}

/// Checks that task `id` ends `want` (with all its bytes when COMPLETED).
bool ends(OrbiteTransport &t, Transport::SubBatchRef batch, int id, TransferStatusEnum want, std::size_t length,
          const char *what) {
  TransferStatus st = settle(t, batch, id);
  if (st.s == want && (want != COMPLETED || st.transferred_bytes == length)) return true;
  std::fprintf(stderr, "tent_orbite_test: %s: task %d ended %s (%zu bytes), expected %s\n", what, id, name_of(st.s),
               st.transferred_bytes, name_of(want));
  return false;
}

/// TENT's progress hook, as TENT's engine sets it on a sub-batch: counts
/// its calls, and lets the test wait for the next one without polling.
struct Hook {
  std::mutex lock;
  std::condition_variable called;
  int calls = 0;
  void attach(Transport::SubBatchRef batch) {
    batch->progress_batch_id = 7;
    batch->notify_progress = [this](BatchID id) {
      if (id != 7) std::fprintf(stderr, "tent_orbite_test: the hook got batch id %llu\n", (unsigned long long)id);
      std::lock_guard<std::mutex> g(lock);
      ++calls;
      called.notify_all();
    };
  }
  /// Waits (bounded: `limit`) until the hook was called more than `seen`
  /// times; the calls then, or -1 when it was not.
  int wait_past(int seen, std::chrono::seconds limit) {
    std::unique_lock<std::mutex> g(lock);
    if (!called.wait_for(g, limit, [&] { return calls > seen; })) return -1;
    return calls;
  }
  int count() {
    std::lock_guard<std::mutex> g(lock);
    return calls;
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Initiator {
  const Options &o;
  const char *self;
  char dir[32] = "/tmp/tent-orbite-XXXXXX";
  pid_t pid = -1;
  FILE *tin = nullptr, *tout = nullptr;
  unsigned long long ra = 0, rb = 0, rc = 0, rd = 0;

  bool start_target(int epoch = 0) {
    int to[2], from[2];
    if (pipe(to) || pipe(from)) return false;
    pid = fork();
    if (pid == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      std::string dev = std::to_string(o.device), size = std::to_string(o.size), ep = std::to_string(epoch);
      execl(self, self, "--role", "target", "--store", dir, "--transport", o.transport.c_str(), "--device",
            dev.c_str(), "--size", size.c_str(), "--case", o.test.c_str(), "--epoch", ep.c_str(),
            static_cast<char *>(nullptr));
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    tin = fdopen(to[1], "w");
    tout = fdopen(from[0], "r");
    std::string ready = line_from(tout);
    if (std::sscanf(ready.c_str(), "ready %llu %llu %llu %llu", &ra, &rb, &rc, &rd) != 4) {
      std::fprintf(stderr, "tent_orbite_test: the target did not start: %s\n", ready.c_str());
      return false;
    }
    return true;
  }
  void say(const char *cmd) {
    std::fprintf(tin, "%s\n", cmd);
    std::fflush(tin);
  }
  /// Ends the target; false when it failed (a killed one is not asked).
  bool stop_target(bool killed) {
    if (pid < 0) return true;
    if (!killed) say("exit");
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    std::fclose(tin);
    std::fclose(tout);
    tin = tout = nullptr;
    return killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ~Initiator() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    for (const char *f : {"/target.segment", "/initiator.segment", "/blackhole.segment"})
      std::remove((std::string(dir) + f).c_str());
    rmdir(dir);
  }
};

int run(const Options &o, const char *self) {
  Initiator in{o, self};
  if (!mkdtemp(in.dir)) return fail("mkdtemp");
  bool needs_target = o.test != "unreachable" && o.test != "local" && o.test != "lookup";
  if (needs_target && !in.start_target()) return fail("the target did not start");
  Cuda cuda;
  if (gpu(o) && !cuda.open(o.device)) return fail("no CUDA driver (libcuda.so.1)");
  Memory mem{gpu(o) ? &cuda : nullptr};
  auto meta = std::make_shared<ControlService>("shim-dir", in.dir, nullptr, "initiator", "127.0.0.1:12002");
  OrbiteTransport t;
  std::string name = "initiator";
  // The frozen case polls a stopped target for as long as the load makes
  // 20 000 polls take (at most 10 s): its tasks must not meet the connect
  // deadline then.
  int connect_ms = o.test == "unreachable" || o.test == "deadline" || o.test == "lookup" ? 1500 : o.test == "frozen" ? 600000 : 5000;
  // The local case also names a key the adapter does not know, and the old
  // place of the engine's configuration: both warned about (glog).
  std::string extra = o.test == "local" ? R"(, "config": {"transport_policy": ["tcp"]}, "conect_timeout_ms": 9)" : "";
  if (auto s = t.install(name, meta, std::make_shared<Topology>(), tent_config(o, connect_ms, extra)); !s.ok())
    return fail("install: " + s.ToString());
  int rc = 0;
  Capabilities caps = t.capabilities();
  if (!caps.dram_to_dram || (gpu(o) && !caps.gpu_to_gpu)) rc = fail("capabilities do not say what the engine moves");
  MemoryOptions opts{location(o)};
  void *l1 = nullptr, *l2 = nullptr;
  for (void **p : {&l1, &l2})
    if (auto s = t.allocateLocalMemory(p, o.size, opts); !s.ok()) return fail("allocateLocalMemory: " + s.ToString());
  mem.put(l1, std::vector<std::uint8_t>(o.size, 0));
  mem.put(l2, pattern_bytes(2, o.size));
  std::vector<BufferDesc> mine = {desc_of(l1, o.size, location(o)), desc_of(l2, o.size, location(o))};
  if (auto s = register_buffers(t, *meta, mine, {opts, opts}); !s.ok()) return fail("register: " + s.ToString());
  SegmentID seg = 0;
  meta->segmentManager().openRemote(seg, "target");
  auto *dst = static_cast<char *>(l1);
  auto *src = static_cast<char *>(l2);
  const std::size_t n = o.size;
  Transport::SubBatchRef batch = nullptr;

  if (o.test == "transfer") {
    // Four threads, a sub-batch each: thread k READs slice k of A into l1,
    // WRITEs slice k of l2 into B, and READs slice k of C's first half into
    // the second half of l1 (tasks polled one by one).
    const std::size_t q = n / 4, h = n / 8;
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] {
        Transport::SubBatchRef b = nullptr;
        if (!t.allocateSubBatch(b, 8).ok()) {
          bad++;
          return;
        }
        std::vector<Request> reqs = {
            req(Request::READ, dst + k * h, seg, in.ra + k * h, h),
            req(Request::WRITE, src + k * q, seg, in.rb + k * q, q),
            req(Request::READ, dst + n / 2 + k * h, seg, in.rc + k * h, h),
        };
        if (!t.submitTransferTasks(b, reqs).ok()) bad++;
        for (std::size_t i = 0; i < reqs.size(); ++i)
          if (!ends(t, b, static_cast<int>(i), COMPLETED, reqs[i].length, "a threaded task")) bad++;
        t.freeSubBatch(b);
      });
    }
    for (auto &th : threads) th.join();
    if (bad) rc = fail(std::to_string(bad.load()) + " tasks did not complete with their bytes");
    if (mem.get(l1, n / 2) != pattern_bytes(1, n / 2)) rc = fail("READs of A brought the wrong bytes");
    if (mem.get(dst + n / 2, n / 2) != pattern_bytes(3, n / 2))
      rc = fail("READs of the adopted buffer brought the wrong bytes");
    // The second half of C over WRITE (the target checks it), then two tasks
    // that cannot run: an unknown segment, unregistered local memory.
    mem.put(l2, pattern_bytes(4, n / 2));
    std::vector<std::uint8_t> unregistered(64);
    SegmentID nobody = 0;
    meta->segmentManager().openRemote(nobody, "nobody");
    t.allocateSubBatch(batch, 4);
    t.submitTransferTasks(batch, {req(Request::WRITE, l2, seg, in.rc + n / 2, n / 2)});
    t.submitTransferTasks(batch, {req(Request::READ, l1, nobody, in.ra, 64)});
    t.submitTransferTasks(batch, {req(Request::READ, unregistered.data(), seg, in.ra, 64)});
    if (!ends(t, batch, 0, COMPLETED, n / 2, "the WRITE into the adopted buffer")) rc = 1;
    if (!ends(t, batch, 1, FAILED, 0, "a task for an unknown segment")) rc = 1;
    if (!ends(t, batch, 2, INVALID, 0, "a task from unregistered memory")) rc = 1;
    std::vector<Request> extra(4, req(Request::WRITE, l2, seg, in.rb, 0));
    if (t.submitTransferTasks(batch, extra).ok()) rc = fail("a full sub-batch took more tasks");
    t.freeSubBatch(batch);
    // The transport asked for carried them, in device D's context.
    orbite::Stats stats = t.engine()->stats();
    orbite::Transport want = o.transport == "nvlink"  ? orbite::Transport::nvlink
                             : o.transport == "mnnvl" ? orbite::Transport::mnnvl
                             : o.transport == "shm"   ? orbite::Transport::shm
                                                      : orbite::Transport::tcp;
    std::uint64_t done = stats.transport(want).requests_completed;
    // Over SHM, the 5 tasks on C (4 READs, 1 WRITE) went over TCP.
    std::uint64_t expected = o.transport == "shm" ? 8 : 13;
    if (done != expected)
      rc = fail(std::to_string(done) + " requests went over " + o.transport + ", not " + std::to_string(expected));
    if (o.transport == "shm" && stats.transport(orbite::Transport::tcp).requests_completed != 5)
      rc = fail("the 5 tasks on the stack's plain host memory did not go over TCP");
    if (gpu(o)) {
      auto by = stats.ipc_of(want).copies_by_device;
      if (by.size() != 1 || by.count(o.device) != 1)
        rc = fail("copies ran on another GPU than device " + std::to_string(o.device));
    }
    if (auto s = t.sendNotification(seg, Notification{"initiator:app/1", "writes done"}); !s.ok())
      rc = fail("sendNotification: " + s.ToString());
    in.say("verify");
    if (line_from(in.tout) != "verified ok") rc = fail("the target does not hold the bytes the WRITEs sent");
  } else if (o.test == "local") {
    // What install said about the keys it does not read.
    int warned = 0;
    for (const std::string &line : orbite_tent_shim::logged()) {
      warned += line.rfind("WARNING", 0) == 0 && line.find("transports/orbite/config is not read") != std::string::npos;
      warned += line.rfind("WARNING", 0) == 0 && line.find("unknown key transports/orbite/conect_timeout_ms") != std::string::npos;
    }
    if (warned != 2) rc = fail("install warned about " + std::to_string(warned) + " of the 2 keys it does not read");
    // The engine's configuration given as a string (what tent_set_config
    // stores) is read as the object it holds: a key OrbiTE refuses fails
    // install, naming it.
    {
      OrbiteTransport other;
      auto c = std::make_shared<Config>();
      c->load(R"({"transports": {"orbite": {"engine": "{\"no_such_key\": 1}"}}})");
      std::string other_name = "other";
      Status s = other.install(other_name, meta, std::make_shared<Topology>(), c);
      if (s.ok() || s.ToString().find("no_such_key") == std::string::npos)
        rc = fail("an engine config given as a string was not read: " + s.ToString());
    }
    // Between this process's own buffers: copied on the spot.
    t.allocateSubBatch(batch, 4);
    std::vector<std::uint8_t> unregistered(64);
    t.submitTransferTasks(batch, {req(Request::READ, dst, LOCAL_SEGMENT_ID, reinterpret_cast<std::uintptr_t>(src), n / 2),
                                  req(Request::WRITE, src + n / 2, LOCAL_SEGMENT_ID,
                                   reinterpret_cast<std::uintptr_t>(dst + n / 2), n / 2),
                                  req(Request::READ, unregistered.data(), LOCAL_SEGMENT_ID,
                                   reinterpret_cast<std::uintptr_t>(src), 64)});
    TransferStatus st{};
    for (int i = 0; i < 2; ++i)
      if (!t.getTransferStatus(batch, i, st).ok() || st.s != COMPLETED || st.transferred_bytes != n / 2)
        rc = fail("local task " + std::to_string(i) + " was not COMPLETED on return: " + name_of(st.s));
    if (mem.get(l1, n) != pattern_bytes(2, n)) rc = fail("local copies left the wrong bytes");
    if (!ends(t, batch, 2, INVALID, 0, "a local task from unregistered memory")) rc = 1;
    t.freeSubBatch(batch);
  } else if (o.test == "readonly") {
    t.allocateSubBatch(batch, 2);
    t.submitTransferTasks(batch, {req(Request::WRITE, src, seg, in.rd, 4096), req(Request::READ, dst, seg, in.rd, n)});
    if (!ends(t, batch, 0, INVALID, 0, "a WRITE into a READ-only buffer")) rc = 1;
    if (!ends(t, batch, 1, COMPLETED, n, "a READ of a READ-only buffer")) rc = 1;
    if (mem.get(l1, n) != pattern_bytes(5, n)) rc = fail("the READ of the READ-only buffer brought the wrong bytes");
    t.freeSubBatch(batch);
    in.say("verify-readonly");
    if (line_from(in.tout) != "verified ok") rc = fail("the READ-only buffer changed");
  } else if (o.test == "cancel") {
    // 64 WRITEs of n/64 bytes into B, in reverse order (nothing coalesces),
    // and task 60 cancelled at once: over TCP the last ones are still
    // queued then. The other 63 complete, whatever a cancel of the whole
    // batch would have stopped.
    const std::size_t k = 64, part = n / k;
    t.allocateSubBatch(batch, 2 * k);
    // Connected first (a task cancelled while its connect is under way is
    // simply never sent).
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
    if (!ends(t, batch, 0, COMPLETED, 4096, "the first READ")) rc = 1;
    std::vector<Request> reqs;
    for (std::size_t i = 0; i < k; ++i) {
      std::size_t at = (k - 1 - i) * part;
      reqs.push_back(req(Request::WRITE, src + at, seg, in.rb + at, part));
    }
    if (!t.submitTransferTasks(batch, reqs).ok()) rc = fail("submit");
    if (auto s = t.cancelTransferTask(batch, 1 + 60); !s.ok()) rc = fail("cancel: " + s.ToString());
    for (std::size_t i = 0; i < k; ++i)
      if (i != 60 && !ends(t, batch, static_cast<int>(1 + i), COMPLETED, part, "a sibling of the cancelled task"))
        rc = 1;
    TransferStatus st = settle(t, batch, 1 + 60);
    if (st.s != CANCELED && st.s != COMPLETED) rc = fail(std::string("the cancelled task ended ") + name_of(st.s));
    std::printf("tent_orbite_test: the cancelled task ended %s\n", name_of(st.s));
    // B read back: every slice written, but the cancelled one's only if it
    // completed.
    std::vector<Request> back = {req(Request::READ, dst, seg, in.rb, n)};
    t.submitTransferTasks(batch, back);
    if (!ends(t, batch, static_cast<int>(1 + k), COMPLETED, n, "reading B back")) rc = 1;
    std::vector<std::uint8_t> want = pattern_bytes(2, n);
    std::size_t cancelled_at = (k - 1 - 60) * part;
    if (st.s == CANCELED) std::fill(want.begin() + cancelled_at, want.begin() + cancelled_at + part, 0);
    if (mem.get(l1, n) != want) rc = fail("B does not hold exactly the WRITEs that completed");
    t.freeSubBatch(batch);
  } else if (o.test == "direct") {
    // A region reached once gets a direct route: later tasks naming it are
    // copied within submitTransferTasks (COMPLETED when it returns, no
    // OrbiTE batch), READ and WRITE. Then the target is killed: the next
    // task's direct copy fails, and the task goes through a connector
    // thread and ends FAILED, as a submitted one would.
    t.allocateSubBatch(batch, 8);
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
    t.submitTransferTasks(batch, {req(Request::WRITE, src, seg, in.rb, 4096)});
    if (!ends(t, batch, 0, COMPLETED, 4096, "the first READ of A")) rc = 1;
    if (!ends(t, batch, 1, COMPLETED, 4096, "the first WRITE into B")) rc = 1;
    if (t.directCopies() != 0) rc = fail("a first task went direct");
    mem.put(l1, std::vector<std::uint8_t>(n, 0));
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, n / 2),
                                  req(Request::WRITE, src + n / 2, seg, in.rb + n / 2, n / 2)});
    t.submitTransferTasks(batch, {req(Request::READ, dst + n / 2, seg, in.rb + n / 2, n / 2)});
    for (int i = 2; i <= 4; ++i) {
      TransferStatus st{};
      if (!t.getTransferStatus(batch, i, st).ok() || st.s != COMPLETED || st.transferred_bytes != n / 2)
        rc = fail("task " + std::to_string(i) + " was not COMPLETED on return: " + name_of(st.s));
    }
    if (t.directCopies() != 3) rc = fail(std::to_string(t.directCopies()) + " tasks went direct, not 3");
    if (mem.get(l1, n / 2) != pattern_bytes(1, n / 2)) rc = fail("the direct READ of A brought the wrong bytes");
    std::vector<std::uint8_t> b_half = pattern_bytes(2, n);
    b_half.erase(b_half.begin(), b_half.begin() + n / 2);
    if (mem.get(dst + n / 2, n / 2) != b_half) rc = fail("B does not hold what the direct WRITE sent");
    orbite::Transport want = o.transport == "nvlink"  ? orbite::Transport::nvlink
                             : o.transport == "mnnvl" ? orbite::Transport::mnnvl
                                                      : orbite::Transport::shm;
    if (std::uint64_t done = t.engine()->stats().transport(want).requests_completed; done != 5)
      rc = fail(std::to_string(done) + " requests completed over " + o.transport + ", not 5");
    kill(in.pid, SIGKILL);
    in.stop_target(true);
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
    if (!ends(t, batch, 5, FAILED, 0, "a READ of A after the target was killed")) rc = 1;
    if (t.directCopies() != 3) rc = fail("the READ after the kill counted as a direct copy");
    t.freeSubBatch(batch);
  } else if (o.test == "unreachable") {
    // A listener that never answers: the connect waits for its deadline.
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) || listen(fd, 16) ||
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len))
      return fail("listener");
    ControlService black("shim-dir", in.dir, nullptr, "blackhole");
    black.segmentManager().updateLocal([&](SegmentDesc &s) {
      BufferDesc d = desc_of(reinterpret_cast<void *>(0x100000), 1 << 20, "cpu:0");
      d.transports.push_back(ORBITE);
      d.transport_attrs[ORBITE] = "endpoint=127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + " region=1";
      std::get<MemorySegmentDesc>(s.detail).buffers.push_back(d);
      return Status::OK();
    });
    black.segmentManager().synchronizeLocal();
    SegmentID hole = 0;
    meta->segmentManager().openRemote(hole, "blackhole");
    t.allocateSubBatch(batch, 2);
    if (!t.submitTransferTasks(batch, {req(Request::READ, dst, hole, 0x100000, 4096)}).ok()) rc = fail("submit");
    TransferStatus st{};
    if (!t.getTransferStatus(batch, 0, st).ok() || st.s != PENDING)
      rc = fail(std::string("right after submit the task was ") + name_of(st.s) + ", not PENDING");
    if (!ends(t, batch, 0, TIMEOUT, 0, "a task for a target that never answers")) rc = 1;
    t.freeSubBatch(batch);
    close(fd);
  } else if (o.test == "unregister") {
    in.say(("pull " + std::to_string(reinterpret_cast<std::uintptr_t>(src))).c_str());
    if (line_from(in.tout) != "pulled ok") return fail("the target could not READ the initiator's buffer");
    int stopped = 0;
    if (kill(in.pid, SIGSTOP) || waitpid(in.pid, &stopped, WUNTRACED) != in.pid || !WIFSTOPPED(stopped))
      return fail("the target did not stop");
    // The stopped target never answers the revoke of its import: the call
    // returns at unregister_timeout_ms (1 s), not at the engine's deadline.
    auto t0 = std::chrono::steady_clock::now();
    Status removed = t.removeMemoryBuffer(mine[1]);
    double took = ms_since(t0);
    std::printf("tent_orbite_test: removeMemoryBuffer returned in %.1f ms (unregister_timeout_ms 1000)\n", took);
    if (removed.ok() || removed.ToString().find("unregister deferred") == std::string::npos)
      rc = fail("removeMemoryBuffer did not say the unregister was deferred: " + removed.ToString());
    if (took > 10000) rc = fail("removeMemoryBuffer took " + std::to_string(took) + " ms");
    if (t.freeLocalMemory(src, n).ok()) rc = fail("memory still registered was freed");
    kill(in.pid, SIGCONT);
    // Running again, the target gives the import back; the next
    // registration change unregisters the buffer, and it can be freed.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool freed = false;
    while (!freed && std::chrono::steady_clock::now() < until) {
      BufferDesc none = desc_of(reinterpret_cast<void *>(0x1000), 4096, "cpu:0");
      (void)t.removeMemoryBuffer(none);  // registers nothing; retries the deferred one
      freed = t.freeLocalMemory(src, n).ok();
      if (!freed) std::this_thread::yield();
    }
    if (!freed) rc = fail("the deferred buffer was never unregistered after the target ran again");
    mine.erase(mine.begin() + 1);
  } else if (o.test == "lookup") {
    // The segment's record is a FIFO: reading it blocks until a writer
    // opens it, which the test does only after uninstall.
    std::string fifo = std::string(in.dir) + "/stuck.segment";
    if (mkfifo(fifo.c_str(), 0600)) return fail("mkfifo");
    SegmentID stuck = 0;
    meta->segmentManager().openRemote(stuck, "stuck");
    t.allocateSubBatch(batch, 2);
    for (int id = 0; id < 2; ++id) {
      // The second connect waits for the same lookup, up to its deadline.
      auto t0 = std::chrono::steady_clock::now();
      if (!t.submitTransferTasks(batch, {req(Request::READ, dst, stuck, 0x100000, 4096)}).ok()) rc = fail("submit");
      TransferStatus st{};
      if (!t.getTransferStatus(batch, id, st).ok() || st.s != PENDING)
        rc = fail(std::string("right after submit the task was ") + name_of(st.s) + ", not PENDING");
      if (!ends(t, batch, id, TIMEOUT, 0, "a task whose segment lookup never returns")) rc = 1;
      std::printf("tent_orbite_test: lookup %d: ended %.1f ms after submit (connect deadline 1500 ms)\n", id,
                  ms_since(t0));
      // The timer failed the task; the job's own wait for the lookup ends
      // just after, and says so: the next task starts a job of its own.
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      auto jobs_ended = [] {
        int n = 0;
        for (const std::string &line : orbite_tent_shim::logged())
          n += line.find("TENT's metadata service did not answer within") != std::string::npos;
        return n;
      };
      while (jobs_ended() <= id && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    t.freeSubBatch(batch);
    // Uninstall here, with the lookup still stuck: the pool's jobs ended at
    // their deadline (a job waiting for the lookup would hold uninstall up
    // and be reported stuck); the lookup itself is left, and said so.
    for (auto &d : mine) {
      if (auto s = t.removeMemoryBuffer(d); !s.ok()) rc = fail("removeMemoryBuffer: " + s.ToString());
      if (auto s = t.freeLocalMemory(reinterpret_cast<void *>(static_cast<std::uintptr_t>(d.addr)), n); !s.ok())
        rc = fail("freeLocalMemory: " + s.ToString());
    }
    mine.clear();
    if (auto s = t.uninstall(); !s.ok()) rc = fail("uninstall: " + s.ToString());
    int stuck_jobs = 0, left_lookups = 0;
    for (const std::string &line : orbite_tent_shim::logged()) {
      stuck_jobs += line.find("jobs did not end at uninstall") != std::string::npos;
      left_lookups += line.find("segment lookups still wait for TENT's metadata service") != std::string::npos;
    }
    if (stuck_jobs != 0) rc = fail("a pool job was still waiting for the segment lookup at uninstall");
    if (left_lookups != 1) rc = fail("uninstall did not report the stuck lookup (the FIFO did not block it?)");
    // Lets the lookup end: its read finds the record empty.
    int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
  } else if (o.test == "killed") {
    t.allocateSubBatch(batch, 4);
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, n)});
    if (!ends(t, batch, 0, COMPLETED, n, "the READ before the kill")) rc = 1;
    kill(in.pid, SIGKILL);
    in.stop_target(true);
    // The connection is gone: this task fails (its reconnect is refused),
    // and so does the next one, at once.
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, n)});
    if (!ends(t, batch, 1, FAILED, 0, "a READ from the killed target")) rc = 1;
    t.submitTransferTasks(batch, {req(Request::WRITE, src, seg, in.rb, n)});
    if (!ends(t, batch, 2, FAILED, 0, "a WRITE to the killed target")) rc = 1;
    t.freeSubBatch(batch);
  } else if (o.test == "frozen") {
    t.allocateSubBatch(batch, 3);
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
    if (!ends(t, batch, 0, COMPLETED, 4096, "the READ before the freeze")) rc = 1;
    in.say("grow");
    unsigned long long re = 0;
    if (std::sscanf(line_from(in.tout).c_str(), "grown %llu", &re) != 1) return fail("the target registered no E");
    // Stopped for good before anything is asked of it (a signal lands
    // asynchronously: waitpid says when it has).
    int stopped = 0;
    if (kill(in.pid, SIGSTOP) || waitpid(in.pid, &stopped, WUNTRACED) != in.pid || !WIFSTOPPED(stopped))
      return fail("the target did not stop");
    // B is known but not reached yet (over NVLink and MNNVL its import is
    // opened with the target; over TCP the target sends its bytes); E is in
    // no region the initiator knows (the target is asked). The target
    // cannot answer, so both tasks are PENDING whenever submit returns
    // (were E's question asked in submit, it would return after the
    // deadline, the task refused; so would B's import over NVLink). Over
    // SHM, B's import may be open already (the target's SHM buffers share
    // what the first READ opened): B may complete at once.
    if (!t.submitTransferTasks(batch, {req(Request::READ, src, seg, in.rb, n)}).ok()) rc = fail("submit");
    if (!t.submitTransferTasks(batch, {req(Request::READ, dst, seg, re, n)}).ok()) rc = fail("submit");
    // Polled again and again while the connector thread submits them (and
    // waits for the target): a poll never waits for that submission. At
    // most 20 000 polls or 10 s, whichever ends first: on a loaded machine
    // each yield below can give the core away for milliseconds, and the
    // tasks' own deadline (the engine's default_timeout_ms, 30 s) must not
    // pass while the target is stopped.
    auto poll_until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int round = 0; round < 20000 && rc == 0 && std::chrono::steady_clock::now() < poll_until; ++round) {
      for (int i = o.transport == "shm" ? 2 : 1; i <= 2; ++i) {
        TransferStatus st{};
        if (!t.getTransferStatus(batch, i, st).ok() || st.s != PENDING)
          rc = fail("with the target stopped, after submit task " + std::to_string(i) + " was " + name_of(st.s) +
                    ", not PENDING (poll " + std::to_string(round) + ")");
      }
      std::this_thread::yield();
    }
    kill(in.pid, SIGCONT);
    if (!ends(t, batch, 1, COMPLETED, n, "a READ of a buffer not reached before")) rc = 1;
    if (!ends(t, batch, 2, COMPLETED, n, "a READ of a buffer registered after the connect")) rc = 1;
    if (mem.get(l2, n) != std::vector<std::uint8_t>(n, 0)) rc = fail("the READ of B brought the wrong bytes");
    if (mem.get(l1, n) != pattern_bytes(6, n)) rc = fail("the READ of E brought the wrong bytes");
    t.freeSubBatch(batch);
  } else if (o.test == "restart") {
    // Connected, A reached (over SHM with the defaults: a direct route to
    // it), and the initiator's own thread holds a copy of the segment.
    t.allocateSubBatch(batch, 256);
    int next = 0;
    // The route is opened by the pool job after the first READ's
    // submission, so a READ right after it may still go through the pool:
    // READs until one goes direct (over SHM), each COMPLETED.
    for (int i = 0; i < (o.transport == "shm" ? 200 : 2) && rc == 0; ++i) {
      t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
      if (!ends(t, batch, next++, COMPLETED, 4096, "a READ of the first target")) rc = 1;
      if (t.directCopies() > 0) break;
    }
    if (o.transport == "shm" && t.directCopies() == 0) rc = fail("with the defaults, no task went direct over SHM");
    SegmentDescRef cached;
    meta->segmentManager().getRemoteCached(cached, seg);
    for (int epoch = 1; epoch <= 3 && rc == 0; ++epoch) {
      kill(in.pid, SIGKILL);
      in.stop_target(true);
      if (!in.start_target(epoch)) return fail("the restarted target did not start");
      // The first task to the new target, submitted once it serves: the
      // adapter still holds the dead peer; the task must reach the new one.
      auto t0 = std::chrono::steady_clock::now();
      mem.put(l1, std::vector<std::uint8_t>(n, 0));
      t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, n)});
      int id = next++;
      if (!ends(t, batch, id, COMPLETED, n, "the first READ of a restarted target")) rc = 1;
      std::printf("tent_orbite_test: restart %d: the new target's first READ ended in %.1f ms\n", epoch, ms_since(t0));
      if (mem.get(l1, n) != pattern_bytes(1 + 16 * epoch, n)) rc = fail("the READ did not bring the new target's bytes");
      // TENT's cached copies of the segment (this thread's too) were
      // refreshed: they name the new target's buffers.
      meta->segmentManager().getRemoteCached(cached, seg);
      if (cached->getMemory().buffers.empty() || cached->getMemory().buffers[0].addr != in.ra)
        rc = fail("this thread's cached segment still names the old target's buffers");
      // And the next ones (over SHM: through a direct route again).
      t.submitTransferTasks(batch, {req(Request::WRITE, src, seg, in.rb, 4096)});
      if (!ends(t, batch, next++, COMPLETED, 4096, "a WRITE to the restarted target")) rc = 1;
    }
    if (t.connects() != 4) rc = fail(std::to_string(t.connects()) + " connects, not 4 (one per target)");
    t.freeSubBatch(batch);
  } else if (o.test == "deadline") {
    t.allocateSubBatch(batch, 4);
    Hook hook;
    hook.attach(batch);
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
    if (!ends(t, batch, 0, COMPLETED, 4096, "the READ before the freeze")) rc = 1;
    in.say("grow");
    unsigned long long re = 0;
    if (std::sscanf(line_from(in.tout).c_str(), "grown %llu", &re) != 1) return fail("the target registered no E");
    int stopped = 0;
    if (kill(in.pid, SIGSTOP) || waitpid(in.pid, &stopped, WUNTRACED) != in.pid || !WIFSTOPPED(stopped))
      return fail("the target did not stop");
    // E is not known: a pool job asks the stopped target (its answer would
    // come at the engine's 60 s); A's READ waits behind it, in order.
    int seen = hook.count();
    auto t0 = std::chrono::steady_clock::now();
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, re, 4096)});
    t.submitTransferTasks(batch, {req(Request::READ, dst, seg, in.ra, 4096)});
    // No poll: the hook says when they ended.
    while (rc == 0) {
      int calls = hook.wait_past(seen, std::chrono::seconds(20));
      if (calls < 0) {
        rc = fail("TENT's progress hook was not called within 20 s of the connect deadline");
        break;
      }
      seen = calls;
      TransferStatus s1{}, s2{};
      t.getTransferStatus(batch, 1, s1);
      t.getTransferStatus(batch, 2, s2);
      if (s1.s != PENDING && s2.s != PENDING) break;
    }
    double took = ms_since(t0);
    std::printf("tent_orbite_test: both tasks ended %.1f ms after submit (connect deadline 1500 ms)\n", took);
    if (!ends(t, batch, 1, TIMEOUT, 0, "a READ of a region the stopped target was asked about")) rc = 1;
    if (!ends(t, batch, 2, TIMEOUT, 0, "a READ queued behind it")) rc = 1;
    // Well under the 60 s the engine would have taken (the exact figure is
    // printed, not asserted: the machine may be loaded).
    if (took > 30000) rc = fail("the tasks ended after " + std::to_string(took) + " ms");
    kill(in.pid, SIGCONT);
    t.freeSubBatch(batch);
  } else if (o.test == "progress") {
    t.allocateSubBatch(batch, 16);
    Hook hook;
    hook.attach(batch);
    t.submitTransferTasks(batch, {req(Request::WRITE, src, seg, in.rb, n)});
    if (!ends(t, batch, 0, COMPLETED, n, "the first WRITE")) rc = 1;
    // B is reached: each WRITE is an OrbiTE batch made on this thread; the
    // only thing that calls the hook is its end.
    double worst = 0;
    for (int i = 1; i <= 8 && rc == 0; ++i) {
      int seen = hook.count();
      auto t0 = std::chrono::steady_clock::now();
      t.submitTransferTasks(batch, {req(Request::WRITE, src, seg, in.rb, n)});
      if (hook.wait_past(seen, std::chrono::seconds(30)) < 0) {
        rc = fail("TENT's progress hook was not called when the batch ended");
        break;
      }
      worst = std::max(worst, ms_since(t0));
      TransferStatus st{};
      if (!t.getTransferStatus(batch, i, st).ok() || st.s != COMPLETED)
        rc = fail(std::string("when the hook was called the task was ") + name_of(st.s));
    }
    std::printf("tent_orbite_test: the hook came at most %.1f ms after submit (WRITEs of %zu bytes)\n", worst, n);
    t.freeSubBatch(batch);
  } else {
    return fail("unknown --case " + o.test);
  }
  // Closing gives the target's exports back (close receipts), so that it
  // can remove its buffers at once.
  for (auto &d : mine) {
    void *p = reinterpret_cast<void *>(static_cast<std::uintptr_t>(d.addr));
    if (auto s = t.removeMemoryBuffer(d); !s.ok()) rc = fail("removeMemoryBuffer: " + s.ToString());
    if (auto s = t.freeLocalMemory(p, n); !s.ok()) rc = fail("freeLocalMemory: " + s.ToString());
  }
  if (auto s = t.uninstall(); !s.ok()) rc = fail("uninstall: " + s.ToString());
  if (!in.stop_target(o.test == "killed" || o.test == "direct")) rc = fail("the target failed");
  if (rc == 0) std::printf("tent_orbite_test: %s over %s: every task ended as TENT expects\n", o.test.c_str(), o.transport.c_str());
  return rc;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--transport") o.transport = v;
    else if (k == "--case") o.test = v;
    else if (k == "--role") o.role = v;
    else if (k == "--store") o.store = v;
    else if (k == "--device") o.device = std::atoi(v.c_str());
    else if (k == "--size") o.size = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--epoch") o.epoch = std::atoi(v.c_str());
    else return fail("unknown argument " + k);
  }
  if (o.transport != "tcp" && o.transport != "shm" && o.transport != "nvlink" && o.transport != "mnnvl")
    return fail("--transport tcp|shm|nvlink|mnnvl");
  try {
    return o.role == "target" ? target(o) : run(o, argv[0]);
  } catch (const std::exception &e) {
    return fail(e.what());
  }
}
