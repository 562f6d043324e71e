//! The NVLink (CUDA IPC) backend of the IPC protocol: exports are CUDA IPC
//! handles of whole `allocate_ipc` allocations; imports are opened in the
//! requester's primary context; copies run on a leased stream with one
//! trailing event (native batch copies for independent groups), or, for a
//! single copy below `nvlink_async_memcpy_threshold_kb`, synchronously with
//! the legacy stream drained before the import may be released.

use super::copy_batch::{CopyBatch, Submission};
use super::driver::{check, driver, primary_context, ContextGuard};
use super::memory::consume_producer;
use super::stream_pool::{StreamFactory, StreamLease, StreamPool};
use crate::error::{Error, Result};
use crate::memory::owners;
use crate::memory::MemoryKind;
use crate::transport::ipc::backend::{CopyOp, CopyPlan, ExportedHandle, IpcBackend, Mapping, ReceivedHandle};
use crate::transport::TransportKind;
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// Creates (stream, event) pairs in a context.
pub struct CudaStreams;

/// A (stream, event) pair.
pub struct StreamPair {
    stream: usize,
    event: usize,
}

impl StreamFactory for CudaStreams {
    type Handle = StreamPair;
    fn create(&self, ctx: u64) -> Result<StreamPair> {
        let g = ContextGuard::bind(ctx as usize)?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: context bound; creates one stream.
        check(
            unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            "cuStreamCreate",
        )?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: context bound; creates one event.
        let r = check(
            unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        );
        if let Err(err) = r {
            // SAFETY: destroying the stream made above.
            unsafe { sys::cuStreamDestroy_v2(s) };
            return Err(err);
        }
        g.restore()?;
        Ok(StreamPair { stream: s as usize, event: e as usize })
    }
    fn destroy(&self, ctx: u64, h: StreamPair) -> Result<()> {
        let g = ContextGuard::bind(ctx as usize)?;
        // SAFETY: our idle pair; nothing is queued on it.
        let a = check(unsafe { sys::cuEventDestroy_v2(h.event as sys::CUevent) }, "cuEventDestroy");
        // SAFETY: as above.
        let b = check(unsafe { sys::cuStreamDestroy_v2(h.stream as sys::CUstream) }, "cuStreamDestroy");
        g.restore()?;
        a.and(b)
    }
}

/// The NVLink backend.
pub struct NvlinkBackend {
    pool: Arc<StreamPool<CudaStreams>>,
    /// The requester's device for imports (its first visible device);
    /// peer ordinals never select it.
    device: i32,
    threshold: u64,
}

impl NvlinkBackend {
    /// A backend with a pool of `streams` slots and the sync-copy threshold.
    pub fn new(streams: usize, threshold_kb: u64) -> Result<NvlinkBackend> {
        driver()?;
        Ok(NvlinkBackend { pool: StreamPool::new(CudaStreams, streams), device: 0, threshold: threshold_kb * 1024 })
    }

    /// The stream pool (for stats).
    pub fn pool(&self) -> &Arc<StreamPool<CudaStreams>> {
        &self.pool
    }
}

impl IpcBackend for NvlinkBackend {
    fn transport(&self) -> TransportKind {
        TransportKind::Nvlink
    }

    fn export(&self, base: u64) -> Result<ExportedHandle> {
        let o = owners::owner_of(base)
            .filter(|o| o.base == base && o.kind == MemoryKind::CudaIpc)
            .ok_or_else(|| Error::NotSupported(format!("0x{base:x} is not an allocate_ipc allocation")))?;
        consume_producer(base)?;
        let g = ContextGuard::bind(primary_context(o.device.unwrap_or(0))?)?;
        // SAFETY: an all-zero handle is valid storage for the driver to fill.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: base is the start of a cuMemAlloc allocation in this context.
        check(unsafe { sys::cuIpcGetMemHandle(&mut h, base) }, "cuIpcGetMemHandle")?;
        g.restore()?;
        Ok(ExportedHandle { bytes: h.reserved.iter().map(|c| *c as u8).collect(), fd: None, owned_fd: None })
    }

    fn import(&self, handle: ReceivedHandle, physical: u64) -> Result<Box<dyn Mapping>> {
        if handle.bytes.len() != IPC_HANDLE_BYTES {
            return Err(Error::Protocol(format!(
                "a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, got {}",
                handle.bytes.len()
            )));
        }
        // SAFETY: zeroed storage, filled below.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(&handle.bytes) {
            *d = *s as _;
        }
        let ctx = primary_context(self.device)?;
        let g = ContextGuard::bind(ctx)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: context bound; opens the peer's allocation.
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) }, "cuIpcOpenMemHandle")?;
        g.restore()?;
        Ok(mapping(p, physical, ctx, self.pool.clone(), self.threshold, Closer::Ipc))
    }
}

/// How an import is closed natively.
pub(crate) enum Closer {
    /// `cuIpcCloseMemHandle`.
    Ipc,
    /// A VMM import: unmap, release the imported handle, free the range.
    Vmm {
        /// The imported handle.
        handle: u64,
    },
}

/// An import mapping copied through with leased streams (NVLink and MNNVL).
/// `threshold` 0 disables the synchronous single-copy path (MNNVL).
pub(crate) fn mapping(
    base: u64,
    len: u64,
    ctx: usize,
    pool: Arc<StreamPool<CudaStreams>>,
    threshold: u64,
    closer: Closer,
) -> Box<dyn Mapping> {
    Box::new(NvlinkMapping {
        base,
        len,
        ctx,
        pool,
        threshold,
        pending: Mutex::new(None),
        uncertain: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        closer,
    })
}

struct NvlinkMapping {
    base: u64,
    len: u64,
    ctx: usize,
    pool: Arc<StreamPool<CudaStreams>>,
    threshold: u64,
    /// The leased stream of the copies in flight, and the context it runs in.
    pending: Mutex<Option<(StreamLease<StreamPair>, usize)>>,
    uncertain: AtomicBool,
    closed: AtomicBool,
    closer: Closer,
}

impl NvlinkMapping {
    /// The context the copies of `ops` run in: the mapping's, unless the
    /// local side is EGM memory (MNNVL), which is copied on the GPU attached
    /// to its NUMA node; one group must agree on that GPU.
    fn copy_ctx(&self, ops: &[CopyOp]) -> Result<usize> {
        let Closer::Vmm { .. } = self.closer else { return Ok(self.ctx) };
        let inside = |a: u64| a >= self.base && a < self.base + self.len;
        let mut chosen: Option<i32> = None;
        for o in ops {
            let local = if inside(o.dst) { o.src } else { o.dst };
            let Some(node) = super::mnnvl::egm_node(local) else { continue };
            let d = super::mnnvl::device_for_node(node)?;
            if chosen.is_some_and(|c| c != d) {
                return Err(Error::NotSupported(
                    "one group's local EGM memory sits on NUMA nodes of different GPUs; submit them separately".into(),
                ));
            }
            chosen = Some(d);
        }
        match chosen {
            Some(d) => primary_context(d),
            None => Ok(self.ctx),
        }
    }

    fn sync_copy(&self, o: &CopyOp) -> Result<()> {
        let g = ContextGuard::bind(self.ctx)?;
        // SAFETY: both ranges were checked against the grant and the local
        // registration; unified addressing resolves host or device pointers.
        check(unsafe { sys::cuMemcpy(o.dst, o.src, o.len as usize) }, "cuMemcpy")?;
        // A device-to-device cuMemcpy may return before the DMA completes:
        // drain before the import may be released.
        // SAFETY: drains this context.
        if let Err(e) = check(unsafe { sys::cuCtxSynchronize() }, "draining the legacy stream") {
            self.uncertain.store(true, Ordering::Release);
            return Err(Error::Unquiesced(e.to_string()));
        }
        g.restore().inspect_err(|_| self.uncertain.store(true, Ordering::Release))
    }

    fn async_copy(&self, ops: &[CopyOp]) -> Result<()> {
        let batch_v2 = driver()?.batch_v2;
        let ctx = self.copy_ctx(ops)?;
        let lease = self.pool.lease(ctx as u64, Instant::now() + Duration::from_secs(60))?;
        let pair = lease.handle.as_ref().expect("leased pair");
        let (stream, event) = (pair.stream as sys::CUstream, pair.event as sys::CUevent);
        let g = ContextGuard::bind(ctx)?;
        let mut b = CopyBatch::build(ops);
        let enq = match b.submission(batch_v2) {
            Submission::Native => {
                // SAFETY: zeroed attributes are valid; the access order is set.
                let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
                attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
                let mut idx = [0usize];
                // SAFETY: the arrays hold b.len() entries; the exact v2
                // signature (8 arguments) is the one called, only where the
                // probe found the symbol on a 13000+ driver.
                check(
                    unsafe {
                        sys::cuMemcpyBatchAsync_v2(
                            b.dsts.as_mut_ptr(),
                            b.srcs.as_mut_ptr(),
                            b.sizes.as_mut_ptr(),
                            b.len(),
                            &mut attr,
                            idx.as_mut_ptr(),
                            1,
                            stream,
                        )
                    },
                    "cuMemcpyBatchAsync_v2",
                )
            }
            Submission::Ordered => (0..b.len()).try_for_each(|i| {
                // SAFETY: ranges checked as in sync_copy; enqueued in order.
                check(unsafe { sys::cuMemcpyAsync(b.dsts[i], b.srcs[i], b.sizes[i], stream) }, "cuMemcpyAsync")
            }),
        }
        // SAFETY: one trailing event after every slice.
        .and_then(|_| check(unsafe { sys::cuEventRecord(event, stream) }, "cuEventRecord"));
        if let Err(e) = enq {
            // No completed-prefix evidence: every passed descriptor counts as
            // attempted; drain the stream and replay nothing.
            // SAFETY: draining our leased stream.
            let drained = check(unsafe { sys::cuStreamSynchronize(stream) }, "draining after a failed enqueue");
            let restored = g.restore();
            let certain = drained.is_ok() && restored.is_ok();
            self.pool.release(lease, certain);
            if !certain {
                self.uncertain.store(true, Ordering::Release);
            }
            return Err(e);
        }
        g.restore().inspect_err(|_| self.uncertain.store(true, Ordering::Release))?;
        *self.pending.lock() = Some((lease, ctx));
        Ok(())
    }
}

impl Mapping for NvlinkMapping {
    fn base(&self) -> u64 {
        self.base
    }
    fn mapped_len(&self) -> u64 {
        self.len
    }
    fn copy(&self, ops: &[CopyOp], _plan: CopyPlan) -> Result<()> {
        for o in ops {
            consume_producer(o.src)?;
            consume_producer(o.dst)?;
        }
        if ops.len() == 1 && ops[0].len < self.threshold {
            return self.sync_copy(&ops[0]);
        }
        self.async_copy(ops)
    }
    fn wait(&self) -> Result<()> {
        if self.uncertain.load(Ordering::Acquire) {
            return Err(Error::Unquiesced("an earlier drain or context restoration failed".into()));
        }
        let Some((lease, ctx)) = self.pending.lock().take() else { return Ok(()) };
        let event = lease.handle.as_ref().expect("leased pair").event as sys::CUevent;
        let g = ContextGuard::bind(ctx)?;
        // Query once: a ready group completes without waiting.
        // SAFETY: our event in this context.
        let q = unsafe { sys::cuEventQuery(event) };
        let r = match q {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            // SAFETY: as above.
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                check(unsafe { sys::cuEventSynchronize(event) }, "cuEventSynchronize")
            }
            other => check(other, "cuEventQuery"),
        };
        let restored = g.restore();
        let certain = r.is_ok() && restored.is_ok();
        self.pool.release(lease, certain);
        if !certain {
            self.uncertain.store(true, Ordering::Release);
            return Err(Error::Unquiesced(format!(
                "copy completion could not be confirmed: {}",
                r.err().or(restored.err()).map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        Ok(())
    }
    fn query(&self) -> Result<bool> {
        if self.uncertain.load(Ordering::Acquire) {
            return Err(Error::Unquiesced("an earlier drain or context restoration failed".into()));
        }
        let mut pending = self.pending.lock();
        let Some((lease, ctx)) = pending.as_ref() else { return Ok(true) };
        let event = lease.handle.as_ref().expect("leased pair").event as sys::CUevent;
        let g = ContextGuard::bind(*ctx)?;
        // SAFETY: our event in this context; a query never blocks.
        let q = unsafe { sys::cuEventQuery(event) };
        let restored = g.restore();
        match (q, restored) {
            (sys::CUresult::CUDA_ERROR_NOT_READY, Ok(())) => Ok(false),
            (sys::CUresult::CUDA_SUCCESS, Ok(())) => {
                self.pool.release(pending.take().expect("lease").0, true);
                Ok(true)
            }
            (other, r) => {
                // A failed query or restoration: the slot is uncertain.
                self.pool.release(pending.take().expect("lease").0, false);
                self.uncertain.store(true, Ordering::Release);
                Err(Error::Unquiesced(format!(
                    "copy completion could not be confirmed: {other:?}{}",
                    r.err().map(|e| format!(", {e}")).unwrap_or_default()
                )))
            }
        }
    }
    fn abandon(&self) {
        // The stream still has work into this mapping: it is quarantined,
        // never reused, and counted as retained.
        if let Some((lease, _)) = self.pending.lock().take() {
            self.pool.release(lease, false);
        }
        self.uncertain.store(true, Ordering::Release);
    }
    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let g = ContextGuard::bind(self.ctx)?;
        let r = match self.closer {
            // SAFETY: base came from cuIpcOpenMemHandle in this context; every
            // copy through it completed (wait succeeded).
            Closer::Ipc => check(unsafe { sys::cuIpcCloseMemHandle(self.base) }, "cuIpcCloseMemHandle"),
            Closer::Vmm { handle } => super::mnnvl::close_import(self.base, self.len, handle),
        };
        if let Err(e) = r {
            // A failed close is never retried (the state may be partial).
            return Err(Error::Unquiesced(e.to_string()));
        }
        g.restore().map_err(|e| Error::Unquiesced(e.to_string()))
    }
}
