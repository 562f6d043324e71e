/*
 * orbite/values.hpp - part of orbite.hpp (include that).
 *
 * TransportSet, Request, SubmitOptions and RequestResult.
 */
#ifndef ORBITE_VALUES_HPP
#define ORBITE_VALUES_HPP

#include "base.hpp"

namespace orbite {

// ---- small value types ------------------------------------------------------

/// A set of transports (orbite_engine_transports / orbite_peer_transports).
class TransportSet {
 public:
  explicit TransportSet(std::uint32_t mask = 0) noexcept : mask_(mask) {}
  bool contains(Transport t) const noexcept {
    auto bit = static_cast<std::uint32_t>(t);
    return t != Transport::automatic && bit < 32 && ((mask_ >> bit) & 1u) != 0;
  }
  bool empty() const noexcept { return mask_ == 0; }
  std::uint32_t mask() const noexcept { return mask_; }

 private:
  std::uint32_t mask_;
};

/// One request: the C struct itself, so a std::vector<Request> goes to
/// orbite_submit as it is. Build it with read_request / write_request.
using Request = orbite_request;

/// READ `length` bytes at the peer's absolute address `remote` into `local`.
inline Request read_request(void *local, std::uint64_t remote, std::uint64_t length) noexcept {
  return Request{ORBITE_OP_READ, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(local)), remote, length};
}

/// WRITE `length` bytes from `local` to the peer's absolute address `remote`.
inline Request write_request(const void *local, std::uint64_t remote, std::uint64_t length) noexcept {
  return Request{ORBITE_OP_WRITE, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(local)), remote, length};
}

/// Submission options: the transport (automatic: the policy chooses; a
/// specific one is used or the submit fails: UNAVAILABLE when the peer or
/// this engine cannot use it now, NOT_SUPPORTED when a request's memory does
/// not suit it) and the deadline (0: the engine's default_timeout_ms).
struct SubmitOptions {
  Transport transport = Transport::automatic;
  std::chrono::milliseconds timeout{0};
};

/// One request's outcome.
struct RequestResult {
  Status status = Status::pending;
  RemoteEffect remote_effect = RemoteEffect::none;
  bool ok() const noexcept { return status == Status::ok; }
};

}  // namespace orbite

#endif  // ORBITE_VALUES_HPP
