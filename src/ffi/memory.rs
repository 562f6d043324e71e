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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::said;
    use crate::ffi::engine::{orbite_engine_free, orbite_engine_new, orbite_register_memory, orbite_unregister_memory};
    use crate::Status;

    /// A registered allocation is not freed: UNAVAILABLE naming the
    /// registration, and the handle stays valid (its address and length
    /// still answered, its memory still written); unregistered, it frees
    /// OK. Guards the `?` on `orbite_allocation_free`'s `.alloc.release()`
    /// (round 7 G13: with the release's refusal ignored, the handle was
    /// taken back and freed while an engine still had its memory
    /// registered).
    #[test]
    fn a_registered_allocation_is_unavailable_to_free_and_its_handle_stays_valid() {
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        let mut alloc: *mut orbite_allocation = std::ptr::null_mut();
        assert_eq!(orbite_host_allocate_shared(4096, &mut alloc), Status::Ok as u32);
        let addr = orbite_allocation_addr(alloc);
        assert!(!addr.is_null());
        let mut region = 0u64;
        assert_eq!(orbite_register_memory(engine, addr, 4096, ORBITE_ACCESS_READ, &mut region), Status::Ok as u32);

        assert_eq!(orbite_allocation_free(alloc), Status::Unavailable as u32);
        let said = said();
        assert!(said.contains("still registered 1 time(s) and exported 0 time(s)"), "{said}");
        assert_eq!((orbite_allocation_addr(alloc), orbite_allocation_length(alloc)), (addr, 4096));
        // SAFETY: addr is the allocation's start, 4096 bytes, still mapped.
        unsafe { addr.cast::<u8>().add(4095).write(7) };

        assert_eq!(orbite_unregister_memory(engine, region, 60_000), Status::Ok as u32);
        // (The handle is not used after this: its address may be another's.)
        assert_eq!(orbite_allocation_free(alloc), Status::Ok as u32);
        orbite_engine_free(engine);
    }

    /// orbite_allocation_free(NULL) is a no-op returning OK, as C-API.md
    /// documents, and leaves no last error behind (the one set before
    /// stays). Guards the NULL check of `alloc` in `orbite_allocation_free`
    /// (round 14 N3: without it, NULL was NULL_ARGUMENT "alloc is NULL").
    #[test]
    fn freeing_a_null_allocation_is_ok() {
        let mut out: *mut orbite_allocation = std::ptr::null_mut();
        assert_eq!(orbite_host_allocate_shared(0, &mut out), Status::InvalidArgument as u32);
        assert_eq!(orbite_allocation_free(std::ptr::null_mut()), Status::Ok as u32);
        let said = said();
        assert_eq!(said, "invalid argument: length is 0", "the earlier failure's message stays");
        assert!(out.is_null());
    }

    /// The allocation functions given no allocation, each case named:
    /// orbite_host_allocate_shared with out_alloc NULL is NULL_ARGUMENT
    /// "out_alloc is NULL" (nothing allocated); orbite_allocation_addr and
    /// orbite_allocation_length of NULL or of another handle type are NULL
    /// and 0; orbite_allocation_free of an engine handle is
    /// INVALID_ARGUMENT naming what it is, and the engine stays live.
    /// Guards the `live` check of orbite_allocation_free (a handle of
    /// another type is never released as an allocation).
    #[test]
    fn allocation_functions_refuse_null_and_other_handles() {
        let st = orbite_host_allocate_shared(4096, std::ptr::null_mut());
        assert_eq!((st, said().as_str()), (Status::NullArgument as u32, "null argument: out_alloc is NULL"));
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        let other: *mut orbite_allocation = engine.cast();
        for (case, a) in [("NULL", std::ptr::null_mut()), ("an engine", other)] {
            assert!(orbite_allocation_addr(a).is_null(), "addr of {case}");
            assert_eq!(orbite_allocation_length(a), 0, "length of {case}");
        }
        let st = orbite_allocation_free(other);
        let want = "invalid argument: alloc is an orbite_engine, not an orbite_allocation";
        assert_eq!((st, said().as_str()), (Status::InvalidArgument as u32, want));
        let mut region = 0u64;
        let mut buf = vec![0u8; 4096];
        let st = orbite_register_memory(engine, buf.as_mut_ptr().cast(), buf.len(), ORBITE_ACCESS_READ, &mut region);
        assert_eq!(st, Status::Ok as u32, "the engine stays live");
        orbite_engine_free(engine);
    }
}
