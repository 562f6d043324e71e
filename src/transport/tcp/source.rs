//! Source side of a control connection: the driver of
//! [`super::proto::source::SourceCore`]. After the handshake (on a
//! short-lived thread of its own, bounded by `handshake_timeout_ms`), the
//! connection is served by the engine's I/O threads
//! ([`crate::transport::reactor`]): one lock around the core, the socket's
//! reads (WRITE payload straight into registered memory) and writes
//! (answers coalesced, READ payload straight from registered memory), and,
//! once the lock is released, the notifications to make visible. The
//! protocol itself — parsing, validation through the engine, the answers'
//! bound, stall bounds — is the core's.

use super::handshake::Opened;
use super::linger::{Closing, Linger};
use super::proto::source::{AfterSend, Limits, Recv, SourceCore, SourceHost};
use super::pump::{self, Next, Received, Sent, Socket};
use super::torn::{Torn, TornReports};
use crate::control::frame::MsgKind;
use crate::control::message::{DataRequest, Describe};
use crate::control::notify_frame::Notify;
use crate::control::wire::Wire;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::log::Logger;
use crate::memory::{Access, RegionLease, RegionTable};
use crate::sync::admission::{Gate, GateGuard};
use crate::transport::inbox::{Admitted, Inbox, Notification};
use crate::transport::reactor::{Ended, Flow, Handler, Reactor, Registration, Served, SCRATCH};
use crate::transport::tcp::pump::segment_bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
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
    /// The engine's logger.
    pub log: Arc<Logger>,
    /// Reports of WRITEs cut mid-payload (their log lines, rate-limited).
    pub torn: TornReports,
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

/// Most bytes a connection reads, or writes, in one turn of its I/O thread.
const TURN_BYTES: u64 = 4 << 20;

/// What the protocol core asks of the engine, for one connection.
struct EngineHost {
    ctx: Arc<SourceContext>,
    /// The requester's endpoint (a notification's sender when it names none).
    endpoint: String,
    /// The socket's peer address.
    peer: String,
}

impl SourceHost for EngineHost {
    type Held = (RegionLease, GateGuard);
    type Admitted = Admitted;

    fn validate(&mut self, req: &DataRequest, write: bool) -> Result<Self::Held> {
        validate(&self.ctx, req, write)
    }

    fn describe(&mut self) -> Vec<u8> {
        (self.ctx.describe)().encode()
    }

    fn admit(&mut self, n: Notify) -> Result<Admitted> {
        let sender = if n.name.is_empty() { self.endpoint.clone() } else { n.name };
        self.ctx.inbox.admit(Notification { sender, msg: n.msg })
    }

    fn notify_max(&self) -> usize {
        self.ctx.inbox.max_bytes()
    }

    fn land(&mut self, addr: u64, bytes: &[u8]) {
        // SAFETY: the core lands a WRITE's payload only inside the range its
        // held lease (validated by `validate`: registered, bounds-checked,
        // remote WRITE allowed) keeps registered; only this connection's
        // I/O thread writes it for this request.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    }

    fn served(&mut self, ok: bool, bytes: u64) {
        self.ctx.stats.record_served(TransportKind::Tcp, ok, bytes);
    }

    fn notify_rejected(&mut self) {
        self.ctx.stats.notifications.rejected.fetch_add(1, Ordering::Relaxed);
    }

    fn torn(&mut self, req: &DataRequest, landed: u64, held: Self::Held, why: &str) {
        let region = held.0.region().id;
        drop(held);
        let t = Torn { peer: &self.peer, endpoint: &self.endpoint, region, req, landed, why };
        self.ctx.torn.report(&self.ctx.log, &self.ctx.stats, &t);
    }
}

/// One connection's state behind its one lock: the protocol core, what it
/// asks the engine through, and the socket's receive low-water mark.
struct State {
    core: SourceCore<EngineHost>,
    host: EngineHost,
    /// How the bytes travel (sealed with a key).
    wire: Wire,
    lowat: usize,
}

/// An incoming control connection served by an I/O thread: a thin driver
/// around [`SourceCore`] (one lock, the socket's I/O, notifications made
/// visible once the lock is released).
pub struct SourceConn {
    stream: TcpStream,
    state: Mutex<State>,
    reg: once_cell::sync::OnceCell<Registration>,
    revoker_id: AtomicU64,
    finished: Ended,
    /// The engine's live connections, this one among them until it ends.
    revoker: Arc<Revoker>,
    /// Run once, when the connection ends (taken, then run unlocked).
    on_done: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Once the protocol ended: the socket's graceful close, driven by the
    /// I/O thread without the state's lock (taken after it, never before).
    closing: Mutex<Option<Linger>>,
}

/// Answers the handshake of `stream`, whose first frame (after any
/// authentication) has the header `first`, then hands the connection to
/// `reactor`; `on_done` runs when it ends. `None` when the handshake
/// failed (an Error frame was sent and the socket shut down).
pub fn serve(
    ctx: Arc<SourceContext>,
    mut stream: TcpStream,
    mut first: Opened,
    reactor: &Reactor,
    on_done: Box<dyn FnOnce() + Send>,
) -> Option<Arc<SourceConn>> {
    let stop = || match ctx.stopping.load(Ordering::Acquire) {
        true => Err(Error::Unavailable("engine is shutting down".into())),
        false => Ok(()),
    };
    let handshaken = stream.try_clone().map_err(|e| Error::io("clone socket", &e)).and_then(|mut r| {
        super::handshake::answer(&mut first, &mut r, &mut stream, ctx.handshake_timeout, &stop, || (ctx.describe)())
    });
    let peer = match handshaken {
        Ok(p) => p,
        Err(e) => {
            if let Error::Protocol(_) = e {
                ctx.stats.events.protocol_errors.fetch_add(1, Ordering::Relaxed);
                first.refuse(&mut stream, &e);
            }
            let _ = stream.shutdown(Shutdown::Both);
            return None;
        }
    };
    SourceConn::start(ctx, stream, Wire::from(first.seal), peer.endpoint, reactor, on_done).ok()
}

impl SourceConn {
    fn start(
        ctx: Arc<SourceContext>,
        stream: TcpStream,
        wire: Wire,
        endpoint: String,
        reactor: &Reactor,
        on_done: Box<dyn FnOnce() + Send>,
    ) -> Result<Arc<SourceConn>> {
        stream.set_nonblocking(true).map_err(|e| Error::io("set_nonblocking", &e))?;
        let _ = stream.set_nodelay(true);
        let limits = Limits { stall: ctx.handshake_timeout, min_rate: ctx.min_payload_rate };
        let peer = stream.peer_addr().map_or_else(|_| "(address unknown)".to_string(), |a| a.to_string());
        let revoker = ctx.revoker.clone();
        let c = Arc::new(SourceConn {
            stream,
            state: Mutex::new(State {
                core: SourceCore::new(limits),
                host: EngineHost { ctx, endpoint, peer },
                wire,
                lowat: 1,
            }),
            reg: once_cell::sync::OnceCell::new(),
            revoker_id: AtomicU64::new(u64::MAX),
            finished: Ended::default(),
            revoker,
            on_done: Mutex::new(Some(on_done)),
            closing: Mutex::new(None),
        });
        c.revoker_id.store(c.revoker.add(Arc::downgrade(&c)), Ordering::Relaxed);
        match reactor.register(c.stream.as_raw_fd(), c.clone()) {
            Ok(r) => {
                let _ = c.reg.set(r);
                Ok(c)
            }
            Err(e) => {
                c.end(&mut c.state.lock(), None);
                // No I/O thread closes it gracefully.
                let _ = c.stream.shutdown(Shutdown::Both);
                c.ended();
                Err(e)
            }
        }
    }

    /// Queues a whole control frame; false when the connection has ended.
    fn push_frame(&self, kind: MsgKind, body: &[u8]) -> bool {
        if self.is_finished() {
            return false;
        }
        self.state.lock().core.push_frame(kind, body);
        if let Some(r) = self.reg.get() {
            r.wake();
        }
        true
    }

    /// The connection is over: the core releases what it held (leases,
    /// gate guards, unpublished notifications) and the socket's graceful
    /// close begins, owing the peer what the wire still holds, then `last`
    /// ([`Linger`]: the I/O thread drives it once the lock is released).
    /// Runs under the connection's lock; whoever holds it calls
    /// [`SourceConn::ended`] once the lock is released.
    fn end(&self, st: &mut State, last: Option<&[u8]>) {
        st.core.end(&mut st.host);
        let owed = st.wire.owed(last);
        *self.closing.lock() = Some(Linger::new(owed, Instant::now()));
    }

    /// A turn of the graceful close, if the connection is closing
    /// (without the state's lock): `Flow::Done` once it is over, the
    /// socket shut.
    fn linger(&self, scratch: &mut [u8], now: Instant) -> Option<Flow> {
        let mut closing = self.closing.lock();
        let flow = match closing.as_mut()?.turn(&self.stream, scratch, now) {
            Closing::Waiting => Flow::Idle,
            Closing::Again => Flow::Again,
            Closing::Done => {
                let _ = self.stream.shutdown(Shutdown::Both);
                Flow::Done
            }
        };
        Some(flow)
    }

    /// After [`SourceConn::end`], with the connection's lock released (no
    /// callback runs under it): the connection leaves the revoker, its
    /// waiters and its listener are told. Runs `on_done` once.
    fn ended(&self) {
        self.revoker.remove(self.revoker_id.load(Ordering::Relaxed));
        self.finished.set();
        let done = self.on_done.lock().take();
        if let Some(f) = done {
            f();
        }
    }

    /// Ends the connection for `e`: a protocol error is counted and told to
    /// the peer (when no answer is half written).
    fn fail(&self, e: &Error, st: &mut State) {
        if let Error::Protocol(_) = e {
            st.host.ctx.stats.events.protocol_errors.fetch_add(1, Ordering::Relaxed);
        }
        let told = st.core.fail(e, &mut st.host);
        self.end(st, told.as_deref());
    }

    /// Writes what waits, as far as the socket takes it and within the
    /// turn's share ([`pump::write_out`]): `Flow::Again` when that share is
    /// used or a Describe waits for the next turn to be built. `Ok(None)`
    /// when the connection is to end (everything before its close has
    /// left).
    fn flush(&self, st: &mut State, now: Instant) -> Result<Option<Flow>> {
        let State { core, host, wire, lowat } = st;
        let mut pipe = Socket { stream: &self.stream, lowat };
        match pump::write_out(&mut pipe, wire, &mut Out { core, host, now }, TURN_BYTES) {
            Ok(Sent::Complete | Sent::Blocked) => Ok(Some(Flow::Idle)),
            Ok(Sent::Budget) => Ok(Some(Flow::Again)),
            Ok(Sent::Closed) => Ok(None),
            Err(e) if e.kind() == ErrorKind::WriteZero => {
                Err(Error::Unavailable("connection closed while answering".into()))
            }
            Err(e) => Err(Error::Unavailable(format!("connection lost: {e}"))),
        }
    }

    /// The receive turn ([`pump::receive`]): reads what the socket holds
    /// while the answers waiting have room, WRITE payload straight into
    /// registered memory. `Flow::Again` when it stopped with bytes possibly
    /// left in the socket (its share of the turn used, or too many answers
    /// waiting: the next readable edge may never come for those bytes, so
    /// the caller runs it again once the answers have room).
    fn receive(&self, st: &mut State, scratch: &mut [u8], now: Instant) -> Result<Flow> {
        let State { core, host, wire, lowat } = st;
        let mut pipe = Socket { stream: &self.stream, lowat };
        let mut budget = TURN_BYTES;
        Ok(match pump::receive(&mut pipe, wire, &mut In { core, host, now }, scratch, &mut budget, None)? {
            Received::More => Flow::Again,
            Received::Drained | Received::Closed => Flow::Idle,
        })
    }
}

/// The core's sending side, for the pump.
struct Out<'a> {
    core: &'a mut SourceCore<EngineHost>,
    host: &'a mut EngineHost,
    now: Instant,
}

impl pump::Outgoing for Out<'_> {
    fn parts(&mut self) -> (Vec<&[u8]>, u64) {
        let (segs, skip) = self.core.transmit(self.now);
        // SAFETY: the core keeps the request's lease (the region holding
        // [addr, addr+len), bounds-checked by `validate`) until these bytes
        // have been sent; the pump drops the parts before the core hears
        // what was sent.
        (segs.into_iter().map(|s| unsafe { segment_bytes(s) }).collect(), skip as u64)
    }

    fn sent(&mut self, n: usize) {
        self.core.sent(n, self.now);
    }

    fn nothing(&mut self) -> Option<Sent> {
        match self.core.after_send(self.host) {
            AfterSend::Close => Some(Sent::Closed),
            // A Describe left for the next turn: it comes at once.
            AfterSend::Idle if self.core.describe_deferred() => Some(Sent::Budget),
            AfterSend::Idle => Some(Sent::Complete),
            AfterSend::More => None,
        }
    }

    fn closes(&mut self) -> bool {
        self.core.after_send(self.host) == AfterSend::Close
    }
}

/// The core's receiving side, for the pump.
struct In<'a> {
    core: &'a mut SourceCore<EngineHost>,
    host: &'a mut EngineHost,
    now: Instant,
}

impl pump::Incoming for In<'_> {
    fn next(&mut self) -> Next<'_> {
        match self.core.recv(self.now) {
            Recv::Ended => Next::Stop(Received::Closed),
            Recv::Paused => Next::Stop(Received::More),
            // SAFETY: the core names the rest of a WRITE's payload, inside
            // the range its held lease keeps registered (remote WRITE
            // allowed); only this thread writes it for this request.
            // Sealed, only bytes of records that checked are copied there.
            Recv::Direct { addr, len } if len >= (SCRATCH / 2) as u64 => {
                Next::Direct(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) })
            }
            Recv::Direct { .. } | Recv::Buffer => Next::Buffer,
        }
    }

    fn landed(&mut self, n: usize) {
        self.core.landed(n as u64, self.now, self.host);
    }

    fn received(&mut self, bytes: &[u8]) -> Result<bool> {
        self.core.received(bytes, self.now, self.host).map(|_| true)
    }

    fn eof(&mut self) -> Result<()> {
        self.core.eof()
    }

    fn payload_left(&self) -> Option<u64> {
        self.core.payload_left()
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

impl SourceConn {
    /// One turn under the lock, its share bounded by the core
    /// ([`SourceCore::begin_turn`]): answers first (they free room to read
    /// more), then what was read and not handled yet, then requests, then
    /// the answers those produced.
    fn turn(&self, st: &mut State, scratch: &mut [u8]) -> Flow {
        let now = Instant::now();
        if st.host.ctx.stopping.load(Ordering::Acquire) {
            self.fail(&Error::Unavailable("engine is shutting down".into()), st);
            return Flow::Done;
        }
        let State { core, host, .. } = &mut *st;
        core.begin_turn(host);
        let mut sent = Flow::Idle;
        let mut read_more = false;
        for pass in 0..2 {
            match self.flush(st, now) {
                Ok(Some(f)) => sent = f,
                Ok(None) => {
                    self.end(st, None);
                    return Flow::Done;
                }
                Err(e) => {
                    self.fail(&e, st);
                    return Flow::Done;
                }
            }
            if pass == 1 {
                break;
            }
            let State { core, host, .. } = &mut *st;
            let r = if core.stashed() { core.resume(now, host).map(|_| Flow::Again) } else { Ok(Flow::Idle) };
            match r.and_then(|_| self.receive(st, scratch, now)) {
                Ok(f) => read_more = f == Flow::Again,
                Err(e) => {
                    self.fail(&e, st);
                    return Flow::Done;
                }
            }
        }
        // Reading stopped with bytes maybe left: again at once if the
        // answers now have room (else the writable edge that frees it
        // brings this connection back).
        if sent == Flow::Again || (read_more && !st.core.answers_full()) {
            Flow::Again
        } else {
            Flow::Idle
        }
    }
}

impl Handler for SourceConn {
    fn ready(&self, scratch: &mut [u8]) -> Flow {
        if let Some(f) = self.linger(scratch, Instant::now()) {
            return f;
        }
        let (flow, published) = {
            let mut st = self.state.lock();
            if self.is_finished() {
                return Flow::Done;
            }
            let flow = self.turn(&mut st, scratch);
            (flow, st.core.take_published())
        };
        match self.unlocked(flow, published) {
            Flow::Done => self.linger(scratch, Instant::now()).unwrap_or(Flow::Done),
            f => f,
        }
    }

    fn tick(&self, now: Instant) -> (Flow, Option<Instant>) {
        if let Some(deadline) = self.closing.lock().as_ref().map(Linger::deadline) {
            if now < deadline {
                return (Flow::Idle, Some(deadline));
            }
            let _ = self.stream.shutdown(Shutdown::Both);
            return (Flow::Done, None);
        }
        let (flow, published, next) = {
            let mut st = self.state.lock();
            if self.is_finished() {
                return (Flow::Done, None);
            }
            let stopping = st.host.ctx.stopping.load(Ordering::Acquire);
            let check =
                if stopping { Err(Error::Unavailable("engine is shutting down".into())) } else { st.core.check(now) };
            // A frame queued (a `Revoke`) whose wake-up came before this
            // connection's registration was set still leaves.
            let flow = match check.and_then(|_| self.flush(&mut st, now)) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    self.end(&mut st, None);
                    Flow::Done
                }
                Err(e) => {
                    self.fail(&e, &mut st);
                    Flow::Done
                }
            };
            (flow, st.core.take_published(), st.core.next_deadline())
        };
        match self.unlocked(flow, published) {
            // The close's first turn needs the thread's buffer: a turn
            // at once runs it; its deadline ticks it at the latest.
            Flow::Done => (Flow::Again, self.closing.lock().as_ref().map(Linger::deadline)),
            f => (f, next),
        }
    }
}

impl SourceConn {
    /// What a turn leaves for after the lock: notifications made visible
    /// and, when the connection ended, [`SourceConn::ended`] (nothing runs
    /// under the lock).
    fn unlocked(&self, flow: Flow, published: Vec<Admitted>) -> Flow {
        for a in published {
            a.publish();
        }
        if flow == Flow::Done {
            self.ended();
        }
        flow
    }
}

/// Validates a request against the regions: existence, bounds, epoch,
/// permission and memory kind. Returns the lease that keeps the region
/// registered during the copy, and the gate guard for close_source.
fn validate(ctx: &SourceContext, req: &DataRequest, write: bool) -> Result<(RegionLease, GateGuard)> {
    let guard =
        ctx.gate.enter().map_err(|_| Error::Unavailable("the source is closing and serves no new requests".into()))?;
    let wants = if write { Access::WRITE } else { Access::READ };
    let lease = ctx.regions.lease_for_remote(req.addr, req.len, req.region_epoch, wants)?;
    let r = lease.region();
    if !r.kind.cpu_accessible() {
        return Err(Error::NotSupported(format!(
            "region {} holds {} memory, which the TCP transport cannot copy",
            r.id,
            r.kind.name()
        )));
    }
    Ok((lease, guard))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Level;
    use std::net::TcpListener;
    use std::sync::mpsc;

    fn context() -> Arc<SourceContext> {
        let stats = Arc::new(Counters::default());
        Arc::new(SourceContext {
            regions: Arc::new(RegionTable::default()),
            stats: stats.clone(),
            gate: Gate::new("test source"),
            stopping: Arc::new(AtomicBool::new(false)),
            describe: Arc::new(|| Describe::bare(crate::control::identity::Identity::gone())),
            handshake_timeout: Duration::from_secs(30),
            min_payload_rate: 0,
            revoker: Arc::new(Revoker::default()),
            inbox: Arc::new(Inbox::new(4, 1024, stats)),
            log: Arc::new(Logger::new(Level::Off, "test")),
            torn: Default::default(),
        })
    }

    /// A connection's `on_done` (the engine's: it takes the accept loop's
    /// lock and drops the connection's record) runs with the connection's
    /// lock released, and after the connection left the revoker. Guards
    /// `ended` being called by `unlocked` once the lock is gone (with the
    /// callback run from `end`, under the lock, the callback sees the lock
    /// held and the revoker still listing the connection).
    #[test]
    fn on_done_runs_with_the_connection_lock_released() {
        let ctx = context();
        let reactor = Reactor::new(1, Duration::ZERO);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let me: Arc<once_cell::sync::OnceCell<Weak<SourceConn>>> = Default::default();
        let (tx, rx) = mpsc::channel();
        let on_done = {
            let me = me.clone();
            let revoker = ctx.revoker.clone();
            Box::new(move || {
                let c = me.get().and_then(Weak::upgrade).expect("the connection is alive while it ends");
                let unlocked = c.state.try_lock().is_some();
                let listed = revoker.conns.lock().len();
                tx.send((unlocked, listed)).unwrap();
            })
        };
        let c = SourceConn::start(ctx.clone(), server, Wire::Plain, "peer".into(), &reactor, on_done).unwrap();
        me.set(Arc::downgrade(&c)).unwrap();
        assert_eq!(ctx.revoker.conns.lock().len(), 1);
        // The peer goes: the I/O thread ends the connection.
        drop(client);
        let (unlocked, listed) = rx.recv_timeout(Duration::from_secs(30)).expect("the connection ended");
        assert!(unlocked, "on_done ran under the connection's lock");
        assert_eq!(listed, 0, "on_done ran before the connection left the revoker");
        assert!(c.is_finished());
        drop(c);
        reactor.stop();
    }
}
