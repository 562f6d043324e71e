//! Subbatch planning: which copies may run as one unordered batch, and
//! whether a submission's requests may be regrouped.

use super::backend::{CopyOp, CopyPlan};
use crate::transfer::{Op, Request};

/// Whether the requests are independent, so that they may run in any order
/// and be regrouped: no range a request writes (a READ's local range, a
/// WRITE's remote range) overlaps another request's range in the same
/// address space. O(n log n): per space, intervals sorted by start, each
/// checked against the furthest end of those before it (of any request for
/// a writing interval, of writing ones for a reading interval).
pub fn independent(reqs: &[Request]) -> bool {
    let space = |pick: &dyn Fn(&Request) -> (u64, bool)| -> bool {
        let mut v: Vec<(u64, u64, bool)> = reqs
            .iter()
            .map(|r| {
                let (start, writes) = pick(r);
                (start, start.saturating_add(r.len), writes)
            })
            .collect();
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
/// otherwise they must run in order. Linear when the destinations come in
/// address order and the sources lie apart from every destination (a READ
/// into a local buffer from an import, the common shape); otherwise an
/// O(n log n) sort of the destination intervals.
pub fn classify(ops: &[CopyOp]) -> CopyPlan {
    if ops.is_empty() {
        return CopyPlan::Independent;
    }
    // The envelopes of the destinations and of the sources, and whether
    // the destinations come sorted and apart, in one pass.
    let (mut dst_lo, mut dst_hi, mut src_lo, mut src_hi) = (u64::MAX, 0u64, u64::MAX, 0u64);
    let mut sorted_apart = true;
    let mut prev_end: Option<u64> = None;
    for o in ops {
        let (d_end, s_end) = (o.dst + o.len, o.src + o.len);
        (dst_lo, dst_hi) = (dst_lo.min(o.dst), dst_hi.max(d_end));
        (src_lo, src_hi) = (src_lo.min(o.src), src_hi.max(s_end));
        sorted_apart &= prev_end.is_none_or(|e| o.dst >= e);
        prev_end = Some(d_end);
    }
    let sources_apart = src_hi <= dst_lo || dst_hi <= src_lo;
    if sorted_apart && sources_apart {
        return CopyPlan::Independent;
    }
    let mut dst: Vec<(u64, u64)> = ops.iter().map(|o| (o.dst, o.dst + o.len)).collect();
    if !sorted_apart {
        dst.sort_unstable();
        if dst.windows(2).any(|w| w[1].0 < w[0].1) {
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

    fn op(dst: u64, src: u64, len: u64) -> CopyOp {
        CopyOp { dst, src, len }
    }

    #[test]
    fn independent_and_dependent_sets() {
        assert_eq!(classify(&[]), CopyPlan::Independent);
        assert_eq!(classify(&[op(0, 100, 10)]), CopyPlan::Independent);
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
        assert!(independent(&[]));
        // Scattered READs of overlapping remote blocks into distinct local ones.
        assert!(independent(&[req(Read, 0, 100, 10), req(Read, 10, 105, 10)]));
        // Two READs into overlapping local memory.
        assert!(!independent(&[req(Read, 0, 100, 10), req(Read, 5, 300, 10)]));
        // A WRITE sending what a READ brings in.
        assert!(!independent(&[req(Read, 0, 100, 10), req(Write, 5, 300, 10)]));
        // A READ of remote bytes a WRITE changes.
        assert!(!independent(&[req(Write, 0, 100, 10), req(Read, 50, 105, 10)]));
        // Two WRITEs from one local buffer to distinct remote places.
        assert!(independent(&[req(Write, 0, 100, 10), req(Write, 0, 200, 10)]));
        // Touching, not overlapping.
        assert!(independent(&[req(Read, 0, 100, 10), req(Read, 10, 110, 10)]));
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
            let reqs: Vec<Request> = (0..n)
                .map(|_| {
                    let op = if rnd(2) == 0 { Op::Read } else { Op::Write };
                    req(op, rnd(100), rnd(100), 1 + rnd(20))
                })
                .collect();
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
            assert_eq!(independent(&reqs), !dep, "{reqs:?}");
        }
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
            let mut ops: Vec<CopyOp> = (0..n).map(|_| op(rnd(200), rnd(200), 1 + rnd(20))).collect();
            assert_eq!(classify(&ops), quadratic(&ops), "{ops:?}");
            // The linear paths: destinations in order, then sources moved
            // apart from them (or not quite: by less than their span).
            ops.sort_by_key(|o| o.dst);
            assert_eq!(classify(&ops), quadratic(&ops), "{ops:?}");
            let shift = 150 + rnd(100);
            let apart: Vec<CopyOp> = ops.iter().map(|o| op(o.dst, o.src + shift, o.len)).collect();
            linear += (quadratic(&apart) == CopyPlan::Independent) as u32;
            assert_eq!(classify(&apart), quadratic(&apart), "{apart:?}");
        }
        assert!(linear > 100, "the linear path was exercised {linear} times");
    }
}
