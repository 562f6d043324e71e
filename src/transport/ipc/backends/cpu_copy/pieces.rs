//! How a group's copies are cut into the pieces copiers claim: equal
//! shares ([`shares`], memcpy) or largest first ([`guided`], a mover's
//! kernel calls).

use crate::sync::spare::Spare;
use crate::transport::ipc::backend::CopyOp;

/// The pieces' lists kept between groups (no lock): the windows of a
/// group of 10^5 tiny copies are cut in turn, several copying at once,
/// each list given back by whichever copier drops its group last.
static SPARE_OPS: Spare<CopyOp, 8> = Spare::new();

/// A group's copies in one list, and where each piece of it starts: the
/// pieces of a large group cost two allocations, not one each.
pub(super) struct Pieces {
    /// Bytes of a piece (the last may hold fewer).
    pub(super) each: u64,
    pub(super) ops: Vec<CopyOp>,
    /// Piece `i` is `ops[starts[i]..starts[i + 1]]`.
    pub(super) starts: Vec<usize>,
}

impl Drop for Pieces {
    fn drop(&mut self) {
        SPARE_OPS.give(std::mem::take(&mut self.ops));
    }
}

impl Pieces {
    pub(super) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    pub(super) fn get(&self, i: usize) -> Option<&[CopyOp]> {
        (i < self.len()).then(|| &self.ops[self.starts[i]..self.starts[i + 1]])
    }
}

/// Cuts `ops` into `n` shares of about equal bytes (an op may be cut in two).
pub(super) fn shares(ops: impl Iterator<Item = CopyOp> + Clone, n: usize) -> Pieces {
    let total: u64 = ops.clone().map(|o| o.len).sum();
    let each = total.div_ceil(n as u64).max(1);
    let mut sizes = vec![each; (total / each) as usize];
    sizes.extend((total % each > 0).then_some(total % each));
    cut(ops, &sizes)
}

/// Cuts `ops` (`total` bytes) for `copiers` claiming pieces in turn,
/// largest first: each piece holds a `copiers`-th of the bytes the pieces
/// before it left, in whole pages, at least `min` bytes (the last holds
/// what is left). The first claims move most bytes in few calls (a
/// [`Mover`] pays a kernel call a piece), and the last ones are small, so
/// copiers finish together however late one started (guided
/// self-scheduling): a 1 MiB group for two copiers is 512, 256, 128, 64,
/// 32 and 32 KiB.
pub(super) fn guided(ops: &[CopyOp], total: u64, copiers: usize, min: u64) -> Pieces {
    const PAGE: u64 = 4096;
    let mut sizes = Vec::new();
    let mut left = total;
    while left > 0 {
        let take = (left / copiers.max(1) as u64).next_multiple_of(PAGE).max(min).min(left);
        sizes.push(take);
        left -= take;
    }
    cut(ops.iter().copied(), &sizes)
}

/// Cuts `ops` into pieces of `sizes` bytes in turn (an op may be cut);
/// the sizes add up to the ops' bytes.
pub(super) fn cut(ops: impl Iterator<Item = CopyOp>, sizes: &[u64]) -> Pieces {
    let each = sizes.iter().copied().max().unwrap_or(1);
    let mut out = Pieces { each, ops: SPARE_OPS.take(ops.size_hint().0 + sizes.len()), starts: vec![0] };
    let mut size = sizes.iter().copied();
    let mut room = size.next().unwrap_or(u64::MAX);
    for mut o in ops {
        while o.len > 0 {
            if room == 0 {
                out.starts.push(out.ops.len());
                room = size.next().unwrap_or(u64::MAX);
            }
            let take = o.len.min(room);
            out.ops.push(CopyOp { dst: o.dst, src: o.src, len: take });
            (o.dst, o.src, o.len) = (o.dst + take, o.src + take, o.len - take);
            room -= take;
        }
    }
    out.starts.push(out.ops.len());
    out
}
