//! A unit of transfer on the TCP wire ([`Chunk`]: a request, a piece of a
//! split one, or a run of coalesced requests, as the requester core's `Send`)
//! and the completion record the core carries for it until its answer
//! comes ([`Record`]), handed out by the admission step that admitted it
//! ([`Step`]).

use super::proto::requester::{Send, Sends, Startable};
use crate::memory::RegionLease;
use crate::sync::admission::{Budget, Gate, GateGuards, Permit};
use crate::transfer::{BatchShared, ChunkOutcome};
use std::sync::Arc;

/// One unit of transfer on the wire (a request, a piece of a split one,
/// or a run of coalesced requests): what the requester core sends, with the
/// chunk's [`Record`] and the lease that keeps its local region
/// registered.
pub type Chunk = Send<Record, Arc<RegionLease>>;

/// A submission's chunks as they are queued, with their earliest deadline.
pub type Chunks = Sends<Record, Arc<RegionLease>>;

/// What the chunks of one admission step share (one allocation per step,
/// one reference count per chunk): the batch they complete and where each
/// gives back its share of the step's admission.
struct Shared {
    batch: Arc<BatchShared>,
    budget: Arc<Budget>,
    gate: Arc<Gate>,
    peer_gate: Arc<Gate>,
}

/// The admission a submission took in one step for `n` chunks (bytes of the
/// budget, a unit of the requester gate and of the connection's gate per
/// chunk), handed out a chunk at a time as [`Record`]s; what is never
/// handed out goes back when it drops.
pub struct Step {
    shared: Arc<Shared>,
    permit: Permit,
    guards: GateGuards,
    peer_guards: GateGuards,
}

impl Step {
    /// The step of `permit` and one unit of `guards` (the requester gate's)
    /// and of `peer_guards` (the connection's) per chunk, for `batch`.
    pub fn new(batch: &Arc<BatchShared>, permit: Permit, guards: GateGuards, peer_guards: GateGuards) -> Step {
        let shared = Arc::new(Shared {
            batch: batch.clone(),
            budget: permit.budget().clone(),
            gate: guards.gate().clone(),
            peer_gate: peer_guards.gate().clone(),
        });
        Step { shared, permit, guards, peer_guards }
    }

    /// The record of the chunk carrying requests `index..index + count`,
    /// holding `bytes` of the step's permit and a unit of each gate until
    /// it completes (or drops). Panics when the step has no chunk left or
    /// fewer bytes.
    pub fn record(&mut self, index: usize, count: u32, bytes: u64) -> Record {
        self.permit.detach(bytes);
        let units = self.guards.detach() && self.peer_guards.detach();
        assert!(units, "an admission step handed out more chunks than it admitted");
        Record { shared: self.shared.clone(), index, count, bytes, released: false }
    }
}

/// A chunk's completion record, as the core carries it (its lease travels
/// beside it, as the core's hold of the local memory): the requests it
/// completes and its share of its step's admission, given back as it
/// completes (or drops).
pub struct Record {
    shared: Arc<Shared>,
    /// Request index in the batch: the first of `count` consecutive
    /// requests whose ranges follow each other on both sides (coalesced
    /// into this one unit; 1 otherwise).
    index: usize,
    /// Requests the unit carries (`index..index + count`); each gets the
    /// unit's outcome (a partly sent WRITE's split by the bytes that left,
    /// [`BatchShared::complete_run`]).
    count: u32,
    /// Admission bytes.
    bytes: u64,
    /// The bytes and the requester gate's unit were given back (the
    /// connection's unit goes when the record drops).
    released: bool,
}

impl Startable for Record {
    fn start(&self) -> bool {
        self.shared.batch.start_run(self.index, self.count as usize)
    }
}

impl Record {
    /// Releases the admission bytes and the requester gate's unit (its
    /// lease went already), then records its outcome, then leaves the
    /// connection's gate: a waiter woken by the batch sees every resource
    /// of the chunk but the last released, and a disconnect waiting on
    /// that gate sees the outcome recorded.
    pub(super) fn finish(mut self, out: ChunkOutcome) {
        self.release();
        let s = &self.shared;
        match self.count {
            1 => s.batch.complete_chunk(self.index, out),
            n => s.batch.complete_run(self.index, n as usize, out),
        }
        // Dropping it leaves the connection's gate.
    }

    fn release(&mut self) {
        if !std::mem::replace(&mut self.released, true) {
            self.shared.budget.give_back(self.bytes);
            self.shared.gate.leave_one();
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.release();
        self.shared.peer_gate.leave_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::Counters;
    use crate::error::Status;
    use crate::kinds::TransportKind;
    use crate::transfer::{Op, Request};
    use std::time::{Duration, Instant};

    /// Guards the give-backs of `Record::finish`, `Drop for Record` and a
    /// step's own drop: a chunk's bytes and units leave as it completes or
    /// drops, unhanded ones as the step drops, and nothing twice.
    #[test]
    fn a_step_gives_back_each_chunks_share_as_it_completes_or_drops() {
        let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x9000, len: 100 };
        let batch =
            BatchShared::new(&[req; 3], Arc::new(Counters::default()), Instant::now() + Duration::from_secs(60));
        batch.plan_each(0..3, 1, TransportKind::Tcp);
        let budget = Budget::new(1 << 20);
        let (gate, peer) = (Gate::new("requester gate"), Gate::new("connection gate"));
        let (permit, n) = budget.try_acquire_prefix([100u64, 200, 300].into_iter()).unwrap();
        assert_eq!(n, 3);
        let mut step = Step::new(&batch, permit, gate.enter_many(3).unwrap(), peer.enter_many(3).unwrap());
        let (a, b) = (step.record(0, 1, 100), step.record(1, 1, 200));
        let held = || (budget.used(), gate.active(), peer.active());
        assert_eq!(held(), (600, 3, 3));
        a.finish(ChunkOutcome::ok(Op::Read));
        assert_eq!(held(), (500, 2, 2));
        assert_eq!(batch.result(0).map(|r| r.status), Some(Status::Ok));
        drop(b);
        assert_eq!(held(), (300, 1, 1));
        drop(step);
        assert_eq!(held(), (0, 0, 0));
    }
}
