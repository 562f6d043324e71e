/*
 * orbite/allocation.hpp - part of orbite.hpp (include that).
 *
 * Allocation (memory the library allocates) and the allocations whose
 * free it refused.
 */
#ifndef ORBITE_ALLOCATION_HPP
#define ORBITE_ALLOCATION_HPP

#include "base.hpp"

namespace orbite {

namespace detail {

/// Allocation handles the library refused to free (leaked on purpose).
struct Retained {
  std::mutex lock;
  std::vector<orbite_allocation *> handles;
};
inline Retained &retained() {
  static Retained *r = new Retained();  // never destroyed: the memory stays
  return *r;
}

}  // namespace detail

/// Allocations whose free the library refused (see ~Allocation).
inline std::size_t retained_allocation_count() {
  auto &r = detail::retained();
  std::lock_guard<std::mutex> g(r.lock);
  return r.handles.size();
}

/// Tries to free every retained allocation again; returns how many remain.
inline std::size_t free_retained_allocations() {
  auto &r = detail::retained();
  std::lock_guard<std::mutex> g(r.lock);
  std::vector<orbite_allocation *> left;
  for (orbite_allocation *a : r.handles)
    if (orbite_allocation_free(a) != ORBITE_STATUS_OK) left.push_back(a);
  r.handles.swap(left);
  return r.handles.size();
}

// ---- Allocation -------------------------------------------------------------

/// Memory allocated by the library (orbite_host_allocate_shared and the CUDA
/// allocators). Move-only. See the header comment for what ~Allocation does
/// when the library refuses to free it.
class Allocation {
 public:
  Allocation() noexcept = default;
  /// Adopts a C handle (owned from now on).
  explicit Allocation(orbite_allocation *a) noexcept : a_(a) {}
  Allocation(Allocation &&o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
  Allocation &operator=(Allocation &&o) noexcept {
    if (this != &o) {
      drop();
      a_ = std::exchange(o.a_, nullptr);
    }
    return *this;
  }
  Allocation(const Allocation &) = delete;
  Allocation &operator=(const Allocation &) = delete;
  ~Allocation() { drop(); }

  /// Shared host memory (memfd, zeroed, physically rounded up to 2 MiB): the
  /// only host memory a peer on this host can reach over SHM.
  static Allocation shared_host(std::size_t length) { return try_shared_host(length).value(); }
  static Result<Allocation> try_shared_host(std::size_t length) {
    return make("orbite_host_allocate_shared", orbite_host_allocate_shared, length);
  }
  /// Pinned host memory through CUDA (UNAVAILABLE without a CUDA driver).
  static Allocation cuda_pinned_host(std::size_t length) { return try_cuda_pinned_host(length).value(); }
  static Result<Allocation> try_cuda_pinned_host(std::size_t length) {
    return make("orbite_cuda_allocate_pinned_host", orbite_cuda_allocate_pinned_host, length);
  }
  /// CUDA device memory (not exportable).
  static Allocation cuda(std::int32_t device, std::size_t length) { return try_cuda(device, length).value(); }
  static Result<Allocation> try_cuda(std::int32_t device, std::size_t length) {
    return make("orbite_cuda_allocate", orbite_cuda_allocate, device, length);
  }
  /// CUDA device memory exportable over NVLink (CUDA IPC).
  static Allocation cuda_ipc(std::int32_t device, std::size_t length) { return try_cuda_ipc(device, length).value(); }
  static Result<Allocation> try_cuda_ipc(std::int32_t device, std::size_t length) {
    return make("orbite_cuda_allocate_ipc", orbite_cuda_allocate_ipc, device, length);
  }
  /// Fabric-exportable GPU memory (MNNVL).
  static Allocation mnnvl(std::int32_t device, std::size_t length) { return try_mnnvl(device, length).value(); }
  static Result<Allocation> try_mnnvl(std::int32_t device, std::size_t length) {
    return make("orbite_allocate_mnnvl", orbite_allocate_mnnvl, device, length);
  }
  /// Fabric-exportable host memory of a NUMA node (EGM).
  static Allocation egm(std::int32_t numa_node, std::size_t length) { return try_egm(numa_node, length).value(); }
  static Result<Allocation> try_egm(std::int32_t numa_node, std::size_t length) {
    return make("orbite_allocate_egm", orbite_allocate_egm, numa_node, length);
  }

  /// Adopts CUDA memory the caller's stack allocated (cudaMalloc/cuMemAlloc,
  /// or VMM memory from cuMemCreate) so that NVLink/MNNVL/EGM can export it:
  /// the caller consents that a peer importing it reaches the whole
  /// underlying allocation (ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION). The memory
  /// stays the caller's: freeing this object releases only the library's
  /// record; free the memory after that.
  static Allocation cuda_adopt(void *ptr, std::size_t length) { return try_cuda_adopt(ptr, length).value(); }
  static Result<Allocation> try_cuda_adopt(void *ptr, std::size_t length) {
    orbite_allocation *a = nullptr;
    orbite_status s = orbite_cuda_adopt(ptr, length, ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION, &a);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_cuda_adopt");
    return Allocation(a);
  }

  void *data() const noexcept { return orbite_allocation_addr(a_); }
  /// The memory as bytes (host-accessible kinds only: shared or pinned host, EGM).
  std::byte *bytes() const noexcept { return static_cast<std::byte *>(data()); }
  /// The logical length asked for.
  std::size_t size() const noexcept { return orbite_allocation_length(a_); }
  /// The address as a peer names it in requests.
  std::uint64_t address() const noexcept { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data())); }
  orbite_allocation *get() const noexcept { return a_; }
  explicit operator bool() const noexcept { return a_ != nullptr; }
  /// Gives up ownership of the C handle.
  orbite_allocation *release() noexcept { return std::exchange(a_, nullptr); }

  /// Frees now. On failure (UNAVAILABLE: still registered or exported) the
  /// allocation stays valid and owned by this object.
  Result<void> free() {
    if (!a_) return Result<void>();
    orbite_status s = orbite_allocation_free(a_);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_allocation_free");
    a_ = nullptr;
    return Result<void>();
  }

 private:
  /// Calls the C allocator f(args..., &out) named `call`.
  template <class F, class... A>
  static Result<Allocation> make(const char *call, F f, A... args) {
    orbite_allocation *a = nullptr;
    orbite_status s = f(args..., &a);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, call);
    return Allocation(a);
  }
  void drop() noexcept {
    if (!a_) return;
    if (orbite_allocation_free(a_) != ORBITE_STATUS_OK) {
      // Still registered or exported: never unmap memory a peer may map.
      try {
        auto &r = detail::retained();
        std::lock_guard<std::mutex> g(r.lock);
        r.handles.push_back(a_);
      } catch (...) {
        // Out of memory while recording it: the handle is leaked unlisted.
      }
    }
    a_ = nullptr;
  }

  orbite_allocation *a_ = nullptr;
};

}  // namespace orbite

#endif  // ORBITE_ALLOCATION_HPP
