/*
 * orbite/peer.hpp - part of orbite.hpp (include that).
 *
 * Peer: a connected peer, its regions, transports and submissions; Direct:
 * a direct route to one of its regions.
 */
#ifndef ORBITE_PEER_HPP
#define ORBITE_PEER_HPP

#include "batch.hpp"
#include "stats.hpp"

namespace orbite {

// ---- Direct -----------------------------------------------------------------

/// A direct route to one region of a same-host peer (orbite_direct_open):
/// copies one request at a time on the calling thread through the engine's
/// relocation cache and the peer's grants, each ending before copy()
/// returns. Move-only; keeps its engine alive; usable from several threads.
class Direct {
 public:
  Direct() noexcept = default;
  Direct(Direct &&o) noexcept : engine_(std::move(o.engine_)), d_(std::exchange(o.d_, nullptr)) {}
  Direct &operator=(Direct &&o) noexcept {
    if (this != &o) {
      orbite_direct_free(d_);
      engine_ = std::move(o.engine_);
      d_ = std::exchange(o.d_, nullptr);
    }
    return *this;
  }
  Direct(const Direct &) = delete;
  Direct &operator=(const Direct &) = delete;
  ~Direct() { orbite_direct_free(d_); }

  explicit operator bool() const noexcept { return d_ != nullptr; }

  /// Copies `r` and returns its outcome (a failed request's status is in
  /// the result, and orbite_last_error() says why); the call fails, with
  /// nothing moved, when the request is refused before it starts (local
  /// memory not registered, the engine closed).
  RequestResult copy(const Request &r, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    return try_copy(r, timeout).value();
  }
  Result<RequestResult> try_copy(const Request &r,
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    orbite_request_result out{};
    orbite_status s = orbite_direct_copy(engine_ ? engine_->engine : nullptr, d_, &r, detail::millis(timeout), &out);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_direct_copy");
    return RequestResult{static_cast<Status>(out.status), static_cast<RemoteEffect>(out.remote_effect)};
  }

 private:
  friend class Peer;
  Direct(std::shared_ptr<detail::EngineHandle> e, orbite_direct *d) noexcept : engine_(std::move(e)), d_(d) {}

  std::shared_ptr<detail::EngineHandle> engine_;
  orbite_direct *d_ = nullptr;
};

// ---- Peer -------------------------------------------------------------------

/// A connected peer (orbite_connect). Move-only; keeps its engine alive.
/// Destroying a Peer does not disconnect it: call disconnect(), or close the
/// engine.
class Peer {
 public:
  Peer() noexcept = default;
  Peer(Peer &&o) noexcept : engine_(std::move(o.engine_)), id_(std::exchange(o.id_, 0)) {}
  Peer &operator=(Peer &&o) noexcept {
    if (this != &o) {
      engine_ = std::move(o.engine_);
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  Peer(const Peer &) = delete;
  Peer &operator=(const Peer &) = delete;
  ~Peer() = default;

  std::uint64_t id() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ != 0; }

  /// The regions the peer publishes now (asks the peer).
  std::vector<Region> regions() const { return try_regions().value(); }
  Result<std::vector<Region>> try_regions() const {
    std::vector<orbite_region_info> buf(64);
    for (int attempt = 0;; ++attempt) {
      std::size_t n = 0;
      orbite_status st = orbite_peer_regions(raw(), id_, buf.data(), buf.size(), &n);
      if (st == ORBITE_STATUS_OK) {
        std::vector<Region> out;
        out.reserve(n);
        for (std::size_t i = 0; i < n; ++i) out.push_back(detail::region_of(buf[i]));
        return out;
      }
      // The peer may publish more between two calls.
      if (st != ORBITE_STATUS_BUFFER_TOO_SMALL || attempt == 15) return detail::failure(st, "orbite_peer_regions");
      buf.resize(n > 2 * buf.size() ? n : 2 * buf.size());
    }
  }
  /// The same as JSON text.
  std::string regions_json() const { return try_regions_json().value(); }
  Result<std::string> try_regions_json() const {
    orbite_engine *e = raw();
    std::uint64_t id = id_;
    return detail::text("orbite_peer_regions_json", [e, id](char *buf, std::size_t cap, std::size_t *len) {
      return orbite_peer_regions_json(e, id, buf, cap, len);
    });
  }

  /// The transports both engines can use with each other now (empty once
  /// the peer is gone).
  TransportSet transports() const { return try_transports().value(); }
  Result<TransportSet> try_transports() const {
    std::uint32_t m = 0;
    orbite_status s = orbite_peer_transports(raw(), id_, &m);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_peer_transports");
    return TransportSet(m);
  }

  /// Submits `count` requests; returns once they are admitted. Local problems
  /// fail the call; what happens at the peer is per request in the Batch.
  Batch submit(const Request *requests, std::size_t count, const SubmitOptions &opts = {}) {
    return try_submit(requests, count, opts).value();
  }
  Batch submit(const std::vector<Request> &requests, const SubmitOptions &opts = {}) {
    return try_submit(requests.data(), requests.size(), opts).value();
  }
  Result<Batch> try_submit(const std::vector<Request> &requests, const SubmitOptions &opts = {}) {
    return try_submit(requests.data(), requests.size(), opts);
  }
  Result<Batch> try_submit(const Request *requests, std::size_t count, const SubmitOptions &opts = {}) {
    orbite_submit_options o{static_cast<std::uint32_t>(opts.transport), detail::millis(opts.timeout)};
    orbite_batch *b = nullptr;
    orbite_status s = orbite_submit(raw(), id_, requests, count, &o, &b);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_submit");
    return Batch(b, count);
  }

  /// Sends `msg` to the peer once every request submitted to it before the
  /// call has ended there; returns once the peer queued it (up to `timeout`,
  /// 0: the engine's default). RESOURCE_EXHAUSTED: the peer's queue is full.
  void notify(const std::string &msg, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    try_notify(msg, timeout).value();
  }
  Result<void> try_notify(const std::string &msg, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return detail::done(orbite_notify(raw(), id_, msg.data(), msg.size(), detail::millis(timeout)), "orbite_notify");
  }

  /// Submits as submit() does, with `msg` delivered to the peer after every
  /// byte of the batch is visible in its memory; not sent when a request
  /// fails. The Batch ends once the notification's outcome is known.
  Batch submit_notify(const std::vector<Request> &requests, const std::string &msg, const SubmitOptions &opts = {}) {
    return try_submit_notify(requests.data(), requests.size(), msg, opts).value();
  }
  Result<Batch> try_submit_notify(const Request *requests, std::size_t count, const std::string &msg,
                                  const SubmitOptions &opts = {}) {
    orbite_submit_options o{static_cast<std::uint32_t>(opts.transport), detail::millis(opts.timeout)};
    orbite_batch *b = nullptr;
    orbite_status s = orbite_submit_notify(raw(), id_, requests, count, &o, msg.data(), msg.size(), &b);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_submit_notify");
    return Batch(b, count);
  }

  /// Opens a direct route to the peer's region holding [remote, remote+length)
  /// (orbite_direct_open; asks the peer for its regions once).
  Direct direct(std::uint64_t remote, std::uint64_t length, Transport t = Transport::automatic,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return try_direct(remote, length, t, timeout).value();
  }
  Result<Direct> try_direct(std::uint64_t remote, std::uint64_t length, Transport t = Transport::automatic,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    orbite_direct *d = nullptr;
    orbite_status s = orbite_direct_open(raw(), id_, remote, length, static_cast<std::uint32_t>(t),
                                         detail::millis(timeout), &d);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_direct_open");
    return Direct(engine_, d);
  }

  /// Disconnects after the peer's outstanding requests end (up to `timeout`,
  /// 0: the engine's default). The Peer is empty after OK.
  Result<void> disconnect(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    Result<void> r = detail::done(orbite_disconnect(raw(), id_, detail::millis(timeout)), "orbite_disconnect");
    if (r.ok()) {
      id_ = 0;
      engine_.reset();
    }
    return r;
  }

 private:
  friend class Engine;
  Peer(std::shared_ptr<detail::EngineHandle> e, std::uint64_t id) noexcept : engine_(std::move(e)), id_(id) {}
  orbite_engine *raw() const noexcept { return engine_ ? engine_->engine : nullptr; }

  std::shared_ptr<detail::EngineHandle> engine_;
  std::uint64_t id_ = 0;
};

}  // namespace orbite

#endif  // ORBITE_PEER_HPP
