//! The TCP executor: a submission's TCP part cut into chunks (consecutive
//! requests that continue each other coalesced into one), admitted
//! against the in-flight budget and the gates, and queued on the peer's
//! connection with the records that complete them.

use super::{Chunk, Record, TcpConnection};
use crate::counters::Counters;
use crate::error::Error;
use crate::kinds::TransportKind;
use crate::memory::{owners, MemoryKind};
use crate::sync::admission::{Budget, Gate, GateGuards, Permit};
use crate::transfer::{Assist, BatchShared, RemoteEffect};
use crate::transport::planned::Item;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// What a TCP part runs against: the peer's connection, the engine's
/// budget, gate and counters, and the submission's settings.
pub struct TcpExecutor<'e> {
    /// The peer's control connection (the TCP transport).
    pub conn: &'e Arc<TcpConnection>,
    /// Bytes in flight, all peers together.
    pub budget: &'e Arc<Budget>,
    /// The requester side's gate (a close waits for every chunk).
    pub gate: &'e Arc<Gate>,
    /// Where coalesced requests are counted.
    pub stats: &'e Counters,
    /// The largest chunk.
    pub max_chunk: u64,
    /// Whether requests that continue each other move as one chunk.
    pub coalesce: bool,
    /// The submission's deadline.
    pub deadline: Instant,
}

impl TcpExecutor<'_> {
    /// Splits `items` into chunks, admits them and queues them on the
    /// connection. With `coalesce`, consecutive requests of one direction
    /// whose ranges follow each other on both sides (one local lease, one
    /// remote region, together at most a chunk) move as one chunk: one
    /// frame, one answer (one payload), the outcome given to each of them.
    /// A WRITE run lost midway keeps each request's line between `Unknown`
    /// (some of its bytes left) and `None` (none did): the core says how
    /// much of the payload left ([`BatchShared::complete_run`]). Every item
    /// names a region.
    pub fn run(&self, batch: &Arc<BatchShared>, items: Vec<Item<'_>>) {
        let (max_chunk, deadline, conn) = (self.max_chunk, self.deadline, self.conn);
        // A small batch's waiter reads the answers itself while it spins.
        batch.assisted_by(Arc::downgrade(conn) as Weak<dyn Assist>);
        let units = units(&items, self.coalesce, max_chunk);
        let coalesced = units.iter().map(|u| u.count as u64 - 1).sum::<u64>();
        // Every unit planned at one lock (a fenced one as the one chunk it
        // fails), before any chunk can complete.
        batch.plan_runs(
            units.iter().map(|u| (u.at as usize, u.count, u.chunks(max_chunk).max(u.fenced as u32))),
            TransportKind::Tcp,
        );
        let mut staged: Vec<Chunk> = Vec::with_capacity(units.len());
        let mut failed: Option<Error> = None;
        // What the last admission step took and has not handed out yet.
        let mut admitted: Option<Admitted> = None;
        let fail_unit = |i: usize, n: u32, e: &Error, effect: RemoteEffect| {
            for m in i..i + n as usize {
                batch.fail_request(m, e.clone(), effect);
            }
        };
        for (at, u) in units.iter().enumerate() {
            let c = &items[u.first as usize];
            let (i, r, count) = (c.at(), c.req, u.count);
            if let Some(e) = &failed {
                fail_unit(i, count, e, RemoteEffect::None);
                continue;
            }
            if u.fenced {
                // A GPU group holds (or fenced) the whole local pinned
                // allocation: no CPU access meanwhile.
                let e = Error::Unavailable(format!(
                    "request {i}: the local pinned allocation is held by an NVLink/MNNVL group (or fenced after an \
                     uncertain completion)"
                ));
                batch.fail_request(i, e, RemoteEffect::None);
                continue;
            }
            let region = c.region.expect("resolved");
            for k in 0..u.chunks(max_chunk) as u64 {
                let off = k * max_chunk;
                let piece = (u.len - off).min(max_chunk);
                if admitted.as_ref().is_none_or(|a| a.left == 0) {
                    // One step for as many of the chunks left as the budget
                    // holds now; when not even this one fits, what is staged
                    // goes out and this one waits for room.
                    let rest = units[at..].iter().enumerate().flat_map(|(d, v)| {
                        let skip = if d == 0 { k } else { 0 };
                        v.pieces(max_chunk).skip(skip as usize)
                    });
                    match self.admit(rest, piece, &mut staged) {
                        Ok(a) => admitted = Some(a),
                        Err((e, budget)) => {
                            // A piece of a split request already queued
                            // may have moved its bytes.
                            let uncertain = budget && k > 0;
                            let effect = if uncertain { RemoteEffect::of_uncertain(r.op) } else { RemoteEffect::None };
                            fail_unit(i, count, &e, effect);
                            failed = Some(e);
                            break;
                        }
                    }
                }
                let a = admitted.as_mut().expect("admitted above");
                a.left -= 1;
                let done = Record {
                    batch: batch.clone(),
                    index: i,
                    count,
                    permit: Some(a.permit.split(piece)),
                    guard: a.guards.take(),
                    peer_guard: a.peer_guards.take(),
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
        self.stats.record_coalesced(TransportKind::Tcp, coalesced);
        conn.enqueue(staged);
    }

    /// One admission step: as many of the chunks `rest` (their bytes) as
    /// the budget holds now, with a guard of each gate per chunk; when not
    /// even the first fits, `staged` goes out and the first waits for room
    /// (`piece` bytes) until the deadline. A failure says whether the
    /// budget refused (else a gate).
    fn admit(
        &self,
        rest: impl Iterator<Item = u64> + Clone,
        piece: u64,
        staged: &mut Vec<Chunk>,
    ) -> Result<Admitted, (Error, bool)> {
        let (permit, n) = match self.budget.try_acquire_prefix(rest) {
            Some(x) => x,
            None => {
                self.conn.enqueue(std::mem::take(staged));
                (self.budget.acquire(piece, self.deadline, "submission").map_err(|e| (e, true))?, 1)
            }
        };
        let gates = self.gate.enter_many(n as u64).and_then(|g| Ok((g, self.conn.gate().enter_many(n as u64)?)));
        let (guards, peer_guards) = gates.map_err(|e| (e, false))?;
        Ok(Admitted { permit, guards, peer_guards, left: n })
    }
}

/// Chunks a TCP submission admitted in one step (`Budget::try_acquire_prefix`,
/// `Gate::enter_many`) and has not handed out yet: each chunk takes its
/// share as a permit and two guards of its own, released as it completes.
struct Admitted {
    permit: Permit,
    guards: GateGuards,
    peer_guards: GateGuards,
    left: usize,
}

/// A unit of a TCP submission: a request (`first`: its position among the
/// part's items, which stay where they are: a unit copies none) and those
/// after it that continue it (coalesced: one local lease, one remote
/// region and epoch, ranges that follow each other on both sides, together
/// at most a chunk), or a request refused because its local pinned
/// allocation is fenced.
struct Unit {
    first: u32,
    /// The first request's index in the submission (read without going
    /// back to its item, which is far behind in memory by then).
    at: u32,
    count: u32,
    len: u64,
    fenced: bool,
}

impl Unit {
    /// Chunks it moves in (none when fenced).
    fn chunks(&self, max_chunk: u64) -> u32 {
        if self.fenced {
            0
        } else {
            self.len.div_ceil(max_chunk) as u32
        }
    }

    /// The bytes of each of its chunks, in order.
    fn pieces(&self, max_chunk: u64) -> impl Iterator<Item = u64> + Clone {
        let len = self.len;
        (0..self.chunks(max_chunk) as u64).map(move |k| (len - k * max_chunk).min(max_chunk))
    }
}

/// Groups a TCP part's items into units, in order: with `coalesce`,
/// consecutive requests of one direction whose ranges follow each other on
/// both sides (one local lease, one remote region and epoch, together at
/// most `max_chunk`) join one unit.
fn units(items: &[Item<'_>], coalesce: bool, max_chunk: u64) -> Vec<Unit> {
    let mut units = Vec::with_capacity(items.len());
    let mut next = items.iter().zip(0u32..).peekable();
    while let Some((c, first)) = next.next() {
        let at = c.index;
        let r = c.req;
        let pinned = c.lease.region().kind == MemoryKind::PinnedHost;
        if pinned && owners::fenced(r.local_addr) {
            units.push(Unit { first, at, count: 1, len: r.len, fenced: true });
            continue;
        }
        let region = c.region.expect("resolved");
        let (i, mut count, mut len) = (c.at(), 1u32, r.len);
        while coalesce && len < max_chunk {
            let Some(&(n, _)) = next.peek() else { break };
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
            next.next();
        }
        units.push(Unit { first, at, count, len, fenced: false });
    }
    units
}
