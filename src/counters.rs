//! Engine counters, updated lock-free on the hot path.

use crate::kinds::TransportKind;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares a set of counters once: a live struct of `AtomicU64`s that
/// the hot path bumps, a snapshot struct of the same fields as `u64` (with
/// their docs and serde attributes, so the reported name is written where
/// the counter is), and `snapshot()` between them. Fields listed under
/// `gauges` exist in the snapshot only, for the owner to fill with what it
/// measures at that moment (a table's size, a cache's entries).
///
/// Adding a counter is one line here plus the line that bumps it; the
/// stats schema test then names the C++ table's missing member.
macro_rules! counter_set {
    (
        $(#[$live_meta:meta])* $live_vis:vis struct $live:ident;
        $(#[$snap_meta:meta])* $snap_vis:vis struct $snap:ident {
            $( $(#[$field_meta:meta])* $field:ident ),* $(,)?
        }
        $( gauges { $( $(#[$gauge_meta:meta])* $gauge:ident : $gauge_ty:ty ),* $(,)? } )?
    ) => {
        $(#[$live_meta])*
        #[derive(Debug, Default, serde::Serialize)]
        $live_vis struct $live {
            $( $(#[$field_meta])* pub $field: std::sync::atomic::AtomicU64, )*
        }

        $(#[$snap_meta])*
        #[derive(Debug, Clone, Default, serde::Serialize, PartialEq, Eq)]
        $snap_vis struct $snap {
            $( $(#[$field_meta])* pub $field: u64, )*
            $( $( $(#[$gauge_meta])* pub $gauge: $gauge_ty, )* )?
        }

        impl $live {
            /// The counters' values now; gauges at their defaults, for the
            /// owner to fill.
            #[allow(clippy::needless_update)]
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $( $field: self.$field.load(std::sync::atomic::Ordering::Relaxed), )*
                    ..Default::default()
                }
            }
        }
    };
}
pub(crate) use counter_set;

counter_set! {
    /// What one transport counts, live.
    struct TransportEvents;
    /// Counters of one transport, as reported.
    pub struct TransportStats {
        /// Requests this engine submitted that completed.
        requests_completed,
        /// Requests this engine submitted that failed.
        requests_failed,
        /// Bytes of completed requests.
        bytes_completed,
        /// Bytes of failed requests.
        bytes_failed,
        /// Requests peers made of this engine that it served, as they arrived
        /// (over TCP, READs a peer coalesced arrive as one).
        served_requests,
        /// Bytes served to peers.
        served_bytes,
        /// Requests from peers that this engine refused or failed (a WRITE
        /// whose payload was cut among them).
        served_failed,
        /// TCP: WRITEs from peers whose payload was cut (the connection
        /// ended) after part of it had landed: their range holds part new,
        /// part old bytes (each logged at WARN with the ranges, docs/operations.md).
        served_torn,
        /// IPC: requests importers say they moved through the grant board on
        /// their own (no receipt, nothing this engine saw or checked; saturating).
        claimed_requests,
        /// Their bytes, as claimed.
        claimed_bytes,
        /// Bytes this engine's requester side wrote to peers' sockets (frames
        /// and WRITE payload).
        wire_bytes_sent,
        /// Requests AUTO first routed here that moved to TCP before anything
        /// was posted (the reason is in the batch's notes).
        requests_fell_through,
        /// TCP: requests that moved in the frame of the request before them
        /// (`coalesce`). The IPC transports count theirs in
        /// `ipc.<transport>.requests_coalesced`.
        requests_coalesced,
    }
}

counter_set! {
    /// Engine-wide events, live (flattened into `EngineStats`).
    pub struct EngineEvents;
    /// Engine-wide events, as reported at the top of `EngineStats`.
    pub struct EngineEventCounts {
        /// Protocol errors seen.
        protocol_errors,
        /// Incoming connections refused at the limit.
        connections_refused,
        /// Incoming TCP connections that ended without completing their
        /// handshake: silent or too slow, closed for a newer one at
        /// `max_pending_handshakes` (or per address), or refused (those that
        /// failed the key are also in `auth_failures`).
        handshakes_abandoned,
        /// MNNVL channels accepted over TCP for the fabric domain (peers on
        /// any host of the NVLink partition).
        fabric_channels_accepted,
        /// Peers that advertise MNNVL toward which it is not used: another
        /// fabric domain (clique), or a failed probe import (each noted
        /// with its cause).
        mnnvl_peers_refused,
        /// Incoming connections and IPC channels that failed authentication.
        auth_failures,
        /// IPC channels refused because their process's user may not connect.
        ipc_uid_refusals,
        /// Export offers released because the requester did not answer within
        /// `offer_timeout_ms`.
        offers_expired,
        /// `Revoke` frames received from sources asking for their imports back.
        revokes_received,
        /// TCP answers that came for requests already failed at their deadline,
        /// read and dropped: the connection stayed in step for the others
        /// (a frozen source that resumes is served on the same connection).
        answers_dropped,
        /// Passes that gave the imports back, counted as each ends (revokes
        /// that came during a pass fold into one more: at most one per peer
        /// runs at a time).
        revoke_passes,
        /// Passes that started while another for the same peer still ran: 0
        /// (the passes of one peer fold; a nonzero count is a bug).
        revoke_passes_overlapping,
    }
    gauges {
        /// This engine's log lines dropped because stderr did not take the
        /// lines before them in time (its queue full; docs/logging.md).
        log_lines_dropped: u64,
    }
}

counter_set! {
    /// Notifications, live.
    pub struct NotificationEvents;
    /// Notifications, as `orbite_engine_stats_json` reports them under
    /// `notifications`.
    pub struct NotificationStats {
        /// Frames this engine sent.
        sent,
        /// Of them, queued by their receiver.
        delivered,
        /// Of them, refused by their receiver (its queue full, too large).
        refused,
        /// Never sent: their batch failed, the peer was gone, or the deadline
        /// passed while earlier requests were still running.
        not_sent,
        /// Received and queued here.
        received,
        /// Refused here.
        rejected,
    }
    gauges {
        /// Waiting here to be taken.
        queued: u64,
    }
}

/// Live counters of one engine.
#[derive(Default)]
pub struct Counters {
    per: [TransportEvents; TransportKind::ALL.len()],
    /// Engine-wide events.
    pub events: EngineEvents,
    /// Notifications sent and received.
    pub notifications: NotificationEvents,
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

    /// Records a WRITE from a peer torn by its cut payload; returns how
    /// many transport `t` has counted so far.
    pub fn record_torn(&self, t: TransportKind) -> u64 {
        self.per[t.index()].served_torn.fetch_add(1, Ordering::Relaxed) + 1
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
        self.per[t.index()].requests_fell_through.fetch_add(n, Ordering::Relaxed);
    }

    /// Records `n` requests that moved in the unit of the one before them.
    pub fn record_coalesced(&self, t: TransportKind, n: u64) {
        if n > 0 {
            self.per[t.index()].requests_coalesced.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Snapshot of one transport.
    pub fn transport(&self, t: TransportKind) -> TransportStats {
        self.per[t.index()].snapshot()
    }
}
