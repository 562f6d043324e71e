//! Source side of a requester's IPC channel: the handshake (uid, key,
//! identity against the kernel, epochs) runs on a short-lived thread, then
//! the channel is served by the engine's I/O threads: one answer per
//! request, sent as the socket takes it (a handle's descriptor with its
//! first byte), every answer within the stall bound.

use super::channel::{deadline_tick, Channel, ChannelIo, Frame};
use super::export::{AckGuard, ExportTable};
use super::messages::{self, ExportRef, ExportRequest, Hello, Revalidate, Welcome};
use super::proto::source::{self as proto, AnswerHost, IpcSourceCore, Reply};
use crate::control::auth::{self, AuthKey, FrameIo};
use crate::control::frame::MsgKind;
use crate::control::identity::process_start_time;
use crate::control::message;
use crate::control::pipe::Got;
use crate::control::wire::Wire;
use crate::control::Identity;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::sync::deadline::Deadline;
use crate::transport::reactor::{Ended, Flow, Handler, Reactor, Registration, Served, SCRATCH};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

mod answers;

/// What the IPC serving side needs.
pub struct IpcSourceContext {
    /// The exports of each IPC transport this engine offers.
    pub tables: Vec<(crate::kinds::TransportKind, Arc<ExportTable>)>,
    /// This engine's identity.
    pub identity: Identity,
    /// The fabric domain for which MNNVL channels are accepted over TCP.
    pub fabric_domain: Option<[u8; 16]>,
    /// Counters (fabric channels accepted).
    pub stats: Arc<crate::counters::Counters>,
    /// Set when the engine stops.
    pub stopping: Arc<AtomicBool>,
    /// Handshake deadline, and the stall bound of every answer.
    pub handshake_timeout: Duration,
    /// The shared key an IPC channel must prove, if any (fabric channels
    /// prove it on the TCP listener before they get here).
    pub auth: Option<AuthKey>,
    /// Users besides this process's own who may open a Unix channel.
    pub allowed_uids: Vec<u32>,
    /// The answer to an MNNVL channel's `MnnvlProbe` (where this engine
    /// made its probe allocation).
    pub probe: Option<ProbeSource>,
}

/// Makes the body of an `MnnvlProbeAnswer` and the descriptor that goes
/// with it (a POSIX-fd probe hands each peer a descriptor of its own).
pub type ProbeSource = Arc<dyn Fn() -> Result<(Vec<u8>, Option<OwnedFd>)> + Send + Sync>;

impl IpcSourceContext {
    /// Whether processes of `uid` may open a Unix IPC channel here.
    fn admits(&self, uid: u32) -> bool {
        super::channel::admits_uid(uid, &self.allowed_uids)
    }
}

/// The first check of an accepted Unix channel, made by the accept loop
/// before the channel may wait for a handshake (or make another wait
/// less): only this user's processes (and the allowed uids) may open one.
/// Returns the peer's kernel-verified pid; a process of another user is
/// refused `PERMISSION_DENIED` at once (counted in `ipc_uid_refusals`;
/// the refusal is written only if the socket takes it now) and learns
/// nothing more: `None`.
pub fn admit_unix(ctx: &IpcSourceContext, ch: &mut Channel) -> Option<u32> {
    let (pid, uid) = ch.peer_cred().ok()?;
    if ctx.admits(uid) {
        return Some(pid);
    }
    ctx.stats.events.ipc_uid_refusals.fetch_add(1, Ordering::Relaxed);
    let e = Error::PermissionDenied(format!(
        "processes of user {uid} may not open an IPC channel to this engine (ipc_allowed_uids)"
    ));
    let body = message::encode_error(e.status(), e.message());
    let _ = ch.send(MsgKind::Error, &body, &[], &mut || Err(Error::TimedOut("refusal".into())));
    ch.shutdown();
    None
}

/// The tick of one answer: the requester must read it within the stall
/// bound, or the channel ends (it cannot pin this thread).
fn answer_tick<'a>(stall: Duration, stop: &'a dyn Fn() -> Result<()>) -> impl FnMut() -> Result<()> + 'a {
    Deadline::after(stall, stop)
        .ticker(|| Error::Protocol("answer not read within the stall bound (the requester is not reading)".into()))
}

/// Serves one accepted IPC connection: a Unix channel (`hello: None`: its
/// user admitted by [`admit_unix`]; with a key, it authenticates first), or a TCP fabric
/// channel whose listener already authenticated it and read its
/// `IpcHello`. The handshake runs on the calling thread; once the
/// requester proved who it is, `admit` gives it a channel slot (or refuses
/// it, `RESOURCE_EXHAUSTED`); then `reactor` serves the channel and
/// `on_done` runs when it ends. `None` when the channel ended in its
/// handshake (refused, or broken: a protocol error is told to the peer).
pub fn serve(
    ctx: Arc<IpcSourceContext>,
    mut ch: Channel,
    conn: u64,
    hello: Option<Frame>,
    admit: &dyn Fn() -> Result<()>,
    reactor: &Reactor,
    on_done: Box<dyn FnOnce() + Send>,
) -> Option<Arc<dyn Served>> {
    let mut chosen = None;
    match handshake(&ctx, &mut ch, conn, &mut chosen, hello, admit) {
        Ok(Some((table, requester))) => {
            let served = IpcServed::start(ctx, ch, conn, table, requester, reactor, on_done);
            return served.map(|s| s as Arc<dyn Served>);
        }
        Ok(None) => {}
        Err(Error::Protocol(m)) => {
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut tick = || deadline_tick(deadline, "error");
            let body = messages::encode_reject(0, crate::error::Status::ProtocolError, &m);
            let _ = ch.send(MsgKind::ExportReject, &body, &[], &mut tick);
        }
        Err(_) => {}
    }
    ch.shutdown();
    if let Some(t) = chosen {
        t.connection_lost(conn);
    }
    None
}

/// The handshake: returns the export table the requester chose and its
/// identity once `IpcWelcome` is sent, `None` when it was refused.
fn handshake(
    ctx: &IpcSourceContext,
    ch: &mut Channel,
    conn: u64,
    chosen: &mut Option<Arc<ExportTable>>,
    hello: Option<Frame>,
    admit: &dyn Fn() -> Result<()>,
) -> Result<Option<(Arc<ExportTable>, Identity)>> {
    let stop = || {
        if ctx.stopping.load(Ordering::Acquire) {
            return Err(Error::Unavailable("engine is shutting down".into()));
        }
        Ok(())
    };
    // Every answer must be read within the stall bound.
    let send = |ch: &mut Channel, kind: MsgKind, body: &[u8], fds: &[std::os::fd::RawFd]| {
        ch.send(kind, body, fds, &mut answer_tick(ctx.handshake_timeout, &stop))
    };
    // Handshake: check the requester's claimed identity against the kernel.
    let hs_deadline = Instant::now() + ctx.handshake_timeout;
    let mut hs_tick = || {
        stop()?;
        if Instant::now() >= hs_deadline {
            return Err(Error::Protocol("no IpcHello within the handshake timeout".into()));
        }
        Ok(())
    };
    let f = match hello {
        Some(f) => f,
        None => {
            // A Unix channel, whose user the accept loop admitted
            // (`admit_unix`).
            let f = ch.recv(&mut hs_tick)?;
            if ctx.auth.is_none() && f.kind != MsgKind::AuthChallenge {
                f
            } else {
                let mut io = ChannelIo { ch: &mut *ch, bound: Deadline { at: hs_deadline, stop: &stop } };
                if let Err(e) = auth::accept(&mut io, ctx.auth.as_ref(), (f.kind, &f.body), false) {
                    ctx.stats.events.auth_failures.fetch_add(1, Ordering::Relaxed);
                    let _ = io.send_frame(MsgKind::Error, &auth::refusal(&e));
                    return Ok(None);
                }
                ch.recv(&mut hs_tick)?
            }
        }
    };
    if f.kind != MsgKind::IpcHello {
        return Err(Error::Protocol(format!("expected IpcHello first, got {:?}", f.kind)));
    }
    let hello = Hello::decode(&f.body)?;
    let requester = hello.identity;
    let refuse_with = |ch: &mut Channel, e: Error| -> Result<Option<(Arc<ExportTable>, Identity)>> {
        let body = messages::encode_reject(0, e.status(), e.message());
        send(ch, MsgKind::ExportReject, &body, &[])?;
        Ok(None)
    };
    if ch.is_tcp() {
        // A fabric channel: no kernel identity; only MNNVL with fabric
        // handles, and only for this engine's own nonzero fabric domain.
        let mnnvl = crate::kinds::TransportKind::Mnnvl as u32;
        match ctx.fabric_domain {
            Some(d) if hello.transport == mnnvl && hello.fabric_domain == d => {
                ctx.stats.events.fabric_channels_accepted.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) if hello.transport == mnnvl => {
                return refuse_with(
                    ch,
                    Error::PermissionDenied("the requester's fabric domain is not this engine's".into()),
                )
            }
            _ => {
                return refuse_with(
                    ch,
                    Error::NotSupported(
                        "this engine accepts IPC over TCP only for MNNVL with fabric handles and a fabric domain"
                            .into(),
                    ),
                )
            }
        }
    } else {
        let (pid, _) = ch.peer_cred()?;
        if pid != requester.process.pid || process_start_time(pid) != requester.process.start_time {
            return refuse_with(
                ch,
                Error::StalePeer(format!(
                    "requester claims pid {} (start {}), the kernel says pid {pid} (start {})",
                    requester.process.pid,
                    requester.process.start_time,
                    process_start_time(pid)
                )),
            );
        }
        if !ctx.identity.same_boot(&requester) {
            return refuse_with(ch, Error::StalePeer("requester runs on another boot; SHM needs the same host".into()));
        }
    }
    if hello.expected_source_epoch != ctx.identity.engine_epoch {
        return refuse_with(
            ch,
            Error::StalePeer(format!(
                "requester expects source epoch {:x}, this engine is {:x} (restarted?)",
                hello.expected_source_epoch, ctx.identity.engine_epoch
            )),
        );
    }
    let Some(table) = ctx.tables.iter().find(|(k, _)| *k as u32 == hello.transport).map(|(_, t)| t.clone()) else {
        return refuse_with(
            ch,
            Error::NotSupported(format!("this engine offers no IPC transport with code {}", hello.transport)),
        );
    };
    if !ch.is_tcp() {
        // What the transport itself asks of the requester (CMA: its user).
        let (_, uid) = ch.peer_cred()?;
        if let Err(e) = table.admit_requester(uid, &requester.process) {
            return refuse_with(ch, e);
        }
    }
    if let Err(e) = admit() {
        return refuse_with(ch, e);
    }
    *chosen = Some(table.clone());
    // A Unix channel gets a grant board (a fabric channel crosses hosts:
    // every submission takes the round trip there). A board that cannot be
    // made only costs the round trips.
    let board = if ch.is_tcp() { None } else { super::export::ChannelBoard::create().ok().map(Arc::new) };
    if let Some(b) = &board {
        table.attach_board(conn, b.clone());
    }
    // The board, then the liveness page that tells whether this process
    // still stands behind its words.
    let mut fds = Vec::new();
    if let Some(b) = &board {
        fds.push(std::os::fd::AsRawFd::as_raw_fd(b.board().fd()));
    }
    // Without a page (the kernel refused it) requesters poll instead.
    let alive = board.as_ref().and_then(|_| super::alive::process_page());
    fds.extend(alive.as_ref().map(|a| std::os::fd::AsRawFd::as_raw_fd(a.fd())));
    send(ch, MsgKind::IpcWelcome, &Welcome { identity: ctx.identity }.encode(), &fds)?;

    Ok(Some((table, requester)))
}

/// What rides with an answer: the descriptor sent with its first byte,
/// and the guard that keeps a close waiting for the answer to leave.
#[derive(Default)]
struct Attached {
    fd: Option<OwnedFd>,
    _ack: Option<AckGuard>,
    /// The export whose handle it carries: one dropped unsent ends it.
    export: Option<ExportRef>,
}

type Answer = proto::Answer<Attached>;
/// What the channel's one lock guards: its protocol core and how its
/// bytes travel (sealed in records on a keyed fabric channel).
struct Core {
    proto: IpcSourceCore<Attached>,
    wire: Wire,
}

impl std::ops::Deref for Core {
    type Target = IpcSourceCore<Attached>;
    fn deref(&self) -> &Self::Target {
        &self.proto
    }
}

impl std::ops::DerefMut for Core {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.proto
    }
}

fn plain(kind: MsgKind, body: &[u8]) -> Answer {
    Answer::new(kind, body, Attached::default())
}

fn reject(tag: u64, e: &Error) -> Answer {
    plain(MsgKind::ExportReject, &messages::encode_reject(tag, e.status(), e.message()))
}

/// A handshaken IPC channel served by an I/O thread: the protocol state
/// is its core, behind the one lock of the channel; answers that wait for
/// a producer stream are made on a thread of their own and filled in.
struct IpcServed {
    ch: Channel,
    ctx: Arc<IpcSourceContext>,
    conn: u64,
    table: Arc<ExportTable>,
    requester: Identity,
    core: Mutex<Core>,
    reg: once_cell::sync::OnceCell<Registration>,
    finished: Ended,
    /// Run once, when the channel ends (taken, then run unlocked).
    on_done: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Itself, for the threads that fill in answers.
    me: Weak<IpcServed>,
}

/// The core's view of the channel's answers.
struct Answering<'a>(&'a IpcServed);

impl AnswerHost<Attached> for Answering<'_> {
    fn answer(&mut self, kind: MsgKind, body: &[u8], ticket: u64) -> Result<Reply<Attached>> {
        self.0.answer(kind, body, ticket)
    }
}

impl IpcServed {
    fn start(
        ctx: Arc<IpcSourceContext>,
        mut ch: Channel,
        conn: u64,
        table: Arc<ExportTable>,
        requester: Identity,
        reactor: &Reactor,
        on_done: Box<dyn FnOnce() + Send>,
    ) -> Option<Arc<IpcServed>> {
        let ok = ch.set_nonblocking();
        let stall = ctx.handshake_timeout;
        let wire = ch.take_wire();
        let s = Arc::new_cyclic(|me| IpcServed {
            ch,
            ctx,
            conn,
            table,
            requester,
            core: Mutex::new(Core { proto: IpcSourceCore::new(stall), wire }),
            reg: once_cell::sync::OnceCell::new(),
            finished: Ended::default(),
            on_done: Mutex::new(Some(on_done)),
            me: me.clone(),
        });
        match ok.and_then(|_| reactor.register(s.ch.raw_fd(), s.clone())) {
            Ok(r) => {
                let _ = s.reg.set(r);
                Some(s)
            }
            Err(e) => {
                s.fail(&e, s.core.lock());
                None
            }
        }
    }

    /// Ends the channel for `e`: the core lets go of its answers, then,
    /// unlocked, a protocol error is told to the peer (when no answer is
    /// half written), the socket shut, the export table told.
    fn fail(&self, e: &Error, mut core: parking_lot::MutexGuard<'_, Core>) {
        let mid = core.mid_answer();
        let dropped = core.end();
        // A protocol error is told to the peer when no answer is half
        // written: sealed (best effort, without blocking) while the wire
        // is at hand, plain once the lock is released.
        let told = match (e, mid) {
            (Error::Protocol(m), false) => {
                Some(plain(MsgKind::ExportReject, &messages::encode_reject(0, crate::error::Status::ProtocolError, m)))
            }
            _ => None,
        };
        let told = match (&mut core.wire, self.ch.tcp(), told) {
            (w @ Wire::Sealed(_), Some(s), Some(a)) => {
                let _ = w.send(s, &[&a.bytes], 0, a.bytes.len()).and_then(|_| w.flush(s));
                None
            }
            (_, _, told) => told,
        };
        drop(core);
        // Handles that never left (the descriptor rides on the first byte)
        // end their exports: nobody can hold them.
        for a in dropped.iter().skip(mid as usize) {
            self.not_sent(a);
        }
        if let Some(a) = told {
            let _ = self.ch.send_some(&a.bytes, None);
        }
        self.ch.shutdown();
        drop(dropped);
        self.table.connection_lost(self.conn);
        self.finished.set();
        let done = self.on_done.lock().take();
        if let Some(f) = done {
            f();
        }
    }

    /// Writes the answers ready, as far as the socket takes them; those
    /// that left go to `done` (dropped once the lock is released). Sealed,
    /// an answer leaves in records of its own (made here, sent as the
    /// socket takes them; records already made leave first).
    fn flush(&self, core: &mut Core, done: &mut Vec<Answer>) -> Result<()> {
        let lost = |e: std::io::Error| Error::Unavailable(format!("IPC channel lost: {e}"));
        let Core { proto, wire } = core;
        loop {
            let sent = match (&mut *wire, self.ch.tcp()) {
                (w @ Wire::Sealed(_), Some(s)) => {
                    if !w.flush(s).map_err(lost)? {
                        break;
                    }
                    let Some((bytes, _, _)) = proto.to_send() else { break };
                    w.send(s, &[bytes], 0, bytes.len())
                }
                _ => {
                    let Some((bytes, first, x)) = proto.to_send() else { break };
                    let fd = if first { x.fd.as_ref().map(|f| f.as_raw_fd()) } else { None };
                    self.ch.send_some(bytes, fd)
                }
            };
            match sent {
                Ok(n) => {
                    if let Some(mut a) = proto.sent(n, Instant::now()) {
                        // Its descriptor left with its first byte: this
                        // copy goes now, so that only the requester holds
                        // the description (whether anything still holds it
                        // decides when the export may end).
                        a.extra.fd = None;
                        done.push(a);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(lost(e)),
            }
        }
        Ok(())
    }

    /// Sends what is ready, reads what the socket holds while answers are
    /// below their bound and answers every complete request. `true` when
    /// it stopped with bytes possibly left in the socket (run it again:
    /// no readable edge may come for them).
    fn serve(&self, core: &mut Core, scratch: &mut [u8], done: &mut Vec<Answer>) -> Result<bool> {
        let mut budget = 64usize;
        loop {
            if budget == 0 {
                return Ok(true);
            }
            budget -= 1;
            self.flush(core, done)?;
            core.handle(Instant::now(), &mut Answering(self))?;
            self.flush(core, done)?;
            if !core.has_room() {
                // At the bound: the peer's reading (a writable edge) or an
                // answer filled in wakes the channel.
                return Ok(false);
            }
            if !core.wants_bytes() {
                // Bytes read before the bound wait, and room was made.
                continue;
            }
            let (got, fds) = match (&mut core.wire, self.ch.tcp()) {
                (w @ Wire::Sealed(_), Some(s)) => (w.read(s, scratch)?, false),
                _ => self.ch.recv_some(scratch)?,
            };
            if fds {
                return Err(Error::Protocol("a file descriptor arrived from the requester".into()));
            }
            match got {
                Got::Drained => return Ok(false),
                Got::Eof => return Err(Error::Unavailable("the IPC channel was closed by the peer".into())),
                Got::Bytes(n) => core.receive(&scratch[..n], Instant::now(), &mut Answering(self))?,
            }
        }
    }

    /// Stall bounds (a frame started and not completed, an answer not
    /// read), the engine stopping, and offers never answered.
    fn check(&self, core: &mut Core, now: Instant, done: &mut Vec<Answer>) -> Result<()> {
        if self.ctx.stopping.load(Ordering::Acquire) {
            return Err(Error::Unavailable("engine is shutting down".into()));
        }
        core.check(now)?;
        self.table.expire_offers(self.conn);
        self.flush(core, done)
    }
}

impl Served for IpcServed {
    fn is_finished(&self) -> bool {
        self.finished.is_set()
    }

    fn stop(&self, bound: Duration) {
        self.ch.shutdown();
        if let Some(r) = self.reg.get() {
            r.wake();
        }
        self.finished.wait(bound);
    }
}

impl Handler for IpcServed {
    fn ready(&self, scratch: &mut [u8]) -> Flow {
        let mut core = self.core.lock();
        if core.is_ended() {
            return Flow::Done;
        }
        let mut done = Vec::new();
        match self.serve(&mut core, &mut scratch[..SCRATCH], &mut done) {
            Ok(again) => {
                drop(core);
                drop(done);
                if again {
                    Flow::Again
                } else {
                    Flow::Idle
                }
            }
            Err(e) => {
                self.fail(&e, core);
                Flow::Done
            }
        }
    }

    fn tick(&self, now: Instant) -> (Flow, Option<Instant>) {
        let mut core = self.core.lock();
        if core.is_ended() {
            return (Flow::Done, None);
        }
        let mut done = Vec::new();
        match self.check(&mut core, now, &mut done) {
            Ok(()) => {
                let stall = core.next_deadline();
                drop(core);
                drop(done);
                let offers = self.table.next_offer_expiry(self.conn);
                (Flow::Idle, stall.into_iter().chain(offers).min())
            }
            Err(e) => {
                self.fail(&e, core);
                (Flow::Done, None)
            }
        }
    }
}
