//! The copy pool: a thread per core (at most 8) taking groups from a
//! queue each, and the groups they copy ([`Job`]: pieces any copier claims
//! in turn, the first failure, the wait for the last piece); groups
//! started for the caller to go on ([`start`], [`Pending`]), and the
//! started groups a poller may help with ([`assist`]).

use super::kernel::run_by;
use super::kernel::Mover;
use super::pieces::{shares, Pieces};
use super::policy::{piece_count, streams, ASSIST_MAX_PIECE, IDLE_SPIN, QUEUED_JOBS, SPIN_LIMIT};
use crate::error::{Error, Result};
use crate::transport::ipc::backend::CopyOp;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Weak};

/// A group's copies, cut into pieces that copiers claim in turn, and how
/// many pieces are done.
pub(super) struct Job {
    pub(super) pieces: Pieces,
    /// Whether its copies stream ([`STREAM_MIN_BYTES`]).
    pub(super) stream: bool,
    /// What moves its pieces (`None`: memcpy).
    pub(super) mover: Option<Arc<dyn Mover>>,
    /// The first failure of a piece (a [`Mover`]'s; memcpy cannot fail).
    pub(super) failed: Mutex<Option<Error>>,
    pub(super) next: AtomicUsize,
    pub(super) done: AtomicUsize,
    /// Taken by the copier that finishes the last piece before it wakes
    /// the waiters, and by a waiter before it sleeps.
    pub(super) sleep: Mutex<()>,
    pub(super) all_done: Condvar,
}

impl Job {
    pub(super) fn new(
        ops: impl Iterator<Item = CopyOp> + Clone,
        pieces: usize,
        stream: bool,
        mover: Option<Arc<dyn Mover>>,
    ) -> Arc<Job> {
        Job::of(shares(ops, pieces), stream, mover)
    }

    /// A job of `pieces` already cut.
    pub(super) fn of(pieces: Pieces, stream: bool, mover: Option<Arc<dyn Mover>>) -> Arc<Job> {
        Arc::new(Job {
            pieces,
            stream,
            mover,
            failed: Mutex::new(None),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            all_done: Condvar::new(),
        })
    }

    /// Copies pieces nobody has claimed until none is left.
    pub(super) fn help(&self) {
        while self.help_one() {}
    }

    /// Copies one piece nobody has claimed; false when none is left.
    pub(super) fn help_one(&self) -> bool {
        let i = self.next.fetch_add(1, Ordering::AcqRel);
        let Some(piece) = self.pieces.get(i) else { return false };
        SORTED.with(|sorted| {
            let mut ops = sorted.borrow_mut();
            // Independent copies only, so their order is free: in source
            // order, blocks scattered over a large import are read page
            // after page (fewer TLB misses and DRAM row switches; a
            // 100 000-block submission gained about 4% here).
            ops.clear();
            ops.extend_from_slice(piece);
            ops.sort_unstable_by_key(|o| o.src);
            if let Err(e) = run_by(self.mover.as_ref(), &ops, self.stream) {
                self.failed.lock().get_or_insert(e);
            }
        });
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.pieces.len() {
            let _sleepers = self.sleep.lock();
            self.all_done.notify_all();
        }
        true
    }

    pub(super) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) == self.pieces.len()
    }

    /// The first failure of a piece, once every piece is done.
    pub(super) fn result(&self) -> Result<()> {
        self.failed.lock().take().map_or(Ok(()), Err)
    }

    /// Whether some piece is still unclaimed.
    pub(super) fn unclaimed(&self) -> bool {
        self.next.load(Ordering::Acquire) < self.pieces.len()
    }

    /// Waits until every piece is done: claimed ones by their copiers.
    pub(super) fn wait(&self) {
        let mut sleep = self.sleep.lock();
        while !self.is_done() {
            self.all_done.wait(&mut sleep);
        }
    }

    /// Waits for the pieces other copiers are still copying, once none is
    /// left to claim: at most a piece each, some microseconds, so it spins
    /// first (sleeping would add a wake-up, tens of microseconds on a VM,
    /// to every synchronous group) and sleeps only past [`SPIN_LIMIT`].
    pub(super) fn finish(&self) {
        let spun = std::time::Instant::now();
        while !self.is_done() {
            if spun.elapsed() > SPIN_LIMIT {
                return self.wait();
            }
            std::hint::spin_loop();
        }
    }
}

/// A copy thread: where its jobs go, and how many wait or run there.
pub(super) struct Worker {
    pub(super) tx: SyncSender<Arc<Job>>,
    pub(super) queued: Arc<AtomicUsize>,
}

impl Worker {
    /// Hands `job` over; false when the queue is full (or the thread gone).
    pub(super) fn give(&self, job: &Arc<Job>) -> bool {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let given = self.tx.try_send(job.clone()).is_ok();
        if !given {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        given
    }

    /// Whether it has nothing queued or running.
    pub(super) fn idle(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }
}

pub(super) struct Pool {
    pub(super) workers: Vec<Worker>,
}

pub(super) fn pool() -> &'static Pool {
    static POOL: once_cell::sync::OnceCell<Pool> = once_cell::sync::OnceCell::new();
    POOL.get_or_init(|| {
        // One thread per core (at most 8): a started group uses every core
        // while its caller goes on.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = (0..cores.min(8))
            .filter_map(|i| {
                // Room for the groups one submission posts while the first
                // copies (posting runs ahead of the copy).
                let (tx, rx) = sync_channel::<Arc<Job>>(QUEUED_JOBS);
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

pub(super) fn work(rx: Receiver<Arc<Job>>, queued: &AtomicUsize) {
    while let Some(job) = next_job(&rx) {
        job.help();
        queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The next group for a copy thread: spinning for [`IDLE_SPIN`], then
/// sleeping until one comes; `None` once the pool is gone.
pub(super) fn next_job(rx: &Receiver<Arc<Job>>) -> Option<Arc<Job>> {
    let spun = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) if spun.elapsed() > IDLE_SPIN => return rx.recv().ok(),
            Err(std::sync::mpsc::TryRecvError::Empty) => (0..64).for_each(|_| std::hint::spin_loop()),
        }
    }
}

thread_local! {
    /// A copier's piece, in source order (reused from piece to piece).
    static SORTED: std::cell::RefCell<Vec<CopyOp>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The copies of a started group: done once every piece is.
pub struct Pending {
    pub(super) job: Arc<Job>,
}

impl Pending {
    /// Whether every piece is done (without waiting).
    pub fn is_done(&self) -> bool {
        self.job.is_done()
    }

    /// Waits until every piece is done.
    pub fn wait(&self) {
        self.job.wait()
    }
}

/// Starts an [`asynchronous`](super::asynchronous) group on the pool and returns at once; the
/// memory of every op must stay mapped until the returned [`Pending`] is
/// done. When no worker can take it now (every queue full), it is copied
/// here.
pub fn start(ops: &[CopyOp]) -> Pending {
    let pool = pool();
    let total = ops.iter().map(|o| o.len).sum();
    let job = Job::new(ops.iter().copied(), piece_count(total, pool.workers.len()), streams(total), None);
    if assistable(&job) {
        started().offer(&job);
    }
    let mut given = 0;
    for worker in &pool.workers {
        given += usize::from(worker.give(&job));
    }
    if given == 0 {
        job.help();
    }
    Pending { job }
}

/// Started groups with pieces nobody has claimed yet, which a thread that
/// polls for a completion may copy ([`assist`]) instead of spinning.
pub(super) struct Started {
    /// Weak: a job's pieces are freed with its last copier, listed or not.
    pub(super) jobs: Mutex<Vec<Weak<Job>>>,
    /// How many jobs are listed (read without the lock).
    pub(super) listed: AtomicUsize,
}

impl Started {
    /// Lists `job` (and drops the jobs whose every piece is claimed).
    pub(super) fn offer(&self, job: &Arc<Job>) {
        let mut jobs = self.jobs.lock();
        jobs.push(Arc::downgrade(job));
        self.prune(&mut jobs);
    }

    /// The oldest listed job with a piece unclaimed.
    pub(super) fn oldest(&self) -> Option<Arc<Job>> {
        if self.listed.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut jobs = self.jobs.lock();
        self.prune(&mut jobs);
        jobs.first().and_then(Weak::upgrade)
    }

    /// Drops the listed jobs whose every piece is claimed (or that are
    /// gone) and records how many are left; `jobs` is `self.jobs`, locked.
    pub(super) fn prune(&self, jobs: &mut Vec<Weak<Job>>) {
        jobs.retain(|j| j.upgrade().is_some_and(|j| j.unclaimed()));
        self.listed.store(jobs.len(), Ordering::Release);
    }
}

pub(super) fn started() -> &'static Started {
    static STARTED: Started = Started { jobs: Mutex::new(Vec::new()), listed: AtomicUsize::new(0) };
    &STARTED
}

/// Lends the calling thread, which polls for a completion, to the started
/// groups: copies one piece nobody has claimed, if any; true when it did.
/// A caller that busy-polls its batch (TENT's tebench does) otherwise takes
/// a core from the copy threads it waits for: on 2 cores, its 16 MiB
/// groups ran at 12-24 GB/s from run to run. Pieces are 64 KiB up to
/// [`ASSIST_MAX_PIECE`], so a poll returns within microseconds to about
/// 100 us.
pub fn assist() -> bool {
    started().oldest().is_some_and(|job| job.help_one())
}

/// A started group that no copy thread takes, only [`assist`] (tests of
/// the callers that lend their thread).
#[cfg(test)]
pub(crate) fn start_unattended(ops: &[CopyOp]) -> Pending {
    let job = Job::new(ops.iter().copied(), piece_count(ops.iter().map(|o| o.len).sum(), 2), false, None);
    started().offer(&job);
    Pending { job }
}

/// Whether a poll may copy `job`'s pieces ([`ASSIST_MAX_PIECE`]).
pub(super) fn assistable(job: &Job) -> bool {
    job.pieces.each <= ASSIST_MAX_PIECE
}
