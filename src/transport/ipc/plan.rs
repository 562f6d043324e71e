//! Subbatch planning: which copies may run as one unordered batch, and
//! whether a submission's requests may be regrouped.

use super::backend::{CopyOp, CopyPlan};
use crate::transfer::{Op, Request};

/// At most this many ascending runs are followed by [`Runs`]; more, and
/// the callers sort.
const MAX_RUNS: usize = 16;

/// Intervals seen in one pass as ascending runs: within a run each
/// interval starts at or after the end of the one before it. With a few
/// runs whose envelopes do not overlap, the intervals are pairwise
/// disjoint without a sort: the common shapes are one run (blocks in
/// address order) and a rotation (a ring of blocks that wrapped).
struct Runs {
    /// Finished runs' envelopes.
    done: Vec<(u64, u64)>,
    /// The current run's envelope.
    cur: Option<(u64, u64)>,
    /// More than [`MAX_RUNS`] runs: undecided.
    too_many: bool,
}

impl Runs {
    fn new() -> Runs {
        Runs { done: Vec::new(), cur: None, too_many: false }
    }

    fn push(&mut self, start: u64, end: u64) {
        match &mut self.cur {
            Some(c) if start >= c.1 => c.1 = end,
            _ => {
                if let Some(c) = self.cur.replace((start, end)) {
                    self.done.push(c);
                    self.too_many |= self.done.len() >= MAX_RUNS;
                }
            }
        }
    }

    /// True when the intervals are shown pairwise disjoint (false:
    /// undecided, or not disjoint).
    fn shown_disjoint(mut self) -> bool {
        if self.too_many {
            return false;
        }
        self.done.extend(self.cur);
        self.done.sort_unstable();
        self.done.windows(2).all(|w| w[0].1 <= w[1].0)
    }
}

/// Below this many intervals [`sort_by_start`] compares.
const RADIX_FROM: usize = 512;

/// Sorts intervals by start, stably: a least-significant-digit radix sort
/// over the bytes in which the starts differ (for a submission's blocks
/// over a few GB, three or four passes over the intervals, each a count
/// and a scatter, in place of the n log n comparisons of a sort, which
/// posting 120 000 requests spent 7 % of its time in); a comparison sort
/// for few intervals.
fn sort_by_start(v: &mut Vec<(u64, u64)>) {
    if v.len() < RADIX_FROM {
        v.sort_by_key(|&(start, _)| start);
        return;
    }
    let first = v[0].0;
    let differ = v.iter().fold(0u64, |d, &(start, _)| d | (start ^ first));
    let mut from = std::mem::take(v);
    let mut to: Vec<(u64, u64)> = vec![(0, 0); from.len()];
    for byte in (0..8).filter(|b| (differ >> (8 * b)) & 0xff != 0) {
        let digit = |start: u64| ((start >> (8 * byte)) & 0xff) as usize;
        let mut at = [0usize; 256];
        for &(start, _) in &from {
            at[digit(start)] += 1;
        }
        let mut sum = 0;
        for slot in at.iter_mut() {
            (*slot, sum) = (sum, sum + *slot);
        }
        for &x in &from {
            let d = digit(x.0);
            to[at[d]] = x;
            at[d] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *v = from;
}

/// Whether the requests are independent, so that they may run in any order
/// and be regrouped: no range a request writes (a READ's local range, a
/// WRITE's remote range) overlaps another request's range in the same
/// address space. Linear when every request goes one way and the written
/// ranges come as a few ascending runs (see [`Runs`]); otherwise
/// O(n log n): per space, intervals sorted by start, each checked against
/// the furthest end of those before it (of any request for a writing
/// interval, of writing ones for a reading interval).
pub fn independent<'a>(reqs: impl Iterator<Item = &'a Request> + Clone) -> bool {
    if let Some(first) = reqs.clone().next() {
        // One direction: only one space is written (a READ's local range,
        // a WRITE's remote one), and every range in it is written; the
        // other space holds no conflict. One pass follows the written
        // ranges as ascending runs; only when the runs do not decide, a
        // second keeps them joined where one continues the one before,
        // for the sort (the common shape allocates nothing per request).
        let written = |r: &Request| {
            let start = if first.op == Op::Read { r.local_addr } else { r.remote_addr };
            (start, start.saturating_add(r.len))
        };
        let mut runs = Runs::new();
        let one_way = reqs.clone().all(|r| {
            let (start, end) = written(r);
            runs.push(start, end);
            r.op == first.op
        });
        if one_way {
            if runs.shown_disjoint() {
                return true;
            }
            let mut joined: Vec<(u64, u64)> = Vec::new();
            for (start, end) in reqs.clone().map(written) {
                match joined.last_mut() {
                    Some(last) if last.1 == start => last.1 = end,
                    _ => joined.push((start, end)),
                }
            }
            sort_by_start(&mut joined);
            return joined.windows(2).all(|w| w[0].1 <= w[1].0);
        }
    }
    let space = |pick: &dyn Fn(&Request) -> (u64, bool)| -> bool {
        // A space nothing writes holds no conflict (reads may overlap).
        if !reqs.clone().any(|r| pick(r).1) {
            return true;
        }
        let mut v: Vec<(u64, u64, bool)> = Vec::new();
        for r in reqs.clone() {
            let (start, writes) = pick(r);
            let end = start.saturating_add(r.len);
            // A range that continues the one before it, both writing or
            // both not, joins it: the sort then sees runs, not requests.
            match v.last_mut() {
                Some(last) if last.1 == start && last.2 == writes => last.1 = end,
                _ => v.push((start, end, writes)),
            }
        }
        v.sort_unstable_by_key(|x| x.0);
        let (mut end_any, mut end_writes) = (0u64, 0u64);
        for (i, (start, end, writes)) in v.into_iter().enumerate() {
            if i > 0 && (start < end_writes || (writes && start < end_any)) {
                return false;
            }
            end_any = end_any.max(end);
            if writes {
                end_writes = end_writes.max(end);
            }
        }
        true
    };
    space(&|r| (r.local_addr, r.op == Op::Read)) && space(&|r| (r.remote_addr, r.op == Op::Write))
}

/// Decides whether `ops` are independent (no destination overlaps another
/// destination, no source overlaps a destination, its own included);
/// otherwise they must run in order. Linear when the destinations come as
/// a few ascending runs (see [`Runs`]: in address order, or a wrapped ring)
/// and the sources lie apart from every destination (a READ into a local
/// buffer from an import, the common shape); otherwise an O(n log n) sort
/// of the destination intervals.
pub fn classify(ops: &[CopyOp]) -> CopyPlan {
    match ops {
        [] => return CopyPlan::Independent,
        // One copy (a small batch's usual group): ordered only when its
        // source overlaps its own destination.
        [o] if o.src + o.len <= o.dst || o.dst + o.len <= o.src => return CopyPlan::Independent,
        [_] => return CopyPlan::Ordered,
        _ => {}
    }
    // The envelopes of the destinations and of the sources, and the
    // destinations' runs, in one pass.
    let (mut dst_lo, mut dst_hi, mut src_lo, mut src_hi) = (u64::MAX, 0u64, u64::MAX, 0u64);
    let mut runs = Runs::new();
    for o in ops {
        let (d_end, s_end) = (o.dst + o.len, o.src + o.len);
        (dst_lo, dst_hi) = (dst_lo.min(o.dst), dst_hi.max(d_end));
        (src_lo, src_hi) = (src_lo.min(o.src), src_hi.max(s_end));
        runs.push(o.dst, d_end);
    }
    let sources_apart = src_hi <= dst_lo || dst_hi <= src_lo;
    let one_run = runs.done.is_empty();
    let disjoint = runs.shown_disjoint();
    if disjoint && sources_apart {
        return CopyPlan::Independent;
    }
    // Destinations that continue the one before them join it (the union
    // overlaps what either overlaps): the sort then sees runs, not copies.
    let mut dst: Vec<(u64, u64)> = Vec::new();
    for o in ops {
        match dst.last_mut() {
            Some(last) if last.1 == o.dst => last.1 = o.dst + o.len,
            _ => dst.push((o.dst, o.dst + o.len)),
        }
    }
    if !one_run {
        dst.sort_unstable();
        if !disjoint && dst.windows(2).any(|w| w[1].0 < w[0].1) {
            return CopyPlan::Ordered;
        }
    }
    if sources_apart {
        return CopyPlan::Independent;
    }
    // Destinations are now disjoint and sorted: a source overlaps a
    // destination iff it overlaps the last destination starting before its end.
    for o in ops {
        let (s, e) = (o.src, o.src + o.len);
        let i = dst.partition_point(|d| d.0 < e);
        if i > 0 && dst[i - 1].1 > s {
            return CopyPlan::Ordered;
        }
    }
    CopyPlan::Independent
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `sort_by_start`: intervals in scrambled order, with equal
    /// starts, starts differing in the high and low bytes only, and a
    /// count on each side of the radix threshold, come out as a stable
    /// sort by start gives them.
    #[test]
    fn intervals_sort_by_start_as_a_stable_sort_does() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in [0, 1, 2, RADIX_FROM - 1, RADIX_FROM, 30_146] {
            for mask in [u64::MAX, 0xffff_0000_0000_00ff, 0x3fff_e000, 0x7] {
                let mut v: Vec<(u64, u64)> = (0..n as u64).map(|i| (0x7f00_0000_0000 + (next() & mask), i)).collect();
                let mut want = v.clone();
                want.sort_by_key(|&(start, _)| start);
                sort_by_start(&mut v);
                assert_eq!(v, want, "{n} intervals, mask {mask:#x}");
            }
        }
    }

    fn op(dst: u64, src: u64, len: u64) -> CopyOp {
        CopyOp { dst, src, len }
    }

    #[test]
    fn independent_and_dependent_sets() {
        assert_eq!(classify(&[]), CopyPlan::Independent);
        assert_eq!(classify(&[op(0, 100, 10)]), CopyPlan::Independent);
        // One copy: its source touching its destination, on either side,
        // or overlapping it (by a byte, on either side).
        assert_eq!(classify(&[op(0, 10, 10)]), CopyPlan::Independent);
        assert_eq!(classify(&[op(10, 0, 10)]), CopyPlan::Independent);
        assert_eq!(classify(&[op(0, 9, 10)]), CopyPlan::Ordered);
        assert_eq!(classify(&[op(9, 0, 10)]), CopyPlan::Ordered);
        assert_eq!(classify(&[op(0, 100, 10), op(10, 200, 10)]), CopyPlan::Independent);
        // Overlapping destinations.
        assert_eq!(classify(&[op(0, 100, 10), op(9, 200, 10)]), CopyPlan::Ordered);
        assert_eq!(classify(&[op(50, 100, 10), op(0, 200, 100)]), CopyPlan::Ordered);
        // A source reads what another copy writes.
        assert_eq!(classify(&[op(0, 100, 10), op(300, 5, 10)]), CopyPlan::Ordered);
        // Touching but not overlapping.
        assert_eq!(classify(&[op(0, 10, 10), op(20, 30, 5)]), CopyPlan::Independent);
    }

    fn req(op: Op, local_addr: u64, remote_addr: u64, len: u64) -> Request {
        Request { op, local_addr, remote_addr, len }
    }

    #[test]
    fn requests_are_independent_unless_a_written_range_overlaps_another() {
        use Op::{Read, Write};
        assert!(independent([].iter()));
        // Scattered READs of overlapping remote blocks into distinct local ones.
        assert!(independent([req(Read, 0, 100, 10), req(Read, 10, 105, 10)].iter()));
        // Two READs into overlapping local memory.
        assert!(!independent([req(Read, 0, 100, 10), req(Read, 5, 300, 10)].iter()));
        // A WRITE sending what a READ brings in.
        assert!(!independent([req(Read, 0, 100, 10), req(Write, 5, 300, 10)].iter()));
        // A READ of remote bytes a WRITE changes.
        assert!(!independent([req(Write, 0, 100, 10), req(Read, 50, 105, 10)].iter()));
        // Two WRITEs from one local buffer to distinct remote places.
        assert!(independent([req(Write, 0, 100, 10), req(Write, 0, 200, 10)].iter()));
        // Touching, not overlapping.
        assert!(independent([req(Read, 0, 100, 10), req(Read, 10, 110, 10)].iter()));
    }

    #[test]
    fn request_independence_agrees_with_the_quadratic_definition() {
        let mut x: u64 = 99;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..3000 {
            let n = 1 + rnd(6) as usize;
            let mut reqs: Vec<Request> = Vec::new();
            for _ in 0..n {
                let op = if rnd(2) == 0 { Op::Read } else { Op::Write };
                let mut r = req(op, rnd(100), rnd(100), 1 + rnd(20));
                // Often a continuation of the one before, on either side or
                // both: ranges the check joins before it sorts.
                if let Some(p) = reqs.last().filter(|_| rnd(2) == 0) {
                    let (local, remote) = (rnd(2) == 0, rnd(2) == 0);
                    r.local_addr = if local { p.local_addr + p.len } else { r.local_addr };
                    r.remote_addr = if remote || !local { p.remote_addr + p.len } else { r.remote_addr };
                }
                reqs.push(r);
            }
            let ov = |a: u64, b: u64, l1: u64, l2: u64| a < b + l2 && b < a + l1;
            let mut dep = false;
            for i in 0..n {
                for j in 0..n {
                    let (p, q) = (reqs[i], reqs[j]);
                    if i == j {
                        continue;
                    }
                    let local = ov(p.local_addr, q.local_addr, p.len, q.len) && p.op == Op::Read;
                    let remote = ov(p.remote_addr, q.remote_addr, p.len, q.len) && p.op == Op::Write;
                    dep |= local || remote;
                }
            }
            assert_eq!(independent(reqs.iter()), !dep, "{reqs:?}");
            // Independent requests make independent copies once the remote
            // side lies in a mapping of its own (an import), apart from
            // every local address: what lets a group of a submission shown
            // independent skip `classify` (`GroupLocal::independent`).
            if !dep {
                let mapped = 1 << 20;
                let ops: Vec<CopyOp> = reqs
                    .iter()
                    .map(|r| match r.op {
                        Op::Read => op(r.local_addr, mapped + r.remote_addr, r.len),
                        Op::Write => op(mapped + r.remote_addr, r.local_addr, r.len),
                    })
                    .collect();
                assert_eq!(classify(&ops), CopyPlan::Independent, "{reqs:?}");
            }
            // One direction, written ranges in order and wrapped: the
            // linear path.
            let mut one_way: Vec<Request> = reqs.iter().map(|r| Request { op: reqs[0].op, ..*r }).collect();
            one_way.sort_by_key(|r| if r.op == Op::Read { r.local_addr } else { r.remote_addr });
            one_way.rotate_left(rnd(n as u64) as usize);
            let written = |r: &Request| if r.op == Op::Read { (r.local_addr, r.len) } else { (r.remote_addr, r.len) };
            let overlapping = (0..n).any(|i| {
                (0..n).any(|j| {
                    let ((a, l1), (b, l2)) = (written(&one_way[i]), written(&one_way[j]));
                    i != j && ov(a, b, l1, l2)
                })
            });
            assert_eq!(independent(one_way.iter()), !overlapping, "{one_way:?}");
        }
    }

    #[test]
    fn runs_decide_disjointness_of_sorted_and_wrapped_intervals() {
        let shown = |ivs: &[(u64, u64)]| {
            let mut r = Runs::new();
            for &(s, e) in ivs {
                r.push(s, e);
            }
            r.shown_disjoint()
        };
        // In order; wrapped; wrapped onto itself (overlap).
        assert!(shown(&[(0, 10), (10, 20), (30, 40)]));
        assert!(shown(&[(30, 40), (50, 60), (0, 10), (10, 20)]));
        assert!(!shown(&[(30, 40), (50, 60), (0, 10), (35, 45)]));
        // More runs than followed: undecided.
        let many: Vec<(u64, u64)> = (0..2 * MAX_RUNS as u64).rev().map(|i| (i * 10, i * 10 + 5)).collect();
        assert!(!shown(&many));
    }

    #[test]
    fn agrees_with_the_quadratic_definition() {
        let mut x: u64 = 12345;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let quadratic = |ops: &[CopyOp]| {
            let ov = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
            let n = ops.len();
            let mut dep = false;
            for i in 0..n {
                for j in 0..n {
                    let di = (ops[i].dst, ops[i].dst + ops[i].len);
                    let dj = (ops[j].dst, ops[j].dst + ops[j].len);
                    let sj = (ops[j].src, ops[j].src + ops[j].len);
                    if (i != j && ov(di, dj)) || ov(di, sj) {
                        dep = true;
                    }
                }
            }
            if dep {
                CopyPlan::Ordered
            } else {
                CopyPlan::Independent
            }
        };
        let mut linear = 0;
        for _ in 0..2000 {
            let n = 1 + rnd(6) as usize;
            let mut ops: Vec<CopyOp> = Vec::new();
            for _ in 0..n {
                let mut o = op(rnd(200), rnd(200), 1 + rnd(20));
                // Often a destination that continues the one before: joined
                // before the sort.
                if let Some(p) = ops.last().filter(|_| rnd(2) == 0) {
                    o.dst = p.dst + p.len;
                }
                ops.push(o);
            }
            assert_eq!(classify(&ops), quadratic(&ops), "{ops:?}");
            // The linear paths: destinations in order, then sources moved
            // apart from them (or not quite: by less than their span).
            ops.sort_by_key(|o| o.dst);
            assert_eq!(classify(&ops), quadratic(&ops), "{ops:?}");
            let shift = 150 + rnd(100);
            let mut apart: Vec<CopyOp> = ops.iter().map(|o| op(o.dst, o.src + shift, o.len)).collect();
            linear += (quadratic(&apart) == CopyPlan::Independent) as u32;
            assert_eq!(classify(&apart), quadratic(&apart), "{apart:?}");
            // A wrapped ring: two ascending runs.
            apart.rotate_left(rnd(n as u64) as usize);
            assert_eq!(classify(&apart), quadratic(&apart), "{apart:?}");
            ops.rotate_left(rnd(n as u64) as usize);
            assert_eq!(classify(&ops), quadratic(&ops), "{ops:?}");
        }
        assert!(linear > 100, "the linear path was exercised {linear} times");
    }
}
