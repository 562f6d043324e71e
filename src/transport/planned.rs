//! A request of a submission as the planner hands it to an executor: its
//! index, the request, its local lease and the peer's region it names.

use crate::control::message::RegionInfo;
use crate::memory::RegionLease;
use crate::sync::spare::Spare;
use crate::transfer::Request;
use std::sync::Arc;

/// The planned items' vector kept between submissions (no lock): taken by
/// the planner, given back by the IPC executor once grouped.
static SPARE_ITEMS: Spare<Item<'static>> = Spare::new();

/// An empty vector for `n` planned items (the kept one when there is one).
/// Inline: a call of its own on every submission's route otherwise.
#[inline]
pub fn take_items<'a>(n: usize) -> Vec<Item<'a>> {
    SPARE_ITEMS.take(n)
}

/// Gives a vector of planned items back to be kept, emptied.
#[inline]
pub fn give_back(items: Vec<Item<'_>>) {
    let mut items = std::mem::ManuallyDrop::new(items);
    items.clear();
    // SAFETY: the allocation of a `Vec<Item<'_>>`, handed over whole (the
    // original is never dropped); `Item<'_>` and `Item<'static>` are one
    // type but for the lifetime of the references an item holds, and the
    // vector is empty: it keeps no reference.
    let v = unsafe { Vec::from_raw_parts(items.as_mut_ptr().cast::<Item<'static>>(), 0, items.capacity()) };
    SPARE_ITEMS.give(v);
}

/// A request after local checks: its index, the request, its local lease
/// (shared with the submission's other requests in that region: no
/// reference count per request) and the remote region it names (None: not
/// published by the peer) with that region's position in the peer's table
/// (`slot`: a dense key for grouping; `u32::MAX` with no region).
#[derive(Clone, Copy)]
pub struct Item<'a> {
    /// Its index in the submission.
    pub index: u32,
    /// The region's position in the peer's table (`u32::MAX`: none).
    pub slot: u32,
    /// The request.
    pub req: Request,
    /// The lease of the local region holding it.
    pub lease: &'a Arc<RegionLease>,
    /// The peer's region it names, if the peer publishes one.
    pub region: Option<&'a RegionInfo>,
}

impl Item<'_> {
    /// The request's index in the submission.
    pub fn at(&self) -> usize {
        self.index as usize
    }

    /// Whether its whole remote range lies in the region it names.
    pub fn in_region(&self) -> bool {
        self.region.is_some_and(|g| g.contains(self.req.remote_addr, self.req.len))
    }
}
