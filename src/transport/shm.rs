//! The SHM backend: library-allocated host memory (memfd) shared between
//! processes of one host. Exports pass the memfd; imports map it shared;
//! copies are CPU copies that are complete when `copy` returns.

use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::memory::owners;
use crate::transport::ipc::backend::{CopyOp, CopyPlan, ExportedHandle, IpcBackend, Mapping, ReceivedHandle};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// The SHM backend.
#[derive(Debug, Default)]
pub struct ShmBackend;

struct ShmMapping {
    base: u64,
    len: u64,
    mapped: AtomicBool,
}

impl IpcBackend for ShmBackend {
    fn transport(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn export(&self, base: u64) -> Result<ExportedHandle> {
        let fd = owners::owner_of(base)
            .filter(|o| o.base == base)
            .and_then(|o| o.fd)
            .ok_or_else(|| Error::NotFound(format!("no shared allocation starts at 0x{base:x}")))?;
        Ok(ExportedHandle { bytes: Vec::new(), fd: Some(fd), owned_fd: None })
    }

    fn import(&self, handle: ReceivedHandle, physical: u64) -> Result<Box<dyn Mapping>> {
        let fd =
            handle.fd.ok_or_else(|| Error::Protocol("an SHM handle arrived without its file descriptor".into()))?;
        // The fd must be a regular (memfd) file at least `physical` long.
        // SAFETY: fstat on an fd we own into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::io("fstat on the received SHM handle", &std::io::Error::last_os_error()));
        }
        if (st.st_mode & libc::S_IFMT) != libc::S_IFREG || (st.st_size as u64) < physical {
            return Err(Error::Protocol(format!(
                "the received SHM handle is not a memory file of {physical} bytes (size {})",
                st.st_size
            )));
        }
        let p = owners::map_shared(&fd, physical, "the SHM export")?;
        Ok(Box::new(ShmMapping { base: p, len: physical, mapped: AtomicBool::new(true) }))
    }
}

impl Mapping for ShmMapping {
    fn base(&self) -> u64 {
        self.base
    }
    fn copy(&self, ops: &[CopyOp], _plan: CopyPlan) -> Result<()> {
        // CPU copies in input order satisfy both plans (an independent group
        // may run in any order, input order included); the caller checked
        // every range against its registration and the grant.
        for o in ops {
            // SAFETY: src and dst lie in a leased local region and in this
            // live mapping (checked by the protocol before `copy`);
            // `ptr::copy` tolerates overlap.
            unsafe { std::ptr::copy(o.src as *const u8, o.dst as *mut u8, o.len as usize) };
        }
        Ok(())
    }
    fn wait(&self) -> Result<()> {
        Ok(())
    }
    fn close(&self) -> Result<()> {
        if !self.mapped.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        // SAFETY: unmapping exactly the range mapped in `import`.
        if unsafe { libc::munmap(self.base as *mut libc::c_void, self.len as usize) } != 0 {
            let e = std::io::Error::last_os_error();
            self.mapped.store(true, Ordering::Release);
            return Err(Error::Unquiesced(format!("munmap of the SHM import failed: {e}")));
        }
        Ok(())
    }
}
