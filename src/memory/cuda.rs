//! CUDA memory as owned allocations: the driver's raw device, pinned host
//! and VMM (MNNVL, EGM) memory becomes an [`Allocation`] here, recorded in
//! the owner table with the release hook that frees it; and the table of
//! producer events handed over with `record_producer_stream`. These are the
//! functions both the Rust API and the C entry points call. Without the
//! `cuda` feature, or without a usable driver, each answers `Unavailable`
//! (or `NotSupported`) with the reason, naming the entry point.

use super::owners::{Allocation, MemoryKind};
use crate::error::{Error, Result};

/// `adopt` flag: the caller consents that a peer importing the adopted
/// memory can reach the whole underlying allocation (the driver enforces
/// no subrange).
pub const ADOPT_SHARE_WHOLE_ALLOCATION: u32 = 1;

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

/// Adopts CUDA memory the caller's stack allocated, so that the NVLink,
/// MNNVL and EGM transports can export it and copy with it:
/// `cudaMalloc`/`cuMemAlloc` memory (exported over NVLink with CUDA IPC) or
/// CUDA VMM memory from `cuMemCreate` (exported over MNNVL, under the
/// seed's `wrap_mnnvl`/`wrap_egm` rules: the whole mapping of one
/// exportable pinned allocation). `[ptr, ptr+len)` must lie in one
/// allocation, whose base and size the driver reports; `flags` must hold
/// [`ADOPT_SHARE_WHOLE_ALLOCATION`]. Adoptions inside one allocation share
/// one record of it (one export, one handle), as caching allocators hand
/// out blocks of one segment. Managed and host memory are
/// `InvalidArgument`. The memory stays the caller's: freeing the result
/// forgets the library's record only (`Unavailable` while registered or
/// exported), and the caller frees the memory after that.
pub fn adopt(ptr: u64, len: u64, flags: u32) -> Result<Allocation> {
    if flags & !ADOPT_SHARE_WHOLE_ALLOCATION != 0 {
        return Err(Error::InvalidArgument(format!("unknown adopt flags 0x{flags:x}")));
    }
    if flags & ADOPT_SHARE_WHOLE_ALLOCATION == 0 {
        return Err(Error::InvalidArgument(
            "adopting needs ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION: a peer that imports the memory can reach the \
             whole allocation holding it, and the caller must consent to that"
                .into(),
        ));
    }
    if ptr == 0 || len == 0 {
        return Err(Error::InvalidArgument(format!("cannot adopt 0x{ptr:x}+{len}")));
    }
    native::adopt(ptr, len).map_err(|e| e.context(&format!("cuda_adopt(0x{ptr:x}+{len})")))
}

/// When `addr` is CUDA device or managed memory (which the library did not
/// allocate or adopt, or the caller would not ask), what it is, in words;
/// `None` for host memory, or when no CUDA driver is present.
pub fn foreign_device_memory(addr: u64) -> Option<String> {
    native::foreign(addr)
}

/// The GPU whose context copies local memory of `kind` at `addr`: the
/// device of device memory, the GPU attached to the NUMA node of EGM
/// memory; `None` for host memory.
pub fn local_device(addr: u64, kind: MemoryKind) -> Option<i32> {
    match kind {
        MemoryKind::Cuda | MemoryKind::CudaIpc | MemoryKind::Mnnvl => super::owners::owner_of(addr)?.device,
        MemoryKind::Egm => native::egm_device(addr),
        MemoryKind::Host | MemoryKind::SharedHost | MemoryKind::PinnedHost => None,
    }
}

/// Records an event on `stream` for the library (or adopted) CUDA device,
/// MNNVL, EGM or pinned allocation holding `addr`: the next transfer
/// touching it waits for the work queued on the stream so far. The stream
/// belongs to the allocation's GPU (EGM: the GPU attached to its NUMA
/// node; pinned host memory: device 0).
pub fn record_producer_stream(addr: u64, stream: u64) -> Result<()> {
    native::record_producer(addr, stream).map_err(|e| e.context("record_producer_stream"))
}

/// Waits for the producer event recorded for the allocation holding `addr`,
/// if any (the CUDA transports call this before granting or copying).
#[cfg(feature = "cuda")]
pub fn consume_producer(addr: u64) -> Result<()> {
    native::consume_producer(addr)
}

/// Whether a producer event recorded for the allocation holding `addr`
/// waits to be consumed (a grant of it would first wait for its stream).
#[cfg(feature = "cuda")]
pub fn producer_pending(addr: u64) -> bool {
    native::producer_pending(addr)
}

#[cfg(feature = "cuda")]
mod native {
    use super::super::owners::{self, Allocation, Backing, MemoryKind};
    use crate::cuda::driver::{check_device, driver};
    use crate::cuda::fabric::{self, Placement};
    use crate::cuda::raw::{self, Event};
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

    /// Serialises adoptions, so that two adoptions inside one allocation
    /// agree on who records it.
    static ADOPTING: Mutex<()> = Mutex::new(());

    pub(super) fn adopt(ptr: u64, len: u64) -> Result<Allocation> {
        let _one = ADOPTING.lock();
        let info = raw::pointer_info(ptr)?.ok_or_else(|| {
            Error::InvalidArgument(
                "not CUDA memory: plain host memory is registered directly (orbite_register_memory)".into(),
            )
        })?;
        if info.managed {
            return Err(Error::InvalidArgument(
                "managed (unified) memory cannot be exported by CUDA IPC or VMM handles; allocate the pool with \
                 cudaMalloc or cuMemCreate"
                    .into(),
            ));
        }
        if let Some(handle) = fabric::retained_handle(ptr)? {
            let adopted = adopt_vmm(ptr, len, handle);
            if adopted.as_ref().is_ok_and(|(_, spare)| *spare) || adopted.is_err() {
                // The allocation was already recorded (it keeps the first
                // reference), or nothing was recorded: give this one back.
                let _ = fabric::release_handle(handle);
            }
            return adopted.map(|(a, _)| a);
        }
        if !info.device_memory {
            return Err(Error::InvalidArgument(
                "host memory the driver knows (pinned or registered): register it directly; only device and \
                 VMM memory are adopted"
                    .into(),
            ));
        }
        if !info.legacy_ipc {
            return Err(Error::NotSupported(format!(
                "device memory on device {} that CUDA IPC cannot export (stream-ordered pool memory from \
                 cudaMallocAsync?); allocate the pool with cudaMalloc, or with cuMemCreate and exportable handle types",
                info.device
            )));
        }
        let (base, size) = raw::allocation_range(info.device, ptr)?;
        let foreign = owners::Foreign {
            kind: MemoryKind::CudaIpc,
            base,
            size,
            device: Some(info.device),
            forget: Box::new(|_| Ok(())),
        };
        owners::adopt_range(foreign, ptr, len).map(|(a, _)| a)
    }

    /// Adopts VMM memory through its retained `handle`; `true` with the
    /// result when the allocation was already recorded (the handle is spare).
    fn adopt_vmm(ptr: u64, len: u64, handle: u64) -> Result<(Allocation, bool)> {
        let placement = fabric::handle_placement(handle)?;
        let (kind, device, ctx_device) = match placement {
            Placement::Device(d) => (MemoryKind::Mnnvl, Some(d), d),
            Placement::HostNuma(_) => (MemoryKind::Egm, None, 0),
        };
        let (base, size) = raw::allocation_range(ctx_device, ptr)?;
        let known = owners::owner_of(base).is_some_and(|o| o.base == base);
        if !known {
            // SAFETY: the driver reports [base, base+size) as the mapping of
            // one live pinned allocation (checked again inside); the caller
            // consented to sharing it whole (the adopt flag), and keeps the
            // final unmap: forgetting the record only releases our reference.
            unsafe { fabric::wrap(placement, base, size, handle) }?;
        }
        let forget: owners::Release = Box::new(move |va| {
            fabric::free(va)?;
            fabric::release_handle(handle)
        });
        let f = owners::Foreign { kind, base, size, device, forget };
        match owners::adopt_range(f, ptr, len) {
            Ok((a, spare)) => Ok((a, spare.is_some())),
            Err(e) => {
                if !known {
                    let _ = fabric::free(base);
                }
                Err(e)
            }
        }
    }

    pub(super) fn foreign(addr: u64) -> Option<String> {
        // Only where a driver is installed: a host without CUDA never loads it.
        // SAFETY: is_culib_present only tries to dlopen candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return None;
        }
        let info = raw::pointer_info(addr).ok()??;
        match (info.managed, info.device_memory) {
            (true, _) => Some("CUDA managed memory".into()),
            (false, true) => Some(format!("CUDA device memory of device {}", info.device)),
            (false, false) => None,
        }
    }

    pub(super) fn egm_device(addr: u64) -> Option<i32> {
        fabric::device_for_node(fabric::egm_node(addr)?).ok()
    }

    /// Events recorded on producer streams, by allocation base.
    static PRODUCERS: Mutex<Option<HashMap<u64, Event>>> = Mutex::new(None);

    pub(super) fn record_producer(addr: u64, stream: u64) -> Result<()> {
        driver()?;
        let o = owners::owner_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("0x{addr:x} is not CUDA memory this library allocated")))?;
        // The event lives in the context of the GPU the stream belongs to:
        // the memory's device, the GPU of an EGM owner's NUMA node, device 0
        // for pinned host memory.
        let device = match (o.kind, o.device) {
            (MemoryKind::Cuda | MemoryKind::CudaIpc | MemoryKind::Mnnvl, Some(d)) => d,
            (MemoryKind::Egm, _) => egm_device(addr).unwrap_or(0),
            (MemoryKind::PinnedHost, _) => 0,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "region at 0x{addr:x} is not CUDA, MNNVL, EGM or pinned memory"
                )))
            }
        };
        let event = Event::record(device, stream)?;
        // A superseded event is destroyed when dropped here.
        drop(PRODUCERS.lock().get_or_insert_with(HashMap::new).insert(o.base, event));
        Ok(())
    }

    pub(super) fn producer_pending(addr: u64) -> bool {
        let Some(o) = owners::owner_of(addr) else { return false };
        PRODUCERS.lock().as_ref().is_some_and(|m| m.contains_key(&o.base))
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
    pub(super) fn adopt(_: u64, _: u64) -> Result<Allocation> {
        absent()
    }
    pub(super) fn foreign(_: u64) -> Option<String> {
        None
    }
    pub(super) fn egm_device(_: u64) -> Option<i32> {
        None
    }
}
