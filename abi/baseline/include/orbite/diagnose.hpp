/*
 * orbite/diagnose.hpp - part of orbite.hpp (include that).
 *
 * The doctor: which layer a CUDA transport stands on is broken on this
 * machine, and what to do (orbite_diagnose_json; orbite-doctor prints the
 * same as lines).
 */
#ifndef ORBITE_DIAGNOSE_HPP
#define ORBITE_DIAGNOSE_HPP

#include "base.hpp"

namespace orbite {

/// orbite_diagnose_json: the diagnosis as JSON ({"transport", "handle_type",
/// "usable", "checks": [{"layer", "status", "cause", "text"}]}, orbite.h
/// describes each layer and cause). options_json: "" for every layer and no
/// verdict, or e.g. {"transport": "mnnvl", "peer": "10.0.0.2:5000"}; an
/// unknown key is INVALID_ARGUMENT naming it. Each call runs the checks (a
/// probe allocation; a connection with "peer"), so the buffer starts large
/// enough for any diagnosis rather than growing by retries.
inline Result<std::string> try_diagnose_json(const std::string &options_json = "") {
  std::string buf(64 * 1024, '\0');
  for (int attempt = 0;; ++attempt) {
    std::size_t len = 0;
    orbite_status s = orbite_diagnose_json(options_json.c_str(), &buf[0], buf.size(), &len);
    if (s == ORBITE_STATUS_OK) {
      buf.resize(len);
      return Result<std::string>(std::move(buf));
    }
    if (s != ORBITE_STATUS_BUFFER_TOO_SMALL || attempt == 3) return detail::failure(s, "orbite_diagnose_json");
    buf.assign(len + 1, '\0');
  }
}

/// try_diagnose_json, throwing Error.
inline std::string diagnose_json(const std::string &options_json = "") {
  return try_diagnose_json(options_json).value();
}

}  // namespace orbite

#endif  // ORBITE_DIAGNOSE_HPP
