/*
 * orbite/stats.hpp - part of orbite.hpp (include that).
 *
 * Region (what a peer publishes) and Stats (the engine's counters), read
 * through orbite_peer_regions and orbite_engine_stats.
 */
#ifndef ORBITE_STATS_HPP
#define ORBITE_STATS_HPP

#include "base.hpp"

namespace orbite {

// ---- peer regions and stats, typed ------------------------------------------

/// One region a peer publishes (orbite_peer_regions).
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

namespace detail {

/// The Region of a C orbite_region_info.
inline Region region_of(const orbite_region_info &c) {
  Region r;
  r.id = c.id;
  r.epoch = c.epoch;
  r.addr = c.addr;
  r.length = c.length;
  r.access = static_cast<Access>(c.access & (ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE));
  r.kind_name = c.kind ? c.kind : "";
  r.kind = memory_kind_from_name(r.kind_name);
  return r;
}

}  // namespace detail

/// Counters of one transport (stats "transports" values).
struct TransportStats {
  std::uint64_t requests_completed = 0, requests_failed = 0, bytes_completed = 0, bytes_failed = 0;
  std::uint64_t served_requests = 0, served_bytes = 0, served_failed = 0, wire_bytes_sent = 0;
  /// IPC: what importers say they moved through the grant board, unchecked.
  std::uint64_t claimed_requests = 0, claimed_bytes = 0;
  std::uint64_t requests_fell_through = 0;
  /// TCP: requests that travelled in the frame of the READ before them
  /// (config `coalesce`).
  std::uint64_t requests_coalesced = 0;
  /// TCP: WRITEs from peers cut mid-payload, their range part new, part old.
  std::uint64_t served_torn = 0;
};

/// What an IPC transport holds (stats "ipc" values).
struct IpcStats {
  std::uint64_t exports_open = 0, exports_retained = 0, imports_opened = 0, imports_closed = 0;
  std::uint64_t imports_cached = 0, imports_retained = 0, local_owners_fenced = 0, mapping_bytes_charged = 0;
  std::uint64_t imports_released_after_exit = 0;
  /// Groups through cached imports that ran inside the source's grant on
  /// the channel's board (no round trip), and those revalidated and
  /// receipted over the channel (requester side).
  std::uint64_t groups_without_round_trip = 0, groups_with_round_trips = 0;
  /// Of the first, direct-route copies (Direct::copy) through the import
  /// their route holds, outside the relocation cache's lock.
  std::uint64_t direct_copies = 0;
  std::uint64_t pending_groups = 0, progress_workers = 0;
  /// Exports released because their importing process exited (source side).
  std::uint64_t exports_reclaimed_after_exit = 0;
  /// Accepted offers answered off the I/O thread after waiting for the
  /// producer stream handed over for the memory (source side).
  std::uint64_t exports_answered_after_producer_wait = 0;
  /// Groups reported UNQUIESCED at their deadline whose completion is still
  /// polled, and those whose completion came late (their import was then
  /// closed, or returned to the cache, as usual).
  std::uint64_t late_groups = 0, late_completions = 0;
  /// Copies handed to mappings (one per contiguous run with `coalesce`),
  /// and requests that moved in the copy before them (requester side).
  std::uint64_t copies_issued = 0, requests_coalesced = 0;
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
  std::uint64_t invalid_records = 0;  ///< values under the prefix that were not valid (signed) records: ignored
  std::uint64_t reclaims = 0;         ///< own key found gone or overwritten while the lease lived, put back
};

/// A typed snapshot of the engine's counters (orbite_engine_stats).
struct Stats {
  std::map<std::string, TransportStats> transports;  ///< "tcp", "shm", "nvlink", "mnnvl", "cma"
  std::uint64_t inflight_bytes = 0, peers = 0, peers_alive = 0, incoming_connections = 0, regions = 0;
  std::uint64_t protocol_errors = 0, connections_refused = 0, fabric_channels_accepted = 0;
  /// Peers that advertise MNNVL toward which it is not used (the cause is
  /// in the notes).
  std::uint64_t mnnvl_peers_refused = 0;
  /// Incoming connections that ended without completing their handshake.
  std::uint64_t handshakes_abandoned = 0;
  std::uint64_t auth_failures = 0, ipc_uid_refusals = 0, offers_expired = 0;
  std::uint64_t revokes_received = 0, revoke_passes = 0;
  /// Give-back passes that overlapped another of the same peer: always 0.
  std::uint64_t revoke_passes_overlapping = 0;
  /// TCP answers to requests failed at their deadline, read and dropped.
  std::uint64_t answers_dropped = 0;
  /// This engine's log lines dropped because stderr did not take them in time.
  std::uint64_t log_lines_dropped = 0;
  NotificationStats notifications;
  DiscoveryStats discovery;
  IoStats io;
  std::map<std::string, IpcStats> ipc;  ///< per IPC transport running ("shm", "cma", "nvlink", "mnnvl")
  NvlinkStats nvlink;
  std::map<std::string, std::string> transports_available;  ///< "available", "not available: why" or "failed: why" (a sticky CUDA error: restart the process)
  /// Findings that make a transport unusable or slow for some memory, in
  /// words, with the key to change (the latest 32).
  std::vector<std::string> notes;
  /// Every number of the snapshot by its path ("ipc.shm.exports_open"),
  /// also those of a newer library that this header does not type.
  std::map<std::string, std::uint64_t> numbers;
  /// Paths of the snapshot this header has no member for (empty when the
  /// header and the library agree; a newer library may add some).
  std::vector<std::string> untyped;

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

/// Where one path of a stats snapshot goes: its pattern (each map key or
/// list index a `*`, given to set in `keys`) and whether it is a text.
struct StatField {
  const char *pattern;
  bool text;
  void (*set)(Stats &s, const std::vector<std::string> &keys, std::uint64_t number, const char *text);
};

/// Element `index` of a list, grown to hold it.
inline std::uint64_t &list_at(std::vector<std::uint64_t> &v, const std::string &index) {
  std::size_t i = static_cast<std::size_t>(std::strtoull(index.c_str(), nullptr, 10));
  if (v.size() <= i) v.resize(i + 1);
  return v[i];
}

// One line per path the library reports (src/engine/stats.rs);
// src/engine/stats.rs's schema test reads the patterns between the two
// `stats-schema` lines and fails when either side has one the other lacks.
#define ORBITE_STAT(pattern, member) \
  { pattern, false, [](Stats &s, const std::vector<std::string> &k, std::uint64_t v, const char *) { (void)k; s.member = v; } }
#define ORBITE_STAT_TEXT(pattern, member) \
  { pattern, true, [](Stats &s, const std::vector<std::string> &k, std::uint64_t, const char *t) { s.member = t; } }

inline const std::vector<StatField> &stat_fields() {
  static const std::vector<StatField> fields = {
      // stats-schema-begin
      ORBITE_STAT("transports.*.requests_completed", transports[k[0]].requests_completed),
      ORBITE_STAT("transports.*.requests_failed", transports[k[0]].requests_failed),
      ORBITE_STAT("transports.*.bytes_completed", transports[k[0]].bytes_completed),
      ORBITE_STAT("transports.*.bytes_failed", transports[k[0]].bytes_failed),
      ORBITE_STAT("transports.*.served_requests", transports[k[0]].served_requests),
      ORBITE_STAT("transports.*.served_bytes", transports[k[0]].served_bytes),
      ORBITE_STAT("transports.*.served_failed", transports[k[0]].served_failed),
      ORBITE_STAT("transports.*.wire_bytes_sent", transports[k[0]].wire_bytes_sent),
      ORBITE_STAT("transports.*.claimed_requests", transports[k[0]].claimed_requests),
      ORBITE_STAT("transports.*.claimed_bytes", transports[k[0]].claimed_bytes),
      ORBITE_STAT("transports.*.requests_fell_through", transports[k[0]].requests_fell_through),
      ORBITE_STAT("transports.*.requests_coalesced", transports[k[0]].requests_coalesced),
      ORBITE_STAT("transports.*.served_torn", transports[k[0]].served_torn),
      ORBITE_STAT("inflight_bytes", inflight_bytes),
      ORBITE_STAT("peers", peers),
      ORBITE_STAT("peers_alive", peers_alive),
      ORBITE_STAT("incoming_connections", incoming_connections),
      ORBITE_STAT("regions", regions),
      ORBITE_STAT("protocol_errors", protocol_errors),
      ORBITE_STAT("connections_refused", connections_refused),
      ORBITE_STAT("handshakes_abandoned", handshakes_abandoned),
      ORBITE_STAT("fabric_channels_accepted", fabric_channels_accepted),
      ORBITE_STAT("mnnvl_peers_refused", mnnvl_peers_refused),
      ORBITE_STAT("auth_failures", auth_failures),
      ORBITE_STAT("ipc_uid_refusals", ipc_uid_refusals),
      ORBITE_STAT("offers_expired", offers_expired),
      ORBITE_STAT("revokes_received", revokes_received),
      ORBITE_STAT("answers_dropped", answers_dropped),
      ORBITE_STAT("revoke_passes", revoke_passes),
      ORBITE_STAT("revoke_passes_overlapping", revoke_passes_overlapping),
      ORBITE_STAT("log_lines_dropped", log_lines_dropped),
      ORBITE_STAT("notifications.sent", notifications.sent),
      ORBITE_STAT("notifications.delivered", notifications.delivered),
      ORBITE_STAT("notifications.refused", notifications.refused),
      ORBITE_STAT("notifications.not_sent", notifications.not_sent),
      ORBITE_STAT("notifications.received", notifications.received),
      ORBITE_STAT("notifications.rejected", notifications.rejected),
      ORBITE_STAT("notifications.queued", notifications.queued),
      ORBITE_STAT("discovery.enabled", discovery.enabled),
      ORBITE_STAT("discovery.connected", discovery.connected),
      ORBITE_STAT("discovery.failures", discovery.failures),
      ORBITE_STAT("discovery.reconnects", discovery.reconnects),
      ORBITE_STAT("discovery.reregistrations", discovery.reregistrations),
      ORBITE_STAT("discovery.watched", discovery.watched),
      ORBITE_STAT("discovery.peers_gone", discovery.peers_gone),
      ORBITE_STAT("discovery.invalid_records", discovery.invalid_records),
      ORBITE_STAT("discovery.reclaims", discovery.reclaims),
      ORBITE_STAT("io.threads_max", io.threads_max),
      ORBITE_STAT("io.threads", io.threads),
      ORBITE_STAT("io.wakeups", io.wakeups),
      ORBITE_STAT("io.polled_turns", io.polled_turns),
      ORBITE_STAT("io.wakeups_per_1000_requests", io.wakeups_per_1000_requests),
      {"io.connections_per_thread.*", false,
       [](Stats &s, const std::vector<std::string> &k, std::uint64_t v, const char *) {
         list_at(s.io.connections_per_thread, k[0]) = v;
       }},
      ORBITE_STAT("ipc.*.exports_open", ipc[k[0]].exports_open),
      ORBITE_STAT("ipc.*.exports_retained", ipc[k[0]].exports_retained),
      ORBITE_STAT("ipc.*.imports_opened", ipc[k[0]].imports_opened),
      ORBITE_STAT("ipc.*.imports_closed", ipc[k[0]].imports_closed),
      ORBITE_STAT("ipc.*.imports_cached", ipc[k[0]].imports_cached),
      ORBITE_STAT("ipc.*.imports_retained", ipc[k[0]].imports_retained),
      ORBITE_STAT("ipc.*.imports_released_after_exit", ipc[k[0]].imports_released_after_exit),
      ORBITE_STAT("ipc.*.local_owners_fenced", ipc[k[0]].local_owners_fenced),
      ORBITE_STAT("ipc.*.mapping_bytes_charged", ipc[k[0]].mapping_bytes_charged),
      ORBITE_STAT("ipc.*.groups_without_round_trip", ipc[k[0]].groups_without_round_trip),
      ORBITE_STAT("ipc.*.groups_with_round_trips", ipc[k[0]].groups_with_round_trips),
      ORBITE_STAT("ipc.*.direct_copies", ipc[k[0]].direct_copies),
      ORBITE_STAT("ipc.*.copies_issued", ipc[k[0]].copies_issued),
      ORBITE_STAT("ipc.*.requests_coalesced", ipc[k[0]].requests_coalesced),
      ORBITE_STAT("ipc.*.exports_reclaimed_after_exit", ipc[k[0]].exports_reclaimed_after_exit),
      ORBITE_STAT("ipc.*.exports_answered_after_producer_wait", ipc[k[0]].exports_answered_after_producer_wait),
      ORBITE_STAT("ipc.*.pending_groups", ipc[k[0]].pending_groups),
      ORBITE_STAT("ipc.*.late_groups", ipc[k[0]].late_groups),
      ORBITE_STAT("ipc.*.late_completions", ipc[k[0]].late_completions),
      ORBITE_STAT("ipc.*.progress_workers", ipc[k[0]].progress_workers),
      ORBITE_STAT("ipc.*.copies_by_device.*.copies", ipc[k[0]].copies_by_device[std::atoi(k[1].c_str())].copies),
      ORBITE_STAT("ipc.*.copies_by_device.*.bytes", ipc[k[0]].copies_by_device[std::atoi(k[1].c_str())].bytes),
      ORBITE_STAT("nvlink.stream_slots", nvlink.stream_slots),
      ORBITE_STAT("nvlink.active_streams", nvlink.active_streams),
      ORBITE_STAT("nvlink.retained_streams", nvlink.retained_streams),
      ORBITE_STAT("nvlink.pending_groups", nvlink.pending_groups),
      ORBITE_STAT("nvlink.progress_workers", nvlink.progress_workers),
      ORBITE_STAT_TEXT("transports_available.*", transports_available[k[0]]),
      {"notes.*", true,
       [](Stats &s, const std::vector<std::string> &k, std::uint64_t, const char *t) {
         std::size_t i = static_cast<std::size_t>(std::strtoull(k[0].c_str(), nullptr, 10));
         if (s.notes.size() <= i) s.notes.resize(i + 1);
         s.notes[i] = t;
       }},
      // stats-schema-end
  };
  return fields;
}

#undef ORBITE_STAT
#undef ORBITE_STAT_TEXT

/// Whether `path` matches `pattern` segment by segment (`*` matches any one
/// segment, which is appended to keys).
inline bool path_matches(const char *pattern, const char *path, std::vector<std::string> &keys) {
  keys.clear();
  const char *p = pattern, *q = path;
  for (;;) {
    const char *pe = p, *qe = q;
    while (*pe && *pe != '.') ++pe;
    while (*qe && *qe != '.') ++qe;
    if (pe - p == 1 && *p == '*')
      keys.emplace_back(q, qe);
    else if (pe - p != qe - q || std::string_view(p, pe - p) != std::string_view(q, qe - q))
      return false;
    if (!*pe || !*qe) return !*pe && !*qe;
    p = pe + 1;
    q = qe + 1;
  }
}

/// The typed Stats of a snapshot.
inline Stats stats_of(const orbite_stats *snap) {
  Stats s;
  std::vector<std::string> keys;
  const std::size_t n = orbite_stats_count(snap);
  for (std::size_t i = 0; i < n; ++i) {
    const char *path = nullptr, *text = nullptr;
    std::uint64_t v = 0;
    if (orbite_stats_entry(snap, i, &path, &v, &text) != ORBITE_STATUS_OK) continue;
    if (!text) s.numbers[path] = v;
    bool typed = false;
    for (const StatField &f : stat_fields()) {
      if (f.text == (text != nullptr) && path_matches(f.pattern, path, keys)) {
        f.set(s, keys, v, text);
        typed = true;
        break;
      }
    }
    if (!typed) s.untyped.push_back(path);
  }
  return s;
}

}  // namespace detail

}  // namespace orbite

#endif  // ORBITE_STATS_HPP
