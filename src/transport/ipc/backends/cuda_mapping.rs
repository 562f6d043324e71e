//! One CUDA import mapping, for NVLink (a CUDA IPC import) and MNNVL (a VMM
//! import): copies run on a leased stream of the pool with one trailing
//! event (a native batch for independent groups, ordered enqueue
//! otherwise), or, for one copy below the threshold, synchronously: on a
//! leased stream drained at once, before the import may be released.
//! Completion is queried once and waited for or handed to the progress
//! worker by the IPC protocol; an uncertain drain, query or context
//! restoration quarantines the stream and keeps the mapping. Every copy
//! runs in the context the import was opened in: the GPU chosen for the
//! group's local memory (the transports' rule), counted per device.

use super::copy_batch::{CopyBatch, Submission};
use crate::cuda::driver::{driver, ContextGuard, Ctx};
use crate::cuda::fabric::Imported;
use crate::cuda::raw;
use crate::cuda::stream_pool::{StreamLease, StreamPool};
use crate::cuda::streams::{CudaStreams, StreamPair};
use crate::error::{Error, Result};
use crate::memory::cuda::consume_producer;
use crate::transport::ipc::backend::{CopyOp, CopyPlan, Mapping, Posting};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How an import is closed natively.
pub enum Closer {
    /// `cuIpcCloseMemHandle` (NVLink).
    Ipc,
    /// A VMM import (MNNVL): unmap, release the imported handle, free the range.
    Vmm(Imported),
}

/// Copies posted per device: which GPU's context ran them.
#[derive(Debug, Default)]
pub struct DeviceCopies {
    by_device: Mutex<BTreeMap<i32, DeviceCopyCount>>,
}

/// What one device copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCopyCount {
    /// Copies posted in the device's context.
    pub copies: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl DeviceCopies {
    fn record(&self, device: i32, ops: &[CopyOp]) {
        let mut m = self.by_device.lock();
        let c = m.entry(device).or_default();
        c.copies += ops.len() as u64;
        c.bytes += ops.iter().map(|o| o.len).sum::<u64>();
    }

    /// Counts by device ordinal.
    pub fn snapshot(&self) -> BTreeMap<i32, DeviceCopyCount> {
        self.by_device.lock().clone()
    }
}

/// An import mapping copied through with leased streams.
pub struct CudaMapping {
    base: u64,
    /// The device whose primary context `ctx` is.
    device: i32,
    ctx: Ctx,
    copies: Arc<DeviceCopies>,
    pool: Arc<StreamPool<CudaStreams>>,
    /// Single copies strictly below this many bytes run synchronously (0:
    /// never, as for MNNVL).
    threshold: u64,
    /// The leased stream (and its context) of each group in flight, by
    /// posting: several threads may have groups in flight on one cached
    /// import, each completing on its own event.
    pending: Mutex<HashMap<Posting, (StreamLease<StreamPair>, Ctx)>>,
    next_posting: AtomicU64,
    uncertain: AtomicBool,
    closed: AtomicBool,
    closer: Closer,
}

impl CudaMapping {
    /// A mapping at `base`, opened in `device`'s primary context `ctx`; its
    /// copies are counted in `copies`.
    pub fn new(
        base: u64,
        device: i32,
        ctx: Ctx,
        pool: Arc<StreamPool<CudaStreams>>,
        threshold: u64,
        closer: Closer,
        copies: Arc<DeviceCopies>,
    ) -> CudaMapping {
        CudaMapping {
            base,
            device,
            ctx,
            copies,
            pool,
            threshold,
            pending: Mutex::new(HashMap::new()),
            next_posting: AtomicU64::new(1),
            uncertain: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            closer,
        }
    }

    fn mark_uncertain(&self) {
        self.uncertain.store(true, Ordering::Release);
    }

    /// One small copy, completed before it returns: enqueued on a leased
    /// non-blocking stream and that stream drained. Not the legacy stream
    /// and `cuCtxSynchronize`: the legacy stream waits for the work queued
    /// on every blocking stream of the context, and a context
    /// synchronisation for every stream of it, so in a serving process
    /// (the stack's own compute in the same primary context) a 4 KiB copy
    /// would wait for the stack's kernels.
    fn sync_copy(&self, o: &CopyOp) -> Result<()> {
        let (lease, g) = self.lease_bound()?;
        let pair = lease.handle.as_ref().expect("leased pair");
        // SAFETY: both ranges were checked against the grant and the local
        // registration (leased for the copy); the mapping is open; the
        // stream is drained below before either may be released.
        let enqueued = unsafe { pair.enqueue_copy(o.dst, o.src, o.len as usize) };
        // A device-to-device copy may still run: drain before the import may
        // be released, whether or not the enqueue reported an error.
        let (drained, restored) = self.drain_and_release(lease, g);
        if let Err(e) = drained {
            return Err(Error::Unquiesced(e.to_string()));
        }
        enqueued.and(restored)
    }

    /// A stream of the pool leased for this mapping's context, with that
    /// context bound; a failed bind gives the untouched stream back.
    fn lease_bound(&self) -> Result<(StreamLease<StreamPair>, ContextGuard)> {
        let lease = self.pool.lease(self.ctx as u64, Instant::now() + Duration::from_secs(60))?;
        match ContextGuard::bind(self.ctx) {
            Ok(g) => Ok((lease, g)),
            Err(e) => {
                self.pool.release(lease, true);
                Err(e)
            }
        }
    }

    /// Drains the leased stream, restores the caller's context and gives
    /// the stream back: quarantined, and the mapping marked uncertain,
    /// unless both succeeded. Returns both results.
    fn drain_and_release(&self, lease: StreamLease<StreamPair>, g: ContextGuard) -> (Result<()>, Result<()>) {
        let drained = lease.handle.as_ref().expect("leased pair").synchronize();
        let restored = g.restore();
        let certain = drained.is_ok() && restored.is_ok();
        self.pool.release(lease, certain);
        if !certain {
            self.mark_uncertain();
        }
        (drained, restored)
    }

    fn async_copy(&self, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting> {
        let batch_v2 = driver()?.batch_v2;
        let (lease, g) = self.lease_bound()?;
        let pair = lease.handle.as_ref().expect("leased pair");
        let mut b = CopyBatch::build(ops, plan);
        let enq = match b.submission(batch_v2) {
            // SAFETY: every range was checked as in sync_copy and stays
            // leased until the group's completion is known.
            Submission::Native => unsafe { pair.enqueue_batch(&mut b.dsts, &mut b.srcs, &mut b.sizes) },
            Submission::Ordered => (0..b.len()).try_for_each(|i| {
                // SAFETY: as above; enqueued in input order.
                unsafe { pair.enqueue_copy(b.dsts[i], b.srcs[i], b.sizes[i]) }
            }),
        }
        .and_then(|_| pair.record());
        if let Err(e) = enq {
            // No completed-prefix evidence: every passed descriptor counts as
            // attempted; drain the stream and replay nothing.
            let _ = self.drain_and_release(lease, g);
            return Err(e);
        }
        g.restore().inspect_err(|_| self.mark_uncertain())?;
        let posting = self.next_posting.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(posting, (lease, self.ctx));
        Ok(posting)
    }

    fn check_certain(&self) -> Result<()> {
        if self.uncertain.load(Ordering::Acquire) {
            return Err(Error::Unquiesced("an earlier drain or context restoration failed".into()));
        }
        Ok(())
    }
}

impl Mapping for CudaMapping {
    fn base(&self) -> u64 {
        self.base
    }

    fn copy(&self, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting> {
        for o in ops {
            consume_producer(o.src)?;
            consume_producer(o.dst)?;
        }
        let posting = if ops.len() == 1 && ops[0].len < self.threshold {
            self.sync_copy(&ops[0])?;
            0
        } else {
            self.async_copy(ops, plan)?
        };
        self.copies.record(self.device, ops);
        Ok(posting)
    }

    fn wait(&self, posting: Posting) -> Result<()> {
        self.check_certain()?;
        let Some((lease, ctx)) = self.pending.lock().remove(&posting) else { return Ok(()) };
        let pair = lease.handle.as_ref().expect("leased pair");
        let g = ContextGuard::bind(ctx)?;
        // Query once: a ready group completes without waiting.
        let r = match pair.event_ready() {
            Ok(true) => Ok(()),
            Ok(false) => pair.event_wait(),
            Err(e) => Err(e),
        };
        let restored = g.restore();
        let certain = r.is_ok() && restored.is_ok();
        self.pool.release(lease, certain);
        if !certain {
            self.mark_uncertain();
            return Err(Error::Unquiesced(format!(
                "copy completion could not be confirmed: {}",
                r.err().or(restored.err()).map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        Ok(())
    }

    fn query(&self, posting: Posting) -> Result<bool> {
        self.check_certain()?;
        let mut pending = self.pending.lock();
        let Some((lease, ctx)) = pending.get(&posting) else { return Ok(true) };
        let g = ContextGuard::bind(*ctx)?;
        let ready = lease.handle.as_ref().expect("leased pair").event_ready();
        let restored = g.restore();
        match (ready, restored) {
            (Ok(false), Ok(())) => Ok(false),
            (Ok(true), Ok(())) => {
                self.pool.release(pending.remove(&posting).expect("lease").0, true);
                Ok(true)
            }
            (q, r) => {
                // A failed query or restoration: the slot is uncertain.
                self.pool.release(pending.remove(&posting).expect("lease").0, false);
                self.mark_uncertain();
                let why: Vec<String> = [q.err(), r.err()].into_iter().flatten().map(|e| e.to_string()).collect();
                Err(Error::Unquiesced(format!("copy completion could not be confirmed: {}", why.join(", "))))
            }
        }
    }

    fn abandon(&self, posting: Posting) {
        // The stream still has work into this mapping: it is quarantined,
        // never reused, and counted as retained.
        if let Some((lease, _)) = self.pending.lock().remove(&posting) {
            self.pool.release(lease, false);
        }
        self.mark_uncertain();
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let g = ContextGuard::bind(self.ctx)?;
        let r = match &self.closer {
            // SAFETY: base came from ipc_open in this context; every copy
            // through it completed (wait succeeded).
            Closer::Ipc => unsafe { raw::ipc_close(self.base) },
            Closer::Vmm(imported) => imported.close(),
        };
        if let Err(e) = r {
            // A failed close is never retried (the state may be partial).
            return Err(Error::Unquiesced(e.to_string()));
        }
        g.restore().map_err(|e| Error::Unquiesced(e.to_string()))
    }
}
