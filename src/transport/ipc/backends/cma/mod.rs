//! The CMA backend: any registered host memory of another process of this
//! host and user (malloc, new, numpy or torch buffers: memory the library
//! did not allocate), copied with cross-memory attach by the requester.
//!
//! It runs the IPC protocol of SHM (grants, the grant board, revocation,
//! receipts, the relocation cache) with two differences: an export covers
//! the registration asked for, not a library allocation (there is none),
//! and an import maps nothing. Its handle names where the registration
//! starts in the source; the "mapping" is a window that stands for it
//! (`vm.rs`), through which each copy is a `process_vm_readv` or
//! `process_vm_writev` into the source, many ranges per call, large groups
//! spread over the copy pool (`cpu_copy`). Who may copy is `access.rs`.

pub mod access;
pub mod vm;

use crate::control::identity::ProcessIdentity;
use crate::error::{Error, Result, Status};
use crate::kinds::TransportKind;
use crate::transport::ipc::backend::{CopyOp, CopyPlan, ExportedHandle, IpcBackend, Mapping, Posting, ReceivedHandle};
use crate::transport::ipc::backends::cpu_copy::{self, Mover};
pub use access::PtracerPolicy;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;

/// The first bytes of a CMA handle (its version).
const MAGIC: &[u8; 4] = b"CMA1";

/// The CMA backend of one engine.
pub struct CmaBackend {
    /// What a source does about its ptracer under Yama `ptrace_scope` 1.
    ptracer: PtracerPolicy,
    /// Source processes this process was found allowed to attach to.
    reached: Mutex<HashSet<ProcessIdentity>>,
    /// The engine's log lines.
    log: Arc<crate::log::Logger>,
}

impl CmaBackend {
    /// The backend, or why this process cannot copy with it (a seccomp
    /// filter refuses the calls: [`access::calls_allowed`]).
    pub fn new(ptracer: PtracerPolicy, log: Arc<crate::log::Logger>) -> std::result::Result<CmaBackend, String> {
        access::calls_allowed()?;
        Ok(CmaBackend { ptracer, reached: Mutex::new(HashSet::new()), log })
    }
}

/// A grant's window onto the source's registration: what moves its
/// copies ([`vm::Remote`]).
struct CmaMapping {
    mover: Arc<dyn Mover>,
}

impl IpcBackend for CmaBackend {
    fn transport(&self) -> TransportKind {
        TransportKind::Cma
    }

    /// A source's memory goes when it exits: a copy its exit overtook
    /// moved undefined bytes (and its pid could name another process).
    fn import_outlives_exporter(&self) -> bool {
        false
    }

    fn exports_registrations(&self) -> bool {
        true
    }

    fn maps(&self) -> bool {
        false
    }

    fn admit(&self, uid: u32, requester: &ProcessIdentity) -> Result<()> {
        // SAFETY: geteuid has no memory effects.
        let me = unsafe { libc::geteuid() };
        if uid != me {
            return Err(Error::PermissionDenied(format!(
                "cma moves memory only between processes of one user; the requester runs as user {uid}, this \
                 source as user {me}"
            )));
        }
        match access::admit(self.ptracer, *requester) {
            Ok(None) => Ok(()),
            // The kernel will refuse the requester's copies; it learns so
            // from its own probe and moves its requests over TCP.
            Ok(Some(why)) => {
                self.log.info(format_args!("cma: requester process {}: {why}", requester.pid));
                Ok(())
            }
            Err(e) => {
                self.log.warn(format_args!("cma: PR_SET_PTRACER naming process {} failed: {e}", requester.pid));
                Ok(())
            }
        }
    }

    fn refusal(&self, source: &ProcessIdentity) -> Option<String> {
        access::pid_names_it(source).and_then(|_| access::same_user(source)).err()
    }

    fn refuses_for_good(&self, e: &Error) -> bool {
        e.status() == Status::NotSupported
    }

    fn export(&self, base: u64, _writable: bool) -> Result<ExportedHandle> {
        // Nothing to pass: where the registration starts in this process.
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&base.to_le_bytes());
        Ok(ExportedHandle { bytes, fd: None, owned_fd: None, mark: None })
    }

    fn import(
        &self,
        handle: ReceivedHandle,
        physical: u64,
        writable: bool,
        _: Option<i32>,
    ) -> Result<Box<dyn Mapping>> {
        let source = handle
            .source
            .ok_or_else(|| Error::Protocol("a cma handle arrived without the kernel's word on its source".into()))?;
        let base = match handle.bytes.split_first_chunk::<4>() {
            Some((m, rest)) if m == MAGIC && rest.len() == 8 => u64::from_le_bytes(rest.try_into().expect("8 bytes")),
            _ => return Err(Error::Protocol(format!("a malformed cma handle ({} bytes)", handle.bytes.len()))),
        };
        if base.checked_add(physical).is_none() {
            return Err(Error::Protocol(format!("a cma grant of 0x{base:x}+{physical} wraps the address space")));
        }
        // Copies name the grant's bytes at the window's addresses: a grant
        // past the window's end (no process holds 3 << 62 bytes) would make
        // the requester's translation wrap.
        if vm::WINDOW.checked_add(physical).is_none() {
            return Err(Error::Protocol(format!("a cma grant of {physical} bytes is larger than any address space")));
        }
        // The kernel's word, once per source process: whether this process
        // may attach to it (the source named it as its ptracer, where Yama
        // asks, when it admitted the channel).
        if !self.reached.lock().contains(&source) {
            access::pid_names_it(&source)
                .and_then(|_| access::may_attach(&source))
                .map_err(|why| Error::NotSupported(format!("cma cannot copy with process {}: {why}", source.pid)))?;
            self.reached.lock().insert(source);
        }
        let remote = vm::Remote { pid: source.pid, base, len: physical, writable };
        Ok(Box::new(CmaMapping { mover: Arc::new(remote) }))
    }
}

impl Mapping for CmaMapping {
    fn base(&self) -> u64 {
        vm::WINDOW
    }

    /// Every group completes when this returns: small and ordered ones on
    /// the caller, large independent ones on the caller and idle threads
    /// of the copy pool together. A failure is the group's, exactly (no
    /// completion is ever uncertain).
    fn copy(&self, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting> {
        cpu_copy::copy_with(&self.mover, ops, plan)?;
        Ok(0)
    }

    fn wait(&self, _posting: Posting) -> Result<()> {
        Ok(())
    }

    fn completes_by_waiting(&self) -> bool {
        true
    }

    /// Nothing is mapped.
    fn close(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::identity::this_process;

    fn backend() -> CmaBackend {
        CmaBackend::new(PtracerPolicy::Peer, Arc::new(crate::log::Logger::new(crate::log::Level::Off, "test"))).unwrap()
    }

    /// Guards the handle and the window: an export names its base; its
    /// import copies through the window into exactly that range, READ and
    /// WRITE; a malformed handle or one without the kernel's word on its
    /// source is refused.
    #[test]
    fn an_import_copies_through_its_window_into_the_exported_range() {
        let b = backend();
        let mut remote = vec![0u8; 8192];
        remote[4096..].iter_mut().enumerate().for_each(|(i, x)| *x = (i % 200) as u8 + 1);
        let h = b.export(remote.as_ptr() as u64 + 4096, true).unwrap();
        assert!(h.fd.is_none() && h.owned_fd.is_none());
        let handle = |bytes: Vec<u8>, source| ReceivedHandle { bytes, fd: None, source };
        let m = b.import(handle(h.bytes.clone(), Some(this_process())), 4096, true, None).unwrap();
        assert_eq!(m.base(), vm::WINDOW);
        let mut local = vec![0u8; 4096];
        let read = CopyOp { dst: local.as_mut_ptr() as u64, src: m.base(), len: 4096 };
        assert_eq!(m.copy(&[read], CopyPlan::Independent).unwrap(), 0);
        assert_eq!(&local[..], &remote[4096..]);
        let ones = [1u8; 16];
        let write = CopyOp { dst: m.base() + 10, src: ones.as_ptr() as u64, len: 16 };
        m.copy(&[write], CopyPlan::Ordered).unwrap();
        assert_eq!(&remote[4106..4122], &ones[..]);
        assert!(remote[..4096].iter().all(|&x| x == 0), "nothing before the exported base");
        m.close().unwrap();
        let e = b.import(handle(h.bytes.clone(), None), 4096, false, None).err().unwrap();
        assert_eq!(e.status(), Status::ProtocolError);
        let e = b.import(handle(b"CMA1".to_vec(), Some(this_process())), 4096, false, None).err().unwrap();
        assert!(e.message().contains("malformed"), "{e}");
        let gone = ProcessIdentity { pid: i32::MAX as u32, start_time: 1 };
        let e = b.import(handle(h.bytes, Some(gone)), 4096, false, None).err().unwrap();
        assert!(b.refuses_for_good(&e), "{e}");
    }

    /// A handle naming a base whose grant would wrap the address space
    /// (`u64::MAX - 8191` with a physical extent of 8192) is a protocol
    /// error naming the wrap, before anything is asked of the kernel.
    /// Guards `import`'s `base.checked_add(physical)`.
    #[test]
    fn a_handle_whose_grant_wraps_the_address_space_is_refused() {
        let b = backend();
        let base = u64::MAX - 8191;
        let bytes = [&MAGIC[..], &base.to_le_bytes()].concat();
        let handle = ReceivedHandle { bytes, fd: None, source: Some(this_process()) };
        let e = b.import(handle, 8192, false, None).err().unwrap();
        assert_eq!(e.status(), Status::ProtocolError, "{e}");
        assert!(e.message().contains(&format!("a cma grant of 0x{base:x}+8192 wraps the address space")), "{e}");
    }

    /// A grant reaching past the copy window's end (`3 << 62` bytes from a
    /// base of 0: a hostile source's offer) is a protocol error naming its
    /// size, where the requester's window translation would have wrapped
    /// (a panic in a debug build, a wrong address in release); the largest
    /// grant the window holds is imported. Guards `import`'s
    /// `vm::WINDOW.checked_add(physical)`.
    #[test]
    fn a_grant_larger_than_the_copy_window_is_refused() {
        let b = backend();
        let bytes = [&MAGIC[..], &0u64.to_le_bytes()].concat();
        let handle = || ReceivedHandle { bytes: bytes.clone(), fd: None, source: Some(this_process()) };
        let most = u64::MAX - vm::WINDOW;
        let e = b.import(handle(), most + 1, false, None).err().unwrap();
        assert_eq!(e.status(), Status::ProtocolError, "{e}");
        assert_eq!(e.message(), format!("a cma grant of {} bytes is larger than any address space", most + 1));
        let m = b.import(handle(), most, false, None).unwrap();
        assert_eq!(m.base(), vm::WINDOW);
    }

    /// Guards `admit`: another user's process is refused the channel.
    #[test]
    fn another_user_is_refused_at_admission() {
        let b = backend();
        // SAFETY: geteuid has no memory effects.
        let me = unsafe { libc::geteuid() };
        assert!(b.admit(me, &this_process()).is_ok());
        let e = b.admit(me.wrapping_add(1), &this_process()).unwrap_err();
        assert_eq!(e.status(), Status::PermissionDenied);
        assert!(e.message().contains("one user"), "{e}");
        assert_eq!(b.refusal(&this_process()), None);
    }
}
