//! How exports end besides their close receipts: offers expired or
//! withdrawn, a lost channel (offers released, exposed exports retained
//! and their importer watched), an importing process proven gone
//! (reclaimed), the source's close waiting for the table to empty, and the
//! retained exports reported. The decisions are the core's
//! ([`ExportsCore`]); this is what the driver does with them.

use super::*;

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
        let lost = t.core.connection_lost(conn, process_exited);
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

    /// Has the engine's exit watch call [`ExportTable::reclaim_exited`] once
    /// process `p` exited. Without a watch (none set, or the process
    /// descriptor refused) the retained exports are reclaimed at the next
    /// [`ExportTable::reclaim_exited`] (every export request, and the close).
    pub(super) fn watch_exit(&self, p: ProcessIdentity) {
        let (Some(watch), Some(me)) = (self.exit_watch.get(), self.me.get().cloned()) else {
            return;
        };
        let on_exit = Box::new(move || {
            if let Some(t) = me.upgrade() {
                t.table.lock().core.unwatch(&p);
                t.reclaim_exited();
            }
        });
        if !watch(p, on_exit) {
            self.table.lock().core.unwatch(&p);
        }
    }

    /// Releases retained exports whose importing process has exited (its
    /// mappings went with it). Returns how many were released.
    pub fn reclaim_exited(&self) -> usize {
        let mut t = self.table.lock();
        let gone = t.core.reclaim_exited(process_exited);
        let n = gone.len();
        self.settle(t, gone);
        if n > 0 {
            let what = self.backend.transport().name();
            self.log.info(format_args!("{what}: {n} retained exports reclaimed: their importing process exited"));
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
