//! The TCP executor: a submission's TCP part cut into chunks (consecutive
//! requests that continue each other coalesced into one), admitted
//! against the in-flight budget and the gates, and queued on the peer's
//! connection with the records that complete them.

use super::chunk::{Chunks, Step};
use super::{Chunk, TcpConnection};
use crate::counters::Counters;
use crate::error::Error;
use crate::kinds::TransportKind;
use crate::memory::{owners, MemoryKind, RegionLease};
use crate::sync::admission::{Budget, Gate};
use crate::transfer::{Assist, BatchShared, Op, RemoteEffect};
use crate::transport::planned::Item;
use std::iter::Peekable;
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
        // Every item is routed on TCP as one chunk already
        // (BatchShared::routed, plan_each): only a request split into
        // several chunks is planned again below, before any of its chunks
        // is queued. The whole part's admission takes the bytes of every
        // item and a chunk per piece of each (coalescing needs fewer: the
        // step gives back what it never hands out).
        let (mut bytes, mut chunks) = (0u64, 0usize);
        for c in &items {
            bytes = bytes.saturating_add(c.req.len);
            chunks += chunks_of(c.req.len, max_chunk) as usize;
        }
        let mut coalesced = 0u64;
        let mut staged = Chunks::due_at(chunks, deadline);
        let mut failed: Option<Error> = None;
        // The whole part's admission, tried first in one step.
        let mut whole = Some((bytes, chunks));
        // What the last admission step took and has not handed out yet.
        let mut step: Option<(Step, usize)> = None;
        let fail_unit = |i: usize, n: u32, e: &Error, effect: RemoteEffect| {
            for m in i..i + n as usize {
                batch.fail_request(m, e.clone(), effect);
            }
        };
        let mut units = Units { next: items.iter().peekable(), coalesce: self.coalesce, max_chunk };
        while let Some(u) = units.next() {
            let (i, count) = (u.at as usize, u.count);
            coalesced += u64::from(count - 1);
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
            let n = u.chunks(max_chunk);
            if n > 1 {
                batch.plan(i, n, TransportKind::Tcp);
            }
            for k in 0..u64::from(n) {
                let off = k * max_chunk;
                let piece = (u.len - off).min(max_chunk);
                if step.as_ref().is_none_or(|s| s.1 == 0) {
                    // One step for as many of the chunks left as the budget
                    // holds now; when not even this one fits, what is staged
                    // goes out and this one waits for room.
                    let rest = u
                        .pieces(max_chunk)
                        .skip(k as usize)
                        .chain(units.clone().flat_map(move |v| v.pieces(max_chunk)));
                    match self.admit(batch, whole.take(), rest, piece, &mut staged) {
                        Ok(s) => step = Some(s),
                        Err((e, budget)) => {
                            // A piece of a split request already queued
                            // may have moved its bytes.
                            let uncertain = budget && k > 0;
                            let effect = if uncertain { RemoteEffect::of_uncertain(u.op) } else { RemoteEffect::None };
                            fail_unit(i, count, &e, effect);
                            failed = Some(e);
                            break;
                        }
                    }
                }
                let (s, left) = step.as_mut().expect("admitted above");
                *left -= 1;
                staged.push(Chunk {
                    op: u.op,
                    local_addr: u.local_addr + off,
                    remote_addr: u.remote_addr + off,
                    len: piece,
                    region_epoch: u.epoch,
                    deadline,
                    done: s.record(i, count, piece),
                    hold: u.lease.clone(),
                });
            }
        }
        self.stats.record_coalesced(TransportKind::Tcp, coalesced);
        conn.enqueue(staged);
    }

    /// One admission step: as many of the chunks `rest` (their bytes) as
    /// the budget holds now, with a unit of each gate per chunk, and how
    /// many (all of them at one lock when `whole`, their bytes and count,
    /// fits); when not even the first fits, `staged` goes out and the first
    /// waits for room (`piece` bytes) until the deadline. A failure says
    /// whether the budget refused (else a gate).
    fn admit(
        &self,
        batch: &Arc<BatchShared>,
        whole: Option<(u64, usize)>,
        rest: impl Iterator<Item = u64> + Clone,
        piece: u64,
        staged: &mut Chunks,
    ) -> Result<(Step, usize), (Error, bool)> {
        let all = whole.and_then(|(bytes, n)| Some((self.budget.try_acquire(bytes)?, n)));
        let (permit, n) = match all.or_else(|| self.budget.try_acquire_prefix(rest)) {
            Some(x) => x,
            None => {
                // What follows is due at the submission's deadline too.
                self.conn.enqueue(std::mem::replace(staged, Chunks::due_at(0, self.deadline)));
                (self.budget.acquire(piece, self.deadline, "submission").map_err(|e| (e, true))?, 1)
            }
        };
        let gates = self.gate.enter_many(n as u64).and_then(|g| Ok((g, self.conn.gate().enter_many(n as u64)?)));
        let (guards, peer_guards) = gates.map_err(|e| (e, false))?;
        Ok((Step::new(batch, permit, guards, peer_guards), n))
    }
}

/// A unit of a TCP submission ([`Units`]): a request and those after it that continue
/// it (coalesced: one local lease, one remote region and epoch, ranges
/// that follow each other on both sides, together at most a chunk), or a
/// request refused because its local pinned allocation is fenced. It
/// carries what its chunks are built from, so that they are built without
/// going back to its first item (far behind in memory by then); it
/// copies no item.
#[derive(Clone, Copy)]
struct Unit<'a> {
    /// The first request's index in the submission.
    at: u32,
    count: u32,
    len: u64,
    op: Op,
    fenced: bool,
    local_addr: u64,
    remote_addr: u64,
    /// The remote region's epoch.
    epoch: u64,
    lease: &'a Arc<RegionLease>,
}

impl Unit<'_> {
    /// Chunks it moves in (none when fenced).
    fn chunks(self, max_chunk: u64) -> u32 {
        if self.fenced {
            0
        } else {
            chunks_of(self.len, max_chunk)
        }
    }

    /// The bytes of each of its chunks, in order.
    fn pieces(self, max_chunk: u64) -> impl Iterator<Item = u64> + Clone {
        let len = self.len;
        (0..self.chunks(max_chunk) as u64).map(move |k| (len - k * max_chunk).min(max_chunk))
    }
}

/// The chunks of at most `max_chunk` bytes that `len` bytes move in (one
/// without a division when they fit one).
fn chunks_of(len: u64, max_chunk: u64) -> u32 {
    if len <= max_chunk {
        1
    } else {
        len.div_ceil(max_chunk) as u32
    }
}

/// A TCP part's items grouped into units, in order: with `coalesce`,
/// consecutive requests of one direction whose ranges follow each other on
/// both sides (one local lease, one remote region and epoch, together at
/// most `max_chunk`) join one unit. A clone goes on from where it was.
#[derive(Clone)]
struct Units<'i, 'a> {
    next: Peekable<std::slice::Iter<'i, Item<'a>>>,
    coalesce: bool,
    max_chunk: u64,
}

impl<'a> Iterator for Units<'_, 'a> {
    type Item = Unit<'a>;

    #[inline]
    fn next(&mut self) -> Option<Unit<'a>> {
        let c = self.next.next()?;
        let r = c.req;
        let pinned = c.lease.region().kind == MemoryKind::PinnedHost;
        let unit = |count, len, fenced, epoch| Unit {
            at: c.index,
            count,
            len,
            op: r.op,
            fenced,
            local_addr: r.local_addr,
            remote_addr: r.remote_addr,
            epoch,
            lease: c.lease,
        };
        if pinned && owners::fenced(r.local_addr) {
            return Some(unit(1, r.len, true, 0));
        }
        let region = c.region.expect("resolved");
        let (i, mut count, mut len) = (c.at(), 1u32, r.len);
        while self.coalesce && len < self.max_chunk {
            let Some(&n) = self.next.peek() else { break };
            // The ranges first: gapped neighbours part there.
            let joins = n.req.local_addr == r.local_addr + len
                && n.req.remote_addr == r.remote_addr + len
                && n.at() == i + count as usize
                && n.req.op == r.op
                && Arc::ptr_eq(n.lease, c.lease)
                && n.region.is_some_and(|g| g.id == region.id && g.epoch == region.epoch)
                && len + n.req.len <= self.max_chunk
                && !(pinned && owners::fenced(n.req.local_addr));
            if !joins {
                break;
            }
            len += n.req.len;
            count += 1;
            self.next.next();
        }
        Some(unit(count, len, false, region.epoch))
    }
}
