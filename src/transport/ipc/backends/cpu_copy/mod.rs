//! CPU copies of the SHM and CMA backends, on every core: a group of
//! independent copies large enough to be worth it is cut into pieces
//! that any copier claims, one at a time, from a small process-wide pool
//! of copy threads and the caller. [`copy`]: the caller claims pieces too
//! and returns when every piece is done; [`start`]: the pool copies them
//! and the caller goes on (the submission returns at admission), learning
//! the end from the returned [`Pending`]. Dependent groups (and small
//! ones) run in input order on the caller. [`copy_with`] moves the pieces
//! with a [`Mover`] of the caller's instead of memcpy (CMA: the kernel's
//! cross-memory calls), the first failure failing the group.
//!
//! `pool.rs` the threads and the groups they copy, `pieces.rs` how a group
//! is cut, `kernel.rs` the copies themselves, `policy.rs` the thresholds
//! and decisions.

mod kernel;
mod pieces;
mod policy;
mod pool;
#[cfg(test)]
mod tests;

use crate::error::Result;
use crate::transport::ipc::backend::{CopyOp, CopyPlan};
use kernel::run;
pub use kernel::Mover;
use pieces::guided;
use policy::{
    from_memory, helpers, piece_count, streams, worth_helpers, MOVER_MIN_BYTES, MOVER_MIN_PIECE, PIECE_BYTES,
};
pub use policy::{ASYNC_MIN_BYTES, PARALLEL_MIN_BYTES, STREAM_MIN_BYTES};
#[cfg(test)]
pub(crate) use pool::start_unattended;
pub use pool::{assist, start, Pending};
use pool::{pool, Job, Worker};
use std::sync::Arc;

/// Performs a group's copies: in input order on the caller when `plan` is
/// ordered or the group is small; otherwise on the caller and idle threads
/// of the copy pool at once, one copier per core (a busy thread would reach
/// this group only after the groups started before), when the group is slow
/// enough to be worth their wake-up ([`HELP_MIN_REST`], timed on the first
/// piece, which the caller copies alone). The caller claims pieces from the
/// start, so a helper that wakes late costs at most the piece it is
/// copying. Returns when every copy is done.
pub fn copy(ops: &[CopyOp], plan: CopyPlan) {
    let total: u64 = ops.iter().map(|o| o.len).sum();
    // A small group goes straight to the kernel: the pool is not asked.
    if !pooled_bytes(total, plan, PARALLEL_MIN_BYTES) {
        return run(ops, false);
    }
    let pool = pool();
    let stream = streams(total);
    let idle: Vec<&Worker> = pool.workers.iter().filter(|w| w.idle()).take(helpers(pool.workers.len())).collect();
    if idle.is_empty() {
        return run(ops, stream);
    }
    // The caller copies the first piece straight from `ops`, timed: a
    // group fast enough for it alone (cache-resident data) then costs no
    // pieces, no job and no wake-up.
    let first = std::time::Instant::now();
    let rest = copy_prefix(ops, PIECE_BYTES, stream);
    let took = first.elapsed();
    // The prefix copied PIECE_BYTES (a pooled group is larger).
    let rest_bytes = total.saturating_sub(PIECE_BYTES);
    let helpers = if worth_helpers(took, rest_bytes.div_ceil(PIECE_BYTES) as u32) { &idle[..] } else { &[] };
    copy_rest(&rest, rest_bytes, helpers, stream || from_memory(took))
}

/// [`copy`] with `mover` moving the bytes: a group of at least
/// [`MOVER_MIN_BYTES`] independent copies cut [`guided`] for the caller
/// and the idle pool threads, who claim its pieces from the largest; else
/// on the caller, in input order. No streaming stores (the mover decides
/// how bytes land). Returns when every piece is done: the first failure,
/// if any.
pub fn copy_with(mover: &Arc<dyn Mover>, ops: &[CopyOp], plan: CopyPlan) -> Result<()> {
    let total: u64 = ops.iter().map(|o| o.len).sum();
    if !pooled_bytes(total, plan, MOVER_MIN_BYTES) {
        return mover.run(ops);
    }
    let pool = pool();
    let idle: Vec<&Worker> = pool.workers.iter().filter(|w| w.idle()).take(helpers(pool.workers.len())).collect();
    if idle.is_empty() {
        return mover.run(ops);
    }
    let job = Job::of(guided(ops, total, idle.len() + 1, MOVER_MIN_PIECE), false, Some(mover.clone()));
    for worker in &idle {
        worker.give(&job);
    }
    job.help();
    job.finish();
    job.result()
}

/// Copies what [`copy_prefix`] left (`rest_bytes` bytes): on the caller
/// alone, in input order, without `helpers`; with them, as a job of pieces
/// they and the caller claim (streaming with `stream`).
fn copy_rest(rest: &Rest<'_>, rest_bytes: u64, helpers: &[&Worker], stream: bool) {
    if helpers.is_empty() {
        run(rest.cut.as_slice(), stream);
        return run(rest.tail, stream);
    }
    let job = Job::new(rest.ops(), piece_count(rest_bytes, helpers.len() + 1), stream, None);
    for worker in helpers {
        worker.give(&job);
    }
    job.help();
    job.finish();
}

/// What is left of a group once its first bytes are copied: the rest of an
/// op cut short, then the ops not reached.
struct Rest<'a> {
    cut: Option<CopyOp>,
    tail: &'a [CopyOp],
}

impl Rest<'_> {
    fn ops(&self) -> impl Iterator<Item = CopyOp> + Clone + '_ {
        self.cut.into_iter().chain(self.tail.iter().copied())
    }
}

/// Copies the first `bytes` of `ops` in input order (cutting the op that
/// crosses that mark) and returns what is left.
fn copy_prefix(ops: &[CopyOp], bytes: u64, stream: bool) -> Rest<'_> {
    let mut left = bytes;
    for (i, o) in ops.iter().enumerate() {
        if o.len > left {
            // The ops before it, then its first `left` bytes (nothing
            // copied into a list of its own).
            run(&ops[..i], stream);
            run(&[CopyOp { dst: o.dst, src: o.src, len: left }], stream);
            let cut = CopyOp { dst: o.dst + left, src: o.src + left, len: o.len - left };
            return Rest { cut: Some(cut), tail: &ops[i + 1..] };
        }
        left -= o.len;
    }
    run(ops, stream);
    Rest { cut: None, tail: &[] }
}

/// Whether a group is started on the pool (see [`start`]): independent
/// copies of at least [`ASYNC_MIN_BYTES`], or of [`PARALLEL_MIN_BYTES`]
/// while groups started before are copying (the caller would otherwise
/// copy it alone, beside them, before it could post the next).
pub fn asynchronous(ops: &[CopyOp], plan: CopyPlan) -> bool {
    pooled(ops, plan, ASYNC_MIN_BYTES)
        || (pooled(ops, plan, PARALLEL_MIN_BYTES) && pool().workers.iter().any(|w| !w.idle()))
}

/// Whether the pool takes part: independent copies of at least `min` bytes.
fn pooled(ops: &[CopyOp], plan: CopyPlan, min: u64) -> bool {
    pooled_bytes(ops.iter().map(|o| o.len).sum(), plan, min)
}

/// [`pooled`], for a group of `total` bytes.
pub(super) fn pooled_bytes(total: u64, plan: CopyPlan, min: u64) -> bool {
    plan == CopyPlan::Independent && total >= min && !pool().workers.is_empty()
}
