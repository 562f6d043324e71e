//! CUDA, MNNVL and EGM allocations. Without CUDA (this build or this host)
//! they return ORBITE_STATUS_UNAVAILABLE with the reason.

use super::boundary::*;
use super::memory::allocate_into;
use super::types::*;
use crate::{allocate_egm, allocate_mnnvl, allocate_pinned_host, cuda_adopt, retained_resources_json, CudaMemory};
use std::ffi::{c_char, c_void};

/// Allocates CUDA device memory on `device` (not exportable).
#[no_mangle]
pub extern "C" fn orbite_cuda_allocate(
    device: i32,
    length: usize,
    out_alloc: *mut *mut orbite_allocation,
) -> orbite_status {
    guard(|| allocate_into(out_alloc, length, |len| CudaMemory::allocate(device, len)))
}

/// Allocates CUDA device memory for IPC export (2 MiB physical rounding, zeroed).
#[no_mangle]
pub extern "C" fn orbite_cuda_allocate_ipc(
    device: i32,
    length: usize,
    out_alloc: *mut *mut orbite_allocation,
) -> orbite_status {
    guard(|| allocate_into(out_alloc, length, |len| CudaMemory::allocate_ipc(device, len)))
}

/// Allocates pinned (page-locked) host memory through CUDA.
#[no_mangle]
pub extern "C" fn orbite_cuda_allocate_pinned_host(
    length: usize,
    out_alloc: *mut *mut orbite_allocation,
) -> orbite_status {
    guard(|| allocate_into(out_alloc, length, allocate_pinned_host))
}

/// Allocates fabric-exportable GPU memory (MNNVL).
#[no_mangle]
pub extern "C" fn orbite_allocate_mnnvl(
    device: i32,
    length: usize,
    out_alloc: *mut *mut orbite_allocation,
) -> orbite_status {
    guard(|| allocate_into(out_alloc, length, |len| allocate_mnnvl(device, len)))
}

/// Allocates fabric-exportable host memory on a NUMA node (EGM).
#[no_mangle]
pub extern "C" fn orbite_allocate_egm(
    numa_node: i32,
    length: usize,
    out_alloc: *mut *mut orbite_allocation,
) -> orbite_status {
    guard(|| allocate_into(out_alloc, length, |len| allocate_egm(numa_node, len)))
}

/// Adopts CUDA memory the caller's stack allocated (`cudaMalloc`/`cuMemAlloc`,
/// or CUDA VMM memory from `cuMemCreate`) so that the NVLink/MNNVL/EGM
/// transports can export it and copy with it. `flags` must contain
/// ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION (a peer that imports it can reach the
/// whole underlying allocation). `[ptr, ptr+length)` must lie in one
/// allocation; adoptions inside one allocation share one export. Managed and
/// host memory: INVALID_ARGUMENT; `ptr` NULL: NULL_ARGUMENT. The memory
/// stays the caller's: orbite_allocation_free releases only the library's
/// record (UNAVAILABLE while registered or exported); free the memory after
/// that.
#[no_mangle]
pub extern "C" fn orbite_cuda_adopt(
    ptr: *mut c_void,
    length: usize,
    flags: u32,
    out_alloc: *mut *mut orbite_allocation,
) -> orbite_status {
    guard(|| {
        if ptr.is_null() {
            return Err(crate::Error::NullArgument("ptr is NULL".into()));
        }
        allocate_into(out_alloc, length, |len| cuda_adopt(ptr as u64, len, flags))
    })
}

/// Writes, as JSON, the CUDA driver as probed (`cuda_available`, and the
/// reason when it is not) and what every live engine of the process retains
/// after unconfirmed cleanups (`engines`: exports without a close receipt,
/// imports whose close was not confirmed, quarantined streams).
#[no_mangle]
pub extern "C" fn orbite_cuda_retained_resources_json(
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> orbite_status {
    guard(|| write_text(&retained_resources_json(), buf, cap, out_len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::said;
    use crate::Status;

    /// orbite_cuda_adopt of a NULL `ptr` (valid flags, length and out) is
    /// NULL_ARGUMENT "ptr is NULL", writing no handle, with or without
    /// CUDA (no driver is asked). Guards the NULL check of `ptr` in
    /// `orbite_cuda_adopt` (round 14 N2: without it, NULL went to the
    /// adopt as address 0 and was INVALID_ARGUMENT "cannot adopt 0x0+4096").
    #[test]
    fn adopting_a_null_pointer_is_a_null_argument() {
        let mut out: *mut orbite_allocation = std::ptr::null_mut();
        let st = orbite_cuda_adopt(std::ptr::null_mut(), 4096, ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION, &mut out);
        let said = said();
        assert_eq!((st, said.as_str()), (Status::NullArgument as u32, "null argument: ptr is NULL"));
        assert!(out.is_null(), "no handle written");
    }

    /// Every CUDA, MNNVL and EGM allocating entry point refuses its
    /// arguments before any driver is asked, the same with or without
    /// CUDA, each case named: out_alloc NULL is NULL_ARGUMENT "out_alloc
    /// is NULL", length 0 INVALID_ARGUMENT "length is 0" (not UNAVAILABLE
    /// for want of a driver), no handle written; orbite_cuda_adopt of a
    /// non-NULL pointer the same. Guards `allocate_into`'s `length == 0`
    /// check as each of them reaches it, and orbite_cuda_adopt's order
    /// (ptr, then out_alloc and length).
    #[test]
    fn allocating_entry_points_refuse_null_out_and_zero_length_before_the_driver() {
        type Alloc = fn(usize, *mut *mut orbite_allocation) -> orbite_status;
        let cases: [(&str, Alloc); 6] = [
            ("cuda_allocate", |len, out| orbite_cuda_allocate(0, len, out)),
            ("cuda_allocate_ipc", |len, out| orbite_cuda_allocate_ipc(0, len, out)),
            ("cuda_allocate_pinned_host", |len, out| orbite_cuda_allocate_pinned_host(len, out)),
            ("allocate_mnnvl", |len, out| orbite_allocate_mnnvl(0, len, out)),
            ("allocate_egm", |len, out| orbite_allocate_egm(0, len, out)),
            ("cuda_adopt", |len, out| {
                let ptr = std::ptr::NonNull::<u64>::dangling().as_ptr().cast::<c_void>();
                orbite_cuda_adopt(ptr, len, ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION, out)
            }),
        ];
        for (case, f) in cases {
            let mut out: *mut orbite_allocation = std::ptr::null_mut();
            let st = f(0, &mut out);
            assert_eq!(
                (st, said().as_str()),
                (Status::InvalidArgument as u32, "invalid argument: length is 0"),
                "{case}"
            );
            assert!(out.is_null(), "{case}: a handle written");
            let st = f(4096, std::ptr::null_mut());
            assert_eq!(
                (st, said().as_str()),
                (Status::NullArgument as u32, "null argument: out_alloc is NULL"),
                "{case}"
            );
        }
        let st = orbite_cuda_retained_resources_json(std::ptr::null_mut(), 0, std::ptr::null_mut());
        assert_eq!((st, said().as_str()), (Status::NullArgument as u32, "null argument: out_len is NULL"));
    }
}
