//! The requester's progress worker: one lazy thread per transport that
//! polls the completion of groups posted and left pending by their
//! submitting thread, finishes them (close or receipt) and reports them;
//! groups reported `UNQUIESCED` at their deadline stay polled, and a
//! completion that comes late releases their import as usual.

use super::*;

impl IpcRequester {
    /// Hands a group whose completion is pending to the lazy progress
    /// worker (started on first use).
    pub(super) fn defer(self: &Arc<Self>, d: Deferred) {
        let mut p = self.progress.lock();
        if p.stopped {
            drop(p);
            let out =
                self.finish(d.posted, Err(Error::Unquiesced("the engine closed with the completion pending".into())));
            if let Some(done) = d.done {
                done(out);
            }
            return;
        }
        p.queue.push(d);
        if p.worker.is_none() {
            let me = self.clone();
            p.worker =
                std::thread::Builder::new().name("orbite-ipc-progress".into()).spawn(move || me.progress_loop()).ok();
        }
        drop(p);
        self.progress_cv.notify_all();
    }

    /// The lazy worker: polls pending groups' completions (one query each
    /// per round, a short pause between rounds) and finishes them; a
    /// deadline passed with the completion pending is `Unquiesced`.
    pub(super) fn progress_loop(self: Arc<Self>) {
        loop {
            let batch: Vec<Deferred> = {
                let mut p = self.progress.lock();
                while p.queue.is_empty() && !p.stopped {
                    self.progress_cv.wait(&mut p);
                }
                if p.queue.is_empty() {
                    return;
                }
                p.in_hand = p.queue.len();
                std::mem::take(&mut p.queue)
            };
            let stopping = self.progress.lock().stopped;
            let mut still = Vec::new();
            for mut d in batch {
                // CPU copies always complete: waited for, not polled.
                if self.mapping_waits(&d.posted.imp) {
                    let r = self.mapping_wait(&d.posted.imp, d.posted.posting());
                    self.settle(d, r);
                    continue;
                }
                let verdict = match self.mapping_query(&d.posted.imp, d.posted.posting()) {
                    Ok(true) => Some(Ok(())),
                    Err(e) => Some(Err(e)),
                    Ok(false) if stopping => {
                        d.posted.imp.mapping.abandon(d.posted.posting());
                        Some(Err(Error::Unquiesced("the engine closed with the completion event pending".into())))
                    }
                    Ok(false) => {
                        let reported = d.done.is_none() || Instant::now() < d.posted.deadline;
                        if let Some(done) = d.done.take_if(|_| !reported) {
                            // Reported now; polled on, so that a completion
                            // that comes late still closes the import.
                            self.progress.lock().late += 1;
                            let e = Error::Unquiesced("the deadline passed with the completion event pending".into());
                            done(Finished { items: d.posted.items.clone(), failed: Some(e) });
                        }
                        None
                    }
                };
                match verdict {
                    Some(r) => self.settle(d, r),
                    None => still.push(d),
                }
            }
            if !still.is_empty() {
                let mut p = self.progress.lock();
                p.in_hand = 0;
                still.append(&mut p.queue);
                p.queue = still;
                drop(p);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }

    /// Ends a deferred group whose completion is known (`r`): its outcomes
    /// go to its batch, or, when they were reported already at its
    /// deadline, a late completion releases the import as an ordinary one
    /// (nothing moved is counted: the requests were reported failed).
    pub(super) fn settle(&self, d: Deferred, r: Result<()>) {
        let Deferred { posted, done } = d;
        {
            // No longer pending, before whoever the outcome wakes looks.
            let mut p = self.progress.lock();
            p.in_hand = p.in_hand.saturating_sub(1);
            p.late -= done.is_none() as usize;
        }
        match done {
            Some(done) => done(self.finish(posted, r)),
            None if r.is_err() => drop(self.finish(posted, r)),
            None => {
                let Posted { imp, key, entered, fences, .. } = posted;
                drop(fences);
                match key {
                    Some(key) => {
                        if entered {
                            imp.leave(0, 0);
                        }
                        self.release(&key);
                    }
                    None => {
                        let deadline = Instant::now() + LATE_CLOSE;
                        if let Err((_, native_closed)) = self.close_import(&imp, false, deadline) {
                            self.retained.lock().imports.push(Retained { import: imp, native_closed });
                        }
                    }
                }
                // Counted once the import is settled (closed, or back in
                // the cache), so that whoever sees the count sees that.
                self.events.late_completions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Stops the progress worker; groups still pending end `Unquiesced`
    /// with their imports retained.
    pub fn stop_progress(&self) {
        let worker = {
            let mut p = self.progress.lock();
            p.stopped = true;
            p.worker.take()
        };
        self.progress_cv.notify_all();
        if let Some(w) = worker {
            let _ = w.join();
        }
    }

    /// Groups waiting for their completion on the worker (those reported
    /// at their deadline included), and whether the worker runs.
    pub fn progress_counts(&self) -> (u64, u64) {
        let p = self.progress.lock();
        ((p.queue.len() + p.in_hand) as u64, p.worker.as_ref().is_some_and(|w| !w.is_finished()) as u64)
    }

    /// Groups reported `Unquiesced` at their deadline whose completion is
    /// still polled.
    pub fn late_groups(&self) -> u64 {
        self.progress.lock().late as u64
    }
}
