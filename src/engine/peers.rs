//! Peers: connecting (the handshake, then one IPC link per IPC transport
//! the two engines share), the regions a peer publishes, and
//! disconnecting. The table itself and its lookup ([`Engine::peer`]) are
//! in `mod.rs`, beside [`Peer`].

use super::{ipc_transports, Engine, Inner, Peer};
use crate::control::message::{Describe, RegionInfo};
use crate::control::{endpoint, identity};
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::memory::MemoryKind;
use crate::sync::single_runner::SingleRunner;
use crate::transport::ipc::link::{IpcLink, LocalEnd, Route};
use crate::transport::tcp::outbox::Outbox;
use crate::transport::tcp::requester::RevokeHook;
use crate::transport::tcp::{handshake, TcpConnection};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Engine {
    /// Connects to the engine at `endpoint` (`IP:port` or `localhost:port`).
    /// Returns the peer id.
    pub fn connect(&self, endpoint: &str, timeout: Option<Duration>) -> Result<u64> {
        self.check_open()?;
        endpoint::parse(endpoint)?;
        if !self.inner.requester_gate.is_open() {
            return Err(Error::Unavailable("the requester side is closed".into()));
        }
        let deadline = Instant::now() + self.timeout(timeout);
        let (s, peer, seal) =
            handshake::connect(endpoint, self.timeout(timeout), self.inner.auth.as_ref(), &self.inner.describe())?;
        let id = self.inner.next_peer.fetch_add(1, Ordering::Relaxed);
        let label = format!("peer {id} ({endpoint})");
        let mut links = self.inner.ipc_links(&peer, endpoint, &label);
        self.inner.check_mnnvl_peer(&peer, &label, &mut links, deadline);
        // A published region larger than this engine's mapping budget can
        // never be imported: say so at connect, not at the first grant.
        let budget = self.inner.config.max_inflight_bytes;
        for r in peer.regions.iter().filter(|r| r.len > budget && r.kind != MemoryKind::Host) {
            self.inner.note(format!(
                "{label} region {} ({} bytes of {} memory) is larger than this engine's max_inflight_bytes \
                 ({budget}): it can only be reached over TCP; raise max_inflight_bytes here (and on the source)",
                r.id,
                r.len,
                r.kind.name()
            ));
        }
        let on_revoke = self.revoke_hook(&links, &label);
        let conn = TcpConnection::start(
            (s, crate::control::wire::Wire::from(seal)),
            peer,
            label,
            self.inner.stats.clone(),
            on_revoke,
            &self.inner.reactor,
            self.inner.log.clone(),
        )?;
        let outbox = Outbox::new(
            conn.clone(),
            self.inner.config.name.clone().unwrap_or_default(),
            Duration::from_millis(self.inner.config.default_timeout_ms as u64),
            self.inner.stats.clone(),
        );
        let log = &self.inner.log;
        if log.enabled(crate::log::Level::Info) {
            let ipc: Vec<&str> = links.iter().filter(|(_, l)| l.is_ok()).map(|(k, _)| k.name()).collect();
            log.info(format_args!(
                "peer {id} connected: {endpoint} (epoch {:016x}, transports: tcp{}{})",
                conn.describe().identity.engine_epoch,
                if ipc.is_empty() { "" } else { ", " },
                ipc.join(", ")
            ));
            for (k, l) in &links {
                if let Err(why) = l {
                    log.debug(format_args!("peer {id}: {} cannot be used: {why}", k.name()));
                }
            }
        }
        let describe = conn.published();
        let peer = Arc::new(Peer { endpoint: endpoint.to_string(), conn, describe, links, outbox });
        self.inner.peers.update(|m| m.insert(id, peer));
        Ok(id)
    }

    /// Finds the live engine named `name` through discovery and connects to
    /// it. `NOT_FOUND`: no live engine has that name; `UNAVAILABLE`: no
    /// discovery configured, or etcd out of reach within the timeout;
    /// `STALE_PEER`: the engine that answered is not the epoch published
    /// under the name. While connected, the name is watched: when its key
    /// vanishes (the engine closed, or its lease expired) or names another
    /// epoch, the peer is marked gone at once (`STALE_PEER`).
    pub fn connect_name(&self, name: &str, timeout: Option<Duration>) -> Result<u64> {
        self.check_open()?;
        crate::control::notify_frame::check_name(name).map_err(Error::InvalidArgument)?;
        let d = self
            .inner
            .discovery
            .get()
            .ok_or_else(|| Error::Unavailable("no discovery is configured (config `discovery`)".into()))?;
        let deadline = Instant::now() + self.timeout(timeout);
        let rec = d.resolve(name, deadline)?.ok_or_else(|| {
            let prefix = self.inner.config.discovery.as_ref().map(|c| c.engines_prefix()).unwrap_or_default();
            Error::NotFound(format!("no live engine is named {name:?} in discovery ({prefix})"))
        })?;
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let id = self.connect(&rec.endpoint, Some(left))?;
        let p = self.peer(id)?;
        let epoch = p.conn.describe().identity.engine_epoch;
        if epoch != rec.epoch {
            let _ = self.disconnect(id, Some(Duration::from_secs(1)));
            return Err(Error::StalePeer(format!(
                "{name:?} is published with epoch {:x}, but the engine at {} is epoch {epoch:x}",
                rec.epoch, rec.endpoint
            )));
        }
        let conn = p.conn.clone();
        d.watch(name, rec.epoch, Box::new(move |why| conn.retire(Error::StalePeer(why))));
        Ok(id)
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

    /// What a `Revoke` from the peer does: on a thread of its own (its
    /// reader must not block), give back the imports made through the
    /// peer's IPC links whose grants the peer withdrew on its board (it
    /// unregisters their region, or closes), through their close receipts;
    /// the next submission opens new ones or falls through. Revokes that come while a pass
    /// runs fold into one more pass (one thread per peer at most, however
    /// many the peer sends). Each pass is logged: DEBUG, or WARN with what
    /// could not be given back.
    fn revoke_hook(
        &self,
        links: &[(TransportKind, std::result::Result<Arc<IpcLink>, String>)],
        label: &str,
    ) -> RevokeHook {
        let links: Vec<Arc<IpcLink>> = links.iter().filter_map(|(_, l)| l.as_ref().ok().cloned()).collect();
        let engine = Arc::downgrade(&self.inner);
        let stats = self.inner.stats.clone();
        let label = label.to_string();
        // Passes of this peer running now (one at most).
        let running = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let job = SingleRunner::new("orbite-revoke", move || {
            let Some(inner) = engine.upgrade() else { return };
            if running.fetch_add(1, Ordering::AcqRel) > 0 {
                inner.stats.events.revoke_passes_overlapping.fetch_add(1, Ordering::Relaxed);
            }
            let deadline = Instant::now() + Duration::from_millis(inner.config.default_timeout_ms as u64);
            let mut left = Vec::new();
            for link in &links {
                if let Some(t) = inner.ipc_transport(link.transport) {
                    left.extend(t.requester.give_back(link, deadline));
                }
            }
            if left.is_empty() {
                inner
                    .log
                    .debug(format_args!("{label} asked for its exports back: this engine's imports of them closed"));
            } else {
                inner.log.warn(format_args!(
                    "{label} asked for its exports back; {} imports stay retained: {}",
                    left.len(),
                    left.join("; ")
                ));
            }
            running.fetch_sub(1, Ordering::AcqRel);
            // Counted once it ended: whoever sees the count knows what the
            // pass gave back is given back.
            inner.stats.events.revoke_passes.fetch_add(1, Ordering::Relaxed);
        });
        Box::new(move || {
            // Counted before the pass is triggered: whoever sees what the
            // pass gave back (a source's close that got its exports back)
            // sees the count too; whoever sees the count knows a pass is
            // due (or ran) for it.
            stats.events.revokes_received.fetch_add(1, Ordering::Relaxed);
            job.trigger();
        })
    }

    /// The transports this engine can use with peer `id` now, in stats
    /// order: TCP while the connection lives, and each IPC transport both
    /// engines offer whose link is usable (none once the peer is gone).
    pub fn peer_transports(&self, id: u64) -> Result<Vec<TransportKind>> {
        let p = self.peer(id)?;
        if p.conn.dead_reason().is_some() {
            return Ok(Vec::new());
        }
        let mut out = vec![TransportKind::Tcp];
        for k in TransportKind::ALL {
            if p.link(k).is_ok_and(|l| l.dead_reason().is_none()) && self.ipc_why_not(&p, k).is_none() {
                out.push(k);
            }
        }
        Ok(out)
    }

    /// Disconnects peer `id` after its outstanding requests end (up to `timeout`).
    pub fn disconnect(&self, id: u64, timeout: Option<Duration>) -> Result<()> {
        self.check_owner()?;
        let p = self.peer(id)?;
        let deadline = Instant::now() + self.timeout(timeout);
        if !p.conn.drain(deadline) {
            return Err(Error::TimedOut(format!("peer {id} still has {} requests in flight", p.conn.outstanding())));
        }
        self.inner.peers.update(|m| m.remove(&id));
        // Its imports go back through their close receipts while the
        // channels are up, so that the source keeps no export for this
        // engine; what cannot be confirmed now stays owed and goes out on
        // the next channel to the same source (or the next flush).
        let mut left = Vec::new();
        for (k, l) in &p.links {
            if let (Ok(link), Some(t)) = (l, self.inner.ipc_transport(*k)) {
                left.extend(t.requester.flush_link(link, deadline));
            }
        }
        if !left.is_empty() {
            self.inner.log.warn(format_args!(
                "peer {id} disconnected with {} imports not given back yet (sent again on the next channel to \
                 the same source, or by a flush): {}",
                left.len(),
                left.join("; ")
            ));
        }
        p.conn.close();
        p.close_links();
        self.inner.log.info(format_args!("peer {id} disconnected: {}", p.endpoint));
        Ok(())
    }
}

/// The note (stats `notes`, logged once) of a peer in another PID
/// namespace of this host.
const PID_NAMESPACE_NOTE: &str = "peers in another PID namespace of this host (a container beside this one) are \
    reached over TCP only: the kernel cannot say which process holds an IPC channel across PID namespaces, so \
    SHM, NVLink and MNNVL over a Unix channel are not used with them (orbite_peer_transports lists tcp); run \
    both engines in one PID namespace (e.g. docker --pid=host) to use them";

impl Inner {
    /// One IPC link per IPC transport this engine offers, or why the peer
    /// cannot be reached with it.
    fn ipc_links(
        &self,
        peer: &Describe,
        endpoint: &str,
        label: &str,
    ) -> Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)> {
        let mut out: Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)> = Vec::new();
        // A peer of this boot whose process is provably not this PID
        // namespace's (a container beside this one): the kernel cannot say
        // who holds an IPC channel across the namespaces (SO_PEERCRED gives
        // pid 0, or a pid the peer does not know as its own), so a channel
        // could not be told from an impostor's. Unix channels are left out
        // for it, before anything is sent; TCP carries its requests.
        let elsewhere = ipc_transports::same_boot(&self.identity, &peer.identity)
            && identity::process_is_here(&peer.identity.process) == Some(false);
        let mut left_out = false;
        for t in &self.ipc {
            let k = t.kind;
            // MNNVL with fabric handles and a shared nonzero fabric domain
            // runs its channel over TCP (any host of the partition);
            // everything else needs the same boot and the Unix channel.
            let fabric = ipc_transports::fabric_channel_domain(&self.config)
                .filter(|d| k == TransportKind::Mnnvl && peer.fabric_domain == *d)
                .filter(|_| peer.capabilities & ipc_transports::FABRIC_CHANNEL_CAPABILITY != 0);
            let same_process = ipc_transports::same_boot(&self.identity, &peer.identity)
                && peer.identity.process == self.identity.process;
            let link = if peer.capabilities & k.capability_bit() == 0 || (peer.ipc_name.is_empty() && fabric.is_none())
            {
                Err(format!("{label} does not offer {}", k.name()))
            } else if k != TransportKind::Shm && same_process {
                Err(format!("{label} is in this process; {} needs two cooperating processes", k.name()))
            } else if k == TransportKind::Mnnvl && peer.fabric_domain != self.fabric_domain() {
                Err(format!("{label} advertises another fabric domain"))
            } else if fabric.is_none() && !ipc_transports::same_boot(&self.identity, &peer.identity) {
                Err(format!(
                    "{label} runs on another host or boot; {} needs the same boot{}",
                    k.name(),
                    if k == TransportKind::Mnnvl {
                        " unless both peers use fabric handles with one nonzero fabric_domain"
                    } else {
                        ""
                    }
                ))
            } else if fabric.is_none() && elsewhere {
                left_out = true;
                Err(format!(
                    "{label} runs in another PID namespace of this host (its process {} is not this namespace's): \
                     {} needs the kernel to identify the process on its channel, which it cannot across PID \
                     namespaces",
                    peer.identity.process.pid,
                    k.name()
                ))
            } else {
                let route = match fabric {
                    Some(d) => Route::Fabric(d),
                    None => Route::Unix(peer.ipc_name.clone()),
                };
                let link = Arc::new(IpcLink::new(
                    k,
                    route,
                    peer.identity,
                    endpoint.to_string(),
                    label.to_string(),
                    LocalEnd {
                        identity: self.identity,
                        auth: self.auth.clone(),
                        faults: self.faults.clone(),
                        reconnect_timeout: Duration::from_millis(self.config.handshake_timeout_ms as u64),
                        log: self.log.clone(),
                    },
                ));
                t.requester.track(&link);
                Ok(link)
            };
            out.push((k, link));
        }
        for (k, why) in &self.ipc_unavailable {
            out.push((*k, Err(format!("this engine: {why}"))));
        }
        if left_out {
            self.note(PID_NAMESPACE_NOTE.into());
        }
        out
    }
}
