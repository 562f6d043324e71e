//! CUDA allocations the library owns (`CudaMemory::allocate`,
//! `allocate_ipc`, pinned host) and the producer-stream hand-off.

use super::driver::{check, check_device, primary_context, ContextGuard};
use crate::error::{Error, Result};
use crate::memory::owners::{self, Allocation, Backing};
use crate::memory::MemoryKind;
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::collections::HashMap;

/// IPC allocations are rounded up to this physical size and zeroed.
pub const IPC_ROUNDING: u64 = 2 * 1024 * 1024;

/// CUDA device memory on `device`; `ipc`: exportable, rounded up to 2 MiB
/// physically and zeroed (the logical length stays as requested).
pub fn allocate_device(device: i32, len: u64, ipc: bool) -> Result<Allocation> {
    check_device(device)?;
    let physical =
        if ipc { len.checked_add(IPC_ROUNDING - 1).map(|x| x / IPC_ROUNDING * IPC_ROUNDING) } else { Some(len) }
            .ok_or_else(|| Error::InvalidArgument(format!("length {len} is too large")))?;
    let ctx = primary_context(device)?;
    let g = ContextGuard::bind(ctx)?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a context is current; writes one device pointer.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, physical as usize) };
    if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::ResourceExhausted(format!("CUDA device {device} cannot supply {physical} bytes")));
    }
    check(r, "cuMemAlloc")?;
    if ipc {
        // SAFETY: p is a fresh allocation of `physical` bytes in this context.
        let z = check(unsafe { sys::cuMemsetD8_v2(p, 0, physical as usize) }, "cuMemsetD8")
            // SAFETY: waits for the memset in this context.
            .and_then(|_| check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize"));
        if let Err(e) = z {
            // SAFETY: freeing the allocation made above.
            unsafe { sys::cuMemFree_v2(p) };
            return Err(e);
        }
    }
    g.restore()?;
    let kind = if ipc { MemoryKind::CudaIpc } else { MemoryKind::Cuda };
    Ok(owners::adopt(kind, p, len, physical, Backing::CudaDevice { device }))
}

/// Pinned (page-locked) host memory, zeroed, usable by every context.
pub fn allocate_pinned_host(len: u64) -> Result<Allocation> {
    let ctx = primary_context(0)?;
    let g = ContextGuard::bind(ctx)?;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a context is current; writes one host pointer.
    let r = unsafe { sys::cuMemHostAlloc(&mut p, len as usize, sys::CU_MEMHOSTALLOC_PORTABLE) };
    if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::ResourceExhausted(format!("cannot pin {len} bytes of host memory")));
    }
    check(r, "cuMemHostAlloc")?;
    // SAFETY: p points to `len` fresh host bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len as usize) };
    g.restore()?;
    Ok(owners::adopt(MemoryKind::PinnedHost, p as u64, len, len, Backing::PinnedHost))
}

/// Frees device memory in its device's primary context.
pub fn free_device(device: i32, addr: u64) -> Result<()> {
    let g = ContextGuard::bind(primary_context(device)?)?;
    // SAFETY: addr came from cuMemAlloc in this context and nothing uses it
    // (the owner table checked registrations and exports).
    check(unsafe { sys::cuMemFree_v2(addr) }, "cuMemFree").map_err(|e| Error::Unquiesced(e.to_string()))?;
    g.restore()
}

/// Frees pinned host memory.
pub fn free_pinned_host(addr: u64) -> Result<()> {
    let g = ContextGuard::bind(primary_context(0)?)?;
    // SAFETY: addr came from cuMemHostAlloc and nothing uses it.
    check(unsafe { sys::cuMemFreeHost(addr as *mut std::ffi::c_void) }, "cuMemFreeHost")
        .map_err(|e| Error::Unquiesced(e.to_string()))?;
    g.restore()
}

/// Events recorded on producer streams, by allocation base.
static PRODUCERS: Mutex<Option<HashMap<u64, (usize, usize)>>> = Mutex::new(None);

/// Records an event on `stream` for the allocation holding `addr`: the next
/// transfer touching it waits for the work queued so far.
pub fn record_producer_stream(addr: u64, stream: u64) -> Result<()> {
    let o = owners::owner_of(addr)
        .ok_or_else(|| Error::InvalidArgument(format!("0x{addr:x} is not CUDA memory this library allocated")))?;
    let device = match (o.kind, o.device) {
        (MemoryKind::Cuda | MemoryKind::CudaIpc, Some(d)) => d,
        (MemoryKind::PinnedHost, _) => 0,
        _ => return Err(Error::InvalidArgument(format!("region at 0x{addr:x} is not CUDA or pinned memory"))),
    };
    let ctx = primary_context(device)?;
    let g = ContextGuard::bind(ctx)?;
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: context current; creates one event.
    check(unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }, "cuEventCreate")?;
    // SAFETY: ev is ours; the stream handle is the caller's, in this context.
    if let Err(e) = check(unsafe { sys::cuEventRecord(ev, stream as sys::CUstream) }, "cuEventRecord") {
        // SAFETY: destroying the event created above.
        unsafe { sys::cuEventDestroy_v2(ev) };
        return Err(e);
    }
    g.restore()?;
    let old = PRODUCERS.lock().get_or_insert_with(HashMap::new).insert(o.base, (ctx, ev as usize));
    if let Some((c, e)) = old {
        let _g = ContextGuard::bind(c)?;
        // SAFETY: a superseded event of ours.
        unsafe { sys::cuEventDestroy_v2(e as sys::CUevent) };
    }
    Ok(())
}

/// Waits for the producer event recorded for the allocation holding
/// `addr`, if any (consumers call this before granting or copying).
pub fn consume_producer(addr: u64) -> Result<()> {
    let Some(o) = owners::owner_of(addr) else { return Ok(()) };
    let Some((ctx, ev)) = PRODUCERS.lock().as_mut().and_then(|m| m.remove(&o.base)) else { return Ok(()) };
    let g = ContextGuard::bind(ctx)?;
    // SAFETY: our event, recorded on the producer's stream.
    let r = check(unsafe { sys::cuEventSynchronize(ev as sys::CUevent) }, "waiting for the producer stream");
    // SAFETY: done with the event.
    unsafe { sys::cuEventDestroy_v2(ev as sys::CUevent) };
    g.restore()?;
    r
}

/// Copies host bytes into device (or pinned) memory, synchronously.
pub fn host_to_device(dst: u64, src: &[u8]) -> Result<()> {
    let g = ContextGuard::bind(primary_context(0)?)?;
    // SAFETY: the caller names `src.len()` bytes of memory it owns at dst;
    // unified addressing resolves device or pinned pointers.
    check(unsafe { sys::cuMemcpy(dst, src.as_ptr() as u64, src.len()) }, "cuMemcpy (to device)")?;
    // SAFETY: drains the context so the copy is complete on return.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
    g.restore()
}

/// Copies device (or pinned) bytes to host memory, synchronously.
pub fn device_to_host(dst: &mut [u8], src: u64) -> Result<()> {
    let g = ContextGuard::bind(primary_context(0)?)?;
    // SAFETY: as in host_to_device, in the other direction.
    check(unsafe { sys::cuMemcpy(dst.as_mut_ptr() as u64, src, dst.len()) }, "cuMemcpy (from device)")?;
    // SAFETY: drains the context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
    g.restore()
}

/// A plain device-to-device copy of `len` bytes on device 0, repeated
/// `reps` times; returns GB/s (bytes copied per second, 1e9). The baseline
/// the qualification compares IPC bandwidth with.
pub fn device_copy_gbps(len: u64, reps: u32) -> Result<f64> {
    let a = allocate_device(0, len, false)?;
    let b = allocate_device(0, len, false)?;
    let g = ContextGuard::bind(primary_context(0)?)?;
    // SAFETY: both allocations hold `len` bytes; copies are drained below.
    check(unsafe { sys::cuMemcpy(b.addr(), a.addr(), len as usize) }, "warm-up copy")?;
    // SAFETY: drains the context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
    let t0 = std::time::Instant::now();
    for _ in 0..reps {
        // SAFETY: as above.
        check(unsafe { sys::cuMemcpyAsync(b.addr(), a.addr(), len as usize, std::ptr::null_mut()) }, "cuMemcpyAsync")?;
    }
    // SAFETY: drains the context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
    let secs = t0.elapsed().as_secs_f64();
    g.restore()?;
    let _ = a.free();
    let _ = b.free();
    Ok(len as f64 * reps as f64 / secs / 1e9)
}
