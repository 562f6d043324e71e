//! The groups of an IPC part: requests naming one remote region whose
//! local memory one GPU copies, gathered (independent requests) or kept in
//! runs (dependent ones), and a large independent group's windows.

use super::messages::op_bit;
use super::plan::independent;
use crate::control::message::RegionInfo;
use crate::kinds::TransportKind;
use crate::memory::MemoryKind;
use crate::transfer::Request;
use crate::transport::ipc::backends::cpu_copy;
use crate::transport::planned::{self, Item};
use std::collections::VecDeque;
use std::ops::Range;

/// An IPC part grouped: its items in group order (each group a range of
/// them, so that no group copies its requests), the groups in the order
/// they run, and whether they may end in any order.
pub struct Grouped<'a> {
    /// The part's items, each group's together, in order.
    pub items: Vec<Item<'a>>,
    /// The groups, as ranges of `items`.
    pub groups: VecDeque<Group<'a>>,
    /// The groups may end in any order (several groups of independent
    /// requests).
    pub any_order: bool,
}

impl Grouped<'_> {
    /// Gives the items' vector back to be kept for the next submission.
    pub fn give_back(self) {
        planned::give_back(self.items);
    }
}

/// Subbatches of an IPC submission, in linear time: requests naming one
/// remote region whose local memory one GPU copies. An import maps the
/// whole remote allocation, so how far apart the blocks lie is no reason to
/// split. When the submission's requests are independent (no local or
/// remote range that one writes overlaps another's), every request of a
/// (region, GPU) joins one group, groups in order of first appearance;
/// otherwise groups are consecutive runs, so that dependent requests keep
/// their input order. Also says whether the groups may end in any order
/// (several groups of independent requests). Every request of `live`
/// names a region. One (region, GPU) for all (the common case) and runs
/// keep `live` as it is; only gathered groups reorder it (once, each item
/// moved to its final place).
pub fn group(live: Vec<Item<'_>>) -> Grouped<'_> {
    let key = |c: &Item<'_>| (c.slot, c.lease.region().device);
    let pinned = |c: &Item<'_>| c.lease.region().kind == MemoryKind::PinnedHost;
    let mut groups = VecDeque::new();
    let Some(first) = live.first() else {
        return Grouped { items: live, groups, any_order: false };
    };
    // One (region, GPU) for all, the common case: one group either way.
    let (k0, mut any_pinned) = (key(first), false);
    if live.iter().all(|c| {
        any_pinned |= pinned(c);
        key(c) == k0
    }) {
        groups.push_back(Group::of(first, 0..live.len(), any_pinned));
        return Grouped { items: live, groups, any_order: false };
    }
    if independent(live.iter().map(|c| &c.req)) {
        return gather(live);
    }
    for (at, c) in live.iter().enumerate() {
        match groups.back_mut() {
            Some(g) if (g.slot, g.device) == key(c) => {
                g.to = at + 1;
                g.pinned |= pinned(c);
            }
            _ => groups.push_back(Group::of(c, at..at + 1, pinned(c))),
        }
    }
    Grouped { items: live, groups, any_order: false }
}

/// The groups of independent requests over several (region, GPU) keys:
/// one per key, in order of first appearance, each holding its requests
/// in input order.
fn gather(live: Vec<Item<'_>>) -> Grouped<'_> {
    let key = |c: &Item<'_>| (c.slot, c.lease.region().device);
    // The group of each region slot on the first request's GPU (the
    // common case: a dense table, no hashing), and of any other key.
    let device = live[0].lease.region().device;
    let mut by_slot: Vec<u32> = Vec::new();
    let mut others: std::collections::HashMap<(u32, Option<i32>), u32> = std::collections::HashMap::new();
    // Neighbours mostly share their group: looked up once per run.
    let mut last: Option<((u32, Option<i32>), u32)> = None;
    // Each request's group, and each group's size and first request.
    let mut sizes: Vec<(usize, u32)> = Vec::new();
    let add = |sizes: &mut Vec<(usize, u32)>, first: u32| {
        sizes.push((0, first));
        (sizes.len() - 1) as u32
    };
    let of: Vec<u32> = live
        .iter()
        .zip(0u32..)
        .map(|(c, i)| {
            let k = key(c);
            let at = match last {
                Some((lk, at)) if lk == k => at,
                // Slots are positions in the peer's table: the vector
                // grows to the table's length at most.
                _ if k.1 == device && c.slot != u32::MAX => {
                    let s = c.slot as usize;
                    if s >= by_slot.len() {
                        by_slot.resize(s + 1, u32::MAX);
                    }
                    if by_slot[s] == u32::MAX {
                        by_slot[s] = add(&mut sizes, i);
                    }
                    by_slot[s]
                }
                _ => *others.entry(k).or_insert_with(|| add(&mut sizes, i)),
            };
            last = Some((k, at));
            sizes[at as usize].0 += 1;
            at
        })
        .collect();
    // Each group's range, then each item moved to the next place of its
    // group's range.
    let mut groups: VecDeque<Group<'_>> = VecDeque::with_capacity(sizes.len());
    let mut next: Vec<usize> = Vec::with_capacity(sizes.len());
    for &(n, first) in &sizes {
        let from = groups.back().map_or(0, |g: &Group<'_>| g.to);
        next.push(from);
        groups.push_back(Group::of(&live[first as usize], from..from + n, false));
    }
    let mut items = planned::take_items(live.len());
    items.resize(live.len(), live[0]);
    for (c, at) in live.iter().zip(of) {
        let g = &mut groups[at as usize];
        g.pinned |= c.lease.region().kind == MemoryKind::PinnedHost;
        items[next[at as usize]] = *c;
        next[at as usize] += 1;
    }
    planned::give_back(live);
    Grouped { items, groups, any_order: true }
}

/// One subbatch to run: its requests (a range of the part's items), the
/// remote region they name and the GPU of their local memory (None:
/// host), whether any local memory is library-pinned host memory, whether
/// it is the single-request retry of a rejected group, and, for a window of
/// a larger independent group (completing in any order), the operations of
/// that whole group.
#[derive(Clone, Copy)]
pub struct Group<'a> {
    /// Its first item's position in the part's items.
    pub from: usize,
    /// The position after its last item.
    pub to: usize,
    pub region: &'a RegionInfo,
    pub slot: u32,
    pub device: Option<i32>,
    pub pinned: bool,
    pub retried: bool,
    pub window: Option<u32>,
}

impl<'a> Group<'a> {
    /// The group of the items at `range`, of `first`'s region and GPU.
    pub fn of(first: &Item<'a>, range: Range<usize>, pinned: bool) -> Group<'a> {
        Group {
            from: range.start,
            to: range.end,
            region: first.region.expect("a grouped request names a region"),
            slot: first.slot,
            device: first.lease.region().device,
            pinned,
            retried: false,
            window: None,
        }
    }

    /// Its positions in the part's items.
    pub fn range(&self) -> Range<usize> {
        self.from..self.to
    }

    /// The same group over the items at `range`.
    pub fn over(&self, range: Range<usize>) -> Group<'a> {
        Group { from: range.start, to: range.end, ..*self }
    }

    /// Its number of requests.
    pub fn len(&self) -> usize {
        self.to - self.from
    }

    /// Whether it holds no request.
    pub fn is_empty(&self) -> bool {
        self.to == self.from
    }
}

/// A large independent group moves in windows of at least this many
/// requests (for SHM also at least [`cpu_copy::ASYNC_MIN_BYTES`]): the
/// copy pool (SHM) or a stream of the pool (NVLink, MNNVL: one native
/// batch per window) starts on the first window while the caller builds
/// the next, so posting hides behind the copies, and each window's
/// bookkeeping stays in a core's cache (about 250 bytes per request over
/// its passes: 1 MB here) instead of going to memory between passes over
/// the whole group.
pub const WINDOW_REQUESTS: usize = 4096;

/// The most requests a window holds before it closes whatever its bytes:
/// a group of tiny requests (never [`cpu_copy::ASYNC_MIN_BYTES`]) still
/// moves in windows whose bookkeeping stays in cache, each one as a
/// submission of this many requests would (copied by the caller when too
/// small for the pool), so posting time stays linear in the count.
pub const WINDOW_MAX_REQUESTS: usize = 2 * WINDOW_REQUESTS;

/// Cuts an independent group into windows (see [`WINDOW_REQUESTS`] and
/// [`WINDOW_MAX_REQUESTS`]); a group too small for two windows stays
/// whole. The windows keep the group's order: each is a range of it (of
/// positions in `reqs`), found in one pass, with nothing copied; the same
/// pass gathers the group's operations (each window carries them).
pub fn windows<'r>(kind: TransportKind, reqs: impl ExactSizeIterator<Item = &'r Request>) -> (Vec<Range<usize>>, u32) {
    // A CPU copy needs enough bytes to be worth handing to the pool; a
    // native batch is worth posting from its count of copies alone.
    let cpu = matches!(kind, TransportKind::Shm | TransportKind::Cma);
    let min_bytes = if cpu { cpu_copy::ASYNC_MIN_BYTES } else { 0 };
    let n = reqs.len();
    let mut out = Vec::new();
    let (mut start, mut bytes, mut ops) = (0usize, 0u64, 0u32);
    for (at, r) in reqs.enumerate() {
        bytes += r.len;
        ops |= op_bit(r.op);
        let (len, rest) = (at + 1 - start, n - at - 1);
        // A window closes once it is large enough, unless what is left
        // would make too small a last one.
        let full = len >= WINDOW_REQUESTS && (bytes >= min_bytes || len >= WINDOW_MAX_REQUESTS);
        if full && rest >= WINDOW_REQUESTS {
            out.push(start..at + 1);
            start = at + 1;
            bytes = 0;
        }
    }
    out.push(start..n);
    (out, ops)
}

/// Whether the last group of an IPC submission moves in windows (see
/// [`windows`]): any IPC transport with a relocation cache, so that the
/// windows share one cached import (without a cache each would open its
/// own, each charged for the whole allocation); large enough for two
/// windows; no library pinned local memory (fenced per subbatch: a second
/// window would wait for the first's fence); independent requests
/// (`known_independent`: the whole submission was shown so already).
/// `items` are the group's.
pub fn windowed(kind: TransportKind, caches: bool, g: &Group<'_>, items: &[Item<'_>], known_independent: bool) -> bool {
    matches!(kind, TransportKind::Shm | TransportKind::Cma | TransportKind::Nvlink | TransportKind::Mnnvl)
        && caches
        && g.len() >= 2 * WINDOW_REQUESTS
        && !g.pinned
        && (known_independent || independent(items.iter().map(|c| &c.req)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::identity::Identity;
    use crate::control::message::Describe;
    use crate::memory::Access;
    use std::sync::Arc;

    fn region(id: u64, addr: u64, len: u64) -> RegionInfo {
        RegionInfo { id, epoch: 1, addr, len, access: Access::READ_WRITE, kind: MemoryKind::SharedHost }
    }

    /// Guards `group`: independent requests over three remote regions,
    /// interleaved, make one group per region in order of first appearance,
    /// each holding its requests in input order (a region's slot found
    /// again however far apart its requests lie); once two READs land on
    /// the same local bytes the requests are dependent, and the groups are
    /// the consecutive runs in input order.
    #[test]
    fn group_gathers_each_region_or_keeps_runs_in_order() {
        use crate::memory::region::RegionTable;
        use crate::transfer::Op;
        let table = RegionTable::default();
        table.register(0x10_0000, 0x10_0000, Access::READ_WRITE).unwrap();
        let lease = Arc::new(table.lease(0x10_0000, 0x1000).unwrap());
        let mut d = Describe::bare(Identity::gone());
        d.regions =
            vec![region(11, 0x100_0000, 0x1_0000), region(12, 0x200_0000, 0x1_0000), region(13, 0x300_0000, 0x1_0000)];
        // (remote region position, local block): requests 0..6.
        let shape = |blocks: &[(usize, u64)]| -> Vec<Item<'_>> {
            blocks
                .iter()
                .zip(0u32..)
                .map(|(&(at, block), i)| {
                    let remote_addr = d.regions[at].addr + 0x100 * i as u64;
                    let (region, slot) = (&d.regions[at], at as u32);
                    let req = Request { op: Op::Read, local_addr: 0x10_0000 + block * 0x100, remote_addr, len: 0x100 };
                    Item { index: i, slot, req, lease: &lease, region: Some(region) }
                })
                .collect()
        };
        let summary = |g: &Grouped<'_>| -> Vec<(u64, Vec<usize>)> {
            g.groups.iter().map(|r| (r.region.id, g.items[r.range()].iter().map(Item::at).collect())).collect()
        };
        let g = group(shape(&[(1, 0), (0, 1), (1, 2), (2, 3), (0, 4), (1, 5)]));
        assert!(g.any_order);
        assert_eq!(summary(&g), vec![(12, vec![0, 2, 5]), (11, vec![1, 4]), (13, vec![3])]);
        assert!(g.groups.iter().all(|g| !g.pinned && g.device.is_none()));
        // Requests 2 and 4 read into the same local block: dependent; the
        // runs are ranges of the items as they came (not copied).
        let live = shape(&[(1, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 5)]);
        let at = live.as_ptr();
        let g = group(live);
        assert!(!g.any_order);
        assert_eq!(summary(&g), vec![(12, vec![0]), (11, vec![1]), (12, vec![2, 3]), (11, vec![4, 5])]);
        assert_eq!(g.items.as_ptr(), at, "the runs' items were copied");
        // One region for all: one group, in order, over the items as they
        // came.
        let live = shape(&[(2, 0), (2, 1), (2, 2)]);
        let at = live.as_ptr();
        let g = group(live);
        assert!(!g.any_order);
        assert_eq!(summary(&g), vec![(13, vec![0, 1, 2])]);
        assert_eq!(g.items.as_ptr(), at, "the one group's items were copied");
    }

    /// Guards `windows`: tiny requests (never 8 MiB) close a window at
    /// [`WINDOW_MAX_REQUESTS`], large ones at [`WINDOW_REQUESTS`] once
    /// 8 MiB; a remainder too small for a window joins the last one; the
    /// windows are consecutive ranges covering the group in order.
    #[test]
    fn windows_cut_tiny_requests_by_count_and_large_ones_by_bytes() {
        use crate::transfer::Op;
        let of = |n: usize, len: u64| -> Vec<Request> {
            (0..n).map(|_| Request { op: Op::Read, local_addr: 0, remote_addr: 0, len }).collect()
        };
        let cut = |kind: TransportKind, reqs: Vec<Request>| -> Vec<usize> {
            let (w, ops) = windows(kind, reqs.iter());
            assert_eq!(ops, op_bit(Op::Read));
            let starts: Vec<usize> = w.iter().map(|r| r.start).collect();
            let ends: Vec<usize> = [&[0][..], &w.iter().map(|r| r.end).collect::<Vec<_>>()].concat();
            assert_eq!((starts, w.last().map(|r| r.end)), (ends[..w.len()].to_vec(), Some(reqs.len())), "{w:?}");
            w.iter().map(ExactSizeIterator::len).collect()
        };
        assert_eq!(cut(TransportKind::Shm, of(100_000, 64)), [vec![8192; 11], vec![100_000 - 11 * 8192]].concat());
        // 4 KiB requests reach 8 MiB at 2048: windows of 4096.
        assert_eq!(cut(TransportKind::Shm, of(10_000, 4096)), vec![4096, 5904]);
        // Too small for two windows: whole.
        assert_eq!(cut(TransportKind::Shm, of(8192, 64)), vec![8192]);
        assert_eq!(cut(TransportKind::Nvlink, of(8192, 64)), vec![4096, 4096]);
        // The windows carry the operations of the whole group.
        let mut mixed = of(3, 64);
        mixed[1].op = Op::Write;
        assert_eq!(windows(TransportKind::Shm, mixed.iter()).1, op_bit(Op::Read) | op_bit(Op::Write));
    }
}
