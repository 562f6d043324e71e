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
use crate::sync::admission::Gate;
use crate::sync::deadline::Deadline;
use crate::transport::ipc::channel::{Channel, Frame};
use crate::transport::ipc::source::IpcSourceContext;
use crate::transport::reactor::{Reactor, Served};
use crate::transport::tcp::handshake;
use crate::transport::tcp::{self, SourceContext};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
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
        counters: Arc<Counters>,
        reactor: Arc<Reactor>,
    ) -> Arc<Listeners> {
        Arc::new(Listeners {
            tcp,
            ipc,
            incoming: Mutex::new(HashMap::new()),
            next_incoming: AtomicU64::new(1),
            accept_threads: Mutex::new(Vec::new()),
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

/// A served connection: its socket, the thread that serves it (IPC
/// channels) or answered its handshake (control connections), and, once
/// handshaken, the control connection its I/O thread serves.
struct Incoming {
    conn: ConnHandle,
    thread: Option<JoinHandle<()>>,
    served: Option<Arc<dyn Served>>,
    /// Where a TCP connection comes from.
    from: Option<IpAddr>,
    /// Its handshake completed and it took a connection slot.
    handshaken: bool,
    /// Closed in its handshake for a newer one (no longer pending).
    evicted: bool,
}

impl Incoming {
    fn new(conn: ConnHandle, from: Option<IpAddr>, thread: Option<JoinHandle<()>>) -> Incoming {
        Incoming { conn, thread, served: None, from, handshaken: false, evicted: false }
    }

    /// A connection still in its handshake (a TCP connection, or with
    /// `unix` an IPC channel).
    fn pending(&self, unix: bool) -> bool {
        matches!(self.conn, ConnHandle::Unix(_)) == unix && !self.handshaken && !self.evicted
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

/// Makes room for one more pending handshake from `from` (TCP) or of an
/// IPC channel (`unix`): closes the oldest pending one of that address at
/// its bound, then the oldest of all at the overall bound (ids grow with
/// time); each is counted in `handshakes_abandoned` when its thread ends.
fn make_room(inc: &mut HashMap<u64, Incoming>, unix: bool, from: Option<IpAddr>, per_address: usize, max: usize) {
    let oldest = |inc: &HashMap<u64, Incoming>, same: bool| {
        inc.iter().filter(|(_, c)| c.pending(unix) && (!same || c.from == from)).map(|(id, _)| *id).min()
    };
    for (same, bound) in [(true, per_address), (false, max)] {
        while inc.values().filter(|c| c.pending(unix) && (!same || c.from == from)).count() >= bound {
            let Some(id) = oldest(inc, same) else { break };
            let rec = inc.get_mut(&id).expect("present");
            rec.evicted = true;
            rec.shut();
        }
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
        from: Option<IpAddr>,
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
            // the connection its I/O thread serves, or goes; dropping it
            // detaches this thread's handle.
            match (served, inc.get_mut(&id)) {
                (Some(c), Some(rec)) if !c.is_finished() => rec.served = Some(c),
                _ => drop(inc.remove(&id)),
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
            let from = stream.peer_addr().ok().map(|a| a.ip());
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
            make_room(&mut inc, false, from, self.pending_per_address, self.pending_max);
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
                // configured) says what the connection is.
                let opened = handshake::open(&mut stream, key.as_ref(), timeout, &stop, &counters.events.auth_failures)
                    .and_then(|first| match (first, me.upgrade()) {
                        (Some(f), Some(l)) => l.take_slot(id).map(|_| Some(f)),
                        _ => Ok(None),
                    });
                match opened {
                    Ok(Some(first)) if first.header.kind == MsgKind::IpcHello => {
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
                    Ok(Some(first)) => tcp::serve(c, stream, first, &reactor, forget).map(|c| c as Arc<dyn Served>),
                    Ok(None) => None,
                    Err(e) => {
                        if e.status() == Status::ProtocolError {
                            counters.events.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        if matches!(e.status(), Status::ProtocolError | Status::ResourceExhausted) {
                            handshake::send_error(&mut stream, &e);
                        }
                        let _ = stream.shutdown(Shutdown::Both);
                        None
                    }
                }
            });
        }
    }

    /// Accepts IPC channel connections until the engine stops.
    fn ipc_accept_loop(self: Arc<Self>, ctx: Arc<IpcSourceContext>) {
        let Some(listener) = self.ipc.as_ref() else { return };
        while let Some(stream) = self.next_conn(|| listener.accept().map(|(s, _)| s)) {
            let mut inc = self.incoming.lock();
            reap(&mut inc);
            // Channels in their handshake take no slot: they have their
            // own bound (the oldest makes room for the newest); a slot is
            // taken once the channel proved what it is.
            make_room(&mut inc, true, None, self.pending_max, self.pending_max);
            let Ok(handle) = stream.try_clone() else { continue };
            let (c, reactor) = (ctx.clone(), self.reactor.clone());
            let me = Arc::downgrade(&self);
            self.serve_in_thread(
                &mut inc,
                ConnHandle::Unix(handle),
                None,
                "orbite-ipc-handshake",
                move |id, forget| {
                    let ch = Channel::from_stream(stream).ok()?;
                    let admit = move || me.upgrade().map_or(Ok(()), |l| l.take_slot(id));
                    crate::transport::ipc::source::serve(c, ch, id, None, &admit, &reactor, forget)
                },
            );
        }
    }
}
