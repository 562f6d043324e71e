//! Submissions: local checks, transport selection, and handing requests to
//! the chosen transport. A submission runs on one transport: the IPC
//! transports execute their subbatches on the caller (setup, copies and
//! receipts, in order); TCP queues chunks on the peer's connection.

use super::batch_handle::{Batch, SubmitOptions};
use super::connected_peer::Peer;
use super::Engine;
use crate::control::message::{Describe, RegionInfo};
use crate::error::{Error, Result, Status};
use crate::kinds::{Transport, TransportKind};
use crate::memory::rank::Ranks;
use crate::memory::{owners, MemoryKind, RegionLease};
use crate::sync::admission::{GateGuard, SubbatchAdmission};
use crate::transfer::{Assist, BatchShared, ChunkOutcome, RemoteEffect, Request, MAX_REQUESTS};
use crate::transport::coalesce::LocalSpans;
use crate::transport::cpu_copy;
use crate::transport::ipc::messages::op_bit;
use crate::transport::ipc::plan::independent;
use crate::transport::ipc::requester::{Finished, GroupError, GroupLocal, GroupRun};
use crate::transport::tcp::{Chunk, Record};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// A request after local checks: its index, the request, its local lease
/// (shared with the submission's other requests in that region: no
/// reference count per request) and the remote region it names (None: not
/// published by the peer) with that region's position in the peer's table
/// (`slot`: a dense key for grouping; `u32::MAX` with no region).
struct Checked<'a> {
    index: u32,
    slot: u32,
    req: Request,
    lease: &'a Arc<RegionLease>,
    region: Option<&'a RegionInfo>,
}

impl Checked<'_> {
    /// The request's index in the submission.
    fn at(&self) -> usize {
        self.index as usize
    }
}

/// The transport a submission takes, and which of its requests (positions
/// in the checked list) go over TCP instead: under AUTO, those the chosen
/// IPC transport cannot carry, when the rest are independent of them.
struct Selection {
    kind: TransportKind,
    tcp: Vec<usize>,
}

impl Selection {
    /// Every request on `kind`.
    fn all(kind: TransportKind) -> Selection {
        Selection { kind, tcp: Vec::new() }
    }
}

/// A peer's published regions ordered by address: the region holding an
/// address in O(log n) (a KV pool publishes a hundred regions or more, and
/// a scattered submission looks one up per run of requests). Where the
/// table's regions overlap (a peer's table never should), the first in
/// the table's order, as a linear search gives.
struct RegionIndex<'a> {
    d: &'a Describe,
    /// Each region's start and position in the table, by start (searched
    /// without touching the regions themselves), and the buckets over the
    /// starts.
    sorted: Vec<(u64, u32)>,
    ranks: Ranks,
    disjoint: bool,
}

impl<'a> RegionIndex<'a> {
    fn new(d: &'a Describe) -> RegionIndex<'a> {
        let mut sorted: Vec<(u64, u32)> = d.regions.iter().zip(0u32..).map(|(r, at)| (r.addr, at)).collect();
        sorted.sort_unstable_by_key(|&(start, _)| start);
        let end = |at: u32| d.regions[at as usize].addr.saturating_add(d.regions[at as usize].len);
        let disjoint = sorted.windows(2).all(|w| end(w[0].1) <= w[1].0);
        let ranks = Ranks::new(sorted.len(), |i| sorted[i].0);
        RegionIndex { d, sorted, ranks, disjoint }
    }

    /// The region holding `addr`.
    #[cfg(test)]
    fn find(&self, addr: u64) -> Option<&'a RegionInfo> {
        self.find_slot(addr).map(|(r, _)| r)
    }

    /// The region holding `addr`, and its position in the table.
    fn find_slot(&self, addr: u64) -> Option<(&'a RegionInfo, u32)> {
        if !self.disjoint {
            return self.d.regions.iter().zip(0u32..).find(|(r, _)| r.contains(addr, 1));
        }
        let sorted = &self.sorted;
        let i = self.ranks.rank(sorted.len(), addr, |i| sorted[i].0).checked_sub(1)?;
        let at = sorted[i].1;
        Some((&self.d.regions[at as usize], at)).filter(|(r, _)| r.contains(addr, 1))
    }
}

/// A submission's local leases by their regions' start addresses (the
/// registry refuses overlapping regions, so the last region starting at or
/// before an address is the only one that may hold it). Lookups go through
/// an index ([`Ranks`]) of the leases taken when it was last built, then
/// through all of them by binary search; the index is rebuilt once more
/// lookups have needed the second step than there are leases (or 64).
#[derive(Default)]
struct LeasesByAddr {
    /// Every lease so far: (start, lease), by start.
    all: Vec<(u64, u32)>,
    /// The index: the leases when it was built, (start, lease) by start,
    /// and the buckets over their starts.
    indexed: Vec<(u64, u32)>,
    ranks: Ranks,
    /// Lookups the index missed since it was built.
    stale: usize,
}

impl LeasesByAddr {
    /// The lease whose region `holds`, among those that may hold `addr`.
    fn find(&mut self, addr: u64, holds: impl Fn(u32) -> bool) -> Option<u32> {
        let indexed = &self.indexed;
        let at = self.ranks.rank(indexed.len(), addr, |i| indexed[i].0);
        if let Some(l) = at.checked_sub(1).map(|k| indexed[k].1).filter(|&l| holds(l)) {
            return Some(l);
        }
        let at = self.all.partition_point(|&(start, _)| start <= addr);
        let l = at.checked_sub(1).map(|k| self.all[k].1).filter(|&l| holds(l))?;
        self.stale += 1;
        if self.stale > self.all.len().max(64) {
            self.indexed = self.all.clone();
            self.ranks = Ranks::new(self.indexed.len(), |i| self.indexed[i].0);
            self.stale = 0;
        }
        Some(l)
    }

    fn insert(&mut self, start: u64, lease: u32) {
        self.all.insert(self.all.partition_point(|&(s, _)| s < start), (start, lease));
    }
}

/// `live` without the requests at positions `out` (ascending), and those.
fn split_off<'a>(live: Vec<Checked<'a>>, out: &[usize]) -> (Vec<Checked<'a>>, Vec<Checked<'a>>) {
    if out.is_empty() {
        return (live, Vec::new());
    }
    let mut moved = Vec::with_capacity(out.len());
    let mut kept = Vec::with_capacity(live.len() - out.len());
    let mut next = out.iter().peekable();
    for (at, c) in live.into_iter().enumerate() {
        if next.next_if(|&&o| o == at).is_some() {
            moved.push(c);
        } else {
            kept.push(c);
        }
    }
    (kept, moved)
}

/// Subbatches of an IPC submission, in linear time: requests naming one
/// remote region whose local memory one GPU copies. An import maps the
/// whole remote allocation, so how far apart the blocks lie is no reason to
/// split. When the submission's requests are independent (no local or
/// remote range that one writes overlaps another's), every request of a
/// (region, GPU) joins one group, groups in order of first appearance;
/// otherwise groups are consecutive runs, so that dependent requests keep
/// their input order. Also says whether the groups may end in any order
/// (several groups of independent requests). Every request of `live`
/// names a region.
fn group<'a>(live: Vec<Checked<'a>>) -> (VecDeque<Group<'a>>, bool) {
    let key = |c: &Checked<'_>| (c.slot, c.lease.region().device);
    let mut groups: VecDeque<Group<'a>> = VecDeque::new();
    // One (region, GPU) for all, the common case: one group either way.
    if live.first().is_some_and(|first| live.iter().all(|c| key(c) == key(first))) {
        let mut g = Group::of(&live[0], live.len());
        g.extend(&live);
        groups.push_back(g);
        return (groups, false);
    }
    if independent(live.iter().map(|c| &c.req)) {
        // The group of each region slot on the first request's GPU (the
        // common case: a dense table, no hashing), and of any other key.
        let device = live[0].lease.region().device;
        let mut by_slot: Vec<u32> = Vec::new();
        let mut others: std::collections::HashMap<(u32, Option<i32>), u32> = std::collections::HashMap::new();
        // Neighbours mostly share their group: looked up once per run.
        let mut last: Option<((u32, Option<i32>), u32)> = None;
        // Each request's group, and each group's size and first request:
        // the groups are then filled at their final size, with no growing
        // copies.
        let mut sizes: Vec<(usize, u32)> = Vec::new();
        let add = |sizes: &mut Vec<(usize, u32)>, first: u32| {
            sizes.push((0, first));
            (sizes.len() - 1) as u32
        };
        let of: Vec<u32> = live
            .iter()
            .zip(0u32..)
            .map(|(c, i)| {
                let k = key(c);
                let at = match last {
                    Some((lk, at)) if lk == k => at,
                    // Slots are positions in the peer's table: the vector
                    // grows to the table's length at most.
                    _ if k.1 == device && c.slot != u32::MAX => {
                        let s = c.slot as usize;
                        if s >= by_slot.len() {
                            by_slot.resize(s + 1, u32::MAX);
                        }
                        if by_slot[s] == u32::MAX {
                            by_slot[s] = add(&mut sizes, i);
                        }
                        by_slot[s]
                    }
                    _ => *others.entry(k).or_insert_with(|| add(&mut sizes, i)),
                };
                last = Some((k, at));
                sizes[at as usize].0 += 1;
                at
            })
            .collect();
        groups.extend(sizes.into_iter().map(|(n, first)| Group::of(&live[first as usize], n)));
        for (c, at) in live.iter().zip(of) {
            groups[at as usize].push(c);
        }
        return (groups, true);
    }
    for c in &live {
        match groups.back_mut() {
            Some(g) if (g.slot, g.device) == key(c) => g.push(c),
            _ => {
                let mut g = Group::of(c, 1);
                g.push(c);
                groups.push_back(g);
            }
        }
    }
    (groups, false)
}

/// One subbatch to run: its requests (index in the submission, request),
/// the remote region they name and the GPU of their local memory (None:
/// host), whether any local memory is library-pinned host memory, whether
/// it is the single-request retry of a rejected group, and, for a window of
/// a larger independent group (completing in any order), the operations of
/// that whole group.
struct Group<'a> {
    items: Vec<(usize, Request)>,
    region: &'a RegionInfo,
    slot: u32,
    device: Option<i32>,
    pinned: bool,
    retried: bool,
    window: Option<u32>,
}

impl<'a> Group<'a> {
    /// An empty group of `first`'s region and GPU, with room for `n`.
    fn of(first: &Checked<'a>, n: usize) -> Group<'a> {
        Group {
            items: Vec::with_capacity(n),
            region: first.region.expect("a grouped request names a region"),
            slot: first.slot,
            device: first.lease.region().device,
            pinned: false,
            retried: false,
            window: None,
        }
    }

    /// The same region and GPU, with `items`.
    fn with(&self, items: Vec<(usize, Request)>) -> Group<'a> {
        Group { items, ..*self }
    }

    fn push(&mut self, c: &Checked<'_>) {
        self.items.push((c.at(), c.req));
        self.pinned |= c.lease.region().kind == MemoryKind::PinnedHost;
    }

    fn extend(&mut self, cs: &[Checked<'_>]) {
        for c in cs {
            self.push(c);
        }
    }
}

/// A large independent group moves in windows of at least this many
/// requests (for SHM also at least [`cpu_copy::ASYNC_MIN_BYTES`]): the
/// copy pool (SHM) or a stream of the pool (NVLink, MNNVL: one native
/// batch per window) starts on the first window while the caller builds
/// the next, so posting hides behind the copies, and each window's
/// bookkeeping stays in a core's cache (about 250 bytes per request over
/// its passes: 1 MB here) instead of going to memory between passes over
/// the whole group.
const WINDOW_REQUESTS: usize = 4096;

/// Cuts an independent group into windows (see [`WINDOW_REQUESTS`]); a
/// group too small for two windows stays whole. The windows keep the
/// group's order.
fn windows(kind: TransportKind, items: Vec<(usize, Request)>) -> Vec<Vec<(usize, Request)>> {
    // A CPU copy needs enough bytes to be worth handing to the pool; a
    // native batch is worth posting from its count of copies alone.
    let cpu = matches!(kind, TransportKind::Shm | TransportKind::Cma);
    let min_bytes = if cpu { cpu_copy::ASYNC_MIN_BYTES } else { 0 };
    let mut out: Vec<Vec<(usize, Request)>> = Vec::new();
    let mut cur: Vec<(usize, Request)> = Vec::new();
    let mut bytes = 0u64;
    let mut rest = items.len();
    for c in items {
        bytes += c.1.len;
        cur.push(c);
        rest -= 1;
        // A window closes once it is large enough, unless what is left
        // would make too small a last one.
        let full = cur.len() >= WINDOW_REQUESTS && bytes >= min_bytes;
        if full && rest >= WINDOW_REQUESTS {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
    }
    out.push(cur);
    out
}

/// Fails requests nothing was posted for (by index), each with `e` (no
/// remote effect).
fn fail_unposted(batch: &BatchShared, indices: impl Iterator<Item = usize>, e: &Error) {
    batch.complete_chunks(indices.map(|i| (i, ChunkOutcome::failed(e.clone(), RemoteEffect::None))));
}

/// Whether the last group of an IPC submission moves in windows (see
/// [`windows`]): any IPC transport with a relocation cache, so that the
/// windows share one cached import (without a cache each would open its
/// own, each charged for the whole allocation); large enough for two
/// windows; no library pinned local memory (fenced per subbatch: a second
/// window would wait for the first's fence); independent requests
/// (`known_independent`: the whole submission was shown so already).
fn windowed(kind: TransportKind, caches: bool, g: &Group<'_>, known_independent: bool) -> bool {
    matches!(kind, TransportKind::Shm | TransportKind::Cma | TransportKind::Nvlink | TransportKind::Mnnvl)
        && caches
        && g.items.len() >= 2 * WINDOW_REQUESTS
        && !g.pinned
        && (known_independent || independent(g.items.iter().map(|(_, r)| r)))
}

/// The local regions of a submission's `requests` (each leased once):
/// every group's coalesced copies stay inside one of them. None for a
/// single request, which has nothing to coalesce.
fn local_spans(leases: &[Arc<RegionLease>], requests: usize) -> LocalSpans {
    if requests < 2 {
        return LocalSpans::none();
    }
    LocalSpans::new(leases.iter().map(|l| (l.region().addr, l.region().addr + l.region().len)).collect())
}

/// What the subbatches of one IPC submission share.
struct IpcSubmission<'a> {
    /// The local regions of its requests ([`local_spans`]).
    spans: LocalSpans,
    /// Their leases: each group completed on the progress worker holds
    /// them all (one reference count per group, not one per region a
    /// group touches), so none is free before the submission's last such
    /// group has ended.
    held: Arc<Vec<Arc<RegionLease>>>,
    /// The same leases, and each request's among them (by index in the
    /// submission).
    leases: &'a [Arc<RegionLease>],
    lease_of: &'a [u32],
    deadline: Instant,
    /// AUTO chose the transport: an unposted subbatch may fall to TCP.
    auto: bool,
}

impl<'a> IpcSubmission<'a> {
    /// A group's requests as checked ones again (for TCP).
    fn checked(&self, g: Group<'a>) -> Vec<Checked<'a>> {
        let (leases, lease_of) = (self.leases, self.lease_of);
        let Group { items, region, slot, .. } = g;
        items
            .into_iter()
            .map(|(i, req)| Checked {
                index: i as u32,
                slot,
                req,
                lease: &leases[lease_of[i] as usize],
                region: Some(region),
            })
            .collect()
    }
}

/// The subbatches of one submission still copying on the progress worker:
/// a subbatch refused for want of room (every relocation cache entry in
/// use, the mapping budget spent) waits for one of them to end, rather
/// than failing for room its own submission holds.
#[derive(Default)]
struct InFlight {
    n: parking_lot::Mutex<usize>,
    cv: parking_lot::Condvar,
}

/// One subbatch counted in [`InFlight`] until its completion runs (or is
/// dropped unrun: the subbatch finished on the caller or was refused).
struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        *self.n.lock() += 1;
        InFlightGuard(self.clone())
    }

    /// Waits until fewer than `n` are in flight, `n` being the count now;
    /// false at once when none is, or when the deadline passes first.
    fn wait_for_one(&self, deadline: Instant) -> bool {
        let mut n = self.n.lock();
        let was = *n;
        while *n >= was && was > 0 {
            if self.cv.wait_until(&mut n, deadline).timed_out() {
                return false;
            }
        }
        was > 0
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        *self.0.n.lock() -= 1;
        self.0.cv.notify_all();
    }
}

/// Errors after which an unposted IPC request may try the next transport.
fn may_fall_through(e: &Error) -> bool {
    matches!(e.status(), Status::Unavailable | Status::ResourceExhausted | Status::NotSupported)
}

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
        self.check_open()?;
        if requests.is_empty() {
            return Err(Error::InvalidArgument("a submission needs at least one request".into()));
        }
        if requests.len() > MAX_REQUESTS {
            return Err(Error::InvalidArgument(format!(
                "{} requests; one submission carries at most {MAX_REQUESTS}",
                requests.len()
            )));
        }
        let p = self.peer(peer)?;
        let known = p.conn.describe_live().map_err(|e| {
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
        let in_region = |c: &Checked<'_>| c.region.is_some_and(|g| g.contains(c.req.remote_addr, c.req.len));
        let regions = RegionIndex::new(&known);
        let refreshed;
        let mut peer_caps = known.capabilities;
        let mut missing = false;
        let mut last: Option<(&RegionInfo, u32)> = None;
        let mut live: Vec<Checked<'_>> = requests
            .iter()
            .zip(lease_of.iter().copied())
            .zip(0u32..)
            .map(|((r, l), index)| {
                // Neighbours mostly name the region before them.
                let found =
                    last.filter(|(g, _)| g.contains(r.remote_addr, 1)).or_else(|| regions.find_slot(r.remote_addr));
                last = found;
                let (region, slot) = found.map_or((None, u32::MAX), |(g, s)| (Some(g), s));
                let c = Checked { index, slot, req: *r, lease: &leases[l as usize], region };
                missing |= !in_region(&c);
                c
            })
            .collect();
        if missing {
            if let Ok(d) = p.conn.refresh_describe(deadline) {
                peer_caps = d.capabilities;
                refreshed = d;
                let index = RegionIndex::new(&refreshed);
                missing = false;
                for c in &mut live {
                    (c.region, c.slot) =
                        index.find_slot(c.req.remote_addr).map_or((None, u32::MAX), |(g, s)| (Some(g), s));
                    missing |= !in_region(c);
                }
            }
        }
        let Selection { kind, tcp } = self.select(peer, &p, peer_caps, opts.transport, &live)?;
        let total = live.len();
        let (live, over_tcp) = split_off(live, &tcp);
        // An IPC submission routes every request as one chunk on its
        // transport (TCP plans each request's chunks as it queues them).
        let route = (kind != TransportKind::Tcp).then_some(kind);
        let batch = BatchShared::routed(requests, route, self.inner.stats.clone(), deadline);
        // Later notifications to the peer follow this batch; its own waits
        // for it. Without one, the batch is listed when the submission
        // returns (below).
        if let Some(msg) = note {
            p.outbox.track(&batch);
            batch.expect_notification();
            p.outbox.send_with(&batch, msg.to_vec());
        }
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
            self.enqueue_tcp(&p, &batch, over_tcp, deadline);
        }
        // Requests naming no published region, or a range past the end of
        // the region they start in, fail here, per request: nothing moves
        // outside what the peer published (an import maps no more).
        let mut live = live;
        if missing {
            for c in live.iter().filter(|c| !in_region(c)) {
                batch.plan(c.at(), 1, kind);
                let (i, addr, len) = (c.at(), c.req.remote_addr, c.req.len);
                let e = match c.region {
                    None => Error::NotFound(format!(
                        "request {i}: remote address 0x{addr:x} is in no region peer {peer} publishes"
                    )),
                    Some(g) => Error::OutOfRange(format!(
                        "request {i}: remote range 0x{addr:x}+{len} crosses the end of region {} (0x{:x}+{}) that \
                         peer {peer} publishes",
                        g.id, g.addr, g.len
                    )),
                };
                batch.fail_request(i, e, RemoteEffect::None);
            }
            live.retain(in_region);
        }
        match kind {
            TransportKind::Tcp => self.enqueue_tcp(&p, &batch, live, deadline),
            ipc_kind => {
                let how = IpcSubmission {
                    spans: local_spans(&leases, live.len()),
                    held: leases.clone(),
                    leases: &leases,
                    lease_of: &lease_of,
                    deadline,
                    auto: opts.transport == Transport::Auto,
                };
                let rest = self.run_ipc(ipc_kind, &p, &batch, live, &how);
                if !rest.is_empty() {
                    self.enqueue_tcp(&p, &batch, rest, deadline);
                }
            }
        }
        // A notification submitted after this returns follows this batch's
        // requests (listed only if still running).
        if note.is_none() {
            p.outbox.track(&batch);
        }
        Ok(Batch::new(batch))
    }

    /// Checks every request's local side: a registered region holds it.
    /// Requests of one local region share one lease, taken once per
    /// submission, so the pass is a few comparisons per request (a lookup
    /// among the regions leased so far when a request leaves its
    /// neighbour's); the deadline is checked as it goes. (Local memory
    /// that peers import stays usable: between requesters, the order of
    /// overlapping accesses is the application's.) Returns the leases and,
    /// per request, which one holds it.
    fn check_local(&self, requests: &[Request], deadline: Instant) -> Result<(Vec<Arc<RegionLease>>, Vec<u32>)> {
        let mut leases: Vec<Arc<RegionLease>> = Vec::new();
        let mut by_addr = LeasesByAddr::default();
        let mut out = Vec::with_capacity(requests.len());
        let mut last = u32::MAX;
        for (i, r) in requests.iter().enumerate() {
            if r.len == 0 {
                return Err(Error::InvalidArgument(format!("request {i}: length is 0")));
            }
            if i % 4096 == 4095 && Instant::now() >= deadline {
                return Err(Error::TimedOut(format!("the deadline passed while checking request {i}")));
            }
            let holds = |l: u32| leases[l as usize].region().contains(r.local_addr, r.len);
            if last == u32::MAX || !holds(last) {
                last = match by_addr.find(r.local_addr, holds) {
                    Some(l) => l,
                    None => {
                        let lease = self.inner.regions.lease(r.local_addr, r.len).map_err(|e| {
                            Error::from_status(e.status(), format!("request {i}: local {}", e.message()))
                        })?;
                        let start = lease.region().addr;
                        leases.push(Arc::new(lease));
                        let l = (leases.len() - 1) as u32;
                        by_addr.insert(start, l);
                        l
                    }
                };
            }
            out.push(last);
        }
        Ok((leases, out))
    }

    /// Whether this engine and a peer of capabilities `peer_caps` both
    /// opted in to EGM remote host grants (MNNVL then carries EGM memory).
    pub(super) fn egm_both(&self, peer_caps: u32) -> bool {
        let egm = super::ipc_transports::EGM_CAPABILITY;
        self.inner.capabilities() & egm != 0 && peer_caps & egm != 0
    }

    /// The transport for the whole submission (`peer_caps`: the
    /// capabilities of the peer's latest Describe).
    fn select(&self, peer: u64, p: &Peer, peer_caps: u32, t: Transport, reqs: &[Checked<'_>]) -> Result<Selection> {
        let egm_both = self.egm_both(peer_caps);
        let fits = |k: TransportKind, c: &Checked<'_>| {
            let local = c.lease.region().kind;
            match c.region {
                // A remote host range needs an EGM export and both peers' opt-in.
                Some(r) if r.kind == MemoryKind::Egm && k == TransportKind::Mnnvl && !egm_both => false,
                Some(r) => {
                    super::ipc_transports::kinds_allow(k, local, r.kind)
                        && super::ipc_transports::local_placement_ok(k, local, c.req.local_addr)
                }
                None => k != TransportKind::Tcp || local.cpu_accessible(),
            }
        };
        // The first request `k` cannot carry. Neighbours with one local
        // lease and one remote region are judged once (the previous one
        // fitted), except local EGM memory, placed per address.
        let first_misfit = |k: TransportKind| -> Option<&Checked<'_>> {
            let mut prev = None;
            reqs.iter().find(|c| {
                let key = (Arc::as_ptr(c.lease), c.region.map(|r| r as *const RegionInfo));
                if prev == Some(key) && c.lease.region().kind != MemoryKind::Egm {
                    return false;
                }
                prev = Some(key);
                !fits(k, c)
            })
        };
        let why_not = |k: TransportKind| -> Option<String> {
            match k {
                TransportKind::Tcp => None,
                _ => self.ipc_why_not(p, k),
            }
        };
        match t {
            Transport::Only(k) => {
                if let Some(why) = why_not(k) {
                    return Err(Error::Unavailable(format!(
                        "transport {} is not available to peer {peer}: {why}",
                        k.name()
                    )));
                }
                if let Some(c) = first_misfit(k) {
                    let local = c.lease.region().kind;
                    let placement = if super::ipc_transports::local_placement_ok(k, local, c.req.local_addr) {
                        ""
                    } else {
                        " (no visible GPU is attached to the local EGM memory's NUMA node)"
                    };
                    let remote = c.region.map(|r| r.kind.name()).unwrap_or("unknown");
                    // What the forced transport moves, and what to do instead.
                    let what = match k {
                        TransportKind::Shm if c.region.is_some_and(|r| r.kind != MemoryKind::SharedHost) => format!(
                            "shm moves only memory the peer allocated with orbite_host_allocate_shared; the peer's \
                             region at 0x{:x} is {remote} memory. Submit with ORBITE_TRANSPORT_AUTO or \
                             ORBITE_TRANSPORT_TCP to move it over TCP, or have the peer allocate it with \
                             orbite_host_allocate_shared",
                            c.req.remote_addr
                        ),
                        TransportKind::Shm => format!(
                            "shm copies with the CPU and this request's local memory is {} memory",
                            local.name()
                        ),
                        TransportKind::Tcp => format!(
                            "tcp moves CPU-accessible memory only; this request's local memory is {} memory and \
                             the peer's is {remote} memory",
                            local.name()
                        ),
                        TransportKind::Nvlink => format!(
                            "nvlink moves the peer's orbite_cuda_allocate_ipc memory to or from local device or \
                             pinned host memory; this request's local memory is {} memory and the peer's is \
                             {remote} memory",
                            local.name()
                        ),
                        TransportKind::Mnnvl => format!(
                            "mnnvl moves the peer's orbite_allocate_mnnvl or orbite_allocate_egm memory; this \
                             request's local memory is {} memory and the peer's is {remote} memory",
                            local.name()
                        ),
                        TransportKind::Cma => format!(
                            "cma moves host memory the peer registered that the library did not allocate (its \
                             malloc, numpy or torch buffers) with the CPU; this request's local memory is {} memory \
                             and the peer's is {remote} memory",
                            local.name()
                        ),
                    };
                    return Err(Error::NotSupported(format!(
                        "request {} cannot go over the forced transport {}: {what}{placement}",
                        c.at(),
                        k.name()
                    )));
                }
                Ok(Selection::all(k))
            }
            Transport::Auto => {
                // Without a relocation cache every SHM subbatch maps the
                // whole remote allocation, faults in each page it touches
                // and unmaps it again: slower than TCP for KV-shaped traffic
                // (docs/benchmarks.md, "KV pool flow"), so AUTO takes TCP
                // when TCP can carry the submission.
                let shm_uncached = self.inner.ipc_transport(TransportKind::Shm).is_some_and(|t| !t.requester.caches());
                let tcp_fits = || {
                    self.inner.config.transport_policy.contains(&TransportKind::Tcp)
                        && first_misfit(TransportKind::Tcp).is_none()
                };
                let policy = &self.inner.config.transport_policy;
                for (rank, k) in policy.iter().enumerate() {
                    // CMA shares SHM's cache (`shm_cache_entries`): uncached,
                    // each subbatch takes two round trips.
                    if matches!(*k, TransportKind::Shm | TransportKind::Cma) && shm_uncached && tcp_fits() {
                        continue;
                    }
                    // Before settling on TCP for all: an IPC transport ranked
                    // above it that carries part of the submission takes that
                    // part, TCP the rest.
                    if *k == TransportKind::Tcp {
                        let better = &policy[..rank];
                        if let Some(split) = better.iter().find_map(|&b| self.split(p, b, reqs, &fits, shm_uncached)) {
                            return Ok(split);
                        }
                    }
                    let all_fit = first_misfit(*k).is_none();
                    let any_known = *k == TransportKind::Tcp || reqs.iter().any(|c| c.region.is_some());
                    if all_fit && any_known && why_not(*k).is_none() {
                        return Ok(Selection::all(*k));
                    }
                }
                Err(Error::Unavailable(format!(
                    "no transport in transport_policy can carry this submission to peer {peer} (memory kinds: {})",
                    reqs.iter()
                        .map(|c| format!(
                            "{} -> {}",
                            c.lease.region().kind.name(),
                            c.region.map(|r| r.kind.name()).unwrap_or("unknown")
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        }
    }

    /// The split of an AUTO submission between the IPC transport `k` and
    /// TCP, when `k` is up, carries some of the requests whose remote region
    /// is known, TCP carries all the others, and no request depends on
    /// another (no range one writes overlaps a range of another), so that
    /// the two parts may run side by side. `None` otherwise.
    fn split(
        &self,
        p: &Peer,
        k: TransportKind,
        reqs: &[Checked<'_>],
        fits: &dyn Fn(TransportKind, &Checked<'_>) -> bool,
        shm_uncached: bool,
    ) -> Option<Selection> {
        if k == TransportKind::Tcp || (matches!(k, TransportKind::Shm | TransportKind::Cma) && shm_uncached) {
            return None;
        }
        let mut any_known = false;
        let mut tcp = Vec::new();
        for (at, c) in reqs.iter().enumerate() {
            if fits(k, c) {
                any_known |= c.region.is_some();
            } else if fits(TransportKind::Tcp, c) {
                tcp.push(at);
            } else {
                return None;
            }
        }
        let usable = any_known && !tcp.is_empty() && self.ipc_why_not(p, k).is_none();
        (usable && independent(reqs.iter().map(|c| &c.req))).then_some(Selection { kind: k, tcp })
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

    /// Runs the subbatches of an IPC transport in order. Returns the
    /// requests that fell through to TCP (all remaining ones, in order).
    fn run_ipc<'a>(
        &self,
        kind: TransportKind,
        p: &Peer,
        batch: &Arc<BatchShared>,
        live: Vec<Checked<'a>>,
        how: &IpcSubmission<'a>,
    ) -> Vec<Checked<'a>> {
        let &IpcSubmission { ref spans, ref held, deadline, auto, .. } = how;
        let (Ok(link), Some(transport)) = (p.link(kind), self.inner.ipc_transport(kind)) else {
            return live;
        };
        // Every request is routed on `kind` already (BatchShared::routed).
        let tcp_fallback = auto
            && self.inner.config.transport_policy.contains(&TransportKind::Tcp)
            && live.iter().all(|c| {
                super::ipc_transports::kinds_allow(
                    TransportKind::Tcp,
                    c.lease.region().kind,
                    c.region.expect("resolved").kind,
                )
            });
        if let Err(e) =
            super::ipc_transports::prepare_local(kind, &self.inner.config, live.iter().map(|c| c.lease.region()))
        {
            // Nothing was posted: as an unposted rejection of the first group.
            if tcp_fallback && may_fall_through(&e) {
                return self.fall_through(kind, batch, live, &e);
            }
            fail_unposted(batch, live.iter().map(|c| c.at()), &e);
            return Vec::new();
        }
        let (mut groups, any_order) = group(live);
        // Counted only once a group defers (a one-group batch that ends
        // here allocates nothing for it).
        let mut in_flight: Option<Arc<InFlight>> = None;
        // Each subbatch runs inside the requester gate (entered for its own
        // completion) and, with more to follow, the submission stays
        // entered to its last: close_requester waits, so its flush of the
        // relocation cache never falls before a subbatch (which would open
        // an import after the flush and leave it cached, its export
        // retained). A close begun before then fails the rest.
        let mut admission = SubbatchAdmission::new(&self.inner.requester_gate);
        while let Some(mut g) = groups.pop_front() {
            // A large independent last group moves in windows.
            if groups.is_empty()
                && g.window.is_none()
                && !g.retried
                && windowed(kind, transport.requester.caches(), &g, any_order)
            {
                let ops = g.items.iter().fold(0, |ops, (_, r)| ops | op_bit(r.op));
                let all = std::mem::take(&mut g.items);
                groups.extend(windows(kind, all).into_iter().map(|items| Group { window: Some(ops), ..g.with(items) }));
                continue;
            }
            let mut entry = match admission.admit(!groups.is_empty()) {
                Ok(entry) => entry,
                Err(e) => {
                    let unposted = g.items.iter().chain(groups.iter().flat_map(|g| &g.items));
                    fail_unposted(batch, unposted.map(|&(i, _)| i), &e);
                    return Vec::new();
                }
            };
            let window = g.window;
            // The last group may complete on the progress worker; earlier
            // ones of dependent requests finish here so that subbatches
            // stay in order. Groups of independent requests, and windows
            // of one independent group, may end in any order: each
            // completes there, and the next is posted while it copies.
            // Without an entry of its own (the gate began closing) it
            // completes here, inside the submission's hold. The completion
            // is built only if the transport defers the group: a group
            // that ends at once (a small SHM copy) skips its allocation,
            // its references and its count in flight.
            let defers = (groups.is_empty() || window.is_some() || any_order) && entry.is_some();
            let defer = defers.then_some(|| {
                let entry = entry.take().expect("a deferred group has its own entry");
                let counted = in_flight.get_or_insert_with(Arc::default).enter();
                self.deferred_completion(batch, held, counted, entry)
            });
            let local = GroupLocal {
                device: g.device,
                pinned: g.pinned,
                group_ops: window.unwrap_or(0),
                spans: spans.clone(),
                independent: any_order || window.is_some(),
            };
            // The items go to the transport, which gives them back when it
            // refuses the group unposted.
            let items = std::mem::take(&mut g.items);
            let run = transport.requester.run_group(&link, g.region, items, local, deadline, defer);
            // Not deferred: the group leaves the gate now, as its unbuilt
            // completion would have.
            drop(entry);
            match run {
                Ok(GroupRun::Done(finished)) => batch.complete_chunks(finished.into_pairs()),
                Ok(GroupRun::Deferred) => {}
                Err(GroupError::NotPosted(e, items)) => {
                    g.items = items;
                    if link.source_left() {
                        // The source process exited (or its engine is gone):
                        // the peer is gone, as TCP would report it.
                        p.conn.kill(e.clone());
                    }
                    if e.status() == Status::ResourceExhausted
                        && in_flight.as_ref().is_some_and(|f| f.wait_for_one(deadline))
                    {
                        // Room this submission holds comes back as its
                        // earlier subbatches end: try again after one has.
                        groups.push_front(g);
                        continue;
                    }
                    if e.status() == Status::ResourceExhausted && !g.retried {
                        // One retry, as a single request; the rest of the
                        // group becomes a new group after it.
                        let rest = g.items.split_off(1);
                        if !rest.is_empty() {
                            groups.push_front(g.with(rest));
                        }
                        g.retried = true;
                        groups.push_front(g);
                        continue;
                    }
                    if tcp_fallback && may_fall_through(&e) {
                        let rest = std::iter::once(g).chain(groups).flat_map(|g| how.checked(g)).collect();
                        return self.fall_through(kind, batch, rest, &e);
                    }
                    fail_unposted(batch, g.items.iter().map(|&(i, _)| i), &e);
                }
            }
        }
        Vec::new()
    }

    /// Moves requests nothing was posted for from `kind` to TCP, saying so
    /// on the batch and in the stats.
    fn fall_through<'a>(
        &self,
        kind: TransportKind,
        batch: &BatchShared,
        rest: Vec<Checked<'a>>,
        e: &Error,
    ) -> Vec<Checked<'a>> {
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

    /// The completion of a group finished by the progress worker: records
    /// the outcomes, and until then keeps the local regions leased and the
    /// requester side open (close_requester waits for it).
    fn deferred_completion(
        &self,
        batch: &Arc<BatchShared>,
        held: &Arc<Vec<Arc<RegionLease>>>,
        counted: InFlightGuard,
        guard: GateGuard,
    ) -> crate::transport::ipc::requester::OnDone {
        let batch = batch.clone();
        let held = held.clone();
        Box::new(move |finished: Finished| {
            // Its hold on the local regions ends before the batch says so
            // (the last group's frees them); the requester side stays open
            // until it has (close_requester then returns only with every
            // batch it waited for complete).
            drop(held);
            batch.complete_chunks(finished.into_pairs());
            drop(guard);
            // Its import is back in the cache (idle) by now.
            drop(counted);
        })
    }

    /// Splits requests into chunks, admits them and queues them on the
    /// peer's TCP connection. With `coalesce`, consecutive requests of one
    /// direction whose ranges follow each other on both sides (one local
    /// lease, one remote region, together at most a chunk) move as one
    /// chunk: one frame, one answer (one payload), the outcome given to
    /// each of them. A WRITE run lost midway keeps each request's line
    /// between `Unknown` (some of its bytes left) and `None` (none did):
    /// the core says how much of the payload left
    /// ([`BatchShared::complete_run`]).
    fn enqueue_tcp(&self, p: &Peer, batch: &Arc<BatchShared>, live: Vec<Checked<'_>>, deadline: Instant) {
        let max_chunk = self.inner.config.max_transfer_bytes;
        let coalesce = self.inner.config.coalesce;
        let gate = &self.inner.requester_gate;
        // A small batch's waiter reads the answers itself while it spins.
        batch.assisted_by(Arc::downgrade(&p.conn) as Weak<dyn Assist>);
        let mut staged: Vec<Chunk> = Vec::new();
        let mut failed: Option<Error> = None;
        let mut coalesced = 0u64;
        let fail_unit = |i: usize, n: u32, e: &Error, effect: RemoteEffect| {
            for m in i..i + n as usize {
                batch.fail_request(m, e.clone(), effect);
            }
        };
        let mut live = live.into_iter().peekable();
        while let Some(c) = live.next() {
            let (i, r) = (c.at(), c.req);
            if let Some(e) = &failed {
                batch.plan(i, 1, TransportKind::Tcp);
                batch.fail_request(i, e.clone(), RemoteEffect::None);
                continue;
            }
            let region = c.region.expect("resolved");
            let pinned = c.lease.region().kind == MemoryKind::PinnedHost;
            if pinned && owners::fenced(r.local_addr) {
                // A GPU group holds (or fenced) the whole local pinned
                // allocation: no CPU access meanwhile.
                batch.plan(i, 1, TransportKind::Tcp);
                let e = Error::Unavailable(format!(
                    "request {i}: the local pinned allocation is held by an NVLink/MNNVL group (or fenced after an \
                     uncertain completion)"
                ));
                batch.fail_request(i, e, RemoteEffect::None);
                continue;
            }
            // The unit: this request and those after it that continue it.
            let (mut count, mut len) = (1u32, r.len);
            while coalesce && len < max_chunk {
                let Some(n) = live.peek() else { break };
                let joins = n.at() == i + count as usize
                    && n.req.op == r.op
                    && Arc::ptr_eq(n.lease, c.lease)
                    && n.region.is_some_and(|g| g.id == region.id && g.epoch == region.epoch)
                    && n.req.local_addr == r.local_addr + len
                    && n.req.remote_addr == r.remote_addr + len
                    && len + n.req.len <= max_chunk
                    && !(pinned && owners::fenced(n.req.local_addr));
                if !joins {
                    break;
                }
                len += n.req.len;
                count += 1;
                live.next();
            }
            coalesced += count as u64 - 1;
            let n_chunks = len.div_ceil(max_chunk);
            batch.plan_each(i..i + count as usize, n_chunks as u32, TransportKind::Tcp);
            for k in 0..n_chunks {
                let off = k * max_chunk;
                let piece = (len - off).min(max_chunk);
                let permit = match self.inner.budget.try_acquire(piece) {
                    Some(x) => x,
                    None => {
                        p.conn.enqueue(std::mem::take(&mut staged));
                        match self.inner.budget.acquire(piece, deadline, "submission") {
                            Ok(x) => x,
                            Err(e) => {
                                let effect = if k > 0 { RemoteEffect::of_uncertain(r.op) } else { RemoteEffect::None };
                                fail_unit(i, count, &e, effect);
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                };
                let guards = gate.enter().and_then(|g| Ok((g, p.conn.gate().enter()?)));
                let (guard, peer_guard) = match guards {
                    Ok(g) => g,
                    Err(e) => {
                        fail_unit(i, count, &e, RemoteEffect::None);
                        failed = Some(e);
                        break;
                    }
                };
                let done = Record {
                    batch: batch.clone(),
                    index: i,
                    count,
                    permit: Some(permit),
                    guard: Some(guard),
                    peer_guard: Some(peer_guard),
                };
                staged.push(Chunk {
                    op: r.op,
                    local_addr: r.local_addr + off,
                    remote_addr: r.remote_addr + off,
                    len: piece,
                    region_epoch: region.epoch,
                    deadline,
                    done,
                    hold: c.lease.clone(),
                });
            }
        }
        self.inner.stats.record_coalesced(TransportKind::Tcp, coalesced);
        p.conn.enqueue(staged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::identity::Identity;
    use crate::memory::Access;

    fn region(id: u64, addr: u64, len: u64) -> RegionInfo {
        RegionInfo { id, epoch: 1, addr, len, access: Access::READ_WRITE, kind: MemoryKind::SharedHost }
    }

    /// Guards `RegionIndex::find`: over a table in scrambled order, with
    /// gaps between regions and regions that touch, every address finds
    /// the region a linear search of the table finds (none in a gap or
    /// past the end); and over a table whose regions overlap, the first
    /// in the table's order.
    #[test]
    fn the_region_index_finds_what_a_linear_search_finds() {
        let linear = |d: &Describe, a: u64| d.regions.iter().find(|r| r.contains(a, 1)).map(|r| r.id);
        let mut d = Describe::bare(Identity::gone());
        // Regions of 100 bytes at 0, 100 (touching), 300, 1000 and 1150,
        // listed out of order.
        d.regions = vec![region(4, 1000, 100), region(1, 0, 100), region(5, 1150, 50), region(3, 300, 100)];
        d.regions.push(region(2, 100, 100));
        let index = RegionIndex::new(&d);
        assert!(index.disjoint);
        let mut found = 0;
        for a in 0..1300 {
            assert_eq!(index.find(a).map(|r| r.id), linear(&d, a), "address {a}");
            found += index.find(a).is_some() as u32;
        }
        assert_eq!(found, 450);
        assert_eq!(index.find(u64::MAX), None);
        // Overlapping regions: the table's first, as before.
        d.regions = vec![region(7, 50, 100), region(6, 0, 100)];
        let index = RegionIndex::new(&d);
        assert!(!index.disjoint);
        assert_eq!(index.find(60).map(|r| r.id), Some(7));
        assert_eq!(index.find(10).map(|r| r.id), Some(6));
    }

    /// Guards `group`: independent requests over three remote regions,
    /// interleaved, make one group per region in order of first appearance,
    /// each holding its requests in input order (a region's slot found
    /// again however far apart its requests lie); once two READs land on
    /// the same local bytes the requests are dependent, and the groups are
    /// the consecutive runs in input order.
    #[test]
    fn group_gathers_each_region_or_keeps_runs_in_order() {
        use crate::memory::region::RegionTable;
        use crate::transfer::Op;
        let table = RegionTable::default();
        table.register(0x10_0000, 0x10_0000, Access::READ_WRITE).unwrap();
        let lease = Arc::new(table.lease(0x10_0000, 0x1000).unwrap());
        let mut d = Describe::bare(Identity::gone());
        d.regions =
            vec![region(11, 0x100_0000, 0x1_0000), region(12, 0x200_0000, 0x1_0000), region(13, 0x300_0000, 0x1_0000)];
        let index = RegionIndex::new(&d);
        // (remote region position, local block): requests 0..6.
        let shape = |blocks: &[(usize, u64)]| -> Vec<Checked<'_>> {
            blocks
                .iter()
                .zip(0u32..)
                .map(|(&(at, block), i)| {
                    let remote_addr = d.regions[at].addr + 0x100 * i as u64;
                    let (region, slot) = index.find_slot(remote_addr).unwrap();
                    let req = Request { op: Op::Read, local_addr: 0x10_0000 + block * 0x100, remote_addr, len: 0x100 };
                    Checked { index: i, slot, req, lease: &lease, region: Some(region) }
                })
                .collect()
        };
        let summary = |groups: &VecDeque<Group<'_>>| -> Vec<(u64, Vec<usize>)> {
            groups.iter().map(|g| (g.region.id, g.items.iter().map(|&(i, _)| i).collect())).collect()
        };
        let (groups, any_order) = group(shape(&[(1, 0), (0, 1), (1, 2), (2, 3), (0, 4), (1, 5)]));
        assert!(any_order);
        assert_eq!(summary(&groups), vec![(12, vec![0, 2, 5]), (11, vec![1, 4]), (13, vec![3])]);
        assert!(groups.iter().all(|g| !g.pinned && g.device.is_none()));
        // Requests 2 and 4 read into the same local block: dependent.
        let (groups, any_order) = group(shape(&[(1, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 5)]));
        assert!(!any_order);
        assert_eq!(summary(&groups), vec![(12, vec![0]), (11, vec![1]), (12, vec![2, 3]), (11, vec![4, 5])]);
        // One region for all: one group, in order.
        let (groups, any_order) = group(shape(&[(2, 0), (2, 1), (2, 2)]));
        assert!(!any_order);
        assert_eq!(summary(&groups), vec![(13, vec![0, 1, 2])]);
    }

    /// Guards `LeasesByAddr`: with 200 regions (100 bytes apart, 60 long)
    /// leased in scrambled order, every address finds the region holding
    /// it and none in a gap; once more lookups than regions have missed
    /// the index, it is rebuilt over all of them (found in one step).
    #[test]
    fn leases_by_address_find_their_region_and_reindex() {
        let mut by = LeasesByAddr::default();
        let region_of = |l: u32| (1000 + 100 * l as u64, 60u64);
        for k in 0..200u32 {
            let l = (k * 73) % 200;
            by.insert(region_of(l).0, l);
        }
        let holds = |addr: u64| move |l: u32| region_of(l).0 <= addr && addr < region_of(l).0 + region_of(l).1;
        for round in 0..2 {
            for l in 0..200u32 {
                let (start, len) = region_of(l);
                assert_eq!(by.find(start, holds(start)), Some(l), "round {round}");
                assert_eq!(by.find(start + len - 1, holds(start + len - 1)), Some(l));
                assert_eq!(by.find(start + len, holds(start + len)), None, "a gap");
            }
            if round == 0 {
                assert_eq!(by.indexed.len(), 200, "rebuilt after the misses");
            }
        }
        assert_eq!(by.find(999, holds(999)), None);
    }

    /// Guards `may_fall_through`: of every failure an unposted IPC
    /// subbatch can have, exactly the three docs/transports.md names move
    /// to TCP under AUTO; a refusal on the merits (a bad range, a missing
    /// permission, a stale region table, an uncertain outcome) fails there
    /// and is never retried on another transport.
    #[test]
    fn only_unavailable_exhausted_and_unsupported_fall_through() {
        let falls: Vec<Status> = Status::ALL
            .into_iter()
            .filter(|s| !matches!(s, Status::Ok | Status::Pending))
            .filter(|s| may_fall_through(&Error::from_status(*s, "refused")))
            .collect();
        assert_eq!(falls, vec![Status::Unavailable, Status::ResourceExhausted, Status::NotSupported]);
    }
}
