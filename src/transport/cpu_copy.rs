//! CPU copies of the SHM transport, on every core: a group of independent
//! copies large enough to be worth it is cut into equal shares of bytes for
//! a small process-wide pool of copy threads. [`copy`]: the caller copies
//! one share too and returns when every share is done; [`start`]: the pool
//! copies them all and the caller goes on (the submission returns at
//! admission), learning the end from the returned [`Pending`]. Dependent
//! groups (and small ones) run in input order on the caller.

use crate::transport::ipc::backend::{CopyOp, CopyPlan};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

/// Below this many bytes a group is copied by the caller alone (handing work
/// to another core costs a wake-up of some microseconds).
pub const PARALLEL_MIN_BYTES: u64 = 512 * 1024;

/// Shares waiting for each copy thread at most (a share is a list of
/// copies: some kilobytes).
const QUEUED_SHARES: usize = 256;

/// One share of a group's copies, and where its completion is counted.
struct Share {
    ops: Vec<CopyOp>,
    done: Arc<(Mutex<usize>, Condvar)>,
}

/// A copy thread: where its shares go, and how many wait or run there.
struct Worker {
    tx: SyncSender<Share>,
    queued: Arc<AtomicUsize>,
}

impl Worker {
    /// Hands `share` over, or gives it back when the queue is full.
    fn give(&self, share: Share) -> Result<(), Share> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.try_send(share).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            match e {
                std::sync::mpsc::TrySendError::Full(s) | std::sync::mpsc::TrySendError::Disconnected(s) => s,
            }
        })
    }

    /// Whether it has nothing queued or running.
    fn idle(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }
}

struct Pool {
    workers: Vec<Worker>,
}

fn pool() -> &'static Pool {
    static POOL: once_cell::sync::OnceCell<Pool> = once_cell::sync::OnceCell::new();
    POOL.get_or_init(|| {
        // One thread per core (at most 8): a started group uses every core
        // while its caller goes on.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = (0..cores.min(8))
            .filter_map(|i| {
                // Room for the shares of the groups one submission posts
                // while the first copy (posting runs ahead of the copy);
                // past it the caller copies a share itself.
                let (tx, rx) = sync_channel::<Share>(QUEUED_SHARES);
                let queued = Arc::new(AtomicUsize::new(0));
                let q = queued.clone();
                std::thread::Builder::new()
                    .name(format!("orbite-copy-{i}"))
                    .spawn(move || work(rx, &q))
                    .ok()
                    .map(|_| Worker { tx, queued })
            })
            .collect();
        Pool { workers }
    })
}

fn work(rx: Receiver<Share>, queued: &AtomicUsize) {
    for mut share in rx {
        // The pool gets independent copies only, so their order is free:
        // in source order, blocks scattered over a large import are read
        // page after page (fewer TLB misses and DRAM row switches; a
        // 100 000-block submission gained about 4% here).
        share.ops.sort_unstable_by_key(|o| o.src);
        run(&share.ops);
        queued.fetch_sub(1, Ordering::AcqRel);
        let (count, cv) = &*share.done;
        *count.lock() += 1;
        cv.notify_all();
    }
}

/// Copies `ops` in input order.
fn run(ops: &[CopyOp]) {
    for o in ops {
        // SAFETY: the protocol checked every range against a leased local
        // region and a live mapping before handing the group over, and the
        // caller of `copy` keeps both alive until every share is done;
        // `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(o.src as *const u8, o.dst as *mut u8, o.len as usize) };
    }
}

/// Cuts `ops` into `n` shares of about equal bytes (an op may be cut in two).
fn shares(ops: &[CopyOp], n: usize) -> Vec<Vec<CopyOp>> {
    let total: u64 = ops.iter().map(|o| o.len).sum();
    let each = total.div_ceil(n as u64).max(1);
    // Room for an equal share of ops and a cut one.
    let room_for = ops.len() / n + 2;
    let mut out: Vec<Vec<CopyOp>> = vec![Vec::with_capacity(room_for)];
    let mut room = each;
    for o in ops {
        let mut o = *o;
        while o.len > 0 {
            if room == 0 {
                out.push(Vec::with_capacity(room_for));
                room = each;
            }
            let take = o.len.min(room);
            out.last_mut().expect("one share").push(CopyOp { dst: o.dst, src: o.src, len: take });
            (o.dst, o.src, o.len) = (o.dst + take, o.src + take, o.len - take);
            room -= take;
        }
    }
    out
}

/// The copies of a started group: done once every share is.
pub struct Pending {
    done: Arc<(Mutex<usize>, Condvar)>,
    shares: usize,
}

impl Pending {
    /// Whether every share is done (without waiting).
    pub fn is_done(&self) -> bool {
        *self.done.0.lock() >= self.shares
    }

    /// Waits until every share is done.
    pub fn wait(&self) {
        let (count, cv) = &*self.done;
        let mut c = count.lock();
        while *c < self.shares {
            cv.wait(&mut c);
        }
    }
}

/// From this many bytes an independent group is started on the pool and
/// the submission returns at admission: the copy is long enough that the
/// hand-offs (waking the workers, then the completion) cost little of it.
pub const ASYNC_MIN_BYTES: u64 = 8 << 20;

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
    plan == CopyPlan::Independent && ops.iter().map(|o| o.len).sum::<u64>() >= min && !pool().workers.is_empty()
}

/// Starts an [`asynchronous`] group on the pool and returns at once; the
/// memory of every op must stay mapped until the returned [`Pending`] is
/// done. A share no worker can take now is copied here first.
pub fn start(ops: &[CopyOp]) -> Pending {
    let pool = pool();
    let done = Arc::new((Mutex::new(0usize), Condvar::new()));
    let mut shares = 0;
    for (part, worker) in self::shares(ops, pool.workers.len()).into_iter().zip(&pool.workers) {
        match worker.give(Share { ops: part, done: done.clone() }) {
            Ok(()) => shares += 1,
            Err(s) => run(&s.ops),
        }
    }
    Pending { done, shares }
}

/// Pool threads that help the caller with a synchronous copy when the pool
/// has `workers` (one per core): one fewer, since the caller copies a share
/// too. A copier more than there are cores only adds switches: on 2 cores,
/// 3 copiers of a 1 MiB batch of 64 KiB blocks reached 18.5-20.0 GB/s in
/// TENT's tebench, 2 copiers 27.3-28.1.
fn helpers(workers: usize) -> usize {
    workers.saturating_sub(1)
}

/// Performs a group's copies: in input order on the caller when `plan` is
/// ordered or the group is small; otherwise on the caller and idle threads
/// of the copy pool at once, one copier per core (a busy thread's share is
/// the caller's: it would wait behind the groups started before). Returns
/// when every copy is done.
pub fn copy(ops: &[CopyOp], plan: CopyPlan) {
    let pool = pool();
    if !pooled(ops, plan, PARALLEL_MIN_BYTES) {
        run(ops);
        return;
    }
    let mut parts = self::shares(ops, helpers(pool.workers.len()) + 1);
    let mine = parts.pop().expect("one share at least");
    let done = Arc::new((Mutex::new(0usize), Condvar::new()));
    let mut sent = 0;
    for (part, worker) in parts.into_iter().zip(&pool.workers) {
        let share = Share { ops: part, done: done.clone() };
        // A busy (or gone) worker: the caller copies that share itself.
        let given = if worker.idle() { worker.give(share) } else { Err(share) };
        match given {
            Ok(()) => sent += 1,
            Err(s) => run(&s.ops),
        }
    }
    run(&mine);
    let (count, cv) = &*done;
    let mut c = count.lock();
    while *c < sent {
        cv.wait(&mut c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_byte_once_in_order() {
        let ops = [CopyOp { dst: 0, src: 1000, len: 10 }, CopyOp { dst: 100, src: 2000, len: 7 }];
        let s = shares(&ops, 3);
        let flat: Vec<(u64, u64, u64)> = s.iter().flatten().map(|o| (o.dst, o.src, o.len)).collect();
        assert_eq!(flat, vec![(0, 1000, 6), (6, 1006, 4), (100, 2000, 2), (102, 2002, 5)]);
        assert_eq!(s.len(), 3);
        assert!(s.iter().all(|p| p.iter().map(|o| o.len).sum::<u64>() <= 6));
    }

    #[test]
    fn a_synchronous_copy_takes_one_copier_per_core() {
        // The caller and the helpers: as many copiers as pool threads.
        assert_eq!(helpers(2), 1);
        assert_eq!(helpers(8), 7);
        assert_eq!(helpers(1), 0);
    }

    #[test]
    fn a_parallel_copy_moves_every_byte() {
        let n = 3 * PARALLEL_MIN_BYTES as usize + 4097;
        let src: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![0u8; n];
        // Scattered 4 KiB blocks, reversed, then the tail.
        let mut ops: Vec<CopyOp> = (0..n / 4096)
            .rev()
            .map(|b| CopyOp {
                dst: dst.as_mut_ptr() as u64 + (b * 4096) as u64,
                src: src.as_ptr() as u64 + (b * 4096) as u64,
                len: 4096,
            })
            .collect();
        let tail = n / 4096 * 4096;
        ops.push(CopyOp {
            dst: dst.as_mut_ptr() as u64 + tail as u64,
            src: src.as_ptr() as u64 + tail as u64,
            len: (n - tail) as u64,
        });
        copy(&ops, CopyPlan::Independent);
        assert!(dst == src);
    }
}
