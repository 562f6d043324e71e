//! The Rust API: [`Engine`] and its life cycle (start, what it tells
//! peers, closes, shutdown). Below this file: `config`, `batch`, `ipc` (the
//! IPC transports and route policy), `accept` (the listeners) and `registry` (the process-wide engine list).
//! Above it, each adding methods to [`Engine`]: `peers` (connect,
//! disconnect), `regions` (registration), `submit` (submissions and
//! transport selection) and `stats` (the snapshot).

mod accept;
pub mod batch_handle;
mod check;
pub mod config;
pub mod direct;
pub mod doctor;
mod ipc_transports;
mod json_keys;
mod misfit;
mod mnnvl_fabric;
mod mnnvl_peer;
mod notify;
mod peers;
mod plan;
mod regions;
pub mod registry;
pub mod stats;
mod submit;

pub use batch_handle::{Batch, SubmitOptions};
pub use config::{EngineConfig, FabricDomain, MnnvlConfig, MnnvlHandleType};

use crate::control::auth::AuthKey;
use crate::control::message::{Describe, RegionInfo};
use crate::control::region_index::PublishedDescribe;
use crate::control::Identity;
use crate::counters::Counters;
use crate::discovery::{Discovery, Record};
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::log::{Level, Logger};
use crate::memory::RegionTable;
use crate::sync::admission::{Budget, Gate};
use crate::sync::fast_hash::FastMap;
use crate::sync::snapshot::Snapshot;
use crate::transport::inbox::Inbox;
use crate::transport::ipc::faults::Faults;
use crate::transport::ipc::link::IpcLink;
use crate::transport::ipc::source::IpcSourceContext;
use crate::transport::reactor::Reactor;
use crate::transport::tcp::outbox::Outbox;
use crate::transport::tcp::source::Revoker;
use crate::transport::tcp::SourceContext;
use crate::transport::tcp::TcpConnection;
use accept::Listeners;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Inner {
    config: EngineConfig,
    identity: Identity,
    regions: Arc<RegionTable>,
    stats: Arc<Counters>,
    budget: Arc<Budget>,
    requester_gate: Arc<Gate>,
    source_gate: Arc<Gate>,
    stopping: Arc<AtomicBool>,
    closed: AtomicBool,
    endpoint: SocketAddr,
    ipc_name: std::result::Result<String, String>,
    listeners: Arc<Listeners>,
    /// The connected peers: read by every submission without a lock,
    /// replaced whole on connect and disconnect.
    peers: Snapshot<FastMap<u64, Arc<Peer>>>,
    next_peer: AtomicU64,
    faults: Arc<Faults>,
    /// The shared key of `auth_key_file`, if configured.
    auth: Option<AuthKey>,
    /// The answer streams of the incoming control connections (`Revoke`).
    revoker: Arc<Revoker>,
    /// What the engine found that will make a transport unusable or slow,
    /// in words (a sizing that rules out SHM, ...); the latest few.
    notes: parking_lot::Mutex<std::collections::VecDeque<String>>,
    /// The (transport, status) pairs whose fall-through to TCP was logged
    /// at WARN (later ones at DEBUG).
    fell_through: parking_lot::Mutex<std::collections::HashSet<(TransportKind, crate::error::Status)>>,
    ipc: Vec<ipc_transports::IpcTransport>,
    ipc_unavailable: Vec<(TransportKind, String)>,
    /// What MNNVL found at start: the fabric place, the probe.
    fabric: mnnvl_fabric::FabricSetup,
    /// Notifications received, waiting to be taken.
    inbox: Arc<Inbox>,
    /// Discovery on etcd, when configured (set once, at start).
    discovery: once_cell::sync::OnceCell<Discovery>,
    /// The I/O threads serving the control connections, both ways.
    reactor: Arc<Reactor>,
    /// This engine's log lines: its level (`ORBITE_LOG`, else the config's
    /// `log_level`) and its label (name and endpoint).
    log: Arc<Logger>,
}

/// A connected peer: the value of the peer table ([`Engine::peer`]).
pub(crate) struct Peer {
    /// The endpoint it was connected with.
    endpoint: String,
    /// The control connection (and the TCP transport).
    conn: Arc<TcpConnection>,
    /// The peer's Describe and region index as the connection publishes
    /// them (or why it ended): what a submission plans from, read with no
    /// lock and without entering the connection.
    describe: Arc<PublishedDescribe>,
    /// One IPC link per IPC transport, or why it cannot be used with this peer.
    links: Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)>,
    /// Notifications for the peer, sent once the requests before them ended.
    outbox: Arc<Outbox>,
}

impl Peer {
    /// Its IPC link on transport `kind`, or why there is none.
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

/// How long an engine's close waits for its log lines to reach stderr.
const LOG_FLUSH: Duration = Duration::from_secs(1);

/// A transfer engine: registers memory, serves it to peers and moves bytes
/// to and from theirs. Share it across threads by reference.
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Starts an engine: binds the control socket (and the IPC channel) and
    /// starts serving.
    pub fn new(mut config: EngineConfig) -> Result<Engine> {
        config.validate()?;
        // Before anything reads it: the fabric domain resolved, and whether
        // MNNVL can work here at all.
        let fabric = mnnvl_fabric::FabricSetup::start(&mut config);
        let from_env = crate::log::env_level()
            .map_err(|e| Error::InvalidConfig(format!("environment variable {}: {e}", crate::log::ENV)))?;
        let level = from_env.unwrap_or(config.log_level);
        let auth =
            config.auth_key_file.as_deref().map(AuthKey::load).transpose()?.map(|k| k.with_wire(config.wire_security));
        let addr: SocketAddr = config.listen.parse().map_err(|_| {
            Error::InvalidConfig(format!("key `listen`: {:?} is not an IP:port address", config.listen))
        })?;
        let listener =
            TcpListener::bind(addr).map_err(|e| Error::Unavailable(format!("cannot listen on {addr}: {e}")))?;
        let endpoint = listener.local_addr().map_err(|e| Error::io("local_addr", &e))?;
        let log = Arc::new(Logger::new(
            level,
            match &config.name {
                Some(n) => format!("{n} {endpoint}"),
                None => endpoint.to_string(),
            },
        ));
        let identity = Identity::fresh()?;
        let name = format!("orbite-{}-{:016x}", identity.process.pid, identity.engine_epoch);
        let (ipc_listener, ipc_name) = match crate::transport::ipc::channel::listen(&name) {
            Ok(l) => (Some(l), Ok(name)),
            Err(e) => (None, Err(e.to_string())),
        };
        let regions = Arc::new(RegionTable::default());
        let stats = Arc::new(Counters::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let mapping_budget = Budget::new(config.max_inflight_bytes);
        let source_gate = Gate::new("source side");
        let reactor = Arc::new(Reactor::new(
            config.io_threads as usize,
            std::time::Duration::from_micros(config.io_poll_us as u64),
        ));
        let listeners = Listeners::new(
            (listener, ipc_listener),
            &config,
            auth.clone(),
            stopping.clone(),
            source_gate.clone(),
            (stats.clone(), log.clone()),
            reactor.clone(),
        );
        let faults = Arc::new(Faults::default());
        let parts = ipc_transports::IpcParts {
            config: &config,
            regions: &regions,
            stats: &stats,
            mapping_budget: &mapping_budget,
            source_gate: &source_gate,
            faults: &faults,
            reactor: &reactor,
            log: &log,
        };
        let mut ipc_transports = Vec::new();
        let mut ipc_unavailable = Vec::new();
        match &ipc_name {
            Ok(_) => ipc_transports.push(parts.shm()),
            Err(e) => ipc_unavailable.push((TransportKind::Shm, format!("no IPC channel: {e}"))),
        }
        match parts.cma() {
            Ok(t) if ipc_name.is_ok() => ipc_transports.push(t),
            Ok(_) => ipc_unavailable.push((TransportKind::Cma, "no IPC channel".into())),
            Err(e) => ipc_unavailable.push((TransportKind::Cma, e)),
        }
        match parts.nvlink() {
            Ok(t) if ipc_name.is_ok() => ipc_transports.push(t),
            Ok(_) => ipc_unavailable.push((TransportKind::Nvlink, "no IPC channel".into())),
            Err(e) => ipc_unavailable.push((TransportKind::Nvlink, e)),
        }
        match fabric.refusal.clone().map_or_else(|| parts.mnnvl(), Err) {
            Ok(t) if ipc_name.is_ok() => ipc_transports.push(t),
            Ok(_) => ipc_unavailable.push((TransportKind::Mnnvl, "no IPC channel".into())),
            Err(e) => ipc_unavailable.push((TransportKind::Mnnvl, e)),
        }
        let inner = Arc::new(Inner {
            identity,
            regions,
            stats: stats.clone(),
            budget: Budget::new(config.max_inflight_bytes),
            requester_gate: Gate::new("requester side"),
            source_gate,
            stopping,
            closed: AtomicBool::new(false),
            endpoint,
            ipc_name,
            listeners,
            peers: Snapshot::default(),
            next_peer: AtomicU64::new(1),
            faults,
            auth,
            revoker: Arc::new(Revoker::default()),
            notes: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            fell_through: parking_lot::Mutex::new(std::collections::HashSet::new()),
            ipc: ipc_transports,
            ipc_unavailable,
            fabric,
            discovery: once_cell::sync::OnceCell::new(),
            reactor,
            log,
            inbox: Arc::new(Inbox::new(
                config.notification_queue as usize,
                config.notification_max_bytes as usize,
                stats.clone(),
            )),
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
            min_payload_rate: inner.config.min_payload_rate_kib as u64 * 1024,
            revoker: inner.revoker.clone(),
            inbox: inner.inbox.clone(),
            log: inner.log.clone(),
            torn: Default::default(),
        });
        let ipc_ctx = Arc::new(IpcSourceContext {
            tables: inner.ipc.iter().map(|t| (t.kind, t.exports.clone())).collect(),
            identity: inner.identity,
            fabric_domain: ipc_transports::fabric_channel_domain(&inner.config),
            stats: inner.stats.clone(),
            stopping: inner.stopping.clone(),
            handshake_timeout: Duration::from_millis(inner.config.handshake_timeout_ms as u64),
            auth: inner.auth.clone(),
            allowed_uids: inner.config.ipc_allowed_uids.clone(),
            probe: inner.fabric.probe.clone(),
        });
        // Published under its name before it serves: a peer that finds it
        // connects into the listen backlog meanwhile.
        if let Some(d) = &inner.config.discovery {
            let me = Record {
                name: inner.config.name.clone().unwrap_or_default(),
                endpoint: inner.endpoint.to_string(),
                epoch: inner.identity.engine_epoch,
                capabilities: inner.capabilities(),
                boot_id: inner.identity.boot_id.iter().map(|b| format!("{b:02x}")).collect(),
                pid: inner.identity.process.pid,
                pid_ns: crate::control::identity::pid_namespace(),
                sig: None,
            };
            let deadline = Instant::now() + Duration::from_millis(inner.config.default_timeout_ms as u64);
            let _ = inner.discovery.set(Discovery::start(d, me, inner.auth.clone(), deadline)?);
        }
        if inner.config.shm_cache_entries == 0 && inner.ipc_transport(TransportKind::Shm).is_some() {
            inner.note(
                "shm_cache_entries is 0: each SHM subbatch maps the whole remote allocation and unmaps it again, \
                 so ORBITE_TRANSPORT_AUTO prefers TCP where TCP can carry a submission (a forced SHM still runs)"
                    .into(),
            );
        }
        for n in &inner.fabric.notes {
            inner.note(n.clone());
        }
        if let Some(from) =
            inner.fabric.domain_from.as_ref().filter(|_| inner.ipc_transport(TransportKind::Mnnvl).is_some())
        {
            inner.log.info(format_args!("mnnvl: {from}"));
        }
        inner.listeners.start(tcp_ctx, ipc_ctx)?;
        registry::add(Arc::downgrade(&inner) as std::sync::Weak<dyn registry::Reporting>);
        let engine = Engine { inner };
        engine.log_start(from_env.is_some());
        Ok(engine)
    }

    /// The lines of a start: INFO what it offers; WARN each transport the
    /// config asks for that this engine cannot offer, with the reason
    /// (DEBUG for those not asked for); DEBUG that shared memory uses 4 KiB
    /// pages, where SHM is offered and the kernel keeps it on them.
    fn log_start(&self, level_from_env: bool) {
        let (log, c) = (&self.inner.log, &self.inner.config);
        log.info(format_args!(
            "engine started (transports: {}; log level {}{})",
            self.transports().iter().map(|k| k.name()).collect::<Vec<_>>().join(", "),
            log.level(),
            if level_from_env { " from ORBITE_LOG" } else { "" }
        ));
        if self.transports().contains(&TransportKind::Shm) {
            if let Some(setting) =
                crate::memory::owners::shmem_huge_setting().filter(|s| !crate::memory::owners::shmem_huge_pages_on(s))
            {
                log.event(
                    Level::Debug,
                    format_args!(
                    "shm: shared memory uses 4 KiB pages (transparent_hugepage/shmem_enabled is {setting}): a peer's \
                     fresh import of a large allocation takes a page fault per 4 KiB page it first touches; with \
                     `advise` the library's shared allocations use 2 MiB pages"
                ),
                );
            }
        }
        for (kind, why) in &self.inner.ipc_unavailable {
            let asked = match kind {
                TransportKind::Nvlink => c.nvlink,
                TransportKind::Mnnvl => c.mnnvl.is_some(),
                TransportKind::Cma => c.cma,
                _ => true,
            };
            let level = if asked { Level::Warn } else { Level::Debug };
            log.event(level, format_args!("{} is not offered: {why}", kind.name()));
        }
    }

    /// This engine's logger (its level and label), for code that logs on
    /// its behalf.
    pub fn logger(&self) -> &Arc<Logger> {
        &self.inner.log
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

    /// The transports this engine offers, in stats order (TCP always; the
    /// IPC transports its config enables and this host supports).
    pub fn transports(&self) -> Vec<TransportKind> {
        let ipc: Vec<TransportKind> = self.inner.ipc.iter().map(|t| t.kind).collect();
        TransportKind::ALL.into_iter().filter(|k| *k == TransportKind::Tcp || ipc.contains(k)).collect()
    }

    /// This engine's identity (boot, process, epoch).
    pub fn identity(&self) -> Identity {
        self.inner.identity
    }

    /// Retained IPC resources (exports without a close receipt, imports
    /// kept after an unconfirmed close), per IPC transport, as JSON.
    pub fn retained_resources(&self) -> serde_json::Value {
        ipc_transports::retained_detail(&self.inner.ipc)
    }

    /// Fault-injection switches for the IPC transports (tests and
    /// qualification). Inert unless a counter is set.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Peer `id` from the peer table (read without a lock).
    fn peer(&self, id: u64) -> Result<Arc<Peer>> {
        self.inner.peers.load().get(&id).cloned().ok_or_else(|| Error::NotFound(format!("no peer with id {id}")))
    }

    pub(super) fn timeout(&self, t: Option<Duration>) -> Duration {
        t.unwrap_or(Duration::from_millis(self.inner.config.default_timeout_ms as u64))
    }

    /// `Unavailable` in a process forked from the one that started the
    /// engine: the child's copy shares the parent's sockets and must not
    /// use or close them. No system call once the process's id is known
    /// ([`crate::sync::fork::pid`]).
    pub(super) fn check_owner(&self) -> Result<()> {
        let owner = self.inner.identity.process.pid;
        if owner != crate::sync::fork::pid() {
            return Err(Error::Unavailable(format!(
                "this engine belongs to process {owner}; a forked child cannot use it (create its own engine)"
            )));
        }
        Ok(())
    }

    pub(super) fn check_open(&self) -> Result<()> {
        self.check_owner()?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Unavailable("the engine is closed".into()));
        }
        Ok(())
    }

    /// Closes the cached imports of the cooperative IPC transports (the
    /// NVLink relocation cache and its SHM counterpart) through their
    /// receipts, while admission stays open so that concurrent submissions
    /// can refill the cache. `Unquiesced` if some could not be confirmed.
    pub fn flush_nvlink_cache(&self, timeout: Option<Duration>) -> Result<()> {
        self.check_open()?;
        let deadline = Instant::now() + self.timeout(timeout);
        let left: Vec<String> = self.inner.ipc.iter().flat_map(|t| t.requester.flush(deadline)).collect();
        if !left.is_empty() {
            return Err(Error::Unquiesced(held_imports(&left)));
        }
        Ok(())
    }

    /// Fences new submissions, waits for accepted ones (up to `timeout`),
    /// closes cached imports through their receipts, then closes outgoing
    /// connections. `TimedOut` leaves the side fenced; `Unquiesced` means
    /// imports stay retained.
    pub fn close_requester(&self, timeout: Option<Duration>) -> Result<()> {
        self.check_owner()?;
        let deadline = Instant::now() + self.timeout(timeout);
        let left = self.inner.requester_gate.close_and_wait(deadline);
        if left > 0 {
            return Err(Error::TimedOut(format!(
                "{left} requests are still in flight; the requester side stays fenced, call again"
            )));
        }
        let unclosed: Vec<String> = self.inner.ipc.iter().flat_map(|t| t.requester.flush(deadline)).collect();
        let peers: Vec<_> = self.inner.peers.update(std::mem::take).into_values().collect();
        let n = peers.len();
        for p in peers {
            p.conn.close();
            p.close_links();
        }
        if !unclosed.is_empty() {
            return Err(Error::Unquiesced(held_imports(&unclosed)));
        }
        self.inner.log.debug(format_args!("requester side closed ({n} peers disconnected)"));
        Ok(())
    }

    /// Stops serving new requests and exports, waits (up to `timeout`) for
    /// the requests being served and for every export's close receipt, then
    /// closes incoming connections. An export whose close is unconfirmed
    /// keeps its allocation retained and gives `Unquiesced`.
    pub fn close_source(&self, timeout: Option<Duration>) -> Result<()> {
        self.check_owner()?;
        let deadline = Instant::now() + self.timeout(timeout);
        let left = self.inner.source_gate.close_and_wait(deadline);
        if left > 0 {
            return Err(Error::TimedOut(format!("{left} incoming requests are still being served")));
        }
        // No cached grant is used any more (board slots revoked, groups in
        // flight waited for within the deadline). Then ask every requester
        // to give its imports back now, rather than at its next flush; a
        // requester that does not answer leaves its export retained and the
        // close Unquiesced.
        for t in &self.inner.ipc {
            t.exports.withdraw_offers();
            t.exports.suspend(None, deadline);
        }
        if self.inner.ipc.iter().any(|t| t.exports.counts().open + t.exports.counts().retained > 0) {
            self.inner.revoker.revoke_all();
        }
        let exports: usize = self.inner.ipc.iter().map(|t| t.exports.wait_empty(deadline)).sum();
        if exports > 0 {
            return Err(Error::Unquiesced(format!(
                "{exports} exports have no close receipt; their allocations stay retained (see stats)"
            )));
        }
        self.inner.listeners.stop_incoming();
        self.inner.log.debug(format_args!("source side closed"));
        Ok(())
    }

    /// Releases outgoing imports (requester side) before waiting for
    /// incoming exports (source side), so two peers can close together;
    /// then stops the engine.
    pub fn close(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + self.timeout(timeout);
        let left = || deadline.saturating_duration_since(Instant::now());
        let closed = self.close_requester(Some(left())).and_then(|()| self.close_source(Some(left())));
        if let Err(e) = closed {
            self.inner.log.warn(format_args!("close failed ({}): {}", e.status(), e.message()));
            return Err(e);
        }
        self.inner.shutdown(true);
        Ok(())
    }
}

/// What a flush or close left behind, in words: how many imports, and for
/// each which one and why (the first few).
fn held_imports(left: &[String]) -> String {
    let shown: Vec<&str> = left.iter().take(4).map(String::as_str).collect();
    let more =
        if left.len() > shown.len() { format!("; and {} more", left.len() - shown.len()) } else { String::new() };
    format!(
        "{} imports could not be closed with confirmation and stay retained (see stats and retained resources): {}{more}",
        left.len(),
        shown.join("; ")
    )
}

/// The Describe a source thread answers with once its engine is gone.
fn empty_describe() -> Describe {
    Describe::bare(Identity::gone())
}

impl Inner {
    pub(super) fn capabilities(&self) -> u32 {
        let mut c = self.ipc.iter().fold(TransportKind::Tcp.capability_bit(), |c, t| c | t.kind.capability_bit());
        if self.config.mnnvl.as_ref().is_some_and(|m| m.egm) {
            c |= ipc_transports::EGM_CAPABILITY;
        }
        if self.ipc.iter().any(|t| t.kind == TransportKind::Mnnvl)
            && ipc_transports::fabric_channel_domain(&self.config).is_some()
        {
            c |= ipc_transports::FABRIC_CHANNEL_CAPABILITY;
        }
        if self.fabric.probe.is_some() && self.ipc_transport(TransportKind::Mnnvl).is_some() {
            c |= mnnvl_fabric::PROBE_CAPABILITY;
        }
        c
    }

    fn fabric_domain(&self) -> [u8; 16] {
        self.config.mnnvl.as_ref().and_then(|m| m.fabric_domain.fixed()).unwrap_or([0; 16])
    }

    pub(super) fn describe(&self) -> Describe {
        Describe {
            identity: self.identity,
            capabilities: self.capabilities(),
            fabric_domain: self.fabric_domain(),
            endpoint: self.endpoint.to_string(),
            ipc_name: self.ipc_name.clone().unwrap_or_default(),
            // Local-only regions (no remote access) are not published.
            regions: self
                .regions
                .snapshot()
                .iter()
                .filter(|r| r.access != crate::memory::Access::NONE)
                .map(|r| RegionInfo::of(r))
                .collect(),
        }
    }

    /// Records a finding for the stats' `notes` (the latest 32 are kept),
    /// logged at WARN when it is new.
    pub(super) fn note(&self, text: String) {
        let mut n = self.notes.lock();
        if n.contains(&text) {
            return;
        }
        if n.len() == 32 {
            n.pop_front();
        }
        n.push_back(text.clone());
        drop(n);
        self.log.warn(format_args!("{text}"));
    }

    pub(super) fn ipc_transport(&self, kind: TransportKind) -> Option<&ipc_transports::IpcTransport> {
        self.ipc.iter().find(|t| t.kind == kind)
    }

    /// Stops the engine (once): `orderly` after a close that succeeded,
    /// otherwise when it is dropped or freed.
    fn shutdown(&self, orderly: bool) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Peers stop finding it first (its lease is revoked: the name goes
        // at once).
        if let Some(d) = self.discovery.get() {
            d.close(Instant::now() + Duration::from_secs(2));
        }
        self.stopping.store(true, Ordering::Release);
        self.listeners.stop_accepting();
        let peers: Vec<_> = self.peers.update(std::mem::take).into_values().collect();
        for p in peers {
            p.conn.close();
            p.close_links();
        }
        self.listeners.stop_incoming();
        self.reactor.stop();
        for t in &self.ipc {
            t.requester.stop_progress();
        }
        self.regions.clear();
        if orderly {
            self.log.info(format_args!("engine closed"));
        } else {
            self.log.info(format_args!("engine stopped without an orderly close (freed or dropped)"));
        }
        // Its last lines reach stderr before the close returns (bounded:
        // a stderr nobody drains does not hold it).
        crate::log::flush(LOG_FLUSH);
    }
}

impl registry::Reporting for Inner {
    fn retained(&self) -> Option<(String, serde_json::Value)> {
        let live = !self.closed.load(Ordering::Acquire);
        live.then(|| (self.endpoint.to_string(), ipc_transports::retained_detail(&self.ipc)))
    }
}

impl Drop for Engine {
    /// Stops the engine. In a process forked from its owner, nothing is
    /// touched: the child's copy of the engine (its memory) is leaked, so
    /// that the parent's sockets, threads and mappings stay the parent's.
    fn drop(&mut self) {
        if self.check_owner().is_err() {
            std::mem::forget(self.inner.clone());
            return;
        }
        self.inner.shutdown(false);
    }
}
