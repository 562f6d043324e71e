//! The Rust API: [`Engine`], its lifecycle, peers, submissions and closes.

pub mod batch;
pub mod config;
pub mod endpoint;
pub mod stats;

pub use batch::{Batch, SubmitOptions};
pub use config::{EngineConfig, MnnvlConfig, MnnvlHandleType};
pub use stats::EngineStats;

use crate::control::frame::MsgKind;
use crate::control::io::{self, HeaderRead};
use crate::control::message::{self, Describe, RegionInfo};
use crate::control::Identity;
use crate::error::{Error, Result, Status};
use crate::memory::{Access, Region, RegionTable};
use crate::stats::Stats;
use crate::sync_util::{Budget, Gate};
use crate::transfer::{BatchShared, Op, RemoteEffect, Request};
use crate::transport::tcp::{self, Chunk, SourceContext, TcpConnection};
use crate::transport::{Transport, TransportKind};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A connected peer.
struct Peer {
    endpoint: String,
    conn: Arc<TcpConnection>,
}

struct Incoming {
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct Inner {
    config: EngineConfig,
    identity: Identity,
    regions: Arc<RegionTable>,
    stats: Arc<Stats>,
    budget: Arc<Budget>,
    requester_gate: Arc<Gate>,
    source_gate: Arc<Gate>,
    stopping: Arc<AtomicBool>,
    closed: AtomicBool,
    endpoint: SocketAddr,
    listener: TcpListener,
    accept_thread: Mutex<Option<JoinHandle<()>>>,
    incoming: Mutex<HashMap<u64, Incoming>>,
    next_incoming: AtomicU64,
    peers: RwLock<HashMap<u64, Arc<Peer>>>,
    next_peer: AtomicU64,
}

/// A transfer engine: registers memory, serves it to peers and moves bytes
/// to and from theirs. Cheap to share across threads (`&Engine` is enough).
pub struct Engine {
    inner: Arc<Inner>,
}

/// Capability bits this build advertises.
fn capabilities() -> u32 {
    TransportKind::Tcp.capability_bit()
}

impl Engine {
    /// Starts an engine: binds the control socket and starts serving.
    pub fn new(config: EngineConfig) -> Result<Engine> {
        config.validate()?;
        let addr: SocketAddr = config.listen.parse().map_err(|_| {
            Error::InvalidConfig(format!(
                "key `listen`: {:?} is not an IP:port address",
                config.listen
            ))
        })?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::Unavailable(format!("cannot listen on {addr}: {e}")))?;
        let endpoint = listener
            .local_addr()
            .map_err(|e| Error::io("local_addr", &e))?;
        let inner = Arc::new(Inner {
            identity: Identity::fresh(),
            regions: Arc::new(RegionTable::default()),
            stats: Arc::new(Stats::default()),
            budget: Budget::new(config.max_inflight_bytes),
            requester_gate: Gate::new("requester side"),
            source_gate: Gate::new("source side"),
            stopping: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            endpoint,
            listener,
            accept_thread: Mutex::new(None),
            incoming: Mutex::new(HashMap::new()),
            next_incoming: AtomicU64::new(1),
            peers: RwLock::new(HashMap::new()),
            next_peer: AtomicU64::new(1),
            config,
        });
        let i2 = inner.clone();
        let t = std::thread::Builder::new()
            .name("orbite-accept".into())
            .spawn(move || accept_loop(i2))
            .map_err(|e| Error::io("spawn accept thread", &e))?;
        *inner.accept_thread.lock() = Some(t);
        Ok(Engine { inner })
    }

    /// Parses `config_json` (empty = defaults) and starts an engine.
    pub fn from_json(config_json: &str) -> Result<Engine> {
        Engine::new(EngineConfig::from_json(config_json)?)
    }

    /// The config in force.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The endpoint peers pass to [`Engine::connect`] (`IP:port`).
    pub fn endpoint(&self) -> String {
        self.inner.endpoint.to_string()
    }

    /// This engine's identity (boot, process, epoch).
    pub fn identity(&self) -> Identity {
        self.inner.identity
    }

    fn timeout(&self, t: Option<Duration>) -> Duration {
        t.unwrap_or(Duration::from_millis(
            self.inner.config.default_timeout_ms as u64,
        ))
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Unavailable("the engine is closed".into()));
        }
        Ok(())
    }

    /// Registers `[addr, addr+len)` with remote `access`. Returns the region id.
    pub fn register_memory(&self, addr: u64, len: u64, access: Access) -> Result<u64> {
        self.check_open()?;
        Ok(self.inner.regions.register(addr, len, access)?.id)
    }

    /// Unregisters a region, waiting up to `timeout` (None: engine default)
    /// for copies that use it.
    pub fn unregister_memory(&self, region: u64, timeout: Option<Duration>) -> Result<()> {
        self.inner.regions.unregister(region, self.timeout(timeout))
    }

    /// The regions this engine has registered.
    pub fn regions(&self) -> Vec<RegionInfo> {
        self.inner
            .regions
            .snapshot()
            .iter()
            .map(|r| region_info(r))
            .collect()
    }

    /// Connects to the engine at `endpoint` (`IP:port` or `localhost:port`).
    /// Returns the peer id.
    pub fn connect(&self, endpoint: &str, timeout: Option<Duration>) -> Result<u64> {
        self.check_open()?;
        let addr = endpoint::parse(endpoint)?;
        if !self.inner.requester_gate.is_open() {
            return Err(Error::Unavailable("the requester side is closed".into()));
        }
        let timeout = self.timeout(timeout);
        let deadline = Instant::now() + timeout;
        let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Error::TimedOut(
                format!("connecting to {endpoint}: no answer within {timeout:?}"),
            ),
            _ => Error::Unavailable(format!("cannot connect to {endpoint}: {e}")),
        })?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(io::TICK))
            .map_err(|e| Error::io("set_read_timeout", &e))?;
        s.set_write_timeout(Some(io::TICK))
            .map_err(|e| Error::io("set_write_timeout", &e))?;
        let mut tick = || {
            if Instant::now() >= deadline {
                return Err(Error::TimedOut(format!(
                    "{endpoint} did not complete the handshake in time"
                )));
            }
            Ok(())
        };
        io::write_frame(
            &mut s,
            MsgKind::Describe,
            &self.inner.describe().encode(),
            &mut tick,
        )?;
        let h = match io::read_header(&mut s, &mut tick)? {
            HeaderRead::Eof => {
                return Err(Error::Unavailable(format!(
                    "{endpoint} closed the connection during the handshake"
                )))
            }
            HeaderRead::Frame(h) => h,
        };
        let body = io::read_body(&mut s, h.body_len, &mut tick)?;
        let peer = match h.kind {
            MsgKind::Describe => Describe::decode(&body)?,
            MsgKind::Error => {
                let (st, text) = message::decode_error(&body)?;
                return Err(Error::from_status(
                    st,
                    format!("{endpoint} refused the connection: {text}"),
                ));
            }
            other => {
                return Err(Error::Protocol(format!(
                    "{endpoint} answered the handshake with {other:?}"
                )))
            }
        };
        let id = self.inner.next_peer.fetch_add(1, Ordering::Relaxed);
        let label = format!("peer {id} ({endpoint})");
        let conn = TcpConnection::start(s, peer, label, self.inner.stats.clone())?;
        self.inner.peers.write().insert(
            id,
            Arc::new(Peer {
                endpoint: endpoint.to_string(),
                conn,
            }),
        );
        Ok(id)
    }

    fn peer(&self, id: u64) -> Result<Arc<Peer>> {
        self.inner
            .peers
            .read()
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("no peer with id {id}")))
    }

    /// The regions peer `id` publishes (asks the peer for a fresh list).
    pub fn peer_regions(&self, id: u64, timeout: Option<Duration>) -> Result<Vec<RegionInfo>> {
        let p = self.peer(id)?;
        if let Some(e) = p.conn.dead_reason() {
            return Err(e);
        }
        Ok(p.conn
            .refresh_describe(Instant::now() + self.timeout(timeout))?
            .regions)
    }

    /// The endpoint peer `id` was connected with.
    pub fn peer_endpoint(&self, id: u64) -> Result<String> {
        Ok(self.peer(id)?.endpoint.clone())
    }

    /// Disconnects peer `id` after its outstanding requests end (up to `timeout`).
    pub fn disconnect(&self, id: u64, timeout: Option<Duration>) -> Result<()> {
        let p = self.peer(id)?;
        let deadline = Instant::now() + self.timeout(timeout);
        while p.conn.outstanding() > 0 && p.conn.dead_reason().is_none() {
            if Instant::now() >= deadline {
                return Err(Error::TimedOut(format!(
                    "peer {id} still has {} requests in flight",
                    p.conn.outstanding()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.inner.peers.write().remove(&id);
        p.conn.close();
        Ok(())
    }

    /// Submits requests to peer `peer`. Local checks (region, bounds, length)
    /// fail the whole call; remote outcomes are per request in the [`Batch`].
    /// Returns once every request is admitted (within the deadline).
    pub fn submit(&self, peer: u64, requests: &[Request], opts: SubmitOptions) -> Result<Batch> {
        self.check_open()?;
        if requests.is_empty() {
            return Err(Error::InvalidArgument(
                "a submission needs at least one request".into(),
            ));
        }
        let p = self.peer(peer)?;
        if let Some(e) = p.conn.dead_reason() {
            return Err(Error::Unavailable(format!(
                "peer {peer} is gone: {}",
                e.message()
            )));
        }
        let kind = self.select_transport(peer, opts.transport)?;
        let timeout = self.timeout(opts.timeout);
        let deadline = Instant::now() + timeout;
        // Local checks first: nothing is sent unless every request passes.
        let mut leases = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            if r.len == 0 {
                return Err(Error::InvalidArgument(format!("request {i}: length is 0")));
            }
            let lease = self.inner.regions.lease(r.local_addr, r.len).map_err(|e| {
                Error::from_status(e.status(), format!("request {i}: local {}", e.message()))
            })?;
            if !lease.region().kind.cpu_accessible() {
                return Err(Error::NotSupported(format!(
                    "request {i}: local region holds {} memory, which TCP cannot copy",
                    lease.region().kind.name()
                )));
            }
            leases.push(Arc::new(lease));
        }
        let gate = &self.inner.requester_gate;
        if !gate.is_open() {
            return Err(Error::Unavailable("the requester side is closed".into()));
        }
        let batch = BatchShared::new(requests, self.inner.stats.clone(), deadline);
        let mut view = p.conn.describe();
        let mut refreshed = false;
        let max_chunk = self.inner.config.max_transfer_bytes;
        let mut staged: Vec<Chunk> = Vec::new();
        let mut admission_failed: Option<Error> = None;
        for (i, (r, lease)) in requests.iter().zip(leases).enumerate() {
            if let Some(e) = &admission_failed {
                batch.fail_request(i, e.clone(), RemoteEffect::None);
                continue;
            }
            let mut region = find_region(&view, r.remote_addr);
            if region.is_none() && !refreshed {
                refreshed = true;
                if let Ok(d) = p.conn.refresh_describe(deadline) {
                    view = d;
                }
                region = find_region(&view, r.remote_addr);
            }
            let Some(region) = region else {
                let e = Error::NotFound(format!(
                    "request {i}: remote address 0x{:x} is in no region peer {peer} publishes",
                    r.remote_addr
                ));
                batch.fail_request(i, e, RemoteEffect::None);
                continue;
            };
            let n_chunks = r.len.div_ceil(max_chunk);
            batch.plan(i, n_chunks as u32, kind);
            for c in 0..n_chunks {
                let off = c * max_chunk;
                let len = (r.len - off).min(max_chunk);
                let permit = match self.inner.budget.try_acquire(len) {
                    Some(p) => p,
                    None => {
                        p.conn.enqueue(std::mem::take(&mut staged));
                        match self.inner.budget.acquire(len, deadline, "submission") {
                            Ok(p) => p,
                            Err(e) => {
                                let effect = if c > 0 && r.op == Op::Write {
                                    RemoteEffect::Unknown
                                } else {
                                    RemoteEffect::None
                                };
                                batch.fail_request(i, e.clone(), effect);
                                admission_failed = Some(e);
                                break;
                            }
                        }
                    }
                };
                let guard = match gate.enter() {
                    Ok(g) => g,
                    Err(e) => {
                        batch.fail_request(i, e.clone(), RemoteEffect::None);
                        admission_failed = Some(e);
                        break;
                    }
                };
                staged.push(Chunk {
                    batch: batch.clone(),
                    index: i,
                    op: r.op,
                    local_addr: r.local_addr + off,
                    remote_addr: r.remote_addr + off,
                    len,
                    region_epoch: region.epoch,
                    deadline,
                    lease: lease.clone(),
                    permit: Some(permit),
                    guard: Some(guard),
                });
            }
        }
        p.conn.enqueue(staged);
        Ok(Batch::new(batch))
    }

    fn select_transport(&self, peer: u64, t: Transport) -> Result<TransportKind> {
        match t {
            Transport::Only(TransportKind::Tcp) => Ok(TransportKind::Tcp),
            Transport::Only(k) => Err(Error::Unavailable(format!(
                "transport {} is not available to peer {peer} in this build",
                k.name()
            ))),
            Transport::Auto => self
                .inner
                .config
                .transport_policy
                .iter()
                .copied()
                .find(|k| *k == TransportKind::Tcp)
                .ok_or_else(|| {
                    Error::Unavailable(format!(
                        "no transport in transport_policy is available to peer {peer} (this build offers tcp)"
                    ))
                }),
        }
    }

    /// Hands a GPU producer stream over for `region`: transfers of the region
    /// start after the work queued on the stream so far.
    pub fn record_producer_stream(&self, region: u64, cu_stream: u64) -> Result<()> {
        self.check_open()?;
        if !self.inner.regions.snapshot().iter().any(|r| r.id == region) {
            return Err(Error::NotFound(format!(
                "no region with id {region} is registered"
            )));
        }
        crate::cuda_support::record_producer_stream(region, cu_stream)
    }

    /// Closes cached NVLink imports through their receipts while admission
    /// stays open. With no NVLink transport there is nothing cached and this
    /// succeeds at once.
    pub fn flush_nvlink_cache(&self, _timeout: Option<Duration>) -> Result<()> {
        self.check_open()?;
        Ok(())
    }

    /// Stops new submissions, waits for accepted ones (up to `timeout`) and
    /// closes outgoing connections.
    pub fn close_requester(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + self.timeout(timeout);
        let left = self.inner.requester_gate.close_and_wait(deadline);
        if left > 0 {
            return Err(Error::TimedOut(format!(
                "{left} requests are still in flight; the requester side stays fenced, call again"
            )));
        }
        let peers: Vec<_> = self.inner.peers.write().drain().map(|(_, p)| p).collect();
        for p in peers {
            p.conn.close();
        }
        Ok(())
    }

    /// Stops serving new requests and waits (up to `timeout`) for the
    /// requests being served, then closes incoming connections.
    pub fn close_source(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + self.timeout(timeout);
        let left = self.inner.source_gate.close_and_wait(deadline);
        if left > 0 {
            return Err(Error::TimedOut(format!(
                "{left} incoming requests are still being served"
            )));
        }
        self.inner.stop_incoming();
        Ok(())
    }

    /// Closes the requester side, then the source side, then the engine.
    pub fn close(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + self.timeout(timeout);
        let left = || deadline.saturating_duration_since(Instant::now());
        self.close_requester(Some(left()))?;
        self.close_source(Some(left()))?;
        self.inner.shutdown();
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineStats {
        let peers = self.inner.peers.read();
        EngineStats::collect(
            &self.inner.stats,
            self.inner.budget.used(),
            peers.len(),
            peers
                .values()
                .filter(|p| p.conn.dead_reason().is_none())
                .count(),
            self.inner.incoming.lock().len(),
            self.inner.regions.len(),
        )
    }
}

fn find_region(d: &Describe, addr: u64) -> Option<RegionInfo> {
    d.regions
        .iter()
        .copied()
        .find(|r| addr >= r.addr && addr < r.addr + r.len)
}

fn region_info(r: &Region) -> RegionInfo {
    RegionInfo {
        id: r.id,
        epoch: r.epoch,
        addr: r.addr,
        len: r.len,
        access: r.access,
        kind: r.kind,
    }
}

impl Inner {
    fn describe(&self) -> Describe {
        Describe {
            identity: self.identity,
            capabilities: capabilities(),
            fabric_domain: [0; 16],
            endpoint: self.endpoint.to_string(),
            regions: self
                .regions
                .snapshot()
                .iter()
                .map(|r| region_info(r))
                .collect(),
        }
    }

    fn stop_incoming(&self) {
        let all: Vec<Incoming> = self.incoming.lock().drain().map(|(_, v)| v).collect();
        for mut inc in all {
            let _ = inc.stream.shutdown(Shutdown::Both);
            if let Some(t) = inc.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stopping.store(true, Ordering::Release);
        // SAFETY: the listener fd is owned by `self.listener` and still open;
        // shutdown wakes a thread blocked in accept on it.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.accept_thread.lock().take() {
            let _ = t.join();
        }
        let peers: Vec<_> = self.peers.write().drain().map(|(_, p)| p).collect();
        for p in peers {
            p.conn.close();
        }
        self.stop_incoming();
        self.regions.clear();
    }
}

fn accept_loop(inner: Arc<Inner>) {
    let ctx = Arc::new(SourceContext {
        regions: inner.regions.clone(),
        stats: inner.stats.clone(),
        gate: inner.source_gate.clone(),
        stopping: inner.stopping.clone(),
        describe: {
            let weak = Arc::downgrade(&inner);
            Arc::new(move || match weak.upgrade() {
                Some(i) => i.describe(),
                None => Describe {
                    identity: Identity::fresh(),
                    capabilities: 0,
                    fabric_domain: [0; 16],
                    endpoint: String::new(),
                    regions: Vec::new(),
                },
            })
        },
        handshake_timeout: Duration::from_millis(inner.config.handshake_timeout_ms as u64),
    });
    loop {
        let (stream, _) = match inner.listener.accept() {
            Ok(v) => v,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                if inner.stopping.load(Ordering::Acquire) {
                    return;
                }
                // Transient (e.g. EMFILE): back off briefly rather than spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        // Reap finished connections so the limit counts live ones only.
        {
            let mut inc = inner.incoming.lock();
            let done: Vec<u64> = inc
                .iter()
                .filter(|(_, v)| v.thread.as_ref().is_some_and(|t| t.is_finished()))
                .map(|(k, _)| *k)
                .collect();
            for k in done {
                if let Some(mut v) = inc.remove(&k) {
                    if let Some(t) = v.thread.take() {
                        let _ = t.join();
                    }
                }
            }
            if inc.len() >= inner.config.max_incoming_connections as usize
                || !inner.source_gate.is_open()
            {
                drop(inc);
                inner
                    .stats
                    .connections_refused
                    .fetch_add(1, Ordering::Relaxed);
                let mut s = stream;
                let _ = s.set_write_timeout(Some(io::TICK));
                let why = if inner.source_gate.is_open() {
                    (
                        Status::ResourceExhausted,
                        format!(
                            "connection limit of {} reached",
                            inner.config.max_incoming_connections
                        ),
                    )
                } else {
                    (Status::Unavailable, "the source side is closed".to_string())
                };
                let mut tick = || Err(Error::TimedOut("refusal".into()));
                let _ = io::write_frame(
                    &mut s,
                    MsgKind::Error,
                    &message::encode_error(why.0, &why.1),
                    &mut tick,
                );
                let _ = s.shutdown(Shutdown::Both);
                continue;
            }
        }
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let id = inner.next_incoming.fetch_add(1, Ordering::Relaxed);
        let c = ctx.clone();
        let t = std::thread::Builder::new()
            .name("orbite-serve".into())
            .spawn(move || tcp::serve(c, stream));
        match t {
            Ok(t) => {
                inner.incoming.lock().insert(
                    id,
                    Incoming {
                        stream: clone,
                        thread: Some(t),
                    },
                );
            }
            Err(_) => {
                let _ = clone.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}
