//! Raw driver memory: device and pinned host allocations, legacy CUDA IPC
//! handles, events recorded on a caller's stream, and copies on the legacy
//! stream. Addresses are plain integers; `memory::cuda` owns what they mean.

use super::driver::{check, check_device, driver, primary_context, ContextGuard, Ctx};
use crate::error::{Error, Result};
use cudarc::driver::sys;

/// Size of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// `bytes` of device memory on `device` (`cuMemAlloc`), zeroed when asked.
pub fn alloc_device(device: i32, bytes: u64, zeroed: bool) -> Result<u64> {
    check_device(device)?;
    let g = ContextGuard::bind(primary_context(device)?)?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a context is current; writes one device pointer.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes as usize) };
    if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::ResourceExhausted(format!("CUDA device {device} cannot supply {bytes} bytes")));
    }
    check(r, "cuMemAlloc")?;
    if zeroed {
        // SAFETY: p is a fresh allocation of `bytes` bytes in this context.
        let z = check(unsafe { sys::cuMemsetD8_v2(p, 0, bytes as usize) }, "cuMemsetD8")
            // SAFETY: waits for the memset in this context.
            .and_then(|_| check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize"));
        if let Err(e) = z {
            // SAFETY: freeing the allocation made above.
            unsafe { sys::cuMemFree_v2(p) };
            return Err(e);
        }
    }
    g.restore()?;
    Ok(p)
}

/// Frees device memory in its device's primary context; a failure is
/// `Unquiesced` (the memory may still be in use).
pub fn free_device(device: i32, addr: u64) -> Result<()> {
    let g = ContextGuard::bind(primary_context(device)?)?;
    // SAFETY: addr came from cuMemAlloc in this context and the caller
    // proved that nothing uses it.
    check(unsafe { sys::cuMemFree_v2(addr) }, "cuMemFree").map_err(|e| Error::Unquiesced(e.to_string()))?;
    g.restore()
}

/// `bytes` of pinned (page-locked) host memory, zeroed, usable by every
/// context (`cuMemHostAlloc`, portable).
pub fn alloc_pinned_host(bytes: u64) -> Result<u64> {
    driver()?;
    let g = ContextGuard::bind(primary_context(0)?)?;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a context is current; writes one host pointer.
    let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes as usize, sys::CU_MEMHOSTALLOC_PORTABLE) };
    if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::ResourceExhausted(format!("cannot pin {bytes} bytes of host memory")));
    }
    check(r, "cuMemHostAlloc")?;
    // SAFETY: p points to `bytes` fresh host bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes as usize) };
    g.restore()?;
    Ok(p as u64)
}

/// Frees pinned host memory; a failure is `Unquiesced`.
pub fn free_pinned_host(addr: u64) -> Result<()> {
    let g = ContextGuard::bind(primary_context(0)?)?;
    // SAFETY: addr came from cuMemHostAlloc and the caller proved that
    // nothing uses it.
    check(unsafe { sys::cuMemFreeHost(addr as *mut std::ffi::c_void) }, "cuMemFreeHost")
        .map_err(|e| Error::Unquiesced(e.to_string()))?;
    g.restore()
}

/// An event recorded on a stream of the caller's (a producer hand-off);
/// destroyed, in its context, when dropped.
pub struct Event {
    ctx: Ctx,
    event: usize,
}

impl Event {
    /// Records an event on `stream` (a `CUstream` of `device`'s primary
    /// context): it completes once the work queued so far has.
    pub fn record(device: i32, stream: u64) -> Result<Event> {
        let ctx = primary_context(device)?;
        let g = ContextGuard::bind(ctx)?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: context current; creates one event.
        check(
            unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )?;
        let event = Event { ctx, event: ev as usize };
        // SAFETY: ev is ours; the stream handle is the caller's, in this context.
        check(unsafe { sys::cuEventRecord(ev, stream as sys::CUstream) }, "cuEventRecord")?;
        g.restore()?;
        Ok(event)
    }

    /// Waits until the event completed.
    pub fn synchronize(&self) -> Result<()> {
        let g = ContextGuard::bind(self.ctx)?;
        // SAFETY: our event, in its context.
        let r =
            check(unsafe { sys::cuEventSynchronize(self.event as sys::CUevent) }, "waiting for the producer stream");
        g.restore()?;
        r
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_g) = ContextGuard::bind(self.ctx) {
            // SAFETY: our event; nothing waits on it any more.
            unsafe { sys::cuEventDestroy_v2(self.event as sys::CUevent) };
        }
    }
}

/// The IPC handle of the `cuMemAlloc` allocation starting at `base` on `device`.
pub fn ipc_handle(device: i32, base: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
    let g = ContextGuard::bind(primary_context(device)?)?;
    // SAFETY: an all-zero handle is valid storage for the driver to fill.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: base is the start of a cuMemAlloc allocation in this context.
    check(unsafe { sys::cuIpcGetMemHandle(&mut h, base) }, "cuIpcGetMemHandle")?;
    g.restore()?;
    let mut out = [0u8; IPC_HANDLE_BYTES];
    for (o, c) in out.iter_mut().zip(h.reserved.iter()) {
        *o = *c as u8;
    }
    Ok(out)
}

/// Opens a peer's IPC handle in context `ctx` (peer access enabled lazily);
/// returns the local address of the peer's allocation. A GPU with no path
/// to the exporter's is refused `NOT_SUPPORTED`.
pub fn ipc_open(ctx: Ctx, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64> {
    // SAFETY: zeroed storage, filled below.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    for (d, s) in h.reserved.iter_mut().zip(handle) {
        *d = *s as _;
    }
    let g = ContextGuard::bind(ctx)?;
    let mut p: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: context bound; opens the peer's allocation.
    match unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) } {
        // The driver maps only where the two GPUs have a peer path.
        sys::CUresult::CUDA_ERROR_INVALID_DEVICE => {
            return Err(Error::NotSupported(
                "the GPU copying for this import has no path to the exporter's GPU (cuIpcOpenMemHandle refused it: \
                 no peer access between the two GPUs); register local memory on a GPU that reaches it"
                    .into(),
            ))
        }
        r => check(r, "cuIpcOpenMemHandle")?,
    }
    g.restore()?;
    Ok(p)
}

/// Closes an import opened by [`ipc_open`]; the caller has bound its context.
///
/// # Safety
/// `ptr` came from `ipc_open` in the current context and every copy through
/// it has completed.
pub unsafe fn ipc_close(ptr: u64) -> Result<()> {
    // SAFETY: per the function's contract.
    check(unsafe { sys::cuIpcCloseMemHandle(ptr) }, "cuIpcCloseMemHandle")
}

/// One copy on the legacy stream of the current context (`cuMemCpy`;
/// unified addressing resolves host, pinned or device pointers). A
/// device-to-device copy may return before its DMA completes: follow it with
/// [`synchronize_context`].
///
/// # Safety
/// `[src, src+len)` and `[dst, dst+len)` must be memory the current context
/// may read and write for the whole copy.
pub unsafe fn copy(dst: u64, src: u64, len: u64) -> Result<()> {
    // SAFETY: per the function's contract.
    check(unsafe { sys::cuMemcpy(dst, src, len as usize) }, "cuMemcpy")
}

/// Waits for everything queued in the current context.
pub fn synchronize_context() -> Result<()> {
    // SAFETY: drains the current context; no pointer is involved.
    check(unsafe { sys::cuCtxSynchronize() }, "draining the legacy stream")
}

/// The device whose context copies memory at `addr`: its own for device
/// memory the driver knows, device 0 for host memory.
fn device_of(addr: u64) -> i32 {
    match pointer_info(addr) {
        Ok(Some(i)) if i.device_memory && i.device >= 0 => i.device,
        _ => 0,
    }
}

/// Copies host bytes into device (or pinned) memory, synchronously, in the
/// context of the memory's device.
pub fn host_to_device(dst: u64, src: &[u8]) -> Result<()> {
    let g = ContextGuard::bind(primary_context(device_of(dst))?)?;
    // SAFETY: the caller names `src.len()` bytes of memory it owns at dst.
    unsafe { copy(dst, src.as_ptr() as u64, src.len() as u64) }?;
    synchronize_context()?;
    g.restore()
}

/// Copies device (or pinned) bytes to host memory, synchronously, in the
/// context of the memory's device.
pub fn device_to_host(dst: &mut [u8], src: u64) -> Result<()> {
    let g = ContextGuard::bind(primary_context(device_of(src))?)?;
    // SAFETY: as in host_to_device, in the other direction.
    unsafe { copy(dst.as_mut_ptr() as u64, src, dst.len() as u64) }?;
    synchronize_context()?;
    g.restore()
}

/// A plain device-to-device copy of `len` bytes on device 0, repeated
/// `reps` times; returns GB/s (bytes copied per second, 1e9). The baseline
/// the qualification compares IPC bandwidth with.
pub fn device_copy_gbps(len: u64, reps: u32) -> Result<f64> {
    let a = alloc_device(0, len, false)?;
    let b = match alloc_device(0, len, false) {
        Ok(b) => b,
        Err(e) => {
            let _ = free_device(0, a);
            return Err(e);
        }
    };
    let timed = (|| {
        let g = ContextGuard::bind(primary_context(0)?)?;
        // SAFETY: both allocations hold `len` bytes; copies are drained below.
        unsafe { copy(b, a, len) }?;
        synchronize_context()?;
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            // SAFETY: as above, on the legacy stream.
            check(unsafe { sys::cuMemcpyAsync(b, a, len as usize, std::ptr::null_mut()) }, "cuMemcpyAsync")?;
        }
        synchronize_context()?;
        let secs = t0.elapsed().as_secs_f64();
        g.restore()?;
        Ok(len as f64 * reps as f64 / secs / 1e9)
    })();
    let _ = free_device(0, a);
    let _ = free_device(0, b);
    timed
}

/// What the driver knows about an address it manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// Device memory (`CU_MEMORYTYPE_DEVICE`); otherwise host memory the
    /// driver knows (pinned, registered, or host VMM).
    pub device_memory: bool,
    /// Managed (unified) memory.
    pub managed: bool,
    /// The device it belongs to.
    pub device: i32,
    /// Legacy CUDA IPC can export it (`cudaMalloc`/`cuMemAlloc` memory).
    pub legacy_ipc: bool,
}

/// One pointer attribute, read into a zeroed 8-byte cell (the driver
/// writes 1 to 8 bytes depending on the attribute); `None` when the driver
/// does not know the address.
fn pointer_attribute(addr: u64, attr: sys::CUpointer_attribute) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: the driver writes at most 8 bytes (every attribute read here
    // is an int, a bool or a CUmemorytype) into v.
    let r = unsafe { sys::cuPointerGetAttribute((&mut v as *mut u64).cast(), attr, addr) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// Asks the driver what `addr` is: `Ok(None)` for memory it does not
/// manage (plain host memory). Needs no current context.
pub fn pointer_info(addr: u64) -> Result<Option<PointerInfo>> {
    driver()?;
    if !super::driver::has_symbol("cuPointerGetAttribute") {
        return Err(Error::NotSupported("the CUDA driver does not export cuPointerGetAttribute".into()));
    }
    use sys::CUpointer_attribute as A;
    let Some(ty) = pointer_attribute(addr, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE) else { return Ok(None) };
    let flag = |a: A| pointer_attribute(addr, a).is_some_and(|v| v & 0xffff_ffff != 0);
    Ok(Some(PointerInfo {
        device_memory: ty as u32 == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32,
        managed: flag(A::CU_POINTER_ATTRIBUTE_IS_MANAGED),
        device: pointer_attribute(addr, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL).map_or(-1, |v| v as u32 as i32),
        legacy_ipc: flag(A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE),
    }))
}

/// The whole allocation holding `addr` (`cuMemGetAddressRange`), asked in
/// `device`'s primary context: `(base, size)`.
pub fn allocation_range(device: i32, addr: u64) -> Result<(u64, u64)> {
    let g = ContextGuard::bind(primary_context(device)?)?;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: a context is current; writes one address and one size.
    let r = check(unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr) }, "cuMemGetAddressRange");
    g.restore()?;
    r.map(|_| (base, size as u64))
}
