//! The seed's Rust names for CUDA memory, over the C-ABI-backed functions in
//! `cuda_support` (identical in every build; without CUDA they answer
//! `Unavailable` with the reason).

use crate::cuda_support;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::memory::{Access, Allocation, MemoryKind};

/// CUDA device memory owned by the library.
pub struct CudaMemory;

impl CudaMemory {
    /// Device memory on `device` (not exportable).
    pub fn allocate(device: i32, len: u64) -> Result<Allocation> {
        cuda_support::allocate_device(device, len, false)
    }

    /// Device memory for CUDA IPC export: physically rounded up to 2 MiB and
    /// zeroed; the logical length stays `len`.
    pub fn allocate_ipc(device: i32, len: u64) -> Result<Allocation> {
        cuda_support::allocate_device(device, len, true)
    }
}

/// Pinned (page-locked) host memory, usable by every context.
pub fn allocate_pinned_host(len: u64) -> Result<Allocation> {
    cuda_support::allocate_pinned_host(len)
}

/// Fabric-exportable GPU memory (MNNVL), rounded to the driver's granularity.
pub fn allocate_mnnvl(device: i32, len: u64) -> Result<Allocation> {
    cuda_support::allocate_mnnvl(device, len)
}

/// Fabric-exportable host memory on a NUMA node (EGM).
pub fn allocate_egm(numa_node: i32, len: u64) -> Result<Allocation> {
    cuda_support::allocate_egm(numa_node, len)
}

/// Checked local release of an MNNVL allocation (unmap, release, free the
/// address range); `Unquiesced` keeps it, with its owners and charges.
pub fn free_mnnvl(a: Allocation) -> std::result::Result<(), (Allocation, Error)> {
    a.free()
}

/// Checked local release of an EGM allocation (see [`free_mnnvl`]).
pub fn free_egm(a: Allocation) -> std::result::Result<(), (Allocation, Error)> {
    a.free()
}

/// Adopts existing VMM device storage for MNNVL export.
///
/// # Safety
/// `[va, va+size)` must be the whole mapping of the VMM allocation `handle`,
/// its padding initialized, and the caller consents to sharing it with
/// peers; the caller keeps the final unmap (freeing the result forgets it).
#[cfg(feature = "cuda")]
pub unsafe fn wrap_mnnvl(device: i32, va: u64, size: u64, handle: u64) -> Result<Allocation> {
    // SAFETY: the caller upholds the preconditions documented above.
    unsafe {
        crate::cuda::mnnvl::wrap(MemoryKind::Mnnvl, crate::cuda::mnnvl::Placement::Device(device), va, size, handle)
    }
}

/// Adopts existing VMM host (NUMA) storage for EGM export.
///
/// # Safety
/// As for [`wrap_mnnvl`].
#[cfg(feature = "cuda")]
pub unsafe fn wrap_egm(numa_node: i32, va: u64, size: u64, handle: u64) -> Result<Allocation> {
    // SAFETY: the caller upholds the preconditions documented above.
    unsafe {
        crate::cuda::mnnvl::wrap(MemoryKind::Egm, crate::cuda::mnnvl::Placement::HostNuma(numa_node), va, size, handle)
    }
}

impl Engine {
    /// Registers several library CUDA allocations at once (whole logical
    /// ranges). Either every one is registered or none is.
    pub fn register_cuda_memory_batch(&self, allocs: &[(&Allocation, Access)]) -> Result<Vec<u64>> {
        let mut done = Vec::with_capacity(allocs.len());
        for (a, access) in allocs {
            if !matches!(a.kind(), MemoryKind::Cuda | MemoryKind::CudaIpc | MemoryKind::Mnnvl | MemoryKind::Egm) {
                let e = Error::InvalidArgument(format!(
                    "allocation at 0x{:x} holds {} memory, not CUDA memory",
                    a.addr(),
                    a.kind().name()
                ));
                self.undo(&done);
                return Err(e);
            }
            match self.register_memory(a.addr(), a.len(), *access) {
                Ok(id) => done.push(id),
                Err(e) => {
                    self.undo(&done);
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Registers library pinned host memory (the pinned-host counterpart of
    /// `register_cuda_memory_batch`; pageable memory is refused).
    pub fn register_host_memory(&self, a: &Allocation, access: Access) -> Result<u64> {
        if a.kind() != MemoryKind::PinnedHost {
            return Err(Error::InvalidArgument(format!(
                "allocation at 0x{:x} holds {} memory; NVLink host directions need allocate_pinned_host memory",
                a.addr(),
                a.kind().name()
            )));
        }
        self.register_memory(a.addr(), a.len(), access)
    }

    /// Hands a producer stream over for pinned host memory (the pinned-host
    /// variant of `record_producer_stream`).
    pub fn record_pinned_host_producer_stream(&self, region: u64, cu_stream: u64) -> Result<()> {
        self.record_producer_stream(region, cu_stream)
    }

    fn undo(&self, ids: &[u64]) {
        for id in ids {
            let _ = self.unregister_memory(*id, None);
        }
    }
}
