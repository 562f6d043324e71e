//! A unit of transfer on the TCP wire ([`Chunk`]: a request, a piece of a
//! split one, or a run of coalesced requests, as the requester core's `Send`)
//! and the completion record the core carries for it until its answer
//! comes ([`Record`]).

use super::proto::requester::{Send, Startable};
use crate::memory::RegionLease;
use crate::sync::admission::{GateGuard, Permit};
use crate::transfer::{BatchShared, ChunkOutcome};
use std::sync::Arc;

/// One unit of transfer on the wire (a request, a piece of a split one,
/// or a run of coalesced requests): what the requester core sends, with the
/// chunk's [`Record`] and the lease that keeps its local region
/// registered.
pub type Chunk = Send<Record, Arc<RegionLease>>;

/// A chunk's completion record, as the core carries it (its lease travels
/// beside it, as the core's hold of the local memory).
pub struct Record {
    /// The batch it completes.
    pub batch: Arc<BatchShared>,
    /// Request index in the batch: the first of `count` consecutive
    /// requests whose ranges follow each other on both sides (coalesced
    /// into this one unit; 1 otherwise).
    pub index: usize,
    /// Requests the unit carries (`index..index + count`); each gets the
    /// unit's outcome (a partly sent WRITE's split by the bytes that left,
    /// [`BatchShared::complete_run`]).
    pub count: u32,
    /// Admission bytes.
    pub permit: Option<Permit>,
    /// Keeps the requester gate open until completion.
    pub guard: Option<GateGuard>,
    /// Keeps this connection's gate open until completion (disconnect waits).
    pub peer_guard: Option<GateGuard>,
}

impl Startable for Record {
    fn start(&self) -> bool {
        self.batch.start_run(self.index, self.count as usize)
    }
}

impl Record {
    /// Releases what the chunk holds (admission bytes, gate; its lease went
    /// already), then records its outcome: a waiter woken by the batch sees
    /// every resource of the chunk released.
    pub(super) fn finish(self, out: ChunkOutcome) {
        let Record { batch, index, count, permit, guard, peer_guard } = self;
        drop(permit);
        drop(guard);
        match count {
            1 => batch.complete_chunk(index, out),
            n => batch.complete_run(index, n as usize, out),
        }
        drop(peer_guard);
    }
}
