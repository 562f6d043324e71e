//! A group's requests as the transport holds them, and the group finished:
//! its requests with one verdict for all (every copy of a group ends
//! together: all Ok, or all failed by the one error that ended it, so no
//! outcome is stored per request). The requests' vectors are kept between
//! groups ([`Spare`]): a submission of 10^5 requests runs a dozen windows,
//! and each window's vector, freed, went back to the kernel and was
//! faulted in again by the next.

use crate::error::Error;
use crate::sync::spare::Spare;
use crate::transfer::{BatchShared, ChunkOutcome, Op, RemoteEffect, Request};

/// A group's requests: each one's index in its submission, and the request.
pub type GroupItems = Vec<(usize, Request)>;

/// The group requests' vectors kept between groups (no lock): taken by the
/// executor for each group or window, given back once its outcomes are
/// recorded ([`Finished::complete`]). One per window copying on the pool
/// while the next is posted (a window holds at most 8192 requests: 320
/// KiB).
static SPARE_GROUP_ITEMS: Spare<(usize, Request), 8> = Spare::new();

/// An empty vector for a group of `n` requests (the kept one when there
/// is one).
pub fn take_group_items(n: usize) -> GroupItems {
    SPARE_GROUP_ITEMS.take(n)
}

/// A finished group: its items and the error every one of them failed
/// with (`None`: each ended Ok).
pub struct Finished {
    pub(super) items: GroupItems,
    pub(super) failed: Option<Error>,
}

/// The outcome of a request going `op` of a group that ended with `failed`.
fn outcome(op: Op, failed: Option<&Error>) -> ChunkOutcome {
    match failed {
        None => ChunkOutcome::ok(op),
        Some(e) => ChunkOutcome::failed(e.clone(), RemoteEffect::of_uncertain(op)),
    }
}

impl Finished {
    /// Each item's index in its submission, with its outcome.
    pub fn into_pairs(self) -> impl Iterator<Item = (usize, ChunkOutcome)> {
        let failed = self.failed;
        self.items.into_iter().map(move |(i, r)| (i, outcome(r.op, failed.as_ref())))
    }

    /// Records each item's outcome in `batch`, then keeps the items'
    /// vector for the next group.
    pub fn complete(self, batch: &BatchShared) {
        let Finished { mut items, failed } = self;
        batch.complete_chunks(items.drain(..).map(|(i, r)| (i, outcome(r.op, failed.as_ref()))));
        SPARE_GROUP_ITEMS.give(items);
    }
}
