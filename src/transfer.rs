//! Requests, outcomes and the shared completion record behind a `Batch`.
//! Transports complete chunks here; the engine hands `Batch` to callers.

use crate::counters::Counters;
use crate::error::{Error, Status};
use crate::kinds::TransportKind;
use crate::sync::spin;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The most requests one submission may carry (a larger count is
/// `InvalidArgument` before anything is allocated).
pub const MAX_REQUESTS: usize = 1 << 24;

/// Direction of a request. Its values are the C ABI's opcodes
/// (`ORBITE_OP_READ`, `ORBITE_OP_WRITE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// Remote -> local.
    Read = 1,
    /// Local -> remote.
    Write = 2,
}

/// One transfer: absolute addresses in registered regions. Laid out as
/// the C ABI's `orbite_request`, so that a C submission whose opcodes are
/// checked is read in place, never copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Request {
    /// Direction.
    pub op: Op,
    /// Address inside a region registered on this engine.
    pub local_addr: u64,
    /// Absolute address inside a region the peer registered.
    pub remote_addr: u64,
    /// Bytes (0 is invalid).
    pub len: u64,
}

/// What a request did to the remote memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum RemoteEffect {
    /// Nothing changed remotely (every READ, and a WRITE that never reached the peer).
    None = 0,
    /// The WRITE was applied in full.
    Applied = 1,
    /// The WRITE may have changed any part of the remote range.
    Unknown = 2,
}

impl RemoteEffect {
    /// The effect of a request of `op` that failed after it may have
    /// reached the peer: a READ changes nothing remotely, a WRITE may have
    /// changed any part of its range. The one place this rule is written.
    pub fn of_uncertain(op: Op) -> RemoteEffect {
        match op {
            Op::Write => RemoteEffect::Unknown,
            Op::Read => RemoteEffect::None,
        }
    }
}

/// Per-request outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestResult {
    /// `Ok`, `Pending` or the failure.
    pub status: Status,
    /// Remote effect (`Unknown` only for WRITE).
    pub remote_effect: RemoteEffect,
}

/// Outcome of one chunk (a request may be split into several).
#[derive(Debug, Clone)]
pub struct ChunkOutcome {
    /// `Ok` or the failure.
    pub result: Result<(), Error>,
    /// What the chunk did remotely.
    pub effect: RemoteEffect,
    /// For a WRITE that failed partly sent: how many of its payload bytes
    /// (from its start) may have reached the peer. The requests of a
    /// coalesced run wholly beyond them sent nothing
    /// ([`BatchShared::complete_run`]). `None`: any of them.
    pub reached: Option<u64>,
}

impl ChunkOutcome {
    /// Success.
    pub fn ok(op: Op) -> ChunkOutcome {
        ChunkOutcome {
            result: Ok(()),
            effect: if op == Op::Write { RemoteEffect::Applied } else { RemoteEffect::None },
            reached: None,
        }
    }
    /// Failure with an effect.
    pub fn failed(e: Error, effect: RemoteEffect) -> ChunkOutcome {
        ChunkOutcome { result: Err(e), effect, reached: None }
    }
    /// The same, saying that at most `bytes` of the payload may have
    /// reached the peer.
    pub fn reaching(self, bytes: u64) -> ChunkOutcome {
        ChunkOutcome { reached: Some(bytes), ..self }
    }
}

struct ReqState {
    op: Op,
    len: u64,
    /// The transport carrying it; `None` until the submission routed it.
    transport: Option<TransportKind>,
    chunks_left: u32,
    started: bool,
    /// Asked to end `Cancelled` if it has not started
    /// ([`BatchShared::cancel_request`]).
    cancel_asked: bool,
    /// Its failure, boxed: most requests never fail, and a submission of
    /// 100 000 requests keeps one of these per request.
    error: Option<Box<Error>>,
    any_applied: bool,
    any_unknown: bool,
    done: bool,
}

struct State {
    reqs: Vec<ReqState>,
    pending: usize,
    failed: usize,
    cancelled: bool,
    /// What the engine decided for the submission and why (a fallback to
    /// another transport, groups split by policy), in words.
    notes: Vec<String>,
    /// A notification travels with the batch and its outcome is not known
    /// yet: the batch has not ended.
    notification_pending: bool,
    /// The notification's outcome, once known.
    notification: Option<Result<(), Error>>,
    /// Called once every request has ended (then cleared).
    on_end: Vec<EndHook>,
}

/// A batch's final status: `TRANSFER_FAILED` when a request or its
/// notification failed; `None` while anything is pending.
fn ended(s: &State) -> Option<Status> {
    if s.pending > 0 || s.notification_pending {
        return None;
    }
    let failed = s.failed > 0 || matches!(s.notification, Some(Err(_)));
    Some(if failed { Status::TransferFailed } else { Status::Ok })
}

/// Called once every request of a batch has ended.
pub type EndHook = Box<dyn FnOnce() + Send>;

/// Batches of at most this many bytes are waited for by spinning first
/// (see [`BatchShared::wait`]).
const SPIN_BYTES: u64 = 256 * 1024;
/// How long a small batch's waiter spins before it sleeps.
const SPIN: Duration = Duration::from_micros(150);
/// How long one try of a poller, or of a waiter that does not spin, may
/// read answers ([`BatchShared::assist_once`]).
const ASSIST_SLICE: Duration = Duration::from_micros(50);

/// Work a batch's waiter may do itself while it spins: the receive side of
/// the connection carrying the batch, read by the waiting thread when the
/// connection's I/O thread is not at it (its answers then land without
/// waiting for that thread's wake-up).
pub trait Assist: Send + Sync {
    /// Does what can be done at once without blocking, stopping soon
    /// after `until`; true when anything was received.
    fn assist(&self, until: Instant) -> bool;
}

/// The records' vector kept between batches (no lock): a submission of
/// 10^5 requests otherwise faults its pages in afresh.
static RECORDS: crate::sync::spare::Spare<ReqState> = crate::sync::spare::Spare::new();

impl Drop for BatchShared {
    fn drop(&mut self) {
        RECORDS.give(std::mem::take(&mut self.state.get_mut().reqs));
    }
}

/// The completion record of one submission.
pub struct BatchShared {
    state: Mutex<State>,
    cv: Condvar,
    /// How long a waiter spins (yielding) before it sleeps: a small
    /// batch's answers usually come within a round trip, and a waiter
    /// already running sees them without a wake-up.
    spin: Duration,
    /// What the waiter drives while it spins (see [`Assist`]).
    assist: once_cell::sync::OnceCell<Weak<dyn Assist>>,
    /// Set (under `state`) once every request has ended: read without
    /// the lock by [`BatchShared::requests_ended`].
    requests_ended: AtomicBool,
    stats: Arc<Counters>,
    /// The submission deadline.
    pub deadline: Instant,
}

impl BatchShared {
    /// A record for `requests`, all pending and not yet routed.
    pub fn new(requests: &[Request], stats: Arc<Counters>, deadline: Instant) -> Arc<BatchShared> {
        Self::routed(requests, None, stats, deadline)
    }

    /// A record for `requests`, all pending; with `route`, each already
    /// planned as one chunk on that transport (as [`BatchShared::plan`]
    /// would, without a second pass over the requests).
    pub fn routed(
        requests: &[Request],
        route: Option<TransportKind>,
        stats: Arc<Counters>,
        deadline: Instant,
    ) -> Arc<BatchShared> {
        let mut bytes = 0u64;
        let mut reqs = RECORDS.take(requests.len());
        reqs.extend(requests.iter().map(|r| {
            bytes = bytes.saturating_add(r.len);
            ReqState {
                op: r.op,
                len: r.len,
                transport: route,
                chunks_left: route.is_some() as u32,
                started: false,
                cancel_asked: false,
                error: None,
                any_applied: false,
                any_unknown: false,
                done: false,
            }
        }));
        Arc::new(BatchShared {
            state: Mutex::new(State {
                reqs,
                pending: requests.len(),
                failed: 0,
                cancelled: false,
                notes: Vec::new(),
                notification_pending: false,
                notification: None,
                on_end: Vec::new(),
            }),
            cv: Condvar::new(),
            spin: if bytes <= SPIN_BYTES { SPIN } else { Duration::ZERO },
            assist: once_cell::sync::OnceCell::new(),
            requests_ended: AtomicBool::new(false),
            stats,
            deadline,
        })
    }

    /// Names what a spinning waiter may drive (the first one named stays:
    /// a batch spread over several connections is helped on one).
    pub fn assisted_by(&self, a: Weak<dyn Assist>) {
        if self.spin > Duration::ZERO {
            let _ = self.assist.set(a);
        }
    }

    /// One non-blocking try at what a waiter drives ([`Assist`]), for a
    /// thread that polls the batch: answers already waiting land without
    /// the connection's I/O thread's wake-up. True when anything was
    /// received.
    pub fn assist_once(&self) -> bool {
        self.assist.get().and_then(Weak::upgrade).is_some_and(|a| a.assist(Instant::now() + ASSIST_SLICE))
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.state.lock().reqs.len()
    }

    /// Whether the batch holds no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Declares that request `i` will complete through `chunks` chunks on `transport`.
    pub fn plan(&self, i: usize, chunks: u32, transport: TransportKind) {
        self.plan_each([i], chunks, transport);
    }

    /// [`BatchShared::plan`] for many requests, under one lock.
    pub fn plan_each(&self, indices: impl IntoIterator<Item = usize>, chunks: u32, transport: TransportKind) {
        let mut s = self.state.lock();
        for i in indices {
            s.reqs[i].chunks_left = chunks;
            s.reqs[i].transport = Some(transport);
        }
    }

    /// [`BatchShared::plan`] for runs of requests, `(first, count,
    /// chunks)`: requests `first..first + count` each complete through
    /// `chunks` chunks on `transport`; all under one lock.
    pub fn plan_runs(&self, runs: impl IntoIterator<Item = (usize, u32, u32)>, transport: TransportKind) {
        let mut s = self.state.lock();
        for (first, count, chunks) in runs {
            for r in &mut s.reqs[first..first + count as usize] {
                r.chunks_left = chunks;
                r.transport = Some(transport);
            }
        }
    }

    /// Marks request `i` as started unless the batch, or the request, was
    /// cancelled first; returns false if the request must end `Cancelled`
    /// instead.
    pub fn start(&self, i: usize) -> bool {
        self.start_run(i, 1)
    }

    /// [`BatchShared::start`] for the `n` requests from `i` that move as
    /// one unit (started together, or all cancelled). The unit is refused
    /// when the batch was cancelled or every one of its requests was asked
    /// to cancel; when only some were, it runs (one copy moves them all).
    pub fn start_run(&self, i: usize, n: usize) -> bool {
        let mut s = self.state.lock();
        if s.reqs[i].started {
            return true;
        }
        if s.cancelled || (n > 0 && s.reqs[i..i + n].iter().all(|r| r.cancel_asked)) {
            return false;
        }
        for r in &mut s.reqs[i..i + n] {
            r.started = true;
        }
        true
    }

    /// Records one chunk's outcome for request `i`.
    pub fn complete_chunk(&self, i: usize, out: ChunkOutcome) {
        self.complete_chunks([(i, out)]);
    }

    /// Records the outcome of a run of requests `first..first + count`
    /// that moved as one unit (coalesced: their ranges follow each other on
    /// both sides, so the unit's payload is theirs in order). A WRITE unit
    /// that failed partly sent gives the requests wholly beyond the bytes
    /// that may have reached the peer effect none (nothing of theirs
    /// left); the others get the unit's outcome.
    pub fn complete_run(&self, first: usize, count: usize, out: ChunkOutcome) {
        let Some(reached) = out.reached.filter(|_| out.effect == RemoteEffect::Unknown) else {
            return self.complete_chunks((first..first + count).map(|i| (i, out.clone())));
        };
        let lens: Vec<u64> = {
            let s = self.state.lock();
            (first..first + count).map(|i| s.reqs[i].len).collect()
        };
        let mut at = 0u64;
        let outcomes = lens.into_iter().enumerate().map(|(k, len)| {
            let mut o = out.clone();
            if at >= reached {
                o.effect = RemoteEffect::None;
            }
            at += len;
            (first + k, o)
        });
        self.complete_chunks(outcomes.collect::<Vec<_>>());
    }

    /// Records chunk outcomes of many requests under one lock (the
    /// statistics once per run of alike ends).
    pub fn complete_chunks(&self, outcomes: impl IntoIterator<Item = (usize, ChunkOutcome)>) {
        let mut s = self.state.lock();
        let mut tally = Tally::default();
        let mut hooks = Vec::new();
        for (i, out) in outcomes {
            let r = &mut s.reqs[i];
            if r.done {
                continue;
            }
            match out.effect {
                RemoteEffect::Applied => r.any_applied = true,
                RemoteEffect::Unknown => r.any_unknown = true,
                RemoteEffect::None => {}
            }
            if let Err(e) = out.result {
                if r.error.is_none() {
                    r.error = Some(Box::new(e));
                }
            }
            r.chunks_left = r.chunks_left.saturating_sub(1);
            if r.chunks_left == 0 {
                hooks.extend(self.finish_locked(&mut s, i, &mut tally));
            }
        }
        // Counted before a waiter can see the requests ended.
        tally.record(&self.stats);
        drop(s);
        run(hooks);
    }

    /// Fails request `i` as a whole (its remaining chunks will not run).
    pub fn fail_request(&self, i: usize, e: Error, effect: RemoteEffect) {
        let mut s = self.state.lock();
        let r = &mut s.reqs[i];
        if r.done {
            return;
        }
        if effect == RemoteEffect::Unknown {
            r.any_unknown = true;
        }
        if r.error.is_none() {
            r.error = Some(Box::new(e));
        }
        r.chunks_left = 0;
        let mut tally = Tally::default();
        let hooks = self.finish_locked(&mut s, i, &mut tally);
        tally.record(&self.stats);
        drop(s);
        run(hooks);
    }

    /// Ends request `i`, counting it in `tally` (which the caller records
    /// before it releases the state); when it was the last, returns the end
    /// hooks for the caller to run once it released the state.
    fn finish_locked(&self, s: &mut State, i: usize, tally: &mut Tally) -> Vec<EndHook> {
        let r = &mut s.reqs[i];
        r.done = true;
        let ok = r.error.is_none();
        // Every request is routed (planned) before it can end.
        tally.add(r.transport.unwrap_or(TransportKind::Tcp), ok, r.len);
        s.pending -= 1;
        if !ok {
            s.failed += 1;
        }
        if s.pending == 0 {
            self.requests_ended.store(true, AtomicOrdering::Release);
            self.cv.notify_all();
            return std::mem::take(&mut s.on_end);
        }
        Vec::new()
    }

    /// Whether every request has ended (a notification travelling with
    /// the batch may still be on its way). Takes no lock: the outbox asks
    /// it of every batch submitted to a peer.
    pub fn requests_ended(&self) -> bool {
        self.requests_ended.load(AtomicOrdering::Acquire)
    }

    /// Calls `hook` once every request has ended. False (and `hook`
    /// dropped, not called) when they all ended already.
    pub fn on_end(&self, hook: EndHook) -> bool {
        let mut s = self.state.lock();
        if s.pending == 0 {
            return false;
        }
        s.on_end.push(hook);
        true
    }

    /// A notification travels with this batch: it ends only once
    /// [`BatchShared::notification_done`] reports the outcome.
    pub fn expect_notification(&self) {
        self.state.lock().notification_pending = true;
    }

    /// The notification's outcome; a failure fails the batch
    /// (`TransferFailed`, with the reason in its notes) although each
    /// request keeps its own result.
    pub fn notification_done(&self, outcome: Result<(), Error>) {
        let mut s = self.state.lock();
        if let Err(e) = &outcome {
            s.notes.push(format!("notification: {} ({})", e.message(), e.status()));
        }
        s.notification = Some(outcome);
        s.notification_pending = false;
        self.cv.notify_all();
    }

    /// The outcome of the notification sent with the batch: `None` when
    /// there is none or it is not known yet.
    pub fn notification(&self) -> Option<Result<(), Error>> {
        self.state.lock().notification.clone()
    }

    /// `Ok`, `Pending` or `TransferFailed`.
    pub fn poll(&self) -> Status {
        let s = self.state.lock();
        if s.pending > 0 || s.notification_pending {
            Status::Pending
        } else if s.failed > 0 || matches!(s.notification, Some(Err(_))) {
            Status::TransferFailed
        } else {
            Status::Ok
        }
    }

    /// Waits up to `timeout` for every request to end. A small batch's
    /// waiter first spins briefly (yielding the core), then sleeps.
    pub fn wait(&self, timeout: Duration) -> Status {
        // A batch that ended already (an SHM copy done on the caller) reads
        // no clock.
        if let Some(done) = self.ended_status() {
            return done;
        }
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        // No spin while the host's cores are taken (sync::spin).
        let spin = if spin::allowed() { self.spin.min(timeout) } else { Duration::ZERO };
        let spin_until = start + spin;
        let assist = self.assist.get().and_then(Weak::upgrade);
        while Instant::now() < spin_until {
            if self.ended_status().is_some() {
                break;
            }
            if !assist.as_ref().is_some_and(|a| a.assist(spin_until)) && !spin::yield_now() {
                break;
            }
        }
        // Not spinning (a busy host): answers already waiting are still
        // read here once, rather than after the I/O thread's wake-up.
        let read = spin.is_zero() && assist.as_ref().is_some_and(|a| a.assist(Instant::now() + ASSIST_SLICE));
        drop(assist);
        if let Some(done) = self.ended_status().filter(|_| read) {
            return done;
        }
        let mut s = self.state.lock();
        while s.pending > 0 || s.notification_pending {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut s, d).timed_out() && (s.pending > 0 || s.notification_pending) {
                        return Status::Pending;
                    }
                }
                None => self.cv.wait(&mut s),
            }
        }
        ended(&s).expect("nothing pending")
    }

    /// The batch's final status once nothing is pending (`None` before).
    fn ended_status(&self) -> Option<Status> {
        ended(&self.state.lock())
    }

    /// Per-request outcomes, in input order.
    pub fn results(&self) -> Vec<RequestResult> {
        let s = self.state.lock();
        s.reqs.iter().map(result_of).collect()
    }

    /// The outcome of request `i` (`None`: no such request).
    pub fn result(&self, i: usize) -> Option<RequestResult> {
        self.state.lock().reqs.get(i).map(result_of)
    }

    /// The transport carrying request `i`: `Some(None)` while not yet
    /// routed, `None` when there is no such request.
    pub fn transport(&self, i: usize) -> Option<Option<TransportKind>> {
        self.state.lock().reqs.get(i).map(|r| r.transport)
    }

    /// The failure of request `i`, if it failed.
    pub fn error(&self, i: usize) -> Option<Error> {
        self.state.lock().reqs.get(i).and_then(|r| r.error.as_deref().cloned())
    }

    /// The first failure, by input order.
    pub fn first_error(&self) -> Option<(usize, Error)> {
        let s = self.state.lock();
        s.reqs.iter().enumerate().find_map(|(i, r)| r.error.as_deref().map(|e| (i, e.clone())))
    }

    /// Records a decision about the submission, in words.
    pub fn note(&self, text: String) {
        self.state.lock().notes.push(text);
    }

    /// The decisions recorded about the submission.
    pub fn notes(&self) -> Vec<String> {
        self.state.lock().notes.clone()
    }

    /// Cancels requests that have not started.
    pub fn cancel(&self) {
        self.state.lock().cancelled = true;
    }

    /// Asks request `i` to end `Cancelled` if it has not started; its
    /// siblings are not affected, and a unit that moves it with siblings
    /// not asked runs (see [`BatchShared::start_run`]). False when there
    /// is no request `i`.
    pub fn cancel_request(&self, i: usize) -> bool {
        match self.state.lock().reqs.get_mut(i) {
            Some(r) => {
                r.cancel_asked = true;
                true
            }
            None => false,
        }
    }
}

/// Requests ended under one lock, to be counted in the statistics: runs of
/// alike ends (transport, success), requests and bytes each.
#[derive(Default)]
struct Tally(Vec<(TransportKind, bool, u64, u64)>);

impl Tally {
    fn add(&mut self, t: TransportKind, ok: bool, bytes: u64) {
        match self.0.last_mut() {
            Some((lt, lok, n, b)) if *lt == t && *lok == ok => {
                *n += 1;
                *b += bytes;
            }
            _ => self.0.push((t, ok, 1, bytes)),
        }
    }

    fn record(self, stats: &Counters) {
        for (t, ok, n, bytes) in self.0 {
            stats.record_requests(t, ok, n, bytes);
        }
    }
}

fn run(hooks: Vec<EndHook>) {
    for h in hooks {
        h();
    }
}

fn result_of(r: &ReqState) -> RequestResult {
    if !r.done {
        return RequestResult { status: Status::Pending, remote_effect: RemoteEffect::None };
    }
    match r.error.as_deref() {
        None => RequestResult {
            status: Status::Ok,
            remote_effect: if r.op == Op::Write { RemoteEffect::Applied } else { RemoteEffect::None },
        },
        Some(e) => RequestResult {
            status: e.status(),
            remote_effect: if r.op == Op::Write && (r.any_unknown || r.any_applied) {
                RemoteEffect::Unknown
            } else {
                RemoteEffect::None
            },
        },
    }
}

#[cfg(test)]
#[path = "transfer_tests.rs"]
mod tests;
