//! The requester's IPC link to one source: the channel (connected lazily,
//! with the identity handshake), and the receipt exchange. A channel that
//! fails or times out mid-call is dead: its answers can no longer be
//! matched, so the link refuses further calls.

use super::channel::{Channel, ChannelIo, Frame};
use super::faults::Faults;
use super::messages::{ExportRef, Hello, Welcome};
use crate::control::auth::{self, AuthKey};
use crate::control::frame::MsgKind;
use crate::control::message;
use crate::control::Identity;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
/// its channels prove, and its fault-injection switches.
#[derive(Clone)]
pub struct LocalEnd {
    /// This engine's identity (sent in `IpcHello`).
    pub identity: Identity,
    /// The key of `auth_key_file`, if configured.
    pub auth: Option<AuthKey>,
    /// Fault injection (inert unless armed).
    pub faults: Arc<Faults>,
}

/// Link to one source's IPC channel.
pub struct IpcLink {
    /// How the channel is reached.
    pub route: Route,
    /// The source identity from its Describe.
    pub source: Identity,
    /// Source endpoint (cache key part).
    pub endpoint: String,
    /// Peer label for messages.
    pub label: String,
    /// The IPC transport this link carries.
    pub transport: crate::kinds::TransportKind,
    local: LocalEnd,
    chan: Mutex<ChanState>,
    next_tag: AtomicU64,
}

enum ChanState {
    NotConnected,
    Up(Channel),
    Dead(Error),
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
            endpoint,
            label,
            transport,
            local,
            chan: Mutex::new(ChanState::NotConnected),
            next_tag: AtomicU64::new(1),
        }
    }

    /// A fresh tag.
    pub fn tag(&self) -> u64 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    /// Why the link is dead, if it is.
    pub fn dead_reason(&self) -> Option<Error> {
        match &*self.chan.lock() {
            ChanState::Dead(e) => Some(e.clone()),
            _ => None,
        }
    }

    fn connect(&self, deadline: Instant) -> Result<Channel> {
        let (mut c, fabric_domain) = match &self.route {
            Route::Unix(name) => (Channel::connect(name)?, [0; 16]),
            Route::Fabric(domain) => (Channel::connect_tcp(&self.endpoint, deadline)?, *domain),
        };
        if let Some(key) = &self.local.auth {
            let mut io = ChannelIo { ch: &mut c, deadline, stop: &|| Ok(()) };
            auth::connect(&mut io, key, &self.label)?;
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
                    return Err(Error::StalePeer(format!(
                        "{}: the IPC channel belongs to another engine (epoch {:x}, expected {:x})",
                        self.label, w.identity.engine_epoch, self.source.engine_epoch
                    )));
                }
                Ok(c)
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
    /// needed. Any channel failure kills the link.
    pub fn call(&self, kind: MsgKind, body: &[u8], deadline: Instant, what: &str) -> Result<Frame> {
        let mut st = self.chan.lock();
        if let ChanState::NotConnected = *st {
            match self.connect(deadline) {
                Ok(c) => *st = ChanState::Up(c),
                Err(e) => {
                    *st = ChanState::Dead(e.clone());
                    return Err(e);
                }
            }
        }
        let r = match &mut *st {
            ChanState::Up(c) => c.call(kind, body, deadline, what),
            ChanState::Dead(e) => return Err(e.clone()),
            ChanState::NotConnected => unreachable!("connected above"),
        };
        match r {
            Ok(f) => Ok(f),
            Err(e) => {
                let e = match e {
                    Error::TimedOut(m) => Error::TimedOut(format!("{}: {m}", self.label)),
                    Error::Unavailable(m) => Error::Unavailable(format!("{}: {m}", self.label)),
                    other => other,
                };
                if let ChanState::Up(c) = &*st {
                    c.shutdown();
                }
                *st = ChanState::Dead(e.clone());
                Err(e)
            }
        }
    }

    /// Sends a receipt (OpComplete or CloseReceipt) and waits for its ACK.
    /// A lost ACK permits one receipt-only retry; nothing else is retried.
    pub fn receipt(&self, kind: MsgKind, r: &ExportRef, deadline: Instant) -> Result<()> {
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

    /// Closes the channel (requester close).
    pub fn close(&self) {
        let mut st = self.chan.lock();
        if let ChanState::Up(c) = &*st {
            c.shutdown();
        }
        *st = ChanState::Dead(Error::Unavailable(format!("{}: IPC link closed by this engine", self.label)));
    }
}
