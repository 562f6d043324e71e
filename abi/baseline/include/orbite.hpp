/*
 * orbite.hpp - a header-only C++17 layer over liborbite's C ABI (orbite.h).
 *
 * Every call below goes through the C functions of orbite.h, which stay the
 * contract; this header adds ownership, exceptions, typed JSON views and the
 * text-buffer retry loop. Link against liborbite as for C (orbite::orbite_cpp
 * or orbite::orbite from CMake, or pkg-config) and compile as C++17 with
 * exceptions enabled.
 *
 * Errors
 *   Each fallible operation X comes twice:
 *   - X(...) throws orbite::Error (status + the C function + the message of
 *     orbite_last_error(), read on the failing thread right after the call);
 *   - try_X(...) returns orbite::Result<T> and never throws orbite::Error
 *     (only std::bad_alloc can escape): for hot paths and for code that
 *     treats failures as data.
 *   Batch::poll() and Batch::wait() return a Status: OK, PENDING,
 *   TRANSFER_FAILED and TIMED_OUT are outcomes, not exceptions.
 *
 * Ownership (all handle types are move-only)
 *   - Engine, and every Registration and Peer made from it, share one
 *     orbite_engine: orbite_engine_free runs when the last of them is
 *     destroyed, so a Registration or Peer can never use a freed engine.
 *     A Batch does not hold its engine and may outlive it (the C ABI allows
 *     that: its requests still end with a status, and its results stay
 *     readable).
 *   - Destructors never throw and never wait for peers. The last owner of an
 *     engine calls orbite_engine_free, which stops the engine's threads and
 *     connections without proving that a peer finished with anything. For an
 *     orderly close call Engine::close(timeout) first and look at its status.
 *   - A Registration either BORROWS its memory (register_memory(void*, size,
 *     access): the memory is yours and must stay valid until the region is
 *     unregistered, i.e. unregister() returned OK or NOT_FOUND, or the engine
 *     was closed or freed) or CO-OWNS it (register_memory(Allocation&&) or
 *     register_memory(std::shared_ptr<Allocation>): the Registration keeps
 *     the allocation alive, and it is freed only after the region is gone).
 *     ~Registration calls orbite_unregister_memory with the engine's default
 *     timeout (default_timeout_ms), which waits for copies that use the region.
 *   - ~Allocation calls orbite_allocation_free. The library refuses to free
 *     memory that is still registered or exported to a peer (UNAVAILABLE);
 *     then the memory is LEAKED ON PURPOSE: the handle moves to a
 *     process-wide list (retained_allocation_count()), and
 *     free_retained_allocations() tries again later, for example after the
 *     importing peer exited.
 *
 * What stays behind when a close does not finish (Engine::close runs two
 * halves, close_requester then close_source, and stops at the first that
 * fails; a non-OK close leaves the engine running, and its last owner's
 * orbite_engine_free still stops it):
 *   - TIMED_OUT from the requester half: requests this engine submitted are
 *     still in flight. Their local memory may still be written (READ) or read
 *     (WRITE): keep it valid, and keep its Registrations, until the engine is
 *     freed. The requester side stays fenced (no new submissions).
 *   - UNQUIESCED from the requester half: SHM or CUDA imports of a peer's
 *     memory whose close could not be confirmed stay with their
 *     mapping-budget charge (stats().ipc[...].imports_retained), mapped
 *     unless the unmap itself succeeded; on the peer, the export stays open
 *     and its allocation cannot be freed. (An import of a peer whose process
 *     exited is not such a case: it is unmapped and released by itself,
 *     counted in imports_released_after_exit.)
 *   - TIMED_OUT from the source half: peers' requests are still being served
 *     from or into this engine's registered memory: keep that memory valid.
 *   - UNQUIESCED from the source half: exports without a close receipt; the
 *     exported allocations stay exported (stats().ipc[...].exports_retained),
 *     orbite_allocation_free refuses them, and ~Allocation therefore keeps
 *     them in the retained list instead of unmapping memory a peer may map.
 *   Nothing else is leaked: engines, batches and peers are always freed.
 *
 * JSON: peer regions and engine stats are read into typed values
 * (orbite::Region, orbite::Stats) by a small strict reader
 * (orbite::json::parse): RFC 8259 syntax only, UTF-8 checked, duplicate keys
 * and trailing text rejected, depth at most 64, numbers read exactly as
 * integers (no floating point, no locale). The keys this header knows are
 * required; keys it does not know are ignored, so a newer library still reads.
 */
#ifndef ORBITE_HPP
#define ORBITE_HPP

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
};

/// "auto", "tcp", "shm", "nvlink", "mnnvl" (the names the stats JSON uses).
inline const char *transport_name(Transport t) noexcept {
  switch (t) {
    case Transport::automatic: return "auto";
    case Transport::tcp: return "tcp";
    case Transport::shm: return "shm";
    case Transport::nvlink: return "nvlink";
    case Transport::mnnvl: return "mnnvl";
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

/// Allocation handles the library refused to free (leaked on purpose).
struct Retained {
  std::mutex lock;
  std::vector<orbite_allocation *> handles;
};
inline Retained &retained() {
  static Retained *r = new Retained();  // never destroyed: the memory stays
  return *r;
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

// ---- JSON -------------------------------------------------------------------

namespace json {

/// A parsed JSON value. Numbers keep their text and are read exactly as
/// integers; objects keep their keys in document order.
class Value {
 public:
  enum class Type { null, boolean, number, string, array, object };

  Type type() const noexcept { return type_; }
  bool is_null() const noexcept { return type_ == Type::null; }
  bool is_bool() const noexcept { return type_ == Type::boolean; }
  bool is_number() const noexcept { return type_ == Type::number; }
  bool is_string() const noexcept { return type_ == Type::string; }
  bool is_array() const noexcept { return type_ == Type::array; }
  bool is_object() const noexcept { return type_ == Type::object; }

  bool as_bool() const {
    expect(Type::boolean, "a boolean");
    return bool_;
  }
  /// A number without sign, fraction or exponent that fits 64 bits.
  std::uint64_t as_u64() const {
    expect(Type::number, "an unsigned integer");
    std::uint64_t v = 0;
    for (char c : text_) {
      if (c < '0' || c > '9') type_error("an unsigned integer");
      std::uint64_t d = static_cast<std::uint64_t>(c - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) type_error("an integer that fits 64 bits");
      v = v * 10 + d;
    }
    return v;
  }
  /// A number without fraction or exponent that fits a signed 64-bit integer.
  std::int64_t as_i64() const {
    expect(Type::number, "an integer");
    bool neg = !text_.empty() && text_[0] == '-';
    std::uint64_t mag = 0;
    for (std::size_t i = neg ? 1 : 0; i < text_.size(); ++i) {
      char c = text_[i];
      if (c < '0' || c > '9') type_error("an integer");
      std::uint64_t d = static_cast<std::uint64_t>(c - '0');
      if (mag > (std::numeric_limits<std::uint64_t>::max() - d) / 10) type_error("an integer that fits 64 bits");
      mag = mag * 10 + d;
    }
    const std::uint64_t limit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (mag > limit + (neg ? 1u : 0u)) type_error("an integer that fits 64 bits");
    if (!neg) return static_cast<std::int64_t>(mag);
    return mag == limit + 1 ? std::numeric_limits<std::int64_t>::min() : -static_cast<std::int64_t>(mag);
  }
  /// The number as written in the document (for fractions and exponents).
  const std::string &number_text() const {
    expect(Type::number, "a number");
    return text_;
  }
  const std::string &as_string() const {
    expect(Type::string, "a string");
    return text_;
  }

  /// Elements of an array, or values of an object (in document order).
  const std::vector<Value> &items() const {
    if (type_ != Type::array && type_ != Type::object) type_error("an array or an object");
    return items_;
  }
  /// Keys of an object, in document order (items()[i] is the value of keys()[i]).
  const std::vector<std::string> &keys() const {
    expect(Type::object, "an object");
    return keys_;
  }
  std::size_t size() const { return items().size(); }
  /// Array element i; throws Error(INVALID_ARGUMENT) past the end.
  const Value &operator[](std::size_t i) const {
    expect(Type::array, "an array");
    if (i >= items_.size())
      fail("index " + std::to_string(i) + " is past the end of an array of " + std::to_string(items_.size()));
    return items_[i];
  }
  /// The member named key, or nullptr (also when this is not an object).
  const Value *find(const std::string &key) const noexcept {
    if (type_ != Type::object) return nullptr;
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == key) return &items_[i];
    return nullptr;
  }
  /// The member named key; throws Error(INVALID_ARGUMENT) naming it when absent.
  const Value &at(const std::string &key) const {
    expect(Type::object, "an object");
    const Value *v = find(key);
    if (!v) fail("missing key `" + key + "`");
    return *v;
  }

  /// "null", "a boolean", "a number", "a string", "an array", "an object".
  const char *type_name() const noexcept {
    switch (type_) {
      case Type::null: return "null";
      case Type::boolean: return "a boolean";
      case Type::number: return "a number";
      case Type::string: return "a string";
      case Type::array: return "an array";
      case Type::object: return "an object";
    }
    return "?";
  }

 private:
  friend class Parser;

  [[noreturn]] static void fail(const std::string &what) {
    throw Error(Failure{Status::invalid_argument, "orbite::json", what});
  }
  [[noreturn]] void type_error(const char *wanted) const {
    std::string found = type_name();
    if (type_ == Type::number) found += " (" + text_ + ")";
    fail(std::string("expected ") + wanted + ", found " + found);
  }
  void expect(Type t, const char *wanted) const {
    if (type_ != t) type_error(wanted);
  }

  Type type_ = Type::null;
  bool bool_ = false;
  std::string text_;  // number literal or string contents
  std::vector<std::string> keys_;
  std::vector<Value> items_;
};

/// The strict reader behind parse().
class Parser {
 public:
  explicit Parser(const std::string &text) : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()) {}

  Value document() {
    space();
    Value v = value(0);
    space();
    if (p_ != end_) fail("unexpected text after the value");
    return v;
  }

 private:
  static constexpr int max_depth = 64;

  [[noreturn]] void fail(const std::string &what) const {
    throw Error(Failure{Status::invalid_argument, "orbite::json::parse",
                        "at byte " + std::to_string(p_ - begin_) + ": " + what});
  }
  void space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool eat(char c) {
    if (p_ != end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void literal(const char *word) {
    for (const char *w = word; *w; ++w)
      if (!eat(*w)) fail(std::string("expected `") + word + "`");
  }

  Value value(int depth) {
    if (p_ == end_) fail("unexpected end of text");
    Value v;
    switch (*p_) {
      case '{': return container(depth + 1, Value::Type::object);
      case '[': return container(depth + 1, Value::Type::array);
      case '"':
        v.type_ = Value::Type::string;
        v.text_ = string();
        return v;
      case 't':
        literal("true");
        v.type_ = Value::Type::boolean;
        v.bool_ = true;
        return v;
      case 'f':
        literal("false");
        v.type_ = Value::Type::boolean;
        return v;
      case 'n':
        literal("null");
        return v;
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number();
        fail(std::string("unexpected character `") + *p_ + "`");
    }
  }

  /// An object or an array: members separated by commas up to the closing bracket.
  Value container(int depth, Value::Type type) {
    if (depth > max_depth) fail("nested deeper than 64 levels");
    const bool object = type == Value::Type::object;
    const char close = object ? '}' : ']';
    ++p_;  // '{' or '['
    Value v;
    v.type_ = type;
    space();
    if (eat(close)) return v;
    for (;;) {
      space();
      if (object) {
        if (p_ == end_ || *p_ != '"') fail("expected a key in double quotes");
        std::string key = string();
        for (const std::string &k : v.keys_)
          if (k == key) fail("duplicate key `" + key + "`");
        space();
        if (!eat(':')) fail("expected `:` after a key");
        space();
        v.keys_.push_back(std::move(key));
      }
      v.items_.push_back(value(depth));
      space();
      if (eat(close)) return v;
      if (!eat(',')) fail(object ? "expected `,` or `}` in an object" : "expected `,` or `]` in an array");
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  Value number() {
    const char *start = p_;
    eat('-');
    if (p_ == end_ || !digit(*p_)) fail("expected a digit");
    if (!eat('0'))
      while (p_ != end_ && digit(*p_)) ++p_;
    if (eat('.')) {
      if (p_ == end_ || !digit(*p_)) fail("expected a digit after `.`");
      while (p_ != end_ && digit(*p_)) ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (!eat('+')) eat('-');
      if (p_ == end_ || !digit(*p_)) fail("expected a digit in the exponent");
      while (p_ != end_ && digit(*p_)) ++p_;
    }
    Value v;
    v.type_ = Value::Type::number;
    v.text_.assign(start, p_);
    return v;
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      if (p_ == end_) fail("unexpected end in a \\u escape");
      char c = *p_++;
      unsigned d;
      if (c >= '0' && c <= '9')
        d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<unsigned>(c - 'A' + 10);
      else
        fail("expected four hex digits after \\u");
      u = u * 16 + d;
    }
    return u;
  }

  static void put_utf8(std::string &out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  /// One UTF-8 sequence starting at p_ (a lead byte >= 0x80), copied to out.
  void utf8(std::string &out) {
    unsigned char b = static_cast<unsigned char>(*p_);
    int more = 0;
    unsigned cp = 0, min = 0;
    if (b >= 0xC2 && b <= 0xDF) {
      more = 1;
      cp = b & 0x1Fu;
      min = 0x80;
    } else if (b >= 0xE0 && b <= 0xEF) {
      more = 2;
      cp = b & 0x0Fu;
      min = 0x800;
    } else if (b >= 0xF0 && b <= 0xF4) {
      more = 3;
      cp = b & 0x07u;
      min = 0x10000;
    } else {
      fail("invalid UTF-8");
    }
    const char *start = p_++;
    for (int i = 0; i < more; ++i) {
      if (p_ == end_) fail("truncated UTF-8");
      unsigned char c = static_cast<unsigned char>(*p_++);
      if ((c & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (c & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8");
    out.append(start, p_);
  }

  std::string string() {
    ++p_;  // '"'
    std::string out;
    for (;;) {
      if (p_ == end_) fail("unterminated string");
      char c = *p_;
      if (c == '"') {
        ++p_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        utf8(out);
        continue;
      }
      ++p_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ == end_) fail("unterminated escape");
      char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!eat('\\') || !eat('u')) fail("high surrogate without its low surrogate");
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate without its low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(std::string("unknown escape `\\") + e + "`");
      }
    }
  }

  const char *begin_;
  const char *p_;
  const char *end_;
};

/// Parses one JSON document; throws Error(INVALID_ARGUMENT, "at byte N: ...").
inline Value parse(const std::string &text) { return Parser(text).document(); }

/// As parse(), returning the failure instead of throwing it.
inline Result<Value> try_parse(const std::string &text) {
  try {
    return parse(text);
  } catch (const Error &e) {
    return e.failure();
  }
}

}  // namespace json

// ---- typed views of the library's JSON --------------------------------------

namespace detail {

[[noreturn]] inline void bad_json(const std::string &where, const std::string &what) {
  throw Error(Failure{Status::invalid_argument, "orbite.hpp", where + ": " + what});
}

inline const json::Value &member(const json::Value &obj, const char *key, const std::string &where) {
  if (!obj.is_object()) bad_json(where, std::string("expected an object, found ") + obj.type_name());
  const json::Value *v = obj.find(key);
  if (!v) bad_json(where, std::string("missing key `") + key + "`");
  return *v;
}

inline std::uint64_t u64(const json::Value &obj, const char *key, const std::string &where) {
  try {
    return member(obj, key, where).as_u64();
  } catch (const Error &e) {
    if (e.call() == "orbite.hpp") throw;
    bad_json(where + ": key `" + key + "`", e.message());
  }
}

inline const json::Value &object(const json::Value &obj, const char *key, const std::string &where) {
  const json::Value &v = member(obj, key, where);
  if (!v.is_object()) bad_json(where + ": key `" + key + "`", std::string("expected an object, found ") + v.type_name());
  return v;
}

inline bool boolean(const json::Value &obj, const char *key, const std::string &where) {
  const json::Value &v = member(obj, key, where);
  if (!v.is_bool()) bad_json(where + ": key `" + key + "`", std::string("expected a boolean, found ") + v.type_name());
  return v.as_bool();
}

inline std::vector<std::uint64_t> u64_array(const json::Value &obj, const char *key, const std::string &where) {
  const json::Value &v = member(obj, key, where);
  if (!v.is_array()) bad_json(where + ": key `" + key + "`", std::string("expected an array, found ") + v.type_name());
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    try {
      out.push_back(v[i].as_u64());
    } catch (const Error &e) {
      bad_json(where + ": key `" + key + "`[" + std::to_string(i) + "]", e.message());
    }
  }
  return out;
}

}  // namespace detail

/// One region a peer publishes (an element of orbite_peer_regions_json).
struct Region {
  std::uint64_t id = 0;      ///< the peer's region id
  std::uint64_t epoch = 0;   ///< registration epoch (changes on re-registration)
  std::uint64_t addr = 0;    ///< first byte, in the peer's address space
  std::uint64_t length = 0;  ///< bytes
  Access access = Access::none;
  MemoryKind kind = MemoryKind::unknown;
  std::string kind_name;  ///< the "kind" text, also for kinds this header does not know

  std::uint64_t end() const noexcept { return addr + length; }
  bool readable() const noexcept { return has(access, Access::read); }
  bool writable() const noexcept { return has(access, Access::write); }
  /// Whether [a, a+n) lies inside the region.
  bool contains(std::uint64_t a, std::uint64_t n) const noexcept { return a >= addr && n <= length && a - addr <= length - n; }
};

inline MemoryKind memory_kind_from_name(const std::string &n) noexcept {
  if (n == "host") return MemoryKind::host;
  if (n == "shared_host") return MemoryKind::shared_host;
  if (n == "cuda") return MemoryKind::cuda;
  if (n == "cuda_ipc") return MemoryKind::cuda_ipc;
  if (n == "pinned_host") return MemoryKind::pinned_host;
  if (n == "mnnvl") return MemoryKind::mnnvl;
  if (n == "egm") return MemoryKind::egm;
  return MemoryKind::unknown;
}

/// Reads the regions JSON (an array of {id, epoch, addr, length, access, kind}).
inline std::vector<Region> parse_regions(const std::string &text) {
  json::Value doc = json::parse(text);
  if (!doc.is_array()) detail::bad_json("regions", std::string("expected an array, found ") + doc.type_name());
  std::vector<Region> out;
  out.reserve(doc.size());
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const json::Value &o = doc[i];
    std::string where = "regions[" + std::to_string(i) + "]";
    Region r;
    r.id = detail::u64(o, "id", where);
    r.epoch = detail::u64(o, "epoch", where);
    r.addr = detail::u64(o, "addr", where);
    r.length = detail::u64(o, "length", where);
    const json::Value &acc = detail::member(o, "access", where);
    if (!acc.is_array()) detail::bad_json(where + ": key `access`", std::string("expected an array, found ") + acc.type_name());
    for (const json::Value &a : acc.items()) {
      if (a.is_string() && a.as_string() == "read")
        r.access = r.access | Access::read;
      else if (a.is_string() && a.as_string() == "write")
        r.access = r.access | Access::write;
      else
        detail::bad_json(where + ": key `access`", "expected \"read\" or \"write\"");
    }
    const json::Value &kind = detail::member(o, "kind", where);
    if (!kind.is_string()) detail::bad_json(where + ": key `kind`", std::string("expected a string, found ") + kind.type_name());
    r.kind_name = kind.as_string();
    r.kind = memory_kind_from_name(r.kind_name);
    out.push_back(std::move(r));
  }
  return out;
}

/// Counters of one transport (stats "transports" values).
struct TransportStats {
  std::uint64_t requests_completed = 0, requests_failed = 0, bytes_completed = 0, bytes_failed = 0;
  std::uint64_t served_requests = 0, served_bytes = 0, served_failed = 0, wire_bytes_sent = 0;
  std::uint64_t requests_fell_through = 0;
};

/// What an IPC transport holds (stats "ipc" values).
struct IpcStats {
  std::uint64_t exports_open = 0, exports_retained = 0, imports_opened = 0, imports_closed = 0;
  std::uint64_t imports_cached = 0, imports_retained = 0, local_owners_fenced = 0, mapping_bytes_charged = 0;
  std::uint64_t imports_released_after_exit = 0;
  std::uint64_t pending_groups = 0, progress_workers = 0;
  /// Exports released because their importing process exited (source side).
  std::uint64_t exports_reclaimed_after_exit = 0;
  /// Groups reported UNQUIESCED at their deadline whose completion is still
  /// polled, and those whose completion came late (their import was then
  /// closed, or returned to the cache, as usual).
  std::uint64_t late_groups = 0, late_completions = 0;
  /// Copies posted per GPU (CUDA transports): device ordinal -> counts.
  struct DeviceCopies {
    std::uint64_t copies = 0, bytes = 0;
  };
  std::map<int, DeviceCopies> copies_by_device;
};

/// The CUDA stream pool (stats "nvlink").
struct NvlinkStats {
  std::uint64_t stream_slots = 0, active_streams = 0, retained_streams = 0, pending_groups = 0, progress_workers = 0;
};

/// Notifications sent and received (stats "notifications").
struct NotificationStats {
  std::uint64_t sent = 0, delivered = 0, refused = 0, not_sent = 0, received = 0, rejected = 0, queued = 0;
};

/// The I/O threads serving the connections (stats "io").
struct IoStats {
  std::uint64_t threads_max = 0, threads = 0, wakeups = 0, polled_turns = 0, wakeups_per_1000_requests = 0;
  std::vector<std::uint64_t> connections_per_thread;  ///< one entry per running I/O thread
};

/// Discovery on etcd (stats "discovery"; enabled false without it).
struct DiscoveryStats {
  bool enabled = false, connected = false;
  std::uint64_t failures = 0, reconnects = 0, reregistrations = 0, watched = 0, peers_gone = 0;
};

/// A typed snapshot of orbite_engine_stats_json.
struct Stats {
  std::map<std::string, TransportStats> transports;  ///< "tcp", "shm", "nvlink", "mnnvl"
  std::uint64_t inflight_bytes = 0, peers = 0, peers_alive = 0, incoming_connections = 0, regions = 0;
  std::uint64_t protocol_errors = 0, connections_refused = 0, fabric_channels_accepted = 0;
  std::uint64_t auth_failures = 0, ipc_uid_refusals = 0, offers_expired = 0;
  std::uint64_t revokes_received = 0, revoke_passes = 0;
  /// TCP answers to requests failed at their deadline, read and dropped.
  std::uint64_t answers_dropped = 0;
  NotificationStats notifications;
  DiscoveryStats discovery;
  IoStats io;
  std::map<std::string, IpcStats> ipc;  ///< per IPC transport running ("shm", "nvlink", "mnnvl")
  NvlinkStats nvlink;
  std::map<std::string, std::string> transports_available;  ///< "available" or "not available: why"
  json::Value document;  ///< the whole document, for keys this header does not type

  /// The counters of transport t (all zero if the stats do not list it).
  TransportStats transport(Transport t) const {
    auto it = transports.find(transport_name(t));
    return it == transports.end() ? TransportStats{} : it->second;
  }
  /// What IPC transport t holds (all zero if it does not run).
  IpcStats ipc_of(Transport t) const {
    auto it = ipc.find(transport_name(t));
    return it == ipc.end() ? IpcStats{} : it->second;
  }
};

namespace detail {

/// Sets each listed u64 member of `t` from the key of the same name in `obj`.
template <class T>
void u64_fields(T &t, const json::Value &obj, const std::string &where,
                std::initializer_list<std::pair<const char *, std::uint64_t T::*>> fields) {
  for (const auto &f : fields) t.*(f.second) = u64(obj, f.first, where);
}

/// Reads every member of the object at `key` with read(value, where).
template <class T, class F>
std::map<std::string, T> members(const json::Value &obj, const char *key, const std::string &where, F read) {
  const json::Value &m = object(obj, key, where);
  std::map<std::string, T> out;
  for (std::size_t i = 0; i < m.keys().size(); ++i)
    out[m.keys()[i]] = read(m.items()[i], where + "." + key + "." + m.keys()[i]);
  return out;
}

}  // namespace detail

/// Reads the stats JSON.
inline Stats parse_stats(const std::string &text) {
  using S = Stats;
  using T = TransportStats;
  using I = IpcStats;
  using N = NvlinkStats;
  Stats s;
  s.document = json::parse(text);
  const json::Value &d = s.document;
  s.transports = detail::members<T>(d, "transports", "stats", [](const json::Value &o, const std::string &at) {
    T t;
    detail::u64_fields(t, o, at,
                       {{"requests_completed", &T::requests_completed}, {"requests_failed", &T::requests_failed},
                        {"bytes_completed", &T::bytes_completed}, {"bytes_failed", &T::bytes_failed},
                        {"served_requests", &T::served_requests}, {"served_bytes", &T::served_bytes},
                        {"served_failed", &T::served_failed}, {"wire_bytes_sent", &T::wire_bytes_sent},
                        {"requests_fell_through", &T::requests_fell_through}});
    return t;
  });
  detail::u64_fields(s, d, "stats",
                     {{"inflight_bytes", &S::inflight_bytes}, {"peers", &S::peers}, {"peers_alive", &S::peers_alive},
                      {"incoming_connections", &S::incoming_connections}, {"regions", &S::regions},
                      {"protocol_errors", &S::protocol_errors}, {"connections_refused", &S::connections_refused},
                      {"fabric_channels_accepted", &S::fabric_channels_accepted},
                      {"auth_failures", &S::auth_failures}, {"ipc_uid_refusals", &S::ipc_uid_refusals},
                      {"offers_expired", &S::offers_expired}, {"revokes_received", &S::revokes_received},
                      {"answers_dropped", &S::answers_dropped},
                      {"revoke_passes", &S::revoke_passes}});
  {
    using Nt = NotificationStats;
    detail::u64_fields(s.notifications, detail::object(d, "notifications", "stats"), "stats.notifications",
                       {{"sent", &Nt::sent}, {"delivered", &Nt::delivered}, {"refused", &Nt::refused},
                        {"not_sent", &Nt::not_sent}, {"received", &Nt::received}, {"rejected", &Nt::rejected},
                        {"queued", &Nt::queued}});
    using D = DiscoveryStats;
    const json::Value &disc = detail::object(d, "discovery", "stats");
    s.discovery.enabled = detail::boolean(disc, "enabled", "stats.discovery");
    s.discovery.connected = detail::boolean(disc, "connected", "stats.discovery");
    detail::u64_fields(s.discovery, disc, "stats.discovery",
                       {{"failures", &D::failures}, {"reconnects", &D::reconnects},
                        {"reregistrations", &D::reregistrations}, {"watched", &D::watched},
                        {"peers_gone", &D::peers_gone}});
    using Io = IoStats;
    const json::Value &io = detail::object(d, "io", "stats");
    detail::u64_fields(s.io, io, "stats.io",
                       {{"threads_max", &Io::threads_max}, {"threads", &Io::threads}, {"wakeups", &Io::wakeups},
                        {"polled_turns", &Io::polled_turns},
                        {"wakeups_per_1000_requests", &Io::wakeups_per_1000_requests}});
    s.io.connections_per_thread = detail::u64_array(io, "connections_per_thread", "stats.io");
  }
  s.ipc = detail::members<I>(d, "ipc", "stats", [](const json::Value &o, const std::string &at) {
    I t;
    detail::u64_fields(t, o, at,
                       {{"exports_open", &I::exports_open}, {"exports_retained", &I::exports_retained},
                        {"imports_opened", &I::imports_opened}, {"imports_closed", &I::imports_closed},
                        {"imports_cached", &I::imports_cached}, {"imports_retained", &I::imports_retained},
                        {"imports_released_after_exit", &I::imports_released_after_exit},
                        {"local_owners_fenced", &I::local_owners_fenced},
                        {"mapping_bytes_charged", &I::mapping_bytes_charged},
                        {"pending_groups", &I::pending_groups}, {"progress_workers", &I::progress_workers},
                        {"exports_reclaimed_after_exit", &I::exports_reclaimed_after_exit},
                        {"late_groups", &I::late_groups}, {"late_completions", &I::late_completions}});
    const json::Value &by = detail::object(o, "copies_by_device", at);
    for (std::size_t i = 0; i < by.keys().size(); ++i) {
      const std::string where = at + ".copies_by_device." + by.keys()[i];
      I::DeviceCopies c;
      detail::u64_fields(c, by.items()[i], where, {{"copies", &I::DeviceCopies::copies}, {"bytes", &I::DeviceCopies::bytes}});
      t.copies_by_device[std::atoi(by.keys()[i].c_str())] = c;
    }
    return t;
  });
  detail::u64_fields(s.nvlink, detail::object(d, "nvlink", "stats"), "stats.nvlink",
                     {{"stream_slots", &N::stream_slots}, {"active_streams", &N::active_streams},
                      {"retained_streams", &N::retained_streams}, {"pending_groups", &N::pending_groups},
                      {"progress_workers", &N::progress_workers}});
  s.transports_available =
      detail::members<std::string>(d, "transports_available", "stats", [](const json::Value &v, const std::string &at) {
        if (!v.is_string()) detail::bad_json(at, std::string("expected a string, found ") + v.type_name());
        return v.as_string();
      });
  return s;
}

namespace detail {
/// Runs a throwing reader f(text) and returns its failure instead.
template <class T, class F>
Result<T> read_json(Result<std::string> text, F &&f) {
  if (!text) return text.error();
  try {
    return f(*text);
  } catch (const Error &e) {
    return e.failure();
  }
}
}  // namespace detail

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

// ---- logging ----------------------------------------------------------------

/// ORBITE_LOG_*: how much a log line matters (LogLevel::off only as a level
/// an engine is set to, never the level of a line).
enum class LogLevel : std::uint32_t {
  off = ORBITE_LOG_OFF,
  error = ORBITE_LOG_ERROR,
  warn = ORBITE_LOG_WARN,
  info = ORBITE_LOG_INFO,
  debug = ORBITE_LOG_DEBUG,
  trace = ORBITE_LOG_TRACE,
};

/// "off", "error", "warn", "info", "debug", "trace" (the names of the config
/// key "log_level" and of ORBITE_LOG).
inline const char *log_level_name(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::off: return "off";
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
    case LogLevel::trace: return "trace";
  }
  return "unknown";
}

/// A log callback: the line's level and the line ("[NAME ENDPOINT] text",
/// no newline; the view is valid only during the call).
using LogCallback = std::function<void(LogLevel, std::string_view)>;

namespace detail {

/// The installed callback (owned here; the library holds a pointer to it).
struct LogState {
  std::mutex lock;
  std::unique_ptr<LogCallback> current;
};
inline LogState &log_state() {
  static LogState *s = new LogState();  // never destroyed: library threads may log at exit
  return *s;
}

/// Whether this thread is inside a call of the log callback now.
inline bool &in_log_callback() noexcept {
  static thread_local bool inside = false;
  return inside;
}

/// The C callback: calls the std::function; nothing it throws crosses into
/// the library (it is dropped here).
inline void log_trampoline(std::uint32_t level, const char *message, void *user_data) noexcept {
  bool &inside = in_log_callback();
  inside = true;
  try {
    (*static_cast<LogCallback *>(user_data))(static_cast<LogLevel>(level), std::string_view(message));
  } catch (...) {
  }
  inside = false;
}

}  // namespace detail

/// Sends the library's log lines to `callback` instead of stderr, for the
/// whole process; an empty callback restores stderr. The callback runs on
/// whichever library thread logs, from several threads at once: it must be
/// thread-safe and quick, and call no orbite function (orbite.h,
/// orbite_log_fn). An exception it throws is caught and dropped. When this
/// returns, the previous callback is not running and never runs again (it
/// is destroyed). Which lines come is each engine's level: ORBITE_LOG when
/// set, else the config key "log_level" (default "warn"). Error
/// (UNAVAILABLE) when called from inside the callback.
inline Result<void> try_set_log_callback(LogCallback callback) {
  // From inside the callback the library refuses; answer before locking,
  // since another thread may hold the lock while it waits for this call.
  if (detail::in_log_callback())
    return Failure{Status::unavailable, "orbite_set_log_callback",
                   "the log callback cannot be changed from inside a call of the log callback"};
  detail::LogState &st = detail::log_state();
  std::lock_guard<std::mutex> g(st.lock);
  std::unique_ptr<LogCallback> next;
  if (callback) next = std::make_unique<LogCallback>(std::move(callback));
  orbite_status s = orbite_set_log_callback(next ? detail::log_trampoline : nullptr, next.get());
  if (s != ORBITE_STATUS_OK) return detail::failure(s, "orbite_set_log_callback");
  // The library no longer calls the previous one: it can go.
  st.current = std::move(next);
  return Result<void>();
}
inline void set_log_callback(LogCallback callback) { try_set_log_callback(std::move(callback)).value(); }

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

 private:
  orbite_batch *b_ = nullptr;
  std::size_t n_ = 0;
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
    return detail::read_json<std::vector<Region>>(try_regions_json(), parse_regions);
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
  Result<Stats> try_stats() const { return detail::read_json<Stats>(try_stats_json(), parse_stats); }
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

#endif  // ORBITE_HPP
