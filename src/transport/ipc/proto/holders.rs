//! Who holds an export table's exports, and how much: each requester's
//! count of exports, and the bytes of the allocations that it alone keeps
//! exported (their charges stay on the mapping budget because of it and of
//! nobody else). Both are bounded per requester, so that one requester can
//! neither grow the table without end nor take the whole budget from the
//! others. Every update and check is O(1).
//!
//! A requester is its importing process when the kernel verified it (a
//! Unix channel: it stays the same requester over its later channels and
//! after they are lost), or else the channel it asked on.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// Whom an export counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holder {
    /// A kernel-verified importing process (pid, start time).
    Process(u32, u64),
    /// A channel whose requester the kernel could not verify.
    Channel(u64),
}

/// The per-requester bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Exports one requester holds at once, in any state.
    pub exports: usize,
    /// Bytes of allocations one requester alone may keep exported, once it
    /// holds one such allocation already (a first one, whatever its size,
    /// is always allowed: an allocation larger than the share still goes
    /// to a requester that holds nothing else alone).
    pub sole_bytes: u64,
}

impl Limits {
    /// No bound (tests and the simulator).
    pub const NONE: Limits = Limits { exports: usize::MAX, sole_bytes: u64::MAX };
}

#[derive(Default)]
struct Holding {
    exports: usize,
    /// Bytes of the allocations only this requester holds exports of.
    sole: u64,
}

struct Alloc {
    physical: u64,
    /// Exports of it, by requester.
    by: HashMap<Holder, usize>,
}

/// Every requester's holdings of one table.
pub struct Holders {
    limits: Limits,
    held: HashMap<Holder, Holding>,
    /// Allocations (by base) with at least one export.
    allocs: HashMap<u64, Alloc>,
}

impl Holders {
    /// No holdings yet, bounded by `limits`.
    pub fn new(limits: Limits) -> Holders {
        Holders { limits, held: HashMap::new(), allocs: HashMap::new() }
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether `who` may take one more export, of the allocation at `base`
    /// (`physical` bytes): refused `RESOURCE_EXHAUSTED`, naming the bound,
    /// when it holds its count already, or when the allocation is exported
    /// to nobody yet and would take `who`'s bytes held alone past its share.
    pub fn admit(&self, who: Holder, base: u64, physical: u64) -> Result<()> {
        let (exports, sole) = self.held.get(&who).map_or((0, 0), |h| (h.exports, h.sole));
        if exports >= self.limits.exports {
            return Err(Error::ResourceExhausted(format!(
                "this requester holds {exports} exports of this engine already (ipc_max_exports_per_requester = {}); \
                 close some before asking for more",
                self.limits.exports
            )));
        }
        let adds = if self.allocs.contains_key(&base) { 0 } else { physical };
        if adds > 0 && sole > 0 && sole.saturating_add(adds) > self.limits.sole_bytes {
            return Err(Error::ResourceExhausted(format!(
                "this requester alone keeps {sole} bytes of allocations exported; another {adds} would pass its \
                 share of the mapping budget ({} bytes: ipc_requester_budget_percent of max_inflight_bytes on the \
                 source); close imports it no longer uses",
                self.limits.sole_bytes
            )));
        }
        Ok(())
    }

    /// `who` holds one more export, of the allocation at `base`.
    pub fn add(&mut self, who: Holder, base: u64, physical: u64) {
        let a = self.allocs.entry(base).or_insert_with(|| Alloc { physical, by: HashMap::new() });
        let before = a.by.len();
        let n = a.by.entry(who).or_insert(0);
        *n += 1;
        if *n == 1 {
            // A new holder of the allocation: its first holder alone, or
            // the one that held it alone holds it alone no more.
            match before {
                0 => self.held.entry(who).or_default().sole += a.physical,
                1 => {
                    let other = *a.by.keys().find(|h| **h != who).expect("the one other holder");
                    self.held.get_mut(&other).expect("a holder").sole -= a.physical;
                }
                _ => {}
            }
        }
        self.held.entry(who).or_default().exports += 1;
    }

    /// An export of `who`, of the allocation at `base`, ended.
    pub fn remove(&mut self, who: Holder, base: u64) {
        let Some(a) = self.allocs.get_mut(&base) else { return };
        let Some(n) = a.by.get_mut(&who) else { return };
        *n -= 1;
        if *n == 0 {
            a.by.remove(&who);
            let physical = a.physical;
            match a.by.len() {
                0 => {
                    self.allocs.remove(&base);
                    self.held.get_mut(&who).expect("a holder").sole -= physical;
                }
                1 => {
                    let other = *a.by.keys().next().expect("the one other holder");
                    self.held.get_mut(&other).expect("a holder").sole += physical;
                }
                _ => {}
            }
        }
        let h = self.held.get_mut(&who).expect("a holder");
        h.exports -= 1;
        if h.exports == 0 {
            self.held.remove(&who);
        }
    }

    /// (exports, bytes held alone) of `who`.
    pub fn of(&self, who: Holder) -> (usize, u64) {
        self.held.get(&who).map_or((0, 0), |h| (h.exports, h.sole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    const A: u64 = 0x1000;
    const B: u64 = 0x2000;
    const C: u64 = 0x3000;
    const P: Holder = Holder::Process(7, 1);
    const Q: Holder = Holder::Process(8, 1);

    #[test]
    fn the_count_bound_refuses_the_next_export_and_names_its_key() {
        let mut h = Holders::new(Limits { exports: 2, sole_bytes: u64::MAX });
        for _ in 0..2 {
            h.admit(P, A, 10).unwrap();
            h.add(P, A, 10);
        }
        let e = h.admit(P, A, 10).unwrap_err();
        assert_eq!(e.status(), Status::ResourceExhausted);
        assert!(e.message().contains("ipc_max_exports_per_requester = 2"), "{e}");
        // Another requester is not bounded by P's count.
        h.admit(Q, A, 10).unwrap();
        h.remove(P, A);
        h.admit(P, A, 10).unwrap();
    }

    #[test]
    fn bytes_held_alone_are_bounded_beyond_a_first_allocation() {
        let mut h = Holders::new(Limits { exports: 100, sole_bytes: 100 });
        // A first allocation larger than the share is allowed.
        h.admit(P, A, 150).unwrap();
        h.add(P, A, 150);
        // More exports of it cost nothing more.
        h.admit(P, A, 150).unwrap();
        // A second allocation held alone would pass the share.
        let e = h.admit(P, B, 10).unwrap_err();
        assert_eq!(e.status(), Status::ResourceExhausted);
        assert!(e.message().contains("ipc_requester_budget_percent"), "{e}");
        // Q takes B; then P may share it (it adds nothing held alone).
        h.admit(Q, B, 10).unwrap();
        h.add(Q, B, 10);
        h.admit(P, B, 10).unwrap();
        h.add(P, B, 10);
        assert_eq!((h.of(P), h.of(Q)), ((2, 150), (1, 0)));
        // Q lets go: P holds B alone now.
        h.remove(Q, B);
        assert_eq!((h.of(P), h.of(Q)), ((2, 160), (0, 0)));
        h.remove(P, B);
        h.remove(P, A);
        assert_eq!(h.of(P), (0, 0));
        assert!(h.allocs.is_empty() && h.held.is_empty());
        // Within the share, a second allocation is allowed: exactly the
        // share (40 + 60 = 100) is, one byte past it (40 + 61) is not.
        h.add(P, A, 40);
        h.admit(P, C, 60).unwrap();
        let e = h.admit(P, C, 61).unwrap_err();
        assert_eq!(e.status(), Status::ResourceExhausted);
        assert!(e.message().contains("keeps 40 bytes of allocations exported; another 61"), "{e}");
    }
}
