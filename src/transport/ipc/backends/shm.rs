//! The SHM backend: library-allocated host memory (memfd) shared between
//! processes of one host. Exports pass the memfd; imports map it shared;
//! copies are CPU copies: small and ordered groups complete when `copy`
//! returns, large independent ones run on the copy pool (`cpu_copy`) and
//! complete later (their posting says when).

use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::memory::owners;
use crate::transport::ipc::backend::{CopyOp, CopyPlan, ExportedHandle, IpcBackend, Mapping, Posting, ReceivedHandle};
use crate::transport::ipc::backends::cpu_copy;
use crate::transport::ipc::backends::held_file;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A description of its own of the same memory file (`/proc/self/fd/N`
/// reopened), read-only or read-write.
fn reopen(fd: RawFd, writable: bool) -> Result<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    let mode = if writable { libc::O_RDWR } else { libc::O_RDONLY };
    // SAFETY: open with a NUL-terminated path; the result is checked.
    let own = unsafe { libc::open(path.as_ptr(), mode | libc::O_CLOEXEC) };
    if own < 0 {
        return Err(Error::io("reopening shared memory for an export", &std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(own) })
}

/// The SHM backend.
#[derive(Debug, Default)]
pub struct ShmBackend;

struct ShmMapping {
    base: u64,
    len: u64,
    mapped: AtomicBool,
    /// Groups whose copies run on the copy pool, by posting (0: a group
    /// already complete).
    started: Mutex<HashMap<Posting, cpu_copy::Pending>>,
    next: AtomicU64,
}

impl IpcBackend for ShmBackend {
    fn transport(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn export(&self, base: u64, writable: bool) -> Result<ExportedHandle> {
        let fd = owners::owner_of(base)
            .filter(|o| o.base == base)
            .and_then(|o| o.fd)
            .ok_or_else(|| Error::NotFound(format!("no shared allocation starts at 0x{base:x}")))?;
        // Every grant passes a description of the file of its own (a READ
        // grant's read-only: the importer can map the allocation but never
        // write it), marked so that the source can tell, after the
        // importer's exit, whether anything still holds it.
        let own = reopen(fd, writable)?;
        let mark = held_file::mark(&own)?;
        Ok(ExportedHandle { bytes: Vec::new(), fd: None, owned_fd: Some(own), mark: Some(mark) })
    }

    fn handle_held(&self, base: u64, mark: u64) -> bool {
        // The allocation's own description never leaves this process; the
        // export holds the allocation, so its descriptor is open. Without
        // it nothing can be told: held.
        let probe = owners::owner_of(base).filter(|o| o.base == base).and_then(|o| o.fd);
        probe.is_none_or(|fd| held_file::held(fd, mark))
    }

    fn import(
        &self,
        handle: ReceivedHandle,
        physical: u64,
        writable: bool,
        _: Option<i32>,
    ) -> Result<Box<dyn Mapping>> {
        let fd =
            handle.fd.ok_or_else(|| Error::Protocol("an SHM handle arrived without its file descriptor".into()))?;
        // Only a memory file whose size nobody can change may be mapped: a
        // source that shrank it would make this process fault.
        // SAFETY: fcntl on an fd we own; reads its seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & owners::SIZE_SEALS != owners::SIZE_SEALS {
            return Err(Error::Protocol(
                "the received SHM handle is not sealed against shrinking and growing; refusing to map it".into(),
            ));
        }
        // SAFETY: fcntl on an fd we own; reads its access mode.
        let mode = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE;
        if writable && mode != libc::O_RDWR {
            return Err(Error::Protocol("a WRITE grant arrived with a read-only SHM handle".into()));
        }
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
        let p = owners::map_shared_memory(&fd, physical, writable, "the SHM export")?;
        Ok(Box::new(ShmMapping {
            base: p,
            len: physical,
            mapped: AtomicBool::new(true),
            started: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }))
    }
}

impl Mapping for ShmMapping {
    fn base(&self) -> u64 {
        self.base
    }
    fn copy(&self, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting> {
        // Ordered and small groups in input order on the caller, done when
        // this returns; large independent ones start on every core and the
        // caller goes on (the caller checked every range against its
        // registration and the grant, and keeps the import and its local
        // regions until the posting is complete).
        if !cpu_copy::asynchronous(ops, plan) {
            cpu_copy::copy(ops, plan);
            return Ok(0);
        }
        let posting = self.next.fetch_add(1, Ordering::Relaxed);
        self.started.lock().insert(posting, cpu_copy::start(ops));
        Ok(posting)
    }
    fn query(&self, posting: Posting) -> Result<bool> {
        if posting == 0 {
            return Ok(true);
        }
        let mut s = self.started.lock();
        let done = s.get(&posting).is_none_or(|p| p.is_done());
        if done {
            s.remove(&posting);
        }
        Ok(done)
    }
    fn wait(&self, posting: Posting) -> Result<()> {
        if posting == 0 {
            return Ok(());
        }
        let pending = self.started.lock().remove(&posting);
        if let Some(p) = pending {
            p.wait();
        }
        Ok(())
    }
    fn completes_by_waiting(&self) -> bool {
        true
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::owners::allocate_shared_host;

    fn received(fd: OwnedFd) -> ReceivedHandle {
        ReceivedHandle { bytes: Vec::new(), fd: Some(fd), source: None }
    }

    fn dup(fd: RawFd) -> OwnedFd {
        // SAFETY: dup of an open fd; the copy is owned by the result.
        unsafe { OwnedFd::from_raw_fd(libc::dup(fd)) }
    }

    #[test]
    fn a_read_grant_passes_a_descriptor_that_cannot_write() {
        let a = allocate_shared_host(4096).unwrap();
        // SAFETY: the allocation maps 4096 bytes.
        unsafe { *(a.addr() as *mut u8) = 42 };
        let h = ShmBackend.export(a.addr(), false).unwrap();
        let ro = h.owned_fd.expect("a descriptor made for this export");
        assert!(h.fd.is_none());
        // SAFETY: fcntl reads the access mode.
        assert_eq!(unsafe { libc::fcntl(ro.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE, libc::O_RDONLY);
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: an mmap that must fail (the descriptor is read-only).
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, rw, libc::MAP_SHARED, ro.as_raw_fd(), 0) };
        assert_eq!(p, libc::MAP_FAILED, "a read-only descriptor mapped writable");
        let physical = a.physical_len();
        let e = ShmBackend.import(received(dup(ro.as_raw_fd())), physical, true, None).err().unwrap();
        assert!(e.message().contains("read-only SHM handle"), "{e}");
        let m = ShmBackend.import(received(ro), physical, false, None).unwrap();
        // SAFETY: the import maps `physical` readable bytes.
        assert_eq!(unsafe { *(m.base() as *const u8) }, 42);
        m.close().unwrap();
        let w = ShmBackend.export(a.addr(), true).unwrap();
        let rw = w.owned_fd.expect("a description made for this export");
        // SAFETY: fcntl reads the access mode.
        assert_eq!(unsafe { libc::fcntl(rw.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE, libc::O_RDWR);
        assert_ne!(Some(rw.as_raw_fd()), a.memfd(), "never the allocation's own description");
        assert!(ShmBackend.handle_held(a.addr(), w.mark.expect("marked")));
        drop(rw);
        assert!(!ShmBackend.handle_held(a.addr(), w.mark.unwrap()), "its one descriptor closed, nothing holds it");
        a.free().unwrap();
    }

    #[test]
    fn an_unsealed_memory_file_is_never_mapped() {
        // SAFETY: memfd_create with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"hostile".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizing our own memfd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 21) }, 0);
        let e = ShmBackend.import(received(fd), 1 << 21, true, None).err().unwrap();
        assert_eq!(e.status(), crate::error::Status::ProtocolError);
        assert!(e.message().contains("not sealed"), "{e}");
    }
}
