//! Fault injection for the IPC protocol: a wrapper backend that fails the
//! next N native closes, completions or copies on demand, and switches that
//! drop the next N receipt acknowledgements or export handles (with their
//! channel). Inert (one atomic load per
//! operation) until armed; tests arm it through `Engine::faults()`.

use super::backend::{CopyOp, CopyPlan, ExportedHandle, IpcBackend, Mapping, Posting, ReceivedHandle};
use crate::control::identity::ProcessIdentity;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

/// Counters of faults to inject ("fail the next N").
#[derive(Debug, Default)]
pub struct Faults {
    /// Native close (unmap) fails.
    pub fail_close: AtomicU32,
    /// Completion wait fails.
    pub fail_completion: AtomicU32,
    /// A copy fails.
    pub fail_copy: AtomicU32,
    /// A receipt's acknowledgement is lost on the way back.
    pub lose_ack: AtomicU32,
    /// The channel breaks as an export handle arrives (the handle goes
    /// with it).
    pub lose_handle: AtomicU32,
    /// The channel breaks as a receipt's acknowledgement arrives (the
    /// source took the receipt; the requester cannot know).
    pub break_at_ack: AtomicU32,
    /// The next offer names an allocation that ends with its grant, as a
    /// source whose published region reaches past the allocation it
    /// exports would (the import maps no more).
    pub narrow_offer: AtomicU32,
    /// Completion queries answer "not ready yet" this many more times.
    pub pending_polls: AtomicU32,
}

impl Faults {
    /// Takes one fault from `counter` if armed.
    pub fn take(counter: &AtomicU32) -> bool {
        crate::sync::take_armed(counter)
    }
}

/// Wraps a backend and injects the armed faults.
pub struct FaultyBackend {
    inner: Arc<dyn IpcBackend>,
    faults: Arc<Faults>,
}

impl FaultyBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn IpcBackend>, faults: Arc<Faults>) -> FaultyBackend {
        FaultyBackend { inner, faults }
    }
}

struct FaultyMapping {
    inner: Box<dyn Mapping>,
    faults: Arc<Faults>,
}

impl IpcBackend for FaultyBackend {
    fn transport(&self) -> TransportKind {
        self.inner.transport()
    }
    fn usable(&self) -> Result<()> {
        self.inner.usable()
    }
    fn import_outlives_exporter(&self) -> bool {
        self.inner.import_outlives_exporter()
    }
    fn export(&self, base: u64, writable: bool) -> Result<ExportedHandle> {
        self.inner.export(base, writable)
    }
    fn export_waits(&self, base: u64) -> bool {
        self.inner.export_waits(base)
    }
    fn before_export(&self, base: u64) -> Result<()> {
        self.inner.before_export(base)
    }
    fn unexport(&self, base: u64) {
        self.inner.unexport(base)
    }
    fn exports_registrations(&self) -> bool {
        self.inner.exports_registrations()
    }
    fn maps(&self) -> bool {
        self.inner.maps()
    }
    fn admit(&self, uid: u32, requester: &ProcessIdentity) -> Result<()> {
        self.inner.admit(uid, requester)
    }
    fn refusal(&self, source: &ProcessIdentity) -> Option<String> {
        self.inner.refusal(source)
    }
    fn refuses_for_good(&self, e: &Error) -> bool {
        self.inner.refuses_for_good(e)
    }
    fn handle_held(&self, base: u64, mark: u64) -> bool {
        self.inner.handle_held(base, mark)
    }
    fn import(
        &self,
        handle: ReceivedHandle,
        physical: u64,
        writable: bool,
        local_device: Option<i32>,
    ) -> Result<Box<dyn Mapping>> {
        let inner = self.inner.import(handle, physical, writable, local_device)?;
        Ok(Box::new(FaultyMapping { inner, faults: self.faults.clone() }))
    }
}

impl Mapping for FaultyMapping {
    fn base(&self) -> u64 {
        self.inner.base()
    }
    fn copy(&self, ops: &[CopyOp], plan: CopyPlan) -> Result<Posting> {
        if Faults::take(&self.faults.fail_copy) {
            return Err(Error::TransferFailed("injected fault: copy failed".into()));
        }
        self.inner.copy(ops, plan)
    }
    fn wait(&self, posting: Posting) -> Result<()> {
        if Faults::take(&self.faults.fail_completion) {
            return Err(Error::Unquiesced("injected fault: completion could not be confirmed".into()));
        }
        self.inner.wait(posting)
    }
    fn completes_by_waiting(&self) -> bool {
        // Polled, like a GPU's, while a polling fault is armed.
        self.inner.completes_by_waiting() && self.faults.pending_polls.load(std::sync::atomic::Ordering::SeqCst) == 0
    }
    fn query(&self, posting: Posting) -> Result<bool> {
        if Faults::take(&self.faults.pending_polls) {
            return Ok(false);
        }
        if Faults::take(&self.faults.fail_completion) {
            return Err(Error::Unquiesced("injected fault: completion could not be confirmed".into()));
        }
        self.inner.query(posting)
    }
    fn abandon(&self, posting: Posting) {
        self.inner.abandon(posting)
    }
    fn close(&self) -> Result<()> {
        if Faults::take(&self.faults.fail_close) {
            return Err(Error::Unquiesced("injected fault: native close failed".into()));
        }
        self.inner.close()
    }
}
