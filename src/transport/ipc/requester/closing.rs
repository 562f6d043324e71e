//! Closing an import: its native close, then the close receipt the
//! source acknowledges; a source that provably left is owed no receipt;
//! cached imports no longer current are closed before new ones open.

use super::*;

impl IpcRequester {
    /// Native close, then the close receipt. Only both succeeding releases
    /// the import; a failed native close is never retried; a lost ACK is
    /// retried once as a receipt only. When the source provably left, no
    /// receipt is owed (its export went with it): the import is released
    /// after the native close and counted as released after exit.
    pub(super) fn close_import(
        &self,
        imp: &Import,
        native_closed: bool,
        deadline: Instant,
    ) -> std::result::Result<(), (Error, bool)> {
        if !native_closed {
            imp.stop_direct_copies();
            self.mapping_close(imp).map_err(|e| {
                self.log.warn(format_args!(
                    "{}: import retained for good: its native close failed ({})",
                    imp.describe(),
                    e.message()
                ));
                (e, false)
            })?;
        }
        let link = self.channel_for(&imp.link);
        let receipt = match link.source_left() {
            true => None,
            false => Some(link.receipt(MsgKind::CloseReceipt, &imp.export_ref(0, 0), deadline)),
        };
        match receipt {
            Some(Ok(())) => {
                self.events.closed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // The receipt's own failure may be how the link learned that the
            // source left.
            None => self.released(),
            Some(Err(_)) if link.source_left() => self.released(),
            Some(Err(e)) => {
                self.log.warn(format_args!(
                    "{}: import kept: its close receipt could not be confirmed ({}); later submissions, flushes \
                     and the close retry it",
                    imp.describe(),
                    e.message()
                ));
                Err((e, true))
            }
        }
    }

    /// A new link to a source: receipts owed through links to the same
    /// source that this engine closed (`orbite_disconnect` while an import
    /// was cached, retained or being closed) go out on it from now on.
    pub fn track(&self, link: &Arc<IpcLink>) {
        let mut links = self.links.lock();
        links.retain(|l| l.strong_count() > 0);
        links.push(Arc::downgrade(link));
    }

    /// The link a receipt owed through `link` goes out on: `link` itself,
    /// unless this engine closed it and a later link to the same source
    /// (its engine epoch and process, kernel-verified by both channels)
    /// is open or may open; the source accepts a close receipt from a
    /// later channel of the same requester engine.
    pub(super) fn channel_for(&self, link: &Arc<IpcLink>) -> Arc<IpcLink> {
        if !link.closed_here() {
            return link.clone();
        }
        let links = self.links.lock();
        let next = links.iter().rev().filter_map(std::sync::Weak::upgrade).find(|l| {
            !Arc::ptr_eq(l, link) && l.source == link.source && l.transport == link.transport && !l.is_dead()
        });
        next.unwrap_or_else(|| link.clone())
    }

    pub(super) fn released(&self) -> std::result::Result<(), (Error, bool)> {
        self.events.released_after_exit.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Closes the cached imports that are no longer current (their source
    /// left, or their channel was replaced) and retries the receipts owed
    /// by retained ones of sources that left. Runs before a new import is
    /// opened, so dead sources never keep the cache full.
    pub(super) fn reclaim(&self, deadline: Instant) -> usize {
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        // The imports of one source share its link: whether the source
        // exited is asked once per link (a poll of its process descriptor),
        // not once per import (a pool of a hundred regions opens a hundred
        // imports, each reclaiming over all the others).
        let exited: std::cell::RefCell<Vec<(*const IpcLink, bool)>> = Default::default();
        let source_exited = |link: &Arc<IpcLink>| {
            let key = Arc::as_ptr(link);
            if let Some(&(_, known)) = exited.borrow().iter().find(|(k, _)| *k == key) {
                return known;
            }
            let now = link.source_exited();
            exited.borrow_mut().push((key, now));
            now
        };
        self.cache.reclaim(&close, &|imp: &Import| imp.current() && !source_exited(&imp.link), false)
    }
}
