/*
 * orbite/engine.hpp - part of orbite.hpp (include that).
 *
 * Engine: the life cycle, memory, peers, stats and notifications.
 */
#ifndef ORBITE_ENGINE_HPP
#define ORBITE_ENGINE_HPP

#include "peer.hpp"
#include "registration.hpp"
#include "log.hpp"

namespace orbite {

// ---- Engine -----------------------------------------------------------------

/// A notification received (Engine::take_notification).
struct Notification {
  /// The sender's engine name, or its endpoint when it has none.
  std::string sender;
  /// The message (any bytes).
  std::string msg;
};

/// An engine (orbite_engine_new). Move-only. Shares its orbite_engine with
/// the Registrations and Peers made from it; the last of them frees it.
class Engine {
 public:
  /// An engine from a JSON config ("" or "{}": every default; see
  /// docs/config.md). Throws Error(INVALID_CONFIG naming the key).
  explicit Engine(const std::string &config_json = std::string()) : Engine(try_create(config_json).value()) {}
  static Result<Engine> try_create(const std::string &config_json = std::string()) {
    orbite_engine *e = nullptr;
    orbite_status s = orbite_engine_new(config_json.c_str(), &e);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_engine_new");
    std::shared_ptr<detail::EngineHandle> h;
    try {
      h = std::make_shared<detail::EngineHandle>(e);
    } catch (...) {
      orbite_engine_free(e);
      throw;
    }
    return Engine(std::move(h));
  }
  Engine(Engine &&) noexcept = default;
  Engine &operator=(Engine &&) noexcept = default;
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;
  ~Engine() = default;

  /// The C handle (for C calls this header does not wrap); null when moved from.
  orbite_engine *get() const noexcept { return h_ ? h_->engine : nullptr; }
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /// "IP:port" for peers to connect to.
  std::string endpoint() const { return try_endpoint().value(); }
  Result<std::string> try_endpoint() const {
    return detail::text_of("orbite_engine_endpoint", orbite_engine_endpoint, get());
  }

  /// A typed snapshot of the counters.
  Stats stats() const { return try_stats().value(); }
  Result<Stats> try_stats() const {
    orbite_stats *snap = nullptr;
    orbite_status st = orbite_engine_stats(get(), &snap);
    if (st != ORBITE_STATUS_OK) return detail::failure(st, "orbite_engine_stats");
    std::unique_ptr<orbite_stats, void (*)(orbite_stats *)> held(snap, orbite_stats_free);
    return detail::stats_of(held.get());
  }
  std::string stats_json() const { return try_stats_json().value(); }
  Result<std::string> try_stats_json() const {
    return detail::text_of("orbite_engine_stats_json", orbite_engine_stats_json, get());
  }

  /// The transports this engine offers.
  TransportSet transports() const { return try_transports().value(); }
  Result<TransportSet> try_transports() const {
    std::uint32_t m = 0;
    orbite_status s = orbite_engine_transports(get(), &m);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_engine_transports");
    return TransportSet(m);
  }

  /// Registers memory the caller owns (BORROWED: keep it valid until the
  /// Registration is unregistered or the engine closed or freed).
  Registration register_memory(void *addr, std::size_t length, Access access) {
    return try_register_memory(addr, length, access).value();
  }
  Result<Registration> try_register_memory(void *addr, std::size_t length, Access access) {
    return reg(addr, length, access, nullptr);
  }
  /// Registers a library allocation, whole, and CO-OWNS it: it is freed only
  /// after the region is unregistered and the last owner lets go.
  Registration register_memory(std::shared_ptr<Allocation> memory, Access access) {
    return try_register_memory(std::move(memory), access).value();
  }
  Result<Registration> try_register_memory(std::shared_ptr<Allocation> memory, Access access) {
    if (!memory || !*memory)
      return Failure{Status::null_argument, "orbite_register_memory", "the allocation is empty"};
    void *addr = memory->data();
    std::size_t len = memory->size();
    return reg(addr, len, access, std::move(memory));
  }
  Registration register_memory(Allocation &&memory, Access access) {
    return register_memory(std::make_shared<Allocation>(std::move(memory)), access);
  }
  Result<Registration> try_register_memory(Allocation &&memory, Access access) {
    return try_register_memory(std::make_shared<Allocation>(std::move(memory)), access);
  }

  /// Connects to a peer's endpoint ("IP:port" or "localhost:port"); `timeout`
  /// 0 is the engine's default.
  Peer connect(const std::string &endpoint, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return try_connect(endpoint, timeout).value();
  }
  Result<Peer> try_connect(const std::string &endpoint, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    std::uint64_t id = 0;
    orbite_status s = orbite_connect(get(), endpoint.c_str(), detail::millis(timeout), &id);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_connect");
    return Peer(h_, id);
  }

  /// Connects to the live engine named `name`, found through discovery
  /// (config "discovery"). NOT_FOUND: no such live engine; UNAVAILABLE: no
  /// discovery, or etcd out of reach within `timeout`.
  Peer connect_name(const std::string &name, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return try_connect_name(name, timeout).value();
  }
  Result<Peer> try_connect_name(const std::string &name,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    std::uint64_t id = 0;
    orbite_status s = orbite_connect_name(get(), name.c_str(), detail::millis(timeout), &id);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_connect_name");
    return Peer(h_, id);
  }

  /// Closes this engine's cached imports (SHM and NVLink) through their
  /// receipts, so the peers' exports are released; submissions continue.
  /// UNQUIESCED: some stay retained (see stats().ipc).
  Result<void> flush_import_cache(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return detail::done(orbite_flush_nvlink_cache(get(), detail::millis(timeout)), "orbite_flush_nvlink_cache");
  }
  /// Fences new submissions, waits for accepted ones, closes imports and
  /// outgoing connections.
  Result<void> close_requester(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return detail::done(orbite_close_requester(get(), detail::millis(timeout)), "orbite_close_requester");
  }
  /// Stops serving, waits for requests being served and for every export's
  /// close receipt.
  Result<void> close_source(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return detail::done(orbite_close_source(get(), detail::millis(timeout)), "orbite_close_source");
  }
  /// Takes the oldest notification received, waiting up to `timeout` (0: do
  /// not wait). TIMED_OUT when none came.
  Notification take_notification(std::chrono::milliseconds timeout) { return try_take_notification(timeout).value(); }
  Result<Notification> try_take_notification(std::chrono::milliseconds timeout) {
    char sender[128];
    std::string msg(256, '\0');
    std::size_t len = 0;
    std::uint32_t ms = detail::millis(timeout);
    for (;;) {
      orbite_status s = orbite_notification_take(get(), ms, sender, sizeof sender, &msg[0], msg.size(), &len);
      if (s == ORBITE_STATUS_OK) {
        msg.resize(len);
        return Notification{sender, std::move(msg)};
      }
      // Too small: it stays queued; take it again with room for it.
      if (s != ORBITE_STATUS_BUFFER_TOO_SMALL || len <= msg.size()) return detail::failure(s, "orbite_notification_take");
      msg.assign(len, '\0');
    }
  }

  /// The orderly close: the requester half, then the source half, then the
  /// engine stops (its regions are unregistered, so co-owned allocations can
  /// be freed). Separate from any destructor; see the header comment for what
  /// TIMED_OUT and UNQUIESCED leave behind.
  Result<void> close(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return detail::done(orbite_close(get(), detail::millis(timeout)), "orbite_close");
  }

 private:
  explicit Engine(std::shared_ptr<detail::EngineHandle> h) noexcept : h_(std::move(h)) {}

  Result<Registration> reg(void *addr, std::size_t length, Access access, std::shared_ptr<Allocation> memory) {
    std::uint64_t id = 0;
    orbite_status s = orbite_register_memory(get(), addr, length, static_cast<std::uint32_t>(access), &id);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_register_memory");
    return Registration(h_, id, addr, length, access, std::move(memory));
  }

  std::shared_ptr<detail::EngineHandle> h_;
};

/// orbite_cuda_retained_resources_json: the CUDA driver as probed and what
/// every live engine of the process retains after unconfirmed cleanups.
inline std::string cuda_retained_resources_json() {
  return detail::text("orbite_cuda_retained_resources_json", [](char *buf, std::size_t cap, std::size_t *len) {
           return orbite_cuda_retained_resources_json(buf, cap, len);
         }).value();
}

}  // namespace orbite

#endif  // ORBITE_ENGINE_HPP
