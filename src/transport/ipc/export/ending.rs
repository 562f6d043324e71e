//! How exports end besides their close receipts: offers expired or
//! withdrawn, a lost channel (offers released, exposed exports retained
//! and their importer watched), an importing process proven gone
//! (reclaimed), the source's close waiting for the table to empty, and the
//! retained exports reported.

use super::*;

impl ExportTable {
    /// Releases the offers of channel `conn` that were not answered within
    /// the offer timeout (their hold, charge and registration go back; a
    /// late answer finds no export). Returns how many expired.
    pub fn expire_offers(&self, conn: u64) -> usize {
        let now = Instant::now();
        let mut t = self.table.lock();
        let ids: Vec<u64> = t
            .exports
            .iter()
            .filter(|(_, e)| e.conn == conn && e.state == ExportState::Offered)
            .filter(|(_, e)| now.duration_since(e.offered_at) >= self.offer_timeout)
            .map(|(k, _)| *k)
            .collect();
        let gone: Vec<Export> = ids.iter().filter_map(|id| t.remove(*id)).collect();
        drop(t);
        let n = gone.len();
        // Counted before the exports go: dropping them releases the region
        // (an unregistration waiting for it returns), and whoever it wakes
        // sees the count.
        if n > 0 {
            self.stats.offers_expired.fetch_add(n as u64, Ordering::Relaxed);
        }
        drop(gone);
        if n > 0 {
            self.changed.notify_all();
        }
        n
    }

    /// The source closes: offers not answered yet are withdrawn (nothing
    /// was exposed; a late answer finds no export). Returns how many.
    pub fn withdraw_offers(&self) -> usize {
        let mut t = self.table.lock();
        let ids: Vec<u64> =
            t.exports.iter().filter(|(_, e)| e.state == ExportState::Offered).map(|(k, _)| *k).collect();
        let gone: Vec<Export> = ids.iter().filter_map(|id| t.remove(*id)).collect();
        drop(t);
        let n = gone.len();
        drop(gone);
        if n > 0 {
            self.changed.notify_all();
        }
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
        let ids: Vec<u64> = t.exports.iter().filter(|(_, e)| e.conn == conn).map(|(k, _)| *k).collect();
        let mut released = Vec::new();
        let mut exited = 0;
        let mut watch = Vec::new();
        for id in ids {
            let e = t.exports.get_mut(&id).expect("present");
            let gone = e.requester.as_ref().is_some_and(|r| process_exited(&r.process));
            if e.state == ExportState::Offered || gone {
                exited += (e.state != ExportState::Offered) as u64;
                released.push(t.remove(id).expect("present"));
            } else {
                e.state = ExportState::Retained;
                if let Some(r) = e.requester {
                    watch.push(r.process);
                }
            }
        }
        let retained = watch.len();
        let pids: std::collections::BTreeSet<u32> = watch.iter().map(|p| p.pid).collect();
        let watch: Vec<ProcessIdentity> =
            watch.into_iter().filter(|p| t.watched.insert((p.pid, p.start_time))).collect();
        drop(t);
        self.reclaimed.fetch_add(exited, Ordering::Relaxed);
        let what = self.backend.transport().name();
        if exited > 0 {
            self.log.info(format_args!("{what}: {exited} exports reclaimed: their importing process exited"));
        }
        if retained > 0 {
            self.log.warn(format_args!(
                "{what}: {retained} exports retained: the IPC channel of process {pids:?} was lost without their \
                 close receipts (reclaimed once it exits, or released by its receipts on a new channel)"
            ));
        }
        drop(released);
        self.changed.notify_all();
        for p in watch {
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
        let key = (p.pid, p.start_time);
        let on_exit = Box::new(move || {
            if let Some(t) = me.upgrade() {
                t.table.lock().watched.remove(&key);
                t.reclaim_exited();
            }
        });
        if !watch(p, on_exit) {
            self.table.lock().watched.remove(&key);
        }
    }

    /// Releases retained exports whose importing process has exited (its
    /// mappings went with it). Returns how many were released.
    pub fn reclaim_exited(&self) -> usize {
        let mut t = self.table.lock();
        let ids: Vec<u64> = t
            .exports
            .iter()
            .filter(|(_, e)| {
                e.state == ExportState::Retained && e.requester.as_ref().is_some_and(|r| process_exited(&r.process))
            })
            .map(|(k, _)| *k)
            .collect();
        let gone: Vec<Export> = ids.iter().filter_map(|id| t.remove(*id)).collect();
        drop(t);
        let n = gone.len();
        self.reclaimed.fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            let what = self.backend.transport().name();
            self.log.info(format_args!("{what}: {n} retained exports reclaimed: their importing process exited"));
        }
        drop(gone);
        if n > 0 {
            self.changed.notify_all();
        }
        n
    }

    /// Waits until no export is left or `deadline`; returns how many remain.
    pub fn wait_empty(&self, deadline: Instant) -> usize {
        self.reclaim_exited();
        let mut t = self.table.lock();
        while !t.exports.is_empty() || t.acks_pending > 0 {
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
        t.exports.len()
    }

    /// Retained exports, for `retained_resources`.
    pub fn retained(&self) -> Vec<serde_json::Value> {
        let t = self.table.lock();
        t.exports
            .iter()
            .filter(|(_, e)| e.state == ExportState::Retained)
            .map(|(id, e)| {
                serde_json::json!({"export_id": id, "base": e.base, "requester_pid": e.requester.map(|r| r.process.pid),
                    "transport": self.backend.transport().name()})
            })
            .collect()
    }
}
