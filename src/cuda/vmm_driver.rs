//! The VMM model's operations on the driver: where physical memory lives
//! (a GPU, or a host NUMA node for EGM), the allocation properties and
//! access grants the driver takes, and [`CudaVmm`], the model's
//! [`VmmOps`] for one placement and handle-type set. The table of
//! allocations, their export and import, and the MNNVL probe are
//! `fabric.rs`.

use super::driver::{can_access_peer, check, driver, ContextGuard};
use super::vmm::{devices_reaching, VmmOps};
use crate::error::{Error, Result};
use cudarc::driver::sys;

/// Where physical memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// GPU memory of a device.
    Device(i32),
    /// Host memory of a NUMA node (EGM).
    HostNuma(i32),
}

pub(super) const FABRIC: sys::CUmemAllocationHandleType = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
pub(super) const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// `Ok` when the driver has the fabric-handle VMM symbols (API 12030+).
pub fn fabric_ready() -> Result<()> {
    if !driver()?.fabric_symbols {
        return Err(Error::NotSupported(
            "the CUDA driver lacks the fabric-handle VMM symbols (driver API 12030+ needed)".into(),
        ));
    }
    Ok(())
}

pub(super) fn location(p: Placement) -> sys::CUmemLocation {
    // SAFETY: an all-zero location is valid storage; both fields are set.
    let mut l: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    match p {
        Placement::Device(d) => {
            l.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            l.id = d;
        }
        Placement::HostNuma(n) => {
            l.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA;
            l.id = n;
        }
    }
    l
}

pub(super) fn prop(p: Placement, handles: sys::CUmemAllocationHandleType) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero property block is valid; the fields that matter are set.
    let mut pr: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    pr.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    pr.requestedHandleTypes = handles;
    pr.location = location(p);
    pr
}

/// Grants read/write access to `va..va + size` for the GPUs `devices` and,
/// with `numa`, the CPU of that NUMA node; the caller has bound a context.
/// Returns the driver's result.
pub(super) fn grant(va: u64, size: u64, devices: &[i32], numa: Option<i32>) -> sys::CUresult {
    let rw = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    let mut descs: Vec<sys::CUmemAccessDesc> =
        devices.iter().map(|d| sys::CUmemAccessDesc { location: location(Placement::Device(*d)), flags: rw }).collect();
    if let Some(n) = numa {
        descs.push(sys::CUmemAccessDesc { location: location(Placement::HostNuma(n)), flags: rw });
    }
    // SAFETY: descs holds descs.len() valid entries.
    unsafe { sys::cuMemSetAccess(va, size as usize, descs.as_ptr(), descs.len()) }
}

/// The driver's VMM operations for one placement and handle-type set.
pub struct CudaVmm {
    pub(super) placement: Placement,
    pub(super) handles: sys::CUmemAllocationHandleType,
    pub(super) ctx: usize,
}

impl CudaVmm {
    pub(super) fn bind(&self) -> Result<ContextGuard> {
        ContextGuard::bind(self.ctx)
    }

    /// The reported allocation granularity.
    pub fn granularity(&self) -> Result<u64> {
        let _g = self.bind()?;
        let pr = prop(self.placement, self.handles);
        let mut g = 0usize;
        let opt = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: writes one size_t; pr is a valid property block.
        check(unsafe { sys::cuMemGetAllocationGranularity(&mut g, &pr, opt) }, "cuMemGetAllocationGranularity")?;
        Ok(g as u64)
    }
}

impl VmmOps for CudaVmm {
    fn create(&self, size: u64) -> Result<u64> {
        let _g = self.bind()?;
        let pr = prop(self.placement, self.handles);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; pr is valid.
        let r = unsafe { sys::cuMemCreate(&mut h, size as usize, &pr, 0) };
        if matches!(r, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
            return Err(Error::ResourceExhausted(format!("CUDA cannot supply {size} bytes at {:?}", self.placement)));
        }
        check(r, "cuMemCreate")?;
        Ok(h)
    }
    fn reserve(&self, size: u64) -> Result<u64> {
        let _g = self.bind()?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: writes one address.
        check(unsafe { sys::cuMemAddressReserve(&mut va, size as usize, 0, 0, 0) }, "cuMemAddressReserve")?;
        Ok(va)
    }
    fn map(&self, va: u64, size: u64, handle: u64) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: va is a reserved range of `size`; handle is a live allocation.
        check(unsafe { sys::cuMemMap(va, size as usize, 0, handle, 0) }, "cuMemMap")
    }
    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        let _g = self.bind()?;
        // The GPUs that can reach the memory (peer ordinals never enter
        // here): for device memory its own GPU and every visible one
        // `cuDeviceCanAccessPeer` says reaches it (granting one without a
        // path fails the whole call, INVALID_DEVICE); for EGM every GPU and
        // the CPU of its NUMA node.
        let all = driver()?.devices;
        let (devices, numa) = match self.placement {
            Placement::Device(p) => (devices_reaching(p, all, can_access_peer)?, None),
            Placement::HostNuma(n) => ((0..all).collect(), Some(n)),
        };
        check(grant(va, size, &devices, numa), "cuMemSetAccess")
    }
    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: va was mapped with this size.
        check(unsafe { sys::cuMemUnmap(va, size as usize) }, "cuMemUnmap")
    }
    fn release(&self, handle: u64) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: our handle, unmapped.
        check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease")
    }
    fn address_free(&self, va: u64, size: u64) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: our reserved range, unmapped.
        check(unsafe { sys::cuMemAddressFree(va, size as usize) }, "cuMemAddressFree")
    }
}
