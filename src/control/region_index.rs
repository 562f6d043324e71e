//! A peer's published regions ordered by address: the region holding an
//! address in O(log n). Built once per Describe the peer sends (the TCP
//! connection publishes the two together, [`PublishedDescribe`]), read by
//! every submission.

use crate::control::message::{Describe, RegionInfo};
use crate::error::Result;
use crate::memory::rank::Ranks;
use crate::sync::snapshot::Snapshot;
use std::sync::Arc;

/// What a peer last published, as every submission reads it with no lock:
/// its Describe with the region index, or why its connection ended. The
/// peer's control connection replaces it whenever either changes; the
/// engine's entry for the peer holds the same cell, so planning a
/// submission reads it without entering the connection.
pub type PublishedDescribe = Snapshot<Result<RegionIndex>>;

/// A peer's published regions ordered by address: the region holding an
/// address in O(log n) (a KV pool publishes a hundred regions or more, and
/// a scattered submission looks one up per run of requests). Where the
/// table's regions overlap (a peer's table never should), the first in
/// the table's order, as a linear search gives.
pub struct RegionIndex {
    d: Arc<Describe>,
    /// Each region's start and position in the table, by start (searched
    /// without touching the regions themselves), and the buckets over the
    /// starts.
    sorted: Vec<(u64, u32)>,
    ranks: Ranks,
    disjoint: bool,
}

impl RegionIndex {
    /// The index of `d`'s regions (holding `d`).
    pub fn new(d: Arc<Describe>) -> RegionIndex {
        let mut sorted: Vec<(u64, u32)> = d.regions.iter().zip(0u32..).map(|(r, at)| (r.addr, at)).collect();
        sorted.sort_unstable_by_key(|&(start, _)| start);
        let end = |at: u32| d.regions[at as usize].addr.saturating_add(d.regions[at as usize].len);
        let disjoint = sorted.windows(2).all(|w| end(w[0].1) <= w[1].0);
        let ranks = Ranks::new(sorted.len(), |i| sorted[i].0);
        RegionIndex { d, sorted, ranks, disjoint }
    }

    /// The Describe indexed.
    pub fn describe(&self) -> &Arc<Describe> {
        &self.d
    }

    /// The region holding `addr`.
    #[cfg(test)]
    fn find(&self, addr: u64) -> Option<&RegionInfo> {
        self.find_slot(addr).map(|(r, _)| r)
    }

    /// The region holding `addr`, and its position in the table.
    pub fn find_slot(&self, addr: u64) -> Option<(&RegionInfo, u32)> {
        if !self.disjoint {
            return self.d.regions.iter().zip(0u32..).find(|(r, _)| r.contains(addr, 1));
        }
        let sorted = &self.sorted;
        let i = self.ranks.rank(sorted.len(), addr, |i| sorted[i].0).checked_sub(1)?;
        let at = sorted[i].1;
        Some((&self.d.regions[at as usize], at)).filter(|(r, _)| r.contains(addr, 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::identity::Identity;
    use crate::memory::{Access, MemoryKind};

    fn region(id: u64, addr: u64, len: u64) -> RegionInfo {
        RegionInfo { id, epoch: 1, addr, len, access: Access::READ_WRITE, kind: MemoryKind::SharedHost }
    }

    /// Guards `RegionIndex::find`: over a table in scrambled order, with
    /// gaps between regions and regions that touch, every address finds
    /// the region a linear search of the table finds (none in a gap or
    /// past the end); and over a table whose regions overlap, the first
    /// in the table's order.
    #[test]
    fn the_region_index_finds_what_a_linear_search_finds() {
        let linear = |d: &Describe, a: u64| d.regions.iter().find(|r| r.contains(a, 1)).map(|r| r.id);
        let mut d = Describe::bare(Identity::gone());
        // Regions of 100 bytes at 0, 100 (touching), 300, 1000 and 1150,
        // listed out of order.
        d.regions = vec![region(4, 1000, 100), region(1, 0, 100), region(5, 1150, 50), region(3, 300, 100)];
        d.regions.push(region(2, 100, 100));
        let index = RegionIndex::new(Arc::new(d.clone()));
        assert!(index.disjoint);
        let mut found = 0;
        for a in 0..1300 {
            assert_eq!(index.find(a).map(|r| r.id), linear(&d, a), "address {a}");
            found += index.find(a).is_some() as u32;
        }
        assert_eq!(found, 450);
        assert_eq!(index.find(u64::MAX), None);
        // Overlapping regions: the table's first, as before.
        d.regions = vec![region(7, 50, 100), region(6, 0, 100)];
        let index = RegionIndex::new(Arc::new(d));
        assert!(!index.disjoint);
        assert_eq!(index.find(60).map(|r| r.id), Some(7));
        assert_eq!(index.find(10).map(|r| r.id), Some(6));
    }
}
