// The C++ layer (orbite.hpp): ownership, errors, the text retry loop, the
// JSON reader and the typed views, batches. Built with -Wall -Wextra -Werror
// and run under ASan/UBSan and valgrind like the C tests.
#include <orbite.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

// `expr` must throw orbite::Error with status `want` whose message contains `needle`.
#define CHECK_THROWS(expr, want, needle)                                                        \
  do {                                                                                          \
    bool thrown_ = false;                                                                       \
    try {                                                                                       \
      (void)(expr);                                                                             \
    } catch (const orbite::Error &e_) {                                                         \
      thrown_ = true;                                                                           \
      if (e_.status() != (want) || std::string(e_.what()).find(needle) == std::string::npos) { \
        std::fprintf(stderr, "%s:%d: %s threw \"%s\"\n", __FILE__, __LINE__, #expr, e_.what()); \
        failures++;                                                                             \
      }                                                                                         \
    }                                                                                           \
    if (!thrown_) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s did not throw\n", __FILE__, __LINE__, #expr);             \
      failures++;                                                                               \
    }                                                                                           \
  } while (0)

static void typed_views() {
  // A C region record as the header reads it: access bits, known and
  // unknown kinds.
  orbite_region_info c{3, 9, 4096, 8192, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, "shared_host"};
  orbite::Region r = orbite::detail::region_of(c);
  CHECK(r.id == 3 && r.epoch == 9 && r.addr == 4096 && r.length == 8192 && r.end() == 12288);
  CHECK(r.readable() && r.writable() && r.kind == orbite::MemoryKind::shared_host && r.kind_name == "shared_host");
  CHECK(r.contains(4096, 8192) && r.contains(12287, 1) && !r.contains(12287, 2) && !r.contains(0, 1));
  orbite_region_info later{4, 1, 65536, 1, 0, "quantum"};
  orbite::Region u = orbite::detail::region_of(later);
  CHECK(!u.readable() && !u.writable() && u.kind == orbite::MemoryKind::unknown && u.kind_name == "quantum");

  // Stats paths against the header's patterns: `*` takes one segment.
  std::vector<std::string> keys;
  CHECK(orbite::detail::path_matches("ipc.*.copies_by_device.*.bytes", "ipc.nvlink.copies_by_device.1.bytes", keys));
  CHECK(keys.size() == 2 && keys[0] == "nvlink" && keys[1] == "1");
  CHECK(orbite::detail::path_matches("peers", "peers", keys) && keys.empty());
  CHECK(!orbite::detail::path_matches("peers", "peers_alive", keys));
  CHECK(!orbite::detail::path_matches("ipc.*.exports_open", "ipc.shm", keys));
  CHECK(!orbite::detail::path_matches("ipc.*", "ipc.shm.exports_open", keys));
  CHECK(!orbite::detail::path_matches("io.*", "io", keys));
}

static void errors_and_results() {
  // A bad config: the exception carries the status, the call and the key.
  CHECK_THROWS(orbite::Engine("{\"nvlink_stream_count\": 0}"), orbite::Status::invalid_config, "nvlink_stream_count");
  auto bad = orbite::Engine::try_create("{\"no_such_key\": 1}");
  CHECK(!bad && bad.status() == orbite::Status::invalid_config && bad.error().call == "orbite_engine_new");
  CHECK(bad.error().message.find("no_such_key") != std::string::npos);
  CHECK_THROWS(bad.value(), orbite::Status::invalid_config, "orbite_engine_new: ORBITE_STATUS_INVALID_CONFIG: ");

  orbite::Result<void> fine;
  CHECK(fine.ok() && fine.status() == orbite::Status::ok && fine.error().message.empty());
  orbite::Result<int> seven(7);
  CHECK(seven.ok() && *seven == 7 && seven.error().status == orbite::Status::ok);

  // Each thread's failure carries its own message (orbite_last_error is per
  // thread and read right after the failing call).
  orbite::Engine e;
  std::string other;
  std::thread t([&] {
    auto r = e.try_connect("not an endpoint");
    other = r.error().message;
  });
  t.join();
  auto mine = e.try_connect("127.0.0.1:0");
  CHECK(other.find("\"not an endpoint\" is not an endpoint") != std::string::npos);
  CHECK(mine.error().message.find("\"127.0.0.1:0\" is not an endpoint") != std::string::npos);
  CHECK(mine.error().message.find("localhost:port") != std::string::npos);

  // The doctor's JSON, and a bad option named.
  CHECK(orbite::diagnose_json("{\"transport\": \"mnnvl\"}").find("\"layer\":\"driver\"") != std::string::npos);
  auto typo = orbite::try_diagnose_json("{\"transprot\": 1}");
  CHECK(!typo && typo.status() == orbite::Status::invalid_argument && typo.error().call == "orbite_diagnose_json");
  CHECK(typo.error().message.find("transprot") != std::string::npos);

  // Moved-from handles fail cleanly with NULL_ARGUMENT.
  orbite::Engine moved = std::move(e);
  CHECK(!e && moved);
  CHECK(e.try_endpoint().status() == orbite::Status::null_argument);
  orbite::Batch empty;
  CHECK(empty.poll() == orbite::Status::null_argument && empty.size() == 0);
  CHECK(empty.try_result(0).status() == orbite::Status::null_argument);
  CHECK(empty.cancel_request(0).status() == orbite::Status::null_argument);
}

static void memory_ownership() {
  orbite::Engine e;
  CHECK(orbite::retained_allocation_count() == 0);

  // Borrowing: the memory stays the caller's.
  std::vector<std::byte> buf(4096);
  orbite::Registration r = e.register_memory(buf.data(), buf.size(), orbite::Access::read);
  CHECK(r && r.id() != 0 && r.data() == buf.data() && r.size() == 4096 && !r.owns_memory());
  CHECK(r.access() == orbite::Access::read);
  CHECK_THROWS(e.register_memory(buf.data() + 100, 10, orbite::Access::read), orbite::Status::invalid_argument, "overlap");
  orbite::Registration moved = std::move(r);
  CHECK(!r && moved.id() != 0);
  CHECK(moved.unregister(5000ms).ok() && !moved && moved.id() == 0);
  CHECK(moved.unregister().ok());  // empty: nothing to do

  // Co-owning: the registration keeps the allocation; freeing it follows.
  orbite::Allocation a = orbite::Allocation::shared_host(100000);
  CHECK(a && a.size() == 100000 && a.bytes() != nullptr);
  void *where = a.data();
  orbite::Registration owned = e.register_memory(std::move(a), orbite::Access::read_write);
  CHECK(!a && owned.owns_memory() && owned.data() == where && owned.size() == 100000);
  CHECK(owned.allocation()->data() == where);
  owned = orbite::Registration();  // unregisters, then frees the allocation
  CHECK(orbite::retained_allocation_count() == 0);

  // The library refuses to free registered memory: free() says so and keeps it.
  orbite::Allocation b = orbite::Allocation::shared_host(4096);
  orbite::Registration borrowed = e.register_memory(b.data(), b.size(), orbite::Access::read);
  auto refused = b.free();
  CHECK(refused.status() == orbite::Status::unavailable && b);
  CHECK(refused.error().message.find("still registered 1 time(s)") != std::string::npos);
  // Destroyed while registered: leaked on purpose, listed, and freed later.
  { orbite::Allocation gone = std::move(b); }
  CHECK(orbite::retained_allocation_count() == 1);
  CHECK(orbite::free_retained_allocations() == 1);
  CHECK(borrowed.unregister().ok());
  CHECK(orbite::free_retained_allocations() == 0 && orbite::retained_allocation_count() == 0);

  // After close the engine holds no region: unregister says NOT_FOUND and
  // empties the registration; the co-owned allocation can then be freed.
  orbite::Registration last = e.register_memory(orbite::Allocation::shared_host(4096), orbite::Access::read);
  std::weak_ptr<orbite::Allocation> watch = last.allocation();
  CHECK(e.close(5000ms).ok());
  auto nf = last.unregister();
  CHECK(nf.status() == orbite::Status::not_found && !last && watch.expired());
  CHECK(orbite::retained_allocation_count() == 0);
  CHECK(e.try_register_memory(buf.data(), buf.size(), orbite::Access::read).status() == orbite::Status::unavailable);
}

static void transfers() {
  orbite::Engine src("{\"shm_cache_entries\": 2}");
  orbite::Engine req;
  CHECK(src.transports().contains(orbite::Transport::tcp) && src.transports().contains(orbite::Transport::shm));
  CHECK(!src.transports().contains(orbite::Transport::nvlink) && !src.transports().contains(orbite::Transport::automatic));

  // Many regions: the regions JSON outgrows the first buffer (the retry loop).
  std::vector<std::vector<std::byte>> small(40, std::vector<std::byte>(64));
  std::vector<orbite::Registration> regs;
  for (auto &s : small) regs.push_back(src.register_memory(s.data(), s.size(), orbite::Access::read));
  const std::size_t n = 1 << 20;
  std::vector<std::byte> heap(n);
  for (std::size_t i = 0; i < n; i++) heap[i] = std::byte(i * 7 + 1);
  orbite::Registration heap_reg = src.register_memory(heap.data(), n, orbite::Access::read);
  orbite::Registration pool = src.register_memory(orbite::Allocation::shared_host(n), orbite::Access::read_write);
  for (std::size_t i = 0; i < n; i++) pool.bytes()[i] = std::byte(i * 3 + 5);

  std::vector<std::byte> local(n);
  orbite::Registration local_reg = req.register_memory(local.data(), n, orbite::Access::none);
  CHECK_THROWS(req.connect("example.com:1"), orbite::Status::invalid_argument, "localhost:port");
  orbite::Peer peer = req.connect(src.endpoint(), 5000ms);
  // Every transport both offer but CMA, which needs two processes.
  CHECK(src.transports().contains(orbite::Transport::cma) && !peer.transports().contains(orbite::Transport::cma));
  CHECK(peer.id() != 0 && peer.transports().mask() == (src.transports().mask() & ~(1u << ORBITE_TRANSPORT_CMA)));

  std::string text = peer.regions_json();
  CHECK(text.size() > 512);
  std::vector<orbite::Region> regions = peer.regions();
  CHECK(regions.size() == 42);
  const orbite::Region *heap_region = nullptr, *pool_region = nullptr;
  for (const orbite::Region &r : regions) {
    if (r.id == heap_reg.id()) heap_region = &r;
    if (r.id == pool.id()) pool_region = &r;
  }
  CHECK(heap_region && heap_region->addr == heap_reg.address() && heap_region->length == n);
  CHECK(heap_region && heap_region->kind == orbite::MemoryKind::host && heap_region->readable() && !heap_region->writable());
  CHECK(pool_region && pool_region->kind == orbite::MemoryKind::shared_host && pool_region->writable());
  if (!heap_region || !pool_region) return;

  // READ the heap over TCP in 16 requests; each one's transport and outcome.
  std::vector<orbite::Request> reads;
  for (std::size_t k = 0; k < 16; k++)
    reads.push_back(orbite::read_request(local.data() + k * (n / 16), heap_region->addr + k * (n / 16), n / 16));
  orbite::Batch b = peer.submit(reads, {orbite::Transport::automatic, 30000ms});
  CHECK(b.size() == 16);
  CHECK(b.wait(30000ms) == orbite::Status::ok && b.poll() == orbite::Status::ok);
  CHECK(std::memcmp(local.data(), heap.data(), n) == 0);
  for (std::size_t k = 0; k < 16; k++) CHECK(b.transport(k) == orbite::Transport::tcp && b.result(k).ok());
  auto all = b.results();
  CHECK(all.size() == 16 && all[15].status == orbite::Status::ok && all[15].remote_effect == orbite::RemoteEffect::none);
  CHECK_THROWS(b.result(16), orbite::Status::out_of_range, "the batch holds 16 requests");
  CHECK(b.try_transport(16).status() == orbite::Status::out_of_range);
  // Cancelling one ended request changes nothing; past the end is OUT_OF_RANGE.
  CHECK(b.cancel_request(15).ok() && b.result(15).ok());
  auto past = b.cancel_request(16);
  CHECK(past.status() == orbite::Status::out_of_range && past.error().call == "orbite_batch_cancel_request");
  CHECK(past.error().message.find("request index 16") != std::string::npos);

  // Forcing SHM onto the heap region is refused with what to do.
  auto refused = peer.try_submit({orbite::read_request(local.data(), heap_region->addr, 64)}, {orbite::Transport::shm, 0ms});
  CHECK(refused.status() == orbite::Status::not_supported && refused.error().call == "orbite_submit");
  CHECK(refused.error().message.find("orbite_host_allocate_shared") != std::string::npos);

  // The pool over SHM: READ it, then WRITE half of it back.
  orbite::Batch s = peer.submit({orbite::read_request(local.data(), pool_region->addr, n)}, {orbite::Transport::shm, 30000ms});
  CHECK(s.wait(30000ms) == orbite::Status::ok && s.transport(0) == orbite::Transport::shm);
  CHECK(std::memcmp(local.data(), pool.bytes(), n) == 0);
  for (std::size_t i = 0; i < n / 2; i++) local[i] = std::byte(0xee);
  orbite::Batch w = peer.submit({orbite::write_request(local.data(), pool_region->addr + n / 2, n / 2)},
                                {orbite::Transport::shm, 30000ms});
  CHECK(w.wait(30000ms) == orbite::Status::ok);
  CHECK(w.result(0).remote_effect == orbite::RemoteEffect::applied);
  CHECK(pool.bytes()[n / 2] == std::byte(0xee) && pool.bytes()[n - 1] == std::byte(0xee));
  CHECK(pool.bytes()[n / 2 - 1] == std::byte((n / 2 - 1) * 3 + 5));

  // Typed stats: exact counts per transport, the cache, availability.
  orbite::Stats st = req.stats();
  CHECK(st.transport(orbite::Transport::tcp).requests_completed == 16);
  CHECK(st.transport(orbite::Transport::tcp).bytes_completed == n);
  // The 16 READs follow each other on both sides: one frame (coalesce).
  CHECK(st.transport(orbite::Transport::tcp).requests_coalesced == 15);
  CHECK(st.ipc_of(orbite::Transport::shm).copies_issued == 2 && st.ipc_of(orbite::Transport::shm).requests_coalesced == 0);
  CHECK(st.transport(orbite::Transport::shm).requests_completed == 2);
  CHECK(st.transport(orbite::Transport::shm).bytes_completed == n + n / 2);
  CHECK(st.transport(orbite::Transport::mnnvl).requests_completed == 0);
  CHECK(st.peers == 1 && st.peers_alive == 1 && st.regions == 1 && st.inflight_bytes == 0);
  CHECK(st.transports_available.at("tcp") == "available" && st.transports_available.at("shm") == "available");
  // Every path the library reports has its member here (the header's
  // side of the stats schema test), and every number is kept by path.
  CHECK(st.untyped.empty() && st.numbers.at("peers") == 1 && st.numbers.at("transports.tcp.requests_completed") == 16);
  for (const std::string &p : st.untyped) std::fprintf(stderr, "untyped stats path %s\n", p.c_str());
  orbite::Stats served = src.stats();
  CHECK(served.untyped.empty() && served.io.threads > 0 && !served.io.connections_per_thread.empty());
  // The source served what arrived: one READ of the whole range.
  CHECK(served.transport(orbite::Transport::tcp).served_requests == 1);
  CHECK(served.regions == 42);
  // req's relocation cache (on by default) keeps one import of the pool (the
  // writable one, which replaced the READ-only one), src one export; the
  // flush gives them back.
  CHECK(st.ipc_of(orbite::Transport::shm).imports_cached == 1 && served.ipc_of(orbite::Transport::shm).exports_open == 1);
  CHECK(req.flush_import_cache(5000ms).ok());
  CHECK(req.stats().ipc_of(orbite::Transport::shm).imports_cached == 0);
  CHECK(src.stats().ipc_of(orbite::Transport::shm).exports_open == 0);

  // A batch outlives its engine: free every owner of `req`, then read it.
  orbite::Batch late = peer.submit(reads, {orbite::Transport::tcp, 30000ms});
  {
    orbite::Engine gone = std::move(req);
    orbite::Peer p = std::move(peer);
    orbite::Registration r = std::move(local_reg);
  }  // orbite_engine_free ran here: the connection is closed and its threads joined
  orbite::Status ended = late.wait(30000ms);
  CHECK(ended == orbite::Status::ok || ended == orbite::Status::transfer_failed);
  for (const orbite::RequestResult &r : late.results()) {
    CHECK(r.status == orbite::Status::ok || r.status == orbite::Status::unavailable);
    CHECK(r.remote_effect == orbite::RemoteEffect::none);
  }
  CHECK(late.transport(0) == orbite::Transport::tcp);
  CHECK(src.close(10000ms).ok());
}

// Direct routes: one region of a same-host peer, one request at a time on
// this thread; exact bytes, outcomes, refusals, and the C boundary's checks.
static void direct_routes() {
  orbite::Engine src;
  orbite::Engine req;
  const std::size_t n = 1 << 16;
  orbite::Registration pool = src.register_memory(orbite::Allocation::shared_host(n), orbite::Access::read_write);
  for (std::size_t i = 0; i < n; i++) pool.bytes()[i] = std::byte(i * 3 + 5);
  std::vector<std::byte> heap(4096);
  orbite::Registration heap_reg = src.register_memory(heap.data(), heap.size(), orbite::Access::read);
  std::vector<std::byte> local(n);
  orbite::Registration local_reg = req.register_memory(local.data(), n, orbite::Access::none);
  orbite::Peer peer = req.connect(src.endpoint(), 5000ms);

  orbite::Direct d = peer.direct(pool.address(), n);
  CHECK(bool(d));
  orbite::RequestResult r = d.copy(orbite::read_request(local.data(), pool.address() + 100, 4096));
  CHECK(r.ok() && r.remote_effect == orbite::RemoteEffect::none);
  CHECK(std::memcmp(local.data(), pool.bytes() + 100, 4096) == 0);
  for (std::size_t i = 0; i < 512; i++) local[i] = std::byte(0xab);
  r = d.copy(orbite::write_request(local.data(), pool.address() + 8192, 512));
  CHECK(r.ok() && r.remote_effect == orbite::RemoteEffect::applied);
  CHECK(pool.bytes()[8192] == std::byte(0xab) && pool.bytes()[8192 + 511] == std::byte(0xab));
  CHECK(pool.bytes()[8192 + 512] == std::byte((8192 + 512) * 3 + 5));
  // A range past the region: the request's outcome, with why.
  r = d.copy(orbite::read_request(local.data(), pool.address() + n - 8, 16));
  CHECK(r.status == orbite::Status::out_of_range && r.remote_effect == orbite::RemoteEffect::none);
  CHECK(std::string(orbite_last_error()).find("outside region") != std::string::npos);
  // Refused calls: local memory not registered; the peer's plain host memory.
  std::vector<std::byte> stray(64);
  auto refused = d.try_copy(orbite::read_request(stray.data(), pool.address(), 64));
  CHECK(refused.status() == orbite::Status::not_found && refused.error().call == "orbite_direct_copy");
  auto no_route = peer.try_direct(heap_reg.address(), heap.size());
  CHECK(no_route.status() == orbite::Status::unavailable && no_route.error().call == "orbite_direct_open");
  CHECK(no_route.error().message.find("cannot carry the peer's host memory") != std::string::npos);
  CHECK(peer.try_direct(pool.address(), 64, orbite::Transport::tcp).status() == orbite::Status::not_supported);
  CHECK(req.stats().transport(orbite::Transport::shm).requests_completed == 2);
  CHECK(req.stats().transport(orbite::Transport::shm).requests_failed == 1);

  // The C boundary: NULLs, a handle of another type, an unknown opcode.
  orbite_request_result out{99, 99};
  orbite_request q = orbite::read_request(local.data(), pool.address(), 64);
  CHECK(orbite_direct_copy(nullptr, nullptr, &q, 0, &out) == ORBITE_STATUS_NULL_ARGUMENT);
  orbite_engine *e = nullptr;
  CHECK(orbite_engine_new("{}", &e) == ORBITE_STATUS_OK);
  CHECK(orbite_direct_copy(e, reinterpret_cast<orbite_direct *>(e), &q, 0, &out) == ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(orbite_last_error()).find("not an orbite_direct") != std::string::npos);
  orbite_direct *raw = nullptr;
  CHECK(orbite_direct_open(e, peer.id(), pool.address(), 64, 77, 0, &raw) == ORBITE_STATUS_INVALID_ARGUMENT && !raw);
  orbite_request bad = q;
  bad.opcode = 9;
  CHECK(d.try_copy(bad).status() == orbite::Status::invalid_argument);
  CHECK(orbite_direct_open(nullptr, peer.id(), pool.address(), 64, 0, 0, &raw) == ORBITE_STATUS_NULL_ARGUMENT);
  orbite_engine_free(e);
  CHECK(out.status == 99 && out.remote_effect == 99);
  orbite_direct_free(nullptr);
  CHECK(req.close(10000ms).ok() && src.close(10000ms).ok());
}

// Notifications: a long message outgrows take's first buffer (it stays
// queued and is taken again), a WRITE carries one, TIMED_OUT when none.
static void notifications() {
  orbite::Engine rx("{\"name\": \"rx\"}");
  orbite::Engine tx("{\"name\": \"tx\"}");
  std::vector<std::byte> buf(4096);
  orbite::Registration pool = rx.register_memory(buf.data(), buf.size(), orbite::Access::write);
  std::vector<std::byte> local(4096, std::byte(9));
  orbite::Registration local_reg = tx.register_memory(local.data(), local.size(), orbite::Access::none);
  orbite::Peer peer = tx.connect(rx.endpoint());
  std::string long_msg(1000, 'k');
  peer.notify(long_msg);
  orbite::Notification n = rx.take_notification(10000ms);
  CHECK(n.sender == "tx" && n.msg == long_msg);
  std::vector<orbite::Request> w{{ORBITE_OP_WRITE, reinterpret_cast<std::uint64_t>(local.data()),
                                  reinterpret_cast<std::uint64_t>(buf.data()), 4096}};
  orbite::Batch b = peer.submit_notify(w, "in place");
  CHECK(b.wait(60000ms) == orbite::Status::ok);
  CHECK(b.notes().empty());
  n = rx.take_notification(10000ms);
  CHECK(n.msg == "in place" && buf[4095] == std::byte(9));
  // A READ of the write-only region fails: nothing is sent, Batch::notes says why.
  std::vector<orbite::Request> denied{orbite::read_request(local.data(), reinterpret_cast<std::uint64_t>(buf.data()), 512)};
  orbite::Batch refused = peer.submit_notify(denied, "never");
  CHECK(refused.wait(60000ms) == orbite::Status::transfer_failed);
  std::vector<std::string> notes = refused.notes();
  CHECK(notes.size() == 1 && notes[0].find("notification not sent") != std::string::npos);
  CHECK_THROWS(rx.take_notification(0ms), orbite::Status::timed_out, "no notification");
  // Typed: both notifications delivered and taken, no discovery, the one
  // connection on an I/O thread.
  orbite::Stats sent = tx.stats();
  orbite::Stats got = rx.stats();
  CHECK(sent.notifications.sent == 2 && sent.notifications.delivered == 2 && sent.notifications.refused == 0);
  CHECK(got.notifications.received == 2 && got.notifications.queued == 0 && got.notifications.rejected == 0);
  CHECK(!sent.discovery.enabled && !sent.discovery.connected && sent.discovery.watched == 0);
  CHECK(sent.io.threads >= 1 && sent.io.threads <= sent.io.threads_max);
  CHECK(sent.io.connections_per_thread.size() == sent.io.threads);
  std::uint64_t served = 0;
  for (std::uint64_t c : sent.io.connections_per_thread) served += c;
  CHECK(served == 1);
  CHECK(sent.revokes_received == 0 && sent.revoke_passes == 0);
}

// The log callback (orbite::set_log_callback): the lines of an engine's start
// and close at their levels, a callback that throws (the exception stays on
// the C++ side), no change from inside the callback, and stderr restored.
static void logging() {
  unsetenv("ORBITE_LOG");  // the test's environment decides nothing
  CHECK(static_cast<std::uint32_t>(orbite::LogLevel::trace) == ORBITE_LOG_TRACE);
  CHECK(std::string(orbite::log_level_name(orbite::LogLevel::warn)) == "warn");
  std::mutex mu;
  std::vector<std::pair<orbite::LogLevel, std::string>> got;
  orbite::Result<void> inside = orbite::Result<void>();
  bool change_inside = false;
  orbite::set_log_callback([&](orbite::LogLevel level, std::string_view line) {
    std::lock_guard<std::mutex> g(mu);
    got.emplace_back(level, std::string(line));
    if (change_inside) inside = orbite::try_set_log_callback(nullptr);
  });
  std::string ep;
  {
    orbite::Engine e(R"({"name": "cpplog", "log_level": "info"})");
    ep = e.endpoint();
    CHECK(e.close(10000ms).ok());
  }
  {
    std::lock_guard<std::mutex> g(mu);
    CHECK(got.size() == 2);
    if (got.size() == 2) {
      std::string label = "[cpplog " + ep + "] ";
      CHECK(got[0].first == orbite::LogLevel::info && got[0].second.rfind(label + "engine started (transports: tcp", 0) == 0);
      CHECK(got[1].first == orbite::LogLevel::info && got[1].second == label + "engine closed");
    }
    got.clear();
    change_inside = true;
  }
  { orbite::Engine e(R"({"log_level": "info"})"); }
  CHECK(inside.status() == orbite::Status::unavailable);
  CHECK(got.size() == 2);  // still installed: the start and the stop
  // A throwing callback: the library never sees the exception.
  int thrown = 0;
  orbite::set_log_callback([&](orbite::LogLevel, std::string_view) {
    thrown++;
    throw std::runtime_error("from the log callback");
  });
  {
    orbite::Engine e(R"({"log_level": "info"})");
    CHECK(e.close(10000ms).ok());
  }
  CHECK(thrown == 2);
  orbite::set_log_callback(nullptr);
  { orbite::Engine quiet; }
  CHECK(thrown == 2);
  CHECK_THROWS(orbite::Engine(R"({"log_level": "loud"})"), orbite::Status::invalid_config, "`log_level`");
}

int main() {
  CHECK(orbite::abi_matches() && orbite::version() == ORBITE_VERSION_STRING);
  CHECK(std::string(orbite::status_name(orbite::Status::unquiesced)) == "ORBITE_STATUS_UNQUIESCED");
  typed_views();
  errors_and_results();
  memory_ownership();
  transfers();
  direct_routes();
  notifications();
  logging();
  if (failures) {
    std::fprintf(stderr, "test_cpp_api: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("test_cpp_api: all checks passed\n");
  return 0;
}
