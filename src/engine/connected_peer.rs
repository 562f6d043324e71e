//! One connected peer: its control connection and one IPC link per IPC
//! transport (or why that transport cannot reach it).

use crate::kinds::TransportKind;
use crate::transport::ipc::link::IpcLink;
use crate::transport::tcp::outbox::Outbox;
use crate::transport::tcp::TcpConnection;
use std::sync::Arc;

/// A connected peer.
pub(crate) struct Peer {
    /// The endpoint it was connected with.
    pub(super) endpoint: String,
    /// The control connection (and the TCP transport).
    pub(super) conn: Arc<TcpConnection>,
    /// One IPC link per IPC transport, or why it cannot be used with this peer.
    pub(super) links: Vec<(TransportKind, std::result::Result<Arc<IpcLink>, String>)>,
    /// Notifications for the peer, sent once the requests before them ended.
    pub(super) outbox: Arc<Outbox>,
}

impl Peer {
    pub(super) fn link(&self, kind: TransportKind) -> std::result::Result<Arc<IpcLink>, String> {
        self.links
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| Err(format!("{} is not an IPC transport", kind.name())))
    }

    pub(super) fn close_links(&self) {
        for (_, l) in &self.links {
            if let Ok(l) = l {
                l.close();
            }
        }
    }
}
