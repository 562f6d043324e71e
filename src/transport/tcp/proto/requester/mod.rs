//! The requester side of the TCP data protocol as a state machine without
//! sockets, threads or a clock (the model is quinn-proto). It is fed
//! submissions, the bytes the driver read (or tells the driver where a
//! READ's payload goes, so that it is read straight into local memory),
//! the bytes the socket took and the time; it is polled for what to send
//! (frames, and WRITE payloads by address), what completed, and what the
//! source said (Revoke, a fresh Describe, a notification's verdict).
//!
//! A request carries two things of the driver's that the core never looks
//! into: `T`, its completion record (handed back with its outcome), and
//! `H`, what keeps its local memory registered (dropped once the core is
//! done with the memory: at completion, or, for a WRITE failed at its
//! deadline while its payload was leaving, once its bytes have left).
//!
//! A request that passes its deadline is failed on its own and its answer,
//! when it comes, is checked and dropped (the connection stays in step);
//! the connection ends on a protocol error, the peer's end, an unanswered
//! notification, a WRITE payload stuck past [`WRITE_OVERRUN`] or more than
//! [`ABANDONED_MAX`] abandoned requests.

use super::source::Segment;
use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::message::{self, DataRequest, DataResponse, Describe, DATA_RESPONSE_LEN, MAX_REASON};
use crate::error::{Error, Result, Status};
use crate::transfer::{ChunkOutcome, Op, RemoteEffect};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most requests a connection remembers as abandoned (failed at their
/// deadline, answer still to come); beyond, it is cut instead.
pub const ABANDONED_MAX: usize = 1 << 16;

/// How long past its deadline a WRITE's payload may take to leave (the
/// request was failed at the deadline; its bytes keep the stream in step)
/// before the connection is cut.
pub const WRITE_OVERRUN: Duration = Duration::from_secs(60);

/// WRITEs of at most this many bytes may be sent by the submitting thread
/// itself.
pub const SMALL_WRITE: u64 = 64 * 1024;

/// A request's completion record, as the core needs it.
pub trait Startable {
    /// Whether the request may still start (its batch was not cancelled);
    /// asked once, when its frame is about to be sent.
    fn start(&self) -> bool;
}

/// One request (or a piece of a split one) to send.
pub struct Send<T, H> {
    /// Direction.
    pub op: Op,
    /// Local address (an opaque token to the core).
    pub local_addr: u64,
    /// Remote address.
    pub remote_addr: u64,
    /// Bytes.
    pub len: u64,
    /// The remote region's epoch the requester knows.
    pub region_epoch: u64,
    /// When it fails unanswered.
    pub deadline: Instant,
    /// Its completion record.
    pub done: T,
    /// What keeps its local memory registered.
    pub hold: H,
}

/// A submission's requests, in order, with the earliest of their
/// deadlines, known before they are pushed (a submission has one
/// deadline), so that neither pushing nor queueing them takes a look at
/// each one's.
pub struct Sends<T, H> {
    reqs: Vec<Send<T, H>>,
    due: Option<Instant>,
}

impl<T, H> Sends<T, H> {
    /// Room for `n` requests of one submission, each due at `deadline`.
    pub fn due_at(n: usize, deadline: Instant) -> Sends<T, H> {
        Sends { reqs: Vec::with_capacity(n), due: Some(deadline) }
    }

    /// Appends a request. Its deadline counts towards the earliest one
    /// (one comparison: it is usually the submission's, given to
    /// [`Sends::due_at`]), so that no request is queued without its
    /// deadline being watched, whoever made the `Sends`.
    pub fn push(&mut self, r: Send<T, H>) {
        if self.due.is_none_or(|d| r.deadline < d) {
            self.due = Some(r.deadline);
        }
        self.reqs.push(r);
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
}

impl<T, H> Default for Sends<T, H> {
    fn default() -> Self {
        Sends { reqs: Vec::new(), due: None }
    }
}

impl<T, H> From<Vec<Send<T, H>>> for Sends<T, H> {
    fn from(reqs: Vec<Send<T, H>>) -> Self {
        let due = reqs.iter().map(|r| r.deadline).min();
        Sends { reqs, due }
    }
}

struct Entry<T, H> {
    op: Op,
    len: u64,
    local_addr: u64,
    remote_addr: u64,
    deadline: Instant,
    done: T,
    hold: Option<H>,
    /// A WRITE whose payload is being sent (whoever sends settles it).
    sending: bool,
    /// The answer that came while its payload was still being sent.
    early: Option<ChunkOutcome>,
}

/// One WRITE in the buffer being sent.
struct QueuedWrite<H> {
    head_start: usize,
    head_end: usize,
    addr: u64,
    len: u64,
    tag: u64,
    deadline: Instant,
    /// Set when its request was failed at its deadline before its payload
    /// left: the local memory stays held until it has.
    hold: Option<H>,
}

/// Frames leaving together: request frames and WRITE headers in `bytes`,
/// each WRITE's payload by address, in stream order; `sent` bytes of it on
/// the socket already.
struct Outbuf<H> {
    bytes: Vec<u8>,
    writes: Vec<QueuedWrite<H>>,
    payload: u64,
    sent: u64,
}

impl<H> Default for Outbuf<H> {
    fn default() -> Self {
        Outbuf { bytes: Vec::new(), writes: Vec::new(), payload: 0, sent: 0 }
    }
}

impl<H> Outbuf<H> {
    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    fn total(&self) -> u64 {
        self.bytes.len() as u64 + self.payload
    }
    fn full(&self) -> bool {
        self.total() >= 256 * 1024 || self.writes.len() >= 64
    }
}

/// What waits to be sent, in order.
enum Outgoing<T, H> {
    /// A submission's requests, as it handed them over (never empty): the
    /// queue takes them in one step, without moving each (a `VecDeque`
    /// made from a `Vec` keeps its buffer).
    Reqs(VecDeque<Send<T, H>>),
    Notify {
        tag: u64,
        body: Vec<u8>,
    },
    Frame(Vec<u8>),
}

impl<T, H> Outgoing<T, H> {
    /// The requests, notifications and frames it holds.
    fn len(&self) -> usize {
        match self {
            Outgoing::Reqs(reqs) => reqs.len(),
            _ => 1,
        }
    }
}

struct NotePending<N> {
    deadline: Instant,
    written: bool,
    answer: N,
}

/// What the receive side waits for next.
enum Want<T, H> {
    Header,
    Body(FrameHeader),
    Fixed(FrameHeader),
    /// The failure text of a refused request (`done` None: a WRITE still
    /// being sent, which stays pending under `tag`; or an abandoned one).
    Reason {
        done: Option<(T, Instant)>,
        tag: u64,
        len: usize,
        status: Status,
    },
    /// A READ's payload, landing in local memory (kept by `hold`).
    Payload {
        addr: u64,
        len: u64,
        done_bytes: u64,
        deadline: Instant,
        record: T,
        hold: Option<H>,
    },
    /// Bytes of an abandoned request's answer, read and dropped.
    Discard {
        left: u64,
    },
}

/// Where the driver puts the next bytes it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// Straight into local memory: `len` bytes at `addr`, then
    /// [`RequesterCore::landed`].
    Direct {
        /// First byte to fill.
        addr: u64,
        /// Bytes still to come.
        len: u64,
    },
    /// Into the driver's buffer, then [`RequesterCore::received`].
    Buffer,
}

/// What the source said, besides answers.
pub enum Event<N> {
    /// The source asks for its imports back.
    Revoke,
    /// A fresh Describe arrived (the core keeps it).
    Described,
    /// The connection ended with Describe requests unanswered: whoever
    /// waits for one learns the end's reason now, not at its deadline.
    DescribeLost,
    /// A notification's verdict, and whether its frame may have reached
    /// the peer.
    NotifyAnswer(N, Result<()>, bool),
}

/// Copies READ payload bytes into local memory (the driver's part: the
/// core holds no pointer).
pub trait Land {
    /// Copies `bytes` to local memory at `addr` (inside a range a request's
    /// `H` keeps registered).
    fn land(&mut self, addr: u64, bytes: &[u8]);
}

impl<F: FnMut(u64, &[u8])> Land for F {
    fn land(&mut self, addr: u64, bytes: &[u8]) {
        self(addr, bytes)
    }
}

/// The requester side of one connection.
pub struct RequesterCore<T, H, N> {
    label: String,
    next_tag: u64,
    queue: VecDeque<Outgoing<T, H>>,
    /// No request in `queue` has a deadline before this (it may be
    /// earlier than the earliest left: `fill` takes requests out).
    queued_due: Option<Instant>,
    out: Outbuf<H>,
    pending: BTreeMap<u64, Entry<T, H>>,
    abandoned: BTreeMap<u64, (Op, u64)>,
    notes: BTreeMap<u64, NotePending<N>>,
    want: Want<T, H>,
    partial: Vec<u8>,
    describe: Arc<Describe>,
    describe_generation: u64,
    /// DescribeRequests queued or sent and not yet answered.
    describes_awaited: usize,
    /// Why the connection is over (nothing more is sent or read).
    dead: Option<Error>,
    /// The peer ended the stream in order (Goodbye or EOF between frames).
    closed_by_peer: bool,
    done: Vec<(T, ChunkOutcome)>,
    events: Vec<Event<N>>,
    /// Answers read and dropped (their request was failed at its deadline),
    /// since the driver last took the count.
    pub dropped: u64,
    /// Notification frames put on the wire, since the driver last took the
    /// count.
    pub notes_sent: u64,
    /// Bug switches for the simulator (`tests/sim_tcp.rs`), off unless a
    /// test turns one on to show the simulator finds that class of bug
    /// (compiled only for tests and with the `sim` feature).
    #[cfg(any(test, feature = "sim"))]
    pub mutations: Mutations,
}

/// Bugs of the past the simulator must find, re-introduced on demand.
#[cfg(any(test, feature = "sim"))]
#[derive(Debug, Clone, Copy, Default)]
pub struct Mutations {
    /// A WRITE answered while its payload is still being sent completes at
    /// once (its local memory released while still being read).
    pub complete_early_writes: bool,
    /// Requests still queued behind a buffer the socket does not take are
    /// failed only once they are taken from the queue, however long after
    /// their deadline.
    pub keep_queued_past_deadline: bool,
    /// A WRITE whose deadline passed while its payload was being sent lets
    /// its local memory go at once, although the rest of its payload is
    /// still to be read from it.
    pub release_expired_writes_mid_payload: bool,
}

impl<T: Startable, H, N> RequesterCore<T, H, N> {
    /// A connection whose handshake is done, with the peer's Describe.
    pub fn new(label: String, peer: Describe) -> RequesterCore<T, H, N> {
        RequesterCore {
            label,
            next_tag: 1,
            queue: VecDeque::new(),
            queued_due: None,
            out: Outbuf::default(),
            pending: BTreeMap::new(),
            abandoned: BTreeMap::new(),
            notes: BTreeMap::new(),
            want: Want::Header,
            partial: Vec::new(),
            describe: Arc::new(peer),
            describe_generation: 0,
            describes_awaited: 0,
            dead: None,
            closed_by_peer: false,
            done: Vec::new(),
            events: Vec::new(),
            dropped: 0,
            notes_sent: 0,
            #[cfg(any(test, feature = "sim"))]
            mutations: Mutations::default(),
        }
    }

    fn tag(&mut self) -> u64 {
        let t = self.next_tag;
        self.next_tag += 1;
        t
    }

    /// Why the connection is over, if it is.
    pub fn dead(&self) -> Option<&Error> {
        self.dead.as_ref()
    }

    /// Why nothing more can be sent: the error that ended the connection.
    fn closed_reason(&self) -> Error {
        self.dead.clone().unwrap_or_else(|| Error::Unavailable(format!("connection to {} is closed", self.label)))
    }

    /// The peer's latest Describe, and how many have come since the first.
    pub fn describe(&self) -> (Arc<Describe>, u64) {
        (self.describe.clone(), self.describe_generation)
    }

    /// Requests, notifications and frames queued or awaiting an answer.
    pub fn outstanding(&self) -> usize {
        self.queue.iter().map(Outgoing::len).sum::<usize>() + self.pending.len() + self.notes.len()
    }

    /// Queues requests behind what waits (failed at once when the
    /// connection is over). Returns whether they may be sent at once by
    /// the submitting thread: nothing else waits and they are READs and
    /// small WRITEs (at most 256 of them and 256 KiB of payload).
    pub fn submit(&mut self, reqs: impl Into<Sends<T, H>>) -> bool {
        let Sends { reqs, due } = reqs.into();
        if self.dead.is_some() {
            let e = self.closed_reason();
            for r in reqs {
                self.done.push((r.done, ChunkOutcome::failed(e.clone(), RemoteEffect::None)));
            }
            return false;
        }
        let at_once = self.queue.is_empty()
            && self.out.is_empty()
            && reqs.len() <= 256
            && reqs.iter().all(|r| r.op == Op::Read || r.len <= SMALL_WRITE)
            && reqs.iter().filter(|r| r.op == Op::Write).map(|r| r.len).sum::<u64>() <= 256 * 1024;
        self.queued_due = due.into_iter().chain(self.queued_due).min();
        if !reqs.is_empty() {
            self.queue.push_back(Outgoing::Reqs(VecDeque::from(reqs)));
        }
        at_once
    }

    /// No queued request has a deadline before this (`None`: none is
    /// queued, or the connection is over).
    pub fn queued_due(&self) -> Option<Instant> {
        self.queued_due
    }

    /// Queues a notification's frame (built by `body` from its tag).
    pub fn notify(&mut self, body: impl FnOnce(u64) -> Vec<u8>, deadline: Instant, answer: N) {
        if self.dead.is_some() {
            let e = self.closed_reason();
            self.events.push(Event::NotifyAnswer(answer, Err(e), false));
            return;
        }
        let tag = self.tag();
        self.notes.insert(tag, NotePending { deadline, written: false, answer });
        self.queue.push_back(Outgoing::Notify { tag, body: body(tag) });
    }

    /// Queues a DescribeRequest. `Err` when the connection is over.
    pub fn request_describe(&mut self) -> Result<()> {
        if self.dead.is_some() {
            return Err(self.closed_reason());
        }
        self.queue.push_back(Outgoing::Frame(FrameHeader::encode(MsgKind::DescribeRequest, 0).to_vec()));
        self.describes_awaited += 1;
        Ok(())
    }

    /// Whether anything waits to be sent.
    pub fn wants_send(&self) -> bool {
        self.dead.is_none() && (!self.out.is_empty() || !self.queue.is_empty())
    }

    /// Fills the buffer being sent from the queue when it is empty (a
    /// request whose deadline passed, or whose batch was cancelled, is
    /// failed instead), and returns what to send: segments in stream order
    /// and how many bytes of them are on the socket already. Empty when
    /// nothing waits.
    pub fn transmit(&mut self, now: Instant) -> (Vec<Segment<'_>>, u64) {
        if self.out.is_empty() && self.dead.is_none() {
            self.fill(now);
        }
        let mut parts = Vec::with_capacity(2 * self.out.writes.len() + 1);
        let mut at = 0;
        for w in &self.out.writes {
            parts.push(Segment::Bytes(&self.out.bytes[at..w.head_end]));
            parts.push(Segment::Memory { addr: w.addr, len: w.len });
            at = w.head_end;
        }
        if at < self.out.bytes.len() {
            parts.push(Segment::Bytes(&self.out.bytes[at..]));
        }
        (parts, self.out.sent)
    }

    fn fill(&mut self, now: Instant) {
        while let Some(item) = self.queue.pop_front() {
            match item {
                Outgoing::Reqs(mut reqs) => {
                    while !self.out.full() {
                        let Some(r) = reqs.pop_front() else { break };
                        self.add(r, now);
                    }
                    if !reqs.is_empty() {
                        self.queue.push_front(Outgoing::Reqs(reqs));
                    }
                }
                Outgoing::Notify { tag, body } => {
                    if let Some(p) = self.notes.get_mut(&tag) {
                        p.written = true;
                        self.notes_sent += 1;
                        self.out.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::Notify, body.len() as u32));
                        self.out.bytes.extend_from_slice(&body);
                    }
                }
                Outgoing::Frame(f) => self.out.bytes.extend_from_slice(&f),
            }
            if self.out.full() {
                break;
            }
        }
    }

    /// Appends a request's frame, or fails it (deadline passed, cancelled).
    fn add(&mut self, r: Send<T, H>, now: Instant) {
        if now >= r.deadline {
            let e = Error::TimedOut(format!("deadline passed before the request was sent to {}", self.label));
            self.done.push((r.done, ChunkOutcome::failed(e, RemoteEffect::None)));
            return;
        }
        if !r.done.start() {
            let e = Error::Cancelled("cancelled before it started".into());
            self.done.push((r.done, ChunkOutcome::failed(e, RemoteEffect::None)));
            return;
        }
        let tag = self.tag();
        let req = DataRequest { tag, region_epoch: r.region_epoch, addr: r.remote_addr, len: r.len };
        match r.op {
            Op::Read => {
                self.out.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::ReadRequest, 32));
                self.out.bytes.extend_from_slice(&req.encode());
            }
            Op::Write => {
                let head_start = self.out.bytes.len();
                self.out.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::WriteRequest, (32 + r.len) as u32));
                self.out.bytes.extend_from_slice(&req.encode());
                self.out.payload += r.len;
                self.out.writes.push(QueuedWrite {
                    head_start,
                    head_end: self.out.bytes.len(),
                    addr: r.local_addr,
                    len: r.len,
                    tag,
                    deadline: r.deadline,
                    hold: None,
                });
            }
        }
        let entry = Entry {
            op: r.op,
            len: r.len,
            local_addr: r.local_addr,
            remote_addr: r.remote_addr,
            deadline: r.deadline,
            done: r.done,
            hold: Some(r.hold),
            sending: r.op == Op::Write,
            early: None,
        };
        self.pending.insert(tag, entry);
    }

    /// The socket took `n` more bytes of what [`RequesterCore::transmit`]
    /// offered. Returns whether the buffer was all sent (then settled: its
    /// WRITEs await their answers).
    pub fn sent(&mut self, n: u64) -> bool {
        self.out.sent += n;
        if self.out.sent < self.out.total() {
            return false;
        }
        self.settle(None);
        true
    }

    /// Settles the buffer: all sent (`failed` None), each WRITE then awaits
    /// its answer (or completes with one that came early); or failed, each
    /// WRITE failing with the effect its first byte allows, and saying how
    /// much of its payload left (a coalesced run's requests beyond it sent
    /// nothing).
    fn settle(&mut self, failed: Option<&Error>) {
        let out = std::mem::take(&mut self.out);
        let mut before = 0u64;
        for w in out.writes {
            let start = w.head_start as u64 + before;
            let payload_start = w.head_end as u64 + before;
            before += w.len;
            // An abandoned WRITE's memory is free once its bytes left.
            drop(w.hold);
            let Some(e) = self.pending.get_mut(&w.tag) else { continue };
            match failed {
                None => {
                    e.sending = false;
                    if e.early.is_some() {
                        let mut e = self.pending.remove(&w.tag).expect("present");
                        let outcome = e.early.take().expect("answered early");
                        drop(e.hold.take());
                        self.done.push((e.done, outcome));
                    }
                }
                Some(err) => {
                    let mut e = self.pending.remove(&w.tag).expect("present");
                    drop(e.hold.take());
                    let outcome = match out.sent > start {
                        true => ChunkOutcome::failed(err.clone(), RemoteEffect::Unknown)
                            .reaching(out.sent.saturating_sub(payload_start).min(w.len)),
                        false => ChunkOutcome::failed(err.clone(), RemoteEffect::None),
                    };
                    self.done.push((e.done, outcome));
                }
            }
        }
    }

    /// The send failed (the socket is broken): the buffer's WRITEs fail
    /// with the effect their first byte allows, and the connection ends.
    pub fn send_failed(&mut self, e: Error, now: Instant) {
        self.settle(Some(&e));
        self.kill(e, now);
    }

    /// The Goodbye frame to send before an orderly close, when nothing is
    /// half written (`None` otherwise: the close just cuts).
    pub fn goodbye(&self) -> Option<Vec<u8>> {
        (self.dead.is_none() && self.out.is_empty()).then(|| FrameHeader::encode(MsgKind::Goodbye, 0).to_vec())
    }

    /// The Error frame telling the peer of a protocol error, when nothing
    /// is half written.
    pub fn protocol_error_frame(&self, e: &Error) -> Option<Vec<u8>> {
        match e {
            Error::Protocol(m) if self.out.sent == 0 => {
                let body = message::encode_error(Status::ProtocolError, m);
                let mut f = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
                f.extend_from_slice(&body);
                Some(f)
            }
            _ => None,
        }
    }

    /// Completions to deliver (once no lock of the connection is held).
    pub fn take_done(&mut self) -> Vec<(T, ChunkOutcome)> {
        std::mem::take(&mut self.done)
    }

    /// Events to act on (once no lock of the connection is held).
    pub fn take_events(&mut self) -> Vec<Event<N>> {
        std::mem::take(&mut self.events)
    }
}

mod end;
mod receive;

#[cfg(test)]
mod tests;
