//! Source side of the IPC protocol: the table of exports. An export is
//! created only after validation (epoch, bounds, permission, memory kind,
//! requester identity), holds the region's registration, a hold on the
//! whole allocation (so that it is never freed while mapped) and a share of
//! the allocation's physical-extent charge (charged once however many
//! exports of it are open), and is released only by a close receipt (or
//! proof that the importing process has exited, which a watch on the
//! process notices while the source runs), and only once nothing holds
//! the handle it was sent. Each requester is bounded in exports and in
//! the budget it alone keeps charged. Exports of one allocation
//! coexist, READ and WRITE alike: nothing waits for another importer. The
//! handle itself is exposed only after the requester answers the offer.

mod ending;

use super::backend::IpcBackend;
use super::board::{self, Board, SlotFree, Words};
use super::messages::{access_of, ExportOffer, ExportRef, ExportRequest, Revalidate};
use super::proto::exports::{Answering, ExportsCore, Finished, Grant, Limits, Released};
use crate::control::identity::{process_start_time, Identity, ProcessIdentity};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::memory::owners::{self, ExportHold};
use crate::memory::{MemoryKind, RegionLease, RegionTable};
use crate::sync::admission::{Budget, Gate, SharedCharge, SharedCharges};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub use super::proto::exports::ExportState;

/// What an export holds while it lives; the table's core hands it back
/// when the export ends.
struct Held {
    base: u64,
    /// How the backend tells whether the handle sent is still held
    /// anywhere (set once the handle is made).
    mark: Option<u64>,
    /// Its slot on the channel's grant board (round trips otherwise).
    slot: Option<SlotHold>,
    /// Its share of the allocation's charge (by owner id), which every
    /// export of the allocation shares; let go under the table's lock
    /// ([`ExportTable::settle`]), so that stats never see an export gone
    /// and its charge still held.
    charge: Option<SharedCharge<u64>>,
    /// The hold on a library allocation (none for a registration of
    /// memory the library did not allocate: CMA).
    _hold: Option<ExportHold>,
    /// The region's registration, let go last (fields drop in order): an
    /// unregistration woken by it finds the allocation's hold gone, so a
    /// free right after it succeeds.
    lease: RegionLease,
}

/// What one export covers: its base and length (an allocation, or the
/// registration itself), the length an importer may address from the base,
/// and its charge (key and bytes) against the mapping budget.
struct Extent {
    base: u64,
    logical: u64,
    physical: u64,
    charge_key: u64,
    charge_bytes: u64,
    hold: Option<ExportHold>,
}

/// One channel's grant board and its free slots.
pub struct ChannelBoard {
    board: Board,
    free: Mutex<SlotFree>,
}

impl ChannelBoard {
    /// A new board for a channel.
    pub fn create() -> Result<ChannelBoard> {
        Ok(ChannelBoard { board: Board::create()?, free: Mutex::new(SlotFree::default()) })
    }

    /// The board (its fd goes to the requester).
    pub fn board(&self) -> &Board {
        &self.board
    }
}

/// An export's slot: given back, with what the requester counted in it
/// recorded as its claim (apart from what this engine served), when the
/// export ends.
struct SlotHold {
    on: Arc<ChannelBoard>,
    index: u32,
    stats: Arc<Counters>,
    transport: crate::kinds::TransportKind,
}

impl SlotHold {
    fn slot(&self) -> &board::Slot {
        self.on.board.slot(self.index).expect("a slot given out")
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        // No group may enter any more; the export is ending (its receipt
        // came, its importer exited, or its offer expired).
        let next = self.on.free.lock().generation();
        board::revoke(self.slot(), next, || false);
        // What the requester says its fast-path groups moved: a claim,
        // kept apart from what this engine served and checked.
        let (requests, bytes) = self.slot().take_counts();
        if requests > 0 || bytes > 0 {
            self.stats.record_claimed(self.transport, requests, bytes);
        }
        self.on.free.lock().give_back(self.index);
    }
}

/// The table's protocol state and the grant boards of its channels,
/// behind its one lock.
struct Table {
    core: ExportsCore<Held>,
    /// The grant board of each Unix channel.
    boards: HashMap<u64, Arc<ChannelBoard>>,
}

/// Held while a release is acknowledged; see [`ExportTable::ack_guard`].
pub struct AckGuard {
    table: Arc<ExportTable>,
}

impl Drop for AckGuard {
    fn drop(&mut self) {
        self.table.table.lock().core.ack_end();
        self.table.changed.notify_all();
    }
}

/// The source side's counts, as `ipc.<transport>` reports them (each
/// under its serde name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportCounts {
    /// Exports offered or exposed to live requesters.
    #[serde(rename = "exports_open")]
    pub open: u64,
    /// Exports kept without proof that their import was closed: no close
    /// receipt after their channel was lost, or a receipt while their
    /// handle is still open or mapped somewhere (lingering).
    #[serde(rename = "exports_retained")]
    pub retained: u64,
    /// Physical bytes charged by exports: each exported allocation once
    /// (reported with the imports' in `mapping_bytes_charged`).
    #[serde(skip)]
    pub charged_bytes: u64,
    /// Exports released because their import's last holder went (the
    /// importing process exited, every thread, and nothing else held its
    /// handle), since the engine started.
    #[serde(rename = "exports_reclaimed_after_exit")]
    pub reclaimed_after_exit: u64,
    /// Accepted offers answered on a thread of their own after waiting for
    /// the producer stream handed over with `record_producer_stream` (the
    /// I/O thread served other channels meanwhile).
    #[serde(rename = "exports_answered_after_producer_wait")]
    pub answered_after_producer_wait: u64,
}

/// A handle that owns its descriptor: one the backend only lent is
/// duplicated while the export is guaranteed to live.
fn owned(mut h: super::backend::ExportedHandle) -> Result<super::backend::ExportedHandle> {
    if let (None, Some(fd)) = (&h.owned_fd, h.fd) {
        // SAFETY: the backend keeps `fd` open while the export exists; the
        // caller holds the export in its `Exposing` state, which nothing
        // ends, during this call.
        let dup = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| Error::io("duplicate a handle's descriptor", &e))?;
        h.owned_fd = Some(dup);
        h.fd = None;
    }
    Ok(h)
}

/// Every export of one engine for one backend: a driver of
/// [`ExportsCore`] (one lock around it; what ended exports held is let go
/// after releasing it), the backend making handles with no lock held.
pub struct ExportTable {
    backend: Arc<dyn IpcBackend>,
    regions: Arc<RegionTable>,
    /// The exported allocations' charges: each allocation's physical
    /// extent counts once against the mapping budget.
    charges: Arc<SharedCharges<u64>>,
    stats: Arc<Counters>,
    gate: Arc<Gate>,
    table: Mutex<Table>,
    changed: Condvar,
    kinds: Vec<MemoryKind>,
    /// Accepted offers answered off the I/O thread after a producer wait.
    answered_after_wait: AtomicU64,
    /// Watches an importing process for its exit (set by the engine: a
    /// process descriptor served by its I/O threads).
    exit_watch: once_cell::sync::OnceCell<ExitWatchFn>,
    /// Itself, for the exit watches to hold.
    me: once_cell::sync::OnceCell<Weak<ExportTable>>,
    /// The engine's log lines (exports retained and reclaimed).
    log: Arc<crate::log::Logger>,
}

/// What an exit watch calls, with whether its process exited (every
/// thread): `true` when the watch may end (nothing of the process is left
/// to wait for); `false` has it call again later.
pub type OnExit = Box<dyn Fn(bool) -> bool + Send + Sync>;

/// Starts watching a process (its identity), calling the given function
/// as soon as it exited and every so often before and after, until it
/// answers `true`. `false`: no watch could be set up (the caller falls
/// back on checking at its own ticks).
pub type ExitWatchFn = Box<dyn Fn(ProcessIdentity, OnExit) -> bool + Send + Sync>;

/// Whether the process is provably gone: no such pid, the pid was reused,
/// or every thread of it has exited (a zombie waiting to be reaped: its
/// memory, and with it every mapping it held, was released before). A
/// thread-group leader that exited alone (`pthread_exit` in `main`) shows
/// as a zombie while the process's other threads run: that process lives.
pub fn process_exited(p: &ProcessIdentity) -> bool {
    process_start_time(p.pid) != p.start_time || crate::control::identity::all_threads_exited(p.pid)
}

impl Drop for ExportTable {
    fn drop(&mut self) {
        let t = self.table.get_mut();
        for g in t.core.drain() {
            if g.exported {
                self.backend.unexport(g.res.base);
            }
        }
    }
}

impl ExportTable {
    /// A table exporting `kind` memory through `backend`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: Arc<dyn IpcBackend>,
        kinds: Vec<MemoryKind>,
        regions: Arc<RegionTable>,
        budget: Arc<Budget>,
        stats: Arc<Counters>,
        gate: Arc<Gate>,
        offer_timeout: Duration,
        limits: Limits,
        log: Arc<crate::log::Logger>,
    ) -> ExportTable {
        ExportTable {
            backend,
            regions,
            charges: SharedCharges::new(budget),
            stats,
            gate,
            table: Mutex::new(Table { core: ExportsCore::bounded(offer_timeout, limits), boards: HashMap::new() }),
            changed: Condvar::new(),
            kinds,
            answered_after_wait: AtomicU64::new(0),
            exit_watch: once_cell::sync::OnceCell::new(),
            me: once_cell::sync::OnceCell::new(),
            log,
        }
    }

    /// Sets how importing processes are watched for their exit (once).
    pub fn set_exit_watch(self: &Arc<Self>, watch: ExitWatchFn) {
        let _ = self.me.set(Arc::downgrade(self));
        let _ = self.exit_watch.set(watch);
    }

    fn validate(&self, region_epoch: u64, addr: u64, len: u64, ops: u32) -> Result<RegionLease> {
        if !self.gate.is_open() {
            return Err(Error::Unavailable("the source is closing and grants no new exports".into()));
        }
        let lease = self.regions.lease_for_remote(addr, len, region_epoch, access_of(ops))?;
        let r = lease.region();
        if !self.kinds.contains(&r.kind) {
            return Err(Error::NotSupported(format!(
                "region {} holds {} memory; {} exports only {} memory",
                r.id,
                r.kind.name(),
                self.backend.transport().name(),
                self.kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(" or ")
            )));
        }
        Ok(lease)
    }

    /// What an export of `req` covers: the library allocation holding it
    /// (held against a free, its physical extent charged), or, for a
    /// backend that exports registrations (CMA), the leased region itself
    /// (nothing to hold: the memory is the application's; nothing mapped,
    /// nothing charged).
    fn extent(&self, lease: &RegionLease, req: &ExportRequest) -> Result<Extent> {
        if self.backend.exports_registrations() {
            let r = lease.region();
            // Unreachable with the backends built today: CMA, the only one
            // exporting registrations, maps nothing (`maps()` false, and
            // `an_import_copies_through_its_window_into_the_exported_range`
            // tests its window); kept for one that would map them.
            let charge_bytes = if self.backend.maps() { r.len } else { 0 };
            let (base, logical) = (r.addr, r.len);
            return Ok(Extent { base, logical, physical: logical, charge_key: r.id, charge_bytes, hold: None });
        }
        let o = owners::owner_of(req.addr)
            .ok_or_else(|| Error::NotSupported(format!("0x{:x} is not in a library allocation", req.addr)))?;
        let (base, logical, physical) = (o.base, o.len, o.physical);
        // Defence in depth, unreachable by a peer: `validate` leased the
        // request inside its region (`RegionTable::lease`), and no region
        // passes its allocation's logical length (`owners::kind_of`
        // refuses the registration); tests/security.rs
        // `an_export_request_past_its_region_is_refused` tests those two.
        if req.addr + req.len > base + logical {
            return Err(Error::OutOfRange(format!("range 0x{:x}+{} leaves its allocation", req.addr, req.len)));
        }
        let hold = Some(owners::hold_for_export(base)?);
        Ok(Extent { base, logical, physical, charge_key: o.id, charge_bytes: physical, hold })
    }

    /// Validates an export request and retains the allocation (hold +
    /// the allocation's charge, shared with its other exports +
    /// registration). Never waits: exports of one allocation coexist.
    /// Returns the offer (no handle yet).
    pub fn offer(&self, conn: u64, requester: Option<Identity>, req: &ExportRequest) -> Result<ExportOffer> {
        self.backend.usable()?;
        let lease = self.validate(req.region_epoch, req.addr, req.len, req.ops)?;
        let Extent { base, logical, physical, charge_key, charge_bytes, hold } = self.extent(&lease, req)?;
        // An unpredictable token, or no offer (never a guessable one).
        let token = crate::random::nonzero_u64()?;
        let mut t = self.table.lock();
        let mut grant = Grant {
            conn,
            requester,
            token,
            base,
            logical,
            // What its charge counts (nothing for a backend that maps nothing).
            physical: charge_bytes,
            region: lease.region().id,
            region_epoch: req.region_epoch,
            ops: req.ops,
            len: req.len,
            has_slot: false,
        };
        // The requester's bounds, then the charge, under the lock the offer
        // is recorded with: two requests of one requester cannot both pass.
        t.core.admit(&grant)?;
        let charge = self.charge(charge_key, charge_bytes)?;
        // A slot on the channel's board, the grant published in it.
        let slot = t.boards.get(&conn).cloned().and_then(|on| {
            let (index, generation) = on.free.lock().take(&on.board)?;
            board::publish(on.board.slot(index).expect("taken"), generation, req.ops);
            let hold = SlotHold { on, index, stats: self.stats.clone(), transport: self.backend.transport() };
            Some((hold, generation))
        });
        let (slot_index, slot_generation) = slot.as_ref().map_or((super::messages::NO_SLOT, 0), |(h, g)| (h.index, *g));
        grant.has_slot = slot.is_some();
        let held = Held { base, mark: None, slot: slot.map(|(h, _)| h), charge: Some(charge), _hold: hold, lease };
        let export_id = t.core.offer(grant, Instant::now(), held);
        drop(t);
        Ok(ExportOffer {
            tag: req.tag,
            export_id,
            token,
            base,
            physical,
            grant_addr: req.addr,
            grant_len: req.len,
            region_epoch: req.region_epoch,
            ops: req.ops,
            slot: slot_index,
            slot_generation,
        })
    }

    /// A share of allocation `owner`'s charge (`physical` bytes): the one
    /// its open exports share, or a new one against the mapping budget.
    fn charge(&self, owner: u64, physical: u64) -> Result<SharedCharge<u64>> {
        self.charges.try_acquire(owner, physical).ok_or_else(|| {
            let budget = self.charges.budget();
            Error::ResourceExhausted(format!(
                "the source's mapping budget (max_inflight_bytes = {}, {} in use) cannot hold an export of \
                 {physical} physical bytes (the whole allocation, charged once however many requesters import \
                 it); raise max_inflight_bytes on the source above the sum of the allocations it exports",
                budget.limit(),
                budget.used()
            ))
        })
    }

    /// Ends exports the core handed back: their charges go under the
    /// table's lock `t`, then, unlocked, exposed ones are unexported and
    /// the rest of what they held is dropped; waiters are woken.
    fn settle(&self, t: MutexGuard<'_, Table>, mut gone: Vec<Released<Held>>) {
        for g in &mut gone {
            drop(g.res.charge.take());
        }
        drop(t);
        if gone.is_empty() {
            return;
        }
        for g in gone {
            if g.exported {
                self.backend.unexport(g.res.base);
            }
            drop(g);
        }
        self.changed.notify_all();
    }

    /// The requester's answer. Accept: the handle to send, made with no
    /// lock held (its descriptor owned by the handle before the export can
    /// end). Decline: the export is released.
    pub fn answer(&self, conn: u64, r: &ExportRef) -> Result<Option<super::backend::ExportedHandle>> {
        let mut t = self.table.lock();
        let (base, writable) = match t.core.begin_answer(conn, r)? {
            Answering::Declined(g) => {
                self.settle(t, vec![g]);
                return Ok(None);
            }
            Answering::Expose { base, writable } => (base, writable),
        };
        drop(t);
        // While the export is being answered nothing releases it: what the
        // backend lends (its descriptor) stays valid until it is owned.
        let exported = self.backend.export(base, writable);
        let was_exported = exported.is_ok();
        let made = exported.and_then(owned);
        let mut t = self.table.lock();
        match t.core.finish_answer(conn, r, made.is_ok()) {
            Finished::Exposed => {
                // What tells, after its importer's exit, whether the handle
                // is still held, recorded before any reclaim can ask.
                let mark = made.as_ref().ok().and_then(|h| h.mark);
                if let Some(h) = t.core.held_mut(r.export_id) {
                    h.mark = mark;
                }
                made.map(Some)
            }
            ended => {
                if let Finished::Ended(g) = ended {
                    self.settle(t, vec![g]);
                }
                if was_exported {
                    self.backend.unexport(base);
                }
                made?;
                Err(Error::Unavailable(format!("the IPC channel of export {} ended while it was granted", r.export_id)))
            }
        }
    }

    /// The answer carrying export `r`'s handle was dropped before its
    /// first byte left (its channel ended): nobody holds the export, which
    /// ends now instead of staying retained.
    pub fn handle_not_sent(&self, conn: u64, r: &ExportRef) {
        let mut t = self.table.lock();
        let gone = t.core.handle_not_sent(conn, r);
        self.settle(t, gone.into_iter().collect());
    }

    /// Whether accepting offer `r` of channel `conn` would first wait for
    /// a producer stream: the serving I/O thread then leaves the answer to
    /// [`ExportTable::answer_after_wait`] on a thread of its own.
    pub fn answer_waits(&self, conn: u64, r: &ExportRef) -> bool {
        if r.value == 0 {
            return false;
        }
        let base = self.table.lock().core.offered_base(conn, r);
        base.is_some_and(|b| self.backend.export_waits(b))
    }

    /// [`ExportTable::answer`] for an accepted offer whose producer stream
    /// is waited for first, with no lock held (other channels are served
    /// meanwhile). A failed wait ends the export unexposed.
    pub fn answer_after_wait(&self, conn: u64, r: &ExportRef) -> Result<Option<super::backend::ExportedHandle>> {
        self.answered_after_wait.fetch_add(1, Ordering::Relaxed);
        let base = self.table.lock().core.offered_base(conn, r);
        let base = base.ok_or_else(|| Error::NotFound(format!("no offer {} waits on this channel", r.export_id)))?;
        if let Err(e) = self.backend.before_export(base) {
            let mut t = self.table.lock();
            if let Ok(Some(g)) = t.core.close_receipt(conn, None, &ExportRef { value: 0, ..*r }, |_| false) {
                self.settle(t, vec![g]);
            }
            return Err(e.context("the producer stream handed over for this memory"));
        }
        self.answer(conn, r)
    }

    /// Whether the requester process `requester`, running as `uid` (the
    /// kernel's credentials of its Unix channel), may open a channel for
    /// this table's transport ([`IpcBackend::admit`]).
    pub fn admit_requester(&self, uid: u32, requester: &ProcessIdentity) -> Result<()> {
        self.backend.admit(uid, requester)
    }

    /// Channel `conn` gets a grant board: its exports get slots on it.
    pub fn attach_board(&self, conn: u64, on: Arc<ChannelBoard>) {
        self.table.lock().boards.insert(conn, on);
    }

    /// Revokes the board slots of the exports of region `region` (being
    /// unregistered), or of every export (`None`: the source closes): no
    /// new group enters them; then waits, until `deadline`, for the groups
    /// in flight. They stay revoked until [`ExportTable::resume`]. `false`:
    /// a group was still in flight at the deadline.
    pub fn suspend(&self, region: Option<u64>, deadline: Instant) -> bool {
        let holds: Vec<(Arc<ChannelBoard>, u32)> = {
            let mut t = self.table.lock();
            let ids = t.core.suspend(region);
            let slots = ids.iter().filter_map(|id| t.core.held(*id)?.0.slot.as_ref());
            slots.map(|s| (s.on.clone(), s.index)).collect()
        };
        let mut drained = true;
        for (on, index) in holds {
            let next = on.free.lock().generation();
            let pause = || {
                std::thread::sleep(Duration::from_micros(50));
                Instant::now() < deadline
            };
            drained &= board::revoke(on.board.slot(index).expect("taken"), next, pause);
        }
        drained
    }

    /// The exports that hold region `region` registered, one line each:
    /// which export, to which importing process, and where it stands.
    pub fn holding(&self, region: u64) -> Vec<String> {
        let t = self.table.lock();
        let mut out = Vec::new();
        for (id, _, state, process) in t.core.list() {
            if t.core.held(id).is_some_and(|(h, _)| h.lease.region().id == region) {
                let to = process.map_or("an unverified process".to_string(), |p| format!("process {}", p.pid));
                out.push(format!("{} export {id} to {to} ({state:?})", self.backend.transport().name()));
            }
        }
        out
    }

    /// Publishes again the slots [`ExportTable::suspend`] revoked for region
    /// `region`'s exports (its unregistration timed out), under a new
    /// generation: requesters learn it from their next revalidation.
    pub fn resume(&self, region: u64) {
        let mut t = self.table.lock();
        for id in t.core.resume(region) {
            if let Some((Held { slot: Some(s), .. }, ops)) = t.core.held(id) {
                let g = s.on.free.lock().generation();
                board::publish(s.slot(), g, ops);
            }
        }
    }

    /// Revalidates a cached export for a new subbatch: every submission is
    /// checked again (admission, epoch, registration, range, permission).
    /// Returns the generation its board slot names the grant by now (0:
    /// no slot, or suspended), so that the requester uses the board again.
    pub fn revalidate(&self, conn: u64, v: &Revalidate) -> Result<u64> {
        self.table.lock().core.check_revalidate(conn, v)?;
        let _lease = self.validate(v.region_epoch, v.addr, v.len, v.ops)?;
        let mut t = self.table.lock();
        let published = t.core.revalidated(conn, v)?;
        Ok(published.and_then(|h| h.slot.as_ref()).map_or(0, |s| s.slot().generation()))
    }

    /// Operation-complete receipt: counts the subbatch as served, within
    /// what it could have moved and once per validated subbatch (see
    /// [`ExportsCore::op_complete`]), so a peer cannot set the served
    /// counters.
    pub fn op_complete(&self, conn: u64, r: &ExportRef) -> Result<()> {
        if self.table.lock().core.op_complete(conn, r)? {
            self.stats.record_served_n(self.backend.transport(), r.extra as u64, r.value);
        }
        Ok(())
    }

    /// Marks an acknowledgement in progress until the guard drops: take it
    /// before a release that will be acknowledged, drop it once the ACK is
    /// sent. `wait_empty` (the source's close) waits for it, so the release
    /// is visible when the requester hears the ACK, and the close cannot
    /// shut the channel before the ACK leaves.
    pub fn ack_guard(self: &Arc<Self>) -> AckGuard {
        self.table.lock().core.ack_begin();
        AckGuard { table: self.clone() }
    }

    /// Close receipt: the importer unmapped; release hold, charge and
    /// registration. A repeated receipt (after a lost ACK) is acknowledged.
    /// The receipt may come on a later channel of the same (kernel-verified)
    /// requester engine, after the channel the export was granted on was
    /// lost: that is how a requester whose source froze and resumed
    /// releases what it held.
    ///
    /// The receipt is the importer's word: when the backend sees its handle
    /// still open or mapped somewhere (a child it forked), the export
    /// lingers, keeping all it holds but its board slot, until nothing
    /// holds the handle (the importer's watch asks).
    pub fn close_receipt(&self, conn: u64, requester: Option<Identity>, r: &ExportRef) -> Result<()> {
        let mut t = self.table.lock();
        if let Some(g) = t.core.close_receipt(conn, requester, r, |h| !self.let_go(h))? {
            self.settle(t, vec![g]);
            return Ok(());
        }
        let Some(p) = t.core.lingering(r.export_id) else { return Ok(()) };
        let slot = t.core.held_mut(r.export_id).and_then(|h| h.slot.take());
        drop(t);
        drop(slot);
        let what = self.backend.transport().name();
        self.log.warn(format_args!(
            "{what}: export {} lingers: process {} sent its close receipt, but its handle is still open or mapped \
             (a child it forked?); it ends once nothing holds it",
            r.export_id, p.pid
        ));
        self.watch_exit(p);
        Ok(())
    }

    /// Counts for stats.
    pub fn counts(&self) -> ExportCounts {
        let t = self.table.lock();
        let (open, retained) = t.core.counts();
        ExportCounts {
            open,
            retained,
            charged_bytes: self.charges.bytes(),
            reclaimed_after_exit: t.core.reclaimed(),
            answered_after_producer_wait: self.answered_after_wait.load(Ordering::Relaxed),
        }
    }

    /// Offers made on channel `conn` and not answered yet.
    pub fn unanswered_offers(&self, conn: u64) -> usize {
        self.table.lock().core.unanswered(conn)
    }
}
