//! How exports end besides their close receipts: offers expired or
//! withdrawn, a lost channel (offers released, exposed exports retained
//! and their importer watched), an importer proven gone (reclaimed), the
//! source's close waiting for the table to empty, and the retained exports
//! reported. The decisions are the core's ([`ExportsCore`]); this is what
//! the driver does with them.
//!
//! An importer is gone when every thread of its process has exited *and*
//! nothing else still holds the handle it was sent (a child it forked
//! keeps its mappings; `IpcBackend::handle_held`). Until both are proven
//! its exports stay, and its watch keeps asking.

use super::*;

impl ExportTable {
    /// Whether nothing still holds the handle export `held` was sent (open
    /// or mapped, in any process), as far as the backend can tell.
    pub(super) fn let_go(&self, held: &Held) -> bool {
        !held.mark.is_some_and(|m| self.backend.handle_held(held.base, m))
    }
}

impl ExportTable {
    /// Releases the offers of channel `conn` that were not answered within
    /// the offer timeout (their hold, charge and registration go back; a
    /// late answer finds no export). Returns how many expired.
    pub fn expire_offers(&self, conn: u64) -> usize {
        let mut t = self.table.lock();
        let gone = t.core.expire_offers(conn, Instant::now());
        let n = gone.len();
        // Counted before the exports go: dropping them releases the region
        // (an unregistration waiting for it returns), and whoever it wakes
        // sees the count.
        if n > 0 {
            self.stats.events.offers_expired.fetch_add(n as u64, Ordering::Relaxed);
        }
        self.settle(t, gone);
        n
    }

    /// When the earliest unanswered offer of channel `conn` expires.
    pub fn next_offer_expiry(&self, conn: u64) -> Option<Instant> {
        self.table.lock().core.next_offer_expiry(conn)
    }

    /// The source closes: offers not answered yet are withdrawn (nothing
    /// was exposed; a late answer finds no export). Returns how many.
    pub fn withdraw_offers(&self) -> usize {
        let mut t = self.table.lock();
        let gone = t.core.withdraw_offers();
        let n = gone.len();
        self.settle(t, gone);
        n
    }

    /// The channel `conn` was lost. Offers (never exposed) are released;
    /// exposed exports stay retained unless the importer provably exited,
    /// and the importing process is watched: its exit releases them while
    /// the source runs (within a tick of it), with no close needed.
    pub fn connection_lost(&self, conn: u64) {
        let mut t = self.table.lock();
        // Retained exports keep the board alive through their slots.
        t.boards.remove(&conn);
        let lost = t.core.connection_lost(conn, process_exited, |h| self.let_go(h));
        self.settle(t, lost.released);
        let what = self.backend.transport().name();
        if lost.reclaimed > 0 {
            self.log.info(format_args!("{what}: {} exports reclaimed: their importing process exited", lost.reclaimed));
        }
        if lost.retained > 0 {
            self.log.warn(format_args!(
                "{what}: {} exports retained: the IPC channel of process {:?} was lost without their close receipts \
                 (reclaimed once it exits, or released by its receipts on a new channel)",
                lost.retained, lost.pids
            ));
        }
        self.changed.notify_all();
        for p in lost.watch {
            self.watch_exit(p);
        }
    }

    /// Has the engine's exit watch call [`ExportTable::reclaim_of`] for
    /// process `p` (at once when it exits, and every so often), until no
    /// export of `p` is left to wait for. Without a watch (none set, or
    /// the engine stopping) kept exports are reclaimed at the next
    /// [`ExportTable::reclaim_exited`] (the close).
    pub(super) fn watch_exit(&self, p: ProcessIdentity) {
        let (Some(watch), Some(me)) = (self.exit_watch.get(), self.me.get().cloned()) else {
            return;
        };
        let on_exit = Box::new(move |exited| me.upgrade().is_none_or(|t| t.reclaim_of(&p, exited)));
        if !watch(p, on_exit) {
            self.table.lock().core.unwatch(&p);
        }
    }

    /// Releases process `p`'s kept exports whose import is provably closed
    /// (retained ones once it `exited`). `true` once none is left to wait
    /// for (its watch ends).
    fn reclaim_of(&self, p: &ProcessIdentity, exited: bool) -> bool {
        let mut t = self.table.lock();
        let (gone, left) = t.core.reclaim_process(p, exited, |h| self.let_go(h));
        if left == 0 {
            t.core.unwatch(p);
        }
        self.reclaimed(t, gone);
        left == 0
    }

    /// Releases kept exports whose import is provably closed: retained ones
    /// whose process exited, lingering ones, once nothing else holds their
    /// handles. Returns how many were released.
    pub fn reclaim_exited(&self) -> usize {
        let mut t = self.table.lock();
        let gone = t.core.reclaim_exited(process_exited, |h| self.let_go(h));
        self.reclaimed(t, gone)
    }

    /// Settles reclaimed exports and says so; how many.
    fn reclaimed(&self, t: MutexGuard<'_, Table>, gone: Vec<Released<Held>>) -> usize {
        let n = gone.len();
        self.settle(t, gone);
        if n > 0 {
            let what = self.backend.transport().name();
            self.log.info(format_args!(
                "{what}: {n} kept exports reclaimed: their importing process exited or let go, and nothing else \
                 holds their handles"
            ));
        }
        n
    }

    /// Waits until no export is left or `deadline`; returns how many remain.
    pub fn wait_empty(&self, deadline: Instant) -> usize {
        self.reclaim_exited();
        let mut t = self.table.lock();
        while !t.core.is_empty() {
            let step = (Instant::now() + Duration::from_millis(100)).min(deadline);
            let timed_out = self.changed.wait_until(&mut t, step).timed_out();
            if timed_out && Instant::now() >= deadline {
                break;
            }
            if timed_out {
                drop(t);
                self.reclaim_exited();
                t = self.table.lock();
            }
        }
        t.core.len()
    }

    /// Retained exports, for `retained_resources`.
    pub fn retained(&self) -> Vec<serde_json::Value> {
        let t = self.table.lock();
        let what = self.backend.transport().name();
        t.core
            .retained()
            .into_iter()
            .map(|(id, base, pid)| {
                serde_json::json!({"export_id": id, "base": base, "requester_pid": pid, "transport": what})
            })
            .collect()
    }
}
