//! The connection layer's event loop: a fixed number of I/O threads (config
//! `io_threads`) serve every connection of an engine, whatever the number
//! of peers. Each thread owns an epoll instance (mio, edge-triggered) and
//! the connections assigned to it; a connection is a [`Handler`] that does,
//! without blocking, whatever its socket allows when it is ready or woken,
//! and checks its deadlines and stall bounds when it is ticked.
//!
//! Timers come from the cores: a tick returns the handler's next deadline
//! (its core's `next_deadline()`), and each thread keeps a heap of them
//! and sleeps until the earliest; only handlers that are due are ticked.
//! A handler is also ticked [`TICK`] after each of its turns (a deadline
//! the turn set, a wake-up lost before its registration), and another
//! thread that gives it an earlier deadline says so
//! ([`Registration::schedule`]). An idle engine (no deadline anywhere)
//! takes no lock and wakes no thread.
//!
//! Threads start lazily (an engine without connections runs none) and stop
//! with the engine. A thread whose events come close together (within
//! `io_poll_us`, default 200 us, of its last turn) polls for the next one
//! (yielding its core) for up to that long before it sleeps: on a machine
//! whose idle cores halt, a sleeping thread's wake-up is most of what a
//! small round trip costs, and a ping-pong of small batches keeps its
//! threads awake this way. An idle thread never polls, and one whose
//! events are further apart than the bound sleeps at once (the same
//! trade, and the same 200 us default, as Linux's guest halt-polling).
//!
//! A handler is registered on one I/O thread, which alone runs its event
//! and tick callbacks. Its state is still shared: other threads reach it
//! through the handler's own lock (a TCP requester's waiting submitter
//! reads its answers itself under that lock when the I/O thread is not at
//! it, `transfer::Assist`; the submitting thread writes a small batch's
//! frames), hand it work through its queues, and wake its thread with
//! [`Registration::wake`].

use crate::control::io::TICK;
use crate::error::{Error, Result};
use crate::sync::spin;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a handler wants after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Nothing more until the next event, wake-up or tick.
    Idle,
    /// It stopped with work left (its fair share of the turn is used): run
    /// it again before waiting.
    Again,
    /// The connection is finished: deregister and drop it.
    Done,
}

/// A connection served by the reactor.
pub trait Handler: Send + Sync {
    /// Its socket is ready or it was woken: read and write what can be
    /// done without blocking. `scratch` is the thread's receive buffer.
    fn ready(&self, scratch: &mut [u8]) -> Flow;
    /// Its deadline came (or [`TICK`] passed since its last turn):
    /// deadlines and stall bounds (and anything queued whose wake-up was
    /// lost). Returns what it wants and when it must be ticked next: its
    /// earliest deadline (`None`: none until its next turn or
    /// [`Registration::schedule`]).
    fn tick(&self, now: Instant) -> (Flow, Option<Instant>);
}

/// A connection an I/O thread serves, as its owner sees it.
pub trait Served: Send + Sync {
    /// Whether it has ended.
    fn is_finished(&self) -> bool;
    /// Shuts it down and waits (up to `bound`) until its I/O thread has
    /// let go of everything it held.
    fn stop(&self, bound: std::time::Duration);
}

/// That a connection has ended, for whoever waits for it.
#[derive(Default)]
pub struct Ended {
    flag: Mutex<bool>,
    cv: parking_lot::Condvar,
}

impl Ended {
    /// Marks it ended and wakes the waiters.
    pub fn set(&self) {
        *self.flag.lock() = true;
        self.cv.notify_all();
    }

    /// Whether it has ended.
    pub fn is_set(&self) -> bool {
        *self.flag.lock()
    }

    /// Waits until it has ended, at most `bound`.
    pub fn wait(&self, bound: std::time::Duration) {
        let deadline = Instant::now() + bound;
        let mut f = self.flag.lock();
        while !*f {
            if self.cv.wait_until(&mut f, deadline).timed_out() {
                break;
            }
        }
    }
}

/// The largest receive low-water mark a connection sets while a payload
/// comes in.
pub const LOWAT_MAX: usize = 256 * 1024;

/// Sets the socket's receive low-water mark (`SO_RCVLOWAT`) for a reader
/// that drained it: with `left` payload bytes still to come it is woken
/// only once a good part of them is there (fewer, larger reads); between
/// frames at the first byte. `current` is the mark in force (1 at first).
pub fn set_rcvlowat(fd: RawFd, current: &mut usize, left: Option<u64>) {
    let want = left.map_or(1, |l| l.clamp(1, LOWAT_MAX as u64) as usize);
    if want == *current {
        return;
    }
    let v = want as libc::c_int;
    // SAFETY: setsockopt on a socket the caller owns, with a valid int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        *current = want;
    }
}

/// The I/O threads' receive buffer (one per thread, shared by all of its
/// connections: an idle connection holds none).
pub const SCRATCH: usize = 64 * 1024;

const WAKER: Token = Token(usize::MAX);

/// A served connection: its fd (to deregister), its handler, and when it
/// is due (see [`Due`]).
type Entry = (RawFd, Arc<dyn Handler>, Arc<Due>);

/// When a handler must be ticked next: nanoseconds since its thread's
/// `base` (`u64::MAX`: no deadline). Brought forward by any thread
/// ([`Registration::schedule`]); reset by its I/O thread when it ticks it.
pub struct Due(AtomicU64);

/// No deadline.
const NEVER: u64 = u64::MAX;

/// Live counts, for stats.
#[derive(Default)]
pub struct ReactorCounts {
    /// Turns of the event loops that found something to do.
    pub wakeups: AtomicU64,
    /// Of them, turns whose events came while the thread polled (no sleep,
    /// no wake-up).
    pub polled: AtomicU64,
    /// Handler ticks (a deadline due, or [`TICK`] after a turn).
    pub ticks: AtomicU64,
}

/// An engine's I/O threads.
pub struct Reactor {
    size: usize,
    /// Longest poll before sleeping.
    poll_max: Duration,
    workers: Mutex<Vec<Arc<Worker>>>,
    next: AtomicUsize,
    stopped: AtomicBool,
    counts: Arc<ReactorCounts>,
}

struct Worker {
    registry: mio::Registry,
    waker: Waker,
    /// Connections handed over, not yet in the thread's table.
    added: Mutex<Vec<(Token, Entry)>>,
    /// Connections woken by other threads.
    woken: Mutex<Vec<Token>>,
    /// Connections whose deadline other threads brought forward, and
    /// whether any wait (so that a turn looks only then).
    moved: Mutex<Vec<Token>>,
    any_moved: AtomicBool,
    /// When the thread's sleep ends ([`Due`]'s clock; 0 while it runs):
    /// a deadline brought before it wakes the thread.
    armed: AtomicU64,
    /// The origin of the thread's timers.
    base: Instant,
    stop: AtomicBool,
    conns: AtomicUsize,
    next_token: AtomicUsize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A connection's place on an I/O thread. Dropping it does not deregister
/// the connection (its handler says `Done`).
pub struct Registration {
    worker: Arc<Worker>,
    token: Token,
    due: Arc<Due>,
}

impl Registration {
    /// Runs the connection's handler on its I/O thread soon.
    pub fn wake(&self) {
        self.worker.woken.lock().push(self.token);
        let _ = self.worker.waker.wake();
    }

    /// Ticks the handler at `at` at the latest: from a thread other than
    /// its I/O thread that gave it a deadline (a request written by its
    /// submitter). Costs one atomic operation unless `at` is earlier than
    /// what the handler was due at; wakes the I/O thread only if `at`
    /// comes before the end of its sleep.
    pub fn schedule(&self, at: Instant) {
        let w = &self.worker;
        let t = w.clock(at);
        if self.due.0.fetch_min(t, Ordering::SeqCst) <= t {
            return;
        }
        w.moved.lock().push(self.token);
        w.any_moved.store(true, Ordering::SeqCst);
        if t < w.armed.load(Ordering::SeqCst) {
            let _ = w.waker.wake();
        }
    }
}

impl Reactor {
    /// A reactor of `size` threads (at least one), none started yet, each
    /// polling up to `poll_max` for its next event (see the module).
    pub fn new(size: usize, poll_max: Duration) -> Reactor {
        Reactor {
            size: size.max(1),
            poll_max,
            workers: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            counts: Arc::new(ReactorCounts::default()),
        }
    }

    /// Threads running now.
    pub fn threads(&self) -> usize {
        self.workers.lock().len()
    }

    /// Connections served, per thread.
    pub fn connections(&self) -> Vec<usize> {
        self.workers.lock().iter().map(|w| w.conns.load(Ordering::Relaxed)).collect()
    }

    /// Event-loop turns so far.
    pub fn wakeups(&self) -> u64 {
        self.counts.wakeups.load(Ordering::Relaxed)
    }

    /// Of them, turns whose events came while their thread polled.
    pub fn polled(&self) -> u64 {
        self.counts.polled.load(Ordering::Relaxed)
    }

    /// Handler ticks so far.
    pub fn ticks(&self) -> u64 {
        self.counts.ticks.load(Ordering::Relaxed)
    }

    /// Serves `fd` with `handler` from now on: readable and writable
    /// readiness (edge-triggered) run it. `fd` must stay open until the
    /// handler says `Done`. The least loaded thread takes it (a new one is
    /// started while fewer than `size` run).
    pub fn register(&self, fd: RawFd, handler: Arc<dyn Handler>) -> Result<Registration> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::Unavailable("the engine is shutting down".into()));
        }
        let worker = self.pick()?;
        let token = Token(worker.next_token.fetch_add(1, Ordering::Relaxed));
        let due = Arc::new(Due(AtomicU64::new(NEVER)));
        worker
            .registry
            .register(&mut SourceFd(&fd), token, Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| Error::io("register a connection with the event loop", &e))?;
        {
            // Checked under the lock `stop` empties the list with: a
            // connection is either handed to a running thread or refused.
            let mut added = worker.added.lock();
            if worker.stop.load(Ordering::Acquire) {
                drop(added);
                let _ = worker.registry.deregister(&mut SourceFd(&fd));
                return Err(Error::Unavailable("the engine is shutting down".into()));
            }
            worker.conns.fetch_add(1, Ordering::Relaxed);
            added.push((token, (fd, handler, due.clone())));
        }
        let _ = worker.waker.wake();
        Ok(Registration { worker, token, due })
    }

    fn pick(&self) -> Result<Arc<Worker>> {
        let mut ws = self.workers.lock();
        if ws.len() < self.size {
            let w = Worker::start(ws.len(), self.counts.clone(), self.poll_max)?;
            ws.push(w.clone());
            return Ok(w);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % ws.len();
        let best = (0..ws.len())
            .map(|i| &ws[(start + i) % ws.len()])
            .min_by_key(|w| w.conns.load(Ordering::Relaxed))
            .expect("at least one worker");
        Ok(best.clone())
    }

    /// Stops every thread (connections still registered are dropped
    /// unserved: close them first) and waits for them.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let ws: Vec<Arc<Worker>> = self.workers.lock().drain(..).collect();
        for w in &ws {
            w.stop.store(true, Ordering::Release);
            let _ = w.waker.wake();
        }
        for w in ws {
            let t = w.thread.lock().take();
            if let Some(t) = t {
                if t.thread().id() != std::thread::current().id() {
                    let _ = t.join();
                }
            }
            // Connections handed over after the thread's last turn never
            // reached its table: their handlers hold a Registration, and
            // so this worker, which holds them (a cycle that outlived the
            // engine). Dropped here, outside the lock.
            let unserved = std::mem::take(&mut *w.added.lock());
            w.woken.lock().clear();
            w.moved.lock().clear();
            drop(unserved);
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Worker {
    fn start(index: usize, counts: Arc<ReactorCounts>, poll_max: Duration) -> Result<Arc<Worker>> {
        let poll = Poll::new().map_err(|e| Error::io("create an event loop", &e))?;
        let registry = poll.registry().try_clone().map_err(|e| Error::io("clone the event registry", &e))?;
        let waker = Waker::new(poll.registry(), WAKER).map_err(|e| Error::io("create an event-loop waker", &e))?;
        let w = Arc::new(Worker {
            registry,
            waker,
            added: Mutex::new(Vec::new()),
            woken: Mutex::new(Vec::new()),
            moved: Mutex::new(Vec::new()),
            any_moved: AtomicBool::new(false),
            armed: AtomicU64::new(NEVER),
            base: Instant::now(),
            stop: AtomicBool::new(false),
            conns: AtomicUsize::new(0),
            next_token: AtomicUsize::new(0),
            thread: Mutex::new(None),
        });
        let me = w.clone();
        let t = std::thread::Builder::new()
            .name(format!("orbite-io-{index}"))
            .spawn(move || me.run(poll, counts, poll_max))
            .map_err(|e| Error::io("spawn an I/O thread", &e))?;
        *w.thread.lock() = Some(t);
        Ok(w)
    }

    /// `at` on the thread's timer clock (nanoseconds since `base`).
    fn clock(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.base).as_nanos() as u64).min(NEVER - 1)
    }

    fn run(&self, mut poll: Poll, counts: Arc<ReactorCounts>, poll_max: Duration) {
        let mut table: HashMap<Token, Slot> = HashMap::new();
        let mut timers = Timers::default();
        let mut events = Events::with_capacity(256);
        let mut scratch = vec![0u8; SCRATCH];
        let mut again: Vec<Token> = Vec::new();
        // When the last turn ended, and until when to poll after it.
        let mut idle_since = Instant::now();
        let mut poll_until = idle_since;
        while !self.stop.load(Ordering::Acquire) {
            // The end of the sleep is published before the deadlines other
            // threads brought forward are taken: one brought after this
            // look wakes the thread if it comes before that end.
            let next = timers.next();
            self.armed.store(next, Ordering::SeqCst);
            if self.any_moved.swap(false, Ordering::SeqCst) {
                let moved = std::mem::take(&mut *self.moved.lock());
                for t in moved {
                    if let Some(slot) = table.get_mut(&t) {
                        timers.follow(t, slot);
                    }
                }
                continue;
            }
            let now = Instant::now();
            let polling = now < poll_until;
            let timeout = if !again.is_empty() || polling {
                Some(Duration::ZERO)
            } else {
                (next != NEVER).then(|| self.instant(next).saturating_duration_since(now))
            };
            let r = poll.poll(&mut events, timeout);
            self.armed.store(0, Ordering::SeqCst);
            if let Err(e) = r {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    std::thread::sleep(TICK);
                }
                continue;
            }
            let quiet = events.is_empty() && again.is_empty();
            if quiet && polling && timers.next() > self.clock(Instant::now()) {
                if !spin::yield_now() {
                    // The core is shared (the yield came back late): sleep
                    // until the next event, as a sleeper is woken first.
                    poll_until = Instant::now();
                }
                continue;
            }
            // Poll after this turn if its events came within the bound of
            // the last turn, and spinning pays on this host now.
            let close = !events.is_empty()
                && Instant::now().saturating_duration_since(idle_since) <= poll_max
                && spin::allowed();
            if polling && !events.is_empty() {
                counts.polled.fetch_add(1, Ordering::Relaxed);
            }
            counts.wakeups.fetch_add(1, Ordering::Relaxed);
            for (t, (fd, h, due)) in self.added.lock().drain(..) {
                table.insert(t, Slot { fd, h, due, queued: NEVER });
                // Anything that arrived before it was in the table.
                again.push(t);
            }
            let mut run: Vec<Token> = std::mem::take(&mut again);
            for ev in events.iter() {
                if ev.token() == WAKER {
                    run.append(&mut self.woken.lock());
                } else {
                    run.push(ev.token());
                }
            }
            run.sort_unstable();
            run.dedup();
            let check = self.clock(Instant::now() + TICK);
            for t in run {
                let Some(slot) = table.get_mut(&t) else { continue };
                match slot.h.ready(&mut scratch) {
                    Flow::Idle => {}
                    Flow::Again => again.push(t),
                    Flow::Done => {
                        self.remove(&mut table, t);
                        continue;
                    }
                }
                // Ticked a while after its turn: a deadline the turn set.
                slot.due.0.fetch_min(check, Ordering::SeqCst);
                timers.follow(t, slot);
            }
            let now = Instant::now();
            if !events.is_empty() {
                idle_since = now;
                poll_until = if close { now + poll_max } else { now };
            }
            let at = self.clock(now);
            while let Some((t, slot)) = timers.due(at, &mut table) {
                // Reset before the tick: a deadline brought forward from
                // now on is seen (and one before, the tick sees).
                slot.due.0.store(NEVER, Ordering::SeqCst);
                counts.ticks.fetch_add(1, Ordering::Relaxed);
                let (flow, next) = slot.h.tick(now);
                match flow {
                    Flow::Done => {
                        self.remove(&mut table, t);
                        continue;
                    }
                    Flow::Again => again.push(t),
                    Flow::Idle => {}
                }
                if let Some(n) = next {
                    slot.due.0.fetch_min(self.clock(n), Ordering::SeqCst);
                }
                timers.follow(t, slot);
            }
        }
    }

    /// The instant `t` of the thread's timer clock.
    fn instant(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    /// Forgets a finished connection and takes its fd out of the epoll
    /// set (the fd is still open: the handler, which owns it, is alive
    /// until the table's reference goes here).
    fn remove(&self, table: &mut HashMap<Token, Slot>, t: Token) {
        if let Some(slot) = table.remove(&t) {
            let _ = self.registry.deregister(&mut SourceFd(&slot.fd));
            self.conns.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        }
    }
}

/// A connection in its I/O thread's table.
struct Slot {
    fd: RawFd,
    h: Arc<dyn Handler>,
    due: Arc<Due>,
    /// The time of its entry in the heap ([`NEVER`]: none).
    queued: u64,
}

/// An I/O thread's timers: a heap of (when, connection), at most one live
/// entry per connection (the earliest; an entry whose connection was
/// queued again earlier, or has gone, is skipped when it comes).
#[derive(Default)]
struct Timers(BinaryHeap<Reverse<(u64, Token)>>);

impl Timers {
    /// When the earliest entry comes ([`NEVER`]: none).
    fn next(&self) -> u64 {
        self.0.peek().map_or(NEVER, |Reverse((t, _))| *t)
    }

    /// Queues connection `t` for when it is due, if that is earlier than
    /// its entry.
    fn follow(&mut self, t: Token, slot: &mut Slot) {
        let due = slot.due.0.load(Ordering::SeqCst);
        if due < slot.queued {
            self.0.push(Reverse((due, t)));
            slot.queued = due;
        }
    }

    /// The next connection due at `now`: its entry taken; one whose
    /// deadline moved later is queued again for it (no tick, no lock).
    fn due<'a>(&mut self, now: u64, table: &'a mut HashMap<Token, Slot>) -> Option<(Token, &'a mut Slot)> {
        loop {
            let &Reverse((at, t)) = self.0.peek()?;
            if at > now {
                return None;
            }
            self.0.pop();
            let Some(slot) = table.get_mut(&t) else { continue };
            if slot.queued != at {
                continue;
            }
            slot.queued = NEVER;
            if slot.due.0.load(Ordering::SeqCst) > now {
                self.follow(t, slot);
                continue;
            }
            // The borrow checker wants the slot looked up once more.
            return table.get_mut(&t).map(|s| (t, s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// A handler that keeps its own registration, as connections do.
    struct Holder(Mutex<Option<Registration>>);

    impl Handler for Holder {
        fn ready(&self, _: &mut [u8]) -> Flow {
            Flow::Idle
        }
        fn tick(&self, _: Instant) -> (Flow, Option<Instant>) {
            (Flow::Idle, None)
        }
    }

    /// A connection handed to a thread after its last turn (the engine
    /// connected and closed at once) never reached the thread's table:
    /// `stop` drops it, so the handler and the worker it holds do not keep
    /// each other alive past the engine. Guards `stop`'s emptying of
    /// `added` (without it the handler is still held: a leak LSan found in
    /// the C tests, 4 runs in 100).
    #[test]
    fn a_connection_handed_over_as_its_thread_stops_is_dropped_with_it() {
        let r = Reactor::new(1, Duration::ZERO);
        let (a, _b) = UnixStream::pair().unwrap();
        let first = Arc::new(Holder(Mutex::new(None)));
        let reg = r.register(a.as_raw_fd(), first.clone()).unwrap();
        *first.0.lock() = Some(reg);
        // The thread takes its last turn and ends, as at an engine's close.
        let w = r.workers.lock()[0].clone();
        w.stop.store(true, Ordering::Release);
        let _ = w.waker.wake();
        let t = w.thread.lock().take().unwrap();
        t.join().unwrap();
        // A late hand-over: the entry lands in `added` with no thread left.
        let (c, _d) = UnixStream::pair().unwrap();
        let due = Arc::new(Due(AtomicU64::new(NEVER)));
        let reg = Registration { worker: w.clone(), token: Token(99), due: due.clone() };
        let late = Arc::new(Holder(Mutex::new(Some(reg))));
        w.added.lock().push((Token(99), (c.as_raw_fd(), late.clone() as Arc<dyn Handler>, due)));
        drop(w);
        r.stop();
        assert_eq!(Arc::strong_count(&late), 1, "the unserved handler outlived the reactor");
        drop(first.0.lock().take());
    }

    /// A stopped reactor registers nothing: refused UNAVAILABLE, no thread
    /// started. Without the check a fresh I/O thread no `stop` would end
    /// serves the connection. A unit test: the engine stops its reactor
    /// after its listeners and connections, so no caller reaches a stopped
    /// one deterministically. Guards `register`'s
    /// `if self.stopped.load(Ordering::Acquire)`.
    #[test]
    fn a_stopped_reactor_registers_nothing() {
        let r = Reactor::new(1, Duration::ZERO);
        let (a, _b) = UnixStream::pair().unwrap();
        r.register(a.as_raw_fd(), Arc::new(Holder(Mutex::new(None)))).unwrap();
        assert_eq!(r.threads(), 1);
        r.stop();
        assert_eq!(r.threads(), 0);
        let (c, _d) = UnixStream::pair().unwrap();
        let late = Arc::new(Holder(Mutex::new(None)));
        let e = r.register(c.as_raw_fd(), late.clone()).map(|_| ()).unwrap_err();
        assert_eq!(e.status(), crate::Status::Unavailable, "{e}");
        assert_eq!((r.threads(), Arc::strong_count(&late)), (0, 1), "a stopped reactor took the connection");
    }

    /// A handler that counts its ticks, each reported on `tx`, and asks
    /// (once) to be ticked next at `next`.
    struct Ticker {
        ticks: AtomicU64,
        next: Mutex<Option<Instant>>,
        tx: Mutex<std::sync::mpsc::Sender<u64>>,
    }

    impl Handler for Ticker {
        fn ready(&self, _: &mut [u8]) -> Flow {
            Flow::Idle
        }
        fn tick(&self, _: Instant) -> (Flow, Option<Instant>) {
            let n = self.ticks.fetch_add(1, Ordering::Relaxed) + 1;
            let _ = self.tx.lock().send(n);
            (Flow::Idle, self.next.lock().take())
        }
    }

    /// Only due handlers are ticked: after its first turn's check, a
    /// handler with no deadline is not ticked again (it was every 50 ms);
    /// another thread's deadline wakes the sleeping thread for it
    /// (guards `schedule`'s wake: without it the thread sleeps on); the
    /// deadline a tick returns brings the next tick, and nothing after.
    #[test]
    fn only_due_handlers_are_ticked() {
        use std::sync::mpsc::RecvTimeoutError::Timeout;
        let r = Reactor::new(1, Duration::ZERO);
        let (a, _b) = UnixStream::pair().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = Arc::new(Ticker { ticks: AtomicU64::new(0), next: Mutex::new(None), tx: Mutex::new(tx) });
        let reg = r.register(a.as_raw_fd(), h.clone()).unwrap();
        let long = Duration::from_secs(30);
        assert_eq!(rx.recv_timeout(long), Ok(1), "the check after its first turn");
        assert_eq!(rx.recv_timeout(Duration::from_millis(300)), Err(Timeout), "ticked with nothing due");
        *h.next.lock() = Some(Instant::now() + Duration::from_millis(20));
        reg.schedule(Instant::now());
        assert_eq!(rx.recv_timeout(long), Ok(2), "the deadline another thread gave");
        assert_eq!(rx.recv_timeout(long), Ok(3), "the deadline its tick returned");
        assert_eq!(rx.recv_timeout(Duration::from_millis(300)), Err(Timeout), "ticked with nothing due");
        assert_eq!(r.ticks(), 3);
        r.stop();
    }
}
