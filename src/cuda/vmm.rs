//! The VMM (fabric-handle) allocation model behind MNNVL and EGM, written
//! against [`VmmOps`] so that its state machine is tested on CPU; the CUDA
//! build implements `VmmOps` with `cuMemCreate` and friends (`fabric.rs`).
//!
//! An allocation is created, its address range reserved, mapped and
//! access-granted; it is freed in the checked order unmap -> release ->
//! free the address range. A failed step answers `Unquiesced` and keeps the
//! allocation in the state it reached (owners and charges stay); a later
//! free continues from there and never repeats a step that succeeded. While
//! exports are outstanding the allocation cannot be freed.

use crate::error::{Error, Result};

/// Size of a CUDA fabric handle (`CUmemFabricHandle`).
pub const FABRIC_HANDLE_BYTES: usize = 64;

/// Rounds `len` up to the driver's granularity.
pub fn round_to_granularity(len: u64, granularity: u64) -> Result<u64> {
    if granularity == 0 || !granularity.is_power_of_two() {
        return Err(Error::Cuda(format!("the driver reported granularity {granularity}")));
    }
    if len == 0 {
        return Err(Error::InvalidArgument("length is 0".into()));
    }
    len.checked_add(granularity - 1)
        .map(|x| x & !(granularity - 1))
        .ok_or_else(|| Error::InvalidArgument(format!("length {len} is too large")))
}

/// The GPUs (of `visible`, ordinals `0..visible`) to grant access to VMM
/// memory resident on GPU `resident`: its own and each one `reaches(gpu,
/// resident)` says has a path to it (`cuDeviceCanAccessPeer`), in ordinal
/// order. Granting a GPU without a path fails the driver's whole
/// `cuMemSetAccess` (INVALID_DEVICE), so one pair without P2P on a host
/// would otherwise fail every allocation.
pub fn devices_reaching(
    resident: i32,
    visible: i32,
    mut reaches: impl FnMut(i32, i32) -> Result<bool>,
) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for gpu in 0..visible {
        if gpu == resident || reaches(gpu, resident)? {
            out.push(gpu);
        }
    }
    Ok(out)
}

/// The driver operations of a VMM allocation.
pub trait VmmOps: Send + Sync {
    /// Creates physical memory of `size` bytes; returns its handle.
    fn create(&self, size: u64) -> Result<u64>;
    /// Reserves an address range of `size` bytes.
    fn reserve(&self, size: u64) -> Result<u64>;
    /// Maps `handle` at `va`.
    fn map(&self, va: u64, size: u64, handle: u64) -> Result<()>;
    /// Grants read/write access to the visible local GPUs.
    fn set_access(&self, va: u64, size: u64) -> Result<()>;
    /// Unmaps `va`.
    fn unmap(&self, va: u64, size: u64) -> Result<()>;
    /// Releases the physical handle.
    fn release(&self, handle: u64) -> Result<()>;
    /// Frees the address range.
    fn address_free(&self, va: u64, size: u64) -> Result<()>;
}

/// Where a VMM allocation stands on its way down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmmState {
    /// Mapped and usable.
    Mapped,
    /// Unmapped; the handle and the range are still held.
    Unmapped,
    /// Handle released; the range is still reserved.
    Released,
    /// Everything returned.
    Freed,
}

/// One VMM allocation and its lifecycle.
#[derive(Debug)]
pub struct VmmAllocation {
    /// Mapped address.
    pub va: u64,
    /// Physical size (rounded).
    pub physical: u64,
    /// Driver handle.
    pub handle: u64,
    /// Lifecycle state.
    pub state: VmmState,
    /// Outstanding exports.
    pub exports: u32,
    /// Whether the library owns it (false for `wrap_*`: the external owner
    /// keeps final unmap).
    pub owned: bool,
}

impl VmmAllocation {
    /// create -> reserve -> map -> set access, undoing what succeeded on failure.
    pub fn allocate(ops: &dyn VmmOps, len: u64, granularity: u64) -> Result<VmmAllocation> {
        let physical = round_to_granularity(len, granularity)?;
        let handle = ops.create(physical)?;
        let va = match ops.reserve(physical) {
            Ok(v) => v,
            Err(e) => {
                let _ = ops.release(handle);
                return Err(e);
            }
        };
        if let Err(e) = ops.map(va, physical, handle) {
            let _ = ops.release(handle);
            let _ = ops.address_free(va, physical);
            return Err(e);
        }
        if let Err(e) = ops.set_access(va, physical) {
            let _ = ops.unmap(va, physical);
            let _ = ops.release(handle);
            let _ = ops.address_free(va, physical);
            return Err(e);
        }
        Ok(VmmAllocation { va, physical, handle, state: VmmState::Mapped, exports: 0, owned: true })
    }

    /// Counts an export (refused once the allocation is on its way down).
    pub fn add_export(&mut self) -> Result<()> {
        if self.state != VmmState::Mapped {
            return Err(Error::Unavailable("the allocation is being freed".into()));
        }
        self.exports += 1;
        Ok(())
    }

    /// Retires an export; an extra retire is a bug reported as such.
    pub fn retire_export(&mut self) -> Result<()> {
        if self.exports == 0 {
            return Err(Error::Unquiesced("export count underflow: retire without an export".into()));
        }
        self.exports -= 1;
        Ok(())
    }

    /// The checked local release: unmap -> release -> free the range. A
    /// failed step answers `Unquiesced` and keeps the state reached; a later
    /// call continues from there. Refused while exports are outstanding.
    pub fn free(&mut self, ops: &dyn VmmOps) -> Result<()> {
        if self.exports > 0 {
            return Err(Error::Unavailable(format!("{} exports of this allocation are outstanding", self.exports)));
        }
        let step = |r: Result<()>, what: &str| {
            r.map_err(|e| Error::Unquiesced(format!("{what} failed ({}); the allocation stays retained", e.message())))
        };
        if self.state == VmmState::Mapped {
            step(ops.unmap(self.va, self.physical), "unmap")?;
            self.state = VmmState::Unmapped;
        }
        if self.state == VmmState::Unmapped {
            step(ops.release(self.handle), "release")?;
            self.state = VmmState::Released;
        }
        if self.state == VmmState::Released {
            step(ops.address_free(self.va, self.physical), "address-range free")?;
            self.state = VmmState::Freed;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::take_armed as take;
    use parking_lot::Mutex;
    use std::sync::atomic::AtomicU32;

    #[derive(Default)]
    struct Fake {
        log: Mutex<Vec<String>>,
        fail_unmap: AtomicU32,
        fail_release: AtomicU32,
        fail_free: AtomicU32,
        fail_map: AtomicU32,
    }

    impl Fake {
        fn op(&self, what: &str, fail: &AtomicU32) -> Result<()> {
            if take(fail) {
                self.log.lock().push(format!("{what}!"));
                return Err(Error::Cuda(format!("injected {what} failure")));
            }
            self.log.lock().push(what.to_string());
            Ok(())
        }
        fn log(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock())
        }
    }

    #[test]
    fn only_gpus_with_a_path_to_the_memory_are_granted() {
        // Three GPUs; 0 and 2 have no path between them.
        let reach = |a: i32, b: i32| -> Result<bool> { Ok(!matches!((a, b), (0, 2) | (2, 0))) };
        assert_eq!(devices_reaching(2, 3, reach).unwrap(), vec![1, 2]);
        assert_eq!(devices_reaching(0, 3, reach).unwrap(), vec![0, 1]);
        assert_eq!(devices_reaching(1, 3, reach).unwrap(), vec![0, 1, 2]);
        // A GPU always reaches its own memory, whatever the probe says.
        assert_eq!(devices_reaching(1, 2, |_, _| Ok(false)).unwrap(), vec![1]);
        // A failed probe fails the grant, naming the driver's error.
        let e = devices_reaching(0, 2, |_, _| Err(Error::Cuda("cuDeviceCanAccessPeer failed".into()))).unwrap_err();
        assert!(e.to_string().contains("cuDeviceCanAccessPeer"), "{e}");
    }

    impl VmmOps for Fake {
        fn create(&self, _: u64) -> Result<u64> {
            self.log.lock().push("create".into());
            Ok(7)
        }
        fn reserve(&self, _: u64) -> Result<u64> {
            self.log.lock().push("reserve".into());
            Ok(0x1000_0000)
        }
        fn map(&self, _: u64, _: u64, _: u64) -> Result<()> {
            self.op("map", &self.fail_map)
        }
        fn set_access(&self, _: u64, _: u64) -> Result<()> {
            self.log.lock().push("access".into());
            Ok(())
        }
        fn unmap(&self, _: u64, _: u64) -> Result<()> {
            self.op("unmap", &self.fail_unmap)
        }
        fn release(&self, _: u64) -> Result<()> {
            self.op("release", &self.fail_release)
        }
        fn address_free(&self, _: u64, _: u64) -> Result<()> {
            self.op("free", &self.fail_free)
        }
    }

    #[test]
    fn granularity_rounding() {
        assert_eq!(round_to_granularity(1, 2 << 20).unwrap(), 2 << 20);
        assert_eq!(round_to_granularity(2 << 20, 2 << 20).unwrap(), 2 << 20);
        assert_eq!(round_to_granularity((2 << 20) + 1, 2 << 20).unwrap(), 4 << 20);
        assert!(round_to_granularity(0, 4096).is_err());
        assert!(round_to_granularity(10, 0).is_err());
        assert!(round_to_granularity(10, 3000).is_err());
        assert!(round_to_granularity(u64::MAX, 4096).is_err());
    }

    #[test]
    fn allocation_and_free_order() {
        let f = Fake::default();
        let mut a = VmmAllocation::allocate(&f, 17, 2 << 20).unwrap();
        assert_eq!(a.physical, 2 << 20);
        assert_eq!(f.log(), ["create", "reserve", "map", "access"]);
        a.free(&f).unwrap();
        assert_eq!(f.log(), ["unmap", "release", "free"]);
        assert_eq!(a.state, VmmState::Freed);
        // A failed map undoes what succeeded.
        f.fail_map.store(1, std::sync::atomic::Ordering::SeqCst);
        assert!(VmmAllocation::allocate(&f, 17, 2 << 20).is_err());
        assert_eq!(f.log(), ["create", "reserve", "map!", "release", "free"]);
    }

    /// Any export outstanding, down to the last one, refuses the free
    /// (guards `free`'s `self.exports > 0`: with `> 1` the physical memory
    /// was freed under the last importer's mapping; round 8 H20); a failed
    /// step is UNQUIESCED and the retry resumes where it stopped.
    #[test]
    fn exports_block_free_and_a_failed_step_is_unquiesced_then_resumes() {
        let f = Fake::default();
        let mut a = VmmAllocation::allocate(&f, 4096, 4096).unwrap();
        f.log();
        a.add_export().unwrap();
        a.add_export().unwrap();
        assert_eq!(a.free(&f).unwrap_err().status(), crate::error::Status::Unavailable);
        a.retire_export().unwrap();
        // One export left is still one importer mapping the memory: the
        // free is refused, naming it, and nothing is unmapped.
        let one_left = a.free(&f).unwrap_err();
        assert_eq!(one_left.status(), crate::error::Status::Unavailable);
        assert!(one_left.to_string().contains("1 exports of this allocation are outstanding"), "{one_left}");
        assert!(f.log().is_empty(), "a step ran with an export outstanding");
        assert_eq!(a.state, VmmState::Mapped);
        a.retire_export().unwrap();
        assert_eq!(a.retire_export().unwrap_err().status(), crate::error::Status::Unquiesced);
        f.fail_release.store(1, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(a.free(&f).unwrap_err().status(), crate::error::Status::Unquiesced);
        assert_eq!(a.state, VmmState::Unmapped);
        assert!(a.add_export().is_err(), "no new export on the way down");
        // The retry continues with release: the unmap is never repeated.
        a.free(&f).unwrap();
        assert_eq!(f.log(), ["unmap", "release!", "release", "free"]);
        f.fail_free.store(1, std::sync::atomic::Ordering::SeqCst);
        let mut b = VmmAllocation::allocate(&f, 4096, 4096).unwrap();
        f.log();
        assert!(b.free(&f).is_err());
        assert_eq!(b.state, VmmState::Released);
        b.free(&f).unwrap();
        assert_eq!(f.log(), ["unmap", "release", "free!", "free"]);
    }
}
