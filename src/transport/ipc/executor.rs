//! The IPC executor: an IPC part's groups run in order on the caller
//! (setup, copies and receipts), a large independent last group in
//! windows, the last (or any, for independent requests) completing on the
//! progress worker; a group refused for room waits for the submission's
//! own groups in flight or retries as one request; what was never posted
//! is handed back for TCP when the caller allows it.

use super::groups::{group, windowed, windows, Group, Grouped};
use super::link::IpcLink;
use super::requester::{take_group_items, Finished, GroupError, GroupLocal, GroupRun, IpcRequester, OnDone};
use crate::error::{Error, Status};
use crate::kinds::TransportKind;
use crate::memory::RegionLease;
use crate::sync::admission::{Gate, GateGuard, SubbatchAdmission};
use crate::transfer::{BatchShared, ChunkOutcome, RemoteEffect};
use crate::transport::coalesce::LocalSpans;
use crate::transport::planned::Item;
use std::sync::Arc;
use std::time::Instant;

/// What an IPC part runs against.
pub struct IpcExecutor<'e> {
    /// The transport.
    pub kind: TransportKind,
    /// The link to the peer over it.
    pub link: &'e Arc<IpcLink>,
    /// Its requester side.
    pub requester: &'e Arc<IpcRequester>,
    /// The engine's requester gate (a close waits for every group).
    pub gate: &'e Arc<Gate>,
    /// The submission's deadline.
    pub deadline: Instant,
    /// Requests never posted may move to TCP (AUTO chose the transport
    /// and TCP carries them all).
    pub fall_through: bool,
}

/// The local leases of a submission: all of them (each group completed on
/// the progress worker holds them all: one reference count per group, not
/// one per region a group touches, so none is free before the
/// submission's last such group has ended).
pub struct Leases<'a> {
    /// Every lease of the submission.
    pub all: &'a Arc<Vec<Arc<RegionLease>>>,
}

impl Leases<'_> {
    /// The local regions of `requests` of them: every group's coalesced
    /// copies stay inside one of them. None for a single request, which
    /// has nothing to coalesce.
    fn spans(&self, requests: usize) -> LocalSpans {
        if requests < 2 {
            return LocalSpans::none();
        }
        LocalSpans::new(self.all.iter().map(|l| (l.region().addr, l.region().addr + l.region().len)).collect())
    }
}

/// Requests nothing was posted for, handed back for TCP, and why.
pub struct Unposted<'a> {
    /// The requests, in order.
    pub items: Vec<Item<'a>>,
    /// The refusal that left them unposted.
    pub error: Error,
}

/// Fails requests nothing was posted for (by index), each with `e` (no
/// remote effect).
pub fn fail_unposted(batch: &BatchShared, indices: impl Iterator<Item = usize>, e: &Error) {
    batch.complete_chunks(indices.map(|i| (i, ChunkOutcome::failed(e.clone(), RemoteEffect::None))));
}

impl IpcExecutor<'_> {
    /// Runs the groups of `items` (each naming a region) in order.
    /// `source_left` is called when the source process is found gone.
    /// Returns the requests that may fall through to TCP (every one left,
    /// in order) with the refusal, when the executor allows it.
    pub fn run<'a>(
        &self,
        batch: &Arc<BatchShared>,
        items: Vec<Item<'a>>,
        leases: &Leases<'a>,
        source_left: &dyn Fn(&Error),
    ) -> Option<Unposted<'a>> {
        let spans = leases.spans(items.len());
        let mut grouped = group(items);
        let unposted = self.run_groups(batch, &mut grouped, leases, &spans, source_left);
        grouped.give_back();
        unposted
    }

    /// Runs the groups of `grouped` (see [`IpcExecutor::run`]); each
    /// group's or window's requests are copied out of the part's items
    /// only when it is handed to the transport.
    fn run_groups<'a>(
        &self,
        batch: &Arc<BatchShared>,
        grouped: &mut Grouped<'a>,
        leases: &Leases<'a>,
        spans: &LocalSpans,
        source_left: &dyn Fn(&Error),
    ) -> Option<Unposted<'a>> {
        let (kind, link, deadline) = (self.kind, self.link, self.deadline);
        let (mut groups, any_order) = (std::mem::take(&mut grouped.groups), grouped.any_order);
        let items = &grouped.items;
        // Counted only once a group defers (a one-group batch that ends
        // here allocates nothing for it).
        let mut in_flight: Option<Arc<InFlight>> = None;
        // Each subbatch runs inside the requester gate (entered for its own
        // completion) and, with more to follow, the submission stays
        // entered to its last: close_requester waits, so its flush of the
        // relocation cache never falls before a subbatch (which would open
        // an import after the flush and leave it cached, its export
        // retained). A close begun before then fails the rest.
        let mut admission = SubbatchAdmission::new(self.gate);
        while let Some(mut g) = groups.pop_front() {
            // A large independent last group moves in windows.
            let part = &items[g.range()];
            if groups.is_empty()
                && g.window.is_none()
                && !g.retried
                && windowed(kind, self.requester.caches(), &g, part, any_order)
            {
                let (cuts, ops) = windows(kind, part.iter().map(|c| &c.req));
                let at = g.from;
                groups
                    .extend(cuts.into_iter().map(|w| Group { window: Some(ops), ..g.over(at + w.start..at + w.end) }));
                continue;
            }
            let mut entry = match admission.admit(!groups.is_empty()) {
                Ok(entry) => entry,
                Err(e) => {
                    let unposted = std::iter::once(g).chain(groups).flat_map(|g| &items[g.range()]);
                    fail_unposted(batch, unposted.map(Item::at), &e);
                    return None;
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
                deferred_completion(batch, leases.all, counted, entry)
            });
            let local = GroupLocal {
                device: g.device,
                pinned: g.pinned,
                group_ops: window.unwrap_or(0),
                spans: spans.clone(),
                independent: any_order || window.is_some(),
            };
            // The transport takes the group's requests (by index in the
            // submission); a refusal hands them back, and the group still
            // names them in the part's items.
            let mut requests = take_group_items(part.len());
            requests.extend(part.iter().map(|c| (c.at(), c.req)));
            let run = self.requester.run_group(link, g.region, requests, local, deadline, defer);
            // Not deferred: the group leaves the gate now, as its unbuilt
            // completion would have.
            drop(entry);
            match run {
                Ok(GroupRun::Done(finished)) => finished.complete(batch),
                Ok(GroupRun::Deferred) => {}
                Err(GroupError::NotPosted(e, _)) => {
                    if link.source_left() {
                        // The source process exited (or its engine is gone):
                        // the peer is gone, as TCP would report it.
                        source_left(&e);
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
                        if g.len() > 1 {
                            groups.push_front(g.over(g.from + 1..g.to));
                        }
                        g = g.over(g.from..g.from + 1);
                        g.retried = true;
                        groups.push_front(g);
                        continue;
                    }
                    if self.fall_through && may_fall_through(&e) {
                        let rest = std::iter::once(g).chain(groups).flat_map(|g| &items[g.range()]);
                        return Some(Unposted { items: rest.copied().collect(), error: e });
                    }
                    fail_unposted(batch, part.iter().map(Item::at), &e);
                }
            }
        }
        None
    }
}

/// The completion of a group finished by the progress worker: records the
/// outcomes, and until then keeps the local regions leased and the
/// requester side open (close_requester waits for it).
fn deferred_completion(
    batch: &Arc<BatchShared>,
    held: &Arc<Vec<Arc<RegionLease>>>,
    counted: InFlightGuard,
    guard: GateGuard,
) -> OnDone {
    let batch = batch.clone();
    let held = held.clone();
    Box::new(move |finished: Finished| {
        // Its hold on the local regions ends before the batch says so (the
        // last group's frees them); the requester side stays open until it
        // has (close_requester then returns only with every batch it
        // waited for complete).
        drop(held);
        finished.complete(&batch);
        drop(guard);
        // Its import is back in the cache (idle) by now.
        drop(counted);
    })
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
pub fn may_fall_through(e: &Error) -> bool {
    matches!(e.status(), Status::Unavailable | Status::ResourceExhausted | Status::NotSupported)
}

#[cfg(test)]
mod tests {
    use super::*;

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
