//! `EngineStats`: a serialisable snapshot of an engine's counters.

use crate::stats::{Stats, TransportStats};
use crate::transport::TransportKind;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// A snapshot of one engine's counters.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EngineStats {
    /// Per transport (`tcp`, `shm`, `nvlink`, `mnnvl`).
    pub transports: BTreeMap<String, TransportStats>,
    /// Bytes admitted and not yet completed (requester side).
    pub inflight_bytes: u64,
    /// Outgoing peers known.
    pub peers: usize,
    /// Outgoing peers whose connection is alive.
    pub peers_alive: usize,
    /// Incoming connections being served.
    pub incoming_connections: usize,
    /// Regions registered.
    pub regions: usize,
    /// Protocol errors seen.
    pub protocol_errors: u64,
    /// Incoming connections refused at the limit.
    pub connections_refused: u64,
    /// Transports this engine advertises, and why others are absent.
    pub transports_available: BTreeMap<String, String>,
}

impl EngineStats {
    pub(crate) fn collect(
        s: &Stats,
        inflight_bytes: u64,
        peers: usize,
        peers_alive: usize,
        incoming_connections: usize,
        regions: usize,
    ) -> EngineStats {
        let transports = TransportKind::ALL
            .iter()
            .map(|t| (t.name().to_string(), s.transport(*t)))
            .collect();
        let mut avail = BTreeMap::new();
        avail.insert("tcp".to_string(), "available".to_string());
        avail.insert(
            "shm".to_string(),
            "not available: not built in this release".to_string(),
        );
        avail.insert(
            "nvlink".to_string(),
            "not available: built without CUDA support".to_string(),
        );
        avail.insert(
            "mnnvl".to_string(),
            "not available: built without CUDA support".to_string(),
        );
        EngineStats {
            transports,
            inflight_bytes,
            peers,
            peers_alive,
            incoming_connections,
            regions,
            protocol_errors: s.protocol_errors.load(Ordering::Relaxed),
            connections_refused: s.connections_refused.load(Ordering::Relaxed),
            transports_available: avail,
        }
    }

    /// JSON text of the snapshot.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}
