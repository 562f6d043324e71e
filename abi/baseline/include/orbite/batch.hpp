/*
 * orbite/batch.hpp - part of orbite.hpp (include that).
 *
 * Batch: one submission's requests, their outcomes and notes.
 */
#ifndef ORBITE_BATCH_HPP
#define ORBITE_BATCH_HPP

#include "values.hpp"

namespace orbite {

// ---- Batch ------------------------------------------------------------------

/// A submitted batch: knows its request count. Move-only; use it from one
/// thread at a time. ~Batch frees the handle: a pending batch is detached
/// (its requests still run to their outcome), never cancelled mid-copy. A
/// Batch does not keep its engine alive and may outlive it.
class Batch {
 public:
  Batch() noexcept = default;
  /// Adopts a C handle of `count` requests.
  Batch(orbite_batch *b, std::size_t count) noexcept : b_(b), n_(count) {}
  Batch(Batch &&o) noexcept : b_(std::exchange(o.b_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Batch &operator=(Batch &&o) noexcept {
    if (this != &o) {
      orbite_batch_free(b_);
      b_ = std::exchange(o.b_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Batch(const Batch &) = delete;
  Batch &operator=(const Batch &) = delete;
  ~Batch() { orbite_batch_free(b_); }

  /// The number of requests submitted.
  std::size_t size() const noexcept { return n_; }
  orbite_batch *get() const noexcept { return b_; }
  explicit operator bool() const noexcept { return b_ != nullptr; }

  /// OK, PENDING or TRANSFER_FAILED, without waiting.
  Status poll() noexcept { return static_cast<Status>(orbite_batch_poll(b_)); }
  /// Waits up to `timeout` (0: does not wait): OK, TRANSFER_FAILED, or
  /// TIMED_OUT (still pending; wait again).
  Status wait(std::chrono::milliseconds timeout) noexcept {
    return static_cast<Status>(orbite_batch_wait(b_, detail::millis(timeout)));
  }

  /// Every request's outcome, in input order (PENDING for unfinished ones).
  std::vector<RequestResult> results() const { return try_results().value(); }
  Result<std::vector<RequestResult>> try_results() const {
    std::vector<orbite_request_result> raw(n_);
    orbite_status s = orbite_batch_results(b_, raw.data(), raw.size());
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_batch_results");
    std::vector<RequestResult> out;
    out.reserve(n_);
    for (const orbite_request_result &r : raw)
      out.push_back(RequestResult{static_cast<Status>(r.status), static_cast<RemoteEffect>(r.remote_effect)});
    return Result<std::vector<RequestResult>>(std::move(out));
  }
  /// Request i's outcome; Error(OUT_OF_RANGE) when i >= size().
  RequestResult result(std::size_t i) const { return try_result(i).value(); }
  Result<RequestResult> try_result(std::size_t i) const {
    orbite_request_result r{};
    orbite_status s = orbite_batch_result(b_, i, &r);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_batch_result");
    return RequestResult{static_cast<Status>(r.status), static_cast<RemoteEffect>(r.remote_effect)};
  }
  /// The transport that carried request i (Transport::automatic while not
  /// yet decided); Error(OUT_OF_RANGE) when i >= size().
  Transport transport(std::size_t i) const { return try_transport(i).value(); }
  Result<Transport> try_transport(std::size_t i) const {
    std::uint32_t t = 0;
    orbite_status s = orbite_batch_transport(b_, i, &t);
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_batch_transport");
    return static_cast<Transport>(t);
  }
  /// What the engine decided for this submission and why, one line each
  /// (orbite_batch_notes): a fallback of Transport::automatic to TCP with its
  /// reason, or requests split into more groups than their layout needs.
  /// Empty when nothing was noted.
  std::vector<std::string> notes() const { return try_notes().value(); }
  Result<std::vector<std::string>> try_notes() const {
    Result<std::string> text = detail::text_of("orbite_batch_notes", orbite_batch_notes, b_);
    if (!text) return text.error();
    std::vector<std::string> lines;
    const std::string &t = *text;
    for (std::size_t at = 0; at < t.size();) {
      std::size_t end = t.find('\n', at);
      if (end == std::string::npos) end = t.size();
      lines.push_back(t.substr(at, end - at));
      at = end + 1;
    }
    return Result<std::vector<std::string>>(std::move(lines));
  }
  /// Requests not yet started end CANCELLED; started ones run to their outcome.
  Result<void> cancel() { return detail::done(orbite_batch_cancel(b_), "orbite_batch_cancel"); }
  /// Request i ends CANCELLED if it has not started; the other requests are
  /// not affected (one moving as one copy with requests not asked runs to
  /// its outcome); Error(OUT_OF_RANGE) when i >= size().
  Result<void> cancel_request(std::size_t i) {
    return detail::done(orbite_batch_cancel_request(b_, i), "orbite_batch_cancel_request");
  }
  /// Calls `f` once every request has ended (orbite_batch_on_end): within
  /// this call when they all have, else on the library thread that ends the
  /// last one, also after this Batch was destroyed. `f` must return
  /// promptly and call no liborbite function; an exception it throws is
  /// dropped.
  Result<void> try_on_end(std::function<void()> f) {
    auto held = std::make_unique<std::function<void()>>(std::move(f));
    orbite_status s = orbite_batch_on_end(b_, &Batch::ended, held.get());
    if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_batch_on_end");
    held.release();  // ended() owns it now
    return Result<void>();
  }

 private:
  orbite_batch *b_ = nullptr;
  std::size_t n_ = 0;

  static void ended(void *held) noexcept {
    std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()> *>(held));
    try {
      (*f)();
    } catch (...) {
    }
  }
};

}  // namespace orbite

#endif  // ORBITE_BATCH_HPP
