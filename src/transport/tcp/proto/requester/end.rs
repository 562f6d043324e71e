//! How requests of [`RequesterCore`] end other than by their answer:
//! deadlines (each request failed on its own, the stream kept in step) and
//! the connection's end (everything left failed with its effect).

use super::*;

impl<T: Startable, H, N> RequesterCore<T, H, N> {
    /// Requests that passed their deadline at `now` are failed on their own
    /// (their answers, when they come, are dropped): a READ mid-payload has
    /// the rest of its payload dropped, a WRITE still leaving keeps its
    /// local memory held until its bytes have left. `Err`: the connection
    /// must end (a notification unanswered, a WRITE payload stuck past
    /// [`WRITE_OVERRUN`], too many abandoned requests).
    pub fn expire(&mut self, now: Instant) -> Result<()> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        let label = self.label.clone();
        let late = |what: &str| Error::TimedOut(format!("request to {label} passed its deadline {what}"));
        match &mut self.want {
            Want::Payload { deadline, len, done_bytes, .. } if now >= *deadline => {
                let left = *len - *done_bytes;
                let Want::Payload { record, hold, .. } = std::mem::replace(&mut self.want, Want::Discard { left })
                else {
                    unreachable!("matched above")
                };
                drop(hold);
                let e = late("mid-payload (the rest of its payload is dropped)");
                self.done.push((record, ChunkOutcome::failed(e, RemoteEffect::None)));
                if left == 0 {
                    self.want = Want::Header;
                }
            }
            Want::Reason { done, .. } if done.as_ref().is_some_and(|(_, d)| now >= *d) => {
                // Its refusal is being read: failed now, the rest of the
                // text read and dropped.
                if let Some((d, _)) = done.take() {
                    let e = late("in the middle of its failure answer");
                    self.done.push((d, ChunkOutcome::failed(e, RemoteEffect::None)));
                }
            }
            _ => {}
        }
        if self.queued_due.is_some_and(|d| now >= d) && !mutated!(self.mutations.keep_queued_past_deadline) {
            self.expire_queued(now);
        }
        let tags: Vec<u64> =
            self.pending.iter().filter(|(_, e)| !e.sending && now >= e.deadline).map(|(t, _)| *t).collect();
        for t in tags {
            let mut e = self.pending.remove(&t).expect("present");
            drop(e.hold.take());
            self.abandoned.insert(t, (e.op, e.len));
            let effect = RemoteEffect::of_uncertain(e.op);
            let what = format!("without an answer (0x{:x}+{}); its answer will be dropped", e.remote_addr, e.len);
            self.done.push((e.done, ChunkOutcome::failed(late(&what), effect)));
        }
        for w in self.out.writes.iter_mut().filter(|w| now >= w.deadline) {
            if w.hold.is_some() {
                if now >= w.deadline + WRITE_OVERRUN {
                    return Err(Error::TimedOut(format!(
                        "a WRITE's payload to {label} could not leave within {WRITE_OVERRUN:?} of its deadline"
                    )));
                }
                continue;
            }
            let Some(e) = self.pending.get(&w.tag) else { continue };
            if e.early.is_some() {
                continue;
            }
            let mut e = self.pending.remove(&w.tag).expect("present");
            w.hold = e.hold.take();
            if mutated!(self.mutations.release_expired_writes_mid_payload) {
                drop(w.hold.take());
            }
            self.abandoned.insert(w.tag, (Op::Write, e.len));
            self.done
                .push((e.done, ChunkOutcome::failed(late("while its payload was being sent"), RemoteEffect::Unknown)));
        }
        if self.abandoned.len() > ABANDONED_MAX {
            return Err(Error::TimedOut(format!(
                "more than {ABANDONED_MAX} requests to {label} passed their deadline unanswered"
            )));
        }
        if self.notes.values().any(|n| n.written && now >= n.deadline) {
            return Err(Error::TimedOut(format!("{label} did not answer a notification in time")));
        }
        Ok(())
    }

    /// Fails the queued requests whose deadline passed before they could
    /// be put on the wire (the socket still busy with what went before):
    /// nothing of them was sent, so TIMED_OUT with effect none, at their
    /// deadline rather than when the queue reaches them.
    fn expire_queued(&mut self, now: Instant) {
        let mut due = None;
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for item in self.queue.drain(..) {
            match item {
                Outgoing::Reqs(reqs) => {
                    let mut live = Vec::new();
                    for r in reqs {
                        if now >= r.deadline {
                            let e = Error::TimedOut(format!(
                                "deadline passed before the request was sent to {}",
                                self.label
                            ));
                            self.done.push((r.done, ChunkOutcome::failed(e, RemoteEffect::None)));
                        } else {
                            due = due.into_iter().chain(Some(r.deadline)).min();
                            live.push(r);
                        }
                    }
                    if !live.is_empty() {
                        kept.push_back(Outgoing::Reqs(VecDeque::from(live)));
                    }
                }
                other => kept.push_back(other),
            }
        }
        self.queue = kept;
        self.queued_due = due;
    }

    /// The earliest deadline of a request or notification in flight, or
    /// queued.
    pub fn next_deadline(&self) -> Option<Instant> {
        let mut d = self.pending.values().filter(|e| !e.sending).map(|e| e.deadline).chain(self.queued_due).min();
        if let Want::Payload { deadline, .. } = &self.want {
            d = d.into_iter().chain(Some(*deadline)).min();
        }
        let w = self.out.writes.iter().map(|w| if w.hold.is_some() { w.deadline + WRITE_OVERRUN } else { w.deadline });
        let n = self.notes.values().filter(|n| n.written).map(|n| n.deadline);
        d.into_iter().chain(w).chain(n).min()
    }

    /// Ends the connection with `e` (the first reason stays): every request
    /// queued, in flight or being answered fails — READs with effect none,
    /// WRITEs that were (even partly) sent with effect unknown, a request
    /// past its deadline as TIMED_OUT — and every notification waiting is
    /// answered with the reason, as is a Describe request. Returns the
    /// reason in force.
    pub fn kill(&mut self, e: Error, now: Instant) -> Error {
        if self.dead.is_none() {
            self.dead = Some(e);
        }
        self.finish(now)
    }

    /// [`RequesterCore::kill`]'s failing of everything left, at `now`.
    pub fn finish(&mut self, now: Instant) -> Error {
        let reason = self.closed_reason();
        let label = self.label.clone();
        let (sending, answered): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|(_, e)| e.sending);
        self.pending.extend(sending);
        for (_, mut e) in answered {
            drop(e.hold.take());
            let err = if now >= e.deadline && !matches!(reason, Error::Protocol(_)) {
                Error::TimedOut(format!("no answer from {label} before the deadline; connection closed"))
            } else {
                reason.clone()
            };
            let effect = RemoteEffect::of_uncertain(e.op);
            self.done.push((e.done, ChunkOutcome::failed(err, effect)));
        }
        match std::mem::replace(&mut self.want, Want::Header) {
            Want::Payload { record, hold, .. } => {
                drop(hold);
                self.done.push((record, ChunkOutcome::failed(reason.clone(), RemoteEffect::None)));
            }
            Want::Reason { done: Some((d, _)), .. } => {
                self.done.push((d, ChunkOutcome::failed(reason.clone(), RemoteEffect::None)))
            }
            _ => {}
        }
        if !self.out.is_empty() {
            self.settle(Some(&reason));
        }
        // WRITEs of a buffer not yet settled that stayed pending (sending).
        for (_, mut e) in std::mem::take(&mut self.pending) {
            drop(e.hold.take());
            self.done.push((e.done, ChunkOutcome::failed(reason.clone(), RemoteEffect::Unknown)));
        }
        for item in self.queue.drain(..).collect::<Vec<_>>() {
            if let Outgoing::Reqs(reqs) = item {
                for r in reqs {
                    self.done.push((r.done, ChunkOutcome::failed(reason.clone(), RemoteEffect::None)));
                }
            }
        }
        for (_, p) in std::mem::take(&mut self.notes) {
            self.events.push(Event::NotifyAnswer(p.answer, Err(reason.clone()), p.written));
        }
        if std::mem::take(&mut self.describes_awaited) > 0 {
            self.events.push(Event::DescribeLost);
        }
        self.abandoned.clear();
        reason
    }
}
