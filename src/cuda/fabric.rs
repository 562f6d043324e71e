//! VMM memory on the driver: fabric-handle (or POSIX-fd) allocations on a
//! GPU or a host NUMA node (EGM), the table of every such allocation of the
//! process, their export and import as shareable handles, and EGM NUMA
//! placement. Fabric symbols are resolved only when MNNVL is requested;
//! the allocation life cycle is the CPU-tested model in [`super::vmm`].

use super::driver::{check, check_device, driver, primary_context, ContextGuard, Ctx};
use super::vmm::{VmmAllocation, VmmOps, VmmState, FABRIC_HANDLE_BYTES};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// Placement, properties and the driver's VMM operations live in `vmm_driver.rs`.
pub use super::vmm_driver::{fabric_ready, CudaVmm, Placement};
use super::vmm_driver::{grant, location, prop, FABRIC, POSIX_FD};

struct Entry {
    alloc: VmmAllocation,
    ops: CudaVmm,
}

/// Every VMM allocation of the process (made here or wrapped), by address.
static VMM: Mutex<BTreeMap<u64, Entry>> = Mutex::new(BTreeMap::new());
static FABRIC_WORKS: Mutex<Option<HashMap<i32, bool>>> = Mutex::new(None);

/// Whether a real (small) fabric export works on `device`: the attribute can
/// say yes while no IMEX channel exists, so the probe exports for real.
pub fn fabric_export_works(device: i32) -> Result<bool> {
    if let Some(v) = FABRIC_WORKS.lock().get_or_insert_with(HashMap::new).get(&device) {
        return Ok(*v);
    }
    let ctx = primary_context(device)?;
    let ops = CudaVmm { placement: Placement::Device(device), handles: FABRIC, ctx };
    let works = (|| -> Result<()> {
        let g = ops.granularity()?;
        let h = ops.create(g)?;
        let _c = ContextGuard::bind(ctx)?;
        let mut fh = sys::CUmemFabricHandle { data: [0; FABRIC_HANDLE_BYTES] };
        // SAFETY: exports our fresh handle into a 64-byte buffer.
        let r = check(
            unsafe { sys::cuMemExportToShareableHandle((&mut fh as *mut sys::CUmemFabricHandle).cast(), h, FABRIC, 0) },
            "fabric export probe",
        );
        let _ = ops.release(h);
        r
    })()
    .is_ok();
    FABRIC_WORKS.lock().get_or_insert_with(HashMap::new).insert(device, works);
    Ok(works)
}

/// The exportable handle types of a caller's VMM allocation, after checking
/// its properties against the seed's preconditions: pinned, placed where the
/// caller says, and created with POSIX-fd and/or fabric handle types.
fn wrapped_handle_types(placement: Placement, handle: u64) -> Result<sys::CUmemAllocationHandleType> {
    // SAFETY: an all-zero property block is valid storage for the driver.
    let mut pr: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: writes one property block; the driver validates the handle.
    check(
        unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut pr, handle) },
        "cuMemGetAllocationPropertiesFromHandle (is this a live VMM allocation handle?)",
    )
    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    if pr.type_ != sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(Error::InvalidArgument(format!("VMM handle 0x{handle:x} is not a pinned allocation")));
    }
    let want = location(placement);
    if pr.location.type_ != want.type_ || pr.location.id != want.id {
        return Err(Error::InvalidArgument(format!(
            "VMM handle 0x{handle:x} lives at {:?} {}, not at {placement:?}",
            pr.location.type_, pr.location.id
        )));
    }
    let types = pr.requestedHandleTypes.0 & (FABRIC.0 | POSIX_FD.0);
    if types == 0 {
        return Err(Error::InvalidArgument(format!(
            "VMM handle 0x{handle:x} was created without POSIX-fd or fabric handle types: it cannot be exported"
        )));
    }
    Ok(sys::CUmemAllocationHandleType_enum(types))
}

static NODE_DEVICES: Mutex<Option<HashMap<i32, Option<i32>>>> = Mutex::new(None);

/// The visible GPU attached to host NUMA node `node`
/// (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`): EGM memory there is copied on that
/// GPU. An unknown or incompatible placement is `NotSupported`.
pub fn device_for_node(node: i32) -> Result<i32> {
    if let Some(found) = NODE_DEVICES.lock().get_or_insert_with(HashMap::new).get(&node) {
        return found.ok_or_else(|| no_gpu_at(node));
    }
    let devices = driver()?.devices;
    let found = (0..devices).find(|&d| {
        let mut dev = 0;
        let mut numa = -1;
        // SAFETY: the driver was probed; both calls write one int.
        unsafe {
            sys::cuDeviceGet(&mut dev, d) == sys::CUresult::CUDA_SUCCESS
                && sys::cuDeviceGetAttribute(&mut numa, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev)
                    == sys::CUresult::CUDA_SUCCESS
        }
        .then_some(numa)
            == Some(node)
    });
    NODE_DEVICES.lock().get_or_insert_with(HashMap::new).insert(node, found);
    found.ok_or_else(|| no_gpu_at(node))
}

fn no_gpu_at(node: i32) -> Error {
    Error::NotSupported(format!(
        "no visible GPU is attached to NUMA node {node}: EGM memory there cannot be copied over MNNVL"
    ))
}

/// Where new VMM memory goes: the GPU of a device, or host memory of a
/// NUMA node (EGM). Fabric handles when a real export works on that GPU,
/// POSIX fds (same host) otherwise; never ordinary device memory.
/// Returns the mapped address and the physical (granularity-rounded) size.
pub fn allocate(placement: Placement, len: u64) -> Result<(u64, u64)> {
    let ctx_device = match placement {
        Placement::Device(d) => {
            check_device(d)?;
            d
        }
        Placement::HostNuma(n) => {
            driver()?;
            if n < 0 {
                return Err(Error::InvalidArgument(format!("NUMA node {n} does not exist")));
            }
            0
        }
    };
    fabric_ready()?;
    let ctx = primary_context(ctx_device)?;
    let handles = if fabric_export_works(ctx_device)? {
        sys::CUmemAllocationHandleType_enum(FABRIC.0 | POSIX_FD.0)
    } else {
        POSIX_FD
    };
    let ops = CudaVmm { placement, handles, ctx };
    let g = ops.granularity()?;
    let alloc = VmmAllocation::allocate(&ops, len, g)?;
    let out = (alloc.va, alloc.physical);
    VMM.lock().insert(alloc.va, Entry { alloc, ops });
    Ok(out)
}

/// Records existing VMM storage `[va, va+size)` mapped from `handle` after
/// checking it: a live pinned allocation placed where the caller says,
/// exportable (POSIX-fd and/or fabric handle types), aligned to the
/// granularity and mapped exactly there.
///
/// # Safety
/// The caller owns the whole allocation, its padding is initialized, the
/// mapping is exactly `[va, va+size)`, and the caller consents to sharing it
/// with peers. The external owner keeps the final unmap: [`free`] only
/// forgets it.
pub unsafe fn wrap(placement: Placement, va: u64, size: u64, handle: u64) -> Result<()> {
    fabric_ready()?;
    let device = match placement {
        Placement::Device(d) => d,
        Placement::HostNuma(_) => 0,
    };
    let ctx = primary_context(device)?;
    let handles = wrapped_handle_types(placement, handle)?;
    let ops = CudaVmm { placement, handles, ctx };
    let g = ops.granularity()?;
    if size == 0 || size % g != 0 || va % g != 0 {
        return Err(Error::InvalidArgument(format!("0x{va:x}+{size} is not aligned to the granularity {g}")));
    }
    let c = ContextGuard::bind(ctx)?;
    let (mut base, mut len) = (0u64, 0usize);
    // SAFETY: queries the driver about an address; writes two values.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, va) };
    c.restore()?;
    if r == sys::CUresult::CUDA_SUCCESS && (base != va || len as u64 != size) {
        return Err(Error::InvalidArgument(format!(
            "0x{va:x}+{size} is not a whole mapping (the driver reports 0x{base:x}+{len})"
        )));
    }
    let alloc = VmmAllocation { va, physical: size, handle, state: VmmState::Mapped, exports: 0, owned: false };
    VMM.lock().insert(va, Entry { alloc, ops });
    Ok(())
}

/// The checked local release of the VMM allocation at `va` (unmap, release,
/// free the range); `Unquiesced` keeps it. Wrapped storage is only
/// forgotten (refused while exports are outstanding).
pub fn free(va: u64) -> Result<()> {
    let mut map = VMM.lock();
    let e = map.get_mut(&va).ok_or_else(|| Error::NotFound(format!("no VMM allocation at 0x{va:x}")))?;
    if e.alloc.owned {
        e.alloc.free(&e.ops)?;
    } else if e.alloc.exports > 0 {
        // Wrapped storage reaches here only through its allocation's release
        // hook, which `owners` calls after refusing a free while an export
        // holds the allocation (`release`'s and `release_adoption`'s
        // `counts.exported > 0`; owners_tests.rs
        // `an_exported_allocation_no_engine_registers_is_not_freed` and
        // `an_exported_adoption_is_not_freed`); that hold is let go after the
        // export's `retire_export` everywhere but where an answer's grant ends
        // while its handle is made (`ExportTable::answer`: the handle is then
        // dropped unsent). This check covers that moment; no test reaches it.
        return Err(Error::Unavailable(format!("{} exports are outstanding", e.alloc.exports)));
    }
    map.remove(&va);
    Ok(())
}

/// The NUMA node of the EGM allocation holding `addr` (`None`: not EGM).
pub fn egm_node(addr: u64) -> Option<i32> {
    let map = VMM.lock();
    let (_, e) = map.range(..=addr).next_back()?;
    if addr >= e.alloc.va + e.alloc.physical {
        return None;
    }
    match e.ops.placement {
        Placement::HostNuma(n) => Some(n),
        Placement::Device(_) => None,
    }
}

/// How an export names its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleType {
    /// A 64-byte fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`).
    Fabric,
    /// A POSIX file descriptor (same host).
    PosixFd,
}

/// A shareable handle made for one export.
pub enum Shareable {
    /// A fabric handle.
    Fabric([u8; FABRIC_HANDLE_BYTES]),
    /// A file descriptor made for this export alone.
    PosixFd(OwnedFd),
}

/// What an export of a VMM allocation hands out.
pub struct Exported {
    /// Physical size of the allocation.
    pub physical: u64,
    /// The granularity it was created with.
    pub granularity: u64,
    /// The handle.
    pub handle: Shareable,
}

/// Exports the VMM allocation at `base` as a `ty` handle and counts the
/// export (the allocation cannot be freed until [`retire_export`]).
pub fn export(base: u64, ty: HandleType) -> Result<Exported> {
    let mut map = VMM.lock();
    let e =
        map.get_mut(&base).ok_or_else(|| Error::NotSupported(format!("0x{base:x} is not an MNNVL/EGM allocation")))?;
    let granularity = e.ops.granularity()?;
    let c = e.ops.bind()?;
    let handle = match ty {
        HandleType::Fabric => {
            if e.ops.handles.0 & FABRIC.0 == 0 {
                let cause = super::fabric_cause::Cause::AllocationNotFabric;
                return Err(Error::NotSupported(format!(
                    "{}: the allocation at 0x{base:x} was created without fabric handles (its requested handle \
                     types lack CU_MEM_HANDLE_TYPE_FABRIC: a caller's VMM memory wrapped without them, or memory \
                     allocated while a fabric export did not work here), so it cannot be exported to a peer; {}",
                    cause.name(),
                    cause.remedy()
                )));
            }
            let mut fh = sys::CUmemFabricHandle { data: [0; FABRIC_HANDLE_BYTES] };
            // SAFETY: exports the allocation's handle into 64 bytes.
            check(
                unsafe {
                    sys::cuMemExportToShareableHandle(
                        (&mut fh as *mut sys::CUmemFabricHandle).cast(),
                        e.alloc.handle,
                        FABRIC,
                        0,
                    )
                },
                "cuMemExportToShareableHandle (fabric)",
            )?;
            Shareable::Fabric(fh.data)
        }
        HandleType::PosixFd => {
            let mut fd: libc::c_int = -1;
            // SAFETY: exports into one int fd that we then own.
            check(
                unsafe {
                    sys::cuMemExportToShareableHandle((&mut fd as *mut libc::c_int).cast(), e.alloc.handle, POSIX_FD, 0)
                },
                "cuMemExportToShareableHandle (posix fd)",
            )?;
            // SAFETY: a fresh fd from the driver, owned here.
            Shareable::PosixFd(unsafe { OwnedFd::from_raw_fd(fd) })
        }
    };
    c.restore()?;
    e.alloc.add_export()?;
    Ok(Exported { physical: e.alloc.physical, granularity, handle })
}

/// An export of the allocation at `base` ended.
pub fn retire_export(base: u64) {
    if let Some(e) = VMM.lock().get_mut(&base) {
        let _ = e.alloc.retire_export();
    }
}

/// A peer's handle, as received.
pub enum Received<'a> {
    /// A fabric handle.
    Fabric(&'a [u8; FABRIC_HANDLE_BYTES]),
    /// A POSIX fd that came with the handle.
    PosixFd(&'a OwnedFd),
}

/// A peer's VMM allocation mapped here, on the visible local GPUs.
#[derive(Debug, Clone, Copy)]
pub struct Imported {
    /// Local address of the mapping.
    pub va: u64,
    /// Bytes mapped.
    pub size: u64,
    /// The imported allocation handle.
    pub handle: u64,
    /// The context it was mapped in (`device`'s primary context).
    pub ctx: Ctx,
}

/// Imports a peer's handle of `physical` bytes in `device`'s primary context
/// and maps it with access for `device`, the GPU its copies run on (peer
/// ordinals never select a context); a GPU with no path to the memory is
/// refused `NOT_SUPPORTED`, naming it, before anything is posted.
pub fn import(received: Received<'_>, physical: u64, device: i32) -> Result<Imported> {
    let ctx = primary_context(device)?;
    let g = ContextGuard::bind(ctx)?;
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    match received {
        Received::Fabric(data) => {
            let mut fh = sys::CUmemFabricHandle { data: *data };
            // SAFETY: imports from a 64-byte fabric handle; the driver checks reachability.
            check(
                unsafe {
                    sys::cuMemImportFromShareableHandle(&mut h, (&mut fh as *mut sys::CUmemFabricHandle).cast(), FABRIC)
                },
                "cuMemImportFromShareableHandle (fabric)",
            )?;
        }
        Received::PosixFd(fd) => {
            // SAFETY: the driver takes the fd value as the OS handle.
            check(
                unsafe { sys::cuMemImportFromShareableHandle(&mut h, fd.as_raw_fd() as usize as *mut _, POSIX_FD) },
                "cuMemImportFromShareableHandle (posix fd)",
            )?;
        }
    }
    let ops = CudaVmm { placement: Placement::Device(device), handles: POSIX_FD, ctx };
    let va = match ops.reserve(physical) {
        Ok(v) => v,
        Err(e) => {
            let _ = ops.release(h);
            return Err(e);
        }
    };
    // Copies through the import run on `device` alone: only it is granted.
    // The driver refuses a GPU with no path to the exporter's memory.
    let granted = || match grant(va, physical, &[device], None) {
        sys::CUresult::CUDA_ERROR_INVALID_DEVICE => Err(Error::NotSupported(format!(
            "GPU {device} has no path to the exported allocation (cuMemSetAccess refused it: no peer access \
             between the two GPUs); register local memory on a GPU that reaches it"
        ))),
        r => check(r, "cuMemSetAccess"),
    };
    if let Err(e) = ops.map(va, physical, h).and_then(|_| granted()) {
        let _ = ops.unmap(va, physical);
        let _ = ops.release(h);
        let _ = ops.address_free(va, physical);
        return Err(e);
    }
    g.restore()?;
    Ok(Imported { va, size: physical, handle: h, ctx })
}

impl Imported {
    /// The native close: unmap, release the imported handle, free the
    /// range. The caller has bound the import's context; a failure leaves
    /// the state partial (never retried).
    pub fn close(&self) -> Result<()> {
        // SAFETY: the import's own mapping, handle and range.
        check(unsafe { sys::cuMemUnmap(self.va, self.size as usize) }, "cuMemUnmap (import)")?;
        // SAFETY: as above.
        check(unsafe { sys::cuMemRelease(self.handle) }, "cuMemRelease (import)")?;
        // SAFETY: as above.
        check(unsafe { sys::cuMemAddressFree(self.va, self.size as usize) }, "cuMemAddressFree (import)")
    }
}

/// The VMM allocation handle behind a mapped address, as a new reference
/// the caller must give back with [`release_handle`]; `None` when `addr`
/// is not VMM memory (or the driver lacks `cuMemRetainAllocationHandle`).
pub fn retained_handle(addr: u64) -> Result<Option<u64>> {
    driver()?;
    if !super::driver::has_symbol("cuMemRetainAllocationHandle") {
        return Ok(None);
    }
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: symbol present; writes one handle, or fails for memory that
    // was not mapped through VMM.
    let r = unsafe { sys::cuMemRetainAllocationHandle(&mut h, addr as *mut std::ffi::c_void) };
    Ok((r == sys::CUresult::CUDA_SUCCESS).then_some(h))
}

/// Gives back a reference taken by [`retained_handle`].
pub fn release_handle(handle: u64) -> Result<()> {
    // SAFETY: a reference this process took; releasing it leaves the
    // caller's mapping (which holds its own reference) intact.
    check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease (retained handle)")
}

/// Where the VMM allocation behind `handle` lives.
pub fn handle_placement(handle: u64) -> Result<Placement> {
    // SAFETY: an all-zero property block is valid storage for the driver.
    let mut pr: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: writes one property block; the driver validates the handle.
    check(
        unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut pr, handle) },
        "cuMemGetAllocationPropertiesFromHandle",
    )?;
    match pr.location.type_ {
        sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => Ok(Placement::Device(pr.location.id)),
        sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA => Ok(Placement::HostNuma(pr.location.id)),
        other => Err(Error::NotSupported(format!("VMM memory placed at {other:?} cannot be exported over MNNVL"))),
    }
}

/// Whether GPU `device` says it supports fabric handles
/// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`). It can say yes
/// while no IMEX channel lets this process use them: only a real export
/// proves that ([`ProbeAllocation`]).
pub fn fabric_attribute(device: i32) -> Result<bool> {
    check_device(device)?;
    fabric_ready()?;
    let mut dev = 0;
    // SAFETY: the driver was probed; writes one device handle.
    check(unsafe { sys::cuDeviceGet(&mut dev, device) }, "cuDeviceGet")?;
    let mut v = 0;
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED;
    // SAFETY: the symbol is among the fabric ones probed; writes one int.
    check(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) }, "cuDeviceGetAttribute (fabric handles)")?;
    Ok(v != 0)
}

/// A failed step of a probe: which driver call, its result (`None` when
/// the failure was not the driver's answer) and the error in words.
#[derive(Debug, Clone)]
pub struct ProbeFailure {
    /// The driver call that failed.
    pub step: &'static str,
    /// Its `CUresult`, when the driver answered.
    pub code: Option<i32>,
    /// The error.
    pub error: Error,
}

impl ProbeFailure {
    fn of(step: &'static str, error: Error) -> ProbeFailure {
        ProbeFailure { step, code: None, error }
    }

    fn driver(step: &'static str, r: sys::CUresult) -> ProbeFailure {
        let error = check(r, step).expect_err("a failed result");
        ProbeFailure { step, code: Some(r as i32), error }
    }
}

fn probe_step(r: sys::CUresult, step: &'static str) -> std::result::Result<(), ProbeFailure> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(ProbeFailure::driver(step, r))
    }
}

/// A small VMM allocation made, zeroed and exported with an engine's MNNVL
/// handle type at its start, before MNNVL is advertised: the attribute can
/// say yes while the process may not create or export such memory (no IMEX
/// channel), so only a real export proves it. It stays, exported, for the
/// probe imports of peers (its bytes are zero: a peer learns nothing from
/// them), and is freed when dropped.
pub struct ProbeAllocation {
    alloc: VmmAllocation,
    ops: CudaVmm,
    granularity: u64,
    fabric: Option<[u8; FABRIC_HANDLE_BYTES]>,
    fd: Option<OwnedFd>,
}

/// The probe's shareable handle, for one peer.
pub enum ProbeHandle {
    /// Its fabric handle.
    Fabric([u8; FABRIC_HANDLE_BYTES]),
    /// A descriptor of its POSIX-fd export, made for this peer.
    PosixFd(OwnedFd),
}

impl ProbeAllocation {
    /// Creates, maps, zeroes and exports one granule on GPU `device` with
    /// handle type `ty`.
    pub fn new(device: i32, ty: HandleType) -> std::result::Result<ProbeAllocation, ProbeFailure> {
        check_device(device).map_err(|e| ProbeFailure::of("device", e))?;
        fabric_ready().map_err(|e| ProbeFailure::of("fabric symbols", e))?;
        let ctx = primary_context(device).map_err(|e| ProbeFailure::of("cuDevicePrimaryCtxRetain", e))?;
        let handles = match ty {
            HandleType::Fabric => FABRIC,
            HandleType::PosixFd => POSIX_FD,
        };
        let ops = CudaVmm { placement: Placement::Device(device), handles, ctx };
        let granularity = ops.granularity().map_err(|e| ProbeFailure::of("cuMemGetAllocationGranularity", e))?;
        let g = ContextGuard::bind(ctx).map_err(|e| ProbeFailure::of("cuCtxSetCurrent", e))?;
        let pr = prop(Placement::Device(device), handles);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; pr is a valid property block.
        probe_step(unsafe { sys::cuMemCreate(&mut h, granularity as usize, &pr, 0) }, "cuMemCreate")?;
        let release = |h| {
            // SAFETY: our fresh handle, not mapped.
            let _ = unsafe { sys::cuMemRelease(h) };
        };
        let va = match ops.reserve(granularity) {
            Ok(va) => va,
            Err(e) => {
                release(h);
                return Err(ProbeFailure::of("cuMemAddressReserve", e));
            }
        };
        if let Err(e) = ops.map(va, granularity, h) {
            release(h);
            let _ = ops.address_free(va, granularity);
            return Err(ProbeFailure::of("cuMemMap", e));
        }
        // Mapped: from here on a failure drops the probe, which unmaps,
        // releases and frees the range.
        let alloc =
            VmmAllocation { va, physical: granularity, handle: h, state: VmmState::Mapped, exports: 0, owned: true };
        let mut probe = ProbeAllocation { alloc, ops, granularity, fabric: None, fd: None };
        probe.ops.set_access(va, granularity).map_err(|e| ProbeFailure::of("cuMemSetAccess", e))?;
        // Zeroed on a stream of its own that waits for nobody (a context
        // or legacy-stream synchronisation would wait for the
        // application's work).
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let non_blocking = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: writes one stream handle in the bound context.
        probe_step(unsafe { sys::cuStreamCreate(&mut stream, non_blocking) }, "cuStreamCreate")?;
        // SAFETY: the mapping made above, on that stream.
        let set = unsafe { sys::cuMemsetD8Async(va, 0, granularity as usize, stream) };
        // SAFETY: our stream, waited for and destroyed here.
        let synced = unsafe { sys::cuStreamSynchronize(stream) };
        // SAFETY: as above; its work is done (or failed).
        let _ = unsafe { sys::cuStreamDestroy_v2(stream) };
        probe_step(set, "cuMemsetD8Async")?;
        probe_step(synced, "cuStreamSynchronize")?;
        match ty {
            HandleType::Fabric => {
                let mut fh = sys::CUmemFabricHandle { data: [0; FABRIC_HANDLE_BYTES] };
                // SAFETY: exports our handle into a 64-byte buffer.
                let r = unsafe {
                    sys::cuMemExportToShareableHandle((&mut fh as *mut sys::CUmemFabricHandle).cast(), h, FABRIC, 0)
                };
                probe_step(r, "cuMemExportToShareableHandle (fabric)")?;
                probe.fabric = Some(fh.data);
            }
            HandleType::PosixFd => {
                let mut fd: libc::c_int = -1;
                // SAFETY: exports into one int fd that we then own.
                let r =
                    unsafe { sys::cuMemExportToShareableHandle((&mut fd as *mut libc::c_int).cast(), h, POSIX_FD, 0) };
                probe_step(r, "cuMemExportToShareableHandle (posix fd)")?;
                // SAFETY: a fresh fd from the driver, owned here.
                probe.fd = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        g.restore().map_err(|e| ProbeFailure::of("cuCtxSetCurrent", e))?;
        Ok(probe)
    }

    /// Physical bytes (one granule).
    pub fn physical(&self) -> u64 {
        self.alloc.physical
    }

    /// The granularity it was made with.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Its handle for one peer (a POSIX-fd export hands each peer a
    /// descriptor of its own).
    pub fn handle(&self) -> Result<ProbeHandle> {
        match (&self.fabric, &self.fd) {
            (Some(f), _) => Ok(ProbeHandle::Fabric(*f)),
            (None, Some(fd)) => fd
                .try_clone()
                .map(ProbeHandle::PosixFd)
                .map_err(|e| Error::io("duplicating the probe's descriptor", &e)),
            (None, None) => Err(Error::Unavailable("the probe allocation has no export".into())),
        }
    }
}

impl Drop for ProbeAllocation {
    fn drop(&mut self) {
        // Imports of it elsewhere hold their own references to the memory.
        let _ = self.alloc.free(&self.ops);
    }
}

/// Imports a peer's probe handle in GPU `device`'s context and releases it
/// again: what decides whether MNNVL is used toward that peer (the IMEX
/// domain's refusals happen at the import; a GPU without a path to the
/// memory is refused later, per group, naming it). The driver's refusal is
/// opaque (every IMEX-domain reason reads "invalid resource handle"): its
/// result is kept for the caller to explain.
pub fn probe_import(received: Received<'_>, device: i32) -> std::result::Result<(), ProbeFailure> {
    let ctx = primary_context(device).map_err(|e| ProbeFailure::of("cuDevicePrimaryCtxRetain", e))?;
    let g = ContextGuard::bind(ctx).map_err(|e| ProbeFailure::of("cuCtxSetCurrent", e))?;
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    let r = match received {
        Received::Fabric(data) => {
            let mut fh = sys::CUmemFabricHandle { data: *data };
            // SAFETY: imports from a 64-byte fabric handle; the driver checks it.
            unsafe {
                sys::cuMemImportFromShareableHandle(&mut h, (&mut fh as *mut sys::CUmemFabricHandle).cast(), FABRIC)
            }
        }
        // SAFETY: the driver takes the fd value as the OS handle.
        Received::PosixFd(fd) => unsafe {
            sys::cuMemImportFromShareableHandle(&mut h, fd.as_raw_fd() as usize as *mut _, POSIX_FD)
        },
    };
    probe_step(r, "cuMemImportFromShareableHandle")?;
    // SAFETY: the handle just imported, not mapped.
    let released = probe_step(unsafe { sys::cuMemRelease(h) }, "cuMemRelease");
    g.restore().map_err(|e| ProbeFailure::of("cuCtxSetCurrent", e))?;
    released
}
