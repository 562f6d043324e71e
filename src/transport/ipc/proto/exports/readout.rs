//! What the export table reads out, changing nothing: what an export holds
//! and where it stands, the exports left and kept, per-requester holdings
//! and bounds, and the walks counted over the whole table.

use super::*;

impl<R> ExportsCore<R> {
    /// What export `id` holds, and its OP bits.
    pub fn held(&self, id: u64) -> Option<(&R, u32)> {
        self.exports.get(&id).map(|e| (&e.res, e.grant.ops))
    }

    /// Where export `id` stands.
    pub fn state(&self, id: u64) -> Option<ExportState> {
        self.exports.get(&id).map(|e| e.state)
    }

    /// Every export: (id, channel, state, importing process).
    pub fn list(&self) -> Vec<(u64, u64, ExportState, Option<ProcessIdentity>)> {
        self.exports.walk().map(|(id, e)| (*id, e.grant.conn, e.state, e.grant.requester.map(|r| r.process))).collect()
    }

    /// No export left and no acknowledgement being sent.
    pub fn is_empty(&self) -> bool {
        self.exports.len() == 0 && self.acks_pending == 0
    }

    /// Exports left.
    pub fn len(&self) -> usize {
        self.exports.len()
    }

    /// (open, retained) exports: open ones on a live channel.
    pub fn counts(&self) -> (u64, u64) {
        let retained = self.retained as u64;
        (self.exports.len() as u64 - retained, retained)
    }

    /// Exposed exports released because their importer exited, so far.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed
    }

    /// Offers on channel `conn` not answered yet.
    pub fn unanswered(&self, conn: u64) -> usize {
        self.offers.get(&conn).map_or(0, |s| s.len())
    }

    /// (exports, bytes of allocations held alone) of requester `who`.
    pub fn holding(&self, who: Holder) -> (usize, u64) {
        self.holders.of(who)
    }

    /// The per-requester bounds.
    pub fn limits(&self) -> Limits {
        self.holders.limits()
    }

    /// Entries visited by walks over the whole table so far (an
    /// unregistration, the close, diagnostics): requests, ticks, lost
    /// channels and reclaims add nothing, whatever the table holds.
    pub fn walked(&self) -> u64 {
        self.exports.walked()
    }

    /// Kept exports (retained or lingering): (id, allocation base,
    /// importing pid).
    pub fn retained(&self) -> Vec<(u64, u64, Option<u32>)> {
        self.exports
            .walk()
            .filter(|(_, e)| e.state.kept())
            .map(|(id, e)| (*id, e.grant.base, e.grant.requester.map(|r| r.process.pid)))
            .collect()
    }
}
