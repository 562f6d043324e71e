//! Imports held by direct routes: a route keeps a weak reference to the
//! cached import its last copy went through, and copies one request
//! through it without the cache's lock while the import is still cached,
//! current and mapped, and the source still grants the copy on its board.
//! Anything else (no import yet, one being closed, a grant revoked, a
//! copy that would start on the copy pool) is the full path's: nothing is
//! tried here then.
//!
//! Why a copy here never touches unmapped memory: the copy counts itself
//! in (`direct_users`) and then reads `unmapping`; the native close sets
//! `unmapping` and then waits until no copy is counted in (both
//! sequentially consistent, as the grant board's enter and revoke). Either
//! the copy sees `unmapping` and does not start, or the close sees it
//! counted and waits for it.

use super::*;
use crate::kinds::TransportKind;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Weak;

/// A weak reference to a cached import, as a direct route holds it: it
/// keeps neither the mapping nor its budget charge (the cache does).
#[derive(Clone, Default)]
pub struct HeldImport(Weak<Import>);

impl Import {
    /// Counts a direct copy in: false (nothing counted) when the import is
    /// being unmapped.
    fn enter_direct(&self) -> bool {
        self.direct_users.fetch_add(1, SeqCst);
        if self.unmapping.load(SeqCst) {
            self.direct_users.fetch_sub(1, SeqCst);
            return false;
        }
        true
    }

    fn leave_direct(&self) {
        self.direct_users.fetch_sub(1, SeqCst);
    }

    /// Before the native close: no direct copy starts, and the ones running
    /// (one memcpy each) end.
    pub(super) fn stop_direct_copies(&self) {
        self.unmapping.store(true, SeqCst);
        while self.direct_users.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

impl IpcRequester {
    /// The import the cache holds now for `region` of `link`'s source in
    /// host memory (the writable one first), current and of the region's
    /// epoch; an empty reference when there is none. Only CPU copies (SHM,
    /// CMA) are held: the others complete through their device's streams.
    pub fn held(&self, link: &Arc<IpcLink>, region: &RegionInfo) -> HeldImport {
        if !matches!(self.backend.transport(), TransportKind::Shm | TransportKind::Cma) || self.capacity == 0 {
            return HeldImport::default();
        }
        let keys = [cache_key(link, region, None, true), cache_key(link, region, None, false)];
        match self.cache.share_first(keys.iter(), &Import::current) {
            Some((at, imp)) => {
                self.release(&keys[at]);
                // Defence in depth, unreachable as the requester stands: the
                // keys name `region.epoch`, and the import under them was
                // opened for that epoch, whose offer `Opening::offered`
                // checked (`o.region_epoch == r.region_epoch` in
                // `proto/requester.rs`, killed by `tests/seed_rows.rs`
                // x2's "another region epoch"). What stops a route whose
                // region was re-registered is the source revoking its grant
                // (`tests/direct.rs`, a route to an unregistered region).
                match imp.offer.region_epoch == region.epoch {
                    true => HeldImport(Arc::downgrade(&imp)),
                    false => HeldImport::default(),
                }
            }
            None => HeldImport::default(),
        }
    }

    /// Copies `req` (host memory on this side, inside `region`) through the
    /// held import, on the caller: `None` when it cannot be tried here
    /// (nothing moved; the full path runs it), else its outcome.
    pub fn copy_held(&self, held: &HeldImport, req: &Request) -> Option<Result<()>> {
        let imp = held.0.upgrade()?;
        if !imp.maps_range((req.remote_addr, req.len)) || !imp.current() {
            return None;
        }
        let ops = op_bit(req.op);
        if !imp.enter_direct() {
            return None;
        }
        if !imp.enter(ops) {
            imp.leave_direct();
            return None;
        }
        let remote = imp.mapping.base() + (req.remote_addr - imp.offer.base);
        let op = match req.op {
            Op::Read => CopyOp { dst: req.local_addr, src: remote, len: req.len },
            Op::Write => CopyOp { dst: remote, src: req.local_addr, len: req.len },
        };
        let moved = self.mapping_copy(&imp, &[op], classify(&[op])).and_then(|p| self.mapping_wait(&imp, p));
        // The copy ran inside the grant the source published: its outcome
        // is known without a receipt; what it moved is counted in the slot.
        match &moved {
            Ok(()) => imp.leave(1, req.len),
            Err(_) => imp.leave(0, 0),
        }
        imp.leave_direct();
        self.events.groups_without_round_trip.fetch_add(1, Ordering::Relaxed);
        self.events.direct_copies.fetch_add(1, Ordering::Relaxed);
        self.events.copies_issued.fetch_add(1, Ordering::Relaxed);
        Some(moved)
    }
}
