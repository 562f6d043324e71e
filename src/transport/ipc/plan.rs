//! Subbatch planning: which copies may run as one unordered batch.

use super::backend::{CopyOp, CopyPlan};

/// Decides whether `ops` are independent (no destination overlaps another
/// destination, no source overlaps a destination, its own included) with an O(n log n) sort of
/// the address intervals; otherwise they must run in order.
pub fn classify(ops: &[CopyOp]) -> CopyPlan {
    if ops.is_empty() {
        return CopyPlan::Independent;
    }
    let mut dst: Vec<(u64, u64)> = ops.iter().map(|o| (o.dst, o.dst + o.len)).collect();
    dst.sort_unstable();
    for w in dst.windows(2) {
        if w[1].0 < w[0].1 {
            return CopyPlan::Ordered;
        }
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

    #[test]
    fn agrees_with_the_quadratic_definition() {
        let mut x: u64 = 12345;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..2000 {
            let n = 1 + rnd(6) as usize;
            let ops: Vec<CopyOp> = (0..n).map(|_| op(rnd(200), rnd(200), 1 + rnd(20))).collect();
            let ov = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
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
            let want = if dep { CopyPlan::Ordered } else { CopyPlan::Independent };
            assert_eq!(classify(&ops), want, "{ops:?}");
        }
    }
}
