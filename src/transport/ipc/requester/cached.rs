//! The requester's relocation cache at work: taking an import for a group
//! (a cached one, or a new one opened and cached), giving it back, and
//! flushing imports (all, or one link's) through their close receipts.

use super::*;

impl IpcRequester {
    /// The cached import under `key`, or one opened for `want` and cached;
    /// true when it was opened now.
    pub(super) fn acquire(&self, key: &Key, want: Want) -> Result<(Arc<Import>, bool)> {
        let deadline = want.deadline;
        let label = || format!("{} region {}", want.link.label, want.region.id);
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        let open = || {
            self.reclaim(deadline);
            self.open(want)
        };
        self.cache.acquire(key, deadline, &label, open, &close, &Import::current)
    }

    /// A writable import of `region` for `local_device` was just opened:
    /// the idle READ-only import of the same key is redundant (the writable
    /// one serves READs too) and gives its mapping budget back. One in use
    /// stays until it is evicted.
    pub(super) fn give_back_read_only(
        &self,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        local_device: Option<i32>,
        deadline: Instant,
    ) {
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        let redundant = |imp: &Import| {
            Arc::ptr_eq(&imp.link, link)
                && imp.local_device == local_device
                && !imp.writable()
                && imp.offer.region_epoch == region.epoch
                && imp.maps(region.addr)
        };
        self.cache.flush_where(deadline, &close, &redundant, false);
    }

    pub(super) fn release(&self, key: &Key) {
        self.cache.release(key)
    }

    /// Closes every cached import (waiting for users up to `deadline`)
    /// through the same receipts; new submissions may refill the cache.
    /// Retained entries owing only a receipt get their receipt-only retry.
    /// Returns what stays, one line each: which import, and why.
    pub fn flush(&self, deadline: Instant) -> Vec<String> {
        self.flush_where(deadline, &|_| true, &|_| true)
    }

    /// Flushes every import granted through `link` (this engine
    /// disconnects from its source). Returns what stays, as `flush` does.
    pub fn flush_link(&self, link: &Arc<IpcLink>, deadline: Instant) -> Vec<String> {
        self.flush_where(deadline, &|l| Arc::ptr_eq(l, link), &|_| true)
    }

    /// Gives back the imports granted through `link` whose grant the source
    /// withdrew on its board (it revoked their slots before asking, with a
    /// `Revoke`: it unregisters their region, or closes) or that have no
    /// slot to say so, and retries what is owed through `link`; imports of
    /// the source's other regions stay cached. Returns what stays, as
    /// `flush` does.
    pub fn give_back(&self, link: &Arc<IpcLink>, deadline: Instant) -> Vec<String> {
        self.flush_where(deadline, &|l| Arc::ptr_eq(l, link), &Import::withdrawn)
    }

    /// Flushes what was granted through the links `pick` chooses: of the
    /// cached imports, those `imports` chooses.
    fn flush_where(
        &self,
        deadline: Instant,
        pick: &dyn Fn(&Arc<IpcLink>) -> bool,
        imports: &dyn Fn(&Import) -> bool,
    ) -> Vec<String> {
        // A receipt owed through a channel lost a moment ago waits for it to
        // come back (within the deadline) rather than failing at once.
        let close = |imp: &Import, nc: bool| {
            self.channel_for(&imp.link).settle_reconnect(deadline);
            self.close_import(imp, nc, deadline)
        };
        let mut left: Vec<String> = self
            .cache
            .flush_where(deadline, &close, &|imp: &Import| pick(&imp.link) && imports(imp), true)
            .into_iter()
            .map(|(k, why)| format!("{} region {}: {why}", k.0, k.2))
            .collect();
        // Uncached imports that owe only their receipt get one more try,
        // with the list's lock released: a receipt is a round trip, and the
        // progress worker retains imports meanwhile.
        let taken = std::mem::take(&mut *self.retained.lock());
        let mut kept = Owed::default();
        for ent in taken.imports {
            if !pick(&ent.import.link) {
                kept.imports.push(ent);
                continue;
            }
            if !ent.native_closed {
                left.push(format!("{}: its native close or completion was not confirmed", ent.import.describe()));
                kept.imports.push(ent);
                continue;
            }
            match close(&ent.import, true) {
                Ok(()) => {}
                Err((e, _)) => {
                    left.push(format!(
                        "{}: its close receipt could not be confirmed ({})",
                        ent.import.describe(),
                        e.message()
                    ));
                    kept.imports.push(ent);
                }
            }
        }
        for g in taken.grants {
            if !pick(&g.link) {
                kept.grants.push(g);
                continue;
            }
            if let Err(why) = self.release_lost_grant(&g, deadline) {
                left.push(why);
                kept.grants.push(g);
            }
        }
        let mut owed = self.retained.lock();
        owed.imports.extend(kept.imports);
        owed.grants.extend(kept.grants);
        left
    }

    /// Tells the source that a grant whose handle was lost with its channel
    /// mapped nothing (a close receipt); `Err(why)`: kept, unconfirmed. A
    /// source that left, or that no longer knows the export (never
    /// exposed, or already reclaimed), is owed nothing.
    fn release_lost_grant(&self, g: &LostGrant, deadline: Instant) -> std::result::Result<(), String> {
        // The channel the handle was lost with is usually being
        // re-established: the release waits for it, within the deadline.
        let link = self.channel_for(&g.link);
        link.settle_reconnect(deadline);
        if link.source_left() {
            return Ok(());
        }
        match link.receipt(MsgKind::CloseReceipt, &g.r, deadline) {
            Ok(()) => Ok(()),
            Err(e) if e.status() == crate::error::Status::NotFound || link.source_left() => Ok(()),
            Err(e) => Err(format!(
                "{}: export {}, accepted but its handle was lost with its channel: its release could not be \
                 confirmed ({})",
                g.link.label,
                g.r.export_id,
                e.message()
            )),
        }
    }

    /// Remote region ids with a cached import, least recently used first.
    pub fn cached_regions(&self) -> Vec<u64> {
        let mut v: Vec<(u64, u64)> = self
            .cache
            .entries()
            .into_iter()
            .filter(|e| e.2 == EntryState::Ready)
            .map(|(k, last, _, _)| (last, k.2))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, r)| r).collect()
    }
}
