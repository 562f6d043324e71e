//! CUDA memory as owned allocations: the driver's raw device, pinned host
//! and VMM (MNNVL, EGM) memory becomes an [`Allocation`] here, recorded in
//! the owner table with the release hook that frees it; and the table of
//! producer events handed over with `record_producer_stream`. These are the
//! functions both the Rust API and the C entry points call. Without the
//! `cuda` feature, or without a usable driver, each answers `Unavailable`
//! (or `NotSupported`) with the reason, naming the entry point.

use super::owners::Allocation;
use crate::error::Result;

/// CUDA device memory owned by the library.
pub struct CudaMemory;

impl CudaMemory {
    /// Device memory on `device` (not exportable).
    pub fn allocate(device: i32, len: u64) -> Result<Allocation> {
        native::device(device, len, false).map_err(|e| e.context(&format!("cuda_allocate(device {device})")))
    }

    /// Device memory for CUDA IPC export: physically rounded up to 2 MiB and
    /// zeroed; the logical length stays `len`.
    pub fn allocate_ipc(device: i32, len: u64) -> Result<Allocation> {
        native::device(device, len, true).map_err(|e| e.context(&format!("cuda_allocate_ipc(device {device})")))
    }
}

/// Pinned (page-locked) host memory, zeroed, usable by every context.
pub fn allocate_pinned_host(len: u64) -> Result<Allocation> {
    native::pinned_host(len).map_err(|e| e.context("cuda_allocate_pinned_host"))
}

/// MNNVL device memory: a fabric-exportable VMM allocation on `device`,
/// rounded to the driver's granularity. A typed error when CUDA cannot
/// supply it; never a silent fallback to ordinary device memory.
pub fn allocate_mnnvl(device: i32, len: u64) -> Result<Allocation> {
    native::mnnvl(device, len).map_err(|e| e.context(&format!("allocate_mnnvl(device {device})")))
}

/// EGM host memory on a NUMA node, exportable across the fabric.
pub fn allocate_egm(numa_node: i32, len: u64) -> Result<Allocation> {
    native::egm(numa_node, len).map_err(|e| e.context(&format!("allocate_egm(numa node {numa_node})")))
}

/// Checked local release of an MNNVL or EGM allocation (unmap, release,
/// free the address range); `Unquiesced` keeps it, with its owners and
/// charges; `Unavailable` while it is registered or exported.
pub fn free_mnnvl(a: Allocation) -> std::result::Result<(), (Allocation, crate::error::Error)> {
    a.free()
}

pub use free_mnnvl as free_egm;

/// Adopts existing VMM device storage for MNNVL export.
///
/// # Safety
/// `[va, va+size)` must be the whole mapping of the VMM allocation `handle`,
/// its padding initialized, and the caller consents to sharing it with
/// peers; the caller keeps the final unmap (freeing the result forgets it).
#[cfg(feature = "cuda")]
pub unsafe fn wrap_mnnvl(device: i32, va: u64, size: u64, handle: u64) -> Result<Allocation> {
    // SAFETY: the caller upholds the preconditions documented above.
    unsafe { native::wrap(crate::cuda::fabric::Placement::Device(device), va, size, handle) }
}

/// Adopts existing VMM host (NUMA) storage for EGM export.
///
/// # Safety
/// As for [`wrap_mnnvl`].
#[cfg(feature = "cuda")]
pub unsafe fn wrap_egm(numa_node: i32, va: u64, size: u64, handle: u64) -> Result<Allocation> {
    // SAFETY: the caller upholds the preconditions documented above.
    unsafe { native::wrap(crate::cuda::fabric::Placement::HostNuma(numa_node), va, size, handle) }
}

/// Records an event on `stream` for the library CUDA (or pinned) allocation
/// holding `addr`: the next transfer touching it waits for the work queued
/// on the stream so far.
pub fn record_producer_stream(addr: u64, stream: u64) -> Result<()> {
    native::record_producer(addr, stream).map_err(|e| e.context("record_producer_stream"))
}

/// Waits for the producer event recorded for the allocation holding `addr`,
/// if any (the CUDA transports call this before granting or copying).
#[cfg(feature = "cuda")]
pub fn consume_producer(addr: u64) -> Result<()> {
    native::consume_producer(addr)
}

#[cfg(feature = "cuda")]
mod native {
    use super::super::owners::{self, Allocation, Backing, MemoryKind};
    use crate::cuda::driver::{check_device, driver};
    use crate::cuda::fabric::{self, Placement};
    use crate::cuda::memory::{self as raw, Event};
    use crate::error::{Error, Result};
    use parking_lot::Mutex;
    use std::collections::HashMap;

    pub(super) fn device(device: i32, len: u64, ipc: bool) -> Result<Allocation> {
        check_device(device)?;
        let physical = if ipc { owners::shared_physical(len)? } else { len };
        let p = raw::alloc_device(device, physical, ipc)?;
        let kind = if ipc { MemoryKind::CudaIpc } else { MemoryKind::Cuda };
        let release = Box::new(move |addr| raw::free_device(device, addr));
        Ok(owners::adopt(kind, p, len, physical, Backing::Native { device: Some(device), release }))
    }

    pub(super) fn pinned_host(len: u64) -> Result<Allocation> {
        let p = raw::alloc_pinned_host(len)?;
        let release = Box::new(raw::free_pinned_host);
        Ok(owners::adopt(MemoryKind::PinnedHost, p, len, len, Backing::Native { device: None, release }))
    }

    fn vmm(kind: MemoryKind, placement: Placement, len: u64, va: u64, physical: u64) -> Allocation {
        let device = match placement {
            Placement::Device(d) => Some(d),
            Placement::HostNuma(_) => None,
        };
        owners::adopt(kind, va, len, physical, Backing::Native { device, release: Box::new(fabric::free) })
    }

    pub(super) fn mnnvl(device: i32, len: u64) -> Result<Allocation> {
        let placement = Placement::Device(device);
        let (va, physical) = fabric::allocate(placement, len)?;
        Ok(vmm(MemoryKind::Mnnvl, placement, len, va, physical))
    }

    pub(super) fn egm(numa_node: i32, len: u64) -> Result<Allocation> {
        let placement = Placement::HostNuma(numa_node);
        let (va, physical) = fabric::allocate(placement, len)?;
        Ok(vmm(MemoryKind::Egm, placement, len, va, physical))
    }

    /// # Safety
    /// As `fabric::wrap`.
    pub(super) unsafe fn wrap(placement: Placement, va: u64, size: u64, handle: u64) -> Result<Allocation> {
        // SAFETY: the caller upholds `fabric::wrap`'s preconditions.
        unsafe { fabric::wrap(placement, va, size, handle) }?;
        let kind = match placement {
            Placement::Device(_) => MemoryKind::Mnnvl,
            Placement::HostNuma(_) => MemoryKind::Egm,
        };
        Ok(vmm(kind, placement, size, va, size))
    }

    /// Events recorded on producer streams, by allocation base.
    static PRODUCERS: Mutex<Option<HashMap<u64, Event>>> = Mutex::new(None);

    pub(super) fn record_producer(addr: u64, stream: u64) -> Result<()> {
        driver()?;
        let o = owners::owner_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("0x{addr:x} is not CUDA memory this library allocated")))?;
        let device = match (o.kind, o.device) {
            (MemoryKind::Cuda | MemoryKind::CudaIpc, Some(d)) => d,
            (MemoryKind::PinnedHost, _) => 0,
            _ => return Err(Error::InvalidArgument(format!("region at 0x{addr:x} is not CUDA or pinned memory"))),
        };
        let event = Event::record(device, stream)?;
        // A superseded event is destroyed when dropped here.
        drop(PRODUCERS.lock().get_or_insert_with(HashMap::new).insert(o.base, event));
        Ok(())
    }

    pub(super) fn consume_producer(addr: u64) -> Result<()> {
        let Some(o) = owners::owner_of(addr) else { return Ok(()) };
        let Some(event) = PRODUCERS.lock().as_mut().and_then(|m| m.remove(&o.base)) else { return Ok(()) };
        event.synchronize()
    }
}

#[cfg(not(feature = "cuda"))]
mod native {
    use super::super::owners::Allocation;
    use crate::error::{Error, Result};

    fn absent<T>() -> Result<T> {
        Err(Error::Unavailable(crate::cuda::NO_CUDA.into()))
    }
    pub(super) fn device(_: i32, _: u64, _: bool) -> Result<Allocation> {
        absent()
    }
    pub(super) fn pinned_host(_: u64) -> Result<Allocation> {
        absent()
    }
    pub(super) fn mnnvl(_: i32, _: u64) -> Result<Allocation> {
        absent()
    }
    pub(super) fn egm(_: i32, _: u64) -> Result<Allocation> {
        absent()
    }
    pub(super) fn record_producer(_: u64, _: u64) -> Result<()> {
        absent()
    }
}
