//! The etcd client (feature `etcd`): one thread runs a single-threaded
//! tokio runtime with the gRPC client; the engine talks to it through a
//! command queue and never waits on it longer than its own deadline.
//!
//! The thread keeps the lease alive (every third of its TTL), watches every
//! engine key under the prefix, answers lookups, and when etcd is out of
//! reach keeps trying each period (existing connections between engines do
//! not depend on it). When it is back, a lease that expired meanwhile is
//! granted again and the name claimed again, and the watched names are
//! checked again (a peer that left during the outage is reported then).

use super::record::{unreachable, DiscoveryConfig, DiscoveryStats, OnGone, Record};
use crate::control::auth::AuthKey;
use crate::control::identity::process_alive;
use crate::error::{Error, Result};
use etcd_client::{
    Compare, CompareOp, ConnectOptions, EventType, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions, WatchResponse, WatchStream,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A request to the client thread.
enum Cmd {
    Resolve(String, std::sync::mpsc::Sender<Result<Option<Record>>>),
    Watch(String, u64, OnGone),
    Close(Instant, std::sync::mpsc::Sender<()>),
}

/// The engine's handle on the client thread.
pub struct Client {
    cmds: mpsc::UnboundedSender<Cmd>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    stats: Arc<Mutex<DiscoveryStats>>,
    cfg: DiscoveryConfig,
}

impl Client {
    /// Starts the thread, which connects and claims the name; returns once
    /// it did, or why not.
    pub fn start(cfg: DiscoveryConfig, me: Record, key: Option<AuthKey>, deadline: Instant) -> Result<Client> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stats = Arc::new(Mutex::new(DiscoveryStats { enabled: true, ..Default::default() }));
        let (c, s) = (cfg.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("orbite-discovery".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::io("starting the discovery runtime", &e)));
                        return;
                    }
                };
                rt.block_on(run(c, Me { record: me, key }, deadline, rx, ready_tx, s));
            })
            .map_err(|e| Error::io("spawn the discovery thread", &e))?;
        // The thread gives up by the deadline itself; the margin covers its
        // last attempt.
        let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(3);
        match ready_rx.recv_timeout(wait) {
            Ok(Ok(())) => Ok(Client { cmds: tx, thread: Mutex::new(Some(thread)), stats, cfg }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(unreachable(&cfg, "no answer before the deadline")),
        }
    }

    /// Looks `name` up.
    pub fn resolve(&self, name: &str, deadline: Instant) -> Result<Option<Record>> {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.cmds.send(Cmd::Resolve(name.to_string(), tx)).is_err() {
            return Err(Error::Unavailable("discovery is closed".into()));
        }
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(_) => Err(unreachable(&self.cfg, "no answer before the deadline")),
        }
    }

    /// Watches `name` at `epoch`.
    pub fn watch(&self, name: &str, epoch: u64, on_gone: OnGone) {
        let _ = self.cmds.send(Cmd::Watch(name.to_string(), epoch, on_gone));
    }

    /// Revokes the lease and stops the thread.
    pub fn close(&self, deadline: Instant) {
        let Some(t) = self.thread.lock().take() else { return };
        let (tx, rx) = std::sync::mpsc::channel();
        if self.cmds.send(Cmd::Close(deadline, tx)).is_ok()
            && rx.recv_timeout(deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1)).is_ok()
        {
            let _ = t.join();
        }
        self.stats.lock().connected = false;
    }

    /// Its counters.
    pub fn stats(&self) -> DiscoveryStats {
        self.stats.lock().clone()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close(Instant::now() + Duration::from_secs(2));
    }
}

/// What woke the client thread.
enum Event {
    Cmd(Option<Cmd>),
    Tick,
    Watch(std::result::Result<Option<WatchResponse>, etcd_client::Error>),
}

/// This engine as discovery knows it: its record, and the key that signs
/// it and every record it follows.
struct Me {
    record: Record,
    key: Option<AuthKey>,
}

/// What is stored under a name.
enum Found {
    Absent,
    Valid(Record),
    /// A value that is not a valid record: ignored.
    Invalid,
}

impl Found {
    /// The record under the name, if a valid one.
    fn record(self) -> Option<Record> {
        match self {
            Found::Valid(r) => Some(r),
            _ => None,
        }
    }
}

/// The client thread's state.
struct State {
    cfg: DiscoveryConfig,
    me: Me,
    client: etcd_client::Client,
    lease: i64,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// Watched peers by name: (the epoch connected to, what to call).
    watched: HashMap<String, Vec<(u64, OnGone)>>,
    stats: Arc<Mutex<DiscoveryStats>>,
    /// The period of keep-alives and retries.
    period: Duration,
}

fn options(period: Duration) -> ConnectOptions {
    ConnectOptions::new().with_connect_timeout(period.max(Duration::from_millis(500))).with_timeout(period * 2)
}

async fn run(
    cfg: DiscoveryConfig,
    me: Me,
    deadline: Instant,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ready: std::sync::mpsc::Sender<Result<()>>,
    stats: Arc<Mutex<DiscoveryStats>>,
) {
    let period = Duration::from_millis((cfg.ttl_s as u64 * 1000 / 3).max(100));
    // Connect and claim the name, retrying (etcd may be starting) until the
    // deadline; a name another live engine holds is final.
    let mut last = String::from("no attempt before the deadline");
    let mut st = loop {
        if Instant::now() >= deadline {
            let _ = ready.send(Err(unreachable(&cfg, &last)));
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = tokio::time::timeout(left, connect_and_claim(&cfg, &me, period)).await;
        match attempt.unwrap_or_else(|_| Err(unreachable(&cfg, "no answer before the deadline"))) {
            Ok((client, lease)) => {
                break State { cfg, me, client, lease, keeper: None, watched: HashMap::new(), stats, period }
            }
            Err(e @ Error::InvalidConfig(_)) => {
                let _ = ready.send(Err(e));
                return;
            }
            Err(e) => last = e.message().to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    st.stats.lock().connected = true;
    let _ = ready.send(Ok(()));
    let mut watch = st.open_watch().await;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            c = cmds.recv() => Event::Cmd(c),
            _ = tick.tick() => Event::Tick,
            r = next(&mut watch) => Event::Watch(r),
        };
        match ev {
            Event::Cmd(None) => {
                st.revoke(Instant::now() + Duration::from_secs(2)).await;
                return;
            }
            Event::Cmd(Some(Cmd::Close(until, reply))) => {
                st.revoke(until).await;
                let _ = reply.send(());
                return;
            }
            Event::Cmd(Some(Cmd::Resolve(name, reply))) => {
                let _ = reply.send(st.get(&name).await.map(Found::record));
            }
            Event::Cmd(Some(Cmd::Watch(name, epoch, f))) => {
                st.watched.entry(name.clone()).or_default().push((epoch, f));
                // It may have gone between the lookup and now.
                if let Ok(current) = st.get(&name).await {
                    st.check_found(&name, current);
                }
                st.count_watched();
            }
            Event::Tick => {
                let alive = st.keep_alive().await;
                if alive && watch.is_none() {
                    watch = st.open_watch().await;
                    if watch.is_some() {
                        st.recheck().await;
                    }
                }
            }
            Event::Watch(Ok(Some(resp))) if !resp.canceled() => st.on_events(&resp),
            Event::Watch(_) => {
                watch = None;
                st.failed();
            }
        }
    }
}

/// The next watch response (never, without a watch).
async fn next(w: &mut Option<WatchStream>) -> std::result::Result<Option<WatchResponse>, etcd_client::Error> {
    match w {
        Some(s) => s.message().await,
        None => std::future::pending().await,
    }
}

/// Connects and claims `me.name` under a new lease.
async fn connect_and_claim(cfg: &DiscoveryConfig, me: &Me, period: Duration) -> Result<(etcd_client::Client, i64)> {
    let mut client = etcd_client::Client::connect(&cfg.etcd, Some(options(period)))
        .await
        .map_err(|e| unreachable(cfg, &e.to_string()))?;
    let lease = claim(&mut client, cfg, me).await?;
    Ok((client, lease))
}

/// Grants a lease and puts `me` under it if no engine holds the name: one
/// transaction. `INVALID_CONFIG` naming the holder otherwise.
async fn claim(client: &mut etcd_client::Client, cfg: &DiscoveryConfig, me: &Me) -> Result<i64> {
    let lease = client.lease_grant(cfg.ttl_s as i64, None).await.map_err(|e| unreachable(cfg, &e.to_string()))?.id();
    let key = cfg.key(&me.record.name);
    let value = cfg.store(&me.record, me.key.as_ref());
    let txn = Txn::new()
        .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then(vec![TxnOp::put(key.clone(), value.clone(), Some(PutOptions::new().with_lease(lease)))])
        .or_else(vec![TxnOp::get(key.clone(), None)]);
    let resp = client.txn(txn).await.map_err(|e| unreachable(cfg, &e.to_string()))?;
    if resp.succeeded() {
        return Ok(lease);
    }
    let held = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => {
            g.kvs().first().map(|kv| (kv.mod_revision(), cfg.read(&me.record.name, kv.value(), me.key.as_ref())))
        }
        _ => None,
    });
    // The holder provably no longer exists (it crashed; its lease has not
    // expired yet): take the name over, in one transaction that fails if
    // the key changed meanwhile.
    if let Some((rev, Ok(h))) = &held {
        if provably_gone(h, &me.record) {
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)])
                .and_then(vec![TxnOp::put(key.clone(), value, Some(PutOptions::new().with_lease(lease)))]);
            let resp = client.txn(txn).await.map_err(|e| unreachable(cfg, &e.to_string()))?;
            if resp.succeeded() {
                return Ok(lease);
            }
        }
    }
    let _ = client.lease_revoke(lease).await;
    let name = &me.record.name;
    Err(Error::InvalidConfig(match held {
        Some((_, Ok(h))) => format!(
            "key `name`: {name:?} is held by the live engine at {} (pid {}, epoch {:x}) under {key}",
            h.endpoint, h.pid, h.epoch
        ),
        Some((_, Err(why))) => format!(
            "key `name`: {name:?} is taken under {key} by a value that is not a valid record ({why}); it frees \
             when its lease expires, or remove it"
        ),
        None => format!("key `name`: {name:?} is taken under {key}"),
    }))
}

/// Whether holder `h` is provably gone from where `me` stands: it ran on
/// this boot in this PID namespace (its pid means what it says here) and
/// that process no longer exists. A holder of another namespace, or one
/// whose namespace is unknown, is never presumed gone: its lease frees the
/// name when it really stopped.
fn provably_gone(h: &Record, me: &Record) -> bool {
    h.boot_id == me.boot_id && h.pid_ns != 0 && h.pid_ns == me.pid_ns && !process_alive(h.pid)
}

impl State {
    /// Looks a name up; a value that is not a valid record is counted.
    async fn get(&mut self, name: &str) -> Result<Found> {
        let r = self.client.get(self.cfg.key(name), None).await.map_err(|e| unreachable(&self.cfg, &e.to_string()))?;
        Ok(match r.kvs().first() {
            None => Found::Absent,
            Some(kv) => self.read(name, kv.value()),
        })
    }

    /// The value stored under `name`, read with this engine's key (an
    /// invalid one counted: also a record of another name, or one signed
    /// for another key of etcd).
    fn read(&self, name: &str, value: &[u8]) -> Found {
        match self.cfg.read(name, value, self.me.key.as_ref()) {
            Ok(r) => Found::Valid(r),
            Err(_) => {
                self.stats.lock().invalid_records += 1;
                Found::Invalid
            }
        }
    }

    /// Puts this engine's record back when its key vanished or was
    /// overwritten while its lease lives (by hand, or by anyone who can
    /// write to etcd): it is alive, so the name is its own. One transaction
    /// that fails if the key changed again meanwhile.
    async fn hold(&mut self) {
        let key = self.cfg.key(&self.me.record.name);
        let Ok(r) = self.client.get(key.clone(), None).await else {
            self.failed();
            return;
        };
        let (lease, epoch) = (self.lease, self.me.record.epoch);
        let unchanged = match r.kvs().first() {
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Some(kv) => {
                let ours = kv.lease() == lease
                    && self
                        .cfg
                        .read(&self.me.record.name, kv.value(), self.me.key.as_ref())
                        .is_ok_and(|h| h.epoch == epoch);
                if ours {
                    return;
                }
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision())
            }
        };
        let value = self.cfg.store(&self.me.record, self.me.key.as_ref());
        let txn = Txn::new().when(vec![unchanged]).and_then(vec![TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )]);
        match self.client.txn(txn).await {
            Ok(resp) if resp.succeeded() => self.stats.lock().reclaims += 1,
            Ok(_) => {}
            Err(_) => self.failed(),
        }
    }

    /// Watches every engine key.
    async fn open_watch(&mut self) -> Option<WatchStream> {
        let opts = WatchOptions::new().with_prefix();
        match self.client.watch(self.cfg.engines_prefix(), Some(opts)).await {
            Ok(w) => Some(w),
            Err(_) => {
                self.failed();
                None
            }
        }
    }

    /// Keeps the lease alive; claims the name again under a new lease when
    /// it expired meanwhile. False while etcd is out of reach.
    async fn keep_alive(&mut self) -> bool {
        let period = self.period;
        let r = tokio::time::timeout(period * 2, async {
            if self.keeper.is_none() {
                self.keeper = Some(self.client.lease_keep_alive(self.lease).await?);
            }
            let (keeper, stream) = self.keeper.as_mut().expect("set");
            keeper.keep_alive().await?;
            Ok::<_, etcd_client::Error>(stream.message().await?.map_or(0, |m| m.ttl()))
        })
        .await;
        let ttl = match r {
            Ok(Ok(ttl)) => ttl,
            _ => {
                self.keeper = None;
                self.failed();
                return false;
            }
        };
        self.back();
        if ttl <= 0 {
            // The lease expired while etcd was out of reach: the key went
            // with it. Claim the name again.
            self.keeper = None;
            match claim(&mut self.client, &self.cfg, &self.me).await {
                Ok(lease) => {
                    self.lease = lease;
                    self.stats.lock().reregistrations += 1;
                }
                Err(_) => self.failed(),
            }
        } else {
            self.hold().await;
        }
        true
    }

    /// Reports peers whose key went or changed.
    fn on_events(&mut self, resp: &WatchResponse) {
        let prefix = self.cfg.engines_prefix();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let Some(name) = kv.key().strip_prefix(prefix.as_bytes()) else { continue };
            let name = String::from_utf8_lossy(name).into_owned();
            let found = match ev.event_type() {
                EventType::Delete => Found::Absent,
                EventType::Put => self.read(&name, kv.value()),
            };
            self.check_found(&name, found);
        }
        self.count_watched();
    }

    /// `name` now holds `found`: a valid record or none is news for its
    /// watchers; a value that is not a valid record is ignored (whoever
    /// wrote it cannot retire a peer).
    fn check_found(&mut self, name: &str, found: Found) {
        match found {
            Found::Absent => self.check(name, None),
            Found::Valid(r) => self.check(name, Some(r.epoch)),
            Found::Invalid => {}
        }
    }

    /// `name` now has `epoch` (`None`: no key): the watchers of another
    /// epoch hear that their peer is gone.
    fn check(&mut self, name: &str, epoch: Option<u64>) {
        let Some(list) = self.watched.get_mut(name) else { return };
        let (gone, kept): (Vec<_>, Vec<_>) = list.drain(..).partition(|(e, _)| Some(*e) != epoch);
        *list = kept;
        if list.is_empty() {
            self.watched.remove(name);
        }
        for (e, f) in gone {
            let why = match epoch {
                None => format!(
                    "engine {name:?} (epoch {e:x}) left discovery: its key is gone (closed, or its lease expired)"
                ),
                Some(now) => format!("engine {name:?} (epoch {e:x}) was replaced in discovery by epoch {now:x}"),
            };
            self.stats.lock().peers_gone += 1;
            f(why);
        }
    }

    /// Checks every watched name again (after an outage).
    async fn recheck(&mut self) {
        let names: Vec<String> = self.watched.keys().cloned().collect();
        for name in names {
            if let Ok(current) = self.get(&name).await {
                self.check_found(&name, current);
            }
        }
        self.count_watched();
    }

    fn count_watched(&self) {
        self.stats.lock().watched = self.watched.values().map(|v| v.len() as u64).sum();
    }

    fn failed(&self) {
        let mut s = self.stats.lock();
        s.failures += 1;
        s.connected = false;
    }

    fn back(&self) {
        let mut s = self.stats.lock();
        if !s.connected {
            s.connected = true;
            s.reconnects += 1;
        }
    }

    /// Revokes the lease (the key goes with it), until `until` at most.
    async fn revoke(&mut self, until: Instant) {
        let wait = until.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(wait, self.client.lease_revoke(self.lease)).await;
    }
}
