//! The planner: a submission's checked requests, their local leases, a
//! snapshot of the peer's Describe and the policy make a plan (the
//! transport, the requests on it, those split off to TCP, and per-request
//! refusals), with no lock and no I/O: unit-tested alone.

use super::ipc_transports::local_placement_ok;
use crate::control::message::RegionInfo;
use crate::control::region_index::RegionIndex;
use crate::error::{Error, Result};
use crate::kinds::{Transport, TransportKind};
use crate::memory::{MemoryKind, RegionLease};
use crate::transfer::Request;
use crate::transport::ipc::plan::independent;
use crate::transport::planned::Item;
use std::sync::Arc;

/// What the plan follows besides the requests: the caller's choice, the
/// engine's `transport_policy`, and what it knows of the peer.
pub(super) struct Policy<'p> {
    /// The submission's transport (AUTO or one forced).
    pub transport: Transport,
    /// `transport_policy`, best first.
    pub order: &'p [TransportKind],
    /// SHM (and CMA, sharing its cache) runs without a relocation cache.
    pub shm_uncached: bool,
    /// Both engines opted in to EGM remote host grants.
    pub egm_both: bool,
    /// Why an IPC transport cannot reach the peer (`None`: it may).
    pub why_not: &'p dyn Fn(TransportKind) -> Option<String>,
}

/// A submission's plan: every request on `kind` but those of `tcp` (AUTO
/// split off what `kind` cannot carry when the rest is independent of
/// them), and the requests of `main` refused (by position in `main`: they
/// name no published region, or a range past the end of theirs).
pub(super) struct Plan<'a> {
    /// The transport of the submission.
    pub kind: TransportKind,
    /// The requests on `kind`, in order.
    pub main: Vec<Item<'a>>,
    /// The requests split off to TCP, in order.
    pub tcp: Vec<Item<'a>>,
    /// Some request may name no region, or a range past its end.
    missing: bool,
}

impl<'a> Plan<'a> {
    /// Takes the requests refused out of `main`, each with its error
    /// (`peer`: the peer's id, for the message).
    pub fn take_refused(&mut self, peer: u64) -> Vec<(usize, Error)> {
        if !self.missing {
            return Vec::new();
        }
        let refused = self.main.iter().filter(|c| !c.in_region()).map(|c| (c.at(), refusal(c, peer))).collect();
        self.main.retain(Item::in_region);
        refused
    }
}

/// Why `c` (naming no region, or a range past the end of its region)
/// moves nothing: nothing moves outside what the peer published.
fn refusal(c: &Item<'_>, peer: u64) -> Error {
    let (i, addr, len) = (c.at(), c.req.remote_addr, c.req.len);
    match c.region {
        None => {
            Error::NotFound(format!("request {i}: remote address 0x{addr:x} is in no region peer {peer} publishes"))
        }
        Some(g) => Error::OutOfRange(format!(
            "request {i}: remote range 0x{addr:x}+{len} crosses the end of region {} (0x{:x}+{}) that peer {peer} \
             publishes",
            g.id, g.addr, g.len
        )),
    }
}

/// Whether `k` carries a request between local memory of kind `local` at
/// `local_addr` and the peer's region `remote` (None: no region known;
/// `egm_both`: both engines opted in to EGM). The one check of a
/// submission's transport choice and of a direct route's copies.
pub(super) fn fits(
    k: TransportKind,
    local: MemoryKind,
    local_addr: u64,
    remote: Option<&RegionInfo>,
    egm_both: bool,
) -> bool {
    match remote {
        // A remote host range needs an EGM export and both peers' opt-in.
        Some(r) if r.kind == MemoryKind::Egm && k == TransportKind::Mnnvl && !egm_both => false,
        Some(r) => kinds_allow(k, local, r.kind) && local_placement_ok(k, local, local_addr),
        None => k != TransportKind::Tcp || local.cpu_accessible(),
    }
}

/// Whether a request may use `kind`, given the local and remote memory kinds.
pub(super) fn kinds_allow(kind: TransportKind, local: MemoryKind, remote: MemoryKind) -> bool {
    match kind {
        TransportKind::Tcp => local.cpu_accessible() && remote.cpu_accessible(),
        TransportKind::Shm => local.cpu_accessible() && remote == MemoryKind::SharedHost,
        // Memory the peer registered that the library did not allocate:
        // its own buffers (malloc, new, numpy, torch), copied by the kernel.
        TransportKind::Cma => local.cpu_accessible() && remote == MemoryKind::Host,
        // Local pinned host or device memory only: pageable host memory is
        // never registered or staged implicitly.
        TransportKind::Nvlink => {
            matches!(local, MemoryKind::Cuda | MemoryKind::CudaIpc | MemoryKind::PinnedHost)
                && remote == MemoryKind::CudaIpc
        }
        // Remote device (MNNVL) or host (EGM) fabric memory; EGM also needs
        // both peers' opt-in, checked at selection. Ordinary local host
        // memory is pinned first (`host_register`) or, with host_register
        // false, handed to the driver as it is.
        TransportKind::Mnnvl => {
            matches!(
                local,
                MemoryKind::Cuda
                    | MemoryKind::CudaIpc
                    | MemoryKind::PinnedHost
                    | MemoryKind::Mnnvl
                    | MemoryKind::Egm
                    | MemoryKind::Host
                    | MemoryKind::SharedHost
            ) && matches!(remote, MemoryKind::Mnnvl | MemoryKind::Egm)
        }
    }
}

/// Whether `kind` can carry some local memory to or from the peer's memory
/// of kind `remote` (`egm`: both engines opted in to EGM): what a direct
/// route needs when it is opened.
pub(super) fn carries(kind: TransportKind, remote: MemoryKind, egm: bool) -> bool {
    if remote == MemoryKind::Egm && kind == TransportKind::Mnnvl && !egm {
        return false;
    }
    MemoryKind::ALL.iter().any(|&local| kinds_allow(kind, local, remote))
}

/// The checked requests of a submission (`lease_of`: each one's lease in
/// `leases`), each with the region of the peer's Describe it names (found
/// in `regions`, the index published with it); and whether any names no
/// region, or a range past the end of its region.
pub(super) fn resolve<'a>(
    requests: &[Request],
    leases: &'a [Arc<RegionLease>],
    lease_of: &[u32],
    regions: &'a RegionIndex,
) -> (Vec<Item<'a>>, bool) {
    let mut missing = false;
    let mut last: Option<(&RegionInfo, u32)> = None;
    let mut items = crate::transport::planned::take_items(requests.len());
    items.extend(requests.iter().zip(lease_of.iter().copied()).zip(0u32..).map(|((r, l), index)| {
        let lease = &leases[l as usize];
        // Neighbours mostly name the region before them, their whole range
        // in it: one bounds check finds the region and says the range fits.
        if let Some((g, slot)) = last.filter(|(g, _)| g.contains(r.remote_addr, r.len.max(1))) {
            return Item { index, slot, req: *r, lease, region: Some(g) };
        }
        let found = last.filter(|(g, _)| g.contains(r.remote_addr, 1)).or_else(|| regions.find_slot(r.remote_addr));
        last = found;
        let (region, slot) = found.map_or((None, u32::MAX), |(g, s)| (Some(g), s));
        let c = Item { index, slot, req: *r, lease, region };
        missing |= !c.in_region();
        c
    }));
    (items, missing)
}

/// Resolves `items` again against a newer Describe (its `index`); whether
/// any still names no region, or a range past the end of its region.
pub(super) fn resolve_again<'a>(items: &mut [Item<'a>], index: &'a RegionIndex) -> bool {
    let mut missing = false;
    for c in items {
        (c.region, c.slot) = index.find_slot(c.req.remote_addr).map_or((None, u32::MAX), |(g, s)| (Some(g), s));
        missing |= !c.in_region();
    }
    missing
}

/// The plan of a submission's `items` to peer `peer` under `policy`: the
/// transport for the whole submission, and under AUTO the part TCP takes
/// when a better IPC transport carries the rest. A forced transport that
/// cannot carry a request, or no transport that carries them all, fails
/// the whole submission. `missing`: some request may name no region, or
/// a range past its end ([`resolve`]).
pub(super) fn plan<'a>(peer: u64, items: Vec<Item<'a>>, missing: bool, policy: &Policy<'_>) -> Result<Plan<'a>> {
    let (kind, tcp) = select(peer, policy, &items)?;
    let (main, tcp) = split_off(items, &tcp);
    Ok(Plan { kind, main, tcp, missing })
}

/// Whether `k` carries `c` (see [`fits`]).
fn fits_item(k: TransportKind, c: &Item<'_>, egm_both: bool) -> bool {
    fits(k, c.lease.region().kind, c.req.local_addr, c.region, egm_both)
}

/// The first request `k` cannot carry. Neighbours with one local lease and
/// one remote region are judged once (the previous one fitted), except
/// local EGM memory, placed per address (the lease's kind is read once
/// per lease and region, with its judgement).
fn first_misfit<'i, 'a>(k: TransportKind, items: &'i [Item<'a>], egm_both: bool) -> Option<&'i Item<'a>> {
    // The last judged lease and region, and whether its local memory is
    // EGM (true before the first: nothing to skip).
    let mut judged = (std::ptr::null(), std::ptr::null());
    let mut egm = true;
    items.iter().find(|c| {
        let key = (Arc::as_ptr(c.lease), c.region.map_or(std::ptr::null(), |r| r as *const RegionInfo));
        if key == judged && !egm {
            return false;
        }
        (judged, egm) = (key, c.lease.region().kind == MemoryKind::Egm);
        !fits_item(k, c, egm_both)
    })
}

/// The transport for the whole submission, and the requests (positions in
/// `items`) that go over TCP instead.
fn select(peer: u64, policy: &Policy<'_>, items: &[Item<'_>]) -> Result<(TransportKind, Vec<usize>)> {
    let egm_both = policy.egm_both;
    let why_not = |k: TransportKind| match k {
        TransportKind::Tcp => None,
        _ => (policy.why_not)(k),
    };
    match policy.transport {
        Transport::Only(k) => {
            if let Some(why) = why_not(k) {
                return Err(Error::Unavailable(format!(
                    "transport {} is not available to peer {peer}: {why}",
                    k.name()
                )));
            }
            if let Some(c) = first_misfit(k, items, egm_both) {
                return Err(super::misfit::forced_misfit(k, c));
            }
            Ok((k, Vec::new()))
        }
        Transport::Auto => {
            // Without a relocation cache every SHM subbatch maps the whole
            // remote allocation, faults in each page it touches and unmaps
            // it again: slower than TCP for KV-shaped traffic
            // (docs/benchmarks.md, "KV pool flow"), so AUTO takes TCP when
            // TCP can carry the submission.
            let order = policy.order;
            let tcp_fits =
                || order.contains(&TransportKind::Tcp) && first_misfit(TransportKind::Tcp, items, egm_both).is_none();
            for (rank, &k) in order.iter().enumerate() {
                // CMA shares SHM's cache (`shm_cache_entries`): uncached,
                // each subbatch takes two round trips.
                if matches!(k, TransportKind::Shm | TransportKind::Cma) && policy.shm_uncached && tcp_fits() {
                    continue;
                }
                // Before settling on TCP for all: an IPC transport ranked
                // above it that carries part of the submission takes that
                // part, TCP the rest.
                if k == TransportKind::Tcp {
                    if let Some(split) = order[..rank].iter().find_map(|&b| split(policy, b, items)) {
                        return Ok(split);
                    }
                }
                let all_fit = first_misfit(k, items, egm_both).is_none();
                let any_known = k == TransportKind::Tcp || items.iter().any(|c| c.region.is_some());
                if all_fit && any_known && why_not(k).is_none() {
                    return Ok((k, Vec::new()));
                }
            }
            Err(Error::Unavailable(format!(
                "no transport in transport_policy can carry this submission to peer {peer} (memory kinds: {})",
                items
                    .iter()
                    .map(|c| format!(
                        "{} -> {}",
                        c.lease.region().kind.name(),
                        c.region.map(|r| r.kind.name()).unwrap_or("unknown")
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

/// The split of an AUTO submission between the IPC transport `k` and TCP,
/// when `k` is up, carries some of the requests whose remote region is
/// known, TCP carries all the others, and no request depends on another
/// (no range one writes overlaps a range of another), so that the two
/// parts may run side by side. `None` otherwise.
fn split(policy: &Policy<'_>, k: TransportKind, items: &[Item<'_>]) -> Option<(TransportKind, Vec<usize>)> {
    if k == TransportKind::Tcp || (matches!(k, TransportKind::Shm | TransportKind::Cma) && policy.shm_uncached) {
        return None;
    }
    let mut any_known = false;
    let mut tcp = Vec::new();
    for (at, c) in items.iter().enumerate() {
        if fits_item(k, c, policy.egm_both) {
            any_known |= c.region.is_some();
        } else if fits_item(TransportKind::Tcp, c, policy.egm_both) {
            tcp.push(at);
        } else {
            return None;
        }
    }
    let usable = any_known && !tcp.is_empty() && (policy.why_not)(k).is_none();
    (usable && independent(items.iter().map(|c| &c.req))).then_some((k, tcp))
}

/// `items` without those at positions `out` (ascending), and those.
fn split_off<'a>(items: Vec<Item<'a>>, out: &[usize]) -> (Vec<Item<'a>>, Vec<Item<'a>>) {
    if out.is_empty() {
        return (items, Vec::new());
    }
    let mut moved = Vec::with_capacity(out.len());
    let mut kept = Vec::with_capacity(items.len() - out.len());
    let mut next = out.iter().peekable();
    for (at, c) in items.into_iter().enumerate() {
        if next.next_if(|&&o| o == at).is_some() {
            moved.push(c);
        } else {
            kept.push(c);
        }
    }
    (kept, moved)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
