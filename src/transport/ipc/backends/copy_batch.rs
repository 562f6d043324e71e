//! `CopyBatch`: the destination, source and length arrays of one copy group,
//! and the decision between one native batch copy (`cuMemcpyBatchAsync_v2`,
//! for at least two independent copies) and ordered enqueue (overlapping
//! destinations, or a source that depends on a destination). The plan is
//! the one the IPC protocol computed for the group (`ipc::plan::classify`).

use crate::transport::ipc::backend::{CopyOp, CopyPlan};

/// The arrays handed to the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyBatch {
    /// Destinations.
    pub dsts: Vec<u64>,
    /// Sources.
    pub srcs: Vec<u64>,
    /// Lengths.
    pub sizes: Vec<usize>,
    /// Independent or ordered, as planned for the group.
    pub plan: CopyPlan,
}

/// How a batch will be submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submission {
    /// One `cuMemcpyBatchAsync_v2` call.
    Native,
    /// One `cuMemcpyAsync` per copy, in input order.
    Ordered,
}

impl CopyBatch {
    /// Builds the arrays for `ops` (at most the admitted prefix is passed)
    /// under the group's `plan`.
    pub fn build(ops: &[CopyOp], plan: CopyPlan) -> CopyBatch {
        CopyBatch {
            dsts: ops.iter().map(|o| o.dst).collect(),
            srcs: ops.iter().map(|o| o.src).collect(),
            sizes: ops.iter().map(|o| o.len as usize).collect(),
            plan,
        }
    }

    /// Copies in the batch.
    pub fn len(&self) -> usize {
        self.dsts.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.dsts.is_empty()
    }

    /// Native batch only for two or more independent copies, and only where
    /// the driver has the exact v2 symbol (driver API 13000+).
    pub fn submission(&self, native_available: bool) -> Submission {
        if native_available && self.len() >= 2 && self.plan == CopyPlan::Independent {
            Submission::Native
        } else {
            Submission::Ordered
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ipc::plan::classify;

    fn build(ops: &[CopyOp]) -> CopyBatch {
        CopyBatch::build(ops, classify(ops))
    }

    fn op(dst: u64, src: u64, len: u64) -> CopyOp {
        CopyOp { dst, src, len }
    }

    #[test]
    fn arrays_and_submission_choice() {
        let b = build(&[op(0, 1000, 10), op(100, 2000, 20)]);
        assert_eq!((b.dsts.clone(), b.srcs.clone(), b.sizes.clone()), (vec![0, 100], vec![1000, 2000], vec![10, 20]));
        assert_eq!(b.submission(true), Submission::Native);
        assert_eq!(b.submission(false), Submission::Ordered, "no v2 symbol: never the 12.8 signature");
        assert_eq!(build(&[op(0, 1000, 10)]).submission(true), Submission::Ordered);
        let dep = build(&[op(0, 1000, 10), op(5, 2000, 20)]);
        assert_eq!(dep.submission(true), Submission::Ordered);
        let chain = build(&[op(0, 1000, 10), op(3000, 0, 10)]);
        assert_eq!(chain.submission(true), Submission::Ordered);
    }
}
