//! The source side of the TCP data protocol as a state machine without
//! sockets, threads or a clock (the model is quinn-proto): it is fed the
//! bytes the driver read (or tells the driver where a WRITE's payload goes,
//! so that the driver reads it straight into registered memory), the bytes
//! the socket took and the time, and it is polled for what to send, when
//! to look again and what to publish. What it needs of its engine —
//! validating a request against the regions, the Describe, admitting a
//! notification, the counters — comes through [`SourceHost`], called
//! synchronously and never holding anything but what it returns.
//!
//! Bounds that hold per frame: before each frame is handled the answers
//! waiting are checked against their bound (4 MiB, 1024 items, a Describe
//! counted by its bytes), and at most one Describe waits at a time (a
//! second DescribeRequest is handled once the first has left): a peer
//! cannot make one read of a few KiB queue megabytes of answers. While a
//! Describe waits with another asked for, nothing more is read from the
//! peer: one that streams DescribeRequests without reading its Describes
//! is held back by its own socket (and cut at the stall bound), as one
//! that does not read its answers is, instead of being parsed for ever.
//!
//! Bounds per turn: the driver opens each turn of its I/O thread with
//! [`SourceCore::begin_turn`]; at most [`TURN_FRAMES`] frames are handled
//! in it (the rest waits, read and not handled, for the next turn) and at
//! most one Describe is built (each costs a table of up to 16 384
//! regions). A peer streaming cheap frames, or DescribeRequests it reads
//! the answers of, gets a bounded slice of the I/O thread while its other
//! connections wait.
//!
//! A WRITE whose payload is cut (the connection ends, for whatever reason,
//! after its request was accepted and before its last byte landed) is told
//! to the host ([`SourceHost::torn`] when some of it landed): its range
//! holds part new, part old bytes.

use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::message::{self, DataRequest, DataResponse, DATA_REQUEST_LEN};
use crate::control::notify_frame::{Notify, NOTIFY_OVERHEAD};
use crate::error::{Error, Result, Status};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the protocol needs of its engine.
pub trait SourceHost {
    /// What keeps a request's memory registered (and the source open)
    /// while it is served; dropped once it has been.
    type Held;
    /// A notification admitted to the inbox, not yet visible.
    type Admitted;
    /// Validates a request (region, bounds, epoch, permission, kind).
    fn validate(&mut self, req: &DataRequest, write: bool) -> Result<Self::Held>;
    /// This engine's current Describe, encoded.
    fn describe(&mut self) -> Vec<u8>;
    /// Offers a notification to the inbox.
    fn admit(&mut self, n: Notify) -> Result<Self::Admitted>;
    /// The largest notification message accepted.
    fn notify_max(&self) -> usize;
    /// Copies `bytes` of a WRITE's payload into registered memory at
    /// `addr` (inside the range a [`SourceHost::Held`] of this connection
    /// keeps registered).
    fn land(&mut self, addr: u64, bytes: &[u8]);
    /// A request was served (`ok`) or refused, with its payload bytes.
    fn served(&mut self, ok: bool, bytes: u64);
    /// A notification was refused for its size.
    fn notify_rejected(&mut self);
    /// The payload of an accepted WRITE was cut after `landed` of its
    /// `req.len` bytes (at least one, fewer than all) reached memory from
    /// `req.addr` on; the connection ended for `why`. `held` is the
    /// request's hold, released when dropped. The WRITE itself is also
    /// counted failed ([`SourceHost::served`]).
    fn torn(&mut self, req: &DataRequest, landed: u64, held: Self::Held, why: &str);
}

/// The stall bounds of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Every frame once started, every MiB of payload, and the answers a
    /// peer must read, within this.
    pub stall: Duration,
    /// Payload must move at this many bytes per second on average beyond
    /// the stall allowance (0: the stall bound alone).
    pub min_rate: u64,
}

/// Answers waiting to leave beyond which no more requests are handled.
pub const OUT_BYTES_MAX: u64 = 4 << 20;
/// Answers (items) waiting to leave beyond which no more requests are handled.
pub const OUT_ITEMS_MAX: usize = 1024;
/// Frames handled in one turn of the driver at most (see the module).
pub const TURN_FRAMES: u32 = 256;
const MIB: u64 = 1 << 20;
/// Items offered to one send.
const SEND_ITEMS: usize = 64;

/// The progress of a payload from or to a peer that must keep pace: each
/// MiB within the stall bound, the whole at the minimum rate.
#[derive(Debug, Clone, Copy)]
struct Pace {
    done: u64,
    stall: Instant,
    overall: Option<Instant>,
    mark: u64,
}

impl Pace {
    fn new(l: &Limits, len: u64, now: Instant) -> Pace {
        let overall = (l.min_rate > 0)
            .then(|| now + l.stall + Duration::from_secs_f64((len as f64 / l.min_rate as f64).min(1e9)));
        Pace { done: 0, stall: now + l.stall, overall, mark: MIB }
    }

    fn advance(&mut self, n: u64, l: &Limits, now: Instant) {
        self.done += n;
        if self.done >= self.mark {
            self.mark = self.done + MIB;
            self.stall = now + l.stall;
        }
    }

    fn restart(&mut self, at: Instant) {
        self.stall = at;
        if let Some(o) = self.overall.as_mut() {
            *o = (*o).max(at);
        }
    }

    fn check(&self, now: Instant, l: &Limits, what: &str) -> Result<()> {
        if now >= self.stall {
            return Err(Error::Protocol(format!("{what} made no progress within the stall bound (peer too slow)")));
        }
        if self.overall.is_some_and(|d| now >= d) {
            return Err(Error::Protocol(format!(
                "{what} moved slower than min_payload_rate_kib ({} KiB/s; peer too slow)",
                l.min_rate / 1024
            )));
        }
        Ok(())
    }

    fn next(&self) -> Instant {
        self.overall.map_or(self.stall, |o| o.min(self.stall))
    }
}

/// What the receive side waits for next.
enum Want<H> {
    Header,
    /// The fixed part of a READ or WRITE request.
    Fixed(FrameHeader),
    /// The whole body of a Notify (within the limit) or Error frame.
    Body(FrameHeader),
    /// The tag of a Notify too large to take (the rest is discarded).
    NotifyTag(FrameHeader),
    /// A WRITE's payload, landing in registered memory.
    Landing {
        req: DataRequest,
        held: H,
        pace: Pace,
    },
    /// Payload to read and drop, then `then`.
    Discard {
        left: u64,
        pace: Pace,
        then: AfterDiscard,
    },
    /// Nothing more is read (EOF, Goodbye, Error, or the connection failed).
    Ended,
}

/// What follows a discarded payload.
enum AfterDiscard {
    Refuse { tag: u64, err: Error },
    RejectNotify { tag: u64, len: usize },
}

/// One thing waiting to leave, in stream order.
enum Item<H, A> {
    Bytes(Vec<u8>),
    /// A READ's payload, from registered memory kept by `held`.
    Payload {
        addr: u64,
        len: u64,
        _held: H,
    },
    /// A notification whose acknowledgement has left: it becomes visible.
    Publish(A),
    /// A Describe's end: the next DescribeRequest may be handled.
    DescribeSent,
    /// Everything before has left: the connection ends.
    Close,
}

/// A piece of what to send: bytes the core holds, or registered memory
/// the driver reads by address (kept registered by the core until sent).
#[derive(Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    /// Bytes.
    Bytes(&'a [u8]),
    /// `len` bytes of registered memory at `addr`.
    Memory {
        /// First byte.
        addr: u64,
        /// Bytes.
        len: u64,
    },
}

/// Where the driver puts the next bytes it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// Straight into registered memory: `len` bytes at `addr` (a WRITE's
    /// payload), then [`SourceCore::landed`].
    Direct {
        /// First byte to fill.
        addr: u64,
        /// Bytes still to come.
        len: u64,
    },
    /// Into the driver's buffer, then [`SourceCore::received`].
    Buffer,
    /// Not now: too many answers wait (read again once they have room).
    Paused,
    /// Never again.
    Ended,
}

/// After a send: what the connection does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterSend {
    /// Nothing waits to leave.
    Idle,
    /// More waits (the socket took all it was offered).
    More,
    /// Everything has left and the connection is to end.
    Close,
}

/// The source side of one connection.
pub struct SourceCore<H: SourceHost> {
    limits: Limits,
    want: Want<H::Held>,
    /// Bytes of an unfinished header, fixed part or body.
    partial: Vec<u8>,
    /// When the unit being gathered in `partial` must be complete.
    deadline: Option<Instant>,
    /// Reading stopped because too many answers wait.
    paused: bool,
    /// Bytes read and not yet handled (from `stash_at` on): handling
    /// stops at a frame boundary while the answers are at their bound, or
    /// once the turn's frames are used.
    stash: Vec<u8>,
    stash_at: usize,
    /// Frames handled since the driver's turn began.
    turn_frames: u32,
    /// A Describe was built in this turn (the next waits for the next turn).
    turn_described: bool,
    items: VecDeque<Item<H::Held, H::Admitted>>,
    /// Bytes of the first item already sent.
    at: usize,
    /// Bytes queued and not yet sent.
    bytes: u64,
    /// The pace of what is being sent (set while anything waits).
    out_pace: Option<Pace>,
    /// A Describe waits to leave.
    describing: bool,
    /// A DescribeRequest came while one waited, or after one was built in
    /// this turn: answered once it has left, in a later turn (however
    /// many came meanwhile).
    describe_due: bool,
    /// Notifications whose acknowledgement has left, for the driver.
    published: Vec<H::Admitted>,
    /// When the bounds were last checked: a check that comes much later
    /// (this process was stopped, or starved) restarts them instead of
    /// blaming the peer for a pause that was ours.
    last_check: Option<Instant>,
}

impl<H: SourceHost> SourceCore<H> {
    /// A connection whose handshake is done.
    pub fn new(limits: Limits) -> SourceCore<H> {
        SourceCore {
            limits,
            want: Want::Header,
            partial: Vec::new(),
            deadline: None,
            paused: false,
            stash: Vec::new(),
            stash_at: 0,
            turn_frames: 0,
            turn_described: false,
            items: VecDeque::new(),
            at: 0,
            bytes: 0,
            out_pace: None,
            describing: false,
            describe_due: false,
            published: Vec::new(),
            last_check: None,
        }
    }

    fn full(&self) -> bool {
        self.bytes >= OUT_BYTES_MAX || self.items.len() >= OUT_ITEMS_MAX
    }

    /// A turn of the driver begins: [`TURN_FRAMES`] more frames may be
    /// handled, and one Describe built (a due one first).
    pub fn begin_turn(&mut self, host: &mut H) {
        self.turn_frames = 0;
        self.turn_described = false;
        if self.describe_due && !self.describing {
            self.describe_due = false;
            self.queue_describe(host);
        }
    }

    /// Whether a Describe is due and waits for the next turn to be built
    /// (the driver runs one at once).
    pub fn describe_deferred(&self) -> bool {
        self.describe_due && !self.describing
    }

    /// Whether this turn's frames are used.
    fn turn_used(&self) -> bool {
        self.turn_frames >= TURN_FRAMES
    }

    /// Whether reading has ended.
    pub fn ended(&self) -> bool {
        matches!(self.want, Want::Ended)
    }

    /// Where the next bytes read go. Resumes a paused connection whose
    /// answers have room again (its bounds restart: the peer was not the
    /// slow one meanwhile).
    pub fn recv(&mut self, now: Instant) -> Recv {
        if self.ended() {
            return Recv::Ended;
        }
        if self.answers_full() || self.stashed() || self.turn_used() {
            self.paused = true;
            return Recv::Paused;
        }
        if std::mem::take(&mut self.paused) {
            let restart = now + self.limits.stall;
            if self.deadline.is_some() {
                self.deadline = Some(restart);
            }
            if let Want::Landing { pace, .. } | Want::Discard { pace, .. } = &mut self.want {
                pace.restart(restart);
            }
        }
        match &self.want {
            Want::Landing { req, pace, .. } => Recv::Direct { addr: req.addr + pace.done, len: req.len - pace.done },
            _ => Recv::Buffer,
        }
    }

    /// Payload bytes still to come straight into memory (the driver's
    /// receive low-water mark), if a WRITE's payload is being read.
    pub fn payload_left(&self) -> Option<u64> {
        match &self.want {
            Want::Landing { req, pace, .. } => Some(req.len - pace.done),
            _ => None,
        }
    }

    /// `n` bytes the driver read straight into the memory [`Recv::Direct`]
    /// named.
    pub fn landed(&mut self, n: u64, now: Instant, host: &mut H) {
        if let Want::Landing { pace, .. } = &mut self.want {
            pace.advance(n, &self.limits, now);
        }
        self.landing_done(host);
    }

    /// What to send now, in stream order (at most 64 items), and how many
    /// bytes of the first are sent already; empty when nothing can leave
    /// (nothing waits, or a publication or the close is next: see
    /// [`SourceCore::after_send`]).
    pub fn transmit(&mut self, now: Instant) -> (Vec<Segment<'_>>, usize) {
        if !self.items.is_empty() && self.out_pace.is_none() {
            self.out_pace = Some(Pace::new(&self.limits, self.bytes, now));
        }
        let mut out = Vec::with_capacity(SEND_ITEMS.min(self.items.len()));
        for item in self.items.iter().take(SEND_ITEMS) {
            match item {
                Item::Bytes(v) => out.push(Segment::Bytes(v)),
                Item::Payload { addr, len, .. } => out.push(Segment::Memory { addr: *addr, len: *len }),
                Item::Publish(_) | Item::DescribeSent | Item::Close => break,
            }
        }
        (out, self.at)
    }

    /// The socket took `n` more bytes of what [`SourceCore::transmit`] offered.
    pub fn sent(&mut self, mut n: usize, now: Instant) {
        self.bytes -= n as u64;
        if let Some(p) = self.out_pace.as_mut() {
            p.advance(n as u64, &self.limits, now);
        }
        while n > 0 {
            let size = match self.items.front() {
                Some(Item::Bytes(v)) => v.len(),
                Some(Item::Payload { len, .. }) => *len as usize,
                _ => unreachable!("only data items are offered"),
            };
            let left = size - self.at;
            if n >= left {
                n -= left;
                self.at = 0;
                self.items.pop_front();
            } else {
                self.at += n;
                n = 0;
            }
        }
    }

    /// Settles what reached the front after a send: notifications whose
    /// acknowledgement has left are handed out ([`SourceCore::take_published`]),
    /// a Describe that has left lets the next be handled.
    pub fn after_send(&mut self, host: &mut H) -> AfterSend {
        loop {
            match self.items.front() {
                Some(Item::Close) => return AfterSend::Close,
                Some(Item::Publish(_)) => {
                    if let Some(Item::Publish(a)) = self.items.pop_front() {
                        self.published.push(a);
                    }
                }
                Some(Item::DescribeSent) => {
                    self.items.pop_front();
                    self.describing = false;
                    if self.describe_due && !self.turn_described {
                        self.describe_due = false;
                        self.queue_describe(host);
                    }
                }
                None => {
                    self.out_pace = None;
                    return AfterSend::Idle;
                }
                Some(_) => return AfterSend::More,
            }
        }
    }

    /// Notifications to make visible now (their acknowledgement left).
    pub fn take_published(&mut self) -> Vec<H::Admitted> {
        std::mem::take(&mut self.published)
    }

    /// Whether bytes read wait to be handled (the driver calls
    /// [`SourceCore::resume`] once answers have room).
    pub fn stashed(&self) -> bool {
        self.stash_at < self.stash.len()
    }

    /// Whether the answers waiting are at their bound, or a Describe waits
    /// with another asked for: nothing more is read from the peer until
    /// they leave (what was read is still handled, within the bound).
    pub fn answers_full(&self) -> bool {
        self.full() || self.describe_due
    }

    /// The answers waiting now: bytes and items.
    pub fn queued(&self) -> (u64, usize) {
        (self.bytes, self.items.len())
    }

    /// Stall bounds at `now`: a frame started and not completed in time, a
    /// payload too slow, answers the peer does not read. The driver checks
    /// every tick; a check that comes more than half a stall bound after
    /// the last one means this process did not run meanwhile (stopped,
    /// starved): the bounds restart from `now` instead.
    pub fn check(&mut self, now: Instant) -> Result<()> {
        let paused_here = self.last_check.is_some_and(|t| now.saturating_duration_since(t) > self.limits.stall / 2);
        self.last_check = Some(now);
        if paused_here {
            self.restart_bounds(now);
            return Ok(());
        }
        match &self.want {
            // Not reading (answers wait): the peer is not the slow one.
            _ if self.paused => {}
            Want::Landing { pace, .. } | Want::Discard { pace, .. } => pace.check(now, &self.limits, "payload")?,
            _ if self.deadline.is_some_and(|d| now >= d) => {
                let what = match &self.want {
                    Want::Header => format!("frame header not completed within {:?}", self.limits.stall),
                    Want::Fixed(_) => "request header not completed in time".to_string(),
                    _ => "frame body not completed in time".to_string(),
                };
                return Err(Error::Protocol(format!("{what} (peer too slow)")));
            }
            _ => {}
        }
        if let Some(p) = &self.out_pace {
            if !self.items.is_empty() {
                p.check(now, &self.limits, "response (peer not reading)")?;
            }
        }
        Ok(())
    }

    fn restart_bounds(&mut self, now: Instant) {
        let at = now + self.limits.stall;
        if self.deadline.is_some() {
            self.deadline = Some(at);
        }
        if let Want::Landing { pace, .. } | Want::Discard { pace, .. } = &mut self.want {
            pace.restart(at);
        }
        if let Some(p) = self.out_pace.as_mut() {
            p.restart(at);
        }
    }

    /// The earliest time [`SourceCore::check`] can fail.
    pub fn next_deadline(&self) -> Option<Instant> {
        let rx = match &self.want {
            _ if self.paused => None,
            Want::Landing { pace, .. } | Want::Discard { pace, .. } => Some(pace.next()),
            _ => self.deadline,
        };
        let tx = self.out_pace.filter(|_| !self.items.is_empty()).map(|p| p.next());
        // While a bound runs, checks come at least every quarter of a stall
        // bound: `check` reads a longer gap as this process not running and
        // restarts the bounds, so a check only at the bound itself would
        // restart them for ever and never cut a peer.
        let cadence = self.last_check.map(|t| t + self.limits.stall / 4).filter(|_| rx.is_some() || tx.is_some());
        rx.into_iter().chain(tx).chain(cadence).min()
    }

    /// The connection fails for `e`: nothing more is read, and the answers
    /// waiting (their memory holds, unpublished notifications) are dropped;
    /// a WRITE whose payload was landing is cut (told to `host`). Returns
    /// the Error frame to tell the peer of a protocol error, or of a sealed
    /// record that failed its check (`PermissionDenied`: the answer leaves
    /// sealed, so the requester can believe it), when no answer was half
    /// sent.
    pub fn fail(&mut self, e: &Error, host: &mut H) -> Option<Vec<u8>> {
        let told = match e {
            Error::Protocol(_) | Error::PermissionDenied(_) if self.at == 0 => {
                let body = message::encode_error(e.status(), e.message());
                let mut f = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
                f.extend_from_slice(&body);
                Some(f)
            }
            _ => None,
        };
        self.close(host, &e.to_string());
        told
    }

    /// The connection is over: everything held is released (a WRITE whose
    /// payload was landing is cut, told to `host`).
    pub fn end(&mut self, host: &mut H) {
        self.close(host, "the connection ended");
    }

    fn close(&mut self, host: &mut H, why: &str) {
        if let Want::Landing { req, held, pace } = std::mem::replace(&mut self.want, Want::Ended) {
            host.served(false, 0);
            if pace.done > 0 {
                host.torn(&req, pace.done, held, why);
            }
        }
        self.items.clear();
        self.stash = Vec::new();
        self.stash_at = 0;
        self.bytes = 0;
        self.at = 0;
    }
}

mod receive;

#[cfg(test)]
mod tests;
