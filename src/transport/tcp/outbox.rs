//! Notifications, sender side: the per-peer queue ([`Outbox`]) that sends
//! each notification only once the requests it must follow have ended.
//!
//! Ordering. A notification leaves only when every batch submitted to the
//! peer before it has ended on this side: the TCP answers came (the peer
//! wrote or read the bytes), the SHM copies returned, the CUDA copies'
//! completion events fired. A notification sent with a batch leaves only
//! if every request of the batch succeeded. The outbox is first in, first
//! out, and the control connection keeps the order, so one sender's
//! notifications arrive in the order they were made.

use crate::control::notify_frame::Notify;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::transfer::BatchShared;
use crate::transport::tcp::TcpConnection;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Where a notification's outcome goes.
enum Sink {
    /// A caller of [`Outbox::notify`] waits for it.
    Waiter(Arc<Waiter>),
    /// It travels with this batch, which ends only once the outcome is known.
    Batch(Arc<BatchShared>),
}

impl Sink {
    fn resolve(self, stats: &Counters, outcome: Result<()>, sent: bool) {
        if !sent {
            stats.notifications.not_sent.fetch_add(1, Ordering::Relaxed);
        }
        match self {
            Sink::Waiter(w) => w.resolve(outcome, sent),
            Sink::Batch(b) => b.notification_done(outcome),
        }
    }
}

/// The outcome of one standalone notification, as its caller waits for it.
pub struct Waiter {
    outcome: Mutex<Option<(Result<()>, bool)>>,
    done: Condvar,
}

impl Waiter {
    fn resolve(&self, outcome: Result<()>, sent: bool) {
        *self.outcome.lock() = Some((outcome, sent));
        self.done.notify_all();
    }
}

struct Queued {
    id: u64,
    /// The batches it follows.
    deps: Vec<Arc<BatchShared>>,
    msg: Vec<u8>,
    sink: Sink,
}

#[derive(Default)]
struct OutState {
    queue: VecDeque<Queued>,
    /// Batches submitted to the peer that may not have ended, and whether
    /// a watcher that pumps the queue when they end is set on them.
    in_flight: VecDeque<(Arc<BatchShared>, bool)>,
    next_id: u64,
}

/// The sender's queue of notifications for one peer.
pub struct Outbox {
    state: Mutex<OutState>,
    conn: Arc<TcpConnection>,
    /// This engine's name ("" when it has none).
    name: String,
    /// How long the peer has to answer a notification sent to it.
    answer_within: Duration,
    stats: Arc<Counters>,
}

impl Outbox {
    /// A queue that sends on `conn` as `name`.
    pub fn new(conn: Arc<TcpConnection>, name: String, answer_within: Duration, stats: Arc<Counters>) -> Arc<Outbox> {
        Arc::new(Outbox { state: Mutex::new(OutState::default()), conn, name, answer_within, stats })
    }

    /// Notes a batch submitted to the peer: later notifications follow it.
    /// One whose requests all ended already needs no record (a small SHM
    /// copy finished inside its submission).
    pub fn track(&self, batch: &Arc<BatchShared>) {
        if batch.requests_ended() {
            return;
        }
        let mut s = self.state.lock();
        // Ended batches leave from the front at once, and from anywhere
        // once many are listed, so a finished batch's record is not kept.
        while s.in_flight.front().is_some_and(|(b, _)| b.requests_ended()) {
            s.in_flight.pop_front();
        }
        if s.in_flight.len() >= 64 {
            s.in_flight.retain(|(b, _)| !b.requests_ended());
        }
        s.in_flight.push_back((batch.clone(), false));
    }

    /// Sends `msg` with `batch` (already tracked): once every request of
    /// it and of the batches before it ended, if every request of `batch`
    /// succeeded. The batch ends only once the notification's outcome is
    /// known.
    pub fn send_with(self: &Arc<Self>, batch: &Arc<BatchShared>, msg: Vec<u8>) {
        self.push(msg, Sink::Batch(batch.clone()));
    }

    /// Sends `msg` once every batch submitted to the peer before this call
    /// has ended, and waits until the peer queued it, refused it, or
    /// `deadline` passed.
    pub fn notify(self: &Arc<Self>, msg: Vec<u8>, deadline: Instant) -> Result<()> {
        let w = Arc::new(Waiter { outcome: Mutex::new(None), done: Condvar::new() });
        let id = self.push(msg, Sink::Waiter(w.clone()));
        let mut o = w.outcome.lock();
        while o.is_none() {
            if w.done.wait_until(&mut o, deadline).timed_out() && o.is_none() {
                drop(o);
                if self.cancel(id) {
                    self.stats.notifications.not_sent.fetch_add(1, Ordering::Relaxed);
                    return Err(Error::TimedOut(format!(
                        "notification to {} not sent: requests submitted before it had not ended by the deadline",
                        self.conn.label
                    )));
                }
                // Sent (or being resolved): wait briefly for the verdict.
                o = w.outcome.lock();
                if o.is_none() {
                    return Err(Error::TimedOut(format!(
                        "notification sent to {}, no answer before the deadline (its delivery is unknown)",
                        self.conn.label
                    )));
                }
            }
        }
        o.take().expect("resolved").0
    }

    fn push(self: &Arc<Self>, msg: Vec<u8>, sink: Sink) -> u64 {
        let id = {
            let mut s = self.state.lock();
            s.in_flight.retain(|(b, _)| !b.requests_ended());
            let deps: Vec<Arc<BatchShared>> = s.in_flight.iter().map(|(b, _)| b.clone()).collect();
            let id = s.next_id;
            s.next_id += 1;
            s.queue.push_back(Queued { id, deps, msg, sink });
            // One watcher per batch pumps the queue when the batch ends.
            for (b, watched) in s.in_flight.iter_mut().filter(|(_, w)| !*w) {
                *watched = true;
                let me: Weak<Outbox> = Arc::downgrade(self);
                b.on_end(Box::new(move || {
                    if let Some(o) = me.upgrade() {
                        o.pump();
                    }
                }));
            }
            id
        };
        self.pump();
        id
    }

    /// Removes a notification not yet sent; false when it left already.
    fn cancel(&self, id: u64) -> bool {
        let mut s = self.state.lock();
        let before = s.queue.len();
        s.queue.retain(|q| q.id != id);
        s.queue.len() != before
    }

    /// Sends, in order, the notifications at the head whose batches have
    /// all ended. Runs under the queue's lock, so two pumps cannot reorder
    /// them; sending only queues the frame on the connection.
    fn pump(&self) {
        let mut s = self.state.lock();
        while s.queue.front().is_some_and(|q| q.deps.iter().all(|b| b.requests_ended())) {
            let q = s.queue.pop_front().expect("front");
            if let Sink::Batch(b) = &q.sink {
                if let Some((i, e)) = b.first_error() {
                    let why = Error::from_status(
                        e.status(),
                        format!("notification not sent: request {i} of its batch failed ({})", e.message()),
                    );
                    q.sink.resolve(&self.stats, Err(why), false);
                    continue;
                }
            }
            let body = |tag: u64| Notify { tag, name: self.name.clone(), msg: q.msg.clone() }.encode();
            let stats = self.stats.clone();
            let sink = q.sink;
            self.conn.send_notify(
                body,
                Instant::now() + self.answer_within,
                Box::new(move |outcome: Result<()>, sent: bool| {
                    if sent {
                        let c =
                            if outcome.is_ok() { &stats.notifications.delivered } else { &stats.notifications.refused };
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                    sink.resolve(&stats, outcome, sent);
                }),
            );
        }
    }
}
