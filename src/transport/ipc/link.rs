//! The requester's IPC link to one source: the channel (connected lazily,
//! with the identity handshake), and the receipt exchange. A channel that
//! fails or times out mid-call cannot be used again (its answers could no
//! longer be matched): when the source provably exited or was replaced the
//! link is dead for good; otherwise (a frozen or briefly unreachable source)
//! a background attempt opens a new channel — a new *generation* — while
//! calls fail fast with `Unavailable` (so submissions fall through instead
//! of blocking). Imports of an older generation are closed through the new
//! channel, whose source accepts their close receipts from the same
//! requester.

use super::alive::AliveView;
use super::board::Board;
use super::channel::{Channel, ChannelIo, Frame};
use super::faults::Faults;
use super::messages::{ExportRef, Hello, Welcome};
use super::pipeline::Pipeline;
use crate::control::auth::{self, AuthKey};
use crate::control::frame::MsgKind;
use crate::control::identity::process_start_time;
use crate::control::message;
use crate::control::Identity;
use crate::error::{Error, Result};
use crate::sync::deadline::{never_stop, Deadline};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a link reaches its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The source's abstract Unix socket (same host).
    Unix(String),
    /// A TCP connection to the source's endpoint carrying the fabric domain
    /// (MNNVL fabric handles; any host of the NVLink partition).
    Fabric([u8; 16]),
}

/// What this engine brings to each of its links: who it is, the shared key
/// its channels prove, its fault-injection switches, and how long one
/// (re)connection attempt may take.
#[derive(Clone)]
pub struct LocalEnd {
    /// This engine's identity (sent in `IpcHello`).
    pub identity: Identity,
    /// The key of `auth_key_file`, if configured.
    pub auth: Option<AuthKey>,
    /// Fault injection (inert unless armed).
    pub faults: Arc<Faults>,
    /// Bound of one background reconnection attempt (the handshake timeout).
    pub reconnect_timeout: Duration,
    /// The engine's log lines (channel lost, re-established, source gone).
    pub log: Arc<crate::log::Logger>,
}

/// Link to one source's IPC channel.
pub struct IpcLink {
    /// How the channel is reached.
    pub route: Route,
    /// The source identity from its Describe.
    pub source: Identity,
    /// Source endpoint (cache key part; shared, so a key costs no copy).
    pub endpoint: std::sync::Arc<str>,
    /// Peer label for messages.
    pub label: String,
    /// The IPC transport this link carries.
    pub transport: crate::kinds::TransportKind,
    local: LocalEnd,
    /// The link's one lock: its channel's state, offer places and board.
    state: Mutex<LinkState>,
    /// The kind of `state.chan` ([`HEALTHY`], [`RECONNECTING`] or
    /// [`DEAD`]), written with it under the lock: a submission asks whether
    /// the link can be used without taking the lock.
    health: AtomicU8,
    /// Signalled when the channel leaves `Connecting`.
    changed: Condvar,
    /// Signalled when an offer place is given back.
    offer_freed: Condvar,
    next_tag: AtomicU64,
    /// Channels opened so far (the current one's number).
    generation: AtomicU64,
    /// A process descriptor of the source (Unix routes on this boot),
    /// opened on the first [`IpcLink::source_exited`].
    source_pidfd: once_cell::sync::OnceCell<Option<std::os::fd::OwnedFd>>,
    /// Why this link's transport can never reach its source (its backend
    /// found so: CMA across users or PID namespaces, or refused by the
    /// kernel); set once.
    refused: once_cell::sync::OnceCell<String>,
    /// The backend's checks before a first channel passed.
    checked: std::sync::atomic::AtomicBool,
}

/// What the link's lock guards; held only to look or change, never
/// across I/O.
struct LinkState {
    chan: ChanState,
    /// Offers this engine is answering on the link (at most
    /// [`OFFERS_MAX`](super::messages::OFFERS_MAX), the source's bound).
    offers: usize,
    /// The grant board the source gave the current channel, with that
    /// channel's generation (Unix channels of sources that offer one).
    board: Option<(u64, Arc<Board>)>,
}

/// [`IpcLink::health`]: not connected, connecting or up.
const HEALTHY: u8 = 0;
/// [`IpcLink::health`]: re-establishing its channel in the background.
const RECONNECTING: u8 = 1;
/// [`IpcLink::health`]: dead for good (final).
const DEAD: u8 = 2;

enum ChanState {
    NotConnected,
    /// One caller opens the channel (no lock held); others wait for it.
    Connecting,
    /// Calls in flight, from any number of threads.
    Up(Arc<Pipeline>),
    /// The channel was lost while the source may still live; a background
    /// attempt opens a new one. `why` says what happened.
    Reconnecting {
        why: Error,
    },
    /// For good: the source exited or its engine was replaced
    /// (`source_left`), or this engine closed the link.
    Dead {
        err: Error,
        source_left: bool,
    },
}

impl IpcLink {
    /// A link (not connected yet).
    pub fn new(
        transport: crate::kinds::TransportKind,
        route: Route,
        source: Identity,
        endpoint: String,
        label: String,
        local: LocalEnd,
    ) -> IpcLink {
        IpcLink {
            route,
            source,
            endpoint: endpoint.into(),
            label,
            transport,
            local,
            state: Mutex::new(LinkState { chan: ChanState::NotConnected, offers: 0, board: None }),
            health: AtomicU8::new(HEALTHY),
            changed: Condvar::new(),
            offer_freed: Condvar::new(),
            next_tag: AtomicU64::new(1),
            generation: AtomicU64::new(0),
            source_pidfd: once_cell::sync::OnceCell::new(),
            refused: once_cell::sync::OnceCell::new(),
            checked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Why this link's transport can never reach its source, once found.
    pub fn refused(&self) -> Option<&str> {
        self.refused.get().map(String::as_str)
    }

    /// Records that this link's transport can never reach its source:
    /// `true` the first time (the caller says so once).
    pub fn refuse(&self, why: String) -> bool {
        self.refused.set(why).is_ok()
    }

    /// Whether the backend's checks before a first channel passed.
    pub fn checked(&self) -> bool {
        self.checked.load(Ordering::Acquire)
    }

    /// Records that the backend's checks before a first channel passed.
    pub fn mark_checked(&self) {
        self.checked.store(true, Ordering::Release);
    }

    /// The grant board of channel generation `generation`, if the source
    /// gave that channel one.
    pub fn board(&self, generation: u64) -> Option<Arc<Board>> {
        self.state.lock().board.as_ref().filter(|(g, _)| *g == generation).map(|(_, b)| b.clone())
    }

    /// A new channel is up: its generation, and the board that came with it.
    fn up(&self, st: &mut LinkState, p: Pipeline, board: Option<Board>) {
        self.set(st, ChanState::Up(Arc::new(p)));
        let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        st.board = board.map(|b| (g, Arc::new(b)));
        self.changed.notify_all();
    }

    /// Takes one of the link's offer places for an export request and
    /// the answer to its offer, waiting for one until `deadline`: the
    /// source refuses a request while that many offers are unanswered.
    pub fn offer_place(&self, deadline: Instant) -> Result<OfferPlace<'_>> {
        let mut st = self.state.lock();
        while st.offers >= super::messages::OFFERS_MAX {
            if self.offer_freed.wait_until(&mut st, deadline).timed_out() && st.offers >= super::messages::OFFERS_MAX {
                return Err(Error::TimedOut(format!(
                    "{}: {} offers of this IPC link were still being answered at the deadline",
                    self.label,
                    super::messages::OFFERS_MAX
                )));
            }
        }
        st.offers += 1;
        Ok(OfferPlace { link: self })
    }

    /// A fresh tag.
    pub fn tag(&self) -> u64 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    /// The current channel's generation (0 before the first connection).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Sets the channel's state and its kind in [`IpcLink::health`].
    fn set(&self, st: &mut LinkState, chan: ChanState) {
        let health = match chan {
            ChanState::Reconnecting { .. } => RECONNECTING,
            ChanState::Dead { .. } => DEAD,
            _ => HEALTHY,
        };
        st.chan = chan;
        self.health.store(health, Ordering::Release);
    }

    /// Why the link cannot be used now: dead for good, or re-establishing
    /// its channel. A healthy link answers without its lock.
    pub fn dead_reason(&self) -> Option<Error> {
        if self.health.load(Ordering::Acquire) == HEALTHY {
            return None;
        }
        match &self.state.lock().chan {
            ChanState::Dead { err, .. } => Some(err.clone()),
            ChanState::Reconnecting { why } => Some(self.reconnecting(why)),
            _ => None,
        }
    }

    /// Whether the link is dead for good (not merely re-establishing).
    pub fn is_dead(&self) -> bool {
        self.health.load(Ordering::Acquire) == DEAD
    }

    /// Whether this engine closed the link (`orbite_disconnect`) while the
    /// source may live: what its imports still owe the source goes out on
    /// the next channel to the same source, if there is one.
    pub fn closed_here(&self) -> bool {
        matches!(&self.state.lock().chan, ChanState::Dead { source_left: false, .. })
    }

    /// Whether the source left for good — its process exited or its engine
    /// is gone (no channel answers under its name): whatever it exported to
    /// this engine went with it, so no receipt is owed.
    pub fn source_left(&self) -> bool {
        matches!(&self.state.lock().chan, ChanState::Dead { source_left: true, .. }) || self.source_gone()
    }

    /// Whether the source process provably exited: it ran on this boot (a
    /// Unix channel) and its pid now belongs to no process, or to another
    /// one. A fabric channel's source can never be proven gone.
    pub fn source_gone(&self) -> bool {
        matches!(self.route, Route::Unix(_))
            && self.source.same_boot(&self.local.identity)
            && process_start_time(self.source.process.pid) != self.source.process.start_time
    }

    /// [`IpcLink::source_gone`], asked cheaply enough for every group: one
    /// poll of a process descriptor of the source, opened on first use
    /// (without one, the source is gone already or the kernel has none:
    /// `source_gone` answers).
    pub fn source_exited(&self) -> bool {
        // Defence in depth: engines make Unix links to sources of this boot
        // only (`ipc_links` in engine/peers.rs); link_tests.rs checks it.
        if !matches!(self.route, Route::Unix(_)) || !self.source.same_boot(&self.local.identity) {
            return false;
        }
        match self.source_pidfd.get_or_init(|| super::exit_watch::open_pidfd(&self.source.process)) {
            Some(fd) => super::exit_watch::pidfd_exited(fd),
            None => self.source_gone(),
        }
    }

    fn reconnecting(&self, why: &Error) -> Error {
        Error::Unavailable(format!("{}: the IPC channel is being re-established after: {}", self.label, why.message()))
    }

    /// Whether a failure leaves the link dead for good.
    fn permanent(&self, e: &Error) -> bool {
        e.status() == crate::error::Status::StalePeer || self.source_gone()
    }

    fn gone(&self) -> Error {
        Error::Unavailable(format!(
            "{}: the source process {} exited; its imports are released",
            self.label, self.source.process.pid
        ))
    }

    fn connect(&self, deadline: Instant) -> Result<(Pipeline, Option<Board>)> {
        let (mut c, fabric_domain) = match &self.route {
            Route::Unix(name) => (Channel::connect_until(name, deadline)?, [0; 16]),
            Route::Fabric(domain) => (Channel::connect_tcp(&self.endpoint, deadline)?, *domain),
        };
        if let Route::Unix(name) = &self.route {
            // The kernel says who holds the other end: the source process
            // its Describe named, or a process sitting on its channel's
            // name (another network namespace's, or one that took it)
            // that would otherwise be handed every frame, and with them
            // the memory's handles. Nothing is sent to it.
            let (pid, _) = c.peer_cred()?;
            if pid != self.source.process.pid {
                return Err(Error::PermissionDenied(format!(
                    "{}: the IPC channel {name} is held by process {pid}, not by the source's process {}",
                    self.label, self.source.process.pid
                )));
            }
        }
        if let Some(key) = &self.local.auth {
            let mut io = ChannelIo { ch: &mut c, bound: Deadline { at: deadline, stop: &never_stop } };
            // A fabric channel is sealed: both ends must seal alike.
            let sealed = io.ch.is_tcp();
            let keys = auth::connect(&mut io, key, &self.label, sealed)?;
            // A fabric channel crosses a network: from here on its frames
            // travel sealed under this session's keys (a Unix channel's
            // ends are joined by the kernel and stay as they are).
            if c.is_tcp() {
                c.seal(keys.split())?;
            }
        }
        let hello = Hello {
            identity: self.local.identity,
            expected_source_epoch: self.source.engine_epoch,
            transport: self.transport as u32,
            fabric_domain,
        };
        let f = c.call(MsgKind::IpcHello, &hello.encode(), deadline, "IPC handshake")?;
        match f.kind {
            MsgKind::IpcWelcome => {
                let w = Welcome::decode(&f.body)?;
                if w.identity != self.source {
                    let (got, want) = (&w.identity, &self.source);
                    return Err(Error::StalePeer(format!(
                        "{}: the IPC channel belongs to another engine (epoch {:x} of pid {} started at {}{}, \
                         expected epoch {:x} of pid {} started at {})",
                        self.label,
                        got.engine_epoch,
                        got.process.pid,
                        got.process.start_time,
                        if got.boot_id != want.boot_id { " in another boot" } else { "" },
                        want.engine_epoch,
                        want.process.pid,
                        want.process.start_time
                    )));
                }
                // A board the source offers with its Welcome: used when it is
                // what it claims, otherwise the channel works without one.
                // With it, the source's liveness page tells whether it lives.
                let alive = f.second_fd.and_then(|fd| AliveView::map(fd).ok());
                let board = f.fd.and_then(|fd| Board::map(fd).ok()).map(|b| b.watch(c.watch_fd(), alive));
                Ok((Pipeline::new(c)?, board))
            }
            MsgKind::ExportReject => Err(super::messages::decode_reject(&f.body)?.1),
            MsgKind::Error => {
                let (st, text) = message::decode_error(&f.body)?;
                Err(Error::from_status(st, format!("{}: the IPC channel was refused: {text}", self.label)))
            }
            other => Err(Error::Protocol(format!("IPC handshake answered with {other:?}"))),
        }
    }

    /// Sends one request and returns the answer, connecting first if
    /// needed; other threads' calls to the same source go on meanwhile. A
    /// channel failure ends the channel: the link is dead for good when
    /// the source provably left, otherwise a background attempt opens a
    /// new channel and calls fail fast with `Unavailable` meanwhile.
    pub fn call(self: &Arc<Self>, kind: MsgKind, body: &[u8], deadline: Instant, what: &str) -> Result<Frame> {
        let p = self.pipeline(deadline)?;
        let got = match p.call(kind, body, deadline, what) {
            Ok(f) if f.kind == MsgKind::ExportHandle && Faults::take(&self.local.faults.lose_handle) => {
                Err(Error::Unavailable("the channel broke as the export handle arrived (injected)".into()))
            }
            Ok(f) if f.kind == MsgKind::Ack && Faults::take(&self.local.faults.break_at_ack) => {
                Err(Error::Unavailable("the channel broke as a receipt's acknowledgement arrived (injected)".into()))
            }
            got => got,
        };
        got.map_err(|e| {
            let e = match e {
                Error::TimedOut(m) => Error::TimedOut(format!("{}: {m}", self.label)),
                Error::Unavailable(m) => Error::Unavailable(format!("{}: {m}", self.label)),
                other => other,
            };
            let shown = if self.permanent(&e) && self.source_gone() { self.gone() } else { e };
            let mut st = self.state.lock();
            // The first call to fail on this channel retires it.
            if matches!(&st.chan, ChanState::Up(cur) if Arc::ptr_eq(cur, &p)) {
                p.shutdown();
                self.lost(&mut st, shown.clone());
            }
            shown
        })
    }

    /// The channel's calls, once it is up: opened here (under no lock) by
    /// the first caller, waited for by the others until `deadline`.
    fn pipeline(self: &Arc<Self>, deadline: Instant) -> Result<Arc<Pipeline>> {
        let mut st = self.state.lock();
        loop {
            match &st.chan {
                ChanState::Up(p) => return Ok(p.clone()),
                ChanState::Dead { err, .. } => return Err(err.clone()),
                ChanState::Reconnecting { why } => return Err(self.reconnecting(why)),
                ChanState::Connecting => {
                    let waited = self.changed.wait_until(&mut st, deadline);
                    if waited.timed_out() && matches!(st.chan, ChanState::Connecting) {
                        return Err(Error::TimedOut(format!(
                            "{}: the IPC channel was still being opened at the deadline",
                            self.label
                        )));
                    }
                }
                ChanState::NotConnected => {
                    self.set(&mut st, ChanState::Connecting);
                    let attempt = MutexGuard::unlocked(&mut st, || self.connect(deadline));
                    let still_ours = matches!(st.chan, ChanState::Connecting);
                    match attempt {
                        Ok((p, board)) if still_ours => self.up(&mut st, p, board),
                        // Closed meanwhile: the new channel is not wanted.
                        Ok((p, _)) => p.shutdown(),
                        Err(e) => {
                            if still_ours {
                                self.lost(&mut st, e.clone());
                            }
                            self.changed.notify_all();
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// The channel is gone: dead for good, or re-established in the
    /// background.
    fn lost(self: &Arc<Self>, st: &mut LinkState, e: Error) {
        if self.refused().is_some() {
            // Nothing to re-establish: no channel of this link can reach
            // the source (nothing was exported through it either).
            self.set(st, ChanState::Dead { err: e, source_left: false });
            return;
        }
        if self.permanent(&e) {
            self.local.log.warn(format_args!("{}: {} link dead for good: {}", self.label, self.transport.name(), e));
            self.set(st, ChanState::Dead { err: e, source_left: true });
            return;
        }
        self.local.log.warn(format_args!(
            "{}: {} channel lost, re-establishing it in the background: {}",
            self.label,
            self.transport.name(),
            e
        ));
        self.set(st, ChanState::Reconnecting { why: e });
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("orbite-ipc-reconnect".into()).spawn(move || me.reconnect());
        if let Err(e) = spawned {
            let err = Error::Unavailable(format!("{}: cannot start reconnecting: {e}", self.label));
            self.set(st, ChanState::Dead { err, source_left: false });
        }
    }

    /// Opens a new channel while the link is re-establishing: attempts
    /// bounded by the handshake timeout, backing off between them, until
    /// one succeeds, the source provably left, or the link is closed.
    fn reconnect(self: Arc<Self>) {
        let mut pause = Duration::from_millis(20);
        loop {
            let attempt = self.connect(Instant::now() + self.local.reconnect_timeout);
            let mut st = self.state.lock();
            if !matches!(st.chan, ChanState::Reconnecting { .. }) {
                // Closed meanwhile: the new channel is not wanted.
                if let Ok((p, _)) = attempt {
                    p.shutdown();
                }
                return;
            }
            match attempt {
                Ok((p, board)) => {
                    self.up(&mut st, p, board);
                    self.local.log.info(format_args!(
                        "{}: {} channel re-established",
                        self.label,
                        self.transport.name()
                    ));
                    return;
                }
                Err(e) if self.refused().is_some() => {
                    self.set(&mut st, ChanState::Dead { err: e, source_left: false });
                    self.changed.notify_all();
                    return;
                }
                Err(e) if self.permanent(&e) => {
                    self.local.log.warn(format_args!(
                        "{}: {} link dead for good: {}",
                        self.label,
                        self.transport.name(),
                        e
                    ));
                    let err = if self.source_gone() { self.gone() } else { e };
                    self.set(&mut st, ChanState::Dead { err, source_left: true });
                    self.changed.notify_all();
                    return;
                }
                Err(e) => {
                    // An attempt that waited out its whole bound met a
                    // source that is frozen, not one that refuses: try
                    // again at once, so that the channel is up as soon as
                    // it runs again. Fast failures back off.
                    if e.status() == crate::error::Status::TimedOut {
                        pause = Duration::from_millis(20);
                    }
                    self.set(&mut st, ChanState::Reconnecting { why: e })
                }
            }
            drop(st);
            // Back-off between attempts of a background retry (not a wait
            // for another thread).
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Waits until the channel is no longer being re-established in the
    /// background (it is up again, or the link is dead or closed), or until
    /// `deadline`: what a flush owes a source through a channel lost a
    /// moment ago gets the time its deadline allows.
    pub fn settle_reconnect(&self, deadline: Instant) {
        let mut st = self.state.lock();
        while matches!(st.chan, ChanState::Reconnecting { .. }) {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return;
            }
        }
    }

    /// Sends a receipt (OpComplete or CloseReceipt) and waits for its ACK.
    /// A lost ACK permits one receipt-only retry; nothing else is retried.
    pub fn receipt(self: &Arc<Self>, kind: MsgKind, r: &ExportRef, deadline: Instant) -> Result<()> {
        let mut last = None;
        for _attempt in 0..2 {
            let f = self.call(kind, &r.encode(), deadline, "receipt")?;
            match f.kind {
                MsgKind::Ack => {
                    let a = ExportRef::decode(&f.body, "Ack")?;
                    if a.export_id != r.export_id || a.token != r.token || a.extra != kind as u32 {
                        return Err(Error::Protocol(format!("ACK for another receipt ({a:?})")));
                    }
                    if Faults::take(&self.local.faults.lose_ack) {
                        last = Some(Error::Unavailable(format!("{}: receipt acknowledgement lost", self.label)));
                        continue;
                    }
                    return Ok(());
                }
                MsgKind::ExportReject => return Err(super::messages::decode_reject(&f.body)?.1),
                other => return Err(Error::Protocol(format!("receipt answered with {other:?}"))),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unavailable("receipt not acknowledged".into())))
    }

    /// Closes the channel for good (requester close); a background
    /// reconnection stops.
    pub fn close(&self) {
        let mut st = self.state.lock();
        if let ChanState::Up(p) = &st.chan {
            p.shutdown();
        }
        let err = Error::Unavailable(format!("{}: IPC link closed by this engine", self.label));
        self.set(&mut st, ChanState::Dead { err, source_left: false });
        self.changed.notify_all();
    }
}

/// One of a link's offer places, given back when dropped.
pub struct OfferPlace<'a> {
    link: &'a IpcLink,
}

impl Drop for OfferPlace<'_> {
    fn drop(&mut self) {
        self.link.state.lock().offers -= 1;
        self.link.offer_freed.notify_one();
    }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
