//! The two listeners of an engine: the TCP control socket and the IPC
//! channel (abstract Unix socket). Each accepted connection gets a serving
//! thread; finished ones are reaped so limits count live connections. A TCP
//! connection that opens with an `IpcHello` is an MNNVL fabric channel and
//! is served by the IPC source (which accepts it only for its fabric domain).

use crate::control::auth::AuthKey;
use crate::control::frame::MsgKind;
use crate::control::io;
use crate::control::message;
use crate::counters::Counters;
use crate::engine::config::EngineConfig;
use crate::error::{Error, Result, Status};
use crate::log::{Level, Logger};
use crate::sync::admission::Gate;
use crate::sync::deadline::Deadline;
use crate::transport::ipc::channel::{Channel, Frame};
use crate::transport::ipc::source::IpcSourceContext;
use crate::transport::reactor::{Reactor, Served};
use crate::transport::tcp::handshake;
use crate::transport::tcp::{self, SourceContext};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// An engine's listeners, the connections they accepted and their threads.
pub(crate) struct Listeners {
    tcp: TcpListener,
    ipc: Option<UnixListener>,
    incoming: Mutex<HashMap<u64, Incoming>>,
    next_incoming: AtomicU64,
    accept_threads: Mutex<Vec<JoinHandle<()>>>,
    /// Threads of handshakes that ended unfinished and dropped their
    /// record, not joined yet (an IPC channel's: `true`): still threads
    /// until they have returned.
    ending: Mutex<Vec<(bool, JoinHandle<()>)>>,
    /// Most incoming control connections (and fabric channels) served at once.
    limit: usize,
    /// Most incoming IPC channels (Unix) served at once.
    ipc_limit: usize,
    /// Incoming TCP connections in their handshake at once, in all and
    /// per source address.
    pending_max: usize,
    pending_per_address: usize,
    /// The shared key every incoming TCP connection must prove, if any.
    auth: Option<AuthKey>,
    /// Bound of an incoming connection's first frame and authentication.
    handshake_timeout: Duration,
    /// Set when the engine stops.
    stopping: Arc<AtomicBool>,
    /// Closed by `close_source`: new control connections are refused.
    source_gate: Arc<Gate>,
    counters: Arc<Counters>,
    /// The I/O threads that serve handshaken control connections.
    reactor: Arc<Reactor>,
    /// The engine's logger: each handshaken connection is logged at
    /// `info` when it starts and when it ends.
    log: Arc<Logger>,
}

impl Listeners {
    /// Listeners over bound sockets, the control socket and the IPC
    /// channel's (nothing accepted until [`Listeners::start`]).
    pub(crate) fn new(
        (tcp, ipc): (TcpListener, Option<UnixListener>),
        config: &EngineConfig,
        auth: Option<AuthKey>,
        stopping: Arc<AtomicBool>,
        source_gate: Arc<Gate>,
        (counters, log): (Arc<Counters>, Arc<Logger>),
        reactor: Arc<Reactor>,
    ) -> Arc<Listeners> {
        Arc::new(Listeners {
            tcp,
            ipc,
            incoming: Mutex::new(HashMap::new()),
            next_incoming: AtomicU64::new(1),
            accept_threads: Mutex::new(Vec::new()),
            ending: Mutex::new(Vec::new()),
            limit: config.max_incoming_connections as usize,
            ipc_limit: config.max_ipc_channels as usize,
            pending_max: config.max_pending_handshakes as usize,
            pending_per_address: config.max_pending_handshakes_per_address as usize,
            auth,
            handshake_timeout: Duration::from_millis(config.handshake_timeout_ms as u64),
            stopping,
            source_gate,
            counters,
            reactor,
            log,
        })
    }

    /// Starts the accept threads: control connections (and fabric channels)
    /// are served with `tcp`, IPC channels with `ipc`.
    pub(crate) fn start(self: &Arc<Self>, tcp: Arc<SourceContext>, ipc: Arc<IpcSourceContext>) -> Result<()> {
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io("spawn accept thread", &e))
        };
        let me = self.clone();
        let fabric = ipc.clone();
        let t1 = spawn("orbite-accept", Box::new(move || me.tcp_accept_loop(tcp, fabric)))?;
        self.accept_threads.lock().push(t1);
        if self.ipc.is_some() {
            let me = self.clone();
            let t2 = spawn("orbite-ipc-accept", Box::new(move || me.ipc_accept_loop(ipc)))?;
            self.accept_threads.lock().push(t2);
        }
        Ok(())
    }

    /// Incoming connections being served now.
    pub(crate) fn live(&self) -> usize {
        self.incoming.lock().values().filter(|c| c.is_live()).count()
    }

    /// Shuts every incoming connection down and waits for its thread.
    pub(crate) fn stop_incoming(&self) {
        let all: Vec<Incoming> = self.incoming.lock().drain().map(|(_, v)| v).collect();
        for mut inc in all {
            inc.stop();
        }
        let ending: Vec<_> = self.ending.lock().drain(..).collect();
        for (_, t) in ending {
            let _ = t.join();
        }
    }

    /// Wakes the accept threads (the engine's `stopping` is set) and waits
    /// for them to end.
    pub(crate) fn stop_accepting(&self) {
        // SAFETY: the listener fds are owned by `self` and still open;
        // shutdown wakes the threads blocked in accept on them.
        unsafe { libc::shutdown(self.tcp.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(l) = &self.ipc {
            // SAFETY: as above.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        let threads: Vec<_> = self.accept_threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The socket of a served connection, kept to shut it down.
enum ConnHandle {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Where a connection in its handshake comes from, as the kernel says:
/// the pending handshakes are shared fairly among origins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Origin {
    /// A TCP connection's source address (an IPv6 one's /64, which one
    /// host commonly holds whole).
    Addr(IpAddr),
    /// An IPC channel's peer process (`SO_PEERCRED`).
    Process(u32),
}

impl Origin {
    /// The origin of a TCP connection from `ip`.
    fn of(ip: IpAddr) -> Origin {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Origin::Addr(IpAddr::V4(v4)),
                None => Origin::Addr(IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into())),
            },
            v4 => Origin::Addr(v4),
        }
    }
}

/// A served connection: its socket, the thread that serves it (IPC
/// channels) or answered its handshake (control connections), and, once
/// handshaken, the control connection its I/O thread serves.
struct Incoming {
    conn: ConnHandle,
    thread: Option<JoinHandle<()>>,
    served: Option<Arc<dyn Served>>,
    /// Where it comes from.
    from: Option<Origin>,
    /// A TCP connection's peer address and port.
    addr: Option<SocketAddr>,
    /// Its handshake completed and it took a connection slot.
    handshaken: bool,
    /// Closed in its handshake for a newer one (no longer pending).
    evicted: bool,
    /// Where its end is logged: set once it was logged accepted.
    logged: Option<Arc<Logger>>,
}

impl Incoming {
    fn new(conn: ConnHandle, from: Option<Origin>, thread: Option<JoinHandle<()>>) -> Incoming {
        let addr = match &conn {
            ConnHandle::Tcp(s) => s.peer_addr().ok(),
            ConnHandle::Unix(_) => None,
        };
        Incoming { conn, thread, served: None, from, addr, handshaken: false, evicted: false, logged: None }
    }

    /// What it is and whom it comes from, for the log: "TCP connection
    /// from 10.0.0.7:41234", "IPC channel from process 4242".
    fn describe(&self) -> String {
        match (&self.conn, self.addr, self.from) {
            (ConnHandle::Tcp(_), Some(a), _) => format!("TCP connection from {a}"),
            (ConnHandle::Tcp(_), None, _) => "TCP connection from an unknown address".into(),
            (ConnHandle::Unix(_), _, Some(Origin::Process(pid))) => format!("IPC channel from process {pid}"),
            (ConnHandle::Unix(_), _, _) => "IPC channel".into(),
        }
    }

    /// An IPC channel (else a TCP connection).
    fn is_unix(&self) -> bool {
        matches!(self.conn, ConnHandle::Unix(_))
    }

    /// A connection still in its handshake (a TCP connection, or with
    /// `unix` an IPC channel).
    fn pending(&self, unix: bool) -> bool {
        self.is_unix() == unix && !self.handshaken && !self.evicted
    }

    /// Closes its socket: the handshake thread's next read or write fails
    /// and the record goes with it.
    fn shut(&self) {
        match &self.conn {
            ConnHandle::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            ConnHandle::Unix(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Incoming {
    /// A connection logged accepted is logged ended when its record goes,
    /// whichever way (its I/O thread's end, a refusal, the engine's stop).
    fn drop(&mut self) {
        if let Some(log) = self.logged.take() {
            log.info(format_args!("incoming {} ended", self.describe()));
        }
    }
}

impl Incoming {
    /// Whether it is still being served.
    fn is_live(&self) -> bool {
        match &self.served {
            Some(c) => !c.is_finished(),
            None => self.thread.as_ref().is_some_and(|t| !t.is_finished()),
        }
    }

    fn stop(&mut self) {
        self.shut();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(c) = self.served.take() {
            c.stop(Duration::from_secs(10));
        }
    }
}

/// Handshaken connections that hold a slot: IPC channels (`unix`) or
/// TCP connections.
fn handshaken_count(inc: &HashMap<u64, Incoming>, unix: bool) -> usize {
    inc.values().filter(|c| c.handshaken && matches!(c.conn, ConnHandle::Unix(_)) == unix).count()
}

/// Makes room for one more pending handshake from `from`, a TCP
/// connection or (`unix`) an IPC channel: at the origin's own bound its
/// oldest pending one is closed; at the overall bound, the oldest pending
/// one of the origin that holds the most (of those, the one waiting
/// longest; ids grow with time). So however many origins churn, an origin
/// with fewer pending handshakes than the others loses none of them to
/// their churn, and when every origin holds one, a handshake is closed
/// only once all older ones were. Each closed one is counted in
/// `handshakes_abandoned` when its thread ends.
fn make_room(inc: &mut HashMap<u64, Incoming>, unix: bool, from: Option<Origin>, per_origin: usize, max: usize) {
    let evict = |inc: &mut HashMap<u64, Incoming>, id: u64| {
        let rec = inc.get_mut(&id).expect("present");
        rec.evicted = true;
        rec.shut();
    };
    loop {
        let mine = inc.iter().filter(|(_, c)| c.pending(unix) && c.from == from).map(|(id, _)| *id);
        let (count, oldest) = mine.fold((0, u64::MAX), |(n, o), id| (n + 1, o.min(id)));
        if count < per_origin {
            break;
        }
        evict(inc, oldest);
    }
    loop {
        // Per origin: how many are pending, and the oldest of them.
        let mut by: HashMap<Option<Origin>, (usize, u64)> = HashMap::new();
        for (id, c) in inc.iter().filter(|(_, c)| c.pending(unix)) {
            let e = by.entry(c.from).or_insert((0, u64::MAX));
            *e = (e.0 + 1, e.1.min(*id));
        }
        if by.values().map(|(n, _)| n).sum::<usize>() < max {
            break;
        }
        let Some(&(_, oldest)) = by.values().max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1))) else { break };
        evict(inc, oldest);
    }
}

fn reap(inc: &mut HashMap<u64, Incoming>) {
    let done: Vec<u64> = inc.iter().filter(|(_, v)| !v.is_live()).map(|(k, _)| *k).collect();
    for k in done {
        if let Some(mut v) = inc.remove(&k) {
            if let Some(t) = v.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Listeners {
    /// Makes room for one more pending handshake (`make_room`), then, while
    /// the handshake threads of that kind that have not ended unfinished
    /// — pending, closed for a newer one, or ended and not joined — are
    /// `max_pending_handshakes` or more, joins the one that ended first
    /// (or the oldest closed one): a churn runs at most
    /// `max_pending_handshakes` handshake threads of a kind, and the
    /// accept loop goes no faster than they end. Returns the table's lock.
    fn admit_pending<'a>(
        &'a self,
        mut inc: MutexGuard<'a, HashMap<u64, Incoming>>,
        unix: bool,
        from: Option<Origin>,
    ) -> MutexGuard<'a, HashMap<u64, Incoming>> {
        make_room(&mut inc, unix, from, self.pending_per_address, self.pending_max);
        loop {
            let running = |c: &&Incoming| c.is_unix() == unix && !c.handshaken && c.is_live();
            let (mut threads, oldest_closed) =
                inc.iter().filter(|(_, c)| running(c)).fold((0, None), |(n, o): (usize, Option<u64>), (id, c)| {
                    (n + 1, if c.evicted { Some(o.map_or(*id, |o| o.min(*id))) } else { o })
                });
            let mut ending = self.ending.lock();
            // Those that have returned are joined first (at once: they
            // are gone but for their exit).
            let (done, left): (Vec<_>, Vec<_>) = ending.drain(..).partition(|(_, t)| t.is_finished());
            *ending = left;
            if !done.is_empty() {
                drop((ending, inc));
                done.into_iter().for_each(|(_, t)| drop(t.join()));
                inc = self.incoming.lock();
                continue;
            }
            threads += ending.iter().filter(|(u, _)| *u == unix).count();
            if threads < self.pending_max {
                return inc;
            }
            let thread = match ending.iter().position(|(u, _)| *u == unix) {
                Some(i) => Some(ending.remove(i).1),
                // Its socket is shut: it ends as soon as it runs.
                None => oldest_closed.and_then(|id| inc.get_mut(&id).and_then(|c| c.thread.take())),
            };
            drop(ending);
            let Some(thread) = thread else { return inc };
            drop(inc);
            let _ = thread.join();
            inc = self.incoming.lock();
        }
    }

    /// Connection `id` completed its handshake: it takes a connection slot,
    /// or is refused `RESOURCE_EXHAUSTED` when all are taken (or it was
    /// closed for a newer one meanwhile).
    fn take_slot(&self, id: u64) -> Result<()> {
        let mut inc = self.incoming.lock();
        let unix = inc.get(&id).is_some_and(|r| matches!(r.conn, ConnHandle::Unix(_)));
        let (limit, what) = match unix {
            true => (self.ipc_limit, "IPC channel limit (max_ipc_channels)"),
            false => (self.limit, "connection limit (max_incoming_connections)"),
        };
        let taken = handshaken_count(&inc, unix);
        match inc.get_mut(&id) {
            Some(rec) if !rec.evicted && taken < limit => {
                rec.handshaken = true;
                if self.log.enabled(Level::Info) {
                    let how = if self.auth.is_some() { ", authenticated" } else { "" };
                    self.log.info(format_args!("incoming {} accepted{how}", rec.describe()));
                    rec.logged = Some(self.log.clone());
                }
                Ok(())
            }
            Some(rec) if !rec.evicted => {
                drop(inc);
                self.counters.events.connections_refused.fetch_add(1, Ordering::Relaxed);
                Err(Error::ResourceExhausted(format!("{what} of {limit} reached")))
            }
            _ => Err(Error::Unavailable("closed in its handshake for a newer connection".into())),
        }
    }

    /// Waits for the next connection; `None` once the engine stops.
    /// Transient failures (e.g. EMFILE) back off briefly instead of spinning.
    fn next_conn<S>(&self, accept: impl Fn() -> std::io::Result<S>) -> Option<S> {
        loop {
            match accept() {
                Ok(s) => return (!self.stopping.load(Ordering::Acquire)).then_some(s),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) if self.stopping.load(Ordering::Acquire) => return None,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Serves an admitted connection on a thread of its own and records
    /// it. `serve` gets the record's id and what removes the record; it
    /// returns the control connection it handed to the I/O threads, if it
    /// did (the record then stays until that connection ends). Otherwise
    /// the record goes when the thread is done, so that the last handle of
    /// the socket closes at once (a peer still writing is reset, not left
    /// blocked until the next accept reaps the record).
    fn serve_in_thread(
        self: &Arc<Self>,
        inc: &mut HashMap<u64, Incoming>,
        conn: ConnHandle,
        from: Option<Origin>,
        name: &str,
        serve: impl FnOnce(u64, Box<dyn FnOnce() + Send>) -> Option<Arc<dyn Served>> + Send + 'static,
    ) {
        let id = self.next_incoming.fetch_add(1, Ordering::Relaxed);
        let me = Arc::downgrade(self);
        let forget = {
            let me = me.clone();
            move || {
                if let Some(l) = me.upgrade() {
                    drop(l.incoming.lock().remove(&id));
                }
            }
        };
        let run = move || {
            let served = serve(id, Box::new(forget));
            let Some(l) = me.upgrade() else { return };
            let mut inc = l.incoming.lock();
            if inc.get(&id).is_some_and(|r| !r.handshaken) {
                l.counters.events.handshakes_abandoned.fetch_add(1, Ordering::Relaxed);
            }
            // The record (inserted under the lock the spawner holds) keeps
            // the connection its I/O thread serves, or goes (its socket
            // closes at once); an unfinished handshake's thread is joined
            // by the accept loop, which counts it until then.
            match (served, inc.get_mut(&id)) {
                (Some(c), Some(rec)) if !c.is_finished() => rec.served = Some(c),
                _ => {
                    if let Some(mut rec) = inc.remove(&id) {
                        if let Some(t) = rec.thread.take().filter(|_| !rec.handshaken) {
                            l.ending.lock().push((rec.is_unix(), t));
                        }
                    }
                }
            }
        };
        match std::thread::Builder::new().name(name.into()).spawn(run) {
            Ok(t) => {
                inc.insert(id, Incoming::new(conn, from, Some(t)));
            }
            Err(_) => Incoming::new(conn, from, None).stop(),
        }
    }

    /// Accepts TCP control connections (and fabric channels) until the engine stops.
    fn tcp_accept_loop(self: Arc<Self>, ctx: Arc<SourceContext>, ipc: Arc<IpcSourceContext>) {
        while let Some(stream) = self.next_conn(|| self.tcp.accept().map(|(s, _)| s)) {
            let mut inc = self.incoming.lock();
            reap(&mut inc);
            let limit = self.limit;
            let from = stream.peer_addr().ok().map(|a| Origin::of(a.ip()));
            if handshaken_count(&inc, false) >= limit || !self.source_gate.is_open() {
                drop(inc);
                self.counters.events.connections_refused.fetch_add(1, Ordering::Relaxed);
                let why = if self.source_gate.is_open() {
                    (Status::ResourceExhausted, format!("connection limit of {limit} reached"))
                } else {
                    (Status::Unavailable, "the source side is closed".to_string())
                };
                let mut s = stream;
                let _ = s.set_write_timeout(Some(io::TICK));
                let mut tick = || Err(Error::TimedOut("refusal".into()));
                let _ = io::write_frame(&mut s, MsgKind::Error, &message::encode_error(why.0, &why.1), &mut tick);
                let _ = s.shutdown(Shutdown::Both);
                continue;
            }
            // Connections in their handshake take no slot: they have their
            // own bounds, and the oldest makes room for the newest.
            let mut inc = self.admit_pending(inc, false, from);
            let Ok(handle) = stream.try_clone() else { continue };
            let (c, fabric, reactor) = (ctx.clone(), ipc.clone(), self.reactor.clone());
            let me = Arc::downgrade(&self);
            let (key, timeout, stopping, counters) =
                (self.auth.clone(), self.handshake_timeout, self.stopping.clone(), self.counters.clone());
            self.serve_in_thread(&mut inc, ConnHandle::Tcp(handle), from, "orbite-handshake", move |id, forget| {
                let mut stream = stream;
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(io::TICK));
                let _ = stream.set_write_timeout(Some(io::TICK));
                let stop = || match stopping.load(Ordering::Acquire) {
                    true => Err(Error::Unavailable("engine is shutting down".into())),
                    false => Ok(()),
                };
                // The first frame (after the authentication, when a key is
                // configured) says what the connection is; `open` told the
                // peer why it failed, if it did.
                let opened = handshake::open(&mut stream, key.as_ref(), timeout, &stop, &counters.events.auth_failures);
                let mut first = match opened {
                    Ok(Some(first)) => first,
                    Ok(None) => return None,
                    Err(e) => {
                        if e.status() == Status::ProtocolError {
                            counters.events.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = stream.shutdown(Shutdown::Both);
                        return None;
                    }
                };
                // Handshaken: it takes a slot, or is told (sealed, when the
                // connection is) why not.
                if let Err(e) = me.upgrade()?.take_slot(id) {
                    first.refuse(&mut stream, &e);
                    let _ = stream.shutdown(Shutdown::Both);
                    return None;
                }
                match first.header.kind {
                    MsgKind::IpcHello => {
                        let mut tick = Deadline::after(timeout, &stop)
                            .ticker(|| Error::Protocol("IpcHello not completed in time".into()));
                        let body = match first.body {
                            Some(b) => b,
                            None => io::read_body(&mut stream, first.header.body_len, &mut tick).ok()?,
                        };
                        let mut ch = Channel::from_tcp(stream).ok()?;
                        if let Some(seal) = first.seal {
                            ch.seal(seal).ok()?;
                        }
                        let hello = Frame { kind: first.header.kind, body, fd: None, second_fd: None };
                        // Its TCP connection took its slot already.
                        crate::transport::ipc::source::serve(fabric, ch, id, Some(hello), &|| Ok(()), &reactor, forget)
                    }
                    _ => tcp::serve(c, stream, first, &reactor, forget).map(|c| c as Arc<dyn Served>),
                }
            });
        }
    }

    /// Accepts IPC channel connections until the engine stops.
    fn ipc_accept_loop(self: Arc<Self>, ctx: Arc<IpcSourceContext>) {
        let Some(listener) = self.ipc.as_ref() else { return };
        while let Some(stream) = self.next_conn(|| listener.accept().map(|(s, _)| s)) {
            let Ok(handle) = stream.try_clone() else { continue };
            let Ok(mut ch) = Channel::from_stream(stream) else { continue };
            // A process of a user who may not open a channel is refused
            // here, before it waits for a handshake or makes room: it
            // costs no thread and closes no one else's handshake.
            let Some(pid) = crate::transport::ipc::source::admit_unix(&ctx, &mut ch) else { continue };
            let mut inc = self.incoming.lock();
            reap(&mut inc);
            // Channels in their handshake take no slot: they have their
            // own bounds (shared fairly among peer processes); a slot is
            // taken once the channel proved what it is.
            let from = Some(Origin::Process(pid));
            let mut inc = self.admit_pending(inc, true, from);
            let (c, reactor) = (ctx.clone(), self.reactor.clone());
            let me = Arc::downgrade(&self);
            self.serve_in_thread(
                &mut inc,
                ConnHandle::Unix(handle),
                from,
                "orbite-ipc-handshake",
                move |id, forget| {
                    let admit = move || me.upgrade().map_or(Ok(()), |l| l.take_slot(id));
                    crate::transport::ipc::source::serve(c, ch, id, None, &admit, &reactor, forget)
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(from: Origin) -> Incoming {
        let (a, _b) = UnixStream::pair().unwrap();
        Incoming::new(ConnHandle::Unix(a), Some(from), None)
    }

    fn addr(s: &str) -> Origin {
        Origin::of(s.parse().unwrap())
    }

    /// Listeners on a fresh loopback port, no IPC listener, at most
    /// `max_pending` handshake threads of a kind.
    fn listeners(max_pending: u32) -> Arc<Listeners> {
        let config = EngineConfig { max_pending_handshakes: max_pending, ..EngineConfig::default() };
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let log = Arc::new(Logger::new(Level::Off, "accept test"));
        let reactor = Arc::new(Reactor::new(1, Duration::from_millis(1)));
        let parts = (Arc::new(Counters::default()), log);
        Listeners::new((tcp, None), &config, None, Arc::default(), Gate::new("source side"), parts, reactor)
    }

    /// A handshake thread of an IPC channel (`unix`) or a TCP connection
    /// that dropped its record and has not returned: it is put in
    /// `ending`, and returns only once it is no longer there (taken to be
    /// joined, or drained by the test).
    fn still_ending(l: &Arc<Listeners>, unix: bool) {
        let (listed, on_list) = std::sync::mpsc::channel::<()>();
        let me = l.clone();
        let t = std::thread::spawn(move || {
            on_list.recv().unwrap();
            let id = std::thread::current().id();
            while me.ending.lock().iter().any(|(_, t)| t.thread().id() == id) {
                std::thread::yield_now();
            }
        });
        l.ending.lock().push((unix, t));
        listed.send(()).unwrap();
    }

    /// Handshake threads closed and not yet joined count toward
    /// `max_pending_handshakes` of their kind: with a bound of 2 and two
    /// IPC handshake threads still ending, admitting one more IPC channel
    /// first joins one of them (each ending thread here returns only once
    /// taken), leaving one: with the new one, two threads, the bound. A
    /// TCP handshake thread still ending counts toward TCP's bound only
    /// and is left. Guards `admit_pending`'s
    /// `threads += ending.iter().filter(|(u, _)| *u == unix).count()`
    /// (without it a churn of closed handshakes runs threads unbounded).
    #[test]
    fn closed_handshake_threads_not_yet_joined_count_toward_the_bound() {
        let l = listeners(2);
        still_ending(&l, false);
        still_ending(&l, true);
        still_ending(&l, true);
        let inc = l.admit_pending(l.incoming.lock(), true, Some(Origin::Process(1)));
        drop(inc);
        let kinds: Vec<bool> = l.ending.lock().iter().map(|(u, _)| *u).collect();
        // The rest return once drained.
        let left: Vec<_> = l.ending.lock().drain(..).collect();
        left.into_iter().for_each(|(_, t)| t.join().unwrap());
        assert_eq!(kinds, vec![false, true], "the handshake threads of each kind still ending");
    }

    /// An IPv6 /64 is one origin, an IPv4-mapped address its IPv4 one.
    #[test]
    fn origins_group_an_ipv6_64_and_unmap_ipv4() {
        assert_eq!(addr("2001:db8:1:2::5"), addr("2001:db8:1:2:ffff::9"));
        assert_ne!(addr("2001:db8:1:2::5"), addr("2001:db8:1:3::5"));
        assert_eq!(addr("::ffff:10.0.0.7"), addr("10.0.0.7"));
        assert_ne!(addr("10.0.0.7"), addr("10.0.0.8"));
    }

    /// At the overall bound the oldest pending handshake of the origin
    /// holding the most is closed: never the lone, oldest one of an
    /// origin that holds fewer, however many times the others churn; at
    /// an origin's own bound its own oldest goes.
    #[test]
    fn the_origin_holding_the_most_makes_room() {
        let (honest, x, y) = (addr("127.0.0.1"), addr("127.0.1.1"), addr("127.0.1.2"));
        let mut inc = HashMap::new();
        inc.insert(1, pending(honest));
        for id in 2..9 {
            inc.insert(id, pending(if id % 2 == 0 { x } else { y }));
        }
        for id in 9..100 {
            let from = if id % 2 == 0 { x } else { y };
            make_room(&mut inc, true, Some(from), 16, 8);
            inc.insert(id, pending(from));
            let live: Vec<u64> = inc.iter().filter(|(_, c)| c.pending(true)).map(|(id, _)| *id).collect();
            assert_eq!(live.len(), 8, "{live:?}");
            assert!(live.contains(&1), "the honest handshake was closed for {id}");
        }
        // At its own bound an origin loses its own oldest, not another's.
        make_room(&mut inc, true, Some(x), 4, 64);
        let of = |o: Origin| inc.values().filter(|c| c.pending(true) && c.from == Some(o)).count();
        assert_eq!((of(honest), of(x), of(y)), (1, 3, 4));
    }
}
