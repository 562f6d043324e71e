//! Source side: serves one incoming control connection.

use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::io::{self, HeaderRead, TICK};
use crate::control::message::{self, DataRequest, DataResponse, Describe, DATA_REQUEST_LEN};
use crate::control::notify::{Notify, NOTIFY_OVERHEAD};
use crate::counters::Counters;
use crate::error::{Error, Result, Status};
use crate::kinds::TransportKind;
use crate::memory::{RegionLease, RegionTable};
use crate::sync::admission::{Gate, GateGuard};
use crate::transport::inbox::{Admitted, Inbox, Notification};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the source side needs from its engine.
pub struct SourceContext {
    /// The engine's regions.
    pub regions: Arc<RegionTable>,
    /// Counters.
    pub stats: Arc<Counters>,
    /// Serving stops (requests answered Unavailable) once this is closed.
    pub gate: Arc<Gate>,
    /// Set when the engine shuts down: serving threads exit.
    pub stopping: Arc<AtomicBool>,
    /// Builds this engine's current Describe.
    pub describe: Arc<dyn Fn() -> Describe + Send + Sync>,
    /// Handshake deadline for new connections; also the stall bound: every
    /// answer, and every MiB of payload, must move within it.
    pub handshake_timeout: Duration,
    /// Payload must move at this many bytes per second on average beyond
    /// the stall allowance (0: the stall bound alone).
    pub min_payload_rate: u64,
    /// The answer streams of the live connections (for `Revoke`).
    pub revoker: Arc<Revoker>,
    /// Where notifications from requesters wait to be taken.
    pub inbox: Arc<Inbox>,
}

/// The answer streams of an engine's live control connections, so that a
/// closing source can ask every requester, at once, to give back what it
/// imported (`Revoke`), instead of waiting for receipts that would come
/// only at the requester's next flush.
#[derive(Default)]
pub struct Revoker {
    next: AtomicU64,
    writers: Mutex<HashMap<u64, Arc<Mutex<TcpStream>>>>,
}

/// A connection's place in the [`Revoker`]; leaves it when dropped.
pub struct Registered<'a> {
    revoker: &'a Revoker,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.revoker.writers.lock().remove(&self.id);
    }
}

impl Revoker {
    fn add(&self, w: Arc<Mutex<TcpStream>>) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.writers.lock().insert(id, w);
        Registered { revoker: self, id }
    }

    /// Sends `Revoke` on every live control connection, each within
    /// `bound` (a connection busy answering past it is skipped: it will
    /// learn from its next receipt's refusal). Returns how many were told.
    pub fn revoke_all(&self, bound: Duration) -> usize {
        let writers: Vec<Arc<Mutex<TcpStream>>> = self.writers.lock().values().cloned().collect();
        let mut told = 0;
        for w in writers {
            let Some(mut s) = w.try_lock_for(bound) else { continue };
            let deadline = Instant::now() + bound;
            let mut tick = || match Instant::now() >= deadline {
                true => Err(Error::TimedOut("revoke".into())),
                false => Ok(()),
            };
            if io::write_frame(&mut *s, MsgKind::Revoke, &[], &mut tick).is_ok() {
                told += 1;
            }
        }
        told
    }
}

impl SourceContext {
    fn tick(&self) -> Result<()> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(Error::Unavailable("engine is shutting down".into()));
        }
        Ok(())
    }

    /// The tick of one answer: a requester that does not read it within the
    /// stall bound is cut off (it cannot pin this thread or the gate).
    fn answer_tick(&self) -> impl FnMut() -> Result<()> + '_ {
        bounded(self, Instant::now() + self.handshake_timeout, "answer (the peer is not reading)")
    }

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

/// Serves `stream`, whose first frame (after any authentication) has the
/// header `first`, until the peer leaves, the engine stops or the peer
/// breaks the protocol (then an Error frame is sent and the connection closed).
pub fn serve(ctx: Arc<SourceContext>, mut stream: TcpStream, first: FrameHeader) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(TICK));
    let _ = stream.set_write_timeout(Some(TICK));
    // Reads go through a buffer (one recv serves many small frames); large
    // payload reads bypass it and land straight in registered memory.
    let r = match stream.try_clone() {
        Ok(rs) => serve_inner(&ctx, first, &mut BufReader::with_capacity(64 * 1024, rs), &mut stream),
        Err(e) => Err(Error::io("clone socket", &e)),
    };
    if let Err(e @ Error::Protocol(_)) = r {
        ctx.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
        super::handshake::send_error(&mut stream, &e);
    }
    let _ = stream.shutdown(Shutdown::Both);
}

fn serve_inner(ctx: &SourceContext, first: FrameHeader, r: &mut BufReader<TcpStream>, w: &mut TcpStream) -> Result<()> {
    // Handshake: the requester speaks first with its Describe.
    let peer = super::handshake::answer(first, r, w, ctx.handshake_timeout, &|| ctx.tick(), || (ctx.describe)())?;
    // From here answers go through a lock shared with the revoker, which a
    // closing source uses to ask this requester for its imports back.
    let w = Arc::new(Mutex::new(w.try_clone().map_err(|e| Error::io("clone socket", &e))?));
    let _registered = ctx.revoker.add(w.clone());
    let w = &*w;

    let frame_timeout = ctx.handshake_timeout;
    let mut answers = Answers::default();
    loop {
        // Small READ answers wait while more requests are already buffered,
        // and leave together in one sendmsg before this thread could block.
        if !answers.is_empty() && r.buffer().len() < FRAME_HEADER_LEN + DATA_REQUEST_LEN {
            answers.flush(ctx, w)?;
        }
        let h = match io::read_header_bounded(r, &mut || ctx.tick(), frame_timeout)? {
            HeaderRead::Eof => return answers.flush(ctx, w),
            HeaderRead::Frame(h) => h,
        };
        if !matches!(h.kind, MsgKind::ReadRequest | MsgKind::WriteRequest) {
            answers.flush(ctx, w)?;
        }
        match h.kind {
            MsgKind::ReadRequest => {
                if h.body_len as usize != DATA_REQUEST_LEN {
                    return Err(Error::Protocol(format!("ReadRequest body of {} bytes", h.body_len)));
                }
                let req = read_request(ctx, r)?;
                if req.len <= SMALL_ANSWER {
                    match validate(ctx, &req, false) {
                        Ok(held) => answers.add(ctx, w, req, held)?,
                        Err(e) => {
                            answers.flush(ctx, w)?;
                            respond_failure(ctx, w, MsgKind::ReadResponse, req.tag, &e)?;
                        }
                    }
                } else {
                    answers.flush(ctx, w)?;
                    serve_read(ctx, w, req)?;
                }
            }
            MsgKind::WriteRequest => {
                let req = read_request(ctx, r)?;
                if h.body_len as u64 != DATA_REQUEST_LEN as u64 + req.len {
                    return Err(Error::Protocol(format!(
                        "WriteRequest body of {} bytes does not match its length {}",
                        h.body_len, req.len
                    )));
                }
                serve_write(ctx, r, w, req, &mut answers)?;
            }
            MsgKind::DescribeRequest => {
                if h.body_len != 0 {
                    return Err(Error::Protocol("DescribeRequest with a body".into()));
                }
                let mine = (ctx.describe)().encode();
                io::write_frame(&mut *w.lock(), MsgKind::Describe, &mine, &mut ctx.answer_tick())?;
            }
            MsgKind::Notify => {
                let (tag, admitted) = receive_notification(ctx, r, h.body_len as usize, &peer.endpoint)?;
                let verdict = admitted.as_ref().map(|_| ()).map_err(Clone::clone);
                let body = crate::control::notify::encode_ack(tag, &verdict);
                io::write_frame(&mut *w.lock(), MsgKind::NotifyAck, &body, &mut ctx.answer_tick())?;
                // Visible only once the sender's OK is on its way (a failed
                // write above drops it: the sender hears of no delivery).
                if let Ok(a) = admitted {
                    a.publish();
                }
            }
            MsgKind::Goodbye => return Ok(()),
            MsgKind::Error => {
                let mut tick = bounded(ctx, Instant::now() + frame_timeout, "Error frame");
                let body = io::read_body(r, h.body_len, &mut tick)?;
                let _ = message::decode_error(&body)?;
                return Ok(());
            }
            other => return Err(Error::Protocol(format!("unexpected {other:?} from the requester side"))),
        }
    }
}

/// Reads one Notify body of `len` bytes and offers it to the inbox. Memory
/// stays bounded by the inbox's message limit: a larger body is read
/// through a small buffer and refused. Returns the tag and the verdict for
/// the sender; a malformed body is a protocol error.
fn receive_notification<'a>(
    ctx: &'a SourceContext,
    r: &mut impl Read,
    len: usize,
    endpoint: &str,
) -> Result<(u64, Result<Admitted<'a>>)> {
    let mut tick = bounded(ctx, Instant::now() + ctx.handshake_timeout, "notification");
    let most = NOTIFY_OVERHEAD + ctx.inbox.max_bytes();
    if len > most {
        if len < 8 {
            return Err(Error::Protocol(format!("Notify body of {len} bytes")));
        }
        let mut tag = [0u8; 8];
        io::read_full(r, &mut tag, &mut tick, false)?;
        let mut scratch = [0u8; 4096];
        let mut left = len - 8;
        while left > 0 {
            let n = left.min(scratch.len());
            io::read_full(r, &mut scratch[..n], &mut tick, false)?;
            left -= n;
        }
        ctx.stats.notifications_rejected.fetch_add(1, Ordering::Relaxed);
        let e = Error::InvalidArgument(format!(
            "a notification frame of {len} bytes exceeds the receiver's notification_max_bytes ({})",
            ctx.inbox.max_bytes()
        ));
        return Ok((u64::from_le_bytes(tag), Err(e)));
    }
    let body = io::read_body(r, len as u32, &mut tick)?;
    let n = Notify::decode(&body)?;
    let sender = if n.name.is_empty() { endpoint.to_string() } else { n.name };
    Ok((n.tag, ctx.inbox.admit(Notification { sender, msg: n.msg })))
}

/// READ answers of at most this many bytes may wait to leave together.
const SMALL_ANSWER: u64 = 64 * 1024;
/// Most answers, and payload bytes, that wait together.
const ANSWERS_MAX: usize = 64;
const ANSWER_BYTES_MAX: u64 = 256 * 1024;

/// Successful answers waiting to be sent together: each one's header and
/// fixed part, and for a small READ its payload (registered memory, kept
/// registered by its lease until sent).
#[derive(Default)]
struct Answers {
    /// Header and fixed part of each answer, back to back.
    heads: Vec<u8>,
    /// Each answer's payload (`None` for a WRITE's), with what keeps it
    /// registered and the source open.
    payloads: Vec<Option<(DataRequest, RegionLease, GateGuard)>>,
    bytes: u64,
}

/// Bytes of one answer's header and fixed part.
const ANSWER_HEAD: usize = FRAME_HEADER_LEN + message::DATA_RESPONSE_LEN;

impl Answers {
    fn is_empty(&self) -> bool {
        self.payloads.is_empty()
    }

    /// Adds the answer to a validated READ; sends them all when they are
    /// many.
    fn add(
        &mut self,
        ctx: &SourceContext,
        w: &Mutex<TcpStream>,
        req: DataRequest,
        held: (RegionLease, GateGuard),
    ) -> Result<()> {
        let fixed = DataResponse { tag: req.tag, status: Status::Ok }.encode();
        self.heads
            .extend_from_slice(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() as u64 + req.len) as u32));
        self.heads.extend_from_slice(&fixed);
        self.bytes += req.len;
        self.payloads.push(Some((req, held.0, held.1)));
        self.flush_if_full(ctx, w)
    }

    /// Adds the answer to a WRITE whose payload landed.
    fn add_written(&mut self, ctx: &SourceContext, w: &Mutex<TcpStream>, tag: u64) -> Result<()> {
        let fixed = DataResponse { tag, status: Status::Ok }.encode();
        self.heads.extend_from_slice(&FrameHeader::encode(MsgKind::WriteResponse, fixed.len() as u32));
        self.heads.extend_from_slice(&fixed);
        self.payloads.push(None);
        self.flush_if_full(ctx, w)
    }

    fn flush_if_full(&mut self, ctx: &SourceContext, w: &Mutex<TcpStream>) -> Result<()> {
        if self.payloads.len() >= ANSWERS_MAX || self.bytes >= ANSWER_BYTES_MAX {
            self.flush(ctx, w)?;
        }
        Ok(())
    }

    /// Sends every waiting answer in one sendmsg (as few as the socket
    /// takes), then releases their regions.
    fn flush(&mut self, ctx: &SourceContext, w: &Mutex<TcpStream>) -> Result<()> {
        if self.payloads.is_empty() {
            return Ok(());
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * self.payloads.len());
        for (i, payload) in self.payloads.iter().enumerate() {
            parts.push(&self.heads[i * ANSWER_HEAD..(i + 1) * ANSWER_HEAD]);
            if let Some((req, _lease, _)) = payload {
                // SAFETY: the lease held beside `req` keeps the region
                // holding [addr, addr+len) registered until this write
                // ends; the range was bounds-checked by `validate`.
                parts.push(unsafe { std::slice::from_raw_parts(req.addr as *const u8, req.len as usize) });
            }
        }
        // Counted before they leave: a requester that has its answers sees
        // them counted here (a failed send ends the connection anyway).
        for (req, _, _) in self.payloads.iter().flatten() {
            ctx.stats.record_served(TransportKind::Tcp, true, req.len);
        }
        let overall = ctx.payload_deadline(self.bytes);
        let mut tick = payload_tick(ctx, overall, "response (peer not reading)");
        let mut written = 0;
        let r = io::write_all_parts(&mut *w.lock(), &parts, &mut tick, &mut written);
        drop(parts);
        self.payloads.clear();
        self.heads.clear();
        self.bytes = 0;
        r
    }
}

/// A tick that also fails once `deadline` passed (a peer too slow to
/// finish what it started is a protocol violation).
fn bounded<'a>(ctx: &'a SourceContext, deadline: Instant, what: &'a str) -> impl FnMut() -> Result<()> + 'a {
    move || {
        ctx.tick()?;
        if Instant::now() >= deadline {
            return Err(Error::Protocol(format!("{what} not completed in time (peer too slow)")));
        }
        Ok(())
    }
}

fn read_request(ctx: &SourceContext, s: &mut impl Read) -> Result<DataRequest> {
    let mut fixed = [0u8; DATA_REQUEST_LEN];
    let mut tick = bounded(ctx, Instant::now() + ctx.handshake_timeout, "request header");
    io::read_full(s, &mut fixed, &mut tick, false)?;
    DataRequest::decode(&fixed)
}

/// Reads `buf` from a peer that must keep making progress: no MiB within
/// the stall bound, or less than the minimum rate overall, is a protocol
/// error.
fn read_progressing(ctx: &SourceContext, s: &mut impl Read, buf: &mut [u8]) -> Result<()> {
    let overall = ctx.payload_deadline(buf.len() as u64);
    let mut done = 0;
    while done < buf.len() {
        let step = (buf.len() - done).min(1 << 20);
        let mut tick = payload_tick(ctx, overall, "payload");
        io::read_full(s, &mut buf[done..done + step], &mut tick, false)?;
        done += step;
    }
    Ok(())
}

/// The tick of one MiB of payload: within the stall bound, and within the
/// payload's overall deadline (`None`: no minimum rate).
fn payload_tick<'a>(
    ctx: &'a SourceContext,
    overall: Option<Instant>,
    what: &'a str,
) -> impl FnMut() -> Result<()> + 'a {
    let stall = Instant::now() + ctx.handshake_timeout;
    move || {
        ctx.tick()?;
        let now = Instant::now();
        if now >= stall {
            return Err(Error::Protocol(format!("{what} made no progress within the stall bound (peer too slow)")));
        }
        if overall.is_some_and(|d| now >= d) {
            return Err(Error::Protocol(format!(
                "{what} moved slower than min_payload_rate_kib ({} KiB/s; peer too slow)",
                ctx.min_payload_rate / 1024
            )));
        }
        Ok(())
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
    if r.kind == crate::memory::MemoryKind::SharedHost && crate::memory::owners::loan_blocks(req.addr, write) {
        let held = if write { "exported to an IPC requester" } else { "exported for WRITE to an IPC requester" };
        return Err(Error::Unavailable(format!(
            "region {} lies in a shared allocation {held} until its close receipt",
            r.id
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

fn respond_failure(ctx: &SourceContext, s: &Mutex<TcpStream>, kind: MsgKind, tag: u64, e: &Error) -> Result<()> {
    ctx.stats.record_served(TransportKind::Tcp, false, 0);
    let text = e.message();
    let text = &text.as_bytes()[..text.len().min(message::MAX_REASON)];
    let fixed = DataResponse { tag, status: e.status() }.encode();
    let h = FrameHeader::encode(kind, (fixed.len() + text.len()) as u32);
    let mut w = 0;
    io::write_all_parts(&mut *s.lock(), &[&h, &fixed, text], &mut ctx.answer_tick(), &mut w)
}

fn serve_read(ctx: &SourceContext, s: &Mutex<TcpStream>, req: DataRequest) -> Result<()> {
    let (lease, _guard) = match validate(ctx, &req, false) {
        Ok(v) => v,
        Err(e) => return respond_failure(ctx, s, MsgKind::ReadResponse, req.tag, &e),
    };
    let fixed = DataResponse { tag: req.tag, status: Status::Ok }.encode();
    let h = FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() as u64 + req.len) as u32);
    // SAFETY: `lease` keeps the region containing [addr, addr+len) registered
    // for the duration of this write; the range was bounds-checked.
    let payload = unsafe { std::slice::from_raw_parts(req.addr as *const u8, req.len as usize) };
    // A requester that stops reading must not pin this thread forever: each
    // MiB must leave within the stall bound, and the whole at the minimum rate.
    let overall = ctx.payload_deadline(req.len);
    let mut w = 0;
    let mut tick = payload_tick(ctx, overall, "response (peer not reading)");
    let first = payload.len().min(1 << 20);
    // Counted before it leaves: a requester that has its answer sees it
    // counted here (a failed send ends the connection anyway).
    ctx.stats.record_served(TransportKind::Tcp, true, req.len);
    let s = &mut *s.lock();
    io::write_all_parts(s, &[&h, &fixed, &payload[..first]], &mut tick, &mut w)?;
    let mut done = first;
    while done < payload.len() {
        let n = (payload.len() - done).min(1 << 20);
        let mut tick = payload_tick(ctx, overall, "response (peer not reading)");
        io::write_all_parts(s, &[&payload[done..done + n]], &mut tick, &mut w)?;
        done += n;
    }
    drop(lease);
    Ok(())
}

/// Serves a WRITE: the payload lands in registered memory; its answer
/// joins the waiting ones (sent before this thread could block).
fn serve_write(
    ctx: &SourceContext,
    r: &mut impl Read,
    w: &Mutex<TcpStream>,
    req: DataRequest,
    answers: &mut Answers,
) -> Result<()> {
    match validate(ctx, &req, true) {
        Ok((lease, _guard)) => {
            // SAFETY: `lease` keeps [addr, addr+len) inside a registered region
            // that allows remote WRITE; this thread is its only writer here.
            let dst = unsafe { std::slice::from_raw_parts_mut(req.addr as *mut u8, req.len as usize) };
            read_progressing(ctx, r, dst)?;
            drop(lease);
            ctx.stats.record_served(TransportKind::Tcp, true, req.len);
            answers.add_written(ctx, w, req.tag)
        }
        Err(e) => {
            // Drain the refused payload, still requiring progress.
            let mut scratch = vec![0u8; (req.len as usize).min(1 << 16)];
            let mut left = req.len as usize;
            while left > 0 {
                let n = left.min(scratch.len());
                read_progressing(ctx, r, &mut scratch[..n])?;
                left -= n;
            }
            answers.flush(ctx, w)?;
            respond_failure(ctx, w, MsgKind::WriteResponse, req.tag, &e)
        }
    }
}
