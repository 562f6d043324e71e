// What the plugin learns from the NIXL libraries loaded in its process,
// without linking against any of them: the NIXL release that runs here,
// and NIXL's own log (the Abseil logger inside libnixl_common.so), so that
// the plugin's messages land where NIXL's do, filtered by NIXL_LOG_LEVEL.
#ifndef ORBITE_NIXL_PROCESS_H
#define ORBITE_NIXL_PROCESS_H

#include <string>
#include <string_view>

namespace orbite_nixl {

enum class Severity { info = 0, warning = 1, error = 2 };

/// Writes one line to NIXL's log (Abseil, as NIXL_INFO/WARN/ERROR do) when
/// the process's libnixl_common.so offers its logger, else to stderr in the
/// same shape. Thread-safe; never throws.
void log(Severity severity, std::string_view message) noexcept;

/// The NIXL release that runs in this process, as NIXL reports it at load
/// ("NIXL version: X" in libnixl_common.so); "" when no loaded NIXL library
/// carries it. `where` receives the library's path.
std::string runningNixlRelease(std::string *where = nullptr);

}  // namespace orbite_nixl

#endif
