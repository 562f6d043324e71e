//! Requester side of a TCP peer connection, served by the engine's I/O
//! threads ([`crate::transport::reactor`]): no thread of its own. Frames
//! leave from the submitting thread when the socket is free (one wake-up
//! less) and otherwise from the I/O thread as the socket takes them;
//! answers are parsed as they arrive, READ payloads landing straight in
//! local registered memory, by the I/O thread or by a small batch's waiter
//! that reads them itself while it spins ([`Assist`]; one wake-up less).

use crate::control::frame::FRAME_HEADER_LEN;
use crate::control::frame::{FrameHeader, MsgKind};
use crate::control::io;
use crate::control::message::{self, DataRequest, DataResponse, Describe, DATA_RESPONSE_LEN, MAX_REASON};
use crate::counters::Counters;
use crate::error::{Error, Result, Status};
use crate::kinds::TransportKind;
use crate::memory::RegionLease;
use crate::sync::admission::{Gate, GateGuard, Permit};
use crate::transfer::{Assist, BatchShared, ChunkOutcome, Op, RemoteEffect};
use crate::transport::reactor::{read_once, set_rcvlowat, Ended, Flow, Got, Handler, Reactor, Registration, SCRATCH};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One unit of transfer on the wire (a request, or a piece of a split one).
pub struct Chunk {
    /// Completion record.
    pub batch: Arc<BatchShared>,
    /// Request index in the batch.
    pub index: usize,
    /// Direction.
    pub op: Op,
    /// Local address.
    pub local_addr: u64,
    /// Remote address.
    pub remote_addr: u64,
    /// Bytes.
    pub len: u64,
    /// Remote region epoch the requester knows.
    pub region_epoch: u64,
    /// Submission deadline.
    pub deadline: Instant,
    /// Keeps the local region registered.
    pub lease: Arc<RegionLease>,
    /// Admission bytes.
    pub permit: Option<Permit>,
    /// Keeps the requester gate open until completion.
    pub guard: Option<GateGuard>,
    /// Keeps this connection's gate open until completion (disconnect waits).
    pub peer_guard: Option<GateGuard>,
}

impl Chunk {
    /// Releases what the chunk holds (admission bytes, region lease, gate),
    /// then records its outcome: a waiter woken by the batch sees every
    /// resource of the chunk already released.
    fn finish(self, out: ChunkOutcome) {
        let Chunk { batch, index, lease, permit, guard, .. } = self;
        drop(permit);
        drop(lease);
        drop(guard);
        batch.complete_chunk(index, out);
    }
    fn fail(self, e: Error, effect: RemoteEffect) {
        self.finish(ChunkOutcome::failed(e, effect));
    }
}

struct Entry {
    chunk: Chunk,
    /// This WRITE's payload is being written from local memory (whoever
    /// writes it settles it; the receive side does not fail it).
    sending: bool,
    /// The answer that came while its payload was still being written
    /// (the peer answered early): applied when the send settles, so the
    /// local memory stays leased until it has left.
    early: Option<ChunkOutcome>,
}

#[derive(Default)]
struct Pending {
    map: HashMap<u64, Entry>,
    /// Requests that passed their deadline unanswered and were failed then
    /// (direction and length, by tag): their answers, when they come, are
    /// read and dropped, so that the connection stays in step for the
    /// others instead of being cut.
    abandoned: HashMap<u64, (Op, u64)>,
    /// The connection ended and failed every entry; later settlements fail
    /// their own.
    drained: bool,
}

/// Most requests a connection remembers as abandoned (failed at their
/// deadline, answer still to come); beyond, it is cut instead.
const ABANDONED_MAX: usize = 1 << 16;

/// How long past its deadline a WRITE's payload may take to leave (the
/// request was failed at the deadline; its bytes keep the stream in step)
/// before the connection is cut.
const WRITE_OVERRUN: Duration = Duration::from_secs(60);

/// WRITEs of at most this many bytes may be sent by the submitting thread
/// itself (see [`TcpConnection::enqueue`]).
const SMALL_WRITE: u64 = 64 * 1024;

/// One WRITE in an [`Outbuf`].
struct QueuedWrite {
    /// Where its frame starts, and its fixed part ends, in `bytes`.
    head_start: usize,
    head_end: usize,
    /// Its payload (local memory).
    addr: u64,
    len: u64,
    tag: u64,
    deadline: Instant,
    /// Set when its request was failed at its deadline before the payload
    /// left: the local region stays leased until it has.
    hold: Option<Arc<RegionLease>>,
}

/// Frames leaving together: request frames and the fixed parts of WRITEs
/// in `bytes`, each WRITE's payload by address, in stream order; `sent` of
/// them are on the socket already.
#[derive(Default)]
struct Outbuf {
    bytes: Vec<u8>,
    writes: Vec<QueuedWrite>,
    /// Bytes of the WRITEs' payloads.
    payload: u64,
    /// Bytes the socket took so far.
    sent: u64,
}

impl Outbuf {
    /// Whether `chunks` fit one send from the submitting thread: READs and
    /// small WRITEs, at most 256 of them and 256 KiB of payload.
    fn fits_at_once(chunks: &[Chunk]) -> bool {
        chunks.len() <= 256
            && chunks.iter().all(|c| c.op == Op::Read || c.len <= SMALL_WRITE)
            && chunks.iter().filter(|c| c.op == Op::Write).map(|c| c.len).sum::<u64>() <= 256 * 1024
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn total(&self) -> u64 {
        self.bytes.len() as u64 + self.payload
    }

    /// Enough to send now.
    fn full(&self) -> bool {
        self.bytes.len() as u64 + self.payload >= 256 * 1024 || self.writes.len() >= 64
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.writes.clear();
        self.payload = 0;
        self.sent = 0;
    }

    /// The frames as slices, in stream order.
    fn parts(&self) -> Vec<&[u8]> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * self.writes.len() + 1);
        let mut at = 0;
        for sw in &self.writes {
            parts.push(&self.bytes[at..sw.head_end]);
            // SAFETY: the WRITE's chunk holds a lease on the local region
            // containing [addr, addr+len) and stays pending (marked sending,
            // so nothing else fails it) until this buffer is settled; a
            // chunk failed at its deadline first moves its lease to `hold`.
            parts.push(unsafe { std::slice::from_raw_parts(sw.addr as *const u8, sw.len as usize) });
            at = sw.head_end;
        }
        parts.push(&self.bytes[at..]);
        parts
    }
}

/// How far one attempt to write an [`Outbuf`] got.
enum Sent {
    /// All of it.
    Complete,
    /// The socket is full: the writable edge resumes it.
    Blocked,
    /// This turn's share is used: more is possible at once.
    Budget,
}

/// Frames waiting for their turn on the socket.
#[derive(Default)]
struct SendQueue {
    items: VecDeque<Outgoing>,
    /// The connection is dead or closing: nothing more is queued.
    closed: bool,
}

/// What waits to be written: a request, a notification's frame, or
/// another whole frame.
enum Outgoing {
    Chunk(Chunk),
    Notify { tag: u64, body: Vec<u8> },
    Frame(Vec<u8>),
}

/// Called with a notification's outcome, and whether its frame may have
/// reached the peer.
pub type NotifyAnswer = Box<dyn FnOnce(Result<()>, bool) + Send>;

struct NotifyPending {
    /// The peer must answer by then (else the connection is cut).
    deadline: Instant,
    /// The frame was handed to the socket.
    written: bool,
    answer: NotifyAnswer,
}

struct DescribeState {
    current: Arc<Describe>,
    generation: u64,
}

/// What the receive side waits for next.
enum Want {
    /// A frame header.
    Header,
    /// The whole body of a control frame.
    Body(FrameHeader),
    /// The fixed part of a READ/WRITE answer.
    Fixed(FrameHeader),
    /// The failure text of a refused request (`chunk` None: the request is
    /// a WRITE still being sent, which stays pending under `tag`).
    Reason { chunk: Option<Chunk>, tag: u64, len: usize, status: Status },
    /// A READ's payload, landing in local registered memory.
    Payload { chunk: Chunk, done: u64 },
    /// Bytes of an abandoned request's answer (payload or failure text),
    /// read and dropped.
    Discard { left: u64 },
}

/// The receive side's state: the I/O thread's, or a spinning waiter's
/// while the I/O thread is not at it (whoever holds the lock reads).
struct Rx {
    /// Bytes of an unfinished header, fixed part or body.
    partial: Vec<u8>,
    want: Want,
    /// The socket's receive low-water mark now (`SO_RCVLOWAT`).
    lowat: usize,
}

/// Most bytes one connection reads, or writes, in one turn of its I/O
/// thread before the others get theirs.
const TURN_BYTES: u64 = 4 << 20;

/// A requester's connection to one peer.
pub struct TcpConnection {
    stream: TcpStream,
    queue: Mutex<SendQueue>,
    /// The frames being written (by a submitting thread or the I/O thread).
    out: Mutex<Outbuf>,
    rx: Mutex<Rx>,
    notes: Mutex<HashMap<u64, NotifyPending>>,
    pending: Mutex<Pending>,
    next_tag: AtomicU64,
    dead: Mutex<Option<Error>>,
    describe: Mutex<DescribeState>,
    describe_cv: Condvar,
    reg: once_cell::sync::OnceCell<Registration>,
    /// Set once the I/O thread has failed everything left (the connection
    /// is over); `close` waits for it.
    finished: Ended,
    stats: Arc<Counters>,
    gate: Arc<Gate>,
    /// Called (by whoever reads: the I/O thread or a spinning waiter; it
    /// must not block) when the source asks for its imports back
    /// (`Revoke`).
    on_revoke: RevokeHook,
    /// The engine's log lines (the connection lost).
    log: Arc<crate::log::Logger>,
    /// This engine is closing the connection (not a loss to log).
    closing: std::sync::atomic::AtomicBool,
    /// Peer label for messages.
    pub label: String,
}

/// What a requester does when its source revokes its imports.
pub type RevokeHook = Box<dyn Fn() + Send + Sync>;

impl TcpConnection {
    /// Wraps a connected, handshaken stream and hands it to `reactor`.
    pub fn start(
        stream: TcpStream,
        peer: Describe,
        label: String,
        stats: Arc<Counters>,
        on_revoke: RevokeHook,
        reactor: &Reactor,
        log: Arc<crate::log::Logger>,
    ) -> Result<Arc<TcpConnection>> {
        stream.set_nonblocking(true).map_err(|x| Error::io("set_nonblocking", &x))?;
        let _ = stream.set_nodelay(true);
        let conn = Arc::new(TcpConnection {
            stream,
            queue: Mutex::new(SendQueue::default()),
            out: Mutex::new(Outbuf::default()),
            rx: Mutex::new(Rx { partial: Vec::new(), want: Want::Header, lowat: 1 }),
            notes: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending::default()),
            next_tag: AtomicU64::new(1),
            dead: Mutex::new(None),
            describe: Mutex::new(DescribeState { current: Arc::new(peer), generation: 0 }),
            describe_cv: Condvar::new(),
            reg: once_cell::sync::OnceCell::new(),
            finished: Ended::default(),
            stats,
            gate: Gate::new("connection"),
            on_revoke,
            log,
            closing: std::sync::atomic::AtomicBool::new(false),
            label,
        });
        let reg = reactor.register(conn.stream.as_raw_fd(), conn.clone())?;
        let _ = conn.reg.set(reg);
        Ok(conn)
    }

    /// The error that killed the connection, if it is dead.
    pub fn dead_reason(&self) -> Option<Error> {
        self.dead.lock().clone()
    }

    /// The peer's latest Describe.
    pub fn describe(&self) -> Arc<Describe> {
        self.describe.lock().current.clone()
    }

    /// Asks the peer for a fresh Describe and waits for it until `deadline`.
    pub fn refresh_describe(&self, deadline: Instant) -> Result<Arc<Describe>> {
        let gen = self.describe.lock().generation;
        self.push(Outgoing::Frame(FrameHeader::encode(MsgKind::DescribeRequest, 0).to_vec()))?;
        let mut d = self.describe.lock();
        while d.generation == gen {
            if let Some(e) = self.dead_reason() {
                return Err(e);
            }
            if self.describe_cv.wait_until(&mut d, deadline).timed_out() && d.generation == gen {
                return Err(Error::TimedOut(format!("{} did not answer a Describe request", self.label)));
            }
        }
        Ok(d.current.clone())
    }

    /// The peer ended the connection in order.
    fn closed_by_peer(&self) -> Error {
        Error::Unavailable(format!("{} closed the connection", self.label))
    }

    /// Why nothing more can be sent: the error that killed the connection,
    /// or its orderly close.
    fn closed_reason(&self) -> Error {
        self.dead_reason().unwrap_or_else(|| Error::Unavailable(format!("connection to {} is closed", self.label)))
    }

    /// Queues one item behind the others and wakes the I/O thread.
    fn push(&self, item: Outgoing) -> Result<()> {
        let mut q = self.queue.lock();
        if q.closed {
            return Err(self.closed_reason());
        }
        q.items.push_back(item);
        drop(q);
        self.wake();
        Ok(())
    }

    fn wake(&self) {
        if let Some(r) = self.reg.get() {
            r.wake();
        }
    }

    /// Queues chunks for sending. Fails them at once if the connection is
    /// dead. When nothing waits and the socket is free, a small batch is
    /// written by the calling thread itself (no wake-up of another
    /// thread); what the socket does not take then, the I/O thread writes
    /// when it drains.
    pub fn enqueue(&self, chunks: Vec<Chunk>) {
        if chunks.is_empty() {
            return;
        }
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            let e = self.closed_reason();
            for c in chunks {
                c.fail(e.clone(), RemoteEffect::None);
            }
            return;
        }
        if q.items.is_empty() && Outbuf::fits_at_once(&chunks) {
            if let Some(mut out) = self.out.try_lock() {
                if out.is_empty() {
                    // Holding the frames' lock before letting go of the
                    // queue: whatever is queued after these is written after
                    // them.
                    drop(q);
                    let failed: Vec<(Chunk, Error)> =
                        chunks.into_iter().filter_map(|c| self.add_chunk(c, &mut out)).collect();
                    let _ = self.write_out(&mut out, u64::MAX, &mut io::SendRamp::default());
                    drop(out);
                    for (c, e) in failed {
                        c.fail(e, RemoteEffect::None);
                    }
                    return;
                }
            }
        }
        q.items.extend(chunks.into_iter().map(Outgoing::Chunk));
        drop(q);
        self.wake();
    }

    /// Queues a notification's frame (built by `body` from its tag) behind
    /// what is queued already; `answer` gets the peer's verdict, or the
    /// connection's error. Never blocks.
    pub fn send_notify(&self, body: impl FnOnce(u64) -> Vec<u8>, deadline: Instant, answer: NotifyAnswer) {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            answer(Err(self.closed_reason()), false);
            return;
        }
        // Registered under the queue's lock: a kill (which sets the flag
        // under it first) finds it when it answers every pending one.
        self.notes.lock().insert(tag, NotifyPending { deadline, written: false, answer });
        q.items.push_back(Outgoing::Notify { tag, body: body(tag) });
        drop(q);
        self.wake();
    }

    /// Answers every notification still waiting for the peer with `e`.
    fn fail_notes(&self, e: &Error) {
        let pending: Vec<NotifyPending> = self.notes.lock().drain().map(|(_, p)| p).collect();
        for p in pending {
            (p.answer)(Err(e.clone()), p.written);
        }
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
        self.queue.lock().items.len() + self.pending.lock().map.len() + self.notes.lock().len()
    }

    /// Kills the connection with `e` (idempotent): in-flight chunks fail
    /// (on the I/O thread, which the kill wakes).
    pub fn kill(&self, e: Error) {
        {
            let mut d = self.dead.lock();
            if d.is_none() {
                if !self.closing.load(Ordering::Acquire) {
                    self.log.warn(format_args!("{}: connection lost: {e}", self.label));
                }
                *d = Some(e);
            }
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        self.queue.lock().closed = true;
        self.describe_cv.notify_all();
        self.wake();
    }

    /// The peer is gone for good (discovery saw its name vanish or pass to
    /// another epoch): `e` becomes the reason, replacing a lost
    /// connection's, and the connection is killed if it was not already.
    pub fn retire(&self, e: Error) {
        *self.dead.lock() = Some(e.clone());
        self.kill(e);
    }

    /// Orderly close: Goodbye (when the socket is free to take it), then
    /// kill, then wait until everything left has been failed.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if self.dead_reason().is_none() {
            let out = self.out.lock();
            if out.is_empty() {
                let h = FrameHeader::encode(MsgKind::Goodbye, 0);
                let _ = io::send_parts_from(&self.stream, &[&h], 0);
            }
        }
        self.kill(Error::Unavailable(format!("connection to {} was closed by this engine", self.label)));
        self.finished.wait(Duration::from_secs(30));
    }

    /// Writes what `out` holds, as far as the socket takes it and at most
    /// `budget` bytes, each send capped by `ramp` (one per run of sends);
    /// settles it when complete or failed (a failure kills the connection).
    fn write_out(&self, out: &mut Outbuf, budget: u64, ramp: &mut io::SendRamp) -> Sent {
        let start = out.sent;
        let r = loop {
            if out.sent == out.total() {
                break Ok(Sent::Complete);
            }
            if out.sent - start >= budget {
                break Ok(Sent::Budget);
            }
            match io::send_parts_upto(&self.stream, &out.parts(), out.sent, ramp.cap()) {
                Ok(0) => break Err(Error::Unavailable("connection closed while sending".into())),
                Ok(n) => out.sent += n as u64,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break Ok(Sent::Blocked),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break Err(Error::Unavailable(format!("connection lost: {e}"))),
            }
        };
        self.stats.record_wire_sent(TransportKind::Tcp, out.sent - start);
        match r {
            Ok(Sent::Complete) => {
                self.settle(out, None);
                Sent::Complete
            }
            Ok(s) => s,
            Err(e) => {
                self.settle(out, Some(&e));
                self.kill(e);
                Sent::Blocked
            }
        }
    }

    /// Settles the WRITEs of a buffer that was written (`failed` None):
    /// they now wait for their answers; or that failed: each fails with
    /// the remote effect its first byte allows (`Unknown` once any of it
    /// left, else `None`). Empties the buffer.
    fn settle(&self, out: &mut Outbuf, failed: Option<&Error>) {
        if !out.writes.is_empty() {
            let mut done = Vec::new();
            let mut answered = Vec::new();
            let mut before = 0u64;
            let mut p = self.pending.lock();
            for sw in &out.writes {
                let start = sw.head_start as u64 + before;
                before += sw.len;
                match failed {
                    None if !p.drained => match p.map.get_mut(&sw.tag) {
                        Some(ent) if ent.early.is_some() => {
                            let ent = p.map.remove(&sw.tag).expect("present");
                            answered.push(ent);
                        }
                        Some(ent) => ent.sending = false,
                        None => {}
                    },
                    None => {
                        let e = self
                            .dead_reason()
                            .unwrap_or_else(|| Error::Unavailable(format!("connection to {} lost", self.label)));
                        done.extend(p.map.remove(&sw.tag).map(|ent| (ent, e, RemoteEffect::Unknown)));
                    }
                    Some(e) => {
                        let effect = if out.sent > start { RemoteEffect::Unknown } else { RemoteEffect::None };
                        done.extend(p.map.remove(&sw.tag).map(|ent| (ent, e.clone(), effect)));
                    }
                }
            }
            drop(p);
            for (ent, e, effect) in done {
                ent.chunk.fail(e, effect);
            }
            for mut ent in answered {
                let outcome = ent.early.take().expect("answered early");
                ent.chunk.finish(outcome);
            }
        }
        out.clear();
    }

    /// The I/O thread's send turn: resumes the buffer in progress, then
    /// builds the next one from the queue, until the socket is full, the
    /// queue empty or the turn's share used.
    fn pump(&self) -> Flow {
        let mut failed = Vec::new();
        let flow = self.pump_locked(&mut failed);
        // Completed with no lock of this connection held: a batch's end
        // hook may queue a notification here.
        for (c, e) in failed {
            c.fail(e, RemoteEffect::None);
        }
        flow
    }

    fn pump_locked(&self, failed: &mut Vec<(Chunk, Error)>) -> Flow {
        let mut out = self.out.lock();
        let mut budget = TURN_BYTES;
        let mut ramp = io::SendRamp::default();
        loop {
            if !out.is_empty() {
                let left = out.total() - out.sent;
                match self.write_out(&mut out, budget, &mut ramp) {
                    Sent::Complete => budget = budget.saturating_sub(left),
                    Sent::Blocked => return Flow::Idle,
                    Sent::Budget => return Flow::Again,
                }
                if budget == 0 {
                    return Flow::Again;
                }
            }
            let mut taken = Vec::new();
            {
                let mut q = self.queue.lock();
                if q.items.is_empty() {
                    return Flow::Idle;
                }
                let n = q.items.len().min(256);
                taken.extend(q.items.drain(..n));
            }
            let mut taken = taken.into_iter();
            for item in taken.by_ref() {
                match item {
                    Outgoing::Chunk(c) => failed.extend(self.add_chunk(c, &mut out)),
                    Outgoing::Notify { tag, body } => self.add_note(tag, &body, &mut out),
                    Outgoing::Frame(f) => out.bytes.extend_from_slice(&f),
                }
                if out.full() {
                    break;
                }
            }
            // What did not fit goes back in front, in order.
            let rest: Vec<Outgoing> = taken.collect();
            if !rest.is_empty() {
                let mut q = self.queue.lock();
                for item in rest.into_iter().rev() {
                    q.items.push_front(item);
                }
            }
        }
    }

    /// Appends a notification's frame (a dead connection answers it when
    /// it fails everything left instead).
    fn add_note(&self, tag: u64, body: &[u8], buf: &mut Outbuf) {
        if self.dead_reason().is_some() {
            return;
        }
        match self.notes.lock().get_mut(&tag) {
            Some(p) => p.written = true,
            None => return,
        }
        buf.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::Notify, body.len() as u32));
        buf.bytes.extend_from_slice(body);
        self.stats.notifications_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends a request's frame, or returns it with the reason it can no
    /// longer go (dead connection, deadline passed, batch cancelled): the
    /// caller fails it once it holds no lock of this connection.
    #[must_use]
    fn add_chunk(&self, chunk: Chunk, buf: &mut Outbuf) -> Option<(Chunk, Error)> {
        if let Some(e) = self.dead_reason() {
            return Some((chunk, e));
        }
        if Instant::now() >= chunk.deadline {
            let msg = format!("deadline passed before the request was sent to {}", self.label);
            return Some((chunk, Error::TimedOut(msg)));
        }
        if !chunk.batch.start(chunk.index) {
            return Some((chunk, Error::Cancelled("cancelled before it started".into())));
        }
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let req = DataRequest { tag, region_epoch: chunk.region_epoch, addr: chunk.remote_addr, len: chunk.len };
        let op = chunk.op;
        let (local, len, deadline) = (chunk.local_addr, chunk.len, chunk.deadline);
        {
            let mut p = self.pending.lock();
            if p.drained {
                drop(p);
                return Some((chunk, self.closed_reason()));
            }
            p.map.insert(tag, Entry { chunk, sending: op == Op::Write, early: None });
        }
        match op {
            Op::Read => {
                buf.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::ReadRequest, 32));
                buf.bytes.extend_from_slice(&req.encode());
            }
            // A WRITE joins the frames before it: its fixed part in the
            // buffer, its payload by address, sent in one sendmsg.
            Op::Write => {
                let head_start = buf.bytes.len();
                buf.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::WriteRequest, (32 + len) as u32));
                buf.bytes.extend_from_slice(&req.encode());
                buf.payload += len;
                let head_end = buf.bytes.len();
                buf.writes.push(QueuedWrite { head_start, head_end, addr: local, len, tag, deadline, hold: None });
            }
        }
        None
    }

    /// The connection is over (`err` says why): tells the peer of a
    /// protocol error when the socket is free, kills it, and fails
    /// everything left: answers awaited, the answer being read, frames not
    /// yet written, notifications. Runs with the receive side held (on the
    /// I/O thread, or a waiter's that found the end).
    fn finish(&self, err: Error, rx: &mut Rx) {
        if matches!(err, Error::Protocol(_)) && self.dead_reason().is_none() {
            if let Some(out) = self.out.try_lock() {
                if out.is_empty() {
                    let body = message::encode_error(Status::ProtocolError, err.message());
                    let h = FrameHeader::encode(MsgKind::Error, body.len() as u32);
                    let _ = io::send_parts_from(&self.stream, &[&h, &body], 0);
                }
            }
        }
        self.kill(err.clone());
        let reason = self.dead_reason().unwrap_or(err);
        let now = Instant::now();
        let entries: Vec<Entry> = {
            let mut p = self.pending.lock();
            p.drained = true;
            let tags: Vec<u64> = p.map.iter().filter(|(_, e)| !e.sending).map(|(t, _)| *t).collect();
            tags.into_iter().filter_map(|t| p.map.remove(&t)).collect()
        };
        for ent in entries {
            let c = ent.chunk;
            let e = if now >= c.deadline && !matches!(reason, Error::Protocol(_)) {
                Error::TimedOut(format!("no answer from {} before the deadline; connection closed", self.label))
            } else {
                reason.clone()
            };
            let effect = if c.op == Op::Write { RemoteEffect::Unknown } else { RemoteEffect::None };
            c.fail(e, effect);
        }
        match std::mem::replace(&mut rx.want, Want::Header) {
            Want::Payload { chunk, .. } | Want::Reason { chunk: Some(chunk), .. } => {
                chunk.fail(reason.clone(), RemoteEffect::None)
            }
            _ => {}
        }
        {
            let mut out = self.out.lock();
            if !out.is_empty() {
                self.settle(&mut out, Some(&reason));
            }
        }
        let queued: Vec<Outgoing> = self.queue.lock().items.drain(..).collect();
        for item in queued {
            if let Outgoing::Chunk(c) = item {
                c.fail(reason.clone(), RemoteEffect::None);
            }
        }
        self.fail_notes(&reason);
        self.finished.set();
    }

    /// Requests that passed their deadline: failed now (returned, to be
    /// failed with no lock of this connection held), their answers read
    /// and dropped when they come, so that the connection stays in step for
    /// the other requests — a READ mid-payload has the rest of its payload
    /// dropped, a WRITE still leaving keeps its local region leased until
    /// its bytes have left. What ends the connection: its death, a
    /// notification left unanswered, a WRITE's payload that cannot leave
    /// within [`WRITE_OVERRUN`] of its deadline, or too many abandoned
    /// requests.
    fn expire(&self, rx: &mut Rx, now: Instant) -> Result<Vec<(Chunk, Error, RemoteEffect)>> {
        if let Some(e) = self.dead_reason() {
            return Err(e);
        }
        let mut out = Vec::new();
        let late = |what: &str| Error::TimedOut(format!("request to {} passed its deadline {what}", self.label));
        match &mut rx.want {
            Want::Payload { chunk, done } if now >= chunk.deadline => {
                let left = chunk.len - *done;
                let Want::Payload { chunk, .. } = std::mem::replace(&mut rx.want, Want::Discard { left }) else {
                    unreachable!("matched above")
                };
                out.push((chunk, late("mid-payload (the rest of its payload is dropped)"), RemoteEffect::None));
            }
            Want::Reason { chunk, .. } if chunk.as_ref().is_some_and(|c| now >= c.deadline) => {
                let c = chunk.take().expect("matched above");
                out.push((c, late("in the middle of its failure answer"), RemoteEffect::None));
            }
            _ => {}
        }
        let mut p = self.pending.lock();
        let tags: Vec<u64> =
            p.map.iter().filter(|(_, e)| !e.sending && now >= e.chunk.deadline).map(|(t, _)| *t).collect();
        for t in tags {
            let e = p.map.remove(&t).expect("present");
            p.abandoned.insert(t, (e.chunk.op, e.chunk.len));
            let effect = if e.chunk.op == Op::Write { RemoteEffect::Unknown } else { RemoteEffect::None };
            let what =
                format!("without an answer (0x{:x}+{}); its answer will be dropped", e.chunk.remote_addr, e.chunk.len);
            out.push((e.chunk, late(&what), effect));
        }
        // WRITEs whose payload is still leaving: failed now, their memory
        // held until the bytes are out.
        if let Some(mut o) = self.out.try_lock() {
            for sw in o.writes.iter_mut().filter(|w| now >= w.deadline) {
                if sw.hold.is_some() {
                    if now >= sw.deadline + WRITE_OVERRUN {
                        return Err(Error::TimedOut(format!(
                            "a WRITE's payload to {} could not leave within {WRITE_OVERRUN:?} of its deadline",
                            self.label
                        )));
                    }
                    continue;
                }
                let Some(e) = p.map.remove(&sw.tag).filter(|e| e.early.is_none()) else { continue };
                sw.hold = Some(e.chunk.lease.clone());
                p.abandoned.insert(sw.tag, (Op::Write, e.chunk.len));
                out.push((e.chunk, late("while its payload was being sent"), RemoteEffect::Unknown));
            }
        }
        let too_many = p.abandoned.len() > ABANDONED_MAX;
        drop(p);
        if too_many {
            return Err(Error::TimedOut(format!(
                "more than {ABANDONED_MAX} requests to {} passed their deadline unanswered",
                self.label
            )));
        }
        if self.notes.lock().values().any(|n| n.written && now >= n.deadline) {
            return Err(Error::TimedOut(format!("{} did not answer a notification in time", self.label)));
        }
        Ok(out)
    }

    /// The receive turn: reads what the socket holds (READ payloads that
    /// are still large go straight into local memory; the rest through the
    /// thread's scratch buffer) and handles every complete frame, reading
    /// at most `budget` bytes (what it read is taken off) and no more after
    /// `until` (`Flow::Again` then). `Ok(None)` when the peer ended the
    /// connection in order.
    fn receive(
        &self,
        rx: &mut Rx,
        scratch: &mut [u8],
        budget: &mut u64,
        until: Option<Instant>,
    ) -> Result<Option<Flow>> {
        loop {
            if *budget == 0 || until.is_some_and(|u| Instant::now() >= u) {
                return Ok(Some(Flow::Again));
            }
            let direct = match &mut rx.want {
                Want::Payload { chunk, done } if chunk.len - *done >= (SCRATCH / 2) as u64 => {
                    // SAFETY: the chunk's lease keeps [local_addr, +len)
                    // inside a registered local region; only this thread
                    // writes it, and the chunk completes only after it.
                    Some(unsafe {
                        std::slice::from_raw_parts_mut(
                            (chunk.local_addr + *done) as *mut u8,
                            (chunk.len - *done) as usize,
                        )
                    })
                }
                _ => None,
            };
            let to_scratch = direct.is_none();
            let n = match read_once(&self.stream, direct.unwrap_or(&mut *scratch))? {
                Got::Bytes(n) => n,
                Got::Drained => {
                    let left = match &rx.want {
                        Want::Payload { chunk, done } => Some(chunk.len - *done),
                        Want::Discard { left } => Some(*left),
                        _ => None,
                    };
                    set_rcvlowat(self.stream.as_raw_fd(), &mut rx.lowat, left);
                    return Ok(Some(Flow::Idle));
                }
                Got::Eof => {
                    return match (&rx.want, rx.partial.is_empty()) {
                        (Want::Header, true) => Ok(None),
                        _ => Err(Error::Unavailable("peer closed the connection mid-frame".into())),
                    }
                }
            };
            *budget = budget.saturating_sub(n as u64);
            if to_scratch {
                if !self.feed(rx, &scratch[..n])? {
                    return Ok(None);
                }
            } else if let Want::Payload { done, .. } = &mut rx.want {
                *done += n as u64;
                self.payload_done(rx);
            }
        }
    }

    /// Completes the READ whose payload is in, if it is.
    fn payload_done(&self, rx: &mut Rx) {
        if matches!(&rx.want, Want::Payload { chunk, done } if *done == chunk.len) {
            if let Want::Payload { chunk, .. } = std::mem::replace(&mut rx.want, Want::Header) {
                chunk.finish(ChunkOutcome::ok(Op::Read));
            }
        }
    }

    /// Consumes received bytes. `Ok(false)`: the peer said Goodbye.
    fn feed(&self, rx: &mut Rx, mut data: &[u8]) -> Result<bool> {
        while !data.is_empty() {
            if let Want::Discard { left } = &mut rx.want {
                let n = (*left).min(data.len() as u64);
                *left -= n;
                data = &data[n as usize..];
                if *left == 0 {
                    rx.want = Want::Header;
                }
                continue;
            }
            if let Want::Payload { chunk, done } = &mut rx.want {
                let n = ((chunk.len - *done) as usize).min(data.len());
                // SAFETY: as in `receive`: [local_addr, +len) is leased local
                // registered memory that only this thread writes until the
                // chunk completes; `done + n <= len`.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), (chunk.local_addr + *done) as *mut u8, n);
                }
                *done += n as u64;
                data = &data[n..];
                self.payload_done(rx);
                continue;
            }
            let need = match &rx.want {
                Want::Header => FRAME_HEADER_LEN,
                Want::Body(h) => h.body_len as usize,
                Want::Fixed(_) => DATA_RESPONSE_LEN,
                Want::Reason { len, .. } => *len,
                Want::Payload { .. } | Want::Discard { .. } => unreachable!("handled above"),
            };
            let take = (need - rx.partial.len()).min(data.len());
            rx.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if rx.partial.len() == need && !self.complete(rx)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Handles the unit `rx.partial` completed and says what comes next.
    /// `Ok(false)`: the peer said Goodbye.
    fn complete(&self, rx: &mut Rx) -> Result<bool> {
        let bytes = std::mem::take(&mut rx.partial);
        match std::mem::replace(&mut rx.want, Want::Header) {
            Want::Header => {
                let h = FrameHeader::decode(bytes[..].try_into().expect("a whole header"))?;
                match h.kind {
                    MsgKind::ReadResponse | MsgKind::WriteResponse => {
                        if (h.body_len as usize) < DATA_RESPONSE_LEN {
                            return Err(Error::Protocol(format!("{:?} of {} bytes is too short", h.kind, h.body_len)));
                        }
                        rx.want = Want::Fixed(h);
                    }
                    MsgKind::Describe | MsgKind::Error | MsgKind::NotifyAck if h.body_len > 0 => {
                        rx.want = Want::Body(h)
                    }
                    MsgKind::Describe | MsgKind::Error | MsgKind::NotifyAck => return self.control_frame(h, &[]),
                    MsgKind::Goodbye | MsgKind::Revoke if h.body_len != 0 => {
                        return Err(Error::Protocol(format!("{:?} with a body", h.kind)))
                    }
                    MsgKind::Goodbye => return Ok(false),
                    MsgKind::Revoke => (self.on_revoke)(),
                    other => return Err(Error::Protocol(format!("unexpected {other:?} from the source side"))),
                }
            }
            Want::Body(h) => return self.control_frame(h, &bytes),
            Want::Fixed(h) => self.answer(rx, h, &bytes)?,
            Want::Reason { chunk, tag, status, .. } => {
                let msg = String::from_utf8_lossy(&bytes).into_owned();
                let e = Error::from_status(status, format!("{}: {msg}", self.label));
                match chunk {
                    Some(c) => c.fail(e, RemoteEffect::None),
                    None => self.answered_early(tag, ChunkOutcome::failed(e, RemoteEffect::None)),
                }
            }
            Want::Payload { .. } | Want::Discard { .. } => unreachable!("payload is not gathered in `partial`"),
        }
        // The buffer is kept for the next unit unless a large body grew it
        // (an idle connection holds next to nothing).
        if bytes.capacity() <= 4096 {
            rx.partial = bytes;
            rx.partial.clear();
        }
        Ok(true)
    }

    /// A control frame from the source, body complete.
    fn control_frame(&self, h: FrameHeader, body: &[u8]) -> Result<bool> {
        match h.kind {
            MsgKind::Describe => {
                let d = Describe::decode(body)?;
                let mut st = self.describe.lock();
                if d.identity.engine_epoch != st.current.identity.engine_epoch {
                    return Err(Error::Protocol("peer changed its engine epoch mid-connection".into()));
                }
                st.current = Arc::new(d);
                st.generation += 1;
                self.describe_cv.notify_all();
            }
            MsgKind::Error => {
                let (st, text) = message::decode_error(body)?;
                return Err(Error::from_status(
                    if st == Status::Ok { Status::Unavailable } else { st },
                    format!("{} closed the connection: {text}", self.label),
                ));
            }
            MsgKind::NotifyAck => {
                let (tag, outcome) = crate::control::notify::decode_ack(body)?;
                let Some(p) = self.notes.lock().remove(&tag) else {
                    return Err(Error::Protocol(format!("NotifyAck for unknown tag {tag}")));
                };
                let outcome = outcome.map_err(|e| {
                    Error::from_status(e.status(), format!("{} refused the notification: {}", self.label, e.message()))
                });
                (p.answer)(outcome, true);
            }
            other => return Err(Error::Protocol(format!("unexpected {other:?} from the source side"))),
        }
        Ok(true)
    }

    /// The fixed part of a READ/WRITE answer: finds its request and says
    /// what follows (nothing, its failure text, or its payload).
    fn answer(&self, rx: &mut Rx, h: FrameHeader, fixed: &[u8]) -> Result<()> {
        let resp = DataResponse::decode(fixed.try_into().expect("a whole fixed part"))?;
        let rest = h.body_len as u64 - DATA_RESPONSE_LEN as u64;
        let want = if h.kind == MsgKind::ReadResponse { Op::Read } else { Op::Write };
        let ent = {
            let mut p = self.pending.lock();
            match p.map.get(&resp.tag) {
                Some(e) if e.chunk.op == want && e.early.is_some() => {
                    return Err(Error::Protocol(format!("{:?} for tag {} answered twice", h.kind, resp.tag)))
                }
                Some(e) if e.chunk.op == want => {}
                Some(_) => {
                    return Err(Error::Protocol(format!("{:?} for tag {} of the other direction", h.kind, resp.tag)))
                }
                None => {
                    drop(p);
                    return self.abandoned_answer(rx, h, resp, rest, want);
                }
            }
            // A WRITE answered while its payload is still being written
            // (an honest source whose answer overtook the sender's
            // bookkeeping, or one that answered early) stays pending until
            // the send settles: its memory is still in use.
            if p.map[&resp.tag].sending {
                drop(p);
                return self.early_answer(rx, resp, rest);
            }
            p.map.remove(&resp.tag).expect("present")
        };
        let c = ent.chunk;
        if resp.status != Status::Ok {
            if rest > MAX_REASON as u64 + 2 {
                let e = Error::Protocol(format!("failure text of {rest} bytes is too long"));
                c.fail(e.clone(), RemoteEffect::None);
                return Err(e);
            }
            if rest == 0 {
                c.fail(Error::from_status(resp.status, format!("{}: ", self.label)), RemoteEffect::None);
            } else {
                rx.want = Want::Reason { chunk: Some(c), tag: resp.tag, len: rest as usize, status: resp.status };
            }
            return Ok(());
        }
        match want {
            Op::Write if rest != 0 => {
                let e = Error::Protocol("WRITE success carries a body".into());
                c.fail(e.clone(), RemoteEffect::Unknown);
                Err(e)
            }
            Op::Write => {
                c.finish(ChunkOutcome::ok(Op::Write));
                Ok(())
            }
            Op::Read if rest != c.len => {
                let e = Error::Protocol(format!("READ answer carries {rest} bytes, asked for {}", c.len));
                c.fail(e.clone(), RemoteEffect::None);
                Err(e)
            }
            Op::Read => {
                rx.want = Want::Payload { chunk: c, done: 0 };
                self.payload_done(rx);
                Ok(())
            }
        }
    }
}

impl TcpConnection {
    /// The answer to a request that was failed at its deadline: checked as
    /// any answer is, then dropped (its payload or failure text too).
    fn abandoned_answer(&self, rx: &mut Rx, h: FrameHeader, resp: DataResponse, rest: u64, want: Op) -> Result<()> {
        let Some((op, len)) = self.pending.lock().abandoned.remove(&resp.tag) else {
            return Err(Error::Protocol(format!("{:?} for unknown tag {}", h.kind, resp.tag)));
        };
        let fits = match (op == want, resp.status == Status::Ok, want) {
            (false, _, _) => false,
            (true, false, _) => rest <= MAX_REASON as u64 + 2,
            (true, true, Op::Read) => rest == len,
            (true, true, Op::Write) => rest == 0,
        };
        if !fits {
            return Err(Error::Protocol(format!("{:?} for tag {} does not match its request", h.kind, resp.tag)));
        }
        self.stats.answers_dropped.fetch_add(1, Ordering::Relaxed);
        if rest > 0 {
            rx.want = Want::Discard { left: rest };
        }
        Ok(())
    }

    /// The answer to a WRITE still being sent: recorded on its entry (or,
    /// for a failure with text, once the text is in).
    fn early_answer(&self, rx: &mut Rx, resp: DataResponse, rest: u64) -> Result<()> {
        if resp.status == Status::Ok {
            if rest != 0 {
                return Err(Error::Protocol("WRITE success carries a body".into()));
            }
            self.answered_early(resp.tag, ChunkOutcome::ok(Op::Write));
            return Ok(());
        }
        if rest > MAX_REASON as u64 + 2 {
            return Err(Error::Protocol(format!("failure text of {rest} bytes is too long")));
        }
        if rest == 0 {
            let e = Error::from_status(resp.status, format!("{}: ", self.label));
            self.answered_early(resp.tag, ChunkOutcome::failed(e, RemoteEffect::None));
        } else {
            rx.want = Want::Reason { chunk: None, tag: resp.tag, len: rest as usize, status: resp.status };
        }
        Ok(())
    }

    /// Applies the answer of WRITE `tag`: kept on its entry while its
    /// payload is still being sent, at once if the send settled meanwhile.
    fn answered_early(&self, tag: u64, outcome: ChunkOutcome) {
        let mut p = self.pending.lock();
        let Some(ent) = p.map.get_mut(&tag) else { return };
        if ent.sending {
            ent.early = Some(outcome);
            return;
        }
        let ent = p.map.remove(&tag).expect("present");
        drop(p);
        ent.chunk.finish(outcome);
    }
}

/// Most bytes a spinning waiter reads for a connection in one go (the I/O
/// thread takes over beyond).
const ASSIST_BYTES: u64 = 256 * 1024;

thread_local! {
    /// A waiting thread's receive buffer, for [`TcpConnection::assist`].
    static ASSIST_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Assist for TcpConnection {
    /// A batch's waiter reads the answers itself while the I/O thread is
    /// not reading them: they land without that thread's wake-up. Anything
    /// beyond the fast path (a dead connection, an end, more than
    /// [`ASSIST_BYTES`] waiting, or bytes still there at `until`) is left
    /// to the I/O thread, which is woken.
    fn assist(&self, until: Instant) -> bool {
        let Some(mut rx) = self.rx.try_lock() else { return false };
        if self.finished.is_set() || self.dead_reason().is_some() {
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
            let got = self.receive(&mut rx, &mut scratch, &mut budget, Some(until));
            Some((got, budget < ASSIST_BYTES))
        }) else {
            return false;
        };
        let end = match got {
            (Ok(Some(Flow::Idle)), progress) => return progress,
            (Ok(Some(_)), _) => None,
            (Ok(None), _) => Some(self.closed_by_peer()),
            (Err(e), _) => Some(e),
        };
        if let Some(e) = end {
            self.finish(e, &mut rx);
        }
        drop(rx);
        self.wake();
        true
    }
}

impl Handler for TcpConnection {
    fn ready(&self, scratch: &mut [u8]) -> Flow {
        let mut rx = self.rx.lock();
        if self.finished.is_set() {
            return Flow::Done;
        }
        if let Some(e) = self.dead_reason() {
            self.finish(e, &mut rx);
            return Flow::Done;
        }
        let sent = self.pump();
        let mut budget = TURN_BYTES;
        let got = match self.receive(&mut rx, scratch, &mut budget, None) {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.finish(self.closed_by_peer(), &mut rx);
                return Flow::Done;
            }
            Err(e) => {
                self.finish(e, &mut rx);
                return Flow::Done;
            }
        };
        if let Some(e) = self.dead_reason() {
            self.finish(e, &mut rx);
            return Flow::Done;
        }
        if sent == Flow::Again || got == Flow::Again {
            Flow::Again
        } else {
            Flow::Idle
        }
    }

    fn tick(&self, now: Instant) -> Flow {
        let mut rx = self.rx.lock();
        if self.finished.is_set() {
            return Flow::Done;
        }
        let late = match self.expire(&mut rx, now) {
            Ok(late) => late,
            Err(e) => {
                self.finish(e, &mut rx);
                return Flow::Done;
            }
        };
        drop(rx);
        // Failed with no lock of this connection held: a batch's end hook
        // may queue a notification here.
        for (c, e, effect) in late {
            c.fail(e, effect);
        }
        // Frames queued by a thread whose wake-up came before this
        // connection's registration was set still leave.
        if self.queue.lock().items.is_empty() {
            Flow::Idle
        } else {
            self.pump()
        }
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::identity::Identity;
    use crate::control::message::DATA_REQUEST_LEN;
    use crate::memory::{Access, RegionTable};
    use crate::transfer::Request;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A batch's waiter reads its answer itself: the connection's only I/O
    /// thread is stopped before the request leaves, so nothing else could
    /// (without `assist` the batch stays pending).
    #[test]
    fn a_spinning_waiter_reads_its_answer_itself() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let describe = Describe::bare(Identity::fresh());
        let stats = Arc::new(Counters::default());
        let reactor = Reactor::new(1, Duration::ZERO);
        let log = Arc::new(crate::log::Logger::new(crate::log::Level::Off, "test"));
        let conn =
            TcpConnection::start(client, describe, "test peer".into(), stats.clone(), Box::new(|| {}), &reactor, log)
                .unwrap();
        reactor.stop();

        let mut local = vec![0u8; 4096];
        let addr = local.as_mut_ptr() as u64;
        let regions = RegionTable::default();
        let region = regions.register(addr, 4096, Access::READ | Access::WRITE).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let req = Request { op: Op::Read, local_addr: addr, remote_addr: 0x7000, len: 4096 };
        let batch = BatchShared::new(&[req], stats, deadline);
        batch.plan(0, 1, TransportKind::Tcp);
        batch.assisted_by(Arc::downgrade(&conn) as std::sync::Weak<dyn Assist>);
        conn.enqueue(vec![Chunk {
            batch: batch.clone(),
            index: 0,
            op: Op::Read,
            local_addr: addr,
            remote_addr: 0x7000,
            len: 4096,
            region_epoch: region.epoch,
            deadline,
            lease: Arc::new(regions.lease(addr, 4096).unwrap()),
            permit: None,
            guard: None,
            peer_guard: None,
        }]);

        // The request left from this thread; answer it.
        let mut frame = [0u8; FRAME_HEADER_LEN + DATA_REQUEST_LEN];
        peer.read_exact(&mut frame).unwrap();
        let h = FrameHeader::decode(frame[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.kind, MsgKind::ReadRequest);
        let r = DataRequest::decode(frame[FRAME_HEADER_LEN..].try_into().unwrap()).unwrap();
        assert_eq!((r.addr, r.len), (0x7000, 4096));
        let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        peer.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (DATA_RESPONSE_LEN + 4096) as u32)).unwrap();
        peer.write_all(&DataResponse { tag: r.tag, status: Status::Ok }.encode()).unwrap();
        peer.write_all(&payload).unwrap();

        // Each wait spins (and assists) before it sleeps for the rest of
        // its millisecond; a loaded machine may take several.
        let give_up = Instant::now() + Duration::from_secs(20);
        while batch.wait(Duration::from_millis(1)) == Status::Pending {
            assert!(Instant::now() < give_up, "the waiter never read its answer");
        }
        assert_eq!(batch.poll(), Status::Ok);
        assert_eq!(local, payload);
        drop(batch);
        conn.kill(Error::Unavailable("test over".into()));
    }
}
