//! The backend seam of the IPC protocol: how one kind of memory is exported,
//! imported, copied, waited for and closed. The protocol (grants, receipts,
//! loans, charges, caches) is written once against this; SHM plugs in host
//! memfd memory, the CUDA backends plug in driver calls.

use crate::control::identity::ProcessIdentity;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use std::os::fd::{OwnedFd, RawFd};

/// A handle as exported: opaque bytes (e.g. a CUDA IPC or fabric handle)
/// and/or a file descriptor passed with `SCM_RIGHTS`.
pub struct ExportedHandle {
    /// Opaque handle bytes (empty for SHM).
    pub bytes: Vec<u8>,
    /// Descriptor to pass (borrowed; the backend keeps it open).
    pub fd: Option<RawFd>,
    /// A descriptor made for this export alone, closed once sent.
    pub owned_fd: Option<OwnedFd>,
    /// How [`IpcBackend::handle_held`] later tells whether what was sent is
    /// still held anywhere (`None`: the backend cannot tell).
    pub mark: Option<u64>,
}

/// A handle as received by the requester.
pub struct ReceivedHandle {
    /// Opaque handle bytes.
    pub bytes: Vec<u8>,
    /// Descriptor received with the handle, if any.
    pub fd: Option<OwnedFd>,
    /// The exporting process, as the kernel named the other end of the
    /// Unix channel the handle came on (`None` over a fabric channel).
    pub source: Option<ProcessIdentity>,
}

/// One copy between a local address and an address inside an imported
/// mapping (both in this process's address space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOp {
    /// Destination.
    pub dst: u64,
    /// Source.
    pub src: u64,
    /// Bytes.
    pub len: u64,
}

/// How the copies of a subbatch may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPlan {
    /// No destination overlaps another and no source overlaps a
    /// destination: any order, or one native batch.
    Independent,
    /// Dependent or overlapping: strictly in input order.
    Ordered,
}

/// One group's copies as posted through a mapping: what its completion is
/// asked and waited for by. Groups of several threads may be in flight on
/// one (cached) mapping at once, each with its own posting. 0: nothing is
/// pending (the copies ran synchronously).
pub type Posting = u64;

/// An imported mapping of a whole remote allocation.
pub trait Mapping: Send + Sync {
    /// Local address of the allocation's first byte.
    fn base(&self) -> u64;
    /// Enqueues (or performs) the copies of one group.
    fn copy(&self, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting>;
    /// Waits until the copies of `posting` are complete.
    fn wait(&self, posting: Posting) -> Result<()>;
    /// Asks once, without waiting, whether the copies of `posting` are
    /// complete (`Ok(false)`: not yet). CPU copies are complete at once.
    fn query(&self, posting: Posting) -> Result<bool> {
        self.wait(posting).map(|_| true)
    }
    /// The completion of `posting` will not be waited for (a deadline
    /// passed with it pending): resources tied to the pending work (a
    /// leased stream) are given up as uncertain. The mapping itself stays
    /// retained.
    fn abandon(&self, _posting: Posting) {}
    /// Whether a pending posting is sure to complete, so that the progress
    /// worker may wait for it instead of polling (CPU copies: yes).
    fn completes_by_waiting(&self) -> bool {
        false
    }
    /// The native close (unmap). On failure the mapping must be considered
    /// still live: the caller retains it and never closes it twice.
    fn close(&self) -> Result<()>;
}

/// One kind of exportable memory.
pub trait IpcBackend: Send + Sync {
    /// The transport this backend carries.
    fn transport(&self) -> TransportKind;
    /// `Ok` while the backend can take new work; otherwise why not, for
    /// good (the CUDA backends after a sticky driver error: see
    /// `cuda::driver::usable`). Asked before each group and each export;
    /// an error refuses them before anything is posted.
    fn usable(&self) -> Result<()> {
        Ok(())
    }
    /// Whether an import keeps its memory alive after the exporting
    /// process exits (a shared-memory file, a VMM handle: true) or the
    /// memory is freed under it (legacy CUDA IPC: false), so that a copy
    /// the exporter's exit overtook moved undefined bytes.
    fn import_outlives_exporter(&self) -> bool {
        true
    }
    /// Source side: the handle naming the owned allocation at `base`; a
    /// grant without WRITE asks for a read-only handle where the kind of
    /// memory allows one (SHM); CUDA handles always map read-write.
    fn export(&self, base: u64, writable: bool) -> Result<ExportedHandle>;
    /// Source side: whether exporting `base` now would first wait for
    /// work the application handed over (a recorded producer stream). The
    /// serving I/O thread then leaves the answer to a worker.
    fn export_waits(&self, _base: u64) -> bool {
        false
    }
    /// Source side: waits for what [`IpcBackend::export_waits`] named,
    /// outside every lock; an error fails the export (nothing exposed).
    fn before_export(&self, _base: u64) -> Result<()> {
        Ok(())
    }
    /// Source side: an export of `base` ended (its close receipt arrived or
    /// its importer provably exited). Backends that count exports use it.
    fn unexport(&self, _base: u64) {}
    /// Source side: whether an export covers the registration it was asked
    /// for (memory the library did not allocate: CMA) rather than the
    /// library allocation holding it, which it then holds against a free.
    fn exports_registrations(&self) -> bool {
        false
    }
    /// Whether an import maps the remote memory into this process, and
    /// so charges the mapping budget (CMA copies through the kernel and
    /// maps nothing).
    fn maps(&self) -> bool {
        true
    }
    /// Source side: whether the requester process `requester`, running
    /// as `uid` (the kernel's credentials of its Unix channel), may use
    /// this transport; an error refuses the channel with its status. CMA
    /// admits only its own user's processes, and names the requester as
    /// this process's ptracer where Yama asks for it.
    fn admit(&self, _uid: u32, _requester: &ProcessIdentity) -> Result<()> {
        Ok(())
    }
    /// Requester side: why this backend can never reach the source process
    /// `source` (`None`: it may), asked before the first channel to it.
    fn refusal(&self, _source: &ProcessIdentity) -> Option<String> {
        None
    }
    /// Requester side: whether `e`, from an import or a copy, means that
    /// this backend can never reach that source (CMA: the kernel refused
    /// the access), so that its requests take another transport from then on.
    fn refuses_for_good(&self, _e: &Error) -> bool {
        false
    }
    /// Source side: whether the handle of `base` exported with `mark` may
    /// still be held — open or mapped — by any process, the importer's
    /// exit notwithstanding (SHM: a forked child keeps its mappings, a
    /// descriptor may have been passed on; `held_file`). Backends whose
    /// handles live in the importing process alone answer `false`: a CUDA
    /// mapping and its context do not survive into a forked child, so the
    /// process's exit is the proof.
    fn handle_held(&self, _base: u64, _mark: u64) -> bool {
        false
    }
    /// Requester side: maps a received handle of `physical` bytes,
    /// read-write only when the grant allows WRITE, for copies with local
    /// memory on `local_device` (`None`: host memory; the backend's rule
    /// picks the GPU). CPU backends ignore the device.
    fn import(
        &self,
        handle: ReceivedHandle,
        physical: u64,
        writable: bool,
        local_device: Option<i32>,
    ) -> Result<Box<dyn Mapping>>;
}
