//! Why a forced transport refuses a submission: what it moves, and what
//! to do instead.

use super::ipc_transports::local_placement_ok;
use crate::error::Error;
use crate::kinds::TransportKind;
use crate::memory::MemoryKind;
use crate::transport::planned::Item;

/// The refusal of a submission forced onto `k`, which cannot carry its
/// request `c`.
pub(super) fn forced_misfit(k: TransportKind, c: &Item<'_>) -> Error {
    let local = c.lease.region().kind;
    let placement = if local_placement_ok(k, local, c.req.local_addr) {
        ""
    } else {
        " (no visible GPU is attached to the local EGM memory's NUMA node)"
    };
    let remote = c.region.map(|r| r.kind.name()).unwrap_or("unknown");
    // What the forced transport moves, and what to do instead.
    let what = match k {
        TransportKind::Shm if c.region.is_some_and(|r| r.kind != MemoryKind::SharedHost) => format!(
            "shm moves only memory the peer allocated with orbite_host_allocate_shared; the peer's \
                 region at 0x{:x} is {remote} memory. Submit with ORBITE_TRANSPORT_AUTO or \
                 ORBITE_TRANSPORT_TCP to move it over TCP, or have the peer allocate it with \
                 orbite_host_allocate_shared",
            c.req.remote_addr
        ),
        TransportKind::Shm => {
            format!("shm copies with the CPU and this request's local memory is {} memory", local.name())
        }
        TransportKind::Tcp => format!(
            "tcp moves CPU-accessible memory only; this request's local memory is {} memory and \
                 the peer's is {remote} memory",
            local.name()
        ),
        TransportKind::Nvlink => format!(
            "nvlink moves the peer's orbite_cuda_allocate_ipc memory to or from local device or \
                 pinned host memory; this request's local memory is {} memory and the peer's is \
                 {remote} memory",
            local.name()
        ),
        TransportKind::Mnnvl => format!(
            "mnnvl moves the peer's orbite_allocate_mnnvl or orbite_allocate_egm memory; this \
                 request's local memory is {} memory and the peer's is {remote} memory",
            local.name()
        ),
        TransportKind::Cma => format!(
            "cma moves host memory the peer registered that the library did not allocate (its \
                 malloc, numpy or torch buffers) with the CPU; this request's local memory is {} memory \
                 and the peer's is {remote} memory",
            local.name()
        ),
    };
    Error::NotSupported(format!(
        "request {} cannot go over the forced transport {}: {what}{placement}",
        c.at(),
        k.name()
    ))
}
