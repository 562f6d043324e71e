//! CPU copies of the SHM transport, on every core: a group of independent
//! copies large enough to be worth it is cut into pieces of about equal
//! bytes that any copier claims, one at a time, from a small process-wide
//! pool of copy threads and the caller. [`copy`]: the caller claims pieces
//! too and returns when every piece is done; [`start`]: the pool copies
//! them and the caller goes on (the submission returns at admission),
//! learning the end from the returned [`Pending`]. Dependent groups (and
//! small ones) run in input order on the caller. [`copy_with`] moves the
//! pieces with a [`Mover`] of the caller's instead of memcpy (CMA: the
//! kernel's cross-memory calls), the first failure failing the group.

use crate::error::{Error, Result};
use crate::transport::ipc::backend::{CopyOp, CopyPlan};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Weak};

/// Below this many bytes a group is copied by the caller alone (handing work
/// to another core costs a wake-up of some microseconds).
pub const PARALLEL_MIN_BYTES: u64 = 512 * 1024;

/// Bytes of a piece: small enough that a copier that wakes late finds most
/// of a synchronous group still unclaimed, or none of it (the caller took
/// it all), rather than a fixed half it must still copy while the caller
/// waits. (On a 2-core VM, a 1 MiB group cut in two fixed halves ran at
/// 9.5-13 GB/s in TENT's tebench against 35-39 for one caller's memcpy:
/// the caller waited for the helper's wake-up.)
const PIECE_BYTES: u64 = 64 * 1024;

/// From this many bytes a group's copies store around the caches
/// ([`stream_copy`]): its destination outgrows a core's L2 anyway, and such
/// stores skip reading every destination line before writing it. On the
/// 2-core Xeon VM (2 MiB of L2 a core), two threads copying 1 MiB blocks
/// through a 16 MiB working set moved 27.0-27.7 GB/s with memcpy and
/// 31.5-32.7 streaming, through 256 MiB 13.9-14.1 and 18.9-19.1; within
/// the L2 (2 MiB) streaming lost, 48-54 against 39.
pub const STREAM_MIN_BYTES: u64 = 8 << 20;

/// Whether a group of `total` bytes streams whatever its data
/// ([`STREAM_MIN_BYTES`]).
fn streams(total: u64) -> bool {
    total >= STREAM_MIN_BYTES
}

/// Pieces of one group at most (a larger group gets larger pieces).
const MAX_PIECES: usize = 256;

/// Groups waiting for each copy thread at most; past it the caller copies
/// what no thread takes.
const QUEUED_JOBS: usize = 256;

/// Moves the bytes of copies that are not two ranges of this process's
/// memory (CMA: one range lies in another process), in place of memcpy.
pub trait Mover: Send + Sync {
    /// Moves `ops` in input order; an error says what failed (the pieces
    /// before it may have moved).
    fn run(&self, ops: &[CopyOp]) -> Result<()>;
}

/// A group's copies, cut into pieces that copiers claim in turn, and how
/// many pieces are done.
struct Job {
    pieces: Pieces,
    /// Whether its copies stream ([`STREAM_MIN_BYTES`]).
    stream: bool,
    /// What moves its pieces (`None`: memcpy).
    mover: Option<Arc<dyn Mover>>,
    /// The first failure of a piece (a [`Mover`]'s; memcpy cannot fail).
    failed: Mutex<Option<Error>>,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Taken by the copier that finishes the last piece before it wakes
    /// the waiters, and by a waiter before it sleeps.
    sleep: Mutex<()>,
    all_done: Condvar,
}

impl Job {
    fn new(
        ops: impl Iterator<Item = CopyOp> + Clone,
        pieces: usize,
        stream: bool,
        mover: Option<Arc<dyn Mover>>,
    ) -> Arc<Job> {
        Job::of(shares(ops, pieces), stream, mover)
    }

    /// A job of `pieces` already cut.
    fn of(pieces: Pieces, stream: bool, mover: Option<Arc<dyn Mover>>) -> Arc<Job> {
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
    fn help(&self) {
        while self.help_one() {}
    }

    /// Copies one piece nobody has claimed; false when none is left.
    fn help_one(&self) -> bool {
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

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) == self.pieces.len()
    }

    /// The first failure of a piece, once every piece is done.
    fn result(&self) -> Result<()> {
        self.failed.lock().take().map_or(Ok(()), Err)
    }

    /// Whether some piece is still unclaimed.
    fn unclaimed(&self) -> bool {
        self.next.load(Ordering::Acquire) < self.pieces.len()
    }

    /// Waits until every piece is done: claimed ones by their copiers.
    fn wait(&self) {
        let mut sleep = self.sleep.lock();
        while !self.is_done() {
            self.all_done.wait(&mut sleep);
        }
    }

    /// Waits for the pieces other copiers are still copying, once none is
    /// left to claim: at most a piece each, some microseconds, so it spins
    /// first (sleeping would add a wake-up, tens of microseconds on a VM,
    /// to every synchronous group) and sleeps only past [`SPIN_LIMIT`].
    fn finish(&self) {
        let spun = std::time::Instant::now();
        while !self.is_done() {
            if spun.elapsed() > SPIN_LIMIT {
                return self.wait();
            }
            std::hint::spin_loop();
        }
    }
}

/// A synchronous group wakes pool threads only when, timed on its first
/// piece, the rest would take the caller longer than this: a helper starts
/// some tens of microseconds after its wake-up on a VM, and a copy the
/// caller finishes sooner (cache-resident data, at 35-39 GB/s a core here)
/// is only slowed by it. In TENT's tebench (a 1 MiB group copied again and
/// again, in cache) helpers cut 34-35 GB/s to 22-29; in orbite-bench (a
/// working set far larger than the caches, 11 GB/s a core) they raise
/// 10-12 GB/s to 14-18.
const HELP_MIN_REST: std::time::Duration = std::time::Duration::from_micros(50);

/// Whether a group whose first piece took `first` is worth waking helpers
/// for, with `rest` pieces still unclaimed.
fn worth_helpers(first: std::time::Duration, rest: u32) -> bool {
    first * rest > HELP_MIN_REST
}

/// How long a synchronous copy's caller spins for its helpers' last pieces
/// before it sleeps (a helper descheduled mid-piece).
const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_micros(50);

/// How many pieces a group of `total` bytes is cut into, for `copiers` at
/// once.
fn piece_count(total: u64, copiers: usize) -> usize {
    (total.div_ceil(PIECE_BYTES) as usize).clamp(copiers.max(1), MAX_PIECES)
}

/// A copy thread: where its jobs go, and how many wait or run there.
struct Worker {
    tx: SyncSender<Arc<Job>>,
    queued: Arc<AtomicUsize>,
}

impl Worker {
    /// Hands `job` over; false when the queue is full (or the thread gone).
    fn give(&self, job: &Arc<Job>) -> bool {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let given = self.tx.try_send(job.clone()).is_ok();
        if !given {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        given
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

fn work(rx: Receiver<Arc<Job>>, queued: &AtomicUsize) {
    while let Some(job) = next_job(&rx) {
        job.help();
        queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a copy thread that finished a group looks for the next one,
/// spinning, before it sleeps: a caller that copies group after group
/// (a batch waited for, then the next submitted, some microseconds apart)
/// then finds it awake, and its group pays no wake-up (tens of
/// microseconds on a VM, more than a 64 KiB group takes to copy).
const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// The next group for a copy thread: spinning for [`IDLE_SPIN`], then
/// sleeping until one comes; `None` once the pool is gone.
fn next_job(rx: &Receiver<Arc<Job>>) -> Option<Arc<Job>> {
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

/// Moves `ops` in input order with `mover`, or with memcpy ([`run`]).
fn run_by(mover: Option<&Arc<dyn Mover>>, ops: &[CopyOp], stream: bool) -> Result<()> {
    match mover {
        Some(m) => m.run(ops),
        None => {
            run(ops, stream);
            Ok(())
        }
    }
}

/// Copies `ops` in input order; with `stream`, each op of at least a
/// cache line whose two ranges lie apart through [`stream_copy`].
fn run(ops: &[CopyOp], stream: bool) {
    let mut streamed = false;
    for o in ops {
        let apart = || o.dst.saturating_add(o.len) <= o.src || o.src.saturating_add(o.len) <= o.dst;
        if stream && o.len >= 64 && apart() {
            // SAFETY: as below, and the two ranges do not overlap (checked).
            unsafe { stream_copy(o.dst as *mut u8, o.src as *const u8, o.len as usize) };
            streamed = true;
            continue;
        }
        // SAFETY: the protocol checked every range against a leased local
        // region and a live mapping before handing the group over, and the
        // caller of `copy` (or the holder of `start`'s `Pending`) keeps both
        // alive until every piece is done; `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(o.src as *const u8, o.dst as *mut u8, o.len as usize) };
    }
    if streamed {
        store_fence();
    }
}

/// Copies `len` bytes from `src` to `dst` with stores that bypass the
/// caches (x86-64; elsewhere a plain copy). Weakly ordered: a
/// [`store_fence`] must follow before anything that tells another thread
/// or process the bytes are there.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, the two not
/// overlapping.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // Streaming stores need 16-byte aligned destinations: the bytes before
    // the first such address go plainly.
    let head = dst.align_offset(16).min(len);
    // SAFETY: within the ranges the caller vouches for, which do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let (mut d, mut s, mut left) = (dst.wrapping_add(head), src.wrapping_add(head), len - head);
    while left >= 64 {
        // SAFETY: 64 bytes at `s` and at `d` lie within the caller's ranges
        // (`left` counts what remains of both); `d` is 16-byte aligned
        // (advanced by multiples of 16 from an aligned address); SSE2 is
        // part of every x86-64 processor; unaligned loads are allowed.
        unsafe {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            _mm_stream_si128(d.cast::<__m128i>(), a);
            _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            (d, s) = (d.add(64), s.add(64));
        }
        left -= 64;
    }
    // SAFETY: the last `left` bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(s, d, left) };
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's ranges, which do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Orders the streaming stores before every later store (the count of
/// pieces done, a completion another process reads).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86-64 processor; a fence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

thread_local! {
    /// A copier's piece, in source order (reused from piece to piece).
    static SORTED: std::cell::RefCell<Vec<CopyOp>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A group's copies in one list, and where each piece of it starts: the
/// pieces of a large group cost two allocations, not one each.
struct Pieces {
    /// Bytes of a piece (the last may hold fewer).
    each: u64,
    ops: Vec<CopyOp>,
    /// Piece `i` is `ops[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
}

impl Pieces {
    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    fn get(&self, i: usize) -> Option<&[CopyOp]> {
        (i < self.len()).then(|| &self.ops[self.starts[i]..self.starts[i + 1]])
    }
}

/// Cuts `ops` into `n` shares of about equal bytes (an op may be cut in two).
fn shares(ops: impl Iterator<Item = CopyOp> + Clone, n: usize) -> Pieces {
    let total: u64 = ops.clone().map(|o| o.len).sum();
    let each = total.div_ceil(n as u64).max(1);
    let mut sizes = vec![each; (total / each) as usize];
    sizes.extend((total % each > 0).then_some(total % each));
    cut(ops, &sizes)
}

/// Cuts `ops` (`total` bytes) for `copiers` claiming pieces in turn,
/// largest first: each piece holds a `copiers`-th of the bytes the pieces
/// before it left, in whole pages, at least `min` bytes (the last holds
/// what is left). The first claims move most bytes in few calls (a
/// [`Mover`] pays a kernel call a piece), and the last ones are small, so
/// copiers finish together however late one started (guided
/// self-scheduling): a 1 MiB group for two copiers is 512, 256, 128, 64,
/// 32 and 32 KiB.
fn guided(ops: &[CopyOp], total: u64, copiers: usize, min: u64) -> Pieces {
    const PAGE: u64 = 4096;
    let mut sizes = Vec::new();
    let mut left = total;
    while left > 0 {
        let take = (left / copiers.max(1) as u64).next_multiple_of(PAGE).max(min).min(left);
        sizes.push(take);
        left -= take;
    }
    cut(ops.iter().copied(), &sizes)
}

/// Cuts `ops` into pieces of `sizes` bytes in turn (an op may be cut);
/// the sizes add up to the ops' bytes.
fn cut(ops: impl Iterator<Item = CopyOp>, sizes: &[u64]) -> Pieces {
    let each = sizes.iter().copied().max().unwrap_or(1);
    let mut out = Pieces { each, ops: Vec::with_capacity(ops.size_hint().0 + sizes.len()), starts: vec![0] };
    let mut size = sizes.iter().copied();
    let mut room = size.next().unwrap_or(u64::MAX);
    for mut o in ops {
        while o.len > 0 {
            if room == 0 {
                out.starts.push(out.ops.len());
                room = size.next().unwrap_or(u64::MAX);
            }
            let take = o.len.min(room);
            out.ops.push(CopyOp { dst: o.dst, src: o.src, len: take });
            (o.dst, o.src, o.len) = (o.dst + take, o.src + take, o.len - take);
            room -= take;
        }
    }
    out.starts.push(out.ops.len());
    out
}

/// The copies of a started group: done once every piece is.
pub struct Pending {
    job: Arc<Job>,
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
    pooled_bytes(ops.iter().map(|o| o.len).sum(), plan, min)
}

/// [`pooled`], for a group of `total` bytes.
fn pooled_bytes(total: u64, plan: CopyPlan, min: u64) -> bool {
    plan == CopyPlan::Independent && total >= min && !pool().workers.is_empty()
}

/// Starts an [`asynchronous`] group on the pool and returns at once; the
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
struct Started {
    /// Weak: a job's pieces are freed with its last copier, listed or not.
    jobs: Mutex<Vec<Weak<Job>>>,
    /// How many jobs are listed (read without the lock).
    listed: AtomicUsize,
}

impl Started {
    /// Lists `job` (and drops the jobs whose every piece is claimed).
    fn offer(&self, job: &Arc<Job>) {
        let mut jobs = self.jobs.lock();
        jobs.push(Arc::downgrade(job));
        self.prune(&mut jobs);
    }

    /// The oldest listed job with a piece unclaimed.
    fn oldest(&self) -> Option<Arc<Job>> {
        if self.listed.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut jobs = self.jobs.lock();
        self.prune(&mut jobs);
        jobs.first().and_then(Weak::upgrade)
    }

    /// Drops the listed jobs whose every piece is claimed (or that are
    /// gone) and records how many are left; `jobs` is `self.jobs`, locked.
    fn prune(&self, jobs: &mut Vec<Weak<Job>>) {
        jobs.retain(|j| j.upgrade().is_some_and(|j| j.unclaimed()));
        self.listed.store(jobs.len(), Ordering::Release);
    }
}

fn started() -> &'static Started {
    static STARTED: Started = Started { jobs: Mutex::new(Vec::new()), listed: AtomicUsize::new(0) };
    &STARTED
}

/// Pieces larger than this are left to the copy threads: a poll that
/// copies one returns within about 100 us even from memory (groups up to
/// 256 MiB).
const ASSIST_MAX_PIECE: u64 = 1 << 20;

/// Whether a poll may copy `job`'s pieces ([`ASSIST_MAX_PIECE`]).
fn assistable(job: &Job) -> bool {
    job.pieces.each <= ASSIST_MAX_PIECE
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

/// Pool threads that help the caller with a synchronous copy when the pool
/// has `workers` (one per core): one fewer, since the caller copies too. A
/// copier more than there are cores only adds switches: on 2 cores, 3
/// copiers of a 1 MiB batch of 64 KiB blocks reached 18.5-20.0 GB/s in
/// TENT's tebench, 2 copiers 27.3-28.1.
fn helpers(workers: usize) -> usize {
    workers.saturating_sub(1)
}

/// Performs a group's copies: in input order on the caller when `plan` is
/// ordered or the group is small; otherwise on the caller and idle threads
/// of the copy pool at once, one copier per core (a busy thread would reach
/// this group only after the groups started before), when the group is slow
/// enough to be worth their wake-up ([`HELP_MIN_REST`], timed on the first
/// piece, which the caller copies alone). The caller claims pieces from the
/// start, so a helper that wakes late costs at most the piece it is
/// copying. Returns when every copy is done.
pub fn copy(ops: &[CopyOp], plan: CopyPlan) {
    let pool = pool();
    let total: u64 = ops.iter().map(|o| o.len).sum();
    if !pooled_bytes(total, plan, PARALLEL_MIN_BYTES) {
        return run(ops, false);
    }
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

/// From this many bytes a [`Mover`]'s independent group is split over the
/// caller and an idle pool thread. A kernel call costs the same from a
/// cache or from memory (it pins every page it moves), so the split does
/// not wait for a timed first piece; a pool thread awake from the group
/// before ([`IDLE_SPIN`]) takes its share within a microsecond or so.
const MOVER_MIN_BYTES: u64 = 64 * 1024;

/// The smallest piece of a [`Mover`]'s group ([`guided`]): one call each.
const MOVER_MIN_PIECE: u64 = 32 * 1024;

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

/// A first piece (64 KiB) slower than this, under 16 GB/s, came from
/// memory, not from a cache: the rest of its group streams
/// ([`STREAM_MIN_BYTES`] says why). On the 2-core Xeon VM a 64 KiB piece
/// takes about 2 us in cache and 6-9 us from memory; orbite-bench's SHM
/// batches of 16 x 64 KiB from 1 GiB buffers went from 7.5-8.6 to
/// 10.6-11.0 GB/s, and tebench's (the same 1 MiB again and again, in
/// cache) stayed at 21-22.
const FROM_MEMORY_PIECE: std::time::Duration = std::time::Duration::from_micros(4);

/// Whether a group whose first piece took `first` copies from memory.
fn from_memory(first: std::time::Duration) -> bool {
    first > FROM_MEMORY_PIECE
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
            // The ops before it and its first `left` bytes, in one call.
            let mut head = ops[..i].to_vec();
            head.push(CopyOp { dst: o.dst, src: o.src, len: left });
            run(&head, stream);
            let cut = CopyOp { dst: o.dst + left, src: o.src + left, len: o.len - left };
            return Rest { cut: Some(cut), tail: &ops[i + 1..] };
        }
        left -= o.len;
    }
    run(ops, stream);
    Rest { cut: None, tail: &[] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_byte_once_in_order() {
        let ops = [CopyOp { dst: 0, src: 1000, len: 10 }, CopyOp { dst: 100, src: 2000, len: 7 }];
        let s = shares(ops.iter().copied(), 3);
        assert_eq!(s.len(), 3);
        let piece = |i| s.get(i).unwrap().iter().map(|o: &CopyOp| (o.dst, o.src, o.len)).collect::<Vec<_>>();
        assert_eq!(piece(0), vec![(0, 1000, 6)]);
        assert_eq!(piece(1), vec![(6, 1006, 4), (100, 2000, 2)]);
        assert_eq!(piece(2), vec![(102, 2002, 5)]);
        assert!(s.get(3).is_none());
    }

    /// The pieces of `p` as (dst, src, len) lists.
    fn listed(p: &Pieces) -> Vec<Vec<(u64, u64, u64)>> {
        (0..p.len()).map(|i| p.get(i).unwrap().iter().map(|o| (o.dst, o.src, o.len)).collect()).collect()
    }

    /// Guards `guided`: each piece a copier's share of what the pieces
    /// before it left, rounded up to whole pages, at least the minimum, the
    /// last what is left; ops cut exactly at the piece boundaries.
    #[test]
    fn guided_pieces_halve_what_is_left_in_whole_pages_down_to_the_minimum() {
        const K: u64 = 1024;
        // A batch of 16 x 64 KiB blocks, two copiers: 512, 256, 128, 64,
        // 32 and 32 KiB, each block whole in one piece.
        let ops: Vec<CopyOp> =
            (0..16).map(|b| CopyOp { dst: b * 100 * K, src: (1 << 40) + b * 64 * K, len: 64 * K }).collect();
        let p = guided(&ops, 16 * 64 * K, 2, 32 * K);
        let sizes: Vec<u64> = (0..p.len()).map(|i| p.get(i).unwrap().iter().map(|o| o.len).sum()).collect();
        assert_eq!(sizes, [512 * K, 256 * K, 128 * K, 64 * K, 32 * K, 32 * K]);
        assert_eq!(p.each, 512 * K);
        let pieces = listed(&p);
        let block = |b: u64| (b * 100 * K, (1 << 40) + b * 64 * K, 64 * K);
        assert_eq!(pieces[0], (0..8).map(block).collect::<Vec<_>>());
        assert_eq!(pieces[1], (8..12).map(block).collect::<Vec<_>>());
        assert_eq!(pieces[3], [block(14)]);
        // The last block cut in two halves of 32 KiB.
        assert_eq!(pieces[4], [(15 * 100 * K, (1 << 40) + 15 * 64 * K, 32 * K)]);
        assert_eq!(pieces[5], [(15 * 100 * K + 32 * K, (1 << 40) + 15 * 64 * K + 32 * K, 32 * K)]);
        // 100 000 bytes in one op: halves rounded up to pages (50 000 ->
        // 53 248), a page at least, the rest last; cut where they end.
        let one = [CopyOp { dst: 0, src: 1 << 40, len: 100_000 }];
        let p = guided(&one, 100_000, 2, 4096);
        let at = |d: u64, len: u64| (d, (1 << 40) + d, len);
        assert_eq!(
            listed(&p),
            [[at(0, 53_248)], [at(53_248, 24_576)], [at(77_824, 12_288)], [at(90_112, 8192)], [at(98_304, 1696)]]
        );
        // Three copiers take a third each time; a 64 KiB group for two is
        // two pieces of 32 KiB.
        let p = guided(&one, 100_000, 3, 4096);
        assert_eq!(listed(&p)[..2], [[at(0, 36_864)], [at(36_864, 24_576)]]);
        let small = [CopyOp { dst: 0, src: 1 << 40, len: 64 * K }];
        assert_eq!(listed(&guided(&small, 64 * K, 2, 32 * K)), [[at(0, 32 * K)], [at(32 * K, 32 * K)]]);
    }

    #[test]
    fn a_synchronous_copy_takes_one_copier_per_core() {
        // The caller and the helpers: as many copiers as pool threads.
        assert_eq!(helpers(2), 1);
        assert_eq!(helpers(8), 7);
        assert_eq!(helpers(1), 0);
    }

    /// Source and target of `blocks` 4 KiB blocks, and the ops between
    /// them in reverse block order.
    fn blocks(src: &[u8], dst: &mut [u8]) -> Vec<CopyOp> {
        (0..src.len() / 4096)
            .rev()
            .map(|b| CopyOp {
                dst: dst.as_mut_ptr() as u64 + (b * 4096) as u64,
                src: src.as_ptr() as u64 + (b * 4096) as u64,
                len: 4096,
            })
            .collect()
    }

    #[test]
    fn a_group_whose_helpers_never_come_is_copied_by_its_caller() {
        let src: Vec<u8> = (0..64 * 4096).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let job = Job::new(blocks(&src, &mut dst).into_iter(), 8, false, None);
        assert_eq!(job.pieces.len(), 8);
        // No copy thread took the job: the caller claims every piece and
        // does not wait for anyone.
        job.help();
        assert!(job.is_done());
        job.wait();
        assert!(dst == src);
        // A helper that wakes after finds nothing left to claim.
        job.help();
        assert_eq!(job.done.load(Ordering::Acquire), 8);
    }

    #[test]
    fn groups_are_cut_into_pieces_of_64_kib_within_bounds() {
        assert_eq!(piece_count(1 << 20, 2), 16);
        assert_eq!(piece_count((1 << 20) + 1, 2), 17);
        // Never fewer pieces than copiers, nor more than MAX_PIECES.
        assert_eq!(piece_count(4096, 2), 2);
        assert_eq!(piece_count(1 << 30, 2), MAX_PIECES);
    }

    #[test]
    fn the_timed_first_piece_copies_exactly_its_bytes_and_leaves_the_rest() {
        let src: Vec<u8> = (0..12).collect();
        let mut dst = vec![0u8; 12];
        let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
        let ops = [
            CopyOp { dst: d, src: s, len: 3 },
            CopyOp { dst: d + 3, src: s + 3, len: 5 },
            CopyOp { dst: d + 8, src: s + 8, len: 4 },
        ];
        // 6 bytes: the first op whole, the second cut after 3 of its 5.
        let rest = copy_prefix(&ops, 6, false);
        assert_eq!(dst, [0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0]);
        let left: Vec<_> = rest.ops().map(|o| (o.dst - d, o.src - s, o.len)).collect();
        assert_eq!(left, [(6, 6, 2), (8, 8, 4)]);
        copy_rest(&rest, 6, &[], false);
        assert!(dst == src);
        // A mark at an op's end cuts nothing; past the group, nothing is left.
        assert_eq!(copy_prefix(&ops, 3, false).ops().map(|o| o.len).collect::<Vec<_>>(), [5, 4]);
        assert_eq!(copy_prefix(&ops, 100, false).ops().count(), 0);
    }

    #[test]
    fn the_rest_of_a_group_moves_whole_with_helpers_or_without() {
        let src: Vec<u8> = (0..256 * 4096).map(|i| (i * 13 % 241) as u8).collect();
        let helpers: Vec<&Worker> = pool().workers.iter().collect();
        for (with, stream) in [(&helpers[..], false), (&[], false), (&helpers[..], true), (&[], true)] {
            let mut dst = vec![0u8; src.len()];
            let ops = blocks(&src, &mut dst);
            let rest = copy_prefix(&ops, PIECE_BYTES, stream);
            copy_rest(&rest, (256 - 16) * 4096, with, stream);
            assert!(dst == src, "with {} helpers, streaming {stream}", with.len());
        }
    }

    #[test]
    fn helpers_are_woken_only_for_groups_slower_than_their_wake_up() {
        let us = std::time::Duration::from_micros;
        // 1 MiB in cache: 64 KiB pieces of 1.8 us, 15 left (27 us).
        assert!(!worth_helpers(us(2), 15));
        // 1 MiB from memory: pieces of 6 us, 15 left (90 us).
        assert!(worth_helpers(us(6), 15));
        assert!(!worth_helpers(us(6), 0));
    }

    /// Guards `from_memory`: the rest of a group whose first piece came
    /// from memory streams; one from a cache does not.
    #[test]
    fn a_group_streams_the_rest_when_its_first_piece_came_from_memory() {
        let us = std::time::Duration::from_micros;
        // 64 KiB in cache: 1.8 us here; from memory (1 GiB buffers): 6-9 us.
        assert!(!from_memory(us(2)));
        assert!(from_memory(us(6)));
        assert!(!from_memory(FROM_MEMORY_PIECE));
    }

    #[test]
    fn a_started_group_moves_every_byte() {
        let src: Vec<u8> = (0..1024 * 4096).map(|i| (i * 7 % 253) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pending = start(&blocks(&src, &mut dst));
        pending.wait();
        assert!(pending.is_done());
        assert!(dst == src);
    }

    #[test]
    fn a_poller_copies_the_pieces_of_a_started_group_no_thread_took() {
        let src: Vec<u8> = (0..64 * 4096).map(|i| (i * 5 % 239) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pending = start_unattended(&blocks(&src, &mut dst));
        let mut lent = 0;
        while !pending.is_done() {
            // Another test's started group may come first; ours is listed
            // until its last piece is claimed, so some piece always is.
            assert!(assist(), "a listed group with pieces unclaimed, yet nothing to copy");
            lent += 1;
            assert!(lent < 10_000);
        }
        assert!(dst == src);
    }

    #[test]
    fn polls_copy_pieces_of_groups_up_to_256_mib_only() {
        // Shares only: nothing is copied.
        let group =
            |len: u64| Job::new(std::iter::once(CopyOp { dst: 0, src: 0, len }), piece_count(len, 2), false, None);
        assert!(assistable(&group(16 << 20)));
        assert!(assistable(&group(256 << 20)), "pieces of 1 MiB");
        assert!(!assistable(&group((256 << 20) + 256)), "pieces over 1 MiB");
    }

    /// Guards `stream_copy` (head to the aligned destination, 64-byte
    /// body, tail) and `run`'s test that the two ranges lie apart.
    #[test]
    fn streamed_copies_move_exactly_their_bytes_at_any_alignment() {
        let src: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8 + 1).collect();
        for len in [64usize, 65, 127, 128, 1000, 4096 + 13] {
            for (d_off, s_off) in [(0, 0), (1, 0), (0, 3), (15, 9), (16, 1), (33, 17)] {
                let mut dst = vec![0u8; 8192 + 64];
                let op =
                    CopyOp { dst: dst.as_mut_ptr() as u64 + d_off, src: src.as_ptr() as u64 + s_off, len: len as u64 };
                run(&[op], true);
                let (d, s) = (d_off as usize, s_off as usize);
                assert!(dst[..d].iter().all(|&b| b == 0), "len {len}, offsets {d_off}/{s_off}: bytes before");
                assert!(dst[d..d + len] == src[s..s + len], "len {len}, offsets {d_off}/{s_off}");
                assert!(dst[d + len..].iter().all(|&b| b == 0), "len {len}, offsets {d_off}/{s_off}: bytes after");
            }
        }
        // Overlapping ranges (8 bytes apart in one buffer) move as memmove
        // would, forward and backward.
        for forward in [true, false] {
            let mut buf: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
            let want = {
                let mut w = buf.clone();
                if forward {
                    w.copy_within(0..4000, 8)
                } else {
                    w.copy_within(8..4008, 0)
                }
                w
            };
            let base = buf.as_mut_ptr() as u64;
            let op = match forward {
                true => CopyOp { dst: base + 8, src: base, len: 4000 },
                false => CopyOp { dst: base, src: base + 8, len: 4000 },
            };
            run(&[op], true);
            assert!(buf == want, "overlapping, forward {forward}");
        }
    }

    #[test]
    fn a_streamed_parallel_copy_moves_every_byte() {
        let n = STREAM_MIN_BYTES as usize + 4097;
        let src: Vec<u8> = (0..n).map(|i| (i * 29 % 251) as u8).collect();
        let mut dst = vec![0u8; n];
        let op = CopyOp { dst: dst.as_mut_ptr() as u64 + 1, src: src.as_ptr() as u64, len: n as u64 - 1 };
        copy(&[op], CopyPlan::Independent);
        assert_eq!(dst[0], 0);
        assert!(dst[1..] == src[..n - 1]);
    }

    /// A mover that copies with memcpy and counts its calls, failing any
    /// op whose source is `poison`.
    struct Counting {
        calls: AtomicUsize,
        poison: u64,
    }

    impl Mover for Counting {
        fn run(&self, ops: &[CopyOp]) -> Result<()> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if ops.iter().any(|o| o.src <= self.poison && self.poison < o.src + o.len) {
                return Err(Error::Io(format!("poisoned 0x{:x}", self.poison)));
            }
            run(ops, false);
            Ok(())
        }
    }

    /// Guards `copy_with`: a mover's group moves every byte through the
    /// mover (small: one call; large: its pieces, on the caller and the
    /// pool), and a piece that fails fails the group with its error, the
    /// other pieces still done.
    #[test]
    fn a_movers_group_moves_every_byte_and_reports_its_first_failure() {
        let n = 4 * PARALLEL_MIN_BYTES as usize;
        let src: Vec<u8> = (0..n).map(|i| (i * 17 % 251) as u8).collect();
        let mut dst = vec![0u8; n];
        let ops = blocks(&src, &mut dst);
        let counting = Arc::new(Counting { calls: AtomicUsize::new(0), poison: 0 });
        let mover: Arc<dyn Mover> = counting.clone();
        copy_with(&mover, &ops[..1], CopyPlan::Independent).unwrap();
        assert_eq!(counting.calls.load(Ordering::Relaxed), 1);
        copy_with(&mover, &ops, CopyPlan::Independent).unwrap();
        assert!(dst == src);
        assert!(counting.calls.load(Ordering::Relaxed) > 2, "cut into pieces");
        let poison = src.as_ptr() as u64 + n as u64 / 2 + 5;
        let failing: Arc<dyn Mover> = Arc::new(Counting { calls: AtomicUsize::new(0), poison });
        dst.fill(0);
        let e = copy_with(&failing, &ops, CopyPlan::Independent).unwrap_err();
        assert_eq!(e.message(), format!("poisoned 0x{poison:x}"));
        let e = copy_with(&failing, &ops, CopyPlan::Ordered).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::IoError);
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
