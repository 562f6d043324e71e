//! `Batch`: the handle of one submission.

use crate::error::{Error, Result, Status};
use crate::kinds::{Transport, TransportKind};
use crate::transfer::{BatchShared, RequestResult};
use crate::transport::ipc::backends::cpu_copy;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Options of one submission (defaults: `Transport::Auto`, engine timeout).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// Which transport carries the requests.
    pub transport: Transport,
    /// Deadline for the whole submission (`None`: `default_timeout_ms`).
    pub timeout: Option<Duration>,
}

/// A submitted set of requests and their outcomes. Dropping a pending batch
/// detaches it; its requests still run to their outcome.
pub struct Batch {
    shared: Arc<BatchShared>,
}

impl Batch {
    pub(crate) fn new(shared: Arc<BatchShared>) -> Batch {
        Batch { shared }
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// Whether the batch has no request (never: empty submissions are refused).
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }

    /// `Ok`, `Pending` or `TransferFailed`, without waiting (while pending,
    /// the caller first reads the TCP answers already waiting, see
    /// [`BatchShared::assist_once`], or else copies a piece of a started
    /// SHM group, see [`cpu_copy::assist`]).
    pub fn poll(&self) -> Status {
        match self.shared.poll() {
            Status::Pending if self.shared.assist_once() || cpu_copy::assist() => self.shared.poll(),
            s => s,
        }
    }

    /// Waits until every request ended or `timeout` passed. `Ok(())` when all
    /// succeeded; `TransferFailed` naming the first failure; `TimedOut` if
    /// requests are still pending (the batch stays valid).
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        match self.shared.wait(timeout) {
            Status::Ok => Ok(()),
            Status::Pending => Err(Error::TimedOut(format!("requests still pending after waiting {timeout:?}"))),
            _ => Err(self.failure()),
        }
    }

    /// The error summarising a failed batch.
    pub fn failure(&self) -> Error {
        match self.shared.first_error() {
            Some((i, e)) => Error::TransferFailed(format!("request {i} failed with {}: {}", e.status(), e.message())),
            None => match self.shared.notification() {
                Some(Err(e)) => Error::TransferFailed(format!(
                    "every request succeeded but the notification was not delivered ({}): {}",
                    e.status(),
                    e.message()
                )),
                _ => Error::TransferFailed("a request failed".into()),
            },
        }
    }

    /// The outcome of the notification submitted with the batch
    /// ([`crate::Engine::submit_with_notification`]): `None` when there is
    /// none or the batch has not ended.
    pub fn notification(&self) -> Option<Result<()>> {
        self.shared.notification()
    }

    /// Per-request outcomes in input order.
    pub fn results(&self) -> Vec<RequestResult> {
        self.shared.results()
    }

    /// The outcome of request `i`; `OutOfRange` when the batch has no
    /// request `i` (while it is pending, the caller first copies a piece of
    /// a started SHM group, as [`Batch::poll`]).
    pub fn result(&self, i: usize) -> Result<RequestResult> {
        let r = self.shared.result(i).ok_or_else(|| self.out_of_range(i))?;
        if r.status == Status::Pending && (self.shared.assist_once() || cpu_copy::assist()) {
            return self.shared.result(i).ok_or_else(|| self.out_of_range(i));
        }
        Ok(r)
    }

    /// Which transport carried (or carries) request `i`: `Ok(None)` while
    /// the submission has not routed it yet; `OutOfRange` when the batch
    /// has no request `i`.
    pub fn transport(&self, i: usize) -> Result<Option<TransportKind>> {
        self.shared.transport(i).ok_or_else(|| self.out_of_range(i))
    }

    fn out_of_range(&self, i: usize) -> Error {
        Error::OutOfRange(format!("request index {i}: the batch holds {} requests", self.len()))
    }

    /// The failure of request `i`, if it failed.
    pub fn error(&self, i: usize) -> Option<Error> {
        self.shared.error(i)
    }

    /// What the engine decided for this submission and why, in words: a
    /// fallback from the transport AUTO chose to TCP (with the reason), or
    /// requests split into more groups than their layout needs.
    pub fn notes(&self) -> Vec<String> {
        self.shared.notes()
    }

    /// Calls `f` once every request has ended: at once, on this thread,
    /// when they all have already; else on the thread that ends the last
    /// one (an I/O thread, a copy thread, a submitter or a canceller), with
    /// no lock of the batch held. Every request ends, by the batch's
    /// deadline at the latest, so `f` runs exactly once; a batch handle
    /// dropped meanwhile does not stop it. `f` must return promptly and
    /// never wait for another batch: on an I/O thread, the completions
    /// of the same turn still to be delivered wait for it.
    pub fn on_end(&self, f: impl FnOnce() + Send + 'static) {
        let slot = Arc::new(Mutex::new(Some(f)));
        let hooked = Arc::clone(&slot);
        let registered = self.shared.on_end(Box::new(move || {
            let f = hooked.lock().take();
            if let Some(f) = f {
                f()
            }
        }));
        if !registered {
            // Every request had ended: the hook was dropped uncalled.
            let f = slot.lock().take();
            if let Some(f) = f {
                f()
            }
        }
    }

    /// Requests not yet started end `Cancelled` with remote effect None;
    /// started ones run to their outcome.
    pub fn cancel(&self) {
        self.shared.cancel()
    }

    /// Asks request `i` to end `Cancelled` (remote effect None) if it has
    /// not started; the other requests are not affected. A request started
    /// already (the IPC transports start theirs within the submission), or
    /// one that moves as one copy with requests not asked to cancel
    /// (coalesced TCP READs), runs to its outcome. `OutOfRange` when the
    /// batch has no request `i`.
    pub fn cancel_request(&self, i: usize) -> Result<()> {
        if self.shared.cancel_request(i) {
            Ok(())
        } else {
            Err(self.out_of_range(i))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::TransportKind;
    use crate::transfer::{Op, Request};
    use crate::transport::ipc::backend::CopyOp;
    use std::time::Instant;

    /// The end callback runs once, when the last request ends (not
    /// before), and at once on a batch that had ended.
    #[test]
    fn the_end_callback_runs_once_when_the_last_request_ends() {
        use crate::transfer::ChunkOutcome;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x2000, len: 8 };
        let deadline = Instant::now() + Duration::from_secs(60);
        let batch = Batch::new(BatchShared::routed(&[req, req], Some(TransportKind::Tcp), Arc::default(), deadline));
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        batch.on_end(move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        batch.shared.complete_chunk(0, ChunkOutcome::ok(Op::Read));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "one request is still pending");
        batch.shared.complete_chunk(1, ChunkOutcome::ok(Op::Read));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the last request ended");
        let c = Arc::clone(&calls);
        batch.on_end(move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 2, "on an ended batch it runs at once");
    }

    /// A pending batch's poll and result lend the caller to a started SHM
    /// group no copy thread takes: it completes only through them.
    #[test]
    fn polling_a_pending_batch_copies_started_groups() {
        let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x2000, len: 8 };
        let deadline = Instant::now() + Duration::from_secs(60);
        let batch = Batch::new(BatchShared::routed(&[req], Some(TransportKind::Shm), Arc::default(), deadline));
        let src: Vec<u8> = (0..16 * 4096).map(|i| (i % 251) as u8).collect();
        for by_result in [false, true] {
            let mut dst = vec![0u8; src.len()];
            let op = CopyOp { dst: dst.as_mut_ptr() as u64, src: src.as_ptr() as u64, len: src.len() as u64 };
            let pending = cpu_copy::start_unattended(&[op]);
            let mut polls = 0;
            while !pending.is_done() {
                match by_result {
                    false => assert_eq!(batch.poll(), Status::Pending),
                    true => assert_eq!(batch.result(0).unwrap().status, Status::Pending),
                }
                polls += 1;
                assert!(polls < 10_000, "polling never copied the started group");
            }
            assert!(dst == src);
        }
    }
}
