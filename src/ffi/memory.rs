//! Library-owned memory.

use super::boundary::*;
use super::handles::{give_out, live, take_back};
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
    guard_value(std::ptr::null_mut(), || match live(alloc, "alloc") {
        Ok(a) => a.alloc.addr() as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    })
}

/// Logical length of an allocation; 0 for NULL.
#[no_mangle]
pub extern "C" fn orbite_allocation_length(alloc: *const orbite_allocation) -> usize {
    guard_value(0, || match live(alloc, "alloc") {
        Ok(a) => a.alloc.len() as usize,
        Err(_) => 0,
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
        live(alloc, "alloc")?.alloc.release()?;
        // Released: the handle is taken back (once; a racing free loses).
        take_back(alloc, "alloc").map(drop)
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
    *out = give_out(orbite_allocation { alloc });
    Ok(())
}
