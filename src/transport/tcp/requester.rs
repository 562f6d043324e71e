//! Requester side of a TCP peer connection: the driver of
//! [`super::proto::requester::RequesterCore`], served by the engine's I/O
//! threads ([`crate::transport::reactor`]), with no thread of its own. One
//! lock guards the core; under it the driver does only non-blocking socket
//! I/O — frames leave from the submitting thread when nothing waits before
//! them (one wake-up less; a submitter never waits for the lock: while
//! another thread holds it, that thread takes the chunks over and writes
//! them before it lets go) and otherwise from the I/O thread as the socket
//! takes them; answers are read as they arrive, READ payload straight into
//! local registered memory, by the I/O thread or by a small batch's waiter
//! or poller that reads them itself ([`Assist`]). What the core
//! reports — completions, notification verdicts, a `Revoke`, a fresh
//! Describe — is acted on only once the lock is released, so a batch's end
//! hook may queue more on this very connection.

pub use super::chunk::{Chunk, Chunks, Record};

mod sides;
use super::proto::requester::{Event, RequesterCore};
use super::pump::{self, Received, Socket};
use crate::control::io;
use crate::control::message::Describe;
use crate::control::region_index::{PublishedDescribe, RegionIndex};
use crate::control::wire::Wire;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::memory::RegionLease;
use crate::sync::admission::Gate;
use crate::sync::snapshot::Snapshot;
use crate::transfer::{Assist, ChunkOutcome};
use crate::transport::reactor::{Ended, Flow, Handler, Reactor, Registration, SCRATCH};
use parking_lot::{Condvar, Mutex, MutexGuard};
use sides::{In, Out};
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Called with a notification's outcome, and whether its frame may have
/// reached the peer.
pub type NotifyAnswer = Box<dyn FnOnce(Result<()>, bool) + std::marker::Send>;

/// What a requester does when its source revokes its imports.
pub type RevokeHook = Box<dyn Fn() + std::marker::Send + Sync>;

type Core = RequesterCore<Record, Arc<RegionLease>, NotifyAnswer>;

/// The connection's state behind its one lock.
struct Conn {
    core: Core,
    /// How the bytes travel (sealed with a key).
    wire: Wire,
    /// The socket's receive low-water mark now (`SO_RCVLOWAT`).
    lowat: usize,
    /// The peer is gone for good (discovery): this reason replaces a lost
    /// connection's.
    retired: Option<Error>,
    /// The Describe generation, the end and the retirement last published
    /// ([`TcpConnection::publish`]).
    published: (u64, bool, bool),
    /// A send failed: the connection ends with this once what the socket
    /// already holds was read (the peer may have said why, in an Error
    /// frame that would be lost if the send's error ended it first).
    lost: Option<Error>,
}

impl Conn {
    /// Why the connection ended (the peer retired, or the connection
    /// lost); `None` while it lives.
    fn ended(&self) -> Option<Error> {
        self.retired.clone().or_else(|| self.core.dead().cloned())
    }
}

/// What the core reported, to act on once the lock is released.
type Outputs = (Vec<(Record, ChunkOutcome)>, Vec<Event<NotifyAnswer>>);

/// Most bytes one connection reads, or writes, in one turn of its I/O
/// thread before the others get theirs.
const TURN_BYTES: u64 = 4 << 20;

/// Most bytes a spinning waiter reads for a connection in one go (the I/O
/// thread takes over beyond).
const ASSIST_BYTES: u64 = 256 * 1024;

/// How far one attempt to write got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// All of it.
    Complete,
    /// The socket is full: the writable edge resumes it.
    Blocked,
    /// This turn's share is used: more is possible at once.
    Budget,
    /// The send failed: the connection ends once what was received is read.
    Lost,
}

/// A requester's connection to one peer.
pub struct TcpConnection {
    stream: TcpStream,
    state: Mutex<Conn>,
    /// Waiters for a fresh Describe wait on the state's lock.
    describe_cv: Condvar,
    /// The peer's latest Describe with its region index (built once per
    /// Describe) while the connection lives, else why it ended: swapped
    /// under the state's lock whenever either changes, read with no lock
    /// (a submission plans from it while an I/O turn holds the connection).
    snapshot: Arc<PublishedDescribe>,
    reg: once_cell::sync::OnceCell<Registration>,
    /// Set once the connection has ended and everything left was failed.
    finished: Ended,
    stats: Arc<Counters>,
    gate: Arc<Gate>,
    /// Called, with no lock of the connection held, when the source asks
    /// for its imports back (`Revoke`); it must not block.
    on_revoke: RevokeHook,
    /// The engine's log lines (the connection lost).
    log: Arc<crate::log::Logger>,
    /// This engine is closing the connection (not a loss to log).
    closing: AtomicBool,
    /// Chunks a submitter handed over because another thread held the
    /// state's lock (a submitter never waits for an I/O turn): whoever
    /// holds the lock queues them before it lets go ([`Self::unlock`]).
    handoff: Mutex<Vec<Chunks>>,
    /// `handoff` may hold chunks: looked at after each release of the lock.
    handed: AtomicBool,
    /// Peer label for messages.
    pub label: String,
    /// Test-only switch: the past race back on (what the core reported is
    /// delivered before the lock is released).
    #[cfg(test)]
    deliver_under_lock: AtomicBool,
}

thread_local! {
    /// A waiting thread's receive buffer, for [`TcpConnection::assist`].
    static ASSIST_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl TcpConnection {
    /// Wraps a connected, handshaken stream (and how its bytes travel)
    /// and hands it to `reactor`.
    pub fn start(
        (stream, wire): (TcpStream, Wire),
        peer: Describe,
        label: String,
        stats: Arc<Counters>,
        on_revoke: RevokeHook,
        reactor: &Reactor,
        log: Arc<crate::log::Logger>,
    ) -> Result<Arc<TcpConnection>> {
        stream.set_nonblocking(true).map_err(|x| Error::io("set_nonblocking", &x))?;
        let _ = stream.set_nodelay(true);
        let core = RequesterCore::new(label.clone(), peer);
        let (describe, generation) = core.describe();
        let conn = Arc::new(TcpConnection {
            stream,
            state: Mutex::new(Conn {
                core,
                wire,
                lowat: 1,
                retired: None,
                published: (generation, false, false),
                lost: None,
            }),
            describe_cv: Condvar::new(),
            snapshot: Arc::new(Snapshot::new(Ok(RegionIndex::new(describe)))),
            reg: once_cell::sync::OnceCell::new(),
            finished: Ended::default(),
            stats,
            gate: Gate::new("connection"),
            on_revoke,
            log,
            closing: AtomicBool::new(false),
            handoff: Mutex::new(Vec::new()),
            handed: AtomicBool::new(false),
            label,
            #[cfg(test)]
            deliver_under_lock: AtomicBool::new(false),
        });
        let reg = reactor.register(conn.stream.as_raw_fd(), conn.clone())?;
        let _ = conn.reg.set(reg);
        Ok(conn)
    }

    /// The error that killed the connection, if it is dead.
    pub fn dead_reason(&self) -> Option<Error> {
        let c = self.state.lock();
        let e = c.ended();
        self.unlock(c);
        e
    }

    /// The peer's latest Describe.
    pub fn describe(&self) -> Arc<Describe> {
        let c = self.state.lock();
        let d = c.core.describe().0;
        self.unlock(c);
        d
    }

    /// The peer's latest Describe with its region index while the
    /// connection lives, else why it ended (as
    /// [`dead_reason`](Self::dead_reason)): what every submission asks
    /// first, read from the published snapshot with no lock. The same
    /// version (one `Arc`) until the peer sends a new Describe or the
    /// connection ends.
    pub fn describe_live(&self) -> Arc<Result<RegionIndex>> {
        self.snapshot.load()
    }

    /// The cell [`describe_live`](Self::describe_live) reads, for whoever
    /// plans submissions to this peer without entering the connection.
    pub fn published(&self) -> Arc<PublishedDescribe> {
        self.snapshot.clone()
    }

    /// Asks the peer for a fresh Describe and waits for it until `deadline`.
    pub fn refresh_describe(&self, deadline: Instant) -> Result<Arc<Describe>> {
        let mut c = self.state.lock();
        let r = self.await_describe(&mut c, deadline);
        self.unlock(c);
        r
    }

    /// [`Self::refresh_describe`] under the lock (released while it
    /// waits; chunks handed over meanwhile go out on the I/O thread's
    /// turn, which their submitter woke).
    fn await_describe(&self, c: &mut MutexGuard<'_, Conn>, deadline: Instant) -> Result<Arc<Describe>> {
        let gen = c.core.describe().1;
        c.core.request_describe()?;
        self.wake();
        while c.core.describe().1 == gen {
            if let Some(e) = c.retired.clone().or_else(|| c.core.dead().cloned()) {
                return Err(e);
            }
            if self.describe_cv.wait_until(c, deadline).timed_out() && c.core.describe().1 == gen {
                return Err(Error::TimedOut(format!("{} did not answer a Describe request", self.label)));
            }
        }
        Ok(c.core.describe().0)
    }

    fn wake(&self) {
        if let Some(r) = self.reg.get() {
            r.wake();
        }
    }

    /// Queues chunks for sending (failed at once if the connection is
    /// dead). When nothing waits before them and they are a small batch,
    /// the calling thread writes them itself (no wake-up of another
    /// thread); what the socket does not take, the I/O thread writes when
    /// it drains. Never waits for the connection's lock: while another
    /// thread holds it (an I/O turn, a poller reading answers), the chunks
    /// are handed over to that thread, which queues and writes them before
    /// it lets go.
    pub fn enqueue(&self, chunks: impl Into<Chunks>) {
        let chunks = chunks.into();
        if chunks.is_empty() {
            return;
        }
        let (mut c, own) = match self.state.try_lock() {
            Some(c) => (c, Some(chunks)),
            None => {
                self.handoff.lock().push(chunks);
                self.handed.store(true, Ordering::SeqCst);
                // Either the holder sees `handed` once it let go, or this
                // sees the lock free (both sides fence).
                fence(Ordering::SeqCst);
                match self.state.try_lock() {
                    Some(c) => (c, None),
                    None => {
                        // A holder that waits on a condition (a Describe)
                        // lets go without looking: its I/O turn takes them.
                        self.wake();
                        return;
                    }
                }
            }
        };
        // Anything handed over goes first (one thread's chunks leave in
        // its order), then these.
        let handed = self.take_handed(&mut c);
        let at_once = own.is_none_or(|chunks| c.core.submit(chunks)) && handed != Some(false);
        self.release(c, Some(at_once));
    }

    /// Moves the chunks handed over into the core, in their order; `None`
    /// when there were none, else whether they may be written at once.
    fn take_handed(&self, c: &mut Conn) -> Option<bool> {
        if !self.handed.swap(false, Ordering::SeqCst) {
            return None;
        }
        let handed = std::mem::take(&mut *self.handoff.lock());
        let mut at_once = true;
        for chunks in handed {
            at_once &= c.core.submit(chunks);
        }
        Some(at_once)
    }

    /// Queues a notification's frame (built by `body` from its tag) behind
    /// what is queued already; `answer` gets the peer's verdict, or the
    /// connection's error. Never blocks.
    pub fn send_notify(&self, body: impl FnOnce(u64) -> Vec<u8>, deadline: Instant, answer: NotifyAnswer) {
        let mut c = self.state.lock();
        // Behind the chunks handed over before it.
        self.take_handed(&mut c);
        c.core.notify(body, deadline, answer);
        self.unlock(c);
        self.wake();
    }

    /// The gate every chunk of this connection holds until it completes.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Fences new chunks and waits until every chunk completed or
    /// `deadline`; true when drained.
    pub fn drain(&self, deadline: Instant) -> bool {
        self.gate.close_and_wait(deadline) == 0
    }

    /// Chunks queued or awaiting a response.
    pub fn outstanding(&self) -> usize {
        let mut c = self.state.lock();
        self.take_handed(&mut c);
        let n = c.core.outstanding();
        self.unlock(c);
        n
    }

    /// Kills the connection with `e` (the first reason stays): everything
    /// in flight fails, the socket is shut, and the I/O thread lets go.
    pub fn kill(&self, e: Error) {
        let mut c = self.state.lock();
        self.end(&mut c, e);
        self.unlock(c);
        self.finished.set();
        self.wake();
    }

    /// The peer is gone for good (discovery saw its name vanish or pass to
    /// another epoch): `e` becomes the reason, replacing a lost
    /// connection's, and the connection is killed if it was not already.
    pub fn retire(&self, e: Error) {
        // Under one lock with the end, so that the published end is this
        // reason from the first.
        let mut c = self.state.lock();
        c.retired = Some(e.clone());
        self.end(&mut c, e);
        self.unlock(c);
        self.finished.set();
        self.wake();
    }

    /// Orderly close: Goodbye (when nothing is half written), then the
    /// end; returns once everything left has been failed.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let mut c = self.state.lock();
        if let Some(bye) = c.core.goodbye() {
            let _ = io::send_parts_from(&self.stream, &[&bye], 0);
        }
        self.end(&mut c, Error::Unavailable(format!("connection to {} was closed by this engine", self.label)));
        self.unlock(c);
        self.finished.set();
        self.wake();
    }

    /// The connection is over (`e` says why): a protocol error is told to
    /// the peer when nothing is half written, the core fails everything
    /// left, the socket is shut. What that ends is delivered by
    /// [`TcpConnection::unlock`].
    fn end(&self, c: &mut Conn, e: Error) {
        if c.core.dead().is_none() {
            if let Some(f) = c.core.protocol_error_frame(&e) {
                let _ = io::send_parts_from(&self.stream, &[&f], 0);
            }
            if !self.closing.load(Ordering::Acquire) {
                self.log.warn(format_args!("{}: connection lost: {e}", self.label));
            }
        }
        c.core.kill(e, Instant::now());
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Releases the connection's lock, then acts on what the core
    /// reported. The only way anything reported is delivered: an end hook,
    /// a notification's verdict or a `Revoke` hook never runs under the
    /// lock, so it may use this connection.
    ///
    /// Chunks handed over while the lock was held are queued first, and
    /// once it is released, chunks handed over meanwhile are taken (the
    /// lock again, if free) and written as [`Self::enqueue`] would.
    fn unlock(&self, c: MutexGuard<'_, Conn>) {
        self.release(c, None);
    }

    /// [`Self::unlock`], `queued` saying whether chunks were just queued
    /// and may be written at once (a small batch with nothing before it):
    /// those, and any handed over, are written first as far as the socket
    /// takes them; the rest is left to the I/O thread (woken, and ticked by
    /// the earliest deadline queued: it may not be woken for them).
    fn release<'a>(&'a self, mut c: MutexGuard<'a, Conn>, mut queued: Option<bool>) {
        loop {
            if let Some(handed) = self.take_handed(&mut c) {
                queued = Some(handed && queued != Some(false));
            }
            let (due, sent) = match queued.take() {
                None => (None, Sent::Complete),
                Some(at_once) => (
                    c.core.queued_due(),
                    if at_once { self.write_out(&mut c, u64::MAX, Instant::now()) } else { Sent::Blocked },
                ),
            };
            self.publish(&mut c);
            let out = self.outputs(&mut c);
            #[cfg(test)]
            if self.deliver_under_lock.load(Ordering::Relaxed) {
                self.deliver(out);
                drop(c);
                return;
            }
            drop(c);
            self.deliver(out);
            if let (Some(at), Some(r)) = (due, self.reg.get()) {
                r.schedule(at);
            }
            if sent != Sent::Complete {
                self.wake();
            }
            // Chunks handed over while this thread held the lock: taken
            // now, unless another thread holds it again (it looks then).
            fence(Ordering::SeqCst);
            if !self.handed.load(Ordering::SeqCst) {
                return;
            }
            match self.state.try_lock() {
                Some(again) => c = again,
                None => return,
            }
        }
    }

    /// Publishes the peer's Describe with its region index, or why the
    /// connection ended, when either changed since last published; under
    /// the state's lock, before it is released, so a submission that reads
    /// the snapshot after any call that changed them sees the change.
    fn publish(&self, c: &mut Conn) {
        let (describe, generation) = c.core.describe();
        let now = (generation, c.core.dead().is_some(), c.retired.is_some());
        if c.published == now {
            return;
        }
        c.published = now;
        self.snapshot.set(match c.ended() {
            Some(e) => Err(e),
            None => Ok(RegionIndex::new(describe)),
        });
    }

    /// Takes what the core reported (and folds its counts into the stats).
    fn outputs(&self, c: &mut Conn) -> Outputs {
        self.stats.events.answers_dropped.fetch_add(std::mem::take(&mut c.core.dropped), Ordering::Relaxed);
        self.stats.notifications.sent.fetch_add(std::mem::take(&mut c.core.notes_sent), Ordering::Relaxed);
        (c.core.take_done(), c.core.take_events())
    }

    /// Acts on what the core reported, with no lock of this connection held.
    fn deliver(&self, (done, events): Outputs) {
        for (r, outcome) in done {
            r.finish(outcome);
        }
        for ev in events {
            match ev {
                Event::Revoke => (self.on_revoke)(),
                // A fresh Describe, or the end with one still awaited: its
                // waiters look again (and find the end's reason).
                Event::Described | Event::DescribeLost => {
                    self.describe_cv.notify_all();
                }
                Event::NotifyAnswer(answer, r, written) => answer(r, written),
            }
        }
    }

    /// Writes what the core offers, as far as the socket takes it and at
    /// most `budget` bytes ([`pump::write_out`]). A failed send ends the
    /// connection.
    fn write_out(&self, c: &mut Conn, budget: u64, now: Instant) -> Sent {
        if c.lost.is_some() {
            return Sent::Lost;
        }
        let Conn { core, wire, lowat, .. } = c;
        let mut pipe = Socket { stream: &self.stream, lowat };
        match pump::write_out(&mut pipe, wire, &mut Out { core, stats: &self.stats, now }, budget) {
            Ok(pump::Sent::Complete | pump::Sent::Closed) => Sent::Complete,
            Ok(pump::Sent::Blocked) => Sent::Blocked,
            Ok(pump::Sent::Budget) => Sent::Budget,
            Err(e) if e.kind() == ErrorKind::WriteZero => {
                Self::lost(c, Error::Unavailable("connection closed while sending".into()))
            }
            Err(e) => Self::lost(c, Error::Unavailable(format!("connection lost: {e}"))),
        }
    }

    /// A send failed with `e`: nothing more is sent, and the I/O thread's
    /// next turn reads what the socket holds before the connection ends.
    fn lost(c: &mut Conn, e: Error) -> Sent {
        c.lost.get_or_insert(e);
        Sent::Lost
    }

    /// The receive turn ([`pump::receive`]): reads what the socket holds
    /// (READ payloads that are still large go straight into local memory;
    /// the rest through the thread's buffer), at most `budget` bytes (what
    /// it read is taken off) and no more after `until` (`Flow::Again`
    /// then). `Ok(None)` when the peer ended the connection in order.
    fn receive(
        &self,
        c: &mut Conn,
        scratch: &mut [u8],
        budget: &mut u64,
        until: Option<Instant>,
    ) -> Result<Option<Flow>> {
        let Conn { core, wire, lowat, .. } = c;
        let mut pipe = Socket { stream: &self.stream, lowat };
        Ok(match pump::receive(&mut pipe, wire, &mut In { core }, scratch, budget, until)? {
            Received::Drained => Some(Flow::Idle),
            Received::More => Some(Flow::Again),
            Received::Closed => None,
        })
    }

    /// The peer ended the connection in order.
    fn closed_by_peer(&self) -> Error {
        Error::Unavailable(format!("{} closed the connection", self.label))
    }

    /// One turn of the I/O thread under the lock: writes, then reads.
    fn turn(&self, c: &mut Conn, scratch: &mut [u8]) -> Flow {
        if let Some(e) = c.core.dead().cloned() {
            self.end(c, e);
            return Flow::Done;
        }
        let sent = self.write_out(c, TURN_BYTES, Instant::now());
        let mut budget = TURN_BYTES;
        let got = match self.receive(c, scratch, &mut budget, None) {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.end(c, self.closed_by_peer());
                return Flow::Done;
            }
            Err(e) => {
                self.end(c, e);
                return Flow::Done;
            }
        };
        // What was received was read: a failed send ends the connection
        // now (unless what was read ended it first, with its own reason).
        if let Some(e) = c.lost.take() {
            c.core.send_failed(e, Instant::now());
        }
        if let Some(e) = c.core.dead().cloned() {
            self.end(c, e);
            return Flow::Done;
        }
        if sent == Sent::Budget || got == Flow::Again {
            Flow::Again
        } else {
            Flow::Idle
        }
    }
}

impl Assist for TcpConnection {
    /// A batch's waiter reads the answers itself while the I/O thread is
    /// not reading them: they land without that thread's wake-up. Anything
    /// beyond the fast path (a dead connection, an end, more than
    /// [`ASSIST_BYTES`] waiting, or bytes still there at `until`) is left
    /// to the I/O thread, which is woken.
    fn assist(&self, until: Instant) -> bool {
        let Some(mut c) = self.state.try_lock() else { return false };
        if self.finished.is_set() || c.core.dead().is_some() {
            self.unlock(c);
            return false;
        }
        // No buffer (the thread is ending and its locals are gone, or it is
        // in use further up this thread's stack): no help.
        let Ok(Some(got)) = ASSIST_SCRATCH.try_with(|cell| {
            let mut scratch = cell.try_borrow_mut().ok()?;
            if scratch.len() < SCRATCH {
                scratch.resize(SCRATCH, 0);
            }
            let mut budget = ASSIST_BYTES;
            let got = self.receive(&mut c, &mut scratch, &mut budget, Some(until));
            Some((got, budget < ASSIST_BYTES))
        }) else {
            self.unlock(c);
            return false;
        };
        let end = match got {
            (Ok(Some(Flow::Idle)), progress) => {
                self.unlock(c);
                return progress;
            }
            (Ok(Some(_)), _) => None,
            (Ok(None), _) => Some(self.closed_by_peer()),
            (Err(e), _) => Some(e),
        };
        let ended = end.is_some();
        if let Some(e) = end {
            self.end(&mut c, e);
        }
        self.unlock(c);
        if ended {
            self.finished.set();
        }
        self.wake();
        true
    }
}

impl Handler for TcpConnection {
    fn ready(&self, scratch: &mut [u8]) -> Flow {
        let c: MutexGuard<'_, Conn> = self.state.lock();
        if self.finished.is_set() {
            self.unlock(c);
            return Flow::Done;
        }
        let mut c = c;
        let flow = self.turn(&mut c, scratch);
        self.unlock(c);
        if flow == Flow::Done {
            self.finished.set();
        }
        flow
    }

    fn tick(&self, now: Instant) -> (Flow, Option<Instant>) {
        let mut c = self.state.lock();
        if self.finished.is_set() {
            self.unlock(c);
            return (Flow::Done, None);
        }
        let flow = match c.core.expire(now) {
            Err(e) => {
                self.end(&mut c, e);
                Flow::Done
            }
            // Frames queued by a thread whose wake-up came before this
            // connection's registration was set still leave.
            Ok(()) if c.core.wants_send() => {
                let sent = self.write_out(&mut c, TURN_BYTES, now);
                match c.core.dead().cloned() {
                    Some(e) => {
                        self.end(&mut c, e);
                        Flow::Done
                    }
                    // A failed send ends it in a turn, after its reads.
                    None if matches!(sent, Sent::Budget | Sent::Lost) => Flow::Again,
                    None => Flow::Idle,
                }
            }
            Ok(()) => Flow::Idle,
        };
        let next = c.core.next_deadline();
        self.unlock(c);
        if flow == Flow::Done {
            self.finished.set();
        }
        (flow, next)
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
#[path = "requester_tests.rs"]
mod tests;
