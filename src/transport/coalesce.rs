//! Coalescing: consecutive copies of a subbatch that are contiguous on both
//! sides (the next starts where the previous ended, locally and remotely)
//! and go the same way become one copy, so that a KV transfer of 100 000
//! block descriptors issues one memcpy or one native batch entry per
//! contiguous run of blocks instead of one per block. Only independent
//! copies are merged (a dependent group keeps its input order, and merging
//! two ordered copies changes what an overlapping one reads), and a run
//! stays inside one local region (a CUDA copy may not span two
//! allocations). What each request's outcome is stays with the caller: a
//! merged copy moves exactly the bytes of its requests.

use crate::memory::rank::Ranks;
use crate::transfer::Op;
use crate::transport::ipc::backend::CopyOp;
use std::sync::Arc;

/// Largest copy a run grows to: big enough that the per-copy cost is
/// nothing beside it, small enough that one copy never holds a stream or a
/// copy thread for long.
pub const MAX_RUN_BYTES: u64 = 64 << 20;

/// The local regions of a subbatch: address ranges (start, end) that a
/// run's local side may not leave. Shared by the subbatches of a
/// submission (a clone is a reference count).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalSpans(Arc<Spans>);

#[derive(Debug, Default, PartialEq, Eq)]
struct Spans {
    /// The spans (start, end), sorted, and the buckets over their starts.
    spans: Vec<(u64, u64)>,
    ranks: Ranks,
}

impl LocalSpans {
    /// The spans of `ranges` (each a registered local region), in any order.
    pub fn new(mut ranges: Vec<(u64, u64)>) -> LocalSpans {
        ranges.sort_unstable();
        ranges.dedup();
        let ranks = Ranks::new(ranges.len(), |i| ranges[i].0);
        LocalSpans(Arc::new(Spans { spans: ranges, ranks }))
    }

    /// No span: every copy stays alone (for a submission of one request,
    /// which has nothing to coalesce). Shared, so that it costs no
    /// allocation.
    pub fn none() -> LocalSpans {
        static NONE: once_cell::sync::Lazy<LocalSpans> = once_cell::sync::Lazy::new(LocalSpans::default);
        NONE.clone()
    }

    /// Whether any span overlaps `[start, end)`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        // The first span ending after `start` is the only candidate (the
        // spans are disjoint and sorted, so their ends are too).
        let i = self.0.spans.partition_point(|s| s.1 <= start);
        self.0.spans.get(i).is_some_and(|s| s.0 < end)
    }

    /// The span (start, end) that holds `addr` (`None`: no span does).
    fn span_of(&self, addr: u64) -> Option<(u64, u64)> {
        // Regions do not overlap; the last one starting at or before
        // `addr` is the only candidate.
        let spans = &self.0.spans;
        let i = self.0.ranks.rank(spans.len(), addr, |i| spans[i].0).checked_sub(1)?;
        Some(spans[i]).filter(|&(_, e)| e > addr)
    }
}

/// The local side of a copy going `op`.
fn local_of(op: Op, c: &CopyOp) -> u64 {
    match op {
        Op::Read => c.dst,
        Op::Write => c.src,
    }
}

/// Merges `ops` (one per request, going `dirs(i)`) into runs, in place
/// (no second vector: a window's copies stay where they were built): a
/// copy joins the run before it when it goes the same way, starts where
/// the run ends on both sides, keeps its local side inside the span where
/// the run began, and keeps the run within [`MAX_RUN_BYTES`]. The caller
/// passes independent copies only.
pub fn runs_in_place(ops: &mut Vec<CopyOp>, dirs: impl Fn(usize) -> Op, spans: &LocalSpans) {
    // The runs so far are `ops[..kept]`; the copy read next lies at or
    // after `kept`.
    let mut kept = 0usize;
    // The current run's direction and the end of its local span.
    let mut run: Option<(Op, u64)> = None;
    // The span last found: copies that do not join (blocks with gaps)
    // mostly start in it, and skip the lookup.
    let mut span: Option<(u64, u64)> = None;
    for i in 0..ops.len() {
        let (o, op) = (ops[i], dirs(i));
        if let Some((run_op, limit)) = run {
            let last = &mut ops[kept - 1];
            let joins = run_op == op
                && last.dst + last.len == o.dst
                && last.src + last.len == o.src
                && last.len + o.len <= MAX_RUN_BYTES
                && local_of(op, &o) + o.len <= limit;
            if joins {
                last.len += o.len;
                continue;
            }
        }
        ops[kept] = o;
        kept += 1;
        let local = local_of(op, &o);
        if !span.is_some_and(|(start, end)| start <= local && local < end) {
            span = spans.span_of(local);
        }
        // A copy outside every span (never, from the engine) stays alone.
        run = span.map(|(_, end)| (op, end));
    }
    ops.truncate(kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(dst: u64, src: u64, len: u64) -> CopyOp {
        CopyOp { dst, src, len }
    }

    fn spans(r: &[(u64, u64)]) -> LocalSpans {
        LocalSpans::new(r.to_vec())
    }

    /// The runs of `ops` (merged in a copy of them).
    fn runs(ops: &[CopyOp], dirs: impl Fn(usize) -> Op, spans: &LocalSpans) -> Vec<CopyOp> {
        let mut out = ops.to_vec();
        runs_in_place(&mut out, dirs, spans);
        out
    }

    /// Guards `LocalSpans::overlaps`: touching is not overlapping; a range
    /// inside a gap, before the first span or after the last overlaps
    /// none; one reaching into a span, or covering it, does.
    #[test]
    fn spans_say_whether_a_range_overlaps_them() {
        let s = spans(&[(300, 400), (100, 200)]);
        let overlap: Vec<bool> = [(0, 100), (0, 101), (200, 300), (199, 201), (250, 450), (400, 500), (350, 360)]
            .iter()
            .map(|&(a, b)| s.overlaps(a, b))
            .collect();
        assert_eq!(overlap, vec![false, true, false, true, true, false, true]);
        assert!(!LocalSpans::default().overlaps(0, u64::MAX));
    }

    #[test]
    fn contiguous_reads_become_one_copy_and_gaps_split_runs() {
        // Three blocks contiguous on both sides, then one that jumps
        // remotely, then one contiguous with it.
        let ops = [
            op(0x1000, 0x9000, 0x100),
            op(0x1100, 0x9100, 0x100),
            op(0x1200, 0x9200, 0x100),
            op(0x1300, 0xa000, 0x100),
            op(0x1400, 0xa100, 0x80),
        ];
        let got = runs(&ops, |_| Op::Read, &spans(&[(0x1000, 0x2000)]));
        assert_eq!(got, vec![op(0x1000, 0x9000, 0x300), op(0x1300, 0xa000, 0x180)]);
    }

    #[test]
    fn a_local_jump_or_a_change_of_direction_splits_a_run() {
        let ops = [op(0x1000, 0x9000, 0x100), op(0x1200, 0x9100, 0x100)];
        assert_eq!(runs(&ops, |_| Op::Read, &spans(&[(0x1000, 0x2000)])), ops.to_vec());
        // WRITE then READ whose addresses happen to line up.
        let ops = [op(0x9000, 0x1000, 0x100), op(0x9100, 0x1100, 0x100)];
        let dirs = |i: usize| if i == 0 { Op::Write } else { Op::Read };
        assert_eq!(runs(&ops, dirs, &spans(&[(0x1000, 0x2000), (0x9000, 0xa000)])), ops.to_vec());
        // Two WRITEs: the local side is the source.
        assert_eq!(runs(&ops, |_| Op::Write, &spans(&[(0x1000, 0x2000)])), vec![op(0x9000, 0x1000, 0x200)]);
    }

    #[test]
    fn a_run_stays_in_its_local_region() {
        // Two adjacent local regions: the copy crossing into the second
        // starts a new run, which then grows inside it.
        let ops = [op(0x1f00, 0x9000, 0x100), op(0x2000, 0x9100, 0x100), op(0x2100, 0x9200, 0x100)];
        let s = spans(&[(0x2000, 0x3000), (0x1000, 0x2000)]);
        assert_eq!(runs(&ops, |_| Op::Read, &s), vec![op(0x1f00, 0x9000, 0x100), op(0x2000, 0x9100, 0x200)]);
        // Outside every span: never merged.
        assert_eq!(runs(&ops, |_| Op::Read, &spans(&[])), ops.to_vec());
    }

    #[test]
    fn a_run_stops_at_the_size_cap() {
        let half = MAX_RUN_BYTES / 2;
        let ops: Vec<CopyOp> = (0..5).map(|i| op(i * half, (1 << 40) + i * half, half)).collect();
        let got = runs(&ops, |_| Op::Read, &spans(&[(0, 1 << 40)]));
        assert_eq!(
            got,
            vec![
                op(0, 1 << 40, MAX_RUN_BYTES),
                op(2 * half, (1 << 40) + 2 * half, MAX_RUN_BYTES),
                op(4 * half, (1 << 40) + 4 * half, half)
            ]
        );
        assert_eq!(got.iter().map(|o| o.len).sum::<u64>(), 5 * half);
    }
}
