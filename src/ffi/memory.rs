//! Library-owned memory.

use super::boundary::*;
use super::types::*;
use crate::{allocate_shared_host, Allocation, Error, Result};
use std::ffi::c_void;

/// Allocates zeroed shared host memory (memfd, physically rounded to 2 MiB)
/// that can be exported to peers on the same host.
#[no_mangle]
pub extern "C" fn orbite_host_allocate_shared(length: usize, out_alloc: *mut *mut orbite_allocation) -> orbite_status {
    guard(|| allocate_into(out_alloc, length, allocate_shared_host))
}

/// Start address of an allocation; NULL for NULL.
#[no_mangle]
pub extern "C" fn orbite_allocation_addr(alloc: *const orbite_allocation) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: NULL or a live allocation handle per the contract.
        match unsafe { alloc.as_ref() } {
            Some(a) => a.alloc.addr() as *mut c_void,
            None => std::ptr::null_mut(),
        }
    })
}

/// Logical length of an allocation; 0 for NULL.
#[no_mangle]
pub extern "C" fn orbite_allocation_length(alloc: *const orbite_allocation) -> usize {
    guard_value(0, || {
        // SAFETY: NULL or a live allocation handle per the contract.
        match unsafe { alloc.as_ref() } {
            Some(a) => a.alloc.len() as usize,
            None => 0,
        }
    })
}

/// Frees an allocation. UNAVAILABLE while registered or exported (the handle
/// stays valid). NULL is a no-op returning OK.
#[no_mangle]
pub extern "C" fn orbite_allocation_free(alloc: *mut orbite_allocation) -> orbite_status {
    guard(|| {
        if alloc.is_null() {
            return Ok(());
        }
        // SAFETY: non-NULL handle from an orbite_*allocate* call.
        let a = unsafe { &*alloc };
        a.alloc.release()?;
        // SAFETY: released successfully; the handle is freed exactly once here.
        drop(unsafe { Box::from_raw(alloc) });
        Ok(())
    })
}

/// The body of every allocating entry point: checks `out` and `length`,
/// allocates with `f`, and writes the handle only on success.
pub(crate) fn allocate_into(
    out: *mut *mut orbite_allocation,
    length: usize,
    f: impl FnOnce(u64) -> Result<Allocation>,
) -> Result<()> {
    let out = need_mut(out, "out_alloc")?;
    if length == 0 {
        return Err(Error::InvalidArgument("length is 0".into()));
    }
    let alloc = f(length as u64)?;
    *out = Box::into_raw(Box::new(orbite_allocation { alloc }));
    Ok(())
}
