//! (stream, event) pairs: the slots of the [`StreamPool`](super::stream_pool::StreamPool)
//! on the driver, and the asynchronous copies, trailing event and
//! completion queries of one copy group. Every method expects the pair's
//! context to be bound on the calling thread (`driver::ContextGuard`).

use super::driver::{check, ContextGuard};
use super::stream_pool::StreamFactory;
use crate::error::Result;
use cudarc::driver::sys;

/// Creates and destroys (stream, event) pairs in a context.
pub struct CudaStreams;

/// A non-blocking stream and the event recorded after a group's copies.
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

impl StreamPair {
    fn stream(&self) -> sys::CUstream {
        self.stream as sys::CUstream
    }

    fn event(&self) -> sys::CUevent {
        self.event as sys::CUevent
    }

    /// Enqueues one copy (`cuMemcpyAsync`).
    ///
    /// # Safety
    /// Both ranges must stay valid memory of the bound context until the
    /// stream has run the copy.
    pub unsafe fn enqueue_copy(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: per the function's contract; the stream is ours.
        check(unsafe { sys::cuMemcpyAsync(dst, src, len, self.stream()) }, "cuMemcpyAsync")
    }

    /// Enqueues independent copies as one native batch
    /// (`cuMemcpyBatchAsync_v2`, stream-ordered source access). Call only
    /// where the driver probe found that exact symbol (`Driver::batch_v2`).
    ///
    /// # Safety
    /// As [`StreamPair::enqueue_copy`], for every (dst, src, size) triple;
    /// the three slices have one length.
    pub unsafe fn enqueue_batch(&self, dsts: &mut [u64], srcs: &mut [u64], sizes: &mut [usize]) -> Result<()> {
        // SAFETY: zeroed attributes are valid; the access order is set.
        let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
        attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        let mut idx = [0usize];
        // SAFETY: the arrays hold dsts.len() entries (the caller's contract);
        // the exact v2 signature (8 arguments) is the one called.
        check(
            unsafe {
                sys::cuMemcpyBatchAsync_v2(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    dsts.len(),
                    &mut attr,
                    idx.as_mut_ptr(),
                    1,
                    self.stream(),
                )
            },
            "cuMemcpyBatchAsync_v2",
        )
    }

    /// Records the trailing event after every copy enqueued so far.
    pub fn record(&self) -> Result<()> {
        // SAFETY: our event and stream, in the bound context.
        check(unsafe { sys::cuEventRecord(self.event(), self.stream()) }, "cuEventRecord")
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: our stream, in the bound context.
        check(unsafe { sys::cuStreamSynchronize(self.stream()) }, "draining the stream")
    }

    /// Asks once, without waiting, whether the trailing event completed.
    pub fn event_ready(&self) -> Result<bool> {
        // SAFETY: our event, in the bound context; a query never blocks.
        match unsafe { sys::cuEventQuery(self.event()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, "cuEventQuery").map(|_| false),
        }
    }

    /// Waits until the trailing event completed.
    pub fn event_wait(&self) -> Result<()> {
        // SAFETY: our event, in the bound context.
        check(unsafe { sys::cuEventSynchronize(self.event()) }, "cuEventSynchronize")
    }
}
