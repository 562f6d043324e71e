//! Notifications: [`Engine::notify`] and [`Engine::take_notification`]
//! (the submission that carries one is in `submit`).

use super::Engine;
use crate::error::{Error, Result};
use crate::transport::inbox::{Notification, Taken};
use std::time::{Duration, Instant};

impl Engine {
    /// Sends `msg` to peer `peer` once every request this engine submitted
    /// to it before the call has ended there, and waits (up to `timeout`,
    /// the default timeout when `None`) until the peer queued it.
    /// `RESOURCE_EXHAUSTED`: the peer's queue is full; `INVALID_ARGUMENT`:
    /// larger than `notification_max_bytes` (here or at the peer);
    /// `TIMED_OUT`: not sent (earlier requests still running), or sent and
    /// not answered in time (the message says which).
    pub fn notify(&self, peer: u64, msg: &[u8], timeout: Option<Duration>) -> Result<()> {
        self.check_open()?;
        self.check_notification(msg)?;
        let p = self.peer(peer)?;
        if let Some(e) = p.conn.dead_reason() {
            self.inner.stats.notifications.not_sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Error::from_status(e.status(), format!("peer {peer} is gone: {}", e.message())));
        }
        p.outbox.notify(msg.to_vec(), Instant::now() + self.timeout(timeout))
    }

    /// Takes the oldest notification received, waiting up to `timeout` for
    /// one (`Duration::ZERO`: do not wait). `TIMED_OUT` when none came.
    pub fn take_notification(&self, timeout: Duration) -> Result<Notification> {
        // Every notification fits unbounded buffers.
        self.take_notification_fitting(timeout, usize::MAX, usize::MAX)?
            .map_err(|_| Error::BufferTooSmall("a notification larger than memory".into()))
    }

    /// Takes the oldest notification if its sender's name fits in
    /// `sender_cap` bytes and its message in `msg_cap`; otherwise leaves it
    /// queued and returns their lengths (`Ok(Err((sender_len, msg_len)))`).
    pub(crate) fn take_notification_fitting(
        &self,
        timeout: Duration,
        sender_cap: usize,
        msg_cap: usize,
    ) -> Result<std::result::Result<Notification, (usize, usize)>> {
        self.check_owner()?;
        match self.inner.inbox.take(timeout, |n| n.sender.len() <= sender_cap && n.msg.len() <= msg_cap) {
            Taken::Taken(n) => Ok(Ok(n)),
            Taken::TooSmall { sender_len, msg_len } => Ok(Err((sender_len, msg_len))),
            Taken::Empty => Err(Error::TimedOut(format!("no notification came within {} ms", timeout.as_millis()))),
        }
    }

    /// A message this engine may send: at most `notification_max_bytes`.
    pub(super) fn check_notification(&self, msg: &[u8]) -> Result<()> {
        let most = self.inner.config.notification_max_bytes as usize;
        if msg.len() > most {
            return Err(Error::InvalidArgument(format!(
                "a notification of {} bytes exceeds notification_max_bytes ({most})",
                msg.len()
            )));
        }
        Ok(())
    }
}
