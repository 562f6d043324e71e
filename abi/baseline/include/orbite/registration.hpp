/*
 * orbite/registration.hpp - part of orbite.hpp (include that).
 *
 * Registration: a region of memory registered on an engine.
 */
#ifndef ORBITE_REGISTRATION_HPP
#define ORBITE_REGISTRATION_HPP

#include "allocation.hpp"

namespace orbite {

// ---- Registration -----------------------------------------------------------

/// A registered region: borrowing or co-owning its memory (see the header
/// comment). Move-only; ~Registration unregisters.
class Registration {
 public:
  Registration() noexcept = default;
  Registration(Registration &&o) noexcept { take(o); }
  Registration &operator=(Registration &&o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  Registration(const Registration &) = delete;
  Registration &operator=(const Registration &) = delete;
  ~Registration() { reset(); }

  std::uint64_t id() const noexcept { return id_; }
  void *data() const noexcept { return addr_; }
  std::byte *bytes() const noexcept { return static_cast<std::byte *>(addr_); }
  std::size_t size() const noexcept { return len_; }
  /// The address as a peer names it in requests.
  std::uint64_t address() const noexcept { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(addr_)); }
  Access access() const noexcept { return access_; }
  /// The co-owned allocation (null when the registration borrows its memory).
  const std::shared_ptr<Allocation> &allocation() const noexcept { return memory_; }
  bool owns_memory() const noexcept { return memory_ != nullptr; }
  explicit operator bool() const noexcept { return id_ != 0; }

  /// Unregisters, waiting up to `timeout` (0: the engine's default) for copies
  /// that use the region. OK, or NOT_FOUND when the region was already gone
  /// (the engine was closed): either way this object is empty afterwards and
  /// releases the engine and its co-owned memory. Any other failure
  /// (TIMED_OUT: copies still use it) leaves everything registered; call again.
  Result<void> unregister(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    if (id_ == 0) return Result<void>();
    orbite_status s = orbite_unregister_memory(engine_->engine, id_, detail::millis(timeout));
    if (s != ORBITE_STATUS_OK && s != ORBITE_STATUS_NOT_FOUND) return detail::failure(s, "orbite_unregister_memory");
    Result<void> r = detail::done(s, "orbite_unregister_memory");
    clear();
    return r;
  }

 private:
  friend class Engine;
  Registration(std::shared_ptr<detail::EngineHandle> e, std::uint64_t id, void *addr, std::size_t len, Access access,
               std::shared_ptr<Allocation> memory) noexcept
      : engine_(std::move(e)), id_(id), addr_(addr), len_(len), access_(access), memory_(std::move(memory)) {}

  void take(Registration &o) noexcept {
    engine_ = std::move(o.engine_);
    id_ = std::exchange(o.id_, 0);
    addr_ = std::exchange(o.addr_, nullptr);
    len_ = std::exchange(o.len_, 0);
    access_ = o.access_;
    memory_ = std::move(o.memory_);
  }
  void clear() noexcept {
    id_ = 0;
    addr_ = nullptr;
    len_ = 0;
    memory_.reset();  // co-owned memory first: ~Allocation needs no engine
    engine_.reset();
  }
  void reset() noexcept {
    if (id_ != 0) {
      // The engine's default timeout. A failure other than NOT_FOUND leaves the
      // region registered until the engine is freed; co-owned memory is then
      // kept by ~Allocation (the library refuses to free registered memory).
      orbite_unregister_memory(engine_->engine, id_, 0);
    }
    clear();
  }

  std::shared_ptr<detail::EngineHandle> engine_;
  std::uint64_t id_ = 0;
  void *addr_ = nullptr;
  std::size_t len_ = 0;
  Access access_ = Access::none;
  std::shared_ptr<Allocation> memory_;
};

}  // namespace orbite

#endif  // ORBITE_REGISTRATION_HPP
