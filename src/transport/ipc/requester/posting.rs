//! A group's copies posted through its import (requests contiguous on both
//! sides coalesced into one copy when they are independent), and the group
//! ended once its completion is known: receipts, the import closed or kept,
//! each request's outcome.

use super::*;
use crate::sync::spare::Spare;

/// A group's copies' vector kept between groups (no lock): built by
/// [`IpcRequester::post`], lent to the mapping, given back once it returns.
static SPARE_OPS: Spare<CopyOp> = Spare::new();

impl IpcRequester {
    /// Enqueues (or performs) every copy of the group through the import:
    /// independent requests contiguous on both sides as one copy (when
    /// coalescing), each request's outcome kept with it.
    pub(super) fn post(
        &self,
        imp: Arc<Import>,
        key: Option<(Key, bool)>,
        items: Vec<(usize, Request)>,
        local: &GroupLocal,
        deadline: Instant,
        fences: Vec<owners::Fence>,
    ) -> Posted {
        let GroupLocal { spans, independent, .. } = local;
        let base = imp.mapping.base();
        let mut ops = SPARE_OPS.take(items.len());
        ops.extend(items.iter().map(|(_, r)| {
            let remote = base + (r.remote_addr - imp.offer.base);
            match r.op {
                Op::Read => CopyOp { dst: r.local_addr, src: remote, len: r.len },
                Op::Write => CopyOp { dst: remote, src: r.local_addr, len: r.len },
            }
        }));
        // Requests shown independent make independent copies while the
        // import's mapping lies apart from every local region (it is a
        // mapping of its own unless a caller registered it as local memory).
        let apart = || !spans.overlaps(base, base.saturating_add(imp.offer.physical));
        let plan = match *independent && apart() {
            true => {
                debug_assert_eq!(classify(&ops), CopyPlan::Independent);
                CopyPlan::Independent
            }
            false => classify(&ops),
        };
        if plan == CopyPlan::Independent && self.coalesce && ops.len() > 1 {
            coalesce::runs_in_place(&mut ops, |i| items[i].1.op, spans);
        }
        self.events.copies_issued.fetch_add(ops.len() as u64, Ordering::Relaxed);
        self.events.requests_coalesced.fetch_add((items.len() - ops.len()) as u64, Ordering::Relaxed);
        let copied = self.mapping_copy(&imp, &ops, plan);
        // The mapping only borrowed them.
        SPARE_OPS.give(ops);
        let (key, entered) = match key {
            Some((k, e)) => (Some(k), e),
            None => (None, false),
        };
        Posted { imp, key, items, copied, deadline, entered, fences }
    }

    /// Ends a posted group once its completion is known (`drained`). On a
    /// copy failure every item of the group is affected. An unconfirmed
    /// completion keeps the import, its charge and the source's export
    /// (no close, no receipt). Otherwise the import is closed with its
    /// receipt (no cache), or an operation-complete receipt is sent (cache):
    /// [`Ending::of`] decides which.
    pub(super) fn finish(&self, p: Posted, drained: Result<()>) -> Finished {
        let Posted { imp, key, items, copied, deadline, entered, fences } = p;
        // Every item of the group ends alike: Ok, or failed by the last
        // error found below.
        let mut failed: Option<Error> = None;
        let uncertain = drained.is_err();
        if uncertain {
            // The copies may still touch the local pinned owners: they stay
            // loaned (fenced) with the retained import.
            self.fenced.lock().extend(fences);
        } else {
            drop(fences);
        }
        if let Err(e) = drained.and(copied.map(|_| ())) {
            if self.backend.refuses_for_good(&e) {
                self.refuse(&imp.link, e.message().to_string());
            }
            failed = Some(e);
        }
        if !uncertain && !self.backend.import_outlives_exporter() && imp.link.source_exited() {
            // The exporter's exit may have overtaken the copy and freed the
            // memory under it: whatever the driver reported, what moved is
            // undefined. Never Ok (a READ's remote effect stays None).
            let e = Error::Unavailable(format!(
                "{}: the source process exited while the copy ran, freeing the imported memory under it",
                imp.describe()
            ));
            failed = Some(e);
        }
        if uncertain {
            let why = failed.as_ref().map_or("", |e| e.message());
            self.log.warn(format_args!(
                "{}: import retained for good: its completion is uncertain ({why})",
                imp.describe()
            ));
        }
        let end = GroupEnd {
            entered,
            uncertain,
            all_ok: failed.is_none(),
            requests: items.len(),
            bytes: items.iter().map(|(_, r)| r.len).sum(),
        };
        match Ending::of(key, end) {
            Ending::Retain => self.retained.lock().imports.push(Retained { import: imp, native_closed: false }),
            Ending::Close => {
                // Posted copies (even failed ones) end with the import closed.
                if let Err((e, native_closed)) = self.close_import(&imp, false, deadline) {
                    self.retained.lock().imports.push(Retained { import: imp.clone(), native_closed });
                    failed = Some(e);
                }
            }
            Ending::MarkUncertain(key) => {
                let why = failed.as_ref().map(|e| e.message().to_string());
                self.cache.mark_uncertain(&key, imp, &why.unwrap_or_else(|| "completion not confirmed".into()))
            }
            Ending::Leave { key, requests, bytes } => {
                // The group ran inside the grant the source published (it
                // could not have revoked it meanwhile): its outcome is known
                // without a receipt; what it moved is counted in the slot.
                imp.leave(requests, bytes);
                self.release(&key);
            }
            Ending::Receipt { key, bytes, requests } => {
                let r = imp.export_ref(bytes, requests);
                if let Err(e) = imp.link.receipt(MsgKind::OpComplete, &r, deadline) {
                    failed = Some(e);
                }
                self.release(&key);
            }
            Ending::Release(key) => self.release(&key),
        }
        Finished { items, failed }
    }
}
