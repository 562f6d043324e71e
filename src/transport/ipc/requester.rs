//! Requester side of the IPC protocol: opening imports (request, offer,
//! answer, handle), the relocation cache, subbatch copies and receipts.

use super::backend::{CopyOp, IpcBackend, Mapping, Posting, ReceivedHandle};
use super::board::{self, Board};
use super::cache::{EntryState, RelocationCache};
use super::faults::Faults;
use super::link::IpcLink;
use super::messages::{op_bit, ExportOffer, ExportRef, ExportRequest, Revalidate, OP_READ, OP_WRITE};
use super::plan::classify;
use crate::control::frame::MsgKind;
use crate::control::message::RegionInfo;
use crate::error::{Error, Result};
use crate::memory::owners;
use crate::memory::MemoryKind;
use crate::sync::admission::{Budget, SharedCharge, SharedCharges};
use crate::transfer::{ChunkOutcome, Op, RemoteEffect, Request};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
    /// [`Import::leave`]); `false` without a slot, when revoked, or when
    /// the source hung up (a dead source cannot revoke: its last words no
    /// longer grant anything, and the round trip reports it gone).
    fn enter(&self, ops: u32) -> bool {
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
        remote_addr >= self.offer.base && remote_addr - self.offer.base < self.offer.physical
    }
}

/// Relocation cache key: source endpoint, source epoch, region id and
/// epoch, local context (0 for host memory, device + 1 for a device's
/// context), and whether the grant allows WRITE (a READ-only import maps
/// the allocation read-only; one that writes replaces it, see
/// [`IpcRequester::give_back_read_only`]).
type Key = (Arc<str>, u64, u64, u64, u64, bool);

/// Imports that could not be closed with certainty (cache disabled).
struct Retained {
    import: Arc<Import>,
    native_closed: bool,
}

/// How long a late completion's close receipt may take (its group's own
/// deadline has passed).
const LATE_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Called with a deferred group's outcomes once its completion is known.
pub type OnDone = Box<dyn FnOnce(Vec<ChunkOutcome>) + Send>;

/// How a subbatch ended on the caller.
pub enum GroupRun {
    /// Finished: one outcome per item.
    Done(Vec<ChunkOutcome>),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// Why a subbatch did not run.
pub enum GroupError {
    /// Rejected before any copy was posted: nothing happened remotely, and
    /// the requests may try another transport.
    NotPosted(Error),
}

/// Counts for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Imports opened since the engine started.
    pub opened: u64,
    /// Imports closed with confirmation (native close + acknowledged receipt).
    pub closed: u64,
    /// Cached imports ready for reuse or in use.
    pub cached: u64,
    /// Imports kept after an unconfirmed close or receipt.
    pub retained: u64,
    /// Physical bytes charged by imports.
    pub charged_bytes: u64,
    /// Local pinned host allocations fenced after an uncertain completion.
    pub fenced_local: u64,
    /// Imports dropped without a receipt because their source provably
    /// left (its process exited or its engine is gone).
    pub released_after_exit: u64,
    /// Groups through a cached import that ran inside the source's
    /// published grant (no round trip).
    pub fast_groups: u64,
    /// Groups through a cached import revalidated over the channel (no
    /// board slot, or the slot was revoked), refused ones included.
    pub round_trip_groups: u64,
    /// Groups reported at their deadline whose completion came later (their
    /// import was then closed, or returned to the cache, as usual).
    pub late_completions: u64,
    /// Groups reported at their deadline whose completion is polled now.
    pub late_groups: u64,
}

/// The requester side of one IPC transport.
pub struct IpcRequester {
    backend: Arc<dyn IpcBackend>,
    /// Imported allocations' charges: each once against the mapping budget.
    charges: Arc<SharedCharges<ChargeKey>>,
    capacity: usize,
    cache: RelocationCache<Key, Import>,
    retained: Mutex<Vec<Retained>>,
    /// Fences of local pinned allocations whose group ended uncertain: the
    /// whole owner stays fenced (no new use, no free) for good.
    fenced: Mutex<Vec<owners::Fence>>,
    opened: AtomicU64,
    closed: AtomicU64,
    released_after_exit: AtomicU64,
    /// Cached groups that ran inside their board slot (no round trip).
    fast_groups: AtomicU64,
    /// Cached groups revalidated and receipted over the channel.
    round_trip_groups: AtomicU64,
    /// Groups whose completion came after their deadline had reported them.
    late_completions: AtomicU64,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
    /// Fault injection switches (inert unless armed).
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

impl IpcRequester {
    /// A requester over `backend` with a cache of `capacity` entries (0: no cache).
    pub fn new(
        backend: Arc<dyn IpcBackend>,
        budget: Arc<Budget>,
        capacity: usize,
        faults: Arc<Faults>,
        log: Arc<crate::log::Logger>,
    ) -> IpcRequester {
        IpcRequester {
            backend,
            charges: SharedCharges::new(budget),
            capacity,
            cache: RelocationCache::new(capacity),
            retained: Mutex::new(Vec::new()),
            fenced: Mutex::new(Vec::new()),
            opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            released_after_exit: AtomicU64::new(0),
            fast_groups: AtomicU64::new(0),
            round_trip_groups: AtomicU64::new(0),
            late_completions: AtomicU64::new(0),
            progress: Mutex::new(Progress::default()),
            progress_cv: Condvar::new(),
            faults,
            log,
        }
    }

    /// Opens an import: ExportRequest -> Offer (validated here) -> charge ->
    /// Answer -> Handle -> map. Any failure is before a copy was posted.
    fn open(
        &self,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        env: (u64, u64),
        ops: u32,
        local_device: Option<i32>,
        deadline: Instant,
    ) -> Result<Import> {
        let tag = link.tag();
        let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128) as u32;
        let req = ExportRequest { tag, region_epoch: region.epoch, addr: env.0, len: env.1, ops, wait_ms };
        let f = link.call(MsgKind::ExportRequest, &req.encode(), deadline, "export request")?;
        let offer = match f.kind {
            MsgKind::ExportOffer => ExportOffer::decode(&f.body)?,
            MsgKind::ExportReject => {
                let (t, e) = super::messages::decode_reject(&f.body)?;
                if t != tag {
                    return Err(Error::Protocol(format!("reject for tag {t}, expected {tag}")));
                }
                return Err(e);
            }
            other => return Err(Error::Protocol(format!("export request answered with {other:?}"))),
        };
        // Validate the grant: operation, range, epochs, fresh token.
        let grant_end = offer.grant_addr.checked_add(offer.grant_len);
        let valid = offer.tag == tag
            && offer.token != 0
            && offer.region_epoch == region.epoch
            && offer.ops & ops == ops
            && offer.grant_addr <= env.0
            && grant_end.is_some_and(|e| e >= env.0 + env.1 && e <= offer.base + offer.physical)
            && offer.base <= offer.grant_addr;
        if !valid {
            let decline = ExportRef { export_id: offer.export_id, token: offer.token, value: 0, extra: 0 };
            let _ = link.call(MsgKind::ExportAnswer, &decline.encode(), deadline, "decline");
            return Err(Error::Protocol(format!("{}: the offer does not match the request ({offer:?})", link.label)));
        }
        let answer =
            |accept: bool| ExportRef { export_id: offer.export_id, token: offer.token, value: accept as u64, extra: 0 };
        let charge_key = (link.endpoint.clone(), link.source.engine_epoch, offer.base);
        // Idle cached imports give their charge back for a new one.
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        let charge = loop {
            match self.charges.try_acquire(charge_key.clone(), offer.physical) {
                Some(c) => break Some(c),
                None if self.cache.evict_lru_idle(&close) => continue,
                None => break None,
            }
        };
        let charge = match charge {
            Some(c) => c,
            None => {
                link.call(MsgKind::ExportAnswer, &answer(false).encode(), deadline, "decline")?;
                return Err(Error::ResourceExhausted(format!(
                    "this engine's mapping budget (max_inflight_bytes = {}, {} in use) cannot hold an import of \
                     {} physical bytes (the whole remote allocation, charged once however many imports of it this \
                     engine holds); raise max_inflight_bytes on the requester above the sum of the remote \
                     allocations it imports at once",
                    self.charges.budget().limit(),
                    self.charges.budget().used(),
                    offer.physical
                )));
            }
        };
        let f = link.call(MsgKind::ExportAnswer, &answer(true).encode(), deadline, "export answer")?;
        let (body, fd) = match f.kind {
            MsgKind::ExportHandle => (f.body, f.fd),
            MsgKind::ExportReject => return Err(super::messages::decode_reject(&f.body)?.1),
            other => return Err(Error::Protocol(format!("export answer answered with {other:?}"))),
        };
        if body.len() < 28 {
            return Err(Error::Protocol("ExportHandle body too short".into()));
        }
        let r = ExportRef::decode(&body[..28], "ExportHandle")?;
        if r.export_id != offer.export_id || r.token != offer.token {
            return Err(Error::Protocol("ExportHandle names another export".into()));
        }
        let handle = ReceivedHandle { bytes: body[28..].to_vec(), fd };
        match self.backend.import(handle, offer.physical, offer.ops & OP_WRITE != 0, local_device) {
            Ok(mapping) => {
                self.opened.fetch_add(1, Ordering::Relaxed);
                let gen = link.generation();
                let board = match offer.slot {
                    super::messages::NO_SLOT => None,
                    i => link.board(gen).filter(|b| b.slot(i).is_some()).map(|b| (b, i)),
                };
                let slot_generation = AtomicU64::new(offer.slot_generation);
                Ok(Import {
                    link: link.clone(),
                    local_device,
                    gen,
                    offer,
                    mapping,
                    board,
                    slot_generation,
                    _charge: charge,
                })
            }
            Err(e) => {
                // Nothing was mapped: tell the source it may release.
                let _ = link.receipt(MsgKind::CloseReceipt, &answer(false), deadline);
                Err(e)
            }
        }
    }

    /// Native close, then the close receipt. Only both succeeding releases
    /// the import; a failed native close is never retried; a lost ACK is
    /// retried once as a receipt only. When the source provably left, no
    /// receipt is owed (its export went with it): the import is released
    /// after the native close and counted as released after exit.
    fn close_import(
        &self,
        imp: &Import,
        native_closed: bool,
        deadline: Instant,
    ) -> std::result::Result<(), (Error, bool)> {
        if !native_closed {
            imp.mapping.close().map_err(|e| {
                self.log.warn(format_args!(
                    "{}: import retained for good: its native close failed ({})",
                    imp.describe(),
                    e.message()
                ));
                (e, false)
            })?;
        }
        let receipt = match imp.link.source_left() {
            true => None,
            false => Some(imp.link.receipt(MsgKind::CloseReceipt, &imp.export_ref(0, 0), deadline)),
        };
        match receipt {
            Some(Ok(())) => {
                self.closed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // The receipt's own failure may be how the link learned that the
            // source left.
            None => self.released(),
            Some(Err(_)) if imp.link.source_left() => self.released(),
            Some(Err(e)) => {
                self.log.warn(format_args!(
                    "{}: import kept: its close receipt could not be confirmed ({}); later submissions, flushes \
                     and the close retry it",
                    imp.describe(),
                    e.message()
                ));
                Err((e, true))
            }
        }
    }

    fn released(&self) -> std::result::Result<(), (Error, bool)> {
        self.released_after_exit.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Closes the cached imports that are no longer current (their source
    /// left, or their channel was replaced) and retries the receipts owed
    /// by retained ones of sources that left. Runs before a new import is
    /// opened, so dead sources never keep the cache full.
    fn reclaim(&self, deadline: Instant) -> usize {
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        self.cache.reclaim(&close, &|imp: &Import| imp.current() && !imp.link.source_gone(), false)
    }

    /// Runs one subbatch: requests naming one remote region, whose local
    /// memory lives on `local.device` (`None`: host memory).
    /// Setup, mapping and copies run on the caller; the trailing completion
    /// is queried once. A ready group finishes here (close or receipt);
    /// otherwise, when `defer` is given, the group moves to this transport's
    /// lazy progress worker, which finishes it and calls `defer` with the
    /// outcomes; without `defer` the caller waits. `NotPosted`: rejected
    /// before anything was posted.
    pub fn run_group(
        self: &Arc<Self>,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        items: Vec<(usize, Request)>,
        local: GroupLocal,
        deadline: Instant,
        defer: Option<OnDone>,
    ) -> std::result::Result<GroupRun, GroupError> {
        if let Some(e) = link.dead_reason() {
            return Err(GroupError::NotPosted(e));
        }
        let local_device = local.device;
        let fences = match local.pinned {
            true => fence_local_pinned(&items, deadline).map_err(GroupError::NotPosted)?,
            false => Vec::new(),
        };
        let (env, ops) = envelope_and_ops(&items);
        let ops = ops | local.group_ops;
        let (imp, key): (Arc<Import>, Option<(Key, bool)>) = if self.capacity == 0 {
            let opened = self.open(link, region, env, ops, local_device, deadline);
            (Arc::new(opened.map_err(GroupError::NotPosted)?), None)
        } else {
            let writable = ops & OP_WRITE != 0;
            let ctx = local_device.map_or(0, |d| d as u64 + 1);
            let key_of =
                |w: bool| -> Key { (link.endpoint.clone(), link.source.engine_epoch, region.id, region.epoch, ctx, w) };
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
            let shared_writable = match writable {
                false => self.cache.try_share(&key_of(true), &Import::current).map(|imp| (imp, key_of(true))),
                true => None,
            };
            let (imp, fresh, key) = match shared_writable {
                Some((imp, key)) => (imp, false, key),
                None => {
                    let key = key_of(writable);
                    let (imp, fresh) = self
                        .acquire(&key, link, region, env, cache_ops, local_device, deadline)
                        .map_err(GroupError::NotPosted)?;
                    if fresh && writable {
                        self.give_back_read_only(link, region, local_device, deadline);
                    }
                    (imp, fresh, key)
                }
            };
            // The board first: the source's words say whether the grant still
            // holds, with no round trip. Otherwise the source revalidates
            // the submission (and tells the slot's current generation).
            let mut entered = imp.enter(ops);
            let revalidated = !entered && !fresh;
            if revalidated {
                self.round_trip_groups.fetch_add(1, Ordering::Relaxed);
                match self.revalidate(link, &imp, region, env, ops, deadline) {
                    Ok(generation) => {
                        if generation != 0 {
                            imp.slot_generation.store(generation, Ordering::Release);
                            entered = imp.enter(ops);
                        }
                    }
                    Err(e) => {
                        self.release(&key);
                        return Err(GroupError::NotPosted(e));
                    }
                }
            }
            if !revalidated {
                let counter = if entered { &self.fast_groups } else { &self.round_trip_groups };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            (imp, Some((key, entered)))
        };
        let posted = self.post(imp, key, items, deadline, fences);
        match (posted.imp.mapping.query(posted.posting()), defer) {
            (Ok(true), _) => Ok(GroupRun::Done(self.finish(posted, Ok(())))),
            (Err(e), _) => Ok(GroupRun::Done(self.finish(posted, Err(e)))),
            (Ok(false), None) => {
                let drained = posted.imp.mapping.wait(posted.posting());
                Ok(GroupRun::Done(self.finish(posted, drained)))
            }
            (Ok(false), Some(done)) => {
                self.defer(Deferred { posted, done: Some(done) });
                Ok(GroupRun::Deferred)
            }
        }
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
        match f.kind {
            // The tag, then (from a source with a board) the slot's
            // current generation.
            MsgKind::RevalidateOk => {
                Ok(f.body.get(8..16).map_or(0, |g| u64::from_le_bytes(g.try_into().expect("8 bytes"))))
            }
            MsgKind::ExportReject => Err(super::messages::decode_reject(&f.body)?.1),
            other => Err(Error::Protocol(format!("revalidate answered with {other:?}"))),
        }
    }

    /// Enqueues (or performs) every copy of the group through the import.
    fn post(
        &self,
        imp: Arc<Import>,
        key: Option<(Key, bool)>,
        items: Vec<(usize, Request)>,
        deadline: Instant,
        fences: Vec<owners::Fence>,
    ) -> Posted {
        let base = imp.mapping.base();
        let ops: Vec<CopyOp> = items
            .iter()
            .map(|(_, r)| {
                let remote = base + (r.remote_addr - imp.offer.base);
                match r.op {
                    Op::Read => CopyOp { dst: r.local_addr, src: remote, len: r.len },
                    Op::Write => CopyOp { dst: remote, src: r.local_addr, len: r.len },
                }
            })
            .collect();
        let copied = imp.mapping.copy(&ops, classify(&ops));
        let (key, entered) = match key {
            Some((k, e)) => (Some(k), e),
            None => (None, false),
        };
        Posted { imp, key, items, copied, deadline, entered, fences }
    }

    /// Ends a posted group once its completion is known (`drained`). On a
    /// copy failure every item of the group is affected. An unconfirmed
    /// completion keeps the import, its charge and the source's export
    /// (no close, no receipt). Otherwise the import is closed with its
    /// receipt (no cache), or an operation-complete receipt is sent (cache).
    fn finish(&self, p: Posted, drained: Result<()>) -> Vec<ChunkOutcome> {
        let Posted { imp, key, items, copied, deadline, entered, fences } = p;
        let mut out: Vec<ChunkOutcome> = items.iter().map(|(_, r)| ChunkOutcome::ok(r.op)).collect();
        let uncertain = drained.is_err();
        if uncertain {
            // The copies may still touch the local pinned owners: they stay
            // loaned (fenced) with the retained import.
            self.fenced.lock().extend(fences);
        } else {
            drop(fences);
        }
        if let Err(e) = drained.and(copied.map(|_| ())) {
            fail_all(&mut out, &items, &e);
        }
        if uncertain {
            let why = out.iter().find_map(|o| o.result.as_ref().err()).map_or("", |e| e.message());
            self.log.warn(format_args!(
                "{}: import retained for good: its completion is uncertain ({why})",
                imp.describe()
            ));
        }
        match key {
            None if uncertain => self.retained.lock().push(Retained { import: imp, native_closed: false }),
            None => {
                // Posted copies (even failed ones) end with the import closed.
                if let Err((e, native_closed)) = self.close_import(&imp, false, deadline) {
                    self.retained.lock().push(Retained { import: imp.clone(), native_closed });
                    fail_all(&mut out, &items, &e);
                }
            }
            Some(key) if uncertain => {
                let why = out.iter().find_map(|o| o.result.as_ref().err()).map(|e| e.message().to_string());
                self.cache.mark_uncertain(&key, imp, &why.unwrap_or_else(|| "completion not confirmed".into()))
            }
            Some(key) if entered => {
                // The group ran inside the grant the source published (it
                // could not have revoked it meanwhile): its outcome is known
                // without a receipt; what it moved is counted in the slot.
                let all_ok = out.iter().all(|o| o.result.is_ok());
                let bytes: u64 = if all_ok { items.iter().map(|(_, r)| r.len).sum() } else { 0 };
                imp.leave(if all_ok { items.len() as u64 } else { 0 }, bytes);
                self.release(&key);
            }
            Some(key) => {
                let bytes: u64 = items.iter().map(|(_, r)| r.len).sum();
                if out.iter().all(|o| o.result.is_ok()) {
                    let r = imp.export_ref(bytes, items.len() as u32);
                    if let Err(e) = imp.link.receipt(MsgKind::OpComplete, &r, deadline) {
                        fail_all(&mut out, &items, &e);
                    }
                }
                self.release(&key);
            }
        }
        out
    }

    /// Hands a group whose completion is pending to the lazy progress
    /// worker (started on first use).
    fn defer(self: &Arc<Self>, d: Deferred) {
        let mut p = self.progress.lock();
        if p.stopped {
            drop(p);
            let out =
                self.finish(d.posted, Err(Error::Unquiesced("the engine closed with the completion pending".into())));
            if let Some(done) = d.done {
                done(out);
            }
            return;
        }
        p.queue.push(d);
        if p.worker.is_none() {
            let me = self.clone();
            p.worker =
                std::thread::Builder::new().name("orbite-ipc-progress".into()).spawn(move || me.progress_loop()).ok();
        }
        drop(p);
        self.progress_cv.notify_all();
    }

    /// The lazy worker: polls pending groups' completions (one query each
    /// per round, a short pause between rounds) and finishes them; a
    /// deadline passed with the completion pending is `Unquiesced`.
    fn progress_loop(self: Arc<Self>) {
        loop {
            let batch: Vec<Deferred> = {
                let mut p = self.progress.lock();
                while p.queue.is_empty() && !p.stopped {
                    self.progress_cv.wait(&mut p);
                }
                if p.queue.is_empty() {
                    return;
                }
                p.in_hand = p.queue.len();
                std::mem::take(&mut p.queue)
            };
            let stopping = self.progress.lock().stopped;
            let mut still = Vec::new();
            for mut d in batch {
                // CPU copies always complete: waited for, not polled.
                let m = &d.posted.imp.mapping;
                if m.completes_by_waiting() {
                    let r = m.wait(d.posted.posting());
                    self.settle(d, r);
                    continue;
                }
                let verdict = match d.posted.imp.mapping.query(d.posted.posting()) {
                    Ok(true) => Some(Ok(())),
                    Err(e) => Some(Err(e)),
                    Ok(false) if stopping => {
                        d.posted.imp.mapping.abandon(d.posted.posting());
                        Some(Err(Error::Unquiesced("the engine closed with the completion event pending".into())))
                    }
                    Ok(false) => {
                        let reported = d.done.is_none() || Instant::now() < d.posted.deadline;
                        if let Some(done) = d.done.take_if(|_| !reported) {
                            // Reported now; polled on, so that a completion
                            // that comes late still closes the import.
                            self.progress.lock().late += 1;
                            let mut out: Vec<ChunkOutcome> =
                                d.posted.items.iter().map(|(_, r)| ChunkOutcome::ok(r.op)).collect();
                            let e = Error::Unquiesced("the deadline passed with the completion event pending".into());
                            fail_all(&mut out, &d.posted.items, &e);
                            done(out);
                        }
                        None
                    }
                };
                match verdict {
                    Some(r) => self.settle(d, r),
                    None => still.push(d),
                }
            }
            if !still.is_empty() {
                let mut p = self.progress.lock();
                p.in_hand = 0;
                still.append(&mut p.queue);
                p.queue = still;
                drop(p);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }

    /// Ends a deferred group whose completion is known (`r`): its outcomes
    /// go to its batch, or, when they were reported already at its
    /// deadline, a late completion releases the import as an ordinary one
    /// (nothing moved is counted: the requests were reported failed).
    fn settle(&self, d: Deferred, r: Result<()>) {
        let Deferred { posted, done } = d;
        {
            // No longer pending, before whoever the outcome wakes looks.
            let mut p = self.progress.lock();
            p.in_hand = p.in_hand.saturating_sub(1);
            p.late -= done.is_none() as usize;
        }
        match done {
            Some(done) => done(self.finish(posted, r)),
            None if r.is_err() => drop(self.finish(posted, r)),
            None => {
                let Posted { imp, key, entered, fences, .. } = posted;
                drop(fences);
                match key {
                    Some(key) => {
                        if entered {
                            imp.leave(0, 0);
                        }
                        self.release(&key);
                    }
                    None => {
                        let deadline = Instant::now() + LATE_CLOSE;
                        if let Err((_, native_closed)) = self.close_import(&imp, false, deadline) {
                            self.retained.lock().push(Retained { import: imp, native_closed });
                        }
                    }
                }
                // Counted once the import is settled (closed, or back in
                // the cache), so that whoever sees the count sees that.
                self.late_completions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether imports are kept in a relocation cache (and so shared by
    /// the subbatches that name one region), rather than opened and closed
    /// per subbatch.
    pub fn caches(&self) -> bool {
        self.capacity > 0
    }

    /// Stops the progress worker; groups still pending end `Unquiesced`
    /// with their imports retained.
    pub fn stop_progress(&self) {
        let worker = {
            let mut p = self.progress.lock();
            p.stopped = true;
            p.worker.take()
        };
        self.progress_cv.notify_all();
        if let Some(w) = worker {
            let _ = w.join();
        }
    }

    /// Groups waiting for their completion on the worker (those reported
    /// at their deadline included), and whether the worker runs.
    pub fn progress_counts(&self) -> (u64, u64) {
        let p = self.progress.lock();
        ((p.queue.len() + p.in_hand) as u64, p.worker.as_ref().is_some_and(|w| !w.is_finished()) as u64)
    }

    /// Groups reported `Unquiesced` at their deadline whose completion is
    /// still polled.
    pub fn late_groups(&self) -> u64 {
        self.progress.lock().late as u64
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &self,
        key: &Key,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        env: (u64, u64),
        ops: u32,
        local_device: Option<i32>,
        deadline: Instant,
    ) -> Result<(Arc<Import>, bool)> {
        let label = || format!("{} region {}", link.label, region.id);
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        let open = || {
            self.reclaim(deadline);
            self.open(link, region, env, ops, local_device, deadline)
        };
        self.cache.acquire(key, deadline, &label, open, &close, &Import::current)
    }

    /// A writable import of `region` for `local_device` was just opened:
    /// the idle READ-only import of the same key is redundant (the writable
    /// one serves READs too) and gives its mapping budget back. One in use
    /// stays until it is evicted.
    fn give_back_read_only(
        &self,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        local_device: Option<i32>,
        deadline: Instant,
    ) {
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        let redundant = |imp: &Import| {
            Arc::ptr_eq(&imp.link, link)
                && imp.local_device == local_device
                && !imp.writable()
                && imp.offer.region_epoch == region.epoch
                && imp.maps(region.addr)
        };
        self.cache.flush_where(deadline, &close, &redundant, false);
    }

    fn release(&self, key: &Key) {
        self.cache.release(key)
    }

    /// Closes every cached import (waiting for users up to `deadline`)
    /// through the same receipts; new submissions may refill the cache.
    /// Retained entries owing only a receipt get their receipt-only retry.
    /// Returns what stays, one line each: which import, and why.
    pub fn flush(&self, deadline: Instant) -> Vec<String> {
        self.flush_where(deadline, &|_| true)
    }

    /// Flushes the imports granted through `link` (the source asked for
    /// them back: it is closing). Returns what stays, as `flush` does.
    pub fn flush_link(&self, link: &Arc<IpcLink>, deadline: Instant) -> Vec<String> {
        self.flush_where(deadline, &|imp| Arc::ptr_eq(&imp.link, link))
    }

    fn flush_where(&self, deadline: Instant, pick: &dyn Fn(&Import) -> bool) -> Vec<String> {
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        let mut left: Vec<String> = self
            .cache
            .flush_where(deadline, &close, pick, true)
            .into_iter()
            .map(|(k, why)| format!("{} region {}: {why}", k.0, k.2))
            .collect();
        // Uncached imports that owe only their receipt get one more try.
        let mut r = self.retained.lock();
        let mut kept = Vec::new();
        for ent in r.drain(..) {
            if !pick(&ent.import) {
                kept.push(ent);
                continue;
            }
            if !ent.native_closed {
                left.push(format!("{}: its native close or completion was not confirmed", ent.import.describe()));
                kept.push(ent);
                continue;
            }
            match self.close_import(&ent.import, true, deadline) {
                Ok(()) => {}
                Err((e, _)) => {
                    left.push(format!(
                        "{}: its close receipt could not be confirmed ({})",
                        ent.import.describe(),
                        e.message()
                    ));
                    kept.push(ent);
                }
            }
        }
        *r = kept;
        left
    }

    /// Counts for stats.
    pub fn counts(&self) -> ImportCounts {
        let mut n = ImportCounts {
            opened: self.opened.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            ..ImportCounts::default()
        };
        for (_, _, st, v) in self.cache.entries() {
            match (st, v) {
                (EntryState::Ready, Some(_)) => n.cached += 1,
                (EntryState::Retained, Some(_)) => n.retained += 1,
                _ => {}
            }
        }
        n.retained += self.retained.lock().len() as u64;
        n.charged_bytes = self.charges.bytes();
        n.released_after_exit = self.released_after_exit.load(Ordering::Relaxed);
        n.fast_groups = self.fast_groups.load(Ordering::Relaxed);
        n.round_trip_groups = self.round_trip_groups.load(Ordering::Relaxed);
        n.late_completions = self.late_completions.load(Ordering::Relaxed);
        n.late_groups = self.late_groups();
        n.fenced_local = self.fenced.lock().len() as u64;
        n
    }
}

impl IpcRequester {
    /// Remote region ids with a cached import, least recently used first.
    pub fn cached_regions(&self) -> Vec<u64> {
        let mut v: Vec<(u64, u64)> = self
            .cache
            .entries()
            .into_iter()
            .filter(|e| e.2 == EntryState::Ready)
            .map(|(k, last, _, _)| (last, k.2))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, r)| r).collect()
    }
}

/// Fences every local pinned host allocation the group
/// copies to or from (in address order, so groups never wait on each other
/// in a cycle), waiting within the deadline while another group holds one.
fn fence_local_pinned(items: &[(usize, Request)], deadline: Instant) -> Result<Vec<owners::Fence>> {
    // One owner lookup per run of requests inside one allocation (or one
    // stretch of memory the library does not own), not one per request.
    let mut bases: Vec<u64> = Vec::new();
    let mut last: Option<(u64, u64)> = None;
    for (_, r) in items {
        if last.is_some_and(|(lo, hi)| r.local_addr >= lo && r.local_addr < hi) {
            continue;
        }
        match owners::owner_of(r.local_addr) {
            Some(o) => {
                last = Some((o.base, o.base + o.len));
                if o.kind == MemoryKind::PinnedHost {
                    bases.push(o.base);
                }
            }
            None => last = None,
        }
    }
    bases.sort_unstable();
    bases.dedup();
    bases
        .into_iter()
        .map(|b| {
            owners::fence(b, deadline).map_err(|e| {
                Error::Unavailable(format!("local pinned allocation 0x{b:x} is held by another group: {}", e.message()))
            })
        })
        .collect()
}

fn fail_all(out: &mut [ChunkOutcome], items: &[(usize, Request)], e: &Error) {
    for (o, (_, r)) in out.iter_mut().zip(items) {
        let effect = if r.op == Op::Write { RemoteEffect::Unknown } else { RemoteEffect::None };
        *o = ChunkOutcome::failed(e.clone(), effect);
    }
}
