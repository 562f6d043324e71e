//! Direct routes: one region of a same-host peer, resolved once (peer, IPC
//! link, region), then copied to and from one request at a time on the
//! caller's thread. A copy is a one-request subbatch through the same
//! relocation cache, grant board and receipts as a submission's; what it
//! skips is the submission around it (the batch record, the peer and
//! region lookups, the transport choice). It ends before the call
//! returns, with the request's exact outcome.

use super::Engine;
use crate::control::message::RegionInfo;
use crate::error::{Error, Result, Status};
use crate::kinds::{Transport, TransportKind};
use crate::memory::MemoryKind;
use crate::transfer::{ChunkOutcome, Op, RemoteEffect, Request, RequestResult};
use crate::transport::coalesce::LocalSpans;
use crate::transport::ipc::link::IpcLink;
use crate::transport::ipc::requester::held::HeldImport;
use crate::transport::ipc::requester::{GroupError, GroupLocal, GroupRun, IpcRequester};
use parking_lot::RwLock;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One region of a peer, held for [`Engine::copy_direct`]: the IPC link
/// that reaches it and the region as the peer published it when the route
/// was opened. It holds no import by itself (the relocation cache does, and
/// may close it like any other); a copy after the peer unregistered the
/// region, or left, fails with the cause, and a new route is opened then.
pub struct DirectRoute {
    /// The engine it belongs to (its epoch: fresh for every engine, so a
    /// new engine at a freed one's address is not taken for it).
    engine: u64,
    peer: u64,
    kind: TransportKind,
    link: Arc<IpcLink>,
    requester: Arc<IpcRequester>,
    region: RegionInfo,
    /// Both engines opted in to EGM remote host grants.
    egm: bool,
    /// The cached import the last copy went through (SHM): the next one
    /// copies through it without the cache's lock while it holds.
    held: RwLock<HeldImport>,
}

impl DirectRoute {
    /// The transport its copies go over.
    pub fn transport(&self) -> TransportKind {
        self.kind
    }

    /// The peer's region it reaches.
    pub fn region(&self) -> &RegionInfo {
        &self.region
    }
}

impl Engine {
    /// Opens a direct route to the region of peer `peer` that holds
    /// `[remote_addr, remote_addr + len)`, over `transport` (AUTO: the first
    /// IPC transport of `transport_policy` that reaches the peer and carries
    /// the region's memory). The peer is asked for its published regions
    /// (one round trip), so the route reaches the region as it is now. TCP moves no memory directly:
    /// `NotSupported`; a peer no IPC transport reaches: `Unavailable`.
    pub fn open_direct(
        &self,
        peer: u64,
        remote_addr: u64,
        len: u64,
        transport: Transport,
        timeout: Option<Duration>,
    ) -> Result<DirectRoute> {
        self.check_open()?;
        if len == 0 {
            return Err(Error::InvalidArgument("the route's length is 0".into()));
        }
        let p = self.peer(peer)?;
        let deadline = Instant::now() + self.timeout(timeout);
        if let Some(e) = p.conn.dead_reason() {
            return Err(e);
        }
        // What the peer publishes now: a region it registered again since
        // the last Describe is reached under its new id and epoch.
        let known = p.conn.refresh_describe(deadline)?;
        let holds = |g: &RegionInfo| g.contains(remote_addr, len);
        let region = known.regions.iter().find(|g| holds(g)).cloned().ok_or_else(|| {
            Error::NotFound(format!("peer {peer} publishes no region holding 0x{remote_addr:x}+{len}"))
        })?;
        let egm = self.egm_both(known.capabilities);
        let candidates: Vec<TransportKind> = match transport {
            Transport::Only(TransportKind::Tcp) => {
                return Err(Error::NotSupported(
                    "a direct route copies through a mapping of the peer's memory: tcp cannot carry one (submit \
                     over tcp instead)"
                        .into(),
                ))
            }
            Transport::Only(k) => vec![k],
            Transport::Auto => {
                self.inner.config.transport_policy.iter().copied().filter(|k| *k != TransportKind::Tcp).collect()
            }
        };
        let mut why = Vec::new();
        for kind in candidates {
            let (link, ipc) = match (p.link(kind), self.inner.ipc_transport(kind)) {
                (Ok(link), Some(ipc)) => (link, ipc),
                (Err(e), _) => {
                    why.push(format!("{}: {e}", kind.name()));
                    continue;
                }
                (Ok(_), None) => {
                    why.push(format!("{}: not started on this engine", kind.name()));
                    continue;
                }
            };
            if !super::plan::carries(kind, region.kind, egm) {
                why.push(format!("{}: cannot carry the peer's {} memory", kind.name(), region.kind.name()));
                continue;
            }
            if let Some(refused) = ipc.requester.refused(&link) {
                why.push(format!("{}: {refused}", kind.name()));
                continue;
            }
            return Ok(DirectRoute {
                engine: self.inner.identity.engine_epoch,
                peer,
                kind,
                link,
                requester: ipc.requester.clone(),
                region,
                egm,
                held: RwLock::new(HeldImport::default()),
            });
        }
        let text = format!(
            "no IPC transport reaches region {} (0x{:x}+{}) of peer {peer} for a direct route ({})",
            region.id,
            region.addr,
            region.len,
            why.join("; ")
        );
        Err(match transport {
            Transport::Only(_) if why.iter().any(|w| w.contains("cannot carry")) => Error::NotSupported(text),
            _ => Error::Unavailable(text),
        })
    }

    /// Copies `req` through `route` on the calling thread and returns once
    /// it has ended: `Ok` with the request's outcome (as a batch would
    /// give it, with the failure when it failed), or `Err` when the call
    /// itself was refused before anything moved (a route of another
    /// engine, a zero length, local memory not registered or not carried by
    /// the route's transport, the engine or its requester side closed).
    pub fn copy_direct(
        &self,
        route: &DirectRoute,
        req: &Request,
        timeout: Option<Duration>,
    ) -> Result<(RequestResult, Option<Error>)> {
        self.check_open()?;
        if route.engine != self.inner.identity.engine_epoch {
            return Err(Error::InvalidArgument("the direct route was opened by another engine".into()));
        }
        super::check::nonzero(req, None)?;
        let lease = self.lease_local(req, None)?;
        let local = lease.region();
        let kind = route.kind;
        // The check a submission's plan makes of each request.
        if !super::plan::fits(kind, local.kind, req.local_addr, Some(&route.region), route.egm) {
            return Err(Error::NotSupported(format!(
                "the route's transport {} cannot copy between local {} memory and the peer's {} memory",
                kind.name(),
                local.kind.name(),
                route.region.kind.name()
            )));
        }
        super::ipc_transports::prepare_local(kind, &self.inner.config, std::iter::once(local))?;
        // Inside the requester gate, as a submission's subbatch: a close
        // waits for the copy before it flushes the relocation cache.
        let _entry = self.inner.requester_gate.enter()?;
        let (remote_effect, failure) = match self.direct_outcome(route, req, local.device, local.kind, timeout) {
            Ok(()) => (ChunkOutcome::ok(req.op).effect, None),
            Err((e, effect)) => (effect, Some(e)),
        };
        self.inner.stats.record_requests(kind, failure.is_none(), 1, req.len);
        let status = failure.as_ref().map_or(Status::Ok, Error::status);
        Ok((RequestResult { status, remote_effect }, failure))
    }

    /// The request's own outcome through the route: its failure and remote
    /// effect when it failed.
    fn direct_outcome(
        &self,
        route: &DirectRoute,
        req: &Request,
        device: Option<i32>,
        local_kind: MemoryKind,
        timeout: Option<Duration>,
    ) -> std::result::Result<(), (Error, RemoteEffect)> {
        let none = |e: Error| (e, RemoteEffect::None);
        let g = &route.region;
        if !g.contains(req.remote_addr, req.len) {
            return Err(none(Error::OutOfRange(format!(
                "remote range 0x{:x}+{} is outside region {} (0x{:x}+{}) the route reaches",
                req.remote_addr, req.len, g.id, g.addr, g.len
            ))));
        }
        let allowed = match req.op {
            Op::Read => g.access.can_read(),
            Op::Write => g.access.can_write(),
        };
        if !allowed {
            return Err(none(Error::PermissionDenied(format!(
                "peer {} published region {} without {} access",
                route.peer,
                g.id,
                if req.op == Op::Read { "READ" } else { "WRITE" }
            ))));
        }
        // Host memory on this side (no fence to take): through the import
        // the last copy used, when it still holds.
        let host = device.is_none() && local_kind != MemoryKind::PinnedHost;
        if host {
            if let Some(moved) = route.requester.copy_held(&route.held.read(), req) {
                return moved.map_err(|e| (e, RemoteEffect::of_uncertain(req.op)));
            }
        }
        let deadline = Instant::now() + self.timeout(timeout);
        let local = GroupLocal {
            device,
            pinned: local_kind == MemoryKind::PinnedHost,
            group_ops: 0,
            spans: LocalSpans::none(),
            // Judged by the copy's own ranges (a local range registered
            // inside the import's mapping overlaps it).
            independent: false,
        };
        let run = route.requester.run_group(
            &route.link,
            g,
            vec![(0, *req)],
            local,
            deadline,
            None::<fn() -> crate::transport::ipc::requester::OnDone>,
        );
        match run {
            Ok(GroupRun::Done(finished)) => match finished.into_pairs().next() {
                Some((_, ChunkOutcome { result: Ok(()), .. })) => {
                    if host {
                        *route.held.write() = route.requester.held(&route.link, g);
                    }
                    Ok(())
                }
                Some((_, ChunkOutcome { result: Err(e), effect, .. })) => Err((e, effect)),
                None => Err(none(Error::Protocol("the copy ended with no outcome".into()))),
            },
            Ok(GroupRun::Deferred) => Err(none(Error::Protocol("a direct copy was deferred".into()))),
            Err(GroupError::NotPosted(e, _)) => {
                if route.link.source_left() {
                    // The source process exited (or its engine is gone): the
                    // peer is gone, as a submission would report it.
                    if let Ok(p) = self.peer(route.peer) {
                        p.conn.kill(e.clone());
                    }
                }
                Err(none(e))
            }
        }
    }
}
