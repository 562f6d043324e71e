//! Requester side of the IPC protocol: running a subbatch's group (its
//! admission, an import ready, revalidated or taken from the cache), the
//! requester's state and counts, and its calls into an import's mapping,
//! each checking its fault switch (`Faults`) first; opening imports
//! (request, offer, answer, handle) in `opening.rs`, posting a group's
//! copies and ending it (receipts) in `posting.rs`, a finished group's
//! requests and verdict in `finished.rs`, the relocation cache at work in
//! `cached.rs`, closing imports in `closing.rs`, the progress worker in
//! `progress.rs`; `tests.rs` tests it against a scripted source. What the
//! protocol decides (whether an offer matches, what answers it, what a
//! handle or a revalidation's answer says, how a group ends) is
//! `ipc/proto/requester.rs`; this driver makes the calls over its link and
//! carries it out.

mod cached;
mod closing;
mod finished;
pub mod held;
mod opening;
mod posting;
mod progress;

use super::backend::{CopyOp, CopyPlan, IpcBackend, Mapping, Posting, ReceivedHandle};
use super::board::{self, Board, Words};
use super::cache::{EntryState, RelocationCache};
use super::faults::Faults;
use super::link::IpcLink;
use super::messages::{op_bit, ExportOffer, ExportRef, Revalidate, OP_READ, OP_WRITE};
use super::plan::classify;
use super::proto::requester::{revalidated, Ending, GroupEnd, Offered, Opening};
use crate::control::frame::MsgKind;
use crate::control::message::RegionInfo;
use crate::error::{Error, Result};
use crate::memory::owners;
use crate::sync::admission::{Budget, SharedCharge, SharedCharges};
use crate::transfer::{Op, Request};
use crate::transport::coalesce::{self, LocalSpans};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use finished::{take_group_items, Finished, GroupItems};

/// An open import: the mapping of a whole remote allocation and its charge.
pub struct Import {
    link: Arc<IpcLink>,
    /// The local GPU whose context it was opened for (`None`: host memory).
    local_device: Option<i32>,
    /// The link's channel generation the export was granted on.
    gen: u64,
    offer: ExportOffer,
    mapping: Box<dyn Mapping>,
    /// The export's slot on its channel's grant board, if it has one.
    board: Option<(Arc<Board>, u32)>,
    /// The generation the slot names this grant by (the source may move it;
    /// a revalidation tells the new one).
    slot_generation: AtomicU64,
    /// Its share of the remote allocation's charge: a READ-only and a
    /// writable import of one allocation count it once.
    _charge: SharedCharge<ChargeKey>,
    /// Direct copies running through it outside the cache ([`HeldImport`]).
    direct_users: std::sync::atomic::AtomicU32,
    /// Set before its native close: no direct copy starts any more.
    unmapping: std::sync::atomic::AtomicBool,
}

/// What an import's charge is counted by: the source (endpoint and engine
/// epoch) and its allocation's base.
type ChargeKey = (Arc<str>, u64, u64);

impl Import {
    fn export_ref(&self, value: u64, extra: u32) -> ExportRef {
        ExportRef { export_id: self.offer.export_id, token: self.offer.token, value, extra }
    }

    /// Whether it may still be used: its link lives and is on the channel
    /// the export was granted on.
    fn current(&self) -> bool {
        !self.link.is_dead() && self.gen == self.link.generation()
    }

    fn describe(&self) -> String {
        format!("{} export {} (0x{:x}+{})", self.link.label, self.offer.export_id, self.offer.base, self.offer.physical)
    }

    /// Whether the grant allows WRITE.
    fn writable(&self) -> bool {
        self.offer.ops & OP_WRITE != 0
    }

    /// Enters the export's board slot for a group needing `ops`: `true`
    /// when the source still grants them (the group is in flight until
    /// [`Import::leave`]); `false` without a slot, when revoked, when the
    /// source hung up (a dead source cannot revoke: its last words no
    /// longer grant anything, and the round trip reports it gone), or when
    /// `ops` go beyond the grant this import was mapped for: the board's
    /// words only withdraw what the mapping allows, never widen it (a READ
    /// grant's mapping is read-only, whatever its slot claims).
    fn enter(&self, ops: u32) -> bool {
        if ops & !self.offer.ops != 0 {
            return false;
        }
        let Some((b, i)) = &self.board else { return false };
        let Some(s) = b.slot(*i) else { return false };
        if !board::enter(s, self.slot_generation.load(Ordering::Acquire), ops) {
            return false;
        }
        if b.source_hung_up() {
            board::leave(s);
            return false;
        }
        true
    }

    /// Whether the source is withdrawing this grant now (its board slot
    /// allows nothing: the source revoked it before it sent `Revoke`,
    /// because it unregisters the region or closes), or there is no slot
    /// to tell: what a source's `Revoke` asks back. A grant the source
    /// published again (its unregistration gave up) stays; the next group
    /// revalidates it and learns its new generation.
    fn withdrawn(&self) -> bool {
        let Some(s) = self.board.as_ref().and_then(|(b, i)| b.slot(*i)) else { return true };
        s.ops() == 0
    }

    /// A group that entered is complete: it moved `requests` requests of
    /// `bytes` bytes in all.
    fn leave(&self, requests: u64, bytes: u64) {
        if let Some(s) = self.board.as_ref().and_then(|(b, i)| b.slot(*i)) {
            s.count(requests, bytes);
            board::leave(s);
        }
    }

    /// Whether it maps the remote allocation holding `remote_addr`.
    fn maps(&self, remote_addr: u64) -> bool {
        self.maps_range((remote_addr, 1))
    }

    /// Whether the remote range `(addr, len)` lies wholly in its mapping.
    fn maps_range(&self, (addr, len): (u64, u64)) -> bool {
        addr >= self.offer.base && (addr - self.offer.base).checked_add(len).is_some_and(|e| e <= self.offer.physical)
    }
}

/// Relocation cache key: source endpoint, source epoch, region id and
/// epoch, local context (0 for host memory, device + 1 for a device's
/// context), and whether the grant allows WRITE (a READ-only import maps
/// the allocation read-only; one that writes replaces it, see
/// [`IpcRequester::give_back_read_only`]).
type Key = (Arc<str>, u64, u64, u64, u64, bool);

/// The cache key of `region`'s import through `link` for copies with local
/// memory on `local_device` (`None`: host memory), writable or not.
fn cache_key(link: &IpcLink, region: &RegionInfo, local_device: Option<i32>, writable: bool) -> Key {
    let ctx = local_device.map_or(0, |d| d as u64 + 1);
    (link.endpoint.clone(), link.source.engine_epoch, region.id, region.epoch, ctx, writable)
}

/// Imports that could not be closed with certainty (cache disabled).
struct Retained {
    import: Arc<Import>,
    native_closed: bool,
}

/// A grant accepted whose handle never arrived: the channel ended first
/// (the handle, if the source sent it, went with it). Nothing was mapped,
/// but the source keeps the export retained until told so or until this
/// process exits; the next flush tells it.
struct LostGrant {
    link: Arc<IpcLink>,
    r: ExportRef,
}

/// What this requester still owes its sources: close receipts of
/// retained imports, and the release of grants whose handle was lost.
#[derive(Default)]
struct Owed {
    imports: Vec<Retained>,
    grants: Vec<LostGrant>,
}

/// How long a late completion's close receipt may take (its group's own
/// deadline has passed).
const LATE_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Called with a deferred group's outcomes once its completion is known.
pub type OnDone = Box<dyn FnOnce(Finished) + Send>;

/// How a subbatch ended on the caller.
pub enum GroupRun {
    /// Finished: its outcomes.
    Done(Finished),
    /// Completion pending: the progress worker will call the `OnDone`.
    Deferred,
}

/// A group whose copies are posted.
struct Posted {
    imp: Arc<Import>,
    key: Option<Key>,
    items: Vec<(usize, Request)>,
    copied: Result<Posting>,
    deadline: Instant,
    /// The group entered its import's board slot (no receipt round trip).
    entered: bool,
    /// Fences of the group's local pinned host allocations.
    fences: Vec<owners::Fence>,
}

impl Posted {
    /// What the group's completion is asked by (nothing pending when its
    /// copies failed to post).
    fn posting(&self) -> Posting {
        *self.copied.as_ref().unwrap_or(&0)
    }
}

/// A posted group waiting on the progress worker.
struct Deferred {
    posted: Posted,
    /// `None` once its outcomes were reported (`Unquiesced`, its deadline
    /// passed with the completion pending): the worker still polls it, and
    /// a completion that comes late releases the import as usual.
    done: Option<OnDone>,
}

#[derive(Default)]
struct Progress {
    queue: Vec<Deferred>,
    /// Groups the worker took out of `queue` for its current round and has
    /// not settled or put back yet (counted as pending all along).
    in_hand: usize,
    /// Of the pending groups, those whose outcomes were reported at their
    /// deadline (polled on).
    late: usize,
    worker: Option<std::thread::JoinHandle<()>>,
    stopped: bool,
}

/// What a group's local memory is, and what group it is part of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLocal {
    /// The GPU whose context copies it (`None`: host memory).
    pub device: Option<i32>,
    /// Some of it is library pinned host memory (fenced while the group runs).
    pub pinned: bool,
    /// For a window of a larger group, the operations of the whole group
    /// (`OP_READ`/`OP_WRITE` bits; 0 otherwise): every window asks the
    /// relocation cache for the import the whole group needs, so that the
    /// windows share one (a group mixing READ and WRITE takes one writable
    /// import, not one per direction, each charged for the allocation).
    pub group_ops: u32,
    /// The local regions the group's requests lie in: a coalesced copy
    /// stays inside one.
    pub spans: LocalSpans,
    /// The submission's requests were shown independent already
    /// ([`super::plan::independent`]: no range one writes overlaps a range
    /// of another in the same address space). Their copies are then
    /// independent too, with no second pass over them: a source or
    /// destination in the import lies in its own mapping, apart from every
    /// local one.
    pub independent: bool,
}

/// Why a subbatch did not run.
pub enum GroupError {
    /// Rejected before any copy was posted: nothing happened remotely, and
    /// the requests (given back) may try another transport.
    NotPosted(Error, Vec<(usize, Request)>),
}

/// What a subbatch runs through once admitted: its import, its cache key
/// (and whether it entered the import's board slot), and the fences of its
/// local pinned memory.
struct Ready {
    imp: Arc<Import>,
    key: Option<(Key, bool)>,
    fences: Vec<owners::Fence>,
}

crate::counters::counter_set! {
    /// What the requester side of one IPC transport counts, live.
    pub struct ImportEvents;
    /// The requester side's counts, as `ipc.<transport>` reports them
    /// (each under its serde name).
    pub struct ImportCounts {
        /// Imports opened since the engine started.
        #[serde(rename = "imports_opened")]
        opened,
        /// Imports closed with confirmation (native close + acknowledged
        /// receipt) since the engine started.
        #[serde(rename = "imports_closed")]
        closed,
        /// Imports released without a receipt because their source provably
        /// left (its process exited or its engine is gone), since the start.
        #[serde(rename = "imports_released_after_exit")]
        released_after_exit,
        /// Groups through cached imports that ran inside the source's
        /// published grant on the channel's board: no round trip.
        groups_without_round_trip,
        /// Of those, direct-route copies (`orbite_direct_copy`) that went
        /// through the import held by their route, outside the cache's lock.
        direct_copies,
        /// Groups through cached imports revalidated and receipted over the
        /// channel (no board slot, or the slot was revoked), refused ones
        /// included.
        groups_with_round_trips,
        /// Groups whose completion came after their deadline had reported
        /// them (their import was then closed, or returned to the cache, as
        /// usual), since the engine started.
        late_completions,
        /// Copies handed to mappings since the engine started: one per
        /// contiguous run of requests with `coalesce` on, else one per
        /// request.
        copies_issued,
        /// Requests that moved in the copy of the request before them
        /// (`coalesce`), since the engine started.
        requests_coalesced,
    }
    gauges {
        /// Imports kept in the relocation cache, ready for reuse or in use.
        #[serde(rename = "imports_cached")]
        cached: u64,
        /// Imports kept after an unconfirmed close or receipt (outside the
        /// relocation cache's bound).
        #[serde(rename = "imports_retained")]
        retained: u64,
        /// Local pinned host allocations fenced after an uncertain
        /// completion (no further use, no free: a copy may still touch them).
        #[serde(rename = "local_owners_fenced")]
        fenced_local: u64,
        /// Groups already reported `UNQUIESCED` at their deadline whose
        /// completion is polled now: a completion that comes late closes
        /// their import (or returns it to the cache) as usual, with no flush.
        late_groups: u64,
        /// Physical bytes charged by imports (reported with the exports' in
        /// `mapping_bytes_charged`).
        #[serde(skip)]
        charged_bytes: u64,
    }
}

/// The requester side of one IPC transport.
pub struct IpcRequester {
    backend: Arc<dyn IpcBackend>,
    /// Imported allocations' charges: each once against the mapping budget.
    charges: Arc<SharedCharges<ChargeKey>>,
    capacity: usize,
    cache: RelocationCache<Key, Import>,
    retained: Mutex<Owed>,
    /// The links made to sources so far (weak: a peer's link lives with
    /// the peer and its imports): what a link this engine closed still
    /// owes its source goes out on a later link to the same source
    /// ([`IpcRequester::track`]).
    links: Mutex<Vec<std::sync::Weak<IpcLink>>>,
    /// Fences of local pinned allocations whose group ended uncertain: the
    /// whole owner stays fenced (no new use, no free) for good.
    fenced: Mutex<Vec<owners::Fence>>,
    /// What it counts (reported through [`IpcRequester::counts`]).
    events: ImportEvents,
    /// Contiguous runs of independent requests move as one copy.
    coalesce: bool,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
    /// Fault injection switches, checked before each call into an
    /// import's mapping and at an import's opening (inert unless armed).
    pub faults: Arc<Faults>,
    /// The engine's log lines (imports retained).
    log: Arc<crate::log::Logger>,
}

/// The group's remote envelope (start, length) and the operations it
/// needs, in one pass.
fn envelope_and_ops(items: &[(usize, Request)]) -> ((u64, u64), u32) {
    let (start, end, ops) = items.iter().fold((u64::MAX, 0, 0), |(lo, hi, ops), (_, r)| {
        (lo.min(r.remote_addr), hi.max(r.remote_addr + r.len), ops | op_bit(r.op))
    });
    let env = if items.is_empty() { (0, 0) } else { (start, end - start) };
    (env, ops)
}

/// Takes one fault from an armed switch of [`Faults`]; unarmed (always,
/// outside tests) it costs one relaxed load and no read-modify-write.
fn injected(switch: &AtomicU32) -> bool {
    switch.load(Ordering::Relaxed) != 0 && crate::sync::take_armed(switch)
}

impl IpcRequester {
    /// A requester over `backend` with a cache of `capacity` entries (0: no
    /// cache), coalescing contiguous runs when `coalesce` is set.
    pub fn new(
        backend: Arc<dyn IpcBackend>,
        budget: Arc<Budget>,
        capacity: usize,
        coalesce: bool,
        faults: Arc<Faults>,
        log: Arc<crate::log::Logger>,
    ) -> IpcRequester {
        IpcRequester {
            backend,
            charges: SharedCharges::new(budget),
            capacity,
            cache: RelocationCache::new(capacity),
            retained: Mutex::new(Owed::default()),
            links: Mutex::new(Vec::new()),
            fenced: Mutex::new(Vec::new()),
            events: ImportEvents::default(),
            coalesce,
            progress: Mutex::new(Progress::default()),
            progress_cv: Condvar::new(),
            faults,
            log,
        }
    }

    /// Enqueues (or performs) `ops` through the import's mapping, unless a
    /// copy fault is armed (`Faults::fail_copy`).
    fn mapping_copy(&self, imp: &Import, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting> {
        if injected(&self.faults.fail_copy) {
            return Err(Error::TransferFailed("injected fault: copy failed".into()));
        }
        imp.mapping.copy(ops, plan)
    }

    /// Waits for `posting`'s copies, unless a completion fault is armed
    /// (`Faults::fail_completion`).
    fn mapping_wait(&self, imp: &Import, posting: Posting) -> Result<()> {
        if injected(&self.faults.fail_completion) {
            return Err(Error::Unquiesced("injected fault: completion could not be confirmed".into()));
        }
        imp.mapping.wait(posting)
    }

    /// Asks once whether `posting`'s copies are complete: "not yet" while
    /// `Faults::pending_polls` is armed, an error while
    /// `Faults::fail_completion` is.
    fn mapping_query(&self, imp: &Import, posting: Posting) -> Result<bool> {
        if injected(&self.faults.pending_polls) {
            return Ok(false);
        }
        if injected(&self.faults.fail_completion) {
            return Err(Error::Unquiesced("injected fault: completion could not be confirmed".into()));
        }
        imp.mapping.query(posting)
    }

    /// Whether the progress worker waits for the import's pending copies
    /// instead of polling them: never while `Faults::pending_polls` is
    /// armed (polled, like a GPU's).
    fn mapping_waits(&self, imp: &Import) -> bool {
        imp.mapping.completes_by_waiting() && self.faults.pending_polls.load(Ordering::SeqCst) == 0
    }

    /// The import's native close (unmap), unless a close fault is armed
    /// (`Faults::fail_close`).
    fn mapping_close(&self, imp: &Import) -> Result<()> {
        if injected(&self.faults.fail_close) {
            return Err(Error::Unquiesced("injected fault: native close failed".into()));
        }
        imp.mapping.close()
    }

    /// Runs one subbatch: requests naming one remote region, whose local
    /// memory lives on `local.device` (`None`: host memory).
    /// Setup, mapping and copies run on the caller; the trailing completion
    /// is queried once. A ready group finishes here (close or receipt);
    /// otherwise, when `defer` is given, the group moves to this transport's
    /// lazy progress worker, which finishes it and calls the completion
    /// `defer` builds (built only then) with the outcomes; without `defer`
    /// the caller waits. `NotPosted`: rejected before anything was posted.
    pub fn run_group(
        self: &Arc<Self>,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        items: Vec<(usize, Request)>,
        local: GroupLocal,
        deadline: Instant,
        defer: Option<impl FnOnce() -> OnDone>,
    ) -> std::result::Result<GroupRun, GroupError> {
        let Ready { imp, key, fences } = match self.ready(link, region, &items, &local, deadline) {
            Ok(ready) => ready,
            Err(e) => return Err(GroupError::NotPosted(e, items)),
        };
        let posted = self.post(imp, key, items, &local, deadline, fences);
        match (self.mapping_query(&posted.imp, posted.posting()), defer) {
            (Ok(true), _) => Ok(GroupRun::Done(self.finish(posted, Ok(())))),
            (Err(e), _) => Ok(GroupRun::Done(self.finish(posted, Err(e)))),
            (Ok(false), None) => {
                let drained = self.mapping_wait(&posted.imp, posted.posting());
                Ok(GroupRun::Done(self.finish(posted, drained)))
            }
            (Ok(false), Some(done)) => {
                self.defer(Deferred { posted, done: Some(done()) });
                Ok(GroupRun::Deferred)
            }
        }
    }

    /// A subbatch's admission before anything is posted: the link alive,
    /// local pinned memory fenced, its import opened or taken from the
    /// cache (entering its board slot, or revalidated by the source).
    fn ready(
        &self,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        items: &[(usize, Request)],
        local: &GroupLocal,
        deadline: Instant,
    ) -> Result<Ready> {
        if let Some(e) = link.dead_reason() {
            return Err(e);
        }
        self.backend.usable()?;
        let local_device = local.device;
        let fences = match local.pinned {
            true => owners::fence_pinned_at(items.iter().map(|(_, r)| r.local_addr), deadline)?,
            false => Vec::new(),
        };
        let (env, ops) = envelope_and_ops(items);
        let ops = ops | local.group_ops;
        let (imp, key): (Arc<Import>, Option<(Key, bool)>) = if self.capacity == 0 {
            let opened = self.open(Want { link, region, env, ops, local_device, deadline });
            (Arc::new(opened?), None)
        } else {
            let writable = ops & OP_WRITE != 0;
            let key_of = |w: bool| cache_key(link, region, local_device, w);
            // A writable cached export serves later READs and WRITEs alike:
            // it asks for every operation the region allows. A READ-only
            // one asks for READ alone, so that readers share the source's
            // allocation. Each submission is revalidated.
            let region_ops = (if region.access.can_read() { OP_READ } else { 0 })
                | (if region.access.can_write() { OP_WRITE } else { 0 });
            let cache_ops = match writable {
                true if ops & !region_ops == 0 => region_ops,
                true => ops,
                false => OP_READ,
            };
            // A READ takes a writable import of the region when one is
            // cached, else its own READ-only one: both looked up under one
            // lock; only a miss goes on to open one.
            let own = key_of(writable);
            let wider = (!writable).then(|| key_of(true));
            let (imp, fresh, key) = match self.cache.share_first(wider.iter().chain([&own]), &Import::current) {
                Some((0, imp)) if wider.is_some() => (imp, false, wider.expect("looked up")),
                Some((_, imp)) => (imp, false, own),
                None => {
                    let key = own;
                    let (imp, fresh) =
                        self.acquire(&key, Want { link, region, env, ops: cache_ops, local_device, deadline })?;
                    if fresh && writable {
                        self.give_back_read_only(link, region, local_device, deadline);
                    }
                    (imp, fresh, key)
                }
            };
            // A cached import serves later ranges of its region without
            // the offer's check: a source whose published region reaches
            // past the allocation it exports must not make a copy leave
            // the mapping.
            if !imp.maps_range(env) {
                self.release(&key);
                return Err(Error::Protocol(format!(
                    "{}: region {} names 0x{:x}+{}, which the import of its allocation does not map",
                    imp.describe(),
                    region.id,
                    env.0,
                    env.1
                )));
            }
            // The board first: the source's words say whether the grant still
            // holds, with no round trip. Otherwise the source revalidates
            // the submission (and tells the slot's current generation).
            let mut entered = imp.enter(ops);
            let revalidated = !entered && !fresh;
            if revalidated {
                self.events.groups_with_round_trips.fetch_add(1, Ordering::Relaxed);
                match self.revalidate(link, &imp, region, env, ops, deadline) {
                    Ok(generation) => {
                        if generation != 0 {
                            imp.slot_generation.store(generation, Ordering::Release);
                            entered = imp.enter(ops);
                        }
                    }
                    Err(e) => {
                        self.release(&key);
                        return Err(e);
                    }
                }
            }
            if !revalidated {
                let counter =
                    if entered { &self.events.groups_without_round_trip } else { &self.events.groups_with_round_trips };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            (imp, Some((key, entered)))
        };
        Ok(Ready { imp, key, fences })
    }

    fn revalidate(
        &self,
        link: &Arc<IpcLink>,
        imp: &Import,
        region: &RegionInfo,
        env: (u64, u64),
        ops: u32,
        deadline: Instant,
    ) -> Result<u64> {
        let v = Revalidate {
            tag: link.tag(),
            export_id: imp.offer.export_id,
            token: imp.offer.token,
            region_epoch: region.epoch,
            addr: env.0,
            len: env.1,
            ops,
        };
        let f = link.call(MsgKind::Revalidate, &v.encode(), deadline, "revalidate")?;
        revalidated(f.kind, &f.body)
    }

    /// Why this transport can never reach `link`'s source (`None`: it may):
    /// the backend's checks, asked once per link before its first channel,
    /// or a refusal found since (an import or a copy the kernel refused).
    /// Submissions under AUTO then take the next transport.
    pub fn refused(&self, link: &Arc<IpcLink>) -> Option<String> {
        if let Some(why) = link.refused() {
            return Some(why.to_string());
        }
        if link.checked() {
            return None;
        }
        if let Some(why) = self.backend.refusal(&link.source.process) {
            self.refuse(link, why.clone());
            return Some(why);
        }
        link.mark_checked();
        None
    }

    /// Records that this transport can never reach `link`'s source, and
    /// says so once (WARN).
    fn refuse(&self, link: &IpcLink, why: String) {
        let kind = self.backend.transport().name();
        let text = format!("{}: {kind} cannot be used: {why}; its requests take the next transport", link.label);
        if link.refuse(why) {
            self.log.warn(format_args!("{text}"));
        }
    }

    /// Whether imports are kept in a relocation cache (and so shared by
    /// the subbatches that name one region), rather than opened and closed
    /// per subbatch.
    pub fn caches(&self) -> bool {
        self.capacity > 0
    }

    /// Whether the transport still takes new work (see
    /// [`IpcBackend::usable`]).
    pub fn usable(&self) -> Result<()> {
        self.backend.usable()
    }

    /// Counts for stats.
    pub fn counts(&self) -> ImportCounts {
        let mut n = self.events.snapshot();
        for (_, _, st, v) in self.cache.entries() {
            match (st, v) {
                (EntryState::Ready, Some(_)) => n.cached += 1,
                (EntryState::Retained, Some(_)) => n.retained += 1,
                _ => {}
            }
        }
        n.retained += self.retained.lock().imports.len() as u64;
        n.charged_bytes = self.charges.bytes();
        n.late_groups = self.late_groups();
        n.fenced_local = self.fenced.lock().len() as u64;
        n
    }
}

/// What an import is opened for: the source's region over `link`, the
/// envelope and operations one group needs, the GPU that copies, and when
/// to give up.
#[derive(Clone, Copy)]
pub(super) struct Want<'a> {
    link: &'a Arc<IpcLink>,
    region: &'a RegionInfo,
    env: (u64, u64),
    ops: u32,
    local_device: Option<i32>,
    deadline: Instant,
}

#[cfg(test)]
mod tests;
