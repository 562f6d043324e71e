//! The export table's protocol as a state machine without locks, threads,
//! a clock or a backend: which exports exist, on which channel, in which
//! state, what a receipt may claim, when an offer expires, what a lost
//! channel or an exited importer ends. What an export holds (its region
//! lease, the allocation's hold and charge, its board slot) is the
//! driver's `R`, opaque here: every way an export ends hands `R` back as a
//! [`Released`], with whether a handle was made for it, so that the driver
//! unexports and drops it after releasing its lock.
//!
//! States: `Offered` (validated, nothing exposed) → `Exposing` (accepted;
//! the driver is making the handle with no lock held) → `Exposed` (the
//! handle was made and goes to the requester) → `Retained` (its channel
//! was lost without a close receipt). A channel lost while an export is
//! `Exposing` marks it `Abandoned`: the driver still holds a borrowed view
//! of what it is exporting, so the export keeps its resources until
//! [`ExportsCore::finish_answer`] ends it (never exposed to anyone). A
//! close receipt for a handle that is still open or mapped somewhere (the
//! driver asks its backend) leaves the export `Lingering` until it is not.
//!
//! An importer is proven gone only when its process exited (every thread)
//! *and* nothing still holds the handle it was sent: the driver answers
//! both (`exited`, `let_go`), and the core asks the first once per process.

use super::super::messages::{ExportRef, Revalidate, OP_WRITE};
use super::holders::Holders;
pub use super::holders::{Holder, Limits};
use crate::control::identity::{Identity, ProcessIdentity};
use crate::error::{Error, Result};
use entries::Entries;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

mod ending;
mod readout;

/// How many closed exports are remembered, so that a receipt repeated
/// after a lost ACK is acknowledged again instead of refused.
pub const RECENTLY_CLOSED: usize = 4096;

/// Where an export stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportState {
    /// Validated and retained; the handle is not exposed yet.
    Offered,
    /// Accepted: the driver is making its handle.
    Exposing,
    /// Its channel ended while the handle was being made: ended by
    /// [`ExportsCore::finish_answer`], never exposed.
    Abandoned,
    /// The handle was made; the requester may hold a mapping.
    Exposed,
    /// The requester's channel was lost without a close receipt: nothing
    /// proves the import was closed, so everything stays retained.
    Retained,
    /// Its close receipt came, but the handle it was sent is still open or
    /// mapped somewhere (a child its importer forked, or an importer that
    /// kept it): nothing proves the memory unused, so everything stays
    /// until the handle lets go (its board slot is given back).
    Lingering,
}

impl ExportState {
    /// Whether a handle was made for an export in this state (its end
    /// unexports it).
    fn exported(self) -> bool {
        matches!(self, ExportState::Exposed | ExportState::Retained | ExportState::Lingering)
    }

    /// Kept without proof that its import was closed.
    fn kept(self) -> bool {
        matches!(self, ExportState::Retained | ExportState::Lingering)
    }
}

/// What an offer grants, as validated by the driver.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    /// The channel it is offered on.
    pub conn: u64,
    /// The importing process when the kernel verified it.
    pub requester: Option<Identity>,
    /// The unpredictable token the requester must name it by.
    pub token: u64,
    /// The allocation's base and logical length.
    pub base: u64,
    /// See `base`.
    pub logical: u64,
    /// The allocation's physical extent (what its charge counts).
    pub physical: u64,
    /// The registered region it lies in, and that region's epoch.
    pub region: u64,
    /// See `region`.
    pub region_epoch: u64,
    /// OP_READ | OP_WRITE.
    pub ops: u32,
    /// The envelope validated with the offer.
    pub len: u64,
    /// Whether it has a slot on its channel's grant board.
    pub has_slot: bool,
}

impl Grant {
    /// Whom the export counts against: its verified process, or its channel.
    fn holder(&self) -> Holder {
        match self.requester {
            Some(r) => Holder::Process(r.process.pid, r.process.start_time),
            None => Holder::Channel(self.conn),
        }
    }
}

struct Entry<R> {
    grant: Grant,
    state: ExportState,
    offered_at: Instant,
    /// Subbatches validated (the grant, then each revalidation) that no
    /// operation-complete receipt has counted yet.
    receipts_due: u64,
    /// The largest envelope validated for this export.
    envelope_max: u64,
    /// Its board slot is revoked (`suspend`) until `resume`.
    suspended: bool,
    res: R,
}

/// An export that ended: what it held, and whether a handle was made for
/// it (the driver unexports it).
pub struct Released<R> {
    /// What the export held.
    pub res: R,
    /// A handle was made for it.
    pub exported: bool,
}

/// What [`ExportsCore::begin_answer`] asks of the driver.
pub enum Answering<R> {
    /// A decline: the export ended (acknowledge it).
    Declined(Released<R>),
    /// Make the handle of allocation `base` (writable or not), with no
    /// lock held, then call [`ExportsCore::finish_answer`].
    Expose {
        /// The allocation's base.
        base: u64,
        /// Whether the handle may write.
        writable: bool,
    },
}

/// What [`ExportsCore::finish_answer`] tells the driver.
pub enum Finished<R> {
    /// The handle goes to the requester.
    Exposed,
    /// The export ended (no handle made, or its channel ended meanwhile):
    /// drop what it held, and unexport a handle that was made.
    Ended(Released<R>),
    /// No such export: unexport a handle that was made.
    Gone,
}

/// The account of a lost channel.
pub struct Lost<R> {
    /// Exports ended: offers, and exposed exports whose importer exited.
    pub released: Vec<Released<R>>,
    /// Of those, exposed ones reclaimed because their importer exited.
    pub reclaimed: u64,
    /// Exports kept retained.
    pub retained: usize,
    /// Pids of the processes whose exports are retained.
    pub pids: BTreeSet<u32>,
    /// Processes to watch for their exit (not watched before).
    pub watch: Vec<ProcessIdentity>,
}

/// Bugs of the past, switched back on to show that the simulator finds
/// them (tests only: compiled only for tests and with the `sim`
/// feature).
#[cfg(any(test, feature = "sim"))]
#[derive(Debug, Default, Clone, Copy)]
pub struct Mutations {
    /// A lost channel releases an export whose handle is being made (what
    /// the driver borrows to make it goes under its feet).
    pub release_exports_being_made: bool,
    /// A handle that never left (its answer dropped unsent) leaves its
    /// export exposed to nobody (retained for good over a fabric channel).
    pub forget_unsent_handles: bool,
    /// `suspend` revokes every slot again, suspended or not (the revoke
    /// flood: passes overlap without end).
    pub suspend_again: bool,
    /// A lost channel's unanswered offers keep what they hold (the grant
    /// that waited on after its channel had closed).
    pub keep_offers_of_lost_channels: bool,
    /// A reclaim releases retained exports whose importer still lives (a
    /// silent importer taken for an exited one: the close's timeout
    /// treated as proof that the import was closed).
    pub reclaim_live_importers: bool,
    /// An operation receipt is counted whether or not a validated
    /// subbatch is due one (a requester's receipts, repeated or never
    /// revalidated, inflate what its grant moved).
    pub count_undue_receipts: bool,
}

/// The table's entries by id. Walks over all of them are counted, so that
/// tests hold the table to its promise: a request or a tick looks at its
/// own exports (through the indexes), never at everyone's.
mod entries {
    use super::Entry;
    use std::cell::Cell;
    use std::collections::BTreeMap;

    pub(super) struct Entries<R> {
        map: BTreeMap<u64, Entry<R>>,
        walked: Cell<u64>,
    }

    impl<R> Entries<R> {
        pub(super) fn new() -> Entries<R> {
            Entries { map: BTreeMap::new(), walked: Cell::new(0) }
        }
        pub(super) fn get(&self, id: &u64) -> Option<&Entry<R>> {
            self.map.get(id)
        }
        pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut Entry<R>> {
            self.map.get_mut(id)
        }
        pub(super) fn insert(&mut self, id: u64, e: Entry<R>) {
            self.map.insert(id, e);
        }
        pub(super) fn remove(&mut self, id: &u64) -> Option<Entry<R>> {
            self.map.remove(id)
        }
        pub(super) fn len(&self) -> usize {
            self.map.len()
        }
        /// Every entry, in id order (counted).
        pub(super) fn walk(&self) -> impl Iterator<Item = (&u64, &Entry<R>)> {
            self.map.iter().inspect(|_| self.walked.set(self.walked.get() + 1))
        }
        /// Every entry, mutably, in id order (counted).
        pub(super) fn walk_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Entry<R>)> {
            let walked = &self.walked;
            self.map.iter_mut().inspect(move |_| walked.set(walked.get() + 1))
        }
        pub(super) fn walked(&self) -> u64 {
            self.walked.get()
        }
    }
}

/// Every export of one table, and the indexes that let each request, tick
/// or lost channel reach its own exports in O(1) (or O(log n)) whatever
/// the table holds.
pub struct ExportsCore<R> {
    exports: Entries<R>,
    /// Every export granted on a channel, by channel.
    by_conn: HashMap<u64, BTreeSet<u64>>,
    /// Offers waiting for their answer, by channel, oldest first.
    offers: HashMap<u64, BTreeSet<(Instant, u64)>>,
    /// Exports of each kernel-verified importing process (pid, start time).
    by_process: HashMap<(u32, u64), BTreeSet<u64>>,
    /// Exports in the `Retained` or `Lingering` state.
    retained: usize,
    /// Each requester's count and bytes held alone, bounded.
    holders: Holders,
    /// (id, token) of recently closed exports, oldest first, and the same
    /// as a set.
    recently_closed: VecDeque<(u64, u64)>,
    closed_set: HashSet<(u64, u64)>,
    /// Releases whose acknowledgement is still being sent.
    acks_pending: usize,
    /// Importing processes watched for their exit (pid, start time).
    watched: BTreeSet<(u32, u64)>,
    next_id: u64,
    offer_timeout: Duration,
    /// Exposed exports released because their importer exited.
    reclaimed: u64,
    /// Test-only switches; see [`Mutations`] (compiled only for tests and
    /// with the `sim` feature).
    #[cfg(any(test, feature = "sim"))]
    pub mutations: Mutations,
}

fn not_found(id: u64) -> Error {
    Error::NotFound(format!("no export {id} with that token on this channel"))
}

fn process_key(p: &ProcessIdentity) -> (u32, u64) {
    (p.pid, p.start_time)
}

impl<R> ExportsCore<R> {
    /// An empty table whose offers expire unanswered after `offer_timeout`,
    /// with no bound per requester.
    pub fn new(offer_timeout: Duration) -> ExportsCore<R> {
        ExportsCore::bounded(offer_timeout, Limits::NONE)
    }

    /// An empty table whose requesters are bounded by `limits`.
    pub fn bounded(offer_timeout: Duration, limits: Limits) -> ExportsCore<R> {
        ExportsCore {
            exports: Entries::new(),
            by_conn: HashMap::new(),
            offers: HashMap::new(),
            by_process: HashMap::new(),
            retained: 0,
            holders: Holders::new(limits),
            recently_closed: VecDeque::new(),
            closed_set: HashSet::new(),
            acks_pending: 0,
            watched: BTreeSet::new(),
            next_id: 1,
            offer_timeout,
            reclaimed: 0,
            #[cfg(any(test, feature = "sim"))]
            mutations: Mutations::default(),
        }
    }

    /// Whether `grant`'s requester may take one more export: within its
    /// count, and within its share of the budget when the allocation is
    /// exported to nobody yet (see [`Holders::admit`]). The driver asks
    /// before charging, under the same lock as [`ExportsCore::offer`].
    pub fn admit(&self, grant: &Grant) -> Result<()> {
        self.holders.admit(grant.holder(), grant.base, grant.physical)
    }

    /// Records an offer made at `now`; returns its export id.
    pub fn offer(&mut self, grant: Grant, now: Instant, res: R) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let e = Entry {
            grant,
            state: ExportState::Offered,
            offered_at: now,
            receipts_due: 1,
            envelope_max: grant.len,
            suspended: false,
            res,
        };
        self.exports.insert(id, e);
        self.by_conn.entry(grant.conn).or_default().insert(id);
        self.offers.entry(grant.conn).or_default().insert((now, id));
        if let Some(r) = grant.requester {
            self.by_process.entry(process_key(&r.process)).or_default().insert(id);
        }
        self.holders.add(grant.holder(), grant.base, grant.physical);
        id
    }

    /// Moves export `id` to `state`, keeping the indexes.
    fn set_state(&mut self, id: u64, state: ExportState) {
        let e = self.exports.get_mut(&id).expect("present");
        let (was, conn, at) = (e.state, e.grant.conn, e.offered_at);
        e.state = state;
        if was == ExportState::Offered && state != ExportState::Offered {
            remove_from(&mut self.offers, conn, &(at, id));
        }
        match (was.kept(), state.kept()) {
            (false, true) => self.retained += 1,
            (true, false) => self.retained -= 1,
            _ => {}
        }
    }

    fn entry(&mut self, conn: u64, r: &ExportRef) -> Result<&mut Entry<R>> {
        match self.exports.get_mut(&r.export_id) {
            Some(e) if e.grant.token == r.token && e.grant.conn == conn => Ok(e),
            _ => Err(not_found(r.export_id)),
        }
    }

    fn take(&mut self, id: u64) -> Option<Released<R>> {
        let e = self.exports.remove(&id)?;
        let g = e.grant;
        remove_from(&mut self.by_conn, g.conn, &id);
        if e.state == ExportState::Offered {
            remove_from(&mut self.offers, g.conn, &(e.offered_at, id));
        }
        if e.state.kept() {
            self.retained -= 1;
        }
        if let Some(r) = g.requester {
            remove_from(&mut self.by_process, process_key(&r.process), &id);
        }
        self.holders.remove(g.holder(), g.base);
        Some(Released { exported: e.state.exported(), res: e.res })
    }

    /// The requester's answer to an offer: a decline ends it; an accept
    /// asks the driver to make the handle.
    pub fn begin_answer(&mut self, conn: u64, r: &ExportRef) -> Result<Answering<R>> {
        if r.value == 0 {
            // Its own channel, so never `None`.
            return self
                .release(conn, None, r, |_| false)
                .and_then(|g| g.ok_or_else(|| not_found(r.export_id)))
                .map(Answering::Declined);
        }
        let e = self.entry(conn, r)?;
        if e.state != ExportState::Offered {
            return Err(Error::Protocol(format!("export {} was already answered", r.export_id)));
        }
        let answer = Answering::Expose { base: e.grant.base, writable: e.grant.ops & OP_WRITE != 0 };
        self.set_state(r.export_id, ExportState::Exposing);
        Ok(answer)
    }

    /// The handle of an accepted offer was made (`made`) or could not be.
    /// An export whose channel ended meanwhile ends here.
    pub fn finish_answer(&mut self, conn: u64, r: &ExportRef, made: bool) -> Finished<R> {
        let Ok(e) = self.entry(conn, r) else { return Finished::Gone };
        match e.state {
            ExportState::Exposing if made => {
                e.state = ExportState::Exposed;
                return Finished::Exposed;
            }
            ExportState::Exposing | ExportState::Abandoned => {}
            _ => return Finished::Gone,
        }
        // Never exposed: the driver unexports the handle if one was made.
        let mut gone = self.take(r.export_id).expect("present");
        gone.exported = false;
        self.remember(r);
        Finished::Ended(gone)
    }

    /// What exposed export `id` holds, to record what its handle became
    /// (the driver keeps how to tell whether the handle is still held).
    pub fn held_mut(&mut self, id: u64) -> Option<&mut R> {
        self.exports.get_mut(&id).map(|e| &mut e.res)
    }

    /// The answer carrying export `r`'s handle was dropped before its
    /// first byte (and the descriptor riding on it) left: nobody can hold
    /// the export, which ends (the driver unexports the handle).
    pub fn handle_not_sent(&mut self, conn: u64, r: &ExportRef) -> Option<Released<R>> {
        if mutated!(self.mutations.forget_unsent_handles) {
            return None;
        }
        let e = self.entry(conn, r).ok()?;
        if !matches!(e.state, ExportState::Exposed | ExportState::Retained) {
            return None;
        }
        let gone = self.take(r.export_id);
        self.remember(r);
        gone
    }

    /// The allocation of offer `r` when it waits to be answered (the
    /// driver asks its backend whether making the handle waits first).
    pub fn offered_base(&self, conn: u64, r: &ExportRef) -> Option<u64> {
        match self.exports.get(&r.export_id) {
            Some(e) if e.grant.token == r.token && e.grant.conn == conn && e.state == ExportState::Offered => {
                Some(e.grant.base)
            }
            _ => None,
        }
    }

    /// Checks a revalidation of a cached export against what it was
    /// granted for; the driver then validates the range against the
    /// regions and calls [`ExportsCore::revalidated`].
    pub fn check_revalidate(&mut self, conn: u64, v: &Revalidate) -> Result<()> {
        let r = ExportRef { export_id: v.export_id, token: v.token, value: 0, extra: 0 };
        let e = self.entry(conn, &r)?;
        if e.state != ExportState::Exposed {
            return Err(Error::Protocol(format!("export {} is not exposed", v.export_id)));
        }
        let g = &e.grant;
        if v.region_epoch != g.region_epoch {
            return Err(Error::StalePeer(format!("export {} was granted for another region epoch", v.export_id)));
        }
        // The range clauses are defence in depth, unreachable by a peer:
        // the epoch above names the grant's region, which lies inside the
        // allocation (`owners::kind_of` refuses a region past it), and the
        // driver leases the range inside that region (`RegionTable::lease`).
        // The operations clause is the only check of a WRITE asked on a
        // READ grant of a READ|WRITE region.
        if v.addr < g.base || v.addr + v.len > g.base + g.logical || v.ops & !g.ops != 0 {
            return Err(Error::OutOfRange(format!(
                "0x{:x}+{} (ops {}) is outside export {} (0x{:x}+{}, ops {})",
                v.addr, v.len, v.ops, v.export_id, g.base, g.logical, g.ops
            )));
        }
        Ok(())
    }

    /// A revalidated subbatch is due a receipt. Returns what the export
    /// holds when its board slot is published (the driver reads the slot's
    /// generation from it), `None` when it has no slot or is suspended.
    pub fn revalidated(&mut self, conn: u64, v: &Revalidate) -> Result<Option<&R>> {
        let r = ExportRef { export_id: v.export_id, token: v.token, value: 0, extra: 0 };
        let e = self.entry(conn, &r)?;
        e.receipts_due = e.receipts_due.saturating_add(1);
        e.envelope_max = e.envelope_max.max(v.len);
        let published = e.grant.has_slot && !e.suspended;
        Ok(published.then_some(&e.res))
    }

    /// Operation-complete receipt: `true` when it counts as served. It may
    /// claim only what a subbatch could have moved — `extra` requests
    /// (1 ..= `MAX_REQUESTS`) of `value` bytes, each at least one byte and
    /// at most the largest validated envelope — or it is a protocol error;
    /// it counts at most once per validated subbatch.
    pub fn op_complete(&mut self, conn: u64, r: &ExportRef) -> Result<bool> {
        let undue = mutated!(self.mutations.count_undue_receipts);
        let e = self.entry(conn, r)?;
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
        let due = e.receipts_due > 0 || undue;
        e.receipts_due = e.receipts_due.saturating_sub(1);
        Ok(due)
    }

    /// Close receipt: the importer unmapped. A repeated receipt (after a
    /// lost ACK) is acknowledged (`None`). It may come on a later channel
    /// of the same kernel-verified requester. An export whose handle is
    /// still open or mapped somewhere (`held`) is not released but left
    /// `Lingering` (`None`; see [`ExportsCore::lingering`]).
    pub fn close_receipt(
        &mut self,
        conn: u64,
        requester: Option<Identity>,
        r: &ExportRef,
        held: impl FnOnce(&R) -> bool,
    ) -> Result<Option<Released<R>>> {
        if self.closed_set.contains(&(r.export_id, r.token)) {
            return Ok(None);
        }
        self.release(conn, requester, r, held)
    }

    /// Ends export `r` for its channel `conn` (or for `requester` on a
    /// later channel of its). `None`: nothing to end now — a grant whose
    /// handle went with its lost channel, released from a later channel
    /// while the handle is still being made, ends unexposed once made; an
    /// exposed export whose handle is still `held` lingers.
    fn release(
        &mut self,
        conn: u64,
        requester: Option<Identity>,
        r: &ExportRef,
        held: impl FnOnce(&R) -> bool,
    ) -> Result<Option<Released<R>>> {
        let same_requester = |e: &Entry<R>| requester.is_some() && e.grant.requester == requester;
        let (state, elsewhere) = match self.exports.get(&r.export_id) {
            Some(e) if e.grant.token == r.token && (e.grant.conn == conn || same_requester(e)) => {
                (e.state, e.grant.conn != conn)
            }
            _ => return Err(not_found(r.export_id)),
        };
        match state {
            ExportState::Abandoned if elsewhere => return Ok(None),
            // The source has not seen the first channel's end yet.
            ExportState::Exposing if elsewhere => {
                return Err(Error::Unavailable(format!(
                    "export {} is still being answered on another channel; try again",
                    r.export_id
                )))
            }
            ExportState::Exposing | ExportState::Abandoned => {
                return Err(Error::Protocol(format!("export {} is still being answered", r.export_id)))
            }
            ExportState::Lingering => return Ok(None),
            _ => {}
        }
        let exposed = state.exported();
        if exposed && held(&self.exports.get(&r.export_id).expect("present").res) {
            self.set_state(r.export_id, ExportState::Lingering);
            self.remember(r);
            return Ok(None);
        }
        let gone = self.take(r.export_id).expect("present");
        self.remember(r);
        Ok(Some(gone))
    }

    /// The process to watch for lingering export `id` (so that it ends once
    /// its handle lets go), unless watched already.
    pub fn lingering(&mut self, id: u64) -> Option<ProcessIdentity> {
        let e = self.exports.get(&id).filter(|e| e.state == ExportState::Lingering)?;
        let p = e.grant.requester?.process;
        self.watched.insert(process_key(&p)).then_some(p)
    }

    fn remember(&mut self, r: &ExportRef) {
        if !self.closed_set.insert((r.export_id, r.token)) {
            return;
        }
        self.recently_closed.push_back((r.export_id, r.token));
        if self.recently_closed.len() > RECENTLY_CLOSED {
            let old = self.recently_closed.pop_front().expect("not empty");
            self.closed_set.remove(&old);
        }
    }

    fn take_all(&mut self, ids: Vec<u64>) -> Vec<Released<R>> {
        ids.into_iter().filter_map(|id| self.take(id)).collect()
    }

    /// Revokes the board slots of region `region`'s exports (`None`: every
    /// export): returns the ids newly suspended, whose slots the driver
    /// revokes. Walks the table (an unregistration, the close).
    pub fn suspend(&mut self, region: Option<u64>) -> Vec<u64> {
        let again = mutated!(self.mutations.suspend_again);
        self.exports
            .walk_mut()
            .filter(|(_, e)| region.is_none_or(|id| e.grant.region == id) && e.grant.has_slot)
            .filter(|(_, e)| again || !e.suspended)
            .map(|(id, e)| {
                e.suspended = true;
                *id
            })
            .collect()
    }

    /// Publishes again the slots [`ExportsCore::suspend`] revoked for
    /// region `region`: returns the ids whose slots the driver publishes.
    pub fn resume(&mut self, region: u64) -> Vec<u64> {
        self.exports
            .walk_mut()
            .filter(|(_, e)| e.suspended && e.grant.region == region)
            .map(|(id, e)| {
                e.suspended = false;
                *id
            })
            .collect()
    }

    /// An acknowledgement of a release is being sent: the source's close
    /// waits for it ([`ExportsCore::is_empty`]).
    pub fn ack_begin(&mut self) {
        self.acks_pending += 1;
    }

    /// See [`ExportsCore::ack_begin`].
    pub fn ack_end(&mut self) {
        self.acks_pending -= 1;
    }
}

/// Removes `item` from the set of `key` in `index`, and the set once empty.
fn remove_from<K: std::hash::Hash + Eq, T: Ord>(index: &mut HashMap<K, BTreeSet<T>>, key: K, item: &T) {
    if let Some(s) = index.get_mut(&key) {
        s.remove(item);
        if s.is_empty() {
            index.remove(&key);
        }
    }
}

#[cfg(test)]
#[path = "exports_tests.rs"]
mod tests;
