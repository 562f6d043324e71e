//! Submissions: the entry checks ([`super::check`]), the plan
//! ([`super::plan`]: the transport and its parts, with no lock and no
//! I/O), then each part handed to its transport's executor: the IPC
//! executor runs its groups on the caller (setup, copies and receipts, in
//! order), the TCP executor queues chunks on the peer's connection.

use super::batch_handle::{Batch, SubmitOptions};
use super::plan::{self, Policy};
use super::{Engine, Peer};
use crate::control::region_index::RegionIndex;
use crate::error::{Error, Result, Status};
use crate::kinds::{Transport, TransportKind};
use crate::transfer::{BatchShared, RemoteEffect, Request};
use crate::transport::ipc::executor::{fail_unposted, may_fall_through, IpcExecutor, Leases};
use crate::transport::planned::Item;
use crate::transport::tcp::executor::TcpExecutor;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Submits requests to peer `peer`. Local checks (region, bounds,
    /// length) fail the whole call; remote outcomes are per request in the
    /// [`Batch`]. Returns once every request is admitted (within the
    /// deadline); the IPC transports also do their copies here.
    pub fn submit(&self, peer: u64, requests: &[Request], opts: SubmitOptions) -> Result<Batch> {
        self.submit_inner(peer, requests, opts, None)
    }

    /// Submits `requests` as [`Engine::submit`] does, with a notification:
    /// when every request succeeded, `msg` is delivered to the peer after
    /// their bytes are visible in its memory (and after every request
    /// submitted to the peer before); when any failed, it is not sent. The
    /// batch ends once the notification's outcome is known
    /// ([`Batch::notification`]); a notification the peer refused (its
    /// queue full) fails the batch although every request succeeded.
    pub fn submit_with_notification(
        &self,
        peer: u64,
        requests: &[Request],
        opts: SubmitOptions,
        msg: &[u8],
    ) -> Result<Batch> {
        self.check_notification(msg)?;
        self.submit_inner(peer, requests, opts, Some(msg))
    }

    fn submit_inner(&self, peer: u64, requests: &[Request], opts: SubmitOptions, note: Option<&[u8]>) -> Result<Batch> {
        self.check_submission(requests)?;
        let p = self.peer(peer)?;
        // The peer's Describe and its region index, published by the
        // connection when they arrived (no lock).
        let live = p.describe.load();
        let known = (*live).as_ref().map_err(|e| {
            // A peer that discovery saw replaced or gone stays STALE_PEER.
            let status = if e.status() == Status::StalePeer { Status::StalePeer } else { Status::Unavailable };
            Error::from_status(status, format!("peer {peer} is gone: {}", e.message()))
        })?;
        let deadline = Instant::now() + self.timeout(opts.timeout);
        let (leases, lease_of) = self.check_local(requests, deadline)?;
        let leases = Arc::new(leases);
        if !self.inner.requester_gate.is_open() {
            return Err(Error::Unavailable("the requester side is closed".into()));
        }
        // Resolve remote regions (one refresh of the peer's table if a
        // request names no region, or a range past the end of its region).
        let refreshed;
        let mut peer_caps = known.describe().capabilities;
        let (mut items, mut missing) = plan::resolve(requests, &leases, &lease_of, known);
        if missing {
            if let Ok(d) = p.conn.refresh_describe(deadline) {
                peer_caps = d.capabilities;
                refreshed = RegionIndex::new(d);
                missing = plan::resolve_again(&mut items, &refreshed);
            }
        }
        let why_not = |k: TransportKind| self.ipc_why_not(&p, k);
        let policy = Policy {
            transport: opts.transport,
            order: &self.inner.config.transport_policy,
            shm_uncached: self.inner.ipc_transport(TransportKind::Shm).is_some_and(|t| !t.requester.caches()),
            egm_both: self.egm_both(peer_caps),
            why_not: &why_not,
        };
        let total = items.len();
        let mut planned = plan::plan(peer, items, missing, &policy)?;
        let kind = planned.kind;
        // Every request routed as one chunk on the submission's transport
        // (the TCP executor plans again a request it splits).
        let batch = BatchShared::routed(requests, Some(kind), self.inner.stats.clone(), deadline);
        // Later notifications to the peer follow this batch; its own waits
        // for it. Without one, the batch is listed when the submission
        // returns (below).
        if let Some(msg) = note {
            p.outbox.track(&batch);
            batch.expect_notification();
            p.outbox.send_with(&batch, msg.to_vec());
        }
        let over_tcp = std::mem::take(&mut planned.tcp);
        if let Some(first) = over_tcp.first() {
            batch.plan_each(over_tcp.iter().map(|c| c.at()), 1, TransportKind::Tcp);
            let text = format!(
                "{} of {total} requests go over tcp: {} cannot carry their memory (request {}: local {} memory, the \
                 peer's {} memory); the others over {}",
                over_tcp.len(),
                kind.name(),
                first.at(),
                first.lease.region().kind.name(),
                first.region.map_or("unknown", |r| r.kind.name()),
                kind.name()
            );
            self.inner.log.event(crate::log::Level::Debug, format_args!("{text}"));
            batch.note(text);
            self.run_tcp(&p, &batch, over_tcp, deadline);
        }
        // Requests naming no published region, or a range past the end of
        // the region they start in, fail here, per request: nothing moves
        // outside what the peer published (an import maps no more).
        for (i, e) in planned.take_refused(peer) {
            batch.plan(i, 1, kind);
            batch.fail_request(i, e, RemoteEffect::None);
        }
        match kind {
            TransportKind::Tcp => self.run_tcp(&p, &batch, planned.main, deadline),
            ipc_kind => {
                let leases = Leases { all: &leases };
                let auto = opts.transport == Transport::Auto;
                let rest = self.run_ipc(ipc_kind, &p, &batch, planned.main, &leases, deadline, auto);
                if !rest.is_empty() {
                    self.run_tcp(&p, &batch, rest, deadline);
                }
            }
        }
        // A notification submitted after this returns follows this batch's
        // requests: the outbox lists it only while they run (a small SHM
        // copy ended here: the outbox never sees it).
        if note.is_none() && !batch.requests_ended() {
            p.outbox.track(&batch);
        }
        Ok(Batch::new(batch))
    }

    /// Whether this engine and a peer of capabilities `peer_caps` both
    /// opted in to EGM remote host grants (MNNVL then carries EGM memory).
    pub(super) fn egm_both(&self, peer_caps: u32) -> bool {
        let egm = super::ipc_transports::EGM_CAPABILITY;
        self.inner.capabilities() & egm != 0 && peer_caps & egm != 0
    }

    /// Why the IPC transport `k` cannot reach peer `p` (`None`: it may): no
    /// link (not offered, another host, ...), or a refusal its backend
    /// found for good (CMA: another user, another PID namespace, the
    /// kernel's refusal), said once in the log.
    pub(super) fn ipc_why_not(&self, p: &Peer, k: TransportKind) -> Option<String> {
        let link = match p.link(k) {
            Ok(l) => l,
            Err(why) => return Some(why),
        };
        let Some(t) = self.inner.ipc_transport(k) else {
            return Some(format!("this engine does not offer {}", k.name()));
        };
        t.requester.refused(&link)
    }

    /// Runs the IPC part of a submission on `kind` (its executor). Returns
    /// the requests that fell through to TCP (all remaining ones, in
    /// order); under AUTO (`auto`) only.
    #[allow(clippy::too_many_arguments)]
    fn run_ipc<'a>(
        &self,
        kind: TransportKind,
        p: &Peer,
        batch: &Arc<BatchShared>,
        items: Vec<Item<'a>>,
        leases: &Leases<'a>,
        deadline: Instant,
        auto: bool,
    ) -> Vec<Item<'a>> {
        let (Ok(link), Some(transport)) = (p.link(kind), self.inner.ipc_transport(kind)) else {
            return items;
        };
        // Every request is routed on `kind` already (BatchShared::routed).
        let fall_through = auto
            && self.inner.config.transport_policy.contains(&TransportKind::Tcp)
            && items.iter().all(|c| {
                plan::kinds_allow(TransportKind::Tcp, c.lease.region().kind, c.region.expect("resolved").kind)
            });
        if let Err(e) =
            super::ipc_transports::prepare_local(kind, &self.inner.config, items.iter().map(|c| c.lease.region()))
        {
            // Nothing was posted: as an unposted rejection of the first group.
            if fall_through && may_fall_through(&e) {
                return self.fall_through(kind, batch, items, &e);
            }
            fail_unposted(batch, items.iter().map(|c| c.at()), &e);
            return Vec::new();
        }
        let executor = IpcExecutor {
            kind,
            link: &link,
            requester: &transport.requester,
            gate: &self.inner.requester_gate,
            deadline,
            fall_through,
        };
        // The source process exited (or its engine is gone): the peer is
        // gone, as TCP would report it.
        let source_left = |e: &Error| p.conn.kill(e.clone());
        match executor.run(batch, items, leases, &source_left) {
            Some(unposted) => self.fall_through(kind, batch, unposted.items, &unposted.error),
            None => Vec::new(),
        }
    }

    /// Moves requests nothing was posted for from `kind` to TCP, saying so
    /// on the batch and in the stats.
    fn fall_through<'a>(
        &self,
        kind: TransportKind,
        batch: &BatchShared,
        rest: Vec<Item<'a>>,
        e: &Error,
    ) -> Vec<Item<'a>> {
        batch.plan_each(rest.iter().map(|c| c.at()), 1, TransportKind::Tcp);
        self.inner.stats.record_fell_through(kind, rest.len() as u64);
        let text = format!("{} requests moved from {} to tcp: {e}", rest.len(), kind.name());
        // The first fall-through of each kind and status at WARN, the rest
        // at DEBUG: a steady fall-back does not flood the log.
        let first = self.inner.fell_through.lock().insert((kind, e.status()));
        let level = if first { crate::log::Level::Warn } else { crate::log::Level::Debug };
        self.inner.log.event(level, format_args!("{text}"));
        batch.note(text);
        rest
    }

    /// Runs the TCP part of a submission (its executor: chunks admitted
    /// and queued on the peer's connection).
    fn run_tcp(&self, p: &Peer, batch: &Arc<BatchShared>, items: Vec<Item<'_>>, deadline: Instant) {
        let executor = TcpExecutor {
            conn: &p.conn,
            budget: &self.inner.budget,
            gate: &self.inner.requester_gate,
            stats: &self.inner.stats,
            max_chunk: self.inner.config.max_transfer_bytes,
            coalesce: self.inner.config.coalesce,
            deadline,
        };
        executor.run(batch, items);
    }
}

#[cfg(test)]
#[path = "submit_tests.rs"]
mod tests;
