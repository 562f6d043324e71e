// tent_demo: the OrbiteTransport adapter between two processes, as TENT's
// engine would drive it.
//
//   tent_demo --transport nvlink|mnnvl|tcp [--device D] [--size BYTES]
//
// The initiator (this process) starts the target (the same program with
// --role target) and shares a metadata directory with it. The target
// allocates two buffers through allocateLocalMemory on cuda:D (host memory
// for tcp), cuMemAllocs a third one itself, as a stack's caching allocator
// would, and hands all three to addMemoryBuffer (the third is adopted), then
// publishes its segment. The initiator allocates its buffers on cuda:D too,
// finds the target's segment, and from four threads, each with its own
// sub-batch, READs and WRITEs every buffer in slices, polling each task's
// status; the target then checks the bytes the WRITEs left. Also: a task
// naming an unknown segment fails, one naming unregistered local memory is
// INVALID, cancelled tasks end CANCELED or COMPLETED, and the copies ran on
// the transport asked for and (CUDA) in device D's context.
// Exit 0 when everything held, 1 otherwise.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "file_store.h"
#include "orbite_transport.h"

namespace {

struct Options {
  std::string transport = "tcp";
  std::string role = "initiator";
  std::string store;
  int device = 0;
  std::size_t size = 4u << 20;
};

int fail(const std::string &why) {
  std::fprintf(stderr, "tent_demo: %s\n", why.c_str());
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
      std::fprintf(stderr, "tent_demo: cuMemcpy failed\n");
      std::exit(1);
    }
  }
  std::vector<std::uint8_t> get(const void *p, std::size_t n) const {
    std::vector<std::uint8_t> v(n);
    if (!cuda) {
      std::memcpy(v.data(), p, n);
    } else if (cuda->copy(reinterpret_cast<std::uintptr_t>(v.data()), reinterpret_cast<std::uintptr_t>(p), n) ||
               cuda->sync()) {
      std::fprintf(stderr, "tent_demo: cuMemcpy failed\n");
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
  if (o.transport == "nvlink") return R"({"nvlink": true, "nvlink_cache_entries": 8})";
  if (o.transport == "mnnvl") return R"({"mnnvl": {"handle_type": "posix_fd"}, "nvlink_cache_entries": 8})";
  return R"({"transport_policy": ["tcp"]})";
}

std::string location(const Options &o) { return o.transport == "tcp" ? "cpu:0" : "cuda:" + std::to_string(o.device); }

std::string line_from(FILE *f) {
  char buf[512];
  if (!std::fgets(buf, sizeof buf, f)) return "";
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// ---- target ---------------------------------------------------------------

int target(const Options &o) {
  Cuda cuda;
  bool gpu = o.transport != "tcp";
  if (gpu && !cuda.open(o.device)) return fail("no CUDA driver (libcuda.so.1)");
  Memory mem{gpu ? &cuda : nullptr};
  auto store = std::make_shared<orbite_tent::FileStore>(o.store, "target");
  orbite_tent::OrbiteTransport t;
  std::string name = "target";
  if (auto s = t.install(name, store, engine_config(o)); !s.ok()) return fail("install: " + s.ToString());
  tent::MemoryOptions opts{location(o)};
  void *a = nullptr, *b = nullptr;
  for (void **p : {&a, &b})
    if (auto s = t.allocateLocalMemory(p, o.size, opts); !s.ok()) return fail("allocateLocalMemory: " + s.ToString());
  // The stack's own allocation (a caching allocator's segment: cudaMalloc
  // memory for NVLink, a cuMemCreate pool for MNNVL), larger than the
  // buffer handed over: the buffer is a sub-range of it.
  unsigned long long stack = 0;
  std::vector<std::uint8_t> host_stack;
  if (o.transport == "mnnvl") {
    if (!(stack = cuda.vmm_alloc(o.device, 2 * o.size))) return fail("cuMemCreate pool");
  } else if (gpu) {
    if (cuda.alloc(&stack, 2 * o.size)) return fail("cuMemAlloc");
  } else {
    host_stack.resize(2 * o.size);
    stack = reinterpret_cast<std::uintptr_t>(host_stack.data());
  }
  void *c = reinterpret_cast<void *>(stack + o.size / 2);
  mem.put(a, pattern_bytes(1, o.size));
  mem.put(b, std::vector<std::uint8_t>(o.size, 0));
  mem.put(c, pattern_bytes(3, o.size));
  std::vector<tent::BufferDesc> descs(3);
  void *addrs[3] = {a, b, c};
  for (int i = 0; i < 3; ++i) {
    descs[i].addr = reinterpret_cast<std::uintptr_t>(addrs[i]);
    descs[i].length = o.size;
    descs[i].location = location(o);
    if (auto s = t.addMemoryBuffer(descs[i], opts); !s.ok()) return fail("addMemoryBuffer: " + s.ToString());
  }
  store->updateLocal([&](tent::SegmentDesc &seg) { seg.buffers = descs; });
  std::printf("ready %llu %llu %llu\n", static_cast<unsigned long long>(descs[0].addr),
              static_cast<unsigned long long>(descs[1].addr), static_cast<unsigned long long>(descs[2].addr));
  std::fflush(stdout);
  int rc = 0;
  for (std::string cmd; !(cmd = line_from(stdin)).empty();) {
    if (cmd == "verify") {
      // The initiator said its WRITEs are in place (sendNotification); they
      // are, the moment the notification is here.
      std::vector<tent::Notification> told;
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (told.empty() && std::chrono::steady_clock::now() < until) {
        if (!t.receiveNotification(told).ok()) break;
        std::this_thread::yield();
      }
      // B holds pattern 2 (WRITEs of the initiator); C's second half pattern 4.
      bool ok = told.size() == 1 && told[0].msg == "writes done" && told[0].name == "initiator" &&
                mem.get(b, o.size) == pattern_bytes(2, o.size) &&
                mem.get(static_cast<char *>(c) + o.size / 2, o.size / 2) == pattern_bytes(4, o.size / 2);
      std::printf("verified %s\n", ok ? "ok" : "bad");
      std::fflush(stdout);
    } else if (cmd == "exit") {
      break;
    }
  }
  for (auto &d : descs)
    if (auto s = t.removeMemoryBuffer(d); !s.ok()) rc = fail("removeMemoryBuffer: " + s.ToString());
  for (void *p : {a, b})
    if (auto s = t.freeLocalMemory(p, o.size); !s.ok()) rc = fail("freeLocalMemory: " + s.ToString());
  if (auto s = t.uninstall(); !s.ok()) rc = fail("uninstall: " + s.ToString());
  if (o.transport == "mnnvl" ? !cuda.vmm_free(stack, 2 * o.size) : gpu && cuda.release(stack))
    rc = fail("freeing the stack's allocation");
  return rc;
}

// ---- initiator ------------------------------------------------------------

/// Polls until every task of `ids` is terminal (bounded); their statuses.
std::vector<tent::TransferStatus> settle(orbite_tent::OrbiteTransport &t, tent::Transport::SubBatchRef batch,
                                         int first, int count) {
  std::vector<tent::TransferStatus> out(count);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int i = 0; i < count; ++i) {
    for (;;) {
      if (!t.getTransferStatus(batch, first + i, out[i]).ok()) break;
      if (out[i].s != tent::TransferStatusEnum::PENDING) break;
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::yield();
    }
  }
  return out;
}

int initiator(const Options &o, const char *self) {
  char dir[] = "/tmp/tent-demo-XXXXXX";
  if (!mkdtemp(dir)) return fail("mkdtemp");
  // The target: the same program, its stdin and stdout on pipes.
  int to[2], from[2];
  if (pipe(to) || pipe(from)) return fail("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    std::string dev = std::to_string(o.device), size = std::to_string(o.size);
    execl(self, self, "--role", "target", "--store", dir, "--transport", o.transport.c_str(), "--device", dev.c_str(),
          "--size", size.c_str(), static_cast<char *>(nullptr));
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  FILE *tin = fdopen(to[1], "w"), *tout = fdopen(from[0], "r");
  int rc = 0;
  auto say = [&](const char *cmd) {
    std::fprintf(tin, "%s\n", cmd);
    std::fflush(tin);
  };
  std::string ready = line_from(tout);
  unsigned long long ra = 0, rb = 0, rcc = 0;
  if (std::sscanf(ready.c_str(), "ready %llu %llu %llu", &ra, &rb, &rcc) != 3) {
    waitpid(pid, nullptr, 0);
    return fail("the target did not start: " + ready);
  }
  {
    Cuda cuda;
    bool gpu = o.transport != "tcp";
    if (gpu && !cuda.open(o.device)) return fail("no CUDA driver (libcuda.so.1)");
    Memory mem{gpu ? &cuda : nullptr};
    auto store = std::make_shared<orbite_tent::FileStore>(dir, "initiator");
    orbite_tent::OrbiteTransport t;
    std::string name = "initiator";
    if (auto s = t.install(name, store, engine_config(o)); !s.ok()) return fail("install: " + s.ToString());
    tent::Capabilities caps = t.capabilities();
    if (!caps.dram_to_dram || (gpu && !caps.gpu_to_gpu)) rc = fail("capabilities do not say what the engine moves");
    tent::MemoryOptions opts{location(o)};
    void *l1 = nullptr, *l2 = nullptr;
    for (void **p : {&l1, &l2})
      if (auto s = t.allocateLocalMemory(p, o.size, opts); !s.ok()) return fail("allocateLocalMemory: " + s.ToString());
    mem.put(l2, pattern_bytes(2, o.size));
    for (void *p : {l1, l2}) {
      tent::BufferDesc d;
      d.addr = reinterpret_cast<std::uintptr_t>(p);
      d.length = o.size;
      d.location = location(o);
      if (auto s = t.addMemoryBuffer(d, opts); !s.ok()) return fail("addMemoryBuffer: " + s.ToString());
    }
    tent::SegmentID seg = store->openSegment("target");
    // Four threads, a sub-batch each: thread k READs slice k of A into l1,
    // WRITEs slice k of l2 into B, and READs slice k of C's first half into
    // the second half of l1 (tasks polled one by one).
    const std::size_t q = o.size / 4, h = o.size / 8;
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] {
        tent::Transport::SubBatchRef batch = nullptr;
        if (!t.allocateSubBatch(batch, 8).ok()) {
          bad++;
          return;
        }
        auto *dst = static_cast<char *>(l1);
        std::vector<tent::Request> reqs = {
            {tent::Request::READ, dst + k * h, seg, ra + k * h, h},
            {tent::Request::WRITE, static_cast<char *>(l2) + k * q, seg, rb + k * q, q},
            {tent::Request::READ, dst + o.size / 2 + k * h, seg, rcc + k * h, h},
        };
        if (!t.submitTransferTasks(batch, reqs).ok()) bad++;
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          auto st = settle(t, batch, static_cast<int>(i), 1)[0];
          if (st.s != tent::TransferStatusEnum::COMPLETED || st.transferred_bytes != reqs[i].length) bad++;
        }
        t.freeSubBatch(batch);
      });
    }
    for (auto &th : threads) th.join();
    if (bad) rc = fail(std::to_string(bad.load()) + " tasks did not complete with their bytes");
    if (mem.get(l1, o.size / 2) != pattern_bytes(1, o.size / 2)) rc = fail("READs of A brought the wrong bytes");
    if (mem.get(static_cast<char *>(l1) + o.size / 2, o.size / 2) != pattern_bytes(3, o.size / 2))
      rc = fail("READs of the adopted buffer brought the wrong bytes");
    // The second half of C over WRITE (the target checks it), then two tasks
    // that cannot run: an unknown segment, unregistered local memory.
    mem.put(l2, pattern_bytes(4, o.size / 2));
    std::vector<std::uint8_t> unregistered(64);
    tent::Transport::SubBatchRef batch = nullptr;
    t.allocateSubBatch(batch, 4);
    std::vector<tent::Request> more = {
        {tent::Request::WRITE, l2, seg, rcc + o.size / 2, o.size / 2},
        {tent::Request::READ, l1, store->openSegment("nobody"), ra, 64},
        {tent::Request::READ, unregistered.data(), seg, ra, 64},
    };
    t.submitTransferTasks(batch, {more[0]});
    t.submitTransferTasks(batch, {more[1]});
    t.submitTransferTasks(batch, {more[2]});
    auto st = settle(t, batch, 0, 3);
    if (st[0].s != tent::TransferStatusEnum::COMPLETED) rc = fail("the WRITE into the adopted buffer did not complete");
    if (st[1].s != tent::TransferStatusEnum::FAILED) rc = fail("a task for an unknown segment did not fail");
    if (st[2].s != tent::TransferStatusEnum::INVALID) rc = fail("a task from unregistered memory was not INVALID");
    std::vector<tent::Request> extra(4, tent::Request{tent::Request::WRITE, l2, seg, rb, 0});
    if (t.submitTransferTasks(batch, extra).ok()) rc = fail("a full sub-batch took more tasks");
    t.freeSubBatch(batch);
    // Cancellation: every task ends CANCELED or COMPLETED.
    t.allocateSubBatch(batch, 16);
    std::vector<tent::Request> many;
    for (std::size_t k = 0; k < 16; ++k) many.push_back({tent::Request::READ, static_cast<char *>(l1) + k * h / 2, seg, ra, h / 2});
    t.submitTransferTasks(batch, many);
    t.cancelTransferTask(batch, 15);
    for (auto &s : settle(t, batch, 0, 16))
      if (s.s != tent::TransferStatusEnum::CANCELED && s.s != tent::TransferStatusEnum::COMPLETED)
        rc = fail("a cancelled task ended neither CANCELED nor COMPLETED");
    t.freeSubBatch(batch);
    // The transport asked for carried them, in device D's context.
    orbite::Stats stats = t.engine().stats();
    orbite::Transport want = o.transport == "nvlink"  ? orbite::Transport::nvlink
                             : o.transport == "mnnvl" ? orbite::Transport::mnnvl
                                                      : orbite::Transport::tcp;
    std::uint64_t done = stats.transport(want).requests_completed;
    if (done < 13) rc = fail("only " + std::to_string(done) + " requests went over " + o.transport);
    if (gpu) {
      auto by = stats.ipc_of(want).copies_by_device;
      if (by.size() != 1 || by.count(o.device) != 1) rc = fail("copies ran on another GPU than device " + std::to_string(o.device));
    }
    if (auto s = t.sendNotification(seg, tent::Notification{"initiator", "writes done"}); !s.ok())
      rc = fail("sendNotification: " + s.ToString());
    say("verify");
    if (line_from(tout) != "verified ok") rc = fail("the target does not hold the bytes the WRITEs sent");
    // Closing gives the target's exports back (close receipts), so that it
    // can remove its buffers at once.
    for (void *p : {l1, l2}) {
      tent::BufferDesc d;
      d.addr = reinterpret_cast<std::uintptr_t>(p);
      if (auto s = t.removeMemoryBuffer(d); !s.ok()) rc = fail("removeMemoryBuffer: " + s.ToString());
      if (auto s = t.freeLocalMemory(p, o.size); !s.ok()) rc = fail("freeLocalMemory: " + s.ToString());
    }
    if (auto s = t.uninstall(); !s.ok()) rc = fail("uninstall: " + s.ToString());
    say("exit");
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = fail("the target failed");
    if (rc == 0)
      std::printf("tent_demo: %s: %llu requests over %s, every task settled with its bytes, device %d\n",
                  o.transport.c_str(), static_cast<unsigned long long>(done), o.transport.c_str(), o.device);
  }
  std::remove((std::string(dir) + "/target.segment").c_str());
  rmdir(dir);
  return rc;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--transport") o.transport = v;
    else if (k == "--role") o.role = v;
    else if (k == "--store") o.store = v;
    else if (k == "--device") o.device = std::atoi(v.c_str());
    else if (k == "--size") o.size = std::strtoull(v.c_str(), nullptr, 10);
    else return fail("unknown argument " + k);
  }
  if (o.transport != "tcp" && o.transport != "nvlink" && o.transport != "mnnvl") return fail("--transport nvlink|mnnvl|tcp");
  try {
    return o.role == "target" ? target(o) : initiator(o, argv[0]);
  } catch (const std::exception &e) {
    return fail(e.what());
  }
}
