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
//! [`ExportsCore::finish_answer`] ends it (never exposed to anyone).

use super::super::messages::{ExportRef, Revalidate, OP_WRITE};
use crate::control::identity::{Identity, ProcessIdentity};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

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
}

impl ExportState {
    /// Whether a handle was made for an export in this state (its end
    /// unexports it).
    fn exported(self) -> bool {
        matches!(self, ExportState::Exposed | ExportState::Retained)
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
/// them (tests only; all `false` in the engine).
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
}

/// Every export of one table.
pub struct ExportsCore<R> {
    exports: BTreeMap<u64, Entry<R>>,
    /// (id, token) of recently closed exports.
    recently_closed: VecDeque<(u64, u64)>,
    /// Releases whose acknowledgement is still being sent.
    acks_pending: usize,
    /// Importing processes watched for their exit (pid, start time).
    watched: BTreeSet<(u32, u64)>,
    next_id: u64,
    offer_timeout: Duration,
    /// Exposed exports released because their importer exited.
    reclaimed: u64,
    /// Test-only switches; see [`Mutations`].
    pub mutations: Mutations,
}

fn not_found(id: u64) -> Error {
    Error::NotFound(format!("no export {id} with that token on this channel"))
}

impl<R> ExportsCore<R> {
    /// An empty table whose offers expire unanswered after `offer_timeout`.
    pub fn new(offer_timeout: Duration) -> ExportsCore<R> {
        ExportsCore {
            exports: BTreeMap::new(),
            recently_closed: VecDeque::new(),
            acks_pending: 0,
            watched: BTreeSet::new(),
            next_id: 1,
            offer_timeout,
            reclaimed: 0,
            mutations: Mutations::default(),
        }
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
        id
    }

    fn entry(&mut self, conn: u64, r: &ExportRef) -> Result<&mut Entry<R>> {
        match self.exports.get_mut(&r.export_id) {
            Some(e) if e.grant.token == r.token && e.grant.conn == conn => Ok(e),
            _ => Err(not_found(r.export_id)),
        }
    }

    fn take(&mut self, id: u64) -> Option<Released<R>> {
        let e = self.exports.remove(&id)?;
        Some(Released { exported: e.state.exported(), res: e.res })
    }

    /// The requester's answer to an offer: a decline ends it; an accept
    /// asks the driver to make the handle.
    pub fn begin_answer(&mut self, conn: u64, r: &ExportRef) -> Result<Answering<R>> {
        if r.value == 0 {
            // Its own channel, so never `None`.
            return self
                .release(conn, None, r)
                .and_then(|g| g.ok_or_else(|| not_found(r.export_id)))
                .map(Answering::Declined);
        }
        let e = self.entry(conn, r)?;
        if e.state != ExportState::Offered {
            return Err(Error::Protocol(format!("export {} was already answered", r.export_id)));
        }
        e.state = ExportState::Exposing;
        Ok(Answering::Expose { base: e.grant.base, writable: e.grant.ops & OP_WRITE != 0 })
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

    /// The answer carrying export `r`'s handle was dropped before its
    /// first byte (and the descriptor riding on it) left: nobody can hold
    /// the export, which ends (the driver unexports the handle).
    pub fn handle_not_sent(&mut self, conn: u64, r: &ExportRef) -> Option<Released<R>> {
        if self.mutations.forget_unsent_handles {
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
        let due = e.receipts_due > 0;
        e.receipts_due = e.receipts_due.saturating_sub(1);
        Ok(due)
    }

    /// Close receipt: the importer unmapped. A repeated receipt (after a
    /// lost ACK) is acknowledged (`None`). It may come on a later channel
    /// of the same kernel-verified requester.
    pub fn close_receipt(
        &mut self,
        conn: u64,
        requester: Option<Identity>,
        r: &ExportRef,
    ) -> Result<Option<Released<R>>> {
        if self.recently_closed.contains(&(r.export_id, r.token)) {
            return Ok(None);
        }
        self.release(conn, requester, r)
    }

    /// Ends export `r` for its channel `conn` (or for `requester` on a
    /// later channel of its). `None`: nothing to end now — a grant whose
    /// handle went with its lost channel, released from a later channel
    /// while the handle is still being made, ends unexposed once made.
    fn release(&mut self, conn: u64, requester: Option<Identity>, r: &ExportRef) -> Result<Option<Released<R>>> {
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
            _ => {}
        }
        let gone = self.take(r.export_id).expect("present");
        self.remember(r);
        Ok(Some(gone))
    }

    fn remember(&mut self, r: &ExportRef) {
        self.recently_closed.push_back((r.export_id, r.token));
        if self.recently_closed.len() > RECENTLY_CLOSED {
            self.recently_closed.pop_front();
        }
    }

    fn take_where(&mut self, pick: impl Fn(&Entry<R>) -> bool) -> Vec<Released<R>> {
        let ids: Vec<u64> = self.exports.iter().filter(|(_, e)| pick(e)).map(|(k, _)| *k).collect();
        ids.into_iter().filter_map(|id| self.take(id)).collect()
    }

    /// Ends the offers of channel `conn` unanswered at `now` after the
    /// offer timeout (a late answer finds no export).
    pub fn expire_offers(&mut self, conn: u64, now: Instant) -> Vec<Released<R>> {
        let timeout = self.offer_timeout;
        self.take_where(|e| {
            e.grant.conn == conn
                && e.state == ExportState::Offered
                && now.saturating_duration_since(e.offered_at) >= timeout
        })
    }

    /// The source closes: every offer not answered yet is withdrawn.
    pub fn withdraw_offers(&mut self) -> Vec<Released<R>> {
        self.take_where(|e| e.state == ExportState::Offered)
    }

    /// Channel `conn` was lost. Offers end; an export being answered is
    /// abandoned (ended when its answer finishes); exposed exports stay
    /// retained unless their importer provably exited (`exited`), and the
    /// importing processes not watched yet are returned to be watched.
    pub fn connection_lost(&mut self, conn: u64, exited: impl Fn(&ProcessIdentity) -> bool) -> Lost<R> {
        let mut lost =
            Lost { released: Vec::new(), reclaimed: 0, retained: 0, pids: BTreeSet::new(), watch: Vec::new() };
        let ids: Vec<u64> = self.exports.iter().filter(|(_, e)| e.grant.conn == conn).map(|(k, _)| *k).collect();
        for id in ids {
            let e = self.exports.get_mut(&id).expect("present");
            let gone = e.grant.requester.as_ref().is_some_and(|r| exited(&r.process));
            match e.state {
                ExportState::Exposing if self.mutations.release_exports_being_made => {
                    lost.released.extend(self.take(id))
                }
                ExportState::Exposing => e.state = ExportState::Abandoned,
                ExportState::Abandoned | ExportState::Retained => {}
                ExportState::Offered if self.mutations.keep_offers_of_lost_channels => {}
                ExportState::Offered => lost.released.extend(self.take(id)),
                ExportState::Exposed if gone => {
                    lost.reclaimed += 1;
                    lost.released.extend(self.take(id));
                }
                ExportState::Exposed => {
                    e.state = ExportState::Retained;
                    lost.retained += 1;
                    if let Some(r) = e.grant.requester {
                        lost.pids.insert(r.process.pid);
                        if self.watched.insert((r.process.pid, r.process.start_time)) {
                            lost.watch.push(r.process);
                        }
                    }
                }
            }
        }
        self.reclaimed += lost.reclaimed;
        lost
    }

    /// Process `p` is no longer watched (its watch fired or could not be
    /// set up).
    pub fn unwatch(&mut self, p: &ProcessIdentity) {
        self.watched.remove(&(p.pid, p.start_time));
    }

    /// Ends retained exports whose importing process exited.
    pub fn reclaim_exited(&mut self, exited: impl Fn(&ProcessIdentity) -> bool) -> Vec<Released<R>> {
        let any = self.mutations.reclaim_live_importers;
        let gone = self.take_where(|e| {
            e.state == ExportState::Retained && e.grant.requester.as_ref().is_some_and(|r| any || exited(&r.process))
        });
        self.reclaimed += gone.len() as u64;
        gone
    }

    /// Revokes the board slots of region `region`'s exports (`None`: every
    /// export): returns the ids newly suspended, whose slots the driver
    /// revokes.
    pub fn suspend(&mut self, region: Option<u64>) -> Vec<u64> {
        let again = self.mutations.suspend_again;
        self.exports
            .iter_mut()
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
            .iter_mut()
            .filter(|(_, e)| e.suspended && e.grant.region == region)
            .map(|(id, e)| {
                e.suspended = false;
                *id
            })
            .collect()
    }

    /// What export `id` holds, and its OP bits.
    pub fn held(&self, id: u64) -> Option<(&R, u32)> {
        self.exports.get(&id).map(|e| (&e.res, e.grant.ops))
    }

    /// Where export `id` stands.
    pub fn state(&self, id: u64) -> Option<ExportState> {
        self.exports.get(&id).map(|e| e.state)
    }

    /// Every export: (id, channel, state, importing process).
    pub fn list(&self) -> Vec<(u64, u64, ExportState, Option<ProcessIdentity>)> {
        self.exports.iter().map(|(id, e)| (*id, e.grant.conn, e.state, e.grant.requester.map(|r| r.process))).collect()
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

    /// Ends every export (the table itself goes).
    pub fn drain(&mut self) -> Vec<Released<R>> {
        self.take_where(|_| true)
    }

    /// No export left and no acknowledgement being sent.
    pub fn is_empty(&self) -> bool {
        self.exports.is_empty() && self.acks_pending == 0
    }

    /// Exports left.
    pub fn len(&self) -> usize {
        self.exports.len()
    }

    /// (open, retained) exports: open ones on a live channel.
    pub fn counts(&self) -> (u64, u64) {
        let retained = self.exports.values().filter(|e| e.state == ExportState::Retained).count() as u64;
        (self.exports.len() as u64 - retained, retained)
    }

    /// Exposed exports released because their importer exited, so far.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed
    }

    /// Offers on channel `conn` not answered yet.
    pub fn unanswered(&self, conn: u64) -> usize {
        self.exports.values().filter(|e| e.grant.conn == conn && e.state == ExportState::Offered).count()
    }

    /// Retained exports: (id, allocation base, importing pid).
    pub fn retained(&self) -> Vec<(u64, u64, Option<u32>)> {
        self.exports
            .iter()
            .filter(|(_, e)| e.state == ExportState::Retained)
            .map(|(id, e)| (*id, e.grant.base, e.grant.requester.map(|r| r.process.pid)))
            .collect()
    }
}

#[cfg(test)]
#[path = "exports_tests.rs"]
mod tests;
