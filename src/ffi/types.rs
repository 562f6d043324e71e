//! C types and constants.

use crate::{Allocation, Batch, DirectRoute, Engine};

/// ABI version of liborbite: [`crate::ABI_VERSION`], defined at the crate
/// root; equals `orbite_abi_version()` and the SONAME suffix. build.rs
/// puts the header's `#define` beside `ORBITE_VERSION_STRING`.
/// cbindgen:ignore
pub const ORBITE_ABI_VERSION: u32 = crate::ABI_VERSION;

/// A status code (`ORBITE_STATUS_*`, from `src/status_table.rs`).
pub type orbite_status = u32;

/// READ: copy from the remote region into local memory.
pub const ORBITE_OP_READ: u32 = 1;
/// WRITE: copy local memory into the remote region.
pub const ORBITE_OP_WRITE: u32 = 2;

/// Remote peers may READ the region.
pub const ORBITE_ACCESS_READ: u32 = 1;
/// Remote peers may WRITE the region.
pub const ORBITE_ACCESS_WRITE: u32 = 2;

/// Let transport_policy choose.
pub const ORBITE_TRANSPORT_AUTO: u32 = 0;
/// Payload over the TCP control connection.
pub const ORBITE_TRANSPORT_TCP: u32 = 1;
/// Shared host memory (same host).
pub const ORBITE_TRANSPORT_SHM: u32 = 2;
/// CUDA IPC over NVLink (same host).
pub const ORBITE_TRANSPORT_NVLINK: u32 = 3;
/// CUDA fabric handles across an NVLink fabric.
pub const ORBITE_TRANSPORT_MNNVL: u32 = 4;
/// Cross-memory attach (same host, same user): any registered host memory.
pub const ORBITE_TRANSPORT_CMA: u32 = 5;
/// `orbite_cuda_adopt` flag: the caller consents that a peer importing the
/// adopted memory can reach the whole underlying allocation.
pub const ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION: u32 = 1;

/// Nothing changed remotely.
pub const ORBITE_REMOTE_EFFECT_NONE: u32 = 0;
/// The WRITE was applied in full.
pub const ORBITE_REMOTE_EFFECT_APPLIED: u32 = 1;
/// The WRITE may have changed any part of the remote range.
pub const ORBITE_REMOTE_EFFECT_UNKNOWN: u32 = 2;

// Each constant the header gives C is the value the library means by it,
// checked when the library compiles.
const _: () = {
    use crate::{Access, RemoteEffect, TransportKind};
    assert!(ORBITE_ACCESS_READ == Access::READ.bits());
    assert!(ORBITE_ACCESS_WRITE == Access::WRITE.bits());
    assert!(ORBITE_TRANSPORT_TCP == TransportKind::Tcp.c_code());
    assert!(ORBITE_TRANSPORT_SHM == TransportKind::Shm.c_code());
    assert!(ORBITE_TRANSPORT_NVLINK == TransportKind::Nvlink.c_code());
    assert!(ORBITE_TRANSPORT_MNNVL == TransportKind::Mnnvl.c_code());
    assert!(ORBITE_TRANSPORT_CMA == TransportKind::Cma.c_code());
    assert!(ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION == crate::ADOPT_SHARE_WHOLE_ALLOCATION);
    assert!(ORBITE_REMOTE_EFFECT_NONE == RemoteEffect::None as u32);
    assert!(ORBITE_REMOTE_EFFECT_APPLIED == RemoteEffect::Applied as u32);
    assert!(ORBITE_REMOTE_EFFECT_UNKNOWN == RemoteEffect::Unknown as u32);
};

/// An engine (opaque).
pub struct orbite_engine {
    pub(crate) engine: Engine,
}

/// A submitted batch (opaque). Use from one thread at a time.
pub struct orbite_batch {
    pub(crate) batch: Batch,
}

/// A direct route to one region of a same-host peer (opaque):
/// `orbite_direct_open`. Usable from several threads at once.
pub struct orbite_direct {
    pub(crate) route: DirectRoute,
}

/// Memory allocated by the library (opaque).
pub struct orbite_allocation {
    pub(crate) alloc: Allocation,
}

/// One region a peer publishes (`orbite_peer_regions`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct orbite_region_info {
    /// The peer's region id.
    pub id: u64,
    /// Registration epoch (a new one when the peer registers the memory again).
    pub epoch: u64,
    /// First byte, in the peer's address space.
    pub addr: u64,
    /// Bytes.
    pub length: u64,
    /// ORBITE_ACCESS_* bits: what this engine may do to it.
    pub access: u32,
    /// Kind of memory: "host", "shared_host", "cuda", "cuda_ipc",
    /// "pinned_host", "mnnvl" or "egm" (static storage).
    pub kind: *const std::os::raw::c_char,
}

/// A snapshot of an engine's counters (opaque): each value of the stats
/// JSON by its dotted path, read without JSON (`orbite_engine_stats`).
pub struct orbite_stats {
    pub(crate) entries: Vec<StatEntry>,
}

/// One value of an [`orbite_stats`]: its path, and its number or text.
pub(crate) struct StatEntry {
    pub(crate) path: std::ffi::CString,
    pub(crate) value: u64,
    pub(crate) text: Option<std::ffi::CString>,
}

/// One transfer request.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct orbite_request {
    /// ORBITE_OP_READ or ORBITE_OP_WRITE.
    pub opcode: u32,
    /// Inside a region registered on this engine.
    pub local_addr: u64,
    /// Absolute address inside a region the peer registered.
    pub remote_addr: u64,
    /// Bytes; 0 is invalid.
    pub length: u64,
}

/// Options of a submission; all-zero means defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct orbite_submit_options {
    /// ORBITE_TRANSPORT_*; AUTO lets the policy choose.
    pub transport: u32,
    /// 0 = the engine's default_timeout_ms.
    pub timeout_ms: u32,
}

/// Outcome of one request.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct orbite_request_result {
    /// An orbite_status: OK, PENDING or the failure.
    pub status: u32,
    /// ORBITE_REMOTE_EFFECT_*; UNKNOWN only for WRITE.
    pub remote_effect: u32,
}
