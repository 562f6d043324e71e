//! Source side of a control connection. After the handshake (on a
//! short-lived thread of its own, bounded by `handshake_timeout_ms`), the
//! connection is served by the engine's I/O threads
//! ([`crate::transport::reactor`]): requests are parsed as they arrive,
//! WRITE payload lands straight in registered memory, answers (READ
//! payload straight from registered memory) leave coalesced as the socket
//! takes them. A peer that stops reading, or trickles a frame, is cut off
//! at the stall bound; one that pipelines requests without reading its
//! answers is no longer read (the answers waiting are bounded) until it does.

use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::io;
use crate::control::message::{self, DataRequest, DataResponse, Describe, DATA_REQUEST_LEN};
use crate::control::notify::{Notify, NOTIFY_OVERHEAD};
use crate::counters::Counters;
use crate::error::{Error, Result, Status};
use crate::kinds::TransportKind;
use crate::memory::{RegionLease, RegionTable};
use crate::sync::admission::{Gate, GateGuard};
use crate::transport::inbox::{Admitted, Inbox, Notification};
use crate::transport::reactor::{
    read_once, set_rcvlowat, Ended, Flow, Got, Handler, Reactor, Registration, Served, SCRATCH,
};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What the source side needs from its engine.
pub struct SourceContext {
    /// The engine's regions.
    pub regions: Arc<RegionTable>,
    /// Counters.
    pub stats: Arc<Counters>,
    /// Serving stops (requests answered Unavailable) once this is closed.
    pub gate: Arc<Gate>,
    /// Set when the engine shuts down: connections end.
    pub stopping: Arc<AtomicBool>,
    /// Builds this engine's current Describe.
    pub describe: Arc<dyn Fn() -> Describe + Send + Sync>,
    /// Handshake deadline for new connections; also the stall bound: every
    /// frame once started, and every MiB of payload, must move within it.
    pub handshake_timeout: Duration,
    /// Payload must move at this many bytes per second on average beyond
    /// the stall allowance (0: the stall bound alone).
    pub min_payload_rate: u64,
    /// The live connections (for `Revoke`).
    pub revoker: Arc<Revoker>,
    /// Where notifications from requesters wait to be taken.
    pub inbox: Arc<Inbox>,
}

impl SourceContext {
    /// When `len` payload bytes starting now must have moved: the stall
    /// allowance plus `len` at the minimum rate.
    fn payload_deadline(&self, len: u64) -> Option<Instant> {
        let rate = self.min_payload_rate;
        (rate > 0).then(|| {
            let secs = len as f64 / rate as f64;
            Instant::now() + self.handshake_timeout + Duration::from_secs_f64(secs.min(1e9))
        })
    }
}

/// The live control connections of an engine, so that a closing source can
/// ask every requester, at once, to give back what it imported (`Revoke`),
/// instead of waiting for receipts that would come only at the requester's
/// next flush.
#[derive(Default)]
pub struct Revoker {
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Weak<SourceConn>>>,
}

impl Revoker {
    fn add(&self, c: Weak<SourceConn>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(id, c);
        id
    }

    fn remove(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// Queues `Revoke` on every live control connection, behind the answers
    /// already waiting there (it leaves as the socket takes it; a peer that
    /// does not read is cut off at the stall bound). Returns how many were
    /// told.
    pub fn revoke_all(&self) -> usize {
        let conns: Vec<Arc<SourceConn>> = self.conns.lock().values().filter_map(Weak::upgrade).collect();
        conns.iter().filter(|c| c.push_frame(MsgKind::Revoke, &[])).count()
    }
}

/// Answers waiting to leave beyond which no more requests are read.
const OUT_BYTES_MAX: u64 = 4 << 20;
const OUT_ITEMS_MAX: usize = 1024;
/// Most bytes a connection reads, or writes, in one turn of its I/O thread.
const TURN_BYTES: u64 = 4 << 20;
const MIB: u64 = 1 << 20;

/// The progress of a payload from or to a peer that must keep pace: each
/// MiB within the stall bound, the whole at the minimum rate.
struct Pace {
    done: u64,
    stall: Instant,
    overall: Option<Instant>,
    mark: u64,
}

impl Pace {
    fn new(ctx: &SourceContext, len: u64) -> Pace {
        Pace { done: 0, stall: Instant::now() + ctx.handshake_timeout, overall: ctx.payload_deadline(len), mark: MIB }
    }

    fn advance(&mut self, n: u64, ctx: &SourceContext) {
        self.done += n;
        if self.done >= self.mark {
            self.mark = self.done + MIB;
            self.stall = Instant::now() + ctx.handshake_timeout;
        }
    }

    fn check(&self, now: Instant, ctx: &SourceContext, what: &str) -> Result<()> {
        if now >= self.stall {
            return Err(Error::Protocol(format!("{what} made no progress within the stall bound (peer too slow)")));
        }
        if self.overall.is_some_and(|d| now >= d) {
            return Err(Error::Protocol(format!(
                "{what} moved slower than min_payload_rate_kib ({} KiB/s; peer too slow)",
                ctx.min_payload_rate / 1024
            )));
        }
        Ok(())
    }
}

/// What the receive side waits for next.
enum Want {
    /// A frame header (idle until its first byte).
    Header,
    /// The fixed part of a READ or WRITE request.
    Fixed(FrameHeader),
    /// The whole body of a Notify (within the inbox's limit) or Error frame.
    Body(FrameHeader),
    /// The tag of a Notify too large to take (the rest is discarded).
    NotifyTag(FrameHeader),
    /// A WRITE's payload, landing in registered memory.
    Landing { req: DataRequest, held: (RegionLease, GateGuard), pace: Pace },
    /// Payload to read and drop, then `then`.
    Discard { left: u64, pace: Pace, then: AfterDiscard },
    /// The peer ended the stream (EOF, Goodbye, Error): nothing more is read.
    Ended,
}

/// What follows a discarded payload.
enum AfterDiscard {
    /// A refused WRITE's failure answer.
    Refuse { tag: u64, err: Error },
    /// A too large notification's refusal.
    RejectNotify { tag: u64, len: usize },
}

/// The receive side's state (the I/O thread's alone).
struct Rx {
    /// Bytes of an unfinished header, fixed part or body.
    partial: Vec<u8>,
    want: Want,
    /// When the unit being gathered in `partial` must be complete.
    deadline: Option<Instant>,
    /// Reading stopped because too many answers wait (the peer's bounds
    /// do not run meanwhile; they restart when reading resumes).
    paused: bool,
    /// The socket's receive low-water mark now (`SO_RCVLOWAT`).
    lowat: usize,
}

/// One thing waiting to leave, in stream order.
enum Item {
    Bytes(Vec<u8>),
    /// A READ's payload, from registered memory kept registered (and the
    /// source gate open) until it has left.
    Payload {
        addr: u64,
        len: u64,
        _held: (RegionLease, GateGuard),
    },
    /// A notification whose acknowledgement has left: it becomes visible.
    Publish(Admitted),
    /// Everything before has left: the connection ends.
    Close,
}

/// The answers waiting to leave.
struct Out {
    items: VecDeque<Item>,
    /// Bytes of the first item already written.
    at: usize,
    /// Bytes queued and not yet written.
    bytes: u64,
    /// The pace of what is being written (set while anything waits).
    pace: Option<Pace>,
}

impl Out {
    fn push_bytes(&mut self, b: &[u8]) {
        self.bytes += b.len() as u64;
        if let Some(Item::Bytes(v)) = self.items.back_mut() {
            v.extend_from_slice(b);
        } else {
            self.items.push_back(Item::Bytes(b.to_vec()));
        }
    }

    fn full(&self) -> bool {
        self.bytes >= OUT_BYTES_MAX || self.items.len() >= OUT_ITEMS_MAX
    }
}

/// An incoming control connection served by an I/O thread.
pub struct SourceConn {
    stream: TcpStream,
    ctx: Arc<SourceContext>,
    /// The requester's endpoint (a notification's sender when it names none).
    endpoint: String,
    rx: Mutex<Rx>,
    out: Mutex<Out>,
    reg: once_cell::sync::OnceCell<Registration>,
    revoker_id: AtomicU64,
    finished: Ended,
    on_done: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// Answers the handshake of `stream`, whose first frame (after any
/// authentication) has the header `first`, then hands the connection to
/// `reactor`; `on_done` runs when it ends. `None` when the handshake
/// failed (an Error frame was sent and the socket shut down).
pub fn serve(
    ctx: Arc<SourceContext>,
    mut stream: TcpStream,
    first: FrameHeader,
    reactor: &Reactor,
    on_done: Box<dyn FnOnce() + Send>,
) -> Option<Arc<SourceConn>> {
    let stop = || match ctx.stopping.load(Ordering::Acquire) {
        true => Err(Error::Unavailable("engine is shutting down".into())),
        false => Ok(()),
    };
    let handshaken = stream.try_clone().map_err(|e| Error::io("clone socket", &e)).and_then(|mut r| {
        super::handshake::answer(first, &mut r, &mut stream, ctx.handshake_timeout, &stop, || (ctx.describe)())
    });
    let peer = match handshaken {
        Ok(p) => p,
        Err(e) => {
            if let Error::Protocol(_) = e {
                ctx.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                super::handshake::send_error(&mut stream, &e);
            }
            let _ = stream.shutdown(Shutdown::Both);
            return None;
        }
    };
    SourceConn::start(ctx, stream, peer.endpoint, reactor, on_done).ok()
}

impl SourceConn {
    fn start(
        ctx: Arc<SourceContext>,
        stream: TcpStream,
        endpoint: String,
        reactor: &Reactor,
        on_done: Box<dyn FnOnce() + Send>,
    ) -> Result<Arc<SourceConn>> {
        stream.set_nonblocking(true).map_err(|e| Error::io("set_nonblocking", &e))?;
        let _ = stream.set_nodelay(true);
        let c = Arc::new(SourceConn {
            stream,
            ctx,
            endpoint,
            rx: Mutex::new(Rx { partial: Vec::new(), want: Want::Header, deadline: None, paused: false, lowat: 1 }),
            out: Mutex::new(Out { items: VecDeque::new(), at: 0, bytes: 0, pace: None }),
            reg: once_cell::sync::OnceCell::new(),
            revoker_id: AtomicU64::new(u64::MAX),
            finished: Ended::default(),
            on_done: Mutex::new(Some(on_done)),
        });
        c.revoker_id.store(c.ctx.revoker.add(Arc::downgrade(&c)), Ordering::Relaxed);
        match reactor.register(c.stream.as_raw_fd(), c.clone()) {
            Ok(r) => {
                let _ = c.reg.set(r);
                Ok(c)
            }
            Err(e) => {
                c.end();
                Err(e)
            }
        }
    }

    /// Queues a whole control frame; false when the connection has ended.
    fn push_frame(&self, kind: MsgKind, body: &[u8]) -> bool {
        if self.is_finished() {
            return false;
        }
        {
            let mut out = self.out.lock();
            out.push_bytes(&FrameHeader::encode(kind, body.len() as u32));
            out.push_bytes(body);
        }
        if let Some(r) = self.reg.get() {
            r.wake();
        }
        true
    }

    /// The connection is over: releases the answers waiting (leases, gate
    /// guards, unpublished notifications), shuts the socket and tells the
    /// listeners. The caller has set the receive side `Ended` (dropping a
    /// WRITE's lease).
    fn end(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        {
            let mut out = self.out.lock();
            out.items.clear();
            out.bytes = 0;
        }
        self.ctx.revoker.remove(self.revoker_id.load(Ordering::Relaxed));
        self.finished.set();
        if let Some(f) = self.on_done.lock().take() {
            f();
        }
    }

    /// Ends the connection for `e`: a protocol error is counted and told to
    /// the peer (when no answer is half written).
    fn fail(&self, e: &Error, rx: &mut Rx) {
        rx.want = Want::Ended;
        if let Error::Protocol(_) = e {
            self.ctx.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
            let out = self.out.lock();
            if out.at == 0 {
                let body = message::encode_error(e.status(), e.message());
                let h = FrameHeader::encode(MsgKind::Error, body.len() as u32);
                let _ = io::send_parts_from(&self.stream, &[&h, &body], 0);
            }
        }
        self.end();
    }

    /// Writes what waits, as far as the socket takes it. `Ok(true)` when
    /// the connection is to end (a `Close` was reached).
    fn flush(&self, out: &mut Out) -> Result<(bool, Flow)> {
        let mut budget = TURN_BYTES;
        let mut ramp = io::SendRamp::default();
        loop {
            match out.items.front() {
                Some(Item::Close) => return Ok((true, Flow::Idle)),
                Some(Item::Publish(_)) => {
                    if let Some(Item::Publish(a)) = out.items.pop_front() {
                        a.publish();
                    }
                    continue;
                }
                None => {
                    out.pace = None;
                    return Ok((false, Flow::Idle));
                }
                _ => {}
            }
            if budget == 0 {
                return Ok((false, Flow::Again));
            }
            if out.pace.is_none() {
                out.pace = Some(Pace::new(&self.ctx, out.bytes));
            }
            let mut parts: Vec<&[u8]> = Vec::with_capacity(64);
            for item in out.items.iter().take(64) {
                match item {
                    Item::Bytes(v) => parts.push(v),
                    // SAFETY: `_held` keeps the region holding [addr,
                    // addr+len) registered until this item leaves; the range
                    // was bounds-checked by `validate`.
                    Item::Payload { addr, len, .. } => {
                        parts.push(unsafe { std::slice::from_raw_parts(*addr as *const u8, *len as usize) })
                    }
                    Item::Publish(_) | Item::Close => break,
                }
            }
            let r = io::send_parts_upto(&self.stream, &parts, out.at as u64, ramp.cap());
            drop(parts);
            let mut n = match r {
                Ok(0) => return Err(Error::Unavailable("connection closed while answering".into())),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok((false, Flow::Idle)),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Unavailable(format!("connection lost: {e}"))),
            };
            budget = budget.saturating_sub(n as u64);
            out.bytes -= n as u64;
            if let Some(p) = out.pace.as_mut() {
                p.advance(n as u64, &self.ctx);
            }
            while n > 0 {
                let size = match out.items.front() {
                    Some(Item::Bytes(v)) => v.len(),
                    Some(Item::Payload { len, .. }) => *len as usize,
                    _ => unreachable!("only data items were written"),
                };
                let left = size - out.at;
                if n >= left {
                    n -= left;
                    out.at = 0;
                    out.items.pop_front();
                } else {
                    out.at += n;
                    n = 0;
                }
            }
        }
    }

    /// The receive turn: reads what the socket holds while the answers
    /// waiting are few, WRITE payload straight into registered memory.
    /// `Flow::Again` when it stopped with bytes possibly left in the socket
    /// (its share of the turn used, or too many answers waiting: the next
    /// readable edge may never come for those bytes, so the caller runs it
    /// again once the answers have room).
    fn receive(&self, rx: &mut Rx, scratch: &mut [u8]) -> Result<Flow> {
        let mut budget = TURN_BYTES;
        loop {
            if matches!(rx.want, Want::Ended) {
                return Ok(Flow::Idle);
            }
            if self.out.lock().full() {
                rx.paused = true;
                return Ok(Flow::Again);
            }
            if std::mem::take(&mut rx.paused) {
                let restart = Instant::now() + self.ctx.handshake_timeout;
                if rx.deadline.is_some() {
                    rx.deadline = Some(restart);
                }
                if let Want::Landing { pace, .. } | Want::Discard { pace, .. } = &mut rx.want {
                    pace.stall = restart;
                    if let Some(o) = pace.overall.as_mut() {
                        *o = (*o).max(restart);
                    }
                }
            }
            if budget == 0 {
                return Ok(Flow::Again);
            }
            let direct = match &rx.want {
                Want::Landing { req, pace, .. } if req.len - pace.done >= (SCRATCH / 2) as u64 => {
                    // SAFETY: the lease in `held` keeps [addr, addr+len)
                    // inside a registered region that allows remote WRITE;
                    // only this thread writes it for this request.
                    Some(unsafe {
                        std::slice::from_raw_parts_mut(
                            (req.addr + pace.done) as *mut u8,
                            (req.len - pace.done) as usize,
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
                        Want::Landing { req, pace, .. } => Some(req.len - pace.done),
                        _ => None,
                    };
                    set_rcvlowat(self.stream.as_raw_fd(), &mut rx.lowat, left);
                    return Ok(Flow::Idle);
                }
                Got::Eof if !matches!(rx.want, Want::Header) || !rx.partial.is_empty() => {
                    return Err(Error::Unavailable("peer closed the connection mid-frame".into()));
                }
                Got::Eof => {
                    rx.want = Want::Ended;
                    self.out.lock().items.push_back(Item::Close);
                    return Ok(Flow::Idle);
                }
            };
            budget = budget.saturating_sub(n as u64);
            if to_scratch {
                self.feed(rx, &scratch[..n])?;
            } else if let Want::Landing { pace, .. } = &mut rx.want {
                pace.advance(n as u64, &self.ctx);
                self.landed(rx);
            }
        }
    }

    /// Consumes received bytes.
    fn feed(&self, rx: &mut Rx, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            match &mut rx.want {
                Want::Ended => return Ok(()),
                Want::Landing { req, pace, .. } => {
                    let n = ((req.len - pace.done) as usize).min(data.len());
                    // SAFETY: as in `receive`; `done + n <= len`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data.as_ptr(), (req.addr + pace.done) as *mut u8, n);
                    }
                    pace.advance(n as u64, &self.ctx);
                    data = &data[n..];
                    self.landed(rx);
                    continue;
                }
                Want::Discard { left, pace, .. } => {
                    let n = (*left as usize).min(data.len());
                    *left -= n as u64;
                    pace.advance(n as u64, &self.ctx);
                    data = &data[n..];
                    self.discarded(rx);
                    continue;
                }
                _ => {}
            }
            let need = match &rx.want {
                Want::Header => FRAME_HEADER_LEN,
                Want::Fixed(_) => DATA_REQUEST_LEN,
                Want::Body(h) => h.body_len as usize,
                Want::NotifyTag(_) => 8,
                _ => unreachable!("handled above"),
            };
            if rx.deadline.is_none() {
                rx.deadline = Some(Instant::now() + self.ctx.handshake_timeout);
            }
            let take = (need - rx.partial.len()).min(data.len());
            rx.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if rx.partial.len() == need {
                self.complete(rx)?;
            }
        }
        Ok(())
    }

    /// A WRITE's payload is in, if it is: its answer joins the waiting ones.
    fn landed(&self, rx: &mut Rx) {
        if matches!(&rx.want, Want::Landing { req, pace, .. } if pace.done == req.len) {
            if let Want::Landing { req, held, .. } = std::mem::replace(&mut rx.want, Want::Header) {
                drop(held);
                self.ctx.stats.record_served(TransportKind::Tcp, true, req.len);
                let fixed = DataResponse { tag: req.tag, status: Status::Ok }.encode();
                let mut out = self.out.lock();
                out.push_bytes(&FrameHeader::encode(MsgKind::WriteResponse, fixed.len() as u32));
                out.push_bytes(&fixed);
            }
        }
    }

    /// A discarded payload is through, if it is: its refusal follows.
    fn discarded(&self, rx: &mut Rx) {
        if matches!(&rx.want, Want::Discard { left: 0, .. }) {
            if let Want::Discard { then, .. } = std::mem::replace(&mut rx.want, Want::Header) {
                match then {
                    AfterDiscard::Refuse { tag, err } => self.refuse(MsgKind::WriteResponse, tag, &err),
                    AfterDiscard::RejectNotify { tag, len } => {
                        self.ctx.stats.notifications_rejected.fetch_add(1, Ordering::Relaxed);
                        let e = Error::InvalidArgument(format!(
                            "a notification frame of {len} bytes exceeds the receiver's notification_max_bytes ({})",
                            self.ctx.inbox.max_bytes()
                        ));
                        let body = crate::control::notify::encode_ack(tag, &Err(e));
                        let mut out = self.out.lock();
                        out.push_bytes(&FrameHeader::encode(MsgKind::NotifyAck, body.len() as u32));
                        out.push_bytes(&body);
                    }
                }
            }
        }
    }

    /// Queues the failure answer of a request.
    fn refuse(&self, kind: MsgKind, tag: u64, e: &Error) {
        self.ctx.stats.record_served(TransportKind::Tcp, false, 0);
        let text = e.message();
        let text = &text.as_bytes()[..text.len().min(message::MAX_REASON)];
        let fixed = DataResponse { tag, status: e.status() }.encode();
        let mut out = self.out.lock();
        out.push_bytes(&FrameHeader::encode(kind, (fixed.len() + text.len()) as u32));
        out.push_bytes(&fixed);
        out.push_bytes(text);
    }

    /// Handles the unit `rx.partial` completed and says what comes next.
    fn complete(&self, rx: &mut Rx) -> Result<()> {
        let bytes = std::mem::take(&mut rx.partial);
        rx.deadline = None;
        match std::mem::replace(&mut rx.want, Want::Header) {
            Want::Header => {
                let h = FrameHeader::decode(bytes[..].try_into().expect("a whole header"))?;
                self.header(rx, h)?;
            }
            Want::Fixed(h) => self.request(rx, h, &bytes)?,
            Want::Body(h) => self.body(rx, h, &bytes)?,
            Want::NotifyTag(h) => {
                let tag = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
                let len = h.body_len as usize;
                let pace = Pace::new(&self.ctx, (len - 8) as u64);
                rx.want = Want::Discard { left: (len - 8) as u64, pace, then: AfterDiscard::RejectNotify { tag, len } };
                self.discarded(rx);
            }
            Want::Landing { .. } | Want::Discard { .. } | Want::Ended => {
                unreachable!("payload is not gathered in `partial`")
            }
        }
        // The buffer is kept for the next unit unless a large body grew it
        // (an idle connection holds next to nothing).
        if bytes.capacity() <= 4096 && rx.partial.is_empty() {
            rx.partial = bytes;
            rx.partial.clear();
        }
        Ok(())
    }

    /// A frame header from the requester.
    fn header(&self, rx: &mut Rx, h: FrameHeader) -> Result<()> {
        match h.kind {
            MsgKind::ReadRequest if h.body_len as usize != DATA_REQUEST_LEN => {
                Err(Error::Protocol(format!("ReadRequest body of {} bytes", h.body_len)))
            }
            MsgKind::ReadRequest | MsgKind::WriteRequest => {
                rx.want = Want::Fixed(h);
                Ok(())
            }
            MsgKind::DescribeRequest if h.body_len != 0 => Err(Error::Protocol("DescribeRequest with a body".into())),
            MsgKind::DescribeRequest => {
                let mine = (self.ctx.describe)().encode();
                let mut out = self.out.lock();
                out.push_bytes(&FrameHeader::encode(MsgKind::Describe, mine.len() as u32));
                out.push_bytes(&mine);
                Ok(())
            }
            MsgKind::Notify => {
                let len = h.body_len as usize;
                if len > NOTIFY_OVERHEAD + self.ctx.inbox.max_bytes() {
                    if len < 8 {
                        return Err(Error::Protocol(format!("Notify body of {len} bytes")));
                    }
                    rx.want = Want::NotifyTag(h);
                } else if len == 0 {
                    self.body(rx, h, &[])?;
                } else {
                    rx.want = Want::Body(h);
                }
                Ok(())
            }
            MsgKind::Goodbye => {
                rx.want = Want::Ended;
                self.out.lock().items.push_back(Item::Close);
                Ok(())
            }
            MsgKind::Error if h.body_len == 0 => self.body(rx, h, &[]),
            MsgKind::Error => {
                rx.want = Want::Body(h);
                Ok(())
            }
            other => Err(Error::Protocol(format!("unexpected {other:?} from the requester side"))),
        }
    }

    /// A whole Notify or Error body.
    fn body(&self, rx: &mut Rx, h: FrameHeader, body: &[u8]) -> Result<()> {
        if h.kind == MsgKind::Error {
            let _ = message::decode_error(body)?;
            rx.want = Want::Ended;
            self.out.lock().items.push_back(Item::Close);
            return Ok(());
        }
        let n = Notify::decode(body)?;
        let sender = if n.name.is_empty() { self.endpoint.clone() } else { n.name };
        let admitted = self.ctx.inbox.admit(Notification { sender, msg: n.msg });
        let verdict = admitted.as_ref().map(|_| ()).map_err(Clone::clone);
        let ack = crate::control::notify::encode_ack(n.tag, &verdict);
        let mut out = self.out.lock();
        out.push_bytes(&FrameHeader::encode(MsgKind::NotifyAck, ack.len() as u32));
        out.push_bytes(&ack);
        // Visible only once the sender's OK has left (a connection that
        // ends first drops it: the sender hears of no delivery).
        if let Ok(a) = admitted {
            out.items.push_back(Item::Publish(a));
        }
        Ok(())
    }

    /// The fixed part of a READ or WRITE request.
    fn request(&self, rx: &mut Rx, h: FrameHeader, fixed: &[u8]) -> Result<()> {
        let req = DataRequest::decode(fixed.try_into().expect("a whole fixed part"))?;
        if h.kind == MsgKind::ReadRequest {
            match validate(&self.ctx, &req, false) {
                Ok(held) => {
                    // Counted before it leaves: a requester that has its
                    // answer sees it counted here.
                    self.ctx.stats.record_served(TransportKind::Tcp, true, req.len);
                    let fixed = DataResponse { tag: req.tag, status: Status::Ok }.encode();
                    let mut out = self.out.lock();
                    out.push_bytes(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() as u64 + req.len) as u32));
                    out.push_bytes(&fixed);
                    if req.len > 0 {
                        out.bytes += req.len;
                        out.items.push_back(Item::Payload { addr: req.addr, len: req.len, _held: held });
                    }
                }
                Err(e) => self.refuse(MsgKind::ReadResponse, req.tag, &e),
            }
            return Ok(());
        }
        if h.body_len as u64 != DATA_REQUEST_LEN as u64 + req.len {
            return Err(Error::Protocol(format!(
                "WriteRequest body of {} bytes does not match its length {}",
                h.body_len, req.len
            )));
        }
        let pace = Pace::new(&self.ctx, req.len);
        match validate(&self.ctx, &req, true) {
            Ok(held) => {
                rx.want = Want::Landing { req, held, pace };
                self.landed(rx);
            }
            Err(err) => {
                rx.want = Want::Discard { left: req.len, pace, then: AfterDiscard::Refuse { tag: req.tag, err } };
                self.discarded(rx);
            }
        }
        Ok(())
    }

    /// Stall bounds: a frame started and not completed in time, a payload
    /// too slow, answers the peer does not read.
    fn check(&self, rx: &Rx, now: Instant) -> Result<()> {
        if self.ctx.stopping.load(Ordering::Acquire) {
            return Err(Error::Unavailable("engine is shutting down".into()));
        }
        match &rx.want {
            // Not reading (answers wait): the peer is not the slow one.
            _ if rx.paused => {}
            Want::Landing { pace, .. } => pace.check(now, &self.ctx, "payload")?,
            Want::Discard { pace, .. } => pace.check(now, &self.ctx, "payload")?,
            _ if rx.deadline.is_some_and(|d| now >= d) => {
                let what = match &rx.want {
                    Want::Header => format!("frame header not completed within {:?}", self.ctx.handshake_timeout),
                    Want::Fixed(_) => "request header not completed in time".to_string(),
                    _ => "frame body not completed in time".to_string(),
                };
                return Err(Error::Protocol(format!("{what} (peer too slow)")));
            }
            _ => {}
        }
        let out = self.out.lock();
        if let Some(p) = &out.pace {
            if !out.items.is_empty() {
                p.check(now, &self.ctx, "response (peer not reading)")?;
            }
        }
        Ok(())
    }
}

impl SourceConn {
    /// Writes the answers waiting; `None` once the connection has ended
    /// (a `Close` reached, or the socket failed).
    fn send_waiting(&self, rx: &mut Rx) -> Option<Flow> {
        let flushed = self.flush(&mut self.out.lock());
        match flushed {
            Ok((true, _)) => {
                rx.want = Want::Ended;
                self.end();
                None
            }
            Ok((false, f)) => Some(f),
            Err(e) => {
                self.fail(&e, rx);
                None
            }
        }
    }
}

impl Served for SourceConn {
    fn is_finished(&self) -> bool {
        self.finished.is_set()
    }

    fn stop(&self, bound: Duration) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(r) = self.reg.get() {
            r.wake();
        }
        self.finished.wait(bound);
    }
}

impl Handler for SourceConn {
    fn ready(&self, scratch: &mut [u8]) -> Flow {
        let mut rx = self.rx.lock();
        if self.is_finished() {
            return Flow::Done;
        }
        // Answers first (they free room to read more), then requests, then
        // the answers those produced, in one sendmsg where they fit.
        let mut sent = Flow::Idle;
        let mut read_more = false;
        for pass in 0..2 {
            match self.send_waiting(&mut rx) {
                Some(f) => sent = f,
                None => return Flow::Done,
            }
            if pass == 1 {
                break;
            }
            match self.receive(&mut rx, scratch) {
                Ok(f) => read_more = f == Flow::Again,
                Err(e) => {
                    self.fail(&e, &mut rx);
                    return Flow::Done;
                }
            }
        }
        // Reading stopped with bytes maybe left: again at once if the
        // answers now have room (else the writable edge that frees it
        // brings this connection back).
        if sent == Flow::Again || (read_more && !self.out.lock().full()) {
            Flow::Again
        } else {
            Flow::Idle
        }
    }

    fn tick(&self, now: Instant) -> Flow {
        let mut rx = self.rx.lock();
        if self.is_finished() {
            return Flow::Done;
        }
        if let Err(e) = self.check(&rx, now) {
            self.fail(&e, &mut rx);
            return Flow::Done;
        }
        // A frame queued (a `Revoke`) whose wake-up came before this
        // connection's registration was set still leaves.
        self.send_waiting(&mut rx).unwrap_or(Flow::Done)
    }
}

/// Validates a request against the regions: existence, bounds, epoch,
/// permission and memory kind. Returns the lease that keeps the region
/// registered during the copy, and the gate guard for close_source.
fn validate(ctx: &SourceContext, req: &DataRequest, write: bool) -> Result<(RegionLease, GateGuard)> {
    let guard =
        ctx.gate.enter().map_err(|_| Error::Unavailable("the source is closing and serves no new requests".into()))?;
    let lease = ctx.regions.lease(req.addr, req.len)?;
    let r = lease.region();
    if r.epoch != req.region_epoch {
        return Err(Error::StalePeer(format!(
            "region at 0x{:x} was re-registered (epoch {}, the request names epoch {}); refresh the peer's regions",
            r.addr, r.epoch, req.region_epoch
        )));
    }
    if write && !r.access.can_write() {
        return Err(Error::PermissionDenied(format!(
            "region {} (0x{:x}+{}) does not allow remote WRITE",
            r.id, r.addr, r.len
        )));
    }
    if !write && !r.access.can_read() {
        return Err(Error::PermissionDenied(format!(
            "region {} (0x{:x}+{}) does not allow remote READ",
            r.id, r.addr, r.len
        )));
    }
    if !r.kind.cpu_accessible() {
        return Err(Error::NotSupported(format!(
            "region {} holds {} memory, which the TCP transport cannot copy",
            r.id,
            r.kind.name()
        )));
    }
    Ok((lease, guard))
}
