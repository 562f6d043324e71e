//! `EngineStats`: a serialisable snapshot of an engine's counters.

use super::Engine;
pub use crate::counters::NotificationStats;
use crate::counters::{Counters, EngineEventCounts, TransportStats};
use crate::kinds::TransportKind;
use crate::transport::ipc::export::ExportCounts;
use crate::transport::ipc::requester::ImportCounts;
use serde::Serialize;
use std::collections::BTreeMap;

/// What an IPC transport holds right now: its requester side's counts
/// and its source side's, each reported under the names their owners
/// declare, and what the engine adds.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct IpcStats {
    /// The requester side (imports, groups, copies).
    #[serde(flatten)]
    pub imports: ImportCounts,
    /// The source side (exports).
    #[serde(flatten)]
    pub exports: ExportCounts,
    /// Physical bytes charged against the mapping budget by exports and imports.
    pub mapping_bytes_charged: u64,
    /// Groups whose completion the progress worker is waiting for (those
    /// reported at their deadline included).
    pub pending_groups: u64,
    /// Progress workers running (0 or 1; started on first use).
    pub progress_workers: u64,
    /// Copies posted per GPU (CUDA transports): which device's context ran
    /// them, by ordinal (as this process sees the devices).
    pub copies_by_device: BTreeMap<i32, DeviceCopyStats>,
}

/// What one GPU's context copied for a CUDA transport.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct DeviceCopyStats {
    /// Copies posted.
    pub copies: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// `EngineStats.nvlink`: the CUDA stream pool and completion progress.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct NvlinkStats {
    /// Stream-pool slots in existence, across contexts.
    pub stream_slots: u64,
    /// Slots lent to copy groups now.
    pub active_streams: u64,
    /// Quarantined slots (retained after uncertain DMA or cleanup).
    pub retained_streams: u64,
    /// Copy groups waiting for their trailing event on the progress worker.
    pub pending_groups: u64,
    /// Completion progress workers running (one per transport, lazily).
    pub progress_workers: u64,
}

/// A snapshot of one engine's counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct EngineStats {
    /// Per transport (`tcp`, `shm`, `nvlink`, `mnnvl`).
    pub transports: BTreeMap<String, TransportStats>,
    /// Bytes admitted and not yet completed (requester side).
    pub inflight_bytes: u64,
    /// Outgoing peers known.
    pub peers: usize,
    /// Outgoing peers whose connection is alive.
    pub peers_alive: usize,
    /// Incoming connections being served (control and IPC).
    pub incoming_connections: usize,
    /// Regions registered.
    pub regions: usize,
    /// Engine-wide events (protocol errors, refusals, authentication
    /// failures, revokes, ...), each at the top level under its name.
    #[serde(flatten)]
    pub events: EngineEventCounts,
    /// Notifications sent and received.
    pub notifications: NotificationStats,
    /// Discovery on etcd (`enabled` false without it).
    pub discovery: crate::discovery::DiscoveryStats,
    /// The I/O threads serving the connections.
    pub io: IoStats,
    /// What the cooperative IPC transports hold (`shm`, `nvlink`).
    pub ipc: BTreeMap<String, IpcStats>,
    /// The NVLink stream pool (all zero where NVLink is not running).
    pub nvlink: NvlinkStats,
    /// Transports this engine offers, and why others are absent.
    pub transports_available: BTreeMap<String, String>,
    /// Findings that make a transport unusable or slow for some memory (a
    /// region larger than the mapping budget, ...), in words, with the key
    /// to change; the latest 32.
    pub notes: Vec<String>,
}

/// The connection layer's I/O threads, as `orbite_engine_stats_json`
/// reports them under `io`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct IoStats {
    /// Most I/O threads (config `io_threads`).
    pub threads_max: u32,
    /// I/O threads running (they start as connections come).
    pub threads: usize,
    /// Connections each running I/O thread serves.
    pub connections_per_thread: Vec<usize>,
    /// Turns of the event loops that found something to do.
    pub wakeups: u64,
    /// Of them, turns whose events came while the thread was polling for
    /// them (config `io_poll_us`): no sleep and no wake-up.
    pub polled_turns: u64,
    /// `wakeups` per 1000 TCP requests this engine completed or failed
    /// (0 before the first): what a request costs in thread wake-ups.
    pub wakeups_per_1000_requests: u64,
}

/// Live values the engine gathers for a snapshot.
pub(crate) struct Live {
    pub inflight_bytes: u64,
    pub peers: usize,
    pub peers_alive: usize,
    pub incoming_connections: usize,
    pub regions: usize,
    pub ipc: Vec<LiveIpc>,
    pub nvlink_pool: Option<(crate::cuda::stream_pool::PoolCounts, (u64, u64))>,
    pub transports_available: BTreeMap<String, String>,
    pub notes: Vec<String>,
    pub log_lines_dropped: u64,
    pub notifications_queued: usize,
    pub discovery: crate::discovery::DiscoveryStats,
    pub io: IoStats,
}

/// What one IPC transport holds now.
pub(crate) struct LiveIpc {
    pub name: String,
    pub exports: ExportCounts,
    pub imports: ImportCounts,
    /// (pending groups, progress workers).
    pub progress: (u64, u64),
    pub copies_by_device: BTreeMap<i32, DeviceCopyStats>,
}

impl EngineStats {
    pub(crate) fn collect(s: &Counters, live: Live) -> EngineStats {
        let transports: BTreeMap<String, TransportStats> =
            TransportKind::ALL.iter().map(|t| (t.name().to_string(), s.transport(*t))).collect();
        let mut io = live.io;
        let tcp = &transports[TransportKind::Tcp.name()];
        let requests = tcp.requests_completed + tcp.requests_failed;
        io.wakeups_per_1000_requests = (io.wakeups * 1000).checked_div(requests).unwrap_or(0);
        let ipc = live
            .ipc
            .into_iter()
            .map(
                |LiveIpc { name, exports, imports, progress: (pending_groups, progress_workers), copies_by_device }| {
                    let mapping_bytes_charged = exports.charged_bytes + imports.charged_bytes;
                    let t = IpcStats {
                        imports,
                        exports,
                        mapping_bytes_charged,
                        pending_groups,
                        progress_workers,
                        copies_by_device,
                    };
                    (name, t)
                },
            )
            .collect();
        let nvlink = live
            .nvlink_pool
            .map(|(p, (pending, workers))| NvlinkStats {
                stream_slots: p.stream_slots,
                active_streams: p.active_streams,
                retained_streams: p.retained_streams,
                pending_groups: pending,
                progress_workers: workers,
            })
            .unwrap_or_default();
        EngineStats {
            transports,
            inflight_bytes: live.inflight_bytes,
            peers: live.peers,
            peers_alive: live.peers_alive,
            incoming_connections: live.incoming_connections,
            regions: live.regions,
            events: EngineEventCounts { log_lines_dropped: live.log_lines_dropped, ..s.events.snapshot() },
            notifications: NotificationStats { queued: live.notifications_queued as u64, ..s.notifications.snapshot() },
            discovery: live.discovery,
            io,
            ipc,
            nvlink,
            transports_available: live.transports_available,
            notes: live.notes,
        }
    }

    /// JSON text of the snapshot.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }

    /// Every value of the snapshot by its dotted path in the JSON
    /// (`transports.tcp.requests_completed`, `io.connections_per_thread.0`,
    /// `notes.3`), in path order: numbers as they are, booleans as 0 or 1,
    /// texts as texts. What `orbite_engine_stats` gives C without JSON.
    pub fn entries(&self) -> Vec<(String, StatValue)> {
        let mut out = Vec::new();
        match serde_json::to_value(self) {
            Ok(v) => flatten(String::new(), &v, &mut out),
            Err(e) => out.push(("error".into(), StatValue::Text(e.to_string()))),
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// One value of [`EngineStats::entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatValue {
    /// A counter, size or boolean (0 or 1).
    Number(u64),
    /// A text (`transports_available.*`, `notes.*`).
    Text(String),
}

/// Appends the leaves of `v` under `path`.
fn flatten(path: String, v: &serde_json::Value, out: &mut Vec<(String, StatValue)>) {
    use serde_json::Value;
    let child = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| flatten(child(k), v, out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| flatten(child(&i.to_string()), v, out)),
        Value::Bool(b) => out.push((path, StatValue::Number(*b as u64))),
        // Every number of the stats is an unsigned integer.
        Value::Number(n) => out.push((path, StatValue::Number(n.as_u64().unwrap_or(u64::MAX)))),
        Value::String(t) => out.push((path, StatValue::Text(t.clone()))),
        Value::Null => {}
    }
}

impl Engine {
    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineStats {
        let i = &self.inner;
        let peers = i.peers.load();
        let mut avail = std::collections::BTreeMap::new();
        avail.insert("tcp".to_string(), "available".to_string());
        for t in &i.ipc {
            let state = match t.requester.usable() {
                Ok(()) => "available".to_string(),
                Err(e) => format!("failed: {}", e.message()),
            };
            avail.insert(t.kind.name().to_string(), state);
        }
        for (k, why) in &i.ipc_unavailable {
            avail.insert(k.name().to_string(), format!("not available: {why}"));
        }
        let refused: Vec<String> = peers
            .values()
            .flat_map(|p| p.links.iter())
            .filter_map(|(k, l)| {
                let l = l.as_ref().ok()?;
                l.refused().map(|why| format!("{}: {} cannot be used: {why}", l.label, k.name()))
            })
            .collect();
        EngineStats::collect(
            &i.stats,
            Live {
                inflight_bytes: i.budget.used(),
                peers: peers.len(),
                peers_alive: peers.values().filter(|p| p.conn.dead_reason().is_none()).count(),
                notifications_queued: i.inbox.len(),
                discovery: i.discovery.get().map(|d| d.stats()).unwrap_or_default(),
                io: IoStats {
                    threads_max: i.config.io_threads,
                    threads: i.reactor.threads(),
                    connections_per_thread: i.reactor.connections(),
                    wakeups: i.reactor.wakeups(),
                    polled_turns: i.reactor.polled(),
                    wakeups_per_1000_requests: 0,
                },
                incoming_connections: i.listeners.live(),
                regions: i.regions.len(),
                ipc: i
                    .ipc
                    .iter()
                    .map(|t| LiveIpc {
                        name: t.kind.name().to_string(),
                        exports: t.exports.counts(),
                        imports: t.requester.counts(),
                        progress: t.requester.progress_counts(),
                        copies_by_device: t
                            .copies
                            .as_ref()
                            .map(|f| f())
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(d, (copies, bytes))| (d, DeviceCopyStats { copies, bytes }))
                            .collect(),
                    })
                    .collect(),
                nvlink_pool: i.ipc.iter().find_map(|t| t.pool.as_ref().map(|f| (f(), t.requester.progress_counts()))),
                transports_available: avail,
                // The notes, then each peer's transport found unable to
                // reach it for good (CMA refused by the kernel, ...).
                notes: i.notes.lock().iter().cloned().chain(refused).collect(),
                log_lines_dropped: i.log.dropped(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot with one entry in every map and list, so that every
    /// path of the schema appears.
    pub(crate) fn every_path() -> EngineStats {
        let mut ipc = IpcStats::default();
        ipc.imports.groups_without_round_trip = 3;
        ipc.copies_by_device.insert(1, DeviceCopyStats { copies: 4, bytes: 4096 });
        EngineStats {
            transports: [("tcp".to_string(), TransportStats { requests_completed: 7, ..Default::default() })].into(),
            inflight_bytes: 5,
            discovery: crate::discovery::DiscoveryStats { enabled: true, ..Default::default() },
            io: IoStats { connections_per_thread: vec![2, 9], ..Default::default() },
            ipc: [("shm".to_string(), ipc)].into(),
            transports_available: [("nvlink".to_string(), "not available: no driver".to_string())].into(),
            notes: vec!["a note".into()],
            ..EngineStats::default()
        }
    }

    /// Guards `flatten`: maps and structs by key, lists by index,
    /// booleans as 0/1, texts kept, in path order.
    #[test]
    fn entries_name_every_value_by_its_path() {
        let e = every_path().entries();
        let get = |p: &str| e.iter().find(|(k, _)| k == p).map(|(_, v)| v.clone());
        assert_eq!(get("transports.tcp.requests_completed"), Some(StatValue::Number(7)));
        assert_eq!(get("ipc.shm.groups_without_round_trip"), Some(StatValue::Number(3)));
        assert_eq!(get("ipc.shm.copies_by_device.1.bytes"), Some(StatValue::Number(4096)));
        assert_eq!(get("io.connections_per_thread.1"), Some(StatValue::Number(9)));
        assert_eq!(get("discovery.enabled"), Some(StatValue::Number(1)));
        assert_eq!(get("discovery.connected"), Some(StatValue::Number(0)));
        assert_eq!(get("transports_available.nvlink"), Some(StatValue::Text("not available: no driver".into())));
        assert_eq!(get("notes.0"), Some(StatValue::Text("a note".into())));
        assert_eq!(get("ipc.shm"), None, "only leaves");
        assert!(e.windows(2).all(|w| w[0].0 < w[1].0), "sorted and distinct");
    }
}

#[cfg(test)]
mod schema {
    use super::tests::every_path;
    use std::collections::BTreeSet;

    /// Paths whose next segment is a map key or a list index, written `*`
    /// in the header's patterns.
    const KEYED: &[&str] =
        &["transports", "ipc", "ipc.*.copies_by_device", "io.connections_per_thread", "transports_available", "notes"];

    /// `path` with each map key and list index replaced by `*`.
    fn pattern(path: &str) -> String {
        let mut out: Vec<&str> = Vec::new();
        for seg in path.split('.') {
            let keyed = KEYED.contains(&out.join(".").as_str());
            out.push(if keyed { "*" } else { seg });
        }
        out.join(".")
    }

    /// The patterns of orbite.hpp's stats table (in orbite/stats.hpp) (the first string literal
    /// of each line between its `stats-schema` marks).
    fn header_patterns() -> BTreeSet<String> {
        let hpp = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/include/orbite/stats.hpp"));
        let begin = hpp.find("// stats-schema-begin").expect("begin mark");
        let end = hpp.find("// stats-schema-end").expect("end mark");
        hpp[begin..end]
            .lines()
            .filter_map(|l| l.split('"').nth(1).filter(|_| l.contains('"')).map(str::to_string))
            .collect()
    }

    /// The stats schema, one fact in one place: every path the library
    /// reports has a member in orbite.hpp's table, and the table names no
    /// path the library does not report. Fails when a counter is added on
    /// one side only (the C++ test checks the same of a live engine:
    /// `Stats::untyped` empty).
    #[test]
    fn the_cpp_header_types_every_stats_path_and_no_other() {
        let rust: BTreeSet<String> = every_path().entries().iter().map(|(p, _)| pattern(p)).collect();
        let cpp = header_patterns();
        let only_rust: Vec<_> = rust.difference(&cpp).collect();
        let only_cpp: Vec<_> = cpp.difference(&rust).collect();
        assert!(only_rust.is_empty(), "paths orbite.hpp does not type: {only_rust:?}");
        assert!(only_cpp.is_empty(), "paths orbite.hpp types that the library does not report: {only_cpp:?}");
        assert!(rust.len() > 70, "{} paths", rust.len());
    }
}
