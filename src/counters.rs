//! Engine counters, updated lock-free on the hot path.

use crate::kinds::TransportKind;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
struct PerTransport {
    requests_completed: AtomicU64,
    requests_failed: AtomicU64,
    bytes_completed: AtomicU64,
    bytes_failed: AtomicU64,
    served_requests: AtomicU64,
    served_bytes: AtomicU64,
    served_failed: AtomicU64,
    claimed_requests: AtomicU64,
    claimed_bytes: AtomicU64,
    wire_bytes_sent: AtomicU64,
    fell_through: AtomicU64,
    coalesced: AtomicU64,
}

/// Live counters of one engine.
#[derive(Default)]
pub struct Counters {
    per: [PerTransport; 4],
    /// Protocol errors seen on any connection.
    pub protocol_errors: AtomicU64,
    /// Incoming connections refused at the connection limit.
    pub connections_refused: AtomicU64,
    /// Incoming TCP connections that ended without completing their
    /// handshake (silent, too slow, closed for a newer one, refused).
    pub handshakes_abandoned: AtomicU64,
    /// MNNVL channels accepted over TCP (fabric handles, fabric domain).
    pub fabric_channels: AtomicU64,
    /// Incoming connections and channels that failed authentication.
    pub auth_failures: AtomicU64,
    /// IPC channels refused because their process's user may not connect.
    pub ipc_uid_refusals: AtomicU64,
    /// Export offers released because the requester did not answer in time.
    pub offers_expired: AtomicU64,
    /// Notification frames this engine sent.
    pub notifications_sent: AtomicU64,
    /// Notifications this engine sent that the receiver queued.
    pub notifications_delivered: AtomicU64,
    /// Notifications this engine sent that the receiver refused.
    pub notifications_refused: AtomicU64,
    /// Notifications never sent (their batch failed, the peer was gone,
    /// or the caller's deadline passed first).
    pub notifications_not_sent: AtomicU64,
    /// Notifications received and queued here.
    pub notifications_received: AtomicU64,
    /// Notifications refused here (queue full, too large).
    pub notifications_rejected: AtomicU64,
    /// `Revoke` frames received from sources (give back your imports).
    pub revokes_received: AtomicU64,
    /// Passes that gave imports back after them (revokes arriving during
    /// a pass fold into one more).
    pub revoke_passes: AtomicU64,
    /// Passes that started while another for the same peer still ran
    /// (never, while passes fold: the check of that promise).
    pub revoke_passes_overlapping: AtomicU64,
    /// TCP answers to requests failed at their deadline, read and dropped.
    pub answers_dropped: AtomicU64,
}

/// Counters of one transport, as reported.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct TransportStats {
    /// Requests this engine submitted that completed.
    pub requests_completed: u64,
    /// Requests this engine submitted that failed.
    pub requests_failed: u64,
    /// Bytes of completed requests.
    pub bytes_completed: u64,
    /// Bytes of failed requests.
    pub bytes_failed: u64,
    /// Requests peers made of this engine that it served, as they arrived
    /// (over TCP, READs a peer coalesced arrive as one).
    pub served_requests: u64,
    /// Bytes served to peers.
    pub served_bytes: u64,
    /// Requests from peers that this engine refused or failed.
    pub served_failed: u64,
    /// IPC: requests importers say they moved through the grant board on
    /// their own (no receipt, nothing this engine saw or checked; saturating).
    pub claimed_requests: u64,
    /// Their bytes, as claimed.
    pub claimed_bytes: u64,
    /// Bytes this engine's requester side wrote to peers' sockets (frames
    /// and WRITE payload).
    pub wire_bytes_sent: u64,
    /// Requests AUTO first routed here that moved to TCP before anything
    /// was posted (the reason is in the batch's notes).
    pub requests_fell_through: u64,
    /// TCP: requests that moved in the frame of the request before them
    /// (`coalesce`). The IPC transports count theirs in
    /// `ipc.<transport>.requests_coalesced`.
    pub requests_coalesced: u64,
}

impl Counters {
    /// Records a finished request of this engine.
    pub fn record_request(&self, t: TransportKind, ok: bool, bytes: u64) {
        self.record_requests(t, ok, 1, bytes);
    }

    /// Records `n` requests that ended alike, `bytes` in all.
    pub fn record_requests(&self, t: TransportKind, ok: bool, n: u64, bytes: u64) {
        let p = &self.per[t.index()];
        if ok {
            p.requests_completed.fetch_add(n, Ordering::Relaxed);
            p.bytes_completed.fetch_add(bytes, Ordering::Relaxed);
        } else {
            p.requests_failed.fetch_add(n, Ordering::Relaxed);
            p.bytes_failed.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Records a request served to a peer.
    pub fn record_served(&self, t: TransportKind, ok: bool, bytes: u64) {
        let p = &self.per[t.index()];
        if ok {
            p.served_requests.fetch_add(1, Ordering::Relaxed);
            p.served_bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            p.served_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records `n` requests served to a peer, `bytes` in all (a receipt).
    pub fn record_served_n(&self, t: TransportKind, n: u64, bytes: u64) {
        let p = &self.per[t.index()];
        p.served_requests.fetch_add(n, Ordering::Relaxed);
        p.served_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records what an importer says it moved through the grant board
    /// (saturating: a claim cannot wrap the counters).
    pub fn record_claimed(&self, t: TransportKind, n: u64, bytes: u64) {
        let p = &self.per[t.index()];
        let add = |c: &AtomicU64, v: u64| {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(x.saturating_add(v)));
        };
        add(&p.claimed_requests, n);
        add(&p.claimed_bytes, bytes);
    }

    /// Records bytes written to a peer's socket by the requester side.
    pub fn record_wire_sent(&self, t: TransportKind, bytes: u64) {
        self.per[t.index()].wire_bytes_sent.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records `n` requests that left transport `t` for TCP.
    pub fn record_fell_through(&self, t: TransportKind, n: u64) {
        self.per[t.index()].fell_through.fetch_add(n, Ordering::Relaxed);
    }

    /// Records `n` requests that moved in the unit of the one before them.
    pub fn record_coalesced(&self, t: TransportKind, n: u64) {
        if n > 0 {
            self.per[t.index()].coalesced.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Snapshot of one transport.
    pub fn transport(&self, t: TransportKind) -> TransportStats {
        let p = &self.per[t.index()];
        TransportStats {
            requests_completed: p.requests_completed.load(Ordering::Relaxed),
            requests_failed: p.requests_failed.load(Ordering::Relaxed),
            bytes_completed: p.bytes_completed.load(Ordering::Relaxed),
            bytes_failed: p.bytes_failed.load(Ordering::Relaxed),
            served_requests: p.served_requests.load(Ordering::Relaxed),
            served_bytes: p.served_bytes.load(Ordering::Relaxed),
            served_failed: p.served_failed.load(Ordering::Relaxed),
            claimed_requests: p.claimed_requests.load(Ordering::Relaxed),
            claimed_bytes: p.claimed_bytes.load(Ordering::Relaxed),
            wire_bytes_sent: p.wire_bytes_sent.load(Ordering::Relaxed),
            requests_fell_through: p.fell_through.load(Ordering::Relaxed),
            requests_coalesced: p.coalesced.load(Ordering::Relaxed),
        }
    }
}
