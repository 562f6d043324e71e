//! Requester side of a TCP peer connection.

use crate::control::frame::{FrameHeader, MsgKind};
use crate::control::io::{self, HeaderRead, TICK};
use crate::control::message::{self, DataRequest, DataResponse, Describe, DATA_RESPONSE_LEN, MAX_REASON};
use crate::counters::Counters;
use crate::error::{Error, Result, Status};
use crate::kinds::TransportKind;
use crate::memory::RegionLease;
use crate::sync::admission::{Gate, GateGuard, Permit};
use crate::transfer::{BatchShared, ChunkOutcome, Op, RemoteEffect};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io::BufReader;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

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
    /// The sender is writing this WRITE's payload from local memory.
    sending: bool,
}

#[derive(Default)]
struct Pending {
    map: HashMap<u64, Entry>,
    /// The reader has failed every entry; later completions go direct.
    drained: bool,
}

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
}

/// Frames waiting to leave together: request frames and the fixed parts
/// of WRITEs in `bytes`, each WRITE's payload by address, in stream order.
#[derive(Default)]
struct Outbuf {
    bytes: Vec<u8>,
    writes: Vec<QueuedWrite>,
    /// Bytes of the WRITEs' payloads.
    payload: u64,
}

impl Outbuf {
    /// Whether `chunks` fit one send from the submitting thread: READs and
    /// small WRITEs, at most 256 of them and 256 KiB of payload.
    fn fits_at_once(chunks: &[Chunk]) -> bool {
        chunks.len() <= 256
            && chunks.iter().all(|c| c.op == Op::Read || c.len <= SMALL_WRITE)
            && chunks.iter().filter(|c| c.op == Op::Write).map(|c| c.len).sum::<u64>() <= 256 * 1024
    }

    /// Enough waits to send now.
    fn full(&self) -> bool {
        self.bytes.len() as u64 + self.payload >= 256 * 1024 || self.writes.len() >= 64
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.writes.clear();
        self.payload = 0;
    }
}

/// The sender thread's queue.
#[derive(Default)]
struct SendQueue {
    items: VecDeque<Outgoing>,
    /// The connection is dead or closing: nothing more is queued.
    closed: bool,
    /// The sender thread waits with nothing in hand.
    sender_idle: bool,
    /// A submitting thread is writing its own frames.
    direct: bool,
}

/// What the sender thread writes: a request, or a notification's frame.
enum Outgoing {
    Chunk(Chunk),
    Notify { tag: u64, body: Vec<u8> },
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

/// A requester's connection to one peer.
pub struct TcpConnection {
    writer: Mutex<TcpStream>,
    control: TcpStream,
    queue: Mutex<SendQueue>,
    notes: Mutex<HashMap<u64, NotifyPending>>,
    queue_cv: Condvar,
    pending: Mutex<Pending>,
    next_tag: AtomicU64,
    dead: Mutex<Option<Error>>,
    describe: Mutex<DescribeState>,
    describe_cv: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stats: Arc<Counters>,
    gate: Arc<Gate>,
    /// Called (on the reader thread; it must not block) when the source
    /// asks for its imports back (`Revoke`).
    on_revoke: RevokeHook,
    /// Peer label for messages.
    pub label: String,
}

/// What a requester does when its source revokes its imports.
pub type RevokeHook = Box<dyn Fn() + Send + Sync>;

impl TcpConnection {
    /// Wraps a connected, handshaken stream and starts its threads.
    pub fn start(
        stream: TcpStream,
        peer: Describe,
        label: String,
        stats: Arc<Counters>,
        on_revoke: RevokeHook,
    ) -> Result<Arc<TcpConnection>> {
        let e = |what: &str, err: std::io::Error| Error::io(what, &err);
        stream.set_read_timeout(Some(TICK)).map_err(|x| e("set_read_timeout", x))?;
        stream.set_write_timeout(Some(TICK)).map_err(|x| e("set_write_timeout", x))?;
        let writer = stream.try_clone().map_err(|x| e("clone socket", x))?;
        let reader = stream.try_clone().map_err(|x| e("clone socket", x))?;
        let conn = Arc::new(TcpConnection {
            writer: Mutex::new(writer),
            control: stream,
            queue: Mutex::new(SendQueue::default()),
            notes: Mutex::new(HashMap::new()),
            queue_cv: Condvar::new(),
            pending: Mutex::new(Pending::default()),
            next_tag: AtomicU64::new(1),
            dead: Mutex::new(None),
            describe: Mutex::new(DescribeState { current: Arc::new(peer), generation: 0 }),
            describe_cv: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            stats,
            gate: Gate::new("connection"),
            on_revoke,
            label,
        });
        let c1 = conn.clone();
        let sender = std::thread::Builder::new()
            .name("orbite-tcp-send".into())
            .spawn(move || c1.send_loop())
            .map_err(|x| e("spawn sender thread", x))?;
        let c2 = conn.clone();
        let recv = std::thread::Builder::new()
            .name("orbite-tcp-recv".into())
            .spawn(move || c2.recv_loop(reader))
            .map_err(|x| e("spawn reader thread", x))?;
        conn.threads.lock().extend([sender, recv]);
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
        {
            let mut w = self.writer.lock();
            let mut tick = || self.check_alive();
            io::write_frame(&mut *w, MsgKind::DescribeRequest, &[], &mut tick)?;
        }
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

    fn check_alive(&self) -> Result<()> {
        match self.dead_reason() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Why nothing more can be sent: the error that killed the connection,
    /// or its orderly close.
    fn closed_reason(&self) -> Error {
        self.dead_reason().unwrap_or_else(|| Error::Unavailable(format!("connection to {} is closed", self.label)))
    }

    /// Queues chunks for sending. Fails them at once if the connection is dead.
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
        // Nothing waits and the sender thread is idle: this thread writes
        // its own frames (one wake-up less). While it does, the sender
        // takes nothing new, so later frames still go after these.
        if q.items.is_empty() && q.sender_idle && !q.direct && Outbuf::fits_at_once(&chunks) {
            q.direct = true;
            drop(q);
            self.send_direct(chunks);
            return;
        }
        q.items.extend(chunks.into_iter().map(Outgoing::Chunk));
        drop(q);
        self.queue_cv.notify_one();
    }

    /// Sends `chunks` on the calling thread (see [`TcpConnection::enqueue`]).
    fn send_direct(&self, chunks: Vec<Chunk>) {
        let mut buf = Outbuf::default();
        for c in chunks {
            if let Err(e) = self.send_one(c, &mut buf) {
                self.kill(e);
            }
        }
        if let Err(e) = self.flush(&mut buf) {
            self.kill(e);
        }
        let mut q = self.queue.lock();
        q.direct = false;
        let more = !q.items.is_empty();
        drop(q);
        if more {
            self.queue_cv.notify_one();
        }
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
        self.queue_cv.notify_one();
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

    /// Kills the connection with `e` (idempotent): in-flight chunks fail.
    pub fn kill(&self, e: Error) {
        {
            let mut d = self.dead.lock();
            if d.is_none() {
                *d = Some(e);
            }
        }
        let _ = self.control.shutdown(Shutdown::Both);
        self.queue.lock().closed = true;
        self.queue_cv.notify_all();
        self.describe_cv.notify_all();
    }

    /// The peer is gone for good (discovery saw its name vanish or pass to
    /// another epoch): `e` becomes the reason, replacing a lost
    /// connection's, and the connection is killed if it was not already.
    pub fn retire(&self, e: Error) {
        *self.dead.lock() = Some(e.clone());
        self.kill(e);
    }

    /// Orderly close: Goodbye, then kill, then join the threads.
    pub fn close(&self) {
        if self.dead_reason().is_none() {
            let mut w = self.writer.lock();
            let mut tick = || Err(Error::TimedOut("goodbye".into()));
            let _ = io::write_frame(&mut *w, MsgKind::Goodbye, &[], &mut tick);
        }
        self.kill(Error::Unavailable(format!("connection to {} was closed by this engine", self.label)));
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }

    fn send_loop(self: Arc<Self>) {
        let mut reqbuf = Outbuf::default();
        loop {
            let batch: Vec<Outgoing> = {
                let mut q = self.queue.lock();
                // Idle (everything sent) while it waits with nothing queued;
                // it takes nothing while a submitting thread writes directly.
                while (q.items.is_empty() || q.direct) && !q.closed {
                    q.sender_idle = q.items.is_empty();
                    self.queue_cv.wait(&mut q);
                }
                q.sender_idle = false;
                if q.items.is_empty() {
                    return;
                }
                let n = q.items.len().min(256);
                q.items.drain(..n).collect()
            };
            for item in batch {
                let r = match item {
                    Outgoing::Chunk(chunk) => self.send_one(chunk, &mut reqbuf),
                    Outgoing::Notify { tag, body } => self.send_note(tag, &body, &mut reqbuf),
                };
                if let Err(e) = r {
                    self.kill(e);
                }
            }
            if let Err(e) = self.flush(&mut reqbuf) {
                self.kill(e);
            }
        }
    }

    /// Sends what `buf` holds in one sendmsg (as few as the socket takes),
    /// then settles its WRITEs: sent ones now wait for their answers;
    /// on failure each fails with the remote effect its first byte allows
    /// (`Unknown` once any of it left, else `None`).
    fn flush(&self, buf: &mut Outbuf) -> Result<()> {
        if buf.bytes.is_empty() {
            return Ok(());
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * buf.writes.len() + 1);
        let mut at = 0;
        for sw in &buf.writes {
            parts.push(&buf.bytes[at..sw.head_end]);
            // SAFETY: the WRITE's chunk holds a lease on the local region
            // containing [addr, addr+len) and stays pending (marked sending,
            // so the reader does not fail it) until settled below.
            parts.push(unsafe { std::slice::from_raw_parts(sw.addr as *const u8, sw.len as usize) });
            at = sw.head_end;
        }
        parts.push(&buf.bytes[at..]);
        let deadline = buf.writes.iter().map(|w| w.deadline).min();
        let mut written = 0u64;
        let r = {
            let mut w = self.writer.lock();
            let mut tick = || {
                self.check_alive()?;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(Error::TimedOut(format!("deadline passed while sending a WRITE to {}", self.label)));
                }
                Ok(())
            };
            io::write_all_parts(&mut *w, &parts, &mut tick, &mut written)
        };
        drop(parts);
        self.stats.record_wire_sent(TransportKind::Tcp, written);
        if !buf.writes.is_empty() {
            let mut failed = Vec::new();
            let mut before = 0u64;
            let mut p = self.pending.lock();
            for sw in &buf.writes {
                let start = sw.head_start as u64 + before;
                before += sw.len;
                match &r {
                    Ok(()) if !p.drained => {
                        if let Some(ent) = p.map.get_mut(&sw.tag) {
                            ent.sending = false;
                        }
                    }
                    Ok(()) => {
                        let e = self
                            .dead_reason()
                            .unwrap_or_else(|| Error::Unavailable(format!("connection to {} lost", self.label)));
                        failed.extend(p.map.remove(&sw.tag).map(|ent| (ent, e, RemoteEffect::Unknown)));
                    }
                    Err(e) => {
                        let effect = if written > start { RemoteEffect::Unknown } else { RemoteEffect::None };
                        failed.extend(p.map.remove(&sw.tag).map(|ent| (ent, e.clone(), effect)));
                    }
                }
            }
            drop(p);
            for (ent, e, effect) in failed {
                ent.chunk.fail(e, effect);
            }
        }
        buf.clear();
        r
    }

    /// Appends a notification's frame to the outgoing buffer (a dead
    /// connection answers it from the reader's drain instead).
    fn send_note(&self, tag: u64, body: &[u8], buf: &mut Outbuf) -> Result<()> {
        if self.dead_reason().is_some() {
            return Ok(());
        }
        match self.notes.lock().get_mut(&tag) {
            Some(p) => p.written = true,
            None => return Ok(()),
        }
        buf.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::Notify, body.len() as u32));
        buf.bytes.extend_from_slice(body);
        self.stats.notifications_sent.fetch_add(1, Ordering::Relaxed);
        if buf.full() {
            self.flush(buf)?;
        }
        Ok(())
    }

    fn send_one(&self, chunk: Chunk, buf: &mut Outbuf) -> Result<()> {
        if let Some(e) = self.dead_reason() {
            chunk.fail(e, RemoteEffect::None);
            return Ok(());
        }
        if Instant::now() >= chunk.deadline {
            let msg = format!("deadline passed before the request was sent to {}", self.label);
            chunk.fail(Error::TimedOut(msg), RemoteEffect::None);
            return Ok(());
        }
        if !chunk.batch.start(chunk.index) {
            chunk.fail(Error::Cancelled("cancelled before it started".into()), RemoteEffect::None);
            return Ok(());
        }
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let req = DataRequest { tag, region_epoch: chunk.region_epoch, addr: chunk.remote_addr, len: chunk.len };
        let op = chunk.op;
        let (local, len, deadline) = (chunk.local_addr, chunk.len, chunk.deadline);
        {
            let mut p = self.pending.lock();
            if p.drained {
                drop(p);
                let e = self
                    .dead_reason()
                    .unwrap_or_else(|| Error::Unavailable(format!("connection to {} lost", self.label)));
                chunk.fail(e, RemoteEffect::None);
                return Ok(());
            }
            p.map.insert(tag, Entry { chunk, sending: op == Op::Write });
        }
        match op {
            Op::Read => {
                buf.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::ReadRequest, 32));
                buf.bytes.extend_from_slice(&req.encode());
                if buf.full() {
                    self.flush(buf)?;
                }
                Ok(())
            }
            // A WRITE joins the frames before it: its fixed part in the
            // buffer, its payload by address, sent in one sendmsg; a large
            // one fills the buffer and leaves at once.
            Op::Write => {
                let head_start = buf.bytes.len();
                buf.bytes.extend_from_slice(&FrameHeader::encode(MsgKind::WriteRequest, (32 + len) as u32));
                buf.bytes.extend_from_slice(&req.encode());
                buf.payload += len;
                buf.writes.push(QueuedWrite { head_start, head_end: buf.bytes.len(), addr: local, len, tag, deadline });
                if buf.full() {
                    self.flush(buf)?;
                }
                Ok(())
            }
        }
    }

    fn recv_loop(self: Arc<Self>, s: TcpStream) {
        // Buffered: one recv serves many small answers; READ payloads larger
        // than the buffer bypass it into registered memory.
        let mut s = BufReader::with_capacity(64 * 1024, s);
        let err = match self.recv_frames(&mut s) {
            Ok(()) => Error::Unavailable(format!("{} closed the connection", self.label)),
            Err(e) => e,
        };
        if matches!(err, Error::Protocol(_)) {
            let mut w = self.writer.lock();
            let mut tick = || Err(Error::TimedOut("error frame".into()));
            let _ = io::write_frame(
                &mut *w,
                MsgKind::Error,
                &message::encode_error(Status::ProtocolError, err.message()),
                &mut tick,
            );
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
        self.fail_notes(&reason);
        // Chunks still queued are failed by the sender, which sees the kill.
    }

    fn expired(&self) -> Result<()> {
        self.check_alive()?;
        let now = Instant::now();
        let p = self.pending.lock();
        if let Some(e) = p.map.values().find(|e| !e.sending && now >= e.chunk.deadline) {
            return Err(Error::TimedOut(format!(
                "request to {} passed its deadline without an answer (0x{:x}+{})",
                self.label, e.chunk.remote_addr, e.chunk.len
            )));
        }
        drop(p);
        if self.notes.lock().values().any(|n| n.written && now >= n.deadline) {
            return Err(Error::TimedOut(format!("{} did not answer a notification in time", self.label)));
        }
        Ok(())
    }

    fn recv_frames(&self, s: &mut BufReader<TcpStream>) -> Result<()> {
        loop {
            let h = match io::read_header(s, &mut || self.expired())? {
                HeaderRead::Eof => return Ok(()),
                HeaderRead::Frame(h) => h,
            };
            match h.kind {
                MsgKind::ReadResponse | MsgKind::WriteResponse => self.on_response(s, h)?,
                MsgKind::Describe => {
                    let body = io::read_body(s, h.body_len, &mut || self.expired())?;
                    let d = Describe::decode(&body)?;
                    let mut st = self.describe.lock();
                    if d.identity.engine_epoch != st.current.identity.engine_epoch {
                        return Err(Error::Protocol("peer changed its engine epoch mid-connection".into()));
                    }
                    st.current = Arc::new(d);
                    st.generation += 1;
                    self.describe_cv.notify_all();
                }
                MsgKind::Error => {
                    let body = io::read_body(s, h.body_len, &mut || self.expired())?;
                    let (st, text) = message::decode_error(&body)?;
                    return Err(Error::from_status(
                        if st == Status::Ok { Status::Unavailable } else { st },
                        format!("{} closed the connection: {text}", self.label),
                    ));
                }
                MsgKind::Goodbye => {
                    if h.body_len != 0 {
                        return Err(Error::Protocol("Goodbye with a body".into()));
                    }
                    return Ok(());
                }
                MsgKind::NotifyAck => {
                    let body = io::read_body(s, h.body_len, &mut || self.expired())?;
                    let (tag, outcome) = crate::control::notify::decode_ack(&body)?;
                    let Some(p) = self.notes.lock().remove(&tag) else {
                        return Err(Error::Protocol(format!("NotifyAck for unknown tag {tag}")));
                    };
                    let outcome = outcome.map_err(|e| {
                        Error::from_status(
                            e.status(),
                            format!("{} refused the notification: {}", self.label, e.message()),
                        )
                    });
                    (p.answer)(outcome, true);
                }
                MsgKind::Revoke => {
                    if h.body_len != 0 {
                        return Err(Error::Protocol("Revoke with a body".into()));
                    }
                    (self.on_revoke)();
                }
                other => {
                    return Err(Error::Protocol(format!("unexpected {other:?} from the source side")));
                }
            }
        }
    }

    fn on_response(&self, s: &mut BufReader<TcpStream>, h: FrameHeader) -> Result<()> {
        let body_len = h.body_len as u64;
        if body_len < DATA_RESPONSE_LEN as u64 {
            return Err(Error::Protocol(format!("{:?} of {body_len} bytes is too short", h.kind)));
        }
        let mut fixed = [0u8; DATA_RESPONSE_LEN];
        io::read_full(s, &mut fixed, &mut || self.expired(), false)?;
        let resp = DataResponse::decode(&fixed)?;
        let rest = body_len - DATA_RESPONSE_LEN as u64;
        let want = if h.kind == MsgKind::ReadResponse { Op::Read } else { Op::Write };
        let ent = {
            let mut p = self.pending.lock();
            match p.map.get(&resp.tag) {
                Some(e) if e.chunk.op == want => {}
                Some(_) => {
                    return Err(Error::Protocol(format!("{:?} for tag {} of the other direction", h.kind, resp.tag)))
                }
                None => return Err(Error::Protocol(format!("{:?} for unknown tag {}", h.kind, resp.tag))),
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
            let mut text = vec![0u8; rest as usize];
            if let Err(e) = io::read_full(s, &mut text, &mut || self.expired(), false) {
                c.fail(e.clone(), RemoteEffect::None);
                return Err(e);
            }
            let msg = String::from_utf8_lossy(&text).into_owned();
            c.fail(Error::from_status(resp.status, format!("{}: {msg}", self.label)), RemoteEffect::None);
            return Ok(());
        }
        match want {
            Op::Write => {
                if rest != 0 {
                    let e = Error::Protocol("WRITE success carries a body".into());
                    c.fail(e.clone(), RemoteEffect::Unknown);
                    return Err(e);
                }
                c.finish(ChunkOutcome::ok(Op::Write));
                Ok(())
            }
            Op::Read => {
                if rest != c.len {
                    let e = Error::Protocol(format!("READ answer carries {rest} bytes, asked for {}", c.len));
                    c.fail(e.clone(), RemoteEffect::None);
                    return Err(e);
                }
                // SAFETY: the chunk's lease keeps [local_addr, +len) inside a
                // registered local region; only this thread writes it, and
                // the chunk completes only after this read ends.
                let dst = unsafe { std::slice::from_raw_parts_mut(c.local_addr as *mut u8, c.len as usize) };
                let deadline = c.deadline;
                let mut tick = || {
                    self.check_alive()?;
                    if Instant::now() >= deadline {
                        return Err(Error::TimedOut(format!(
                            "READ from {} passed its deadline mid-payload",
                            self.label
                        )));
                    }
                    Ok(())
                };
                match io::read_full(s, dst, &mut tick, false) {
                    Ok(_) => {
                        c.finish(ChunkOutcome::ok(Op::Read));
                        Ok(())
                    }
                    Err(e) => {
                        c.fail(e.clone(), RemoteEffect::None);
                        Err(e)
                    }
                }
            }
        }
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        let _ = self.control.shutdown(Shutdown::Both);
    }
}
