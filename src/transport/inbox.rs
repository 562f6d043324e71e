//! Notifications, receiver side: the bounded queue ([`Inbox`]) where a
//! peer's notifications wait to be taken.

use crate::counters::Counters;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A notification as the receiver takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's name, or its endpoint when it has none.
    pub sender: String,
    /// The message.
    pub msg: Vec<u8>,
}

/// What [`Inbox::take`] found.
#[derive(Debug)]
pub enum Taken {
    /// The oldest notification, now out of the queue.
    Taken(Notification),
    /// The oldest notification does not fit the caller's buffers: it stays
    /// queued. Its sender's length and its message's.
    TooSmall {
        /// Bytes of the sender's name.
        sender_len: usize,
        /// Bytes of the message.
        msg_len: usize,
    },
    /// None came in time.
    Empty,
}

/// The receiver's queue: at most `capacity` notifications of at most
/// `max_bytes` each, so a peer cannot make it hold more.
pub struct Inbox {
    queue: Mutex<Slots>,
    arrived: Condvar,
    capacity: usize,
    max_bytes: usize,
    stats: Arc<Counters>,
}

/// What the queue holds: the notifications waiting to be taken, and the
/// places held by admitted ones not yet published.
#[derive(Default)]
struct Slots {
    waiting: VecDeque<Notification>,
    held: usize,
}

/// A notification admitted into an [`Inbox`], not yet visible.
pub struct Admitted {
    inbox: Arc<Inbox>,
    n: Option<Notification>,
}

impl Admitted {
    /// Makes it visible to [`Inbox::take`].
    pub fn publish(mut self) {
        let n = self.n.take().expect("published once");
        let inbox = &self.inbox;
        let mut q = inbox.queue.lock();
        q.held -= 1;
        q.waiting.push_back(n);
        drop(q);
        inbox.stats.notifications.received.fetch_add(1, Ordering::Relaxed);
        inbox.arrived.notify_one();
    }
}

impl Drop for Admitted {
    /// Not published: its place goes back.
    fn drop(&mut self) {
        if self.n.is_some() {
            self.inbox.queue.lock().held -= 1;
        }
    }
}

impl Inbox {
    /// An empty queue.
    pub fn new(capacity: usize, max_bytes: usize, stats: Arc<Counters>) -> Inbox {
        Inbox { queue: Mutex::new(Slots::default()), arrived: Condvar::new(), capacity, max_bytes, stats }
    }

    /// The largest message it accepts.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Notifications waiting to be taken.
    pub fn len(&self) -> usize {
        self.queue.lock().waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a notification, or says why not (`INVALID_ARGUMENT`: too
    /// large; `RESOURCE_EXHAUSTED`: the queue is full). The verdict goes
    /// back to the sender.
    pub fn offer(self: &Arc<Self>, n: Notification) -> Result<()> {
        self.admit(n)?.publish();
        Ok(())
    }

    /// Admits a notification without making it visible yet: its place in
    /// the queue is held until [`Admitted::publish`] (or given back when
    /// dropped). The source publishes only once the sender's OK is on its
    /// way, so that a notification taken is never one whose sender heard
    /// of a failure.
    pub fn admit(self: &Arc<Self>, n: Notification) -> Result<Admitted> {
        let refused = |e: Error| {
            self.stats.notifications.rejected.fetch_add(1, Ordering::Relaxed);
            Err(e)
        };
        if n.msg.len() > self.max_bytes {
            return refused(Error::InvalidArgument(format!(
                "a notification of {} bytes exceeds the receiver's notification_max_bytes ({})",
                n.msg.len(),
                self.max_bytes
            )));
        }
        let mut q = self.queue.lock();
        if q.waiting.len() + q.held >= self.capacity {
            drop(q);
            return refused(Error::ResourceExhausted(format!(
                "the receiver's notification queue is full ({} waiting; notification_queue {})",
                self.capacity, self.capacity
            )));
        }
        q.held += 1;
        drop(q);
        Ok(Admitted { inbox: self.clone(), n: Some(n) })
    }

    /// Takes the oldest notification if `fits` accepts it, waiting up to
    /// `timeout` for one to come.
    pub fn take(&self, timeout: Duration, fits: impl Fn(&Notification) -> bool) -> Taken {
        let deadline = Instant::now().checked_add(timeout);
        let mut q = self.queue.lock();
        loop {
            if let Some(n) = q.waiting.front() {
                if !fits(n) {
                    return Taken::TooSmall { sender_len: n.sender.len(), msg_len: n.msg.len() };
                }
                return Taken::Taken(q.waiting.pop_front().expect("front"));
            }
            match deadline {
                Some(d) => {
                    if self.arrived.wait_until(&mut q, d).timed_out() && q.waiting.is_empty() {
                        return Taken::Empty;
                    }
                }
                None => self.arrived.wait(&mut q),
            }
        }
    }
}
