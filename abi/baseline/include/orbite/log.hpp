/*
 * orbite/log.hpp - part of orbite.hpp (include that).
 *
 * The process-wide log sink: LogLevel and set_log_callback.
 */
#ifndef ORBITE_LOG_HPP
#define ORBITE_LOG_HPP

#include "base.hpp"

namespace orbite {

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

}  // namespace orbite

#endif  // ORBITE_LOG_HPP
