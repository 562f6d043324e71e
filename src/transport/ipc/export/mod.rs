//! Source side of the IPC protocol: the table of exports. An export is
//! created only after validation (epoch, bounds, permission, memory kind,
//! requester identity), holds the region's registration, a hold on the
//! whole allocation (so that it is never freed while mapped) and a share of
//! the allocation's physical-extent charge (charged once however many
//! exports of it are open), and is released only by a close receipt (or
//! proof that the importing process has exited, which a watch on the
//! process notices while the source runs). Exports of one allocation
//! coexist, READ and WRITE alike: nothing waits for another importer. The
//! handle itself is exposed only after the requester answers the offer.

mod ending;

use super::backend::IpcBackend;
use super::board::{self, Board, SlotFree, Words};
use super::messages::{ExportOffer, ExportRef, ExportRequest, Revalidate, OP_READ, OP_WRITE};
use crate::control::identity::{process_start_time, Identity, ProcessIdentity};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::memory::owners::{self, ExportHold};
use crate::memory::{MemoryKind, RegionLease, RegionTable};
use crate::sync::admission::{Budget, Gate, SharedCharge, SharedCharges};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Where an export stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportState {
    /// Validated and retained; the handle is not exposed yet.
    Offered,
    /// The handle was sent; the requester may hold a mapping.
    Exposed,
    /// The requester's channel was lost without a close receipt: nothing
    /// proves the import was closed, so everything stays retained.
    Retained,
}

struct Export {
    /// Calls the backend's `unexport` when an exposed export ends.
    backend: Arc<dyn IpcBackend>,
    token: u64,
    conn: u64,
    base: u64,
    logical: u64,
    region_epoch: u64,
    ops: u32,
    state: ExportState,
    /// When the offer was made (it expires unanswered after `offer_timeout`).
    offered_at: Instant,
    /// Subbatches validated (the grant, then each revalidation) that no
    /// operation-complete receipt has counted yet; several may be in flight
    /// when requester threads share a cached import.
    receipts_due: u64,
    /// The largest envelope validated for this export.
    envelope_max: u64,
    /// The importing process when the kernel verified it (Unix channel);
    /// `None` over a fabric channel: never presumed exited.
    requester: Option<Identity>,
    /// Its slot on the channel's grant board (round trips otherwise).
    slot: Option<SlotHold>,
    /// Its slot is revoked while the region is being unregistered or the
    /// source closes (`suspend`); `resume` publishes it again.
    suspended: bool,
    _lease: RegionLease,
    /// Its share of the allocation's charge (by owner id), which every
    /// export of the allocation shares; let go under the table's lock
    /// ([`Table::remove`]), so that stats never see an export gone and its
    /// charge still held.
    charge: Option<SharedCharge<u64>>,
    _hold: ExportHold,
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

#[derive(Default)]
struct Table {
    exports: HashMap<u64, Export>,
    /// The grant board of each Unix channel.
    boards: HashMap<u64, Arc<ChannelBoard>>,
    /// (id, token) of recently closed exports, so that a receipt retried
    /// after a lost ACK is acknowledged again instead of refused.
    recently_closed: VecDeque<(u64, u64)>,
    /// Releases whose acknowledgement is still being sent: the source's
    /// close waits for them too, so it cannot cut a channel before the ACK.
    acks_pending: usize,
    /// Importing processes watched for their exit (pid, start time).
    watched: HashSet<(u32, u64)>,
}

impl Table {
    /// Takes export `id` out of the table, its share of the charge
    /// returned (the caller drops the rest outside the lock).
    fn remove(&mut self, id: u64) -> Option<Export> {
        let mut e = self.exports.remove(&id)?;
        drop(e.charge.take());
        Some(e)
    }
}

/// Held while a release is acknowledged; see [`ExportTable::ack_guard`].
pub struct AckGuard {
    table: Arc<ExportTable>,
}

impl Drop for AckGuard {
    fn drop(&mut self) {
        self.table.table.lock().acks_pending -= 1;
        self.table.changed.notify_all();
    }
}

/// Snapshot counts for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportCounts {
    /// Exports offered or exposed on a live channel.
    pub open: u64,
    /// Exports retained after a lost channel.
    pub retained: u64,
    /// Physical bytes charged by exports: each exported allocation once.
    pub charged_bytes: u64,
    /// Exports released because their importing process exited, since
    /// the engine started.
    pub reclaimed_after_exit: u64,
    /// Accepted offers answered on a thread of their own after waiting
    /// for the producer stream handed over for the memory.
    pub answered_after_producer_wait: u64,
}

/// Every export of one engine for one backend.
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
    next_id: AtomicU64,
    kinds: Vec<MemoryKind>,
    offer_timeout: Duration,
    /// Exports released because their importer exited.
    reclaimed: AtomicU64,
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

/// Starts watching a process (its identity) for its exit, calling the
/// given function once it exited. `false`: no watch could be set up (the
/// caller falls back on checking at its own ticks).
pub type ExitWatchFn = Box<dyn Fn(ProcessIdentity, Box<dyn Fn() + Send + Sync>) -> bool + Send + Sync>;

/// Whether the process is provably gone: no such pid, the pid was reused,
/// or it is a zombie (its memory, and with it every mapping it held, was
/// released before it became one).
pub fn process_exited(p: &ProcessIdentity) -> bool {
    process_start_time(p.pid) != p.start_time || crate::control::identity::is_zombie(p.pid)
}

impl Drop for Export {
    fn drop(&mut self) {
        if self.state != ExportState::Offered {
            self.backend.unexport(self.base);
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
        log: Arc<crate::log::Logger>,
    ) -> ExportTable {
        ExportTable {
            backend,
            regions,
            charges: SharedCharges::new(budget),
            stats,
            gate,
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            next_id: AtomicU64::new(1),
            kinds,
            offer_timeout,
            reclaimed: AtomicU64::new(0),
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

    fn check_ops(r: &crate::memory::Region, ops: u32) -> Result<()> {
        if ops & OP_READ != 0 && !r.access.can_read() {
            return Err(Error::PermissionDenied(format!(
                "region {} (0x{:x}+{}) does not allow remote READ",
                r.id, r.addr, r.len
            )));
        }
        if ops & OP_WRITE != 0 && !r.access.can_write() {
            return Err(Error::PermissionDenied(format!(
                "region {} (0x{:x}+{}) does not allow remote WRITE",
                r.id, r.addr, r.len
            )));
        }
        Ok(())
    }

    fn validate(&self, region_epoch: u64, addr: u64, len: u64, ops: u32) -> Result<RegionLease> {
        if !self.gate.is_open() {
            return Err(Error::Unavailable("the source is closing and grants no new exports".into()));
        }
        let lease = self.regions.lease(addr, len)?;
        let r = lease.region();
        if r.epoch != region_epoch {
            return Err(Error::StalePeer(format!(
                "region at 0x{:x} was re-registered (epoch {}, the request names epoch {})",
                r.addr, r.epoch, region_epoch
            )));
        }
        Self::check_ops(r, ops)?;
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

    /// Validates an export request and retains the allocation (hold +
    /// the allocation's charge, shared with its other exports +
    /// registration). Never waits: exports of one allocation coexist.
    /// Returns the offer (no handle yet).
    pub fn offer(&self, conn: u64, requester: Option<Identity>, req: &ExportRequest) -> Result<ExportOffer> {
        let lease = self.validate(req.region_epoch, req.addr, req.len, req.ops)?;
        let o = owners::owner_of(req.addr)
            .ok_or_else(|| Error::NotSupported(format!("0x{:x} is not in a library allocation", req.addr)))?;
        let (base, logical, physical) = (o.base, o.len, o.physical);
        if req.addr + req.len > base + logical {
            return Err(Error::OutOfRange(format!("range 0x{:x}+{} leaves its allocation", req.addr, req.len)));
        }
        let charge = self.charge(o.id, physical)?;
        let hold = owners::hold_for_export(base)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // An unpredictable token, or no offer (never a guessable one).
        let token = crate::random::nonzero_u64()?;
        // A slot on the channel's board, the grant published in it.
        let slot = self.table.lock().boards.get(&conn).cloned().and_then(|on| {
            let (index, generation) = on.free.lock().take(&on.board)?;
            board::publish(on.board.slot(index).expect("taken"), generation, req.ops);
            let hold = SlotHold { on, index, stats: self.stats.clone(), transport: self.backend.transport() };
            Some((hold, generation))
        });
        let (slot_index, slot_generation) = slot.as_ref().map_or((super::messages::NO_SLOT, 0), |(h, g)| (h.index, *g));
        let offer = ExportOffer {
            tag: req.tag,
            export_id: id,
            token,
            base,
            physical,
            grant_addr: req.addr,
            grant_len: req.len,
            region_epoch: req.region_epoch,
            ops: req.ops,
            slot: slot_index,
            slot_generation,
        };
        self.table.lock().exports.insert(
            id,
            Export {
                backend: self.backend.clone(),
                token,
                conn,
                base,
                logical,
                region_epoch: req.region_epoch,
                ops: req.ops,
                state: ExportState::Offered,
                offered_at: Instant::now(),
                receipts_due: 1,
                envelope_max: req.len,
                requester,
                slot: slot.map(|(h, _)| h),
                suspended: false,
                _lease: lease,
                charge: Some(charge),
                _hold: hold,
            },
        );
        Ok(offer)
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

    fn with_export<T>(&self, conn: u64, r: &ExportRef, f: impl FnOnce(&mut Export) -> Result<T>) -> Result<T> {
        let mut t = self.table.lock();
        match t.exports.get_mut(&r.export_id) {
            Some(e) if e.token == r.token && e.conn == conn => f(e),
            _ => Err(Error::NotFound(format!("no export {} with that token on this channel", r.export_id))),
        }
    }

    /// The requester's answer. Accept: the handle to send. Decline: the
    /// export is released.
    pub fn answer(&self, conn: u64, r: &ExportRef) -> Result<Option<super::backend::ExportedHandle>> {
        if r.value == 0 {
            self.release(conn, None, r)?;
            return Ok(None);
        }
        // The handle is made under the table lock so that a concurrent close
        // of the channel cannot overtake it; only a made handle counts as
        // exposed (and is later unexported). A handle that cannot be made
        // ends the export: nothing was exposed, so hold and charge go back.
        let mut export_failed = false;
        let made = self.with_export(conn, r, |e| {
            if e.state != ExportState::Offered {
                return Err(Error::Protocol(format!("export {} was already answered", r.export_id)));
            }
            let h = self.backend.export(e.base, e.ops & OP_WRITE != 0).inspect_err(|_| export_failed = true)?;
            e.state = ExportState::Exposed;
            Ok(Some(h))
        });
        if export_failed {
            let _ = self.release(conn, None, r);
        }
        made
    }

    /// Whether accepting offer `r` of channel `conn` would first wait for
    /// a producer stream: the serving I/O thread then leaves the answer to
    /// [`ExportTable::answer_after_wait`] on a thread of its own.
    pub fn answer_waits(&self, conn: u64, r: &ExportRef) -> bool {
        if r.value == 0 {
            return false;
        }
        let base = match self.table.lock().exports.get(&r.export_id) {
            Some(e) if e.token == r.token && e.conn == conn && e.state == ExportState::Offered => e.base,
            _ => return false,
        };
        self.backend.export_waits(base)
    }

    /// [`ExportTable::answer`] for an accepted offer whose producer stream
    /// is waited for first, with no lock held (other channels are served
    /// meanwhile). A failed wait ends the export unexposed.
    pub fn answer_after_wait(&self, conn: u64, r: &ExportRef) -> Result<Option<super::backend::ExportedHandle>> {
        self.answered_after_wait.fetch_add(1, Ordering::Relaxed);
        let base = self.with_export(conn, r, |e| Ok(e.base))?;
        if let Err(e) = self.backend.before_export(base) {
            let _ = self.release(conn, None, r);
            return Err(e.context("the producer stream handed over for this memory"));
        }
        self.answer(conn, r)
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
            t.exports
                .values_mut()
                .filter(|e| region.is_none_or(|id| e._lease.region().id == id) && !e.suspended)
                .filter_map(|e| {
                    let s = e.slot.as_ref()?;
                    e.suspended = true;
                    Some((s.on.clone(), s.index))
                })
                .collect()
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

    /// Publishes again the slots [`ExportTable::suspend`] revoked for region
    /// `region`'s exports (its unregistration timed out), under a new
    /// generation: requesters learn it from their next revalidation.
    pub fn resume(&self, region: u64) {
        let mut t = self.table.lock();
        for e in t.exports.values_mut().filter(|e| e.suspended && e._lease.region().id == region) {
            e.suspended = false;
            if let Some(s) = &e.slot {
                let g = s.on.free.lock().generation();
                board::publish(s.slot(), g, e.ops);
            }
        }
    }

    /// Revalidates a cached export for a new subbatch: every submission is
    /// checked again (admission, epoch, registration, range, permission).
    /// Returns the generation its board slot names the grant by now (0:
    /// no slot, or suspended), so that the requester uses the board again.
    pub fn revalidate(&self, conn: u64, v: &Revalidate) -> Result<u64> {
        let r = ExportRef { export_id: v.export_id, token: v.token, value: 0, extra: 0 };
        let (base, logical, epoch, ops) = self.with_export(conn, &r, |e| {
            if e.state != ExportState::Exposed {
                return Err(Error::Protocol(format!("export {} is not exposed", v.export_id)));
            }
            Ok((e.base, e.logical, e.region_epoch, e.ops))
        })?;
        if v.region_epoch != epoch {
            return Err(Error::StalePeer(format!("export {} was granted for another region epoch", v.export_id)));
        }
        if v.addr < base || v.addr + v.len > base + logical || v.ops & !ops != 0 {
            return Err(Error::OutOfRange(format!(
                "0x{:x}+{} (ops {}) is outside export {} (0x{base:x}+{logical}, ops {ops})",
                v.addr, v.len, v.ops, v.export_id
            )));
        }
        let _lease = self.validate(v.region_epoch, v.addr, v.len, v.ops)?;
        self.with_export(conn, &r, |e| {
            e.receipts_due = e.receipts_due.saturating_add(1);
            e.envelope_max = e.envelope_max.max(v.len);
            let published = e.slot.as_ref().filter(|_| !e.suspended);
            Ok(published.map_or(0, |s| s.slot().generation()))
        })
    }

    /// Operation-complete receipt: counts the subbatch as served. A receipt
    /// may claim only what a subbatch could have moved — `extra` requests
    /// (1 ..= `MAX_REQUESTS`) of `value` bytes, each request at least one
    /// byte and at most the largest validated envelope — or it is a
    /// protocol error; and receipts are counted at most once per validated
    /// subbatch (one repeated after a lost ACK is acknowledged again, not
    /// counted again), so a peer cannot set the served counters.
    pub fn op_complete(&self, conn: u64, r: &ExportRef) -> Result<()> {
        let counted = self.with_export(conn, r, |e| {
            if e.state != ExportState::Exposed {
                return Err(Error::Protocol(format!("operation receipt for unexposed export {}", r.export_id)));
            }
            let (n, bytes, envelope) = (r.extra as u64, r.value, e.envelope_max);
            let bounded = n >= 1
                && n <= crate::transfer::MAX_REQUESTS as u64
                && bytes >= n
                && n.checked_mul(envelope).is_some_and(|most| bytes <= most);
            if !bounded {
                return Err(Error::Protocol(format!(
                    "operation receipt claims {n} requests of {bytes} bytes within an envelope of {envelope} bytes"
                )));
            }
            let due = e.receipts_due > 0;
            e.receipts_due = e.receipts_due.saturating_sub(1);
            Ok(due)
        })?;
        if counted {
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
        self.table.lock().acks_pending += 1;
        AckGuard { table: self.clone() }
    }

    /// Close receipt: the importer unmapped; release hold, charge and
    /// registration. A repeated receipt (after a lost ACK) is acknowledged.
    /// The receipt may come on a later channel of the same (kernel-verified)
    /// requester engine, after the channel the export was granted on was
    /// lost: that is how a requester whose source froze and resumed
    /// releases what it held.
    pub fn close_receipt(&self, conn: u64, requester: Option<Identity>, r: &ExportRef) -> Result<()> {
        {
            let t = self.table.lock();
            if t.recently_closed.contains(&(r.export_id, r.token)) {
                return Ok(());
            }
        }
        self.release(conn, requester, r)
    }

    fn release(&self, conn: u64, requester: Option<Identity>, r: &ExportRef) -> Result<()> {
        let mut t = self.table.lock();
        let same_requester = |e: &Export| requester.is_some() && e.requester == requester;
        match t.exports.get(&r.export_id) {
            Some(e) if e.token == r.token && (e.conn == conn || same_requester(e)) => {}
            _ => return Err(Error::NotFound(format!("no export {} with that token on this channel", r.export_id))),
        }
        let e = t.remove(r.export_id).expect("present");
        t.recently_closed.push_back((r.export_id, r.token));
        if t.recently_closed.len() > 4096 {
            t.recently_closed.pop_front();
        }
        drop(t);
        drop(e);
        self.changed.notify_all();
        Ok(())
    }

    /// Counts for stats.
    pub fn counts(&self) -> ExportCounts {
        let t = self.table.lock();
        let mut c = ExportCounts::default();
        for e in t.exports.values() {
            if e.state == ExportState::Retained {
                c.retained += 1;
            } else {
                c.open += 1;
            }
        }
        c.charged_bytes = self.charges.bytes();
        c.reclaimed_after_exit = self.reclaimed.load(Ordering::Relaxed);
        c.answered_after_producer_wait = self.answered_after_wait.load(Ordering::Relaxed);
        c
    }

    /// Offers made on channel `conn` and not answered yet.
    pub fn unanswered_offers(&self, conn: u64) -> usize {
        self.table.lock().exports.values().filter(|e| e.conn == conn && e.state == ExportState::Offered).count()
    }
}
