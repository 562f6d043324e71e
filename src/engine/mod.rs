//! The Rust API: [`Engine`], its lifecycle, peers and closes. Submissions
//! and transport selection live in `submit.rs`, the listeners in `accept.rs`.

mod accept;
pub mod batch;
pub mod config;
pub mod endpoint;
mod ipc;
pub mod stats;
mod submit;

pub use batch::{Batch, SubmitOptions};
pub use config::{EngineConfig, MnnvlConfig, MnnvlHandleType};
pub use stats::EngineStats;

use crate::control::frame::MsgKind;
use crate::control::io::{self, HeaderRead};
use crate::control::message::{self, Describe, RegionInfo};
use crate::control::Identity;
use crate::error::{Error, Result};
use crate::memory::{Access, Region, RegionTable};
use crate::stats::Stats;
use crate::sync_util::{Budget, Gate};
use crate::transport::ipc::faults::Faults;
use crate::transport::ipc::link::{IpcLink, Route};
use crate::transport::ipc::source::IpcSourceContext;
use crate::transport::tcp::{SourceContext, TcpConnection};
use crate::transport::TransportKind;
use accept::Incoming;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A connected peer.
pub(crate) struct Peer {
    endpoint: String,
    conn: Arc<TcpConnection>,
    /// One IPC link per IPC transport, or why it cannot be used with this peer.
    links: Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)>,
}

pub(crate) struct Inner {
    config: EngineConfig,
    identity: Identity,
    regions: Arc<RegionTable>,
    stats: Arc<Stats>,
    budget: Arc<Budget>,
    mapping_budget: Arc<Budget>,
    requester_gate: Arc<Gate>,
    source_gate: Arc<Gate>,
    stopping: Arc<AtomicBool>,
    closed: AtomicBool,
    endpoint: SocketAddr,
    listener: TcpListener,
    ipc_listener: Option<UnixListener>,
    ipc_name: std::result::Result<String, String>,
    accept_threads: Mutex<Vec<JoinHandle<()>>>,
    incoming: Mutex<HashMap<u64, Incoming>>,
    next_incoming: AtomicU64,
    peers: RwLock<HashMap<u64, Arc<Peer>>>,
    next_peer: AtomicU64,
    faults: Arc<Faults>,
    ipc: Vec<ipc::IpcTransport>,
    ipc_unavailable: Vec<(TransportKind, String)>,
}

/// Every live engine of the process, for process-wide reports.
static ENGINES: Mutex<Vec<std::sync::Weak<Inner>>> = Mutex::new(Vec::new());

/// What every live engine of this process retains after unconfirmed
/// cleanups (exports without a close receipt, imports whose close was not
/// confirmed, quarantined CUDA streams), by engine endpoint.
pub fn retained_resources_all() -> serde_json::Value {
    let engines: Vec<Arc<Inner>> = {
        let mut v = ENGINES.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(|w| w.upgrade()).collect()
    };
    let mut out = serde_json::Map::new();
    for i in engines {
        if i.closed.load(Ordering::Acquire) {
            continue;
        }
        out.insert(i.endpoint.to_string(), i.retained_detail());
    }
    serde_json::Value::Object(out)
}

/// A transfer engine: registers memory, serves it to peers and moves bytes
/// to and from theirs. Share it across threads by reference.
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Starts an engine: binds the control socket (and the IPC channel) and
    /// starts serving.
    pub fn new(config: EngineConfig) -> Result<Engine> {
        config.validate()?;
        let addr: SocketAddr = config.listen.parse().map_err(|_| {
            Error::InvalidConfig(format!("key `listen`: {:?} is not an IP:port address", config.listen))
        })?;
        let listener =
            TcpListener::bind(addr).map_err(|e| Error::Unavailable(format!("cannot listen on {addr}: {e}")))?;
        let endpoint = listener.local_addr().map_err(|e| Error::io("local_addr", &e))?;
        let identity = Identity::fresh();
        let name = format!("orbite-{}-{:016x}", identity.process.pid, identity.engine_epoch);
        let (ipc_listener, ipc_name) = match crate::transport::ipc::channel::listen(&name) {
            Ok(l) => (Some(l), Ok(name)),
            Err(e) => (None, Err(e.to_string())),
        };
        let regions = Arc::new(RegionTable::default());
        let stats = Arc::new(Stats::default());
        let mapping_budget = Budget::new(config.max_inflight_bytes);
        let source_gate = Gate::new("source side");
        let faults = Arc::new(Faults::default());
        let parts = ipc::IpcParts {
            config: &config,
            regions: &regions,
            stats: &stats,
            mapping_budget: &mapping_budget,
            source_gate: &source_gate,
            faults: &faults,
        };
        let mut ipc_transports = Vec::new();
        let mut ipc_unavailable = Vec::new();
        match &ipc_name {
            Ok(_) => ipc_transports.push(parts.shm()),
            Err(e) => ipc_unavailable.push((TransportKind::Shm, format!("no IPC channel: {e}"))),
        }
        match parts.nvlink() {
            Ok(t) if ipc_name.is_ok() => ipc_transports.push(t),
            Ok(_) => ipc_unavailable.push((TransportKind::Nvlink, "no IPC channel".into())),
            Err(e) => ipc_unavailable.push((TransportKind::Nvlink, e)),
        }
        match parts.mnnvl() {
            Ok(t) if ipc_name.is_ok() => ipc_transports.push(t),
            Ok(_) => ipc_unavailable.push((TransportKind::Mnnvl, "no IPC channel".into())),
            Err(e) => ipc_unavailable.push((TransportKind::Mnnvl, e)),
        }
        let inner = Arc::new(Inner {
            identity,
            regions,
            stats,
            budget: Budget::new(config.max_inflight_bytes),
            mapping_budget,
            requester_gate: Gate::new("requester side"),
            source_gate,
            stopping: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            endpoint,
            listener,
            ipc_listener,
            ipc_name,
            accept_threads: Mutex::new(Vec::new()),
            incoming: Mutex::new(HashMap::new()),
            next_incoming: AtomicU64::new(1),
            peers: RwLock::new(HashMap::new()),
            next_peer: AtomicU64::new(1),
            faults,
            ipc: ipc_transports,
            ipc_unavailable,
            config,
        });
        let tcp_ctx = Arc::new(SourceContext {
            regions: inner.regions.clone(),
            stats: inner.stats.clone(),
            gate: inner.source_gate.clone(),
            stopping: inner.stopping.clone(),
            describe: {
                let weak = Arc::downgrade(&inner);
                Arc::new(move || weak.upgrade().map(|i| i.describe()).unwrap_or_else(empty_describe))
            },
            handshake_timeout: Duration::from_millis(inner.config.handshake_timeout_ms as u64),
        });
        let ipc_ctx = Arc::new(IpcSourceContext {
            tables: inner.ipc.iter().map(|t| (t.kind, t.exports.clone())).collect(),
            identity: inner.identity,
            fabric_domain: ipc::fabric_channel_domain(&inner.config),
            stats: inner.stats.clone(),
            stopping: inner.stopping.clone(),
            handshake_timeout: Duration::from_millis(inner.config.handshake_timeout_ms as u64),
        });
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io("spawn accept thread", &e))
        };
        let i1 = inner.clone();
        let fabric_ctx = ipc_ctx.clone();
        let t1 = spawn("orbite-accept", Box::new(move || accept::tcp_accept_loop(i1, tcp_ctx, fabric_ctx)))?;
        inner.accept_threads.lock().push(t1);
        if inner.ipc_listener.is_some() {
            let i2 = inner.clone();
            let t2 = spawn("orbite-ipc-accept", Box::new(move || accept::ipc_accept_loop(i2, ipc_ctx)))?;
            inner.accept_threads.lock().push(t2);
        }
        {
            let mut all = ENGINES.lock();
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&inner));
        }
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

    /// Fault-injection switches for the IPC transports (tests and
    /// qualification). Inert unless a counter is set.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    fn timeout(&self, t: Option<Duration>) -> Duration {
        t.unwrap_or(Duration::from_millis(self.inner.config.default_timeout_ms as u64))
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
    /// for copies and exports that use it.
    pub fn unregister_memory(&self, region: u64, timeout: Option<Duration>) -> Result<()> {
        self.inner.regions.unregister(region, self.timeout(timeout))
    }

    /// The regions this engine has registered.
    pub fn regions(&self) -> Vec<RegionInfo> {
        self.inner.regions.snapshot().iter().map(|r| region_info(r)).collect()
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
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                Error::TimedOut(format!("connecting to {endpoint}: no answer within {timeout:?}"))
            }
            _ => Error::Unavailable(format!("cannot connect to {endpoint}: {e}")),
        })?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(io::TICK)).map_err(|e| Error::io("set_read_timeout", &e))?;
        s.set_write_timeout(Some(io::TICK)).map_err(|e| Error::io("set_write_timeout", &e))?;
        let mut tick = || {
            if Instant::now() >= deadline {
                return Err(Error::TimedOut(format!("{endpoint} did not complete the handshake in time")));
            }
            Ok(())
        };
        io::write_frame(&mut s, MsgKind::Describe, &self.inner.describe().encode(), &mut tick)?;
        let h = match io::read_header(&mut s, &mut tick)? {
            HeaderRead::Eof => {
                return Err(Error::Unavailable(format!("{endpoint} closed the connection during the handshake")))
            }
            HeaderRead::Frame(h) => h,
        };
        let body = io::read_body(&mut s, h.body_len, &mut tick)?;
        let peer = match h.kind {
            MsgKind::Describe => Describe::decode(&body)?,
            MsgKind::Error => {
                let (st, text) = message::decode_error(&body)?;
                return Err(Error::from_status(st, format!("{endpoint} refused the connection: {text}")));
            }
            other => return Err(Error::Protocol(format!("{endpoint} answered the handshake with {other:?}"))),
        };
        let id = self.inner.next_peer.fetch_add(1, Ordering::Relaxed);
        let label = format!("peer {id} ({endpoint})");
        let links = self.inner.ipc_links(&peer, endpoint, &label);
        let conn = TcpConnection::start(s, peer, label, self.inner.stats.clone())?;
        self.inner.peers.write().insert(id, Arc::new(Peer { endpoint: endpoint.to_string(), conn, links }));
        Ok(id)
    }

    fn peer(&self, id: u64) -> Result<Arc<Peer>> {
        self.inner.peers.read().get(&id).cloned().ok_or_else(|| Error::NotFound(format!("no peer with id {id}")))
    }

    /// The regions peer `id` publishes (asks the peer for a fresh list).
    pub fn peer_regions(&self, id: u64, timeout: Option<Duration>) -> Result<Vec<RegionInfo>> {
        let p = self.peer(id)?;
        if let Some(e) = p.conn.dead_reason() {
            return Err(e);
        }
        Ok(p.conn.refresh_describe(Instant::now() + self.timeout(timeout))?.regions.clone())
    }

    /// The endpoint peer `id` was connected with.
    pub fn peer_endpoint(&self, id: u64) -> Result<String> {
        Ok(self.peer(id)?.endpoint.clone())
    }

    /// Disconnects peer `id` after its outstanding requests end (up to `timeout`).
    pub fn disconnect(&self, id: u64, timeout: Option<Duration>) -> Result<()> {
        let p = self.peer(id)?;
        let deadline = Instant::now() + self.timeout(timeout);
        if !p.conn.drain(deadline) {
            return Err(Error::TimedOut(format!("peer {id} still has {} requests in flight", p.conn.outstanding())));
        }
        self.inner.peers.write().remove(&id);
        p.conn.close();
        p.close_links();
        Ok(())
    }

    /// Hands a GPU producer stream over for `region`: transfers of the region
    /// start after the work queued on the stream so far.
    pub fn record_producer_stream(&self, region: u64, cu_stream: u64) -> Result<()> {
        self.check_open()?;
        let addr = self
            .inner
            .regions
            .snapshot()
            .iter()
            .find(|r| r.id == region)
            .map(|r| r.addr)
            .ok_or_else(|| Error::NotFound(format!("no region with id {region} is registered")))?;
        crate::cuda_support::record_producer_stream(addr, cu_stream)
    }

    /// Closes the cached imports of the cooperative IPC transports (the
    /// NVLink relocation cache and its SHM counterpart) through their
    /// receipts, while admission stays open so that concurrent submissions
    /// can refill the cache. `Unquiesced` if some could not be confirmed.
    pub fn flush_nvlink_cache(&self, timeout: Option<Duration>) -> Result<()> {
        self.check_open()?;
        let deadline = Instant::now() + self.timeout(timeout);
        let left: usize = self.inner.ipc.iter().map(|t| t.requester.flush(deadline)).sum();
        if left > 0 {
            return Err(Error::Unquiesced(format!(
                "{left} cached imports could not be closed with confirmation; they stay retained (see stats)"
            )));
        }
        Ok(())
    }

    /// Fences new submissions, waits for accepted ones (up to `timeout`),
    /// closes cached imports through their receipts, then closes outgoing
    /// connections. `TimedOut` leaves the side fenced; `Unquiesced` means
    /// imports stay retained.
    pub fn close_requester(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + self.timeout(timeout);
        let left = self.inner.requester_gate.close_and_wait(deadline);
        if left > 0 {
            return Err(Error::TimedOut(format!(
                "{left} requests are still in flight; the requester side stays fenced, call again"
            )));
        }
        let unclosed: usize = self.inner.ipc.iter().map(|t| t.requester.flush(deadline)).sum();
        let peers: Vec<_> = self.inner.peers.write().drain().map(|(_, p)| p).collect();
        for p in peers {
            p.conn.close();
            p.close_links();
        }
        if unclosed > 0 {
            return Err(Error::Unquiesced(format!(
                "{unclosed} imports could not be closed with confirmation; they stay retained (see stats)"
            )));
        }
        Ok(())
    }

    /// Stops serving new requests and exports, waits (up to `timeout`) for
    /// the requests being served and for every export's close receipt, then
    /// closes incoming connections. An export whose close is unconfirmed
    /// keeps its allocation retained and gives `Unquiesced`.
    pub fn close_source(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + self.timeout(timeout);
        let left = self.inner.source_gate.close_and_wait(deadline);
        if left > 0 {
            return Err(Error::TimedOut(format!("{left} incoming requests are still being served")));
        }
        let exports: usize = self.inner.ipc.iter().map(|t| t.exports.wait_empty(deadline)).sum();
        if exports > 0 {
            return Err(Error::Unquiesced(format!(
                "{exports} exports have no close receipt; their allocations stay retained (see stats)"
            )));
        }
        self.inner.stop_incoming();
        Ok(())
    }

    /// Releases outgoing imports (requester side) before waiting for
    /// incoming exports (source side), so two peers can close together;
    /// then stops the engine.
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
        let i = &self.inner;
        let peers = i.peers.read();
        let mut avail = std::collections::BTreeMap::new();
        avail.insert("tcp".to_string(), "available".to_string());
        for t in &i.ipc {
            avail.insert(t.kind.name().to_string(), "available".to_string());
        }
        for (k, why) in &i.ipc_unavailable {
            avail.insert(k.name().to_string(), format!("not available: {why}"));
        }
        EngineStats::collect(
            &i.stats,
            stats::Live {
                inflight_bytes: i.budget.used(),
                mapping_bytes: i.mapping_budget.used(),
                peers: peers.len(),
                peers_alive: peers.values().filter(|p| p.conn.dead_reason().is_none()).count(),
                incoming_connections: i.incoming.lock().values().filter(|c| c.is_live()).count(),
                regions: i.regions.len(),
                ipc: i
                    .ipc
                    .iter()
                    .map(|t| {
                        (
                            t.kind.name().to_string(),
                            t.exports.counts(),
                            t.requester.counts(),
                            t.requester.progress_counts(),
                        )
                    })
                    .collect(),
                nvlink_pool: i.ipc.iter().find_map(|t| t.pool.as_ref().map(|f| (f(), t.requester.progress_counts()))),
                transports_available: avail,
            },
        )
    }

    /// Retained IPC resources (exports without a close receipt, imports
    /// kept after an unconfirmed close), per IPC transport, as JSON.
    pub fn retained_resources(&self) -> serde_json::Value {
        self.inner.retained_detail()
    }
}

fn empty_describe() -> Describe {
    Describe {
        identity: Identity::fresh(),
        capabilities: 0,
        fabric_domain: [0; 16],
        endpoint: String::new(),
        ipc_name: String::new(),
        regions: Vec::new(),
    }
}

fn region_info(r: &Region) -> RegionInfo {
    RegionInfo { id: r.id, epoch: r.epoch, addr: r.addr, len: r.len, access: r.access, kind: r.kind }
}

impl Inner {
    fn retained_detail(&self) -> serde_json::Value {
        let mut v = serde_json::Map::new();
        for t in &self.ipc {
            let mut entry = serde_json::json!({
                "retained_exports": t.exports.retained(),
                "retained_imports": t.requester.counts().retained,
                "fenced_local_owners": t.requester.counts().fenced_local,
                "cached_regions": t.requester.cached_regions(),
            });
            if let Some(pool) = &t.pool {
                entry["quarantined_streams"] = serde_json::json!(pool().retained_streams);
            }
            v.insert(t.kind.name().to_string(), entry);
        }
        serde_json::Value::Object(v)
    }

    fn capabilities(&self) -> u32 {
        let mut c = self.ipc.iter().fold(TransportKind::Tcp.capability_bit(), |c, t| c | t.kind.capability_bit());
        if self.config.mnnvl.as_ref().is_some_and(|m| m.egm) {
            c |= ipc::EGM_CAPABILITY;
        }
        if self.ipc.iter().any(|t| t.kind == TransportKind::Mnnvl) && ipc::fabric_channel_domain(&self.config).is_some()
        {
            c |= ipc::FABRIC_CHANNEL_CAPABILITY;
        }
        c
    }

    fn fabric_domain(&self) -> [u8; 16] {
        self.config.mnnvl.as_ref().and_then(|m| m.fabric_domain).unwrap_or([0; 16])
    }

    fn describe(&self) -> Describe {
        Describe {
            identity: self.identity,
            capabilities: self.capabilities(),
            fabric_domain: self.fabric_domain(),
            endpoint: self.endpoint.to_string(),
            ipc_name: self.ipc_name.clone().unwrap_or_default(),
            regions: self.regions.snapshot().iter().map(|r| region_info(r)).collect(),
        }
    }

    /// One IPC link per IPC transport this engine offers, or why the peer
    /// cannot be reached with it.
    fn ipc_links(
        &self,
        peer: &Describe,
        endpoint: &str,
        label: &str,
    ) -> Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)> {
        let mut out: Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)> = Vec::new();
        for t in &self.ipc {
            let k = t.kind;
            // MNNVL with fabric handles and a shared nonzero fabric domain
            // runs its channel over TCP (any host of the partition);
            // everything else needs the same boot and the Unix channel.
            let fabric = ipc::fabric_channel_domain(&self.config)
                .filter(|d| k == TransportKind::Mnnvl && peer.fabric_domain == *d)
                .filter(|_| peer.capabilities & ipc::FABRIC_CHANNEL_CAPABILITY != 0);
            let same_process =
                ipc::same_boot(&self.identity, &peer.identity) && peer.identity.process == self.identity.process;
            let link = if peer.capabilities & k.capability_bit() == 0 || (peer.ipc_name.is_empty() && fabric.is_none())
            {
                Err(format!("{label} does not offer {}", k.name()))
            } else if k != TransportKind::Shm && same_process {
                Err(format!("{label} is in this process; {} needs two cooperating processes", k.name()))
            } else if k == TransportKind::Mnnvl && peer.fabric_domain != self.fabric_domain() {
                Err(format!("{label} advertises another fabric domain"))
            } else if fabric.is_none() && !ipc::same_boot(&self.identity, &peer.identity) {
                Err(format!(
                    "{label} runs on another host or boot; {} needs the same boot{}",
                    k.name(),
                    if k == TransportKind::Mnnvl {
                        " unless both peers use fabric handles with one nonzero fabric_domain"
                    } else {
                        ""
                    }
                ))
            } else {
                let route = match fabric {
                    Some(d) => Route::Fabric(d),
                    None => Route::Unix(peer.ipc_name.clone()),
                };
                Ok(Arc::new(IpcLink::new(
                    k,
                    route,
                    peer.identity,
                    endpoint.to_string(),
                    label.to_string(),
                    self.identity,
                    self.faults.clone(),
                )))
            };
            out.push((k, link));
        }
        for (k, why) in &self.ipc_unavailable {
            out.push((*k, Err(format!("this engine: {why}"))));
        }
        out
    }

    fn ipc_transport(&self, kind: TransportKind) -> Option<&ipc::IpcTransport> {
        self.ipc.iter().find(|t| t.kind == kind)
    }

    fn stop_incoming(&self) {
        let all: Vec<Incoming> = self.incoming.lock().drain().map(|(_, v)| v).collect();
        for mut inc in all {
            inc.stop();
        }
    }

    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stopping.store(true, Ordering::Release);
        // SAFETY: the listener fds are owned by `self` and still open;
        // shutdown wakes the threads blocked in accept on them.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(l) = &self.ipc_listener {
            // SAFETY: as above.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        let threads: Vec<_> = self.accept_threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        let peers: Vec<_> = self.peers.write().drain().map(|(_, p)| p).collect();
        for p in peers {
            p.conn.close();
            p.close_links();
        }
        self.stop_incoming();
        for t in &self.ipc {
            t.requester.stop_progress();
        }
        self.regions.clear();
    }
}

impl Peer {
    fn link(&self, kind: TransportKind) -> std::result::Result<Arc<IpcLink>, String> {
        self.links
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| Err(format!("{} is not an IPC transport", kind.name())))
    }

    fn close_links(&self) {
        for (_, l) in &self.links {
            if let Ok(l) = l {
                l.close();
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}
