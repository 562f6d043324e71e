//! MNNVL's `host_register`: ordinary local host memory (heap, stack, memfd
//! shared memory) registered with CUDA (`cuMemHostRegister`) before the
//! first MNNVL copy touching it. Pins are process-wide and counted per page
//! range, so several registrations (several engines) of one buffer share
//! one pin and the last owner's release unregisters it. A range CUDA has
//! already pinned (by the application, or a pinned allocation) is reused and
//! never unregistered here.

use super::driver::{check, has_symbol, primary_context, ContextGuard};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::collections::HashMap;

/// Page-aligned (start, length) → owners.
static PINS: Mutex<Option<HashMap<(u64, u64), u64>>> = Mutex::new(None);

/// One owner's share of a pin; dropping the last share unregisters it.
#[derive(Debug)]
pub struct HostPin {
    /// `None` when CUDA already had the range pinned (reused, not ours).
    key: Option<(u64, u64)>,
}

impl HostPin {
    /// Whether this share owns (counts toward) a pin made by the library.
    pub fn is_owned(&self) -> bool {
        self.key.is_some()
    }
}

fn page_range(addr: u64, len: u64) -> Result<(u64, u64)> {
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or_else(|| Error::InvalidArgument(format!("0x{addr:x}+{len} overflows")))?;
    let start = addr & !(page - 1);
    Ok((start, (end & !(page - 1)) - start))
}

/// Pins `[addr, addr+len)` (widened to whole pages) for CUDA copies.
pub fn pin(addr: u64, len: u64) -> Result<HostPin> {
    let key = page_range(addr, len)?;
    let mut guard = PINS.lock();
    let pins = guard.get_or_insert_with(HashMap::new);
    if let Some(n) = pins.get_mut(&key) {
        *n += 1;
        return Ok(HostPin { key: Some(key) });
    }
    if !has_symbol("cuMemHostRegister_v2") || !has_symbol("cuMemHostUnregister") {
        return Err(Error::NotSupported(
            "the CUDA driver does not export cuMemHostRegister_v2/cuMemHostUnregister (host_register)".into(),
        ));
    }
    let g = ContextGuard::bind(primary_context(0)?)?;
    // SAFETY: the range is mapped memory of this process (a registered
    // region, leased by the caller); the driver only pins it.
    let r = unsafe { sys::cuMemHostRegister_v2(key.0 as *mut _, key.1 as usize, sys::CU_MEMHOSTREGISTER_PORTABLE) };
    g.restore()?;
    match r {
        sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => Ok(HostPin { key: None }),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            Err(Error::ResourceExhausted(format!("CUDA cannot pin {} bytes of host memory at 0x{:x}", key.1, key.0)))
        }
        r => {
            check(r, "cuMemHostRegister (mnnvl.host_register)")?;
            pins.insert(key, 1);
            Ok(HostPin { key: Some(key) })
        }
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut guard = PINS.lock();
        let pins = guard.get_or_insert_with(HashMap::new);
        let last = match pins.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                pins.remove(&key);
                true
            }
            None => false,
        };
        if last {
            if let Ok(g) = primary_context(0).and_then(ContextGuard::bind) {
                // SAFETY: the range was registered above by this table and
                // its last owner (a region with no copy in flight) is gone.
                let _ = unsafe { sys::cuMemHostUnregister(key.0 as *mut _) };
                let _ = g.restore();
            }
        }
    }
}

/// Pins held by the library: (ranges, bytes).
pub fn pinned() -> (u64, u64) {
    let g = PINS.lock();
    g.as_ref().map(|m| (m.len() as u64, m.keys().map(|k| k.1).sum())).unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use super::page_range;

    #[test]
    fn ranges_widen_to_whole_pages() {
        // SAFETY: sysconf has no memory effects.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        assert_eq!(page_range(p, 1).unwrap(), (p, p));
        assert_eq!(page_range(p + 1, p).unwrap(), (p, 2 * p));
        assert_eq!(page_range(2 * p - 1, 2).unwrap(), (p, 2 * p));
        assert!(page_range(u64::MAX - 10, 100).is_err());
    }
}
