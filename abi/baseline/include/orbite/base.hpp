/*
 * orbite/base.hpp - part of orbite.hpp (include that).
 *
 * Constants, Status, Failure, Error and Result; the C-call helpers (a
 * failure read on the failing thread, the text-buffer retry loop) and the
 * engine handle the other types share.
 */
#ifndef ORBITE_BASE_HPP
#define ORBITE_BASE_HPP

#include <orbite.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace orbite {

// ---- constants --------------------------------------------------------------

/// orbite_status as a C++ enumeration (same values).
enum class Status : std::uint32_t {
  ok = ORBITE_STATUS_OK,
  pending = ORBITE_STATUS_PENDING,
  null_argument = ORBITE_STATUS_NULL_ARGUMENT,
  invalid_argument = ORBITE_STATUS_INVALID_ARGUMENT,
  invalid_config = ORBITE_STATUS_INVALID_CONFIG,
  not_found = ORBITE_STATUS_NOT_FOUND,
  out_of_range = ORBITE_STATUS_OUT_OF_RANGE,
  permission_denied = ORBITE_STATUS_PERMISSION_DENIED,
  unavailable = ORBITE_STATUS_UNAVAILABLE,
  resource_exhausted = ORBITE_STATUS_RESOURCE_EXHAUSTED,
  timed_out = ORBITE_STATUS_TIMED_OUT,
  stale_peer = ORBITE_STATUS_STALE_PEER,
  unquiesced = ORBITE_STATUS_UNQUIESCED,
  transfer_failed = ORBITE_STATUS_TRANSFER_FAILED,
  protocol_error = ORBITE_STATUS_PROTOCOL_ERROR,
  not_supported = ORBITE_STATUS_NOT_SUPPORTED,
  cuda_error = ORBITE_STATUS_CUDA_ERROR,
  io_error = ORBITE_STATUS_IO_ERROR,
  buffer_too_small = ORBITE_STATUS_BUFFER_TOO_SMALL,
  cancelled = ORBITE_STATUS_CANCELLED,
  panic = ORBITE_STATUS_PANIC,
};

/// "ORBITE_STATUS_OK", ... (static storage; unknown values give "ORBITE_STATUS_UNKNOWN").
inline const char *status_name(Status s) noexcept { return orbite_status_name(static_cast<std::uint32_t>(s)); }

/// ORBITE_TRANSPORT_*. `automatic` lets the engine's transport_policy choose.
enum class Transport : std::uint32_t {
  automatic = ORBITE_TRANSPORT_AUTO,
  tcp = ORBITE_TRANSPORT_TCP,
  shm = ORBITE_TRANSPORT_SHM,
  nvlink = ORBITE_TRANSPORT_NVLINK,
  mnnvl = ORBITE_TRANSPORT_MNNVL,
  cma = ORBITE_TRANSPORT_CMA,
};

/// "auto", "tcp", "shm", "nvlink", "mnnvl", "cma" (the names the stats JSON uses).
inline const char *transport_name(Transport t) noexcept {
  switch (t) {
    case Transport::automatic: return "auto";
    case Transport::tcp: return "tcp";
    case Transport::shm: return "shm";
    case Transport::nvlink: return "nvlink";
    case Transport::mnnvl: return "mnnvl";
    case Transport::cma: return "cma";
  }
  return "unknown";
}

/// ORBITE_OP_*.
enum class Op : std::uint32_t { read = ORBITE_OP_READ, write = ORBITE_OP_WRITE };

/// ORBITE_REMOTE_EFFECT_*: what a request did to the peer's memory.
enum class RemoteEffect : std::uint32_t {
  none = ORBITE_REMOTE_EFFECT_NONE,
  applied = ORBITE_REMOTE_EFFECT_APPLIED,
  unknown = ORBITE_REMOTE_EFFECT_UNKNOWN,
};

/// ORBITE_ACCESS_* bit flags: what peers may do to a region.
enum class Access : std::uint32_t {
  none = 0,
  read = ORBITE_ACCESS_READ,
  write = ORBITE_ACCESS_WRITE,
  read_write = ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE,
};
constexpr Access operator|(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr bool has(Access set, Access flag) noexcept {
  return (static_cast<std::uint32_t>(set) & static_cast<std::uint32_t>(flag)) == static_cast<std::uint32_t>(flag);
}

/// The memory kinds a peer's region can have (the "kind" key).
enum class MemoryKind { host, shared_host, cuda, cuda_ipc, pinned_host, mnnvl, egm, unknown };

/// Library version "MAJOR.MINOR.PATCH" and ABI version of the loaded library.
inline std::string version() { return orbite_version(); }
inline std::uint32_t abi_version() noexcept { return orbite_abi_version(); }
/// Whether the loaded library has the ABI this header was compiled against.
inline bool abi_matches() noexcept { return orbite_abi_version() == ORBITE_ABI_VERSION; }

/// orbite_last_error() of the calling thread, as a string ("" if none).
inline std::string last_error() {
  const char *m = orbite_last_error();
  return m ? m : "";
}

// ---- errors -----------------------------------------------------------------

/// One failed call: its status, the function that failed and the library's
/// message (orbite_last_error() on the failing thread, right after the call).
struct Failure {
  Status status = Status::ok;
  std::string call;
  std::string message;

  /// "orbite_connect: ORBITE_STATUS_UNAVAILABLE: <message>".
  std::string describe() const { return call + ": " + status_name(status) + ": " + message; }
};

/// The exception every throwing call raises.
class Error : public std::runtime_error {
 public:
  explicit Error(Failure f) : std::runtime_error(f.describe()), failure_(std::move(f)) {}
  Status status() const noexcept { return failure_.status; }
  const std::string &call() const noexcept { return failure_.call; }
  const std::string &message() const noexcept { return failure_.message; }
  const Failure &failure() const noexcept { return failure_; }

 private:
  Failure failure_;
};

namespace detail {
inline const Failure &no_failure() {
  static const Failure none{};
  return none;
}
}  // namespace detail

/// A value or a Failure (the non-throwing, expected-style form).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(Failure failure) : v_(std::in_place_index<1>, std::move(failure)) {}

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  /// Status::ok, or the failure's status.
  Status status() const noexcept { return ok() ? Status::ok : std::get<1>(v_).status; }
  /// The failure (an empty one with Status::ok when ok()).
  const Failure &error() const noexcept { return ok() ? detail::no_failure() : std::get<1>(v_); }
  /// The value; throws Error when !ok().
  T &value() & {
    check();
    return std::get<0>(v_);
  }
  const T &value() const & {
    check();
    return std::get<0>(v_);
  }
  T &&value() && {
    check();
    return std::get<0>(std::move(v_));
  }
  T &operator*() & { return value(); }
  const T &operator*() const & { return value(); }
  T &&operator*() && { return std::move(*this).value(); }
  T *operator->() { return &value(); }
  const T *operator->() const { return &value(); }

 private:
  void check() const {
    if (!ok()) throw Error(std::get<1>(v_));
  }
  std::variant<T, Failure> v_;
};

/// The outcome of a call that returns nothing (close, unregister, ...).
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Failure failure) : failure_(std::move(failure)) {}

  bool ok() const noexcept { return !failure_; }
  explicit operator bool() const noexcept { return ok(); }
  Status status() const noexcept { return failure_ ? failure_->status : Status::ok; }
  const Failure &error() const noexcept { return failure_ ? *failure_ : detail::no_failure(); }
  /// Throws Error when !ok().
  void value() const {
    if (failure_) throw Error(*failure_);
  }

 private:
  std::optional<Failure> failure_;
};

namespace detail {

/// The Failure of C call `call` that returned `s`, read on this thread now.
inline Failure failure(orbite_status s, const char *call) {
  const char *m = orbite_last_error();
  return Failure{static_cast<Status>(s), call, m ? m : ""};
}

inline Result<void> done(orbite_status s, const char *call) {
  if (s == ORBITE_STATUS_OK) return Result<void>();
  return failure(s, call);
}

/// Milliseconds for the C ABI: negative is 0, more than 2^32-1 is clamped.
inline std::uint32_t millis(std::chrono::milliseconds t) noexcept {
  auto n = t.count();
  if (n <= 0) return 0;
  if (static_cast<unsigned long long>(n) > std::numeric_limits<std::uint32_t>::max())
    return std::numeric_limits<std::uint32_t>::max();
  return static_cast<std::uint32_t>(n);
}

/// Runs a C text out-parameter call f(buf, cap, &len), growing the buffer
/// on BUFFER_TOO_SMALL (the text may grow between calls, e.g. stats).
template <class F>
Result<std::string> text(const char *call, F &&f) {
  std::string buf(512, '\0');
  for (int attempt = 0;; ++attempt) {
    std::size_t len = 0;
    orbite_status s = f(&buf[0], buf.size(), &len);
    if (s == ORBITE_STATUS_OK) {
      buf.resize(len);
      return Result<std::string>(std::move(buf));
    }
    if (s != ORBITE_STATUS_BUFFER_TOO_SMALL || attempt == 15) return failure(s, call);
    buf.assign(len + 1 > 2 * buf.size() ? len + 1 : 2 * buf.size(), '\0');
  }
}

/// text() for a C function f(handle, buf, cap, &len).
template <class H, class P>
Result<std::string> text_of(const char *call, orbite_status (*f)(H *, char *, std::size_t, std::size_t *), P *handle) {
  return text(call, [f, handle](char *buf, std::size_t cap, std::size_t *len) { return f(handle, buf, cap, len); });
}

/// One orbite_engine, freed by the last owner (Engine, Registration, Peer).
struct EngineHandle {
  explicit EngineHandle(orbite_engine *e) noexcept : engine(e) {}
  EngineHandle(const EngineHandle &) = delete;
  EngineHandle &operator=(const EngineHandle &) = delete;
  ~EngineHandle() { orbite_engine_free(engine); }
  orbite_engine *engine;
};

}  // namespace detail

}  // namespace orbite

#endif  // ORBITE_BASE_HPP
