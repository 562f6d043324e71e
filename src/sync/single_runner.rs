//! A job that runs on a short-lived thread of its own when triggered, with
//! triggers that come while it runs folded into one more pass: however
//! often it is triggered (a peer flooding a frame that starts it), at most
//! one thread runs it at a time.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The job's state.
#[derive(Default)]
struct State {
    /// A thread is running the job.
    running: bool,
    /// A trigger came while it ran: run it once more.
    again: bool,
}

/// A job run by at most one thread at a time; see the module.
pub struct SingleRunner {
    name: &'static str,
    job: Box<dyn Fn() + Send + Sync>,
    state: Mutex<State>,
    triggers: AtomicU64,
    passes: AtomicU64,
}

impl SingleRunner {
    /// A job run on threads named `name`.
    pub fn new(name: &'static str, job: impl Fn() + Send + Sync + 'static) -> Arc<SingleRunner> {
        Arc::new(SingleRunner {
            name,
            job: Box::new(job),
            state: Mutex::new(State::default()),
            triggers: AtomicU64::new(0),
            passes: AtomicU64::new(0),
        })
    }

    /// Asks for a pass: starts a thread if none runs, else marks one more
    /// pass for the running thread (which then sees everything that led to
    /// this trigger). Never blocks.
    pub fn trigger(self: &Arc<Self>) {
        self.triggers.fetch_add(1, Ordering::Relaxed);
        {
            let mut s = self.state.lock();
            if s.running {
                s.again = true;
                return;
            }
            s.running = true;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new().name(self.name.into()).spawn(move || me.run());
        if spawned.is_err() {
            // No thread: the next trigger tries again.
            self.state.lock().running = false;
        }
    }

    fn run(&self) {
        loop {
            self.passes.fetch_add(1, Ordering::Relaxed);
            (self.job)();
            let mut s = self.state.lock();
            if !std::mem::take(&mut s.again) {
                s.running = false;
                return;
            }
        }
    }

    /// (triggers, passes run) so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.triggers.load(Ordering::Relaxed), self.passes.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Triggers while a pass runs fold into exactly one more pass.
    #[test]
    fn triggers_during_a_pass_fold_into_one_more() {
        let (entered_tx, entered) = mpsc::channel::<()>();
        let (go, go_rx) = mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let job = SingleRunner::new("coalesce-test", move || {
            entered_tx.send(()).unwrap();
            go_rx.lock().recv_timeout(Duration::from_secs(30)).unwrap();
        });
        job.trigger();
        entered.recv_timeout(Duration::from_secs(30)).unwrap();
        for _ in 0..1000 {
            job.trigger();
        }
        go.send(()).unwrap();
        // The second (and last) pass.
        entered.recv_timeout(Duration::from_secs(30)).unwrap();
        go.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while job.state.lock().running {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert_eq!(job.counts(), (1001, 2));
        // Idle again: a new trigger starts a new thread.
        job.trigger();
        entered.recv_timeout(Duration::from_secs(30)).unwrap();
        go.send(()).unwrap();
    }
}
