//! How exports end without a close receipt: offers that expired unanswered
//! or were withdrawn at the close, a lost channel, an importer proven gone
//! (its process exited and nothing holds its handle), and the table
//! drained when it goes. Each hands what ended back as [`Released`].

use super::*;

impl<R> ExportsCore<R> {
    /// Ends the offers of channel `conn` unanswered at `now` after the
    /// offer timeout (a late answer finds no export). Looks at the
    /// channel's oldest offers only.
    pub fn expire_offers(&mut self, conn: u64, now: Instant) -> Vec<Released<R>> {
        let timeout = self.offer_timeout;
        let Some(waiting) = self.offers.get(&conn) else { return Vec::new() };
        let due: Vec<u64> = waiting
            .iter()
            .take_while(|(at, _)| now.saturating_duration_since(*at) >= timeout)
            .map(|(_, id)| *id)
            .collect();
        self.take_all(due)
    }

    /// When the earliest offer of channel `conn` not answered yet expires
    /// ([`ExportsCore::expire_offers`] releases it then).
    pub fn next_offer_expiry(&self, conn: u64) -> Option<Instant> {
        self.offers.get(&conn).and_then(|s| s.first()).map(|(at, _)| *at + self.offer_timeout)
    }

    /// The source closes: every offer not answered yet is withdrawn.
    pub fn withdraw_offers(&mut self) -> Vec<Released<R>> {
        let ids = self.offers.values().flat_map(|s| s.iter().map(|(_, id)| *id)).collect();
        self.take_all(ids)
    }

    /// Channel `conn` was lost. Offers end; an export being answered is
    /// abandoned (ended when its answer finishes); exposed exports stay
    /// retained unless their importer is provably gone (its process
    /// `exited`, and nothing else holds its handle: `let_go`), and the
    /// importing processes not watched yet are returned to be watched.
    pub fn connection_lost(
        &mut self,
        conn: u64,
        exited: impl FnMut(&ProcessIdentity) -> bool,
        mut let_go: impl FnMut(&R) -> bool,
    ) -> Lost<R> {
        let mut lost =
            Lost { released: Vec::new(), reclaimed: 0, retained: 0, pids: BTreeSet::new(), watch: Vec::new() };
        let mut exited = once_per_process(exited);
        let ids: Vec<u64> = self.by_conn.get(&conn).map(|s| s.iter().copied().collect()).unwrap_or_default();
        for id in ids {
            let e = self.exports.get(&id).expect("indexed");
            let (state, requester) = (e.state, e.grant.requester);
            match state {
                ExportState::Exposing if mutated!(self.mutations.release_exports_being_made) => {
                    lost.released.extend(self.take(id))
                }
                ExportState::Exposing => self.set_state(id, ExportState::Abandoned),
                ExportState::Abandoned | ExportState::Retained | ExportState::Lingering => {}
                ExportState::Offered if mutated!(self.mutations.keep_offers_of_lost_channels) => {}
                ExportState::Offered => lost.released.extend(self.take(id)),
                ExportState::Exposed if requester.is_some_and(|r| exited(&r.process) && let_go(&e.res)) => {
                    lost.reclaimed += 1;
                    lost.released.extend(self.take(id));
                }
                ExportState::Exposed => {
                    self.set_state(id, ExportState::Retained);
                    lost.retained += 1;
                    if let Some(r) = requester {
                        lost.pids.insert(r.process.pid);
                        if self.watched.insert(process_key(&r.process)) {
                            lost.watch.push(r.process);
                        }
                    }
                }
            }
        }
        self.reclaimed += lost.reclaimed;
        lost
    }

    /// Process `p` is no longer watched (its watch ended or could not be
    /// set up).
    pub fn unwatch(&mut self, p: &ProcessIdentity) {
        self.watched.remove(&process_key(p));
    }

    /// Ends kept exports whose import is provably closed (see
    /// [`ExportsCore::reclaim_process`]), over every importing process.
    pub fn reclaim_exited(
        &mut self,
        exited: impl FnMut(&ProcessIdentity) -> bool,
        mut let_go: impl FnMut(&R) -> bool,
    ) -> Vec<Released<R>> {
        let mut exited = once_per_process(exited);
        let procs: Vec<ProcessIdentity> =
            self.by_process.keys().map(|&(pid, start_time)| ProcessIdentity { pid, start_time }).collect();
        procs.iter().flat_map(|p| self.reclaim_process(p, exited(p), &mut let_go).0).collect()
    }

    /// Ends process `p`'s kept exports whose import is provably closed: a
    /// retained one once `p` `exited` and nothing else holds its handle
    /// (`let_go`), a lingering one once nothing holds it. Returns them and
    /// how many exports of `p` are still to be watched for (every one once
    /// it exited; otherwise the kept ones).
    pub fn reclaim_process(
        &mut self,
        p: &ProcessIdentity,
        exited: bool,
        mut let_go: impl FnMut(&R) -> bool,
    ) -> (Vec<Released<R>>, usize) {
        let any = mutated!(self.mutations.reclaim_live_importers);
        let ids: Vec<u64> =
            self.by_process.get(&process_key(p)).map(|s| s.iter().copied().collect()).unwrap_or_default();
        let due: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| {
                let e = self.exports.get(id).expect("indexed");
                match e.state {
                    ExportState::Retained => any || (exited && let_go(&e.res)),
                    ExportState::Lingering => any || let_go(&e.res),
                    _ => false,
                }
            })
            .collect();
        let released = self.take_all(due);
        self.reclaimed += released.len() as u64;
        let left = self.by_process.get(&process_key(p)).map_or(0, |s| {
            s.iter().filter(|id| exited || self.exports.get(id).is_some_and(|e| e.state.kept())).count()
        });
        (released, left)
    }

    /// Ends every export (the table itself goes).
    pub fn drain(&mut self) -> Vec<Released<R>> {
        let ids = self.exports.walk().map(|(id, _)| *id).collect();
        self.take_all(ids)
    }
}

/// `exited`, asked at most once per process.
fn once_per_process(mut exited: impl FnMut(&ProcessIdentity) -> bool) -> impl FnMut(&ProcessIdentity) -> bool {
    let mut seen: HashMap<(u32, u64), bool> = HashMap::new();
    move |p| *seen.entry(process_key(p)).or_insert_with(|| exited(p))
}
