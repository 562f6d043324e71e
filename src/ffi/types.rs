//! C types and constants.

use crate::engine::Engine;
use crate::memory::Allocation;
use crate::transfer::BatchShared;
use std::sync::Arc;

/// ABI version of liborbite; equals `orbite_abi_version()` and the SONAME
/// suffix (`liborbite.so.1`). Bumped on any incompatible change.
pub const ORBITE_ABI_VERSION: u32 = 1;

/// A status code (`ORBITE_STATUS_*`).
pub type orbite_status = u32;

/// Success.
pub const ORBITE_STATUS_OK: orbite_status = 0;
/// Not finished yet (poll).
pub const ORBITE_STATUS_PENDING: orbite_status = 1;
/// A required pointer was NULL.
pub const ORBITE_STATUS_NULL_ARGUMENT: orbite_status = 2;
/// An argument had an invalid value (unknown enum value, zero length, overlap).
pub const ORBITE_STATUS_INVALID_ARGUMENT: orbite_status = 3;
/// The config JSON was rejected; orbite_last_error() names the key.
pub const ORBITE_STATUS_INVALID_CONFIG: orbite_status = 4;
/// Unknown peer, region or address.
pub const ORBITE_STATUS_NOT_FOUND: orbite_status = 5;
/// A range crosses the end of its region.
pub const ORBITE_STATUS_OUT_OF_RANGE: orbite_status = 6;
/// The region's access flags forbid the operation.
pub const ORBITE_STATUS_PERMISSION_DENIED: orbite_status = 7;
/// Closed, busy, gone or not built in.
pub const ORBITE_STATUS_UNAVAILABLE: orbite_status = 8;
/// A budget, pool or limit is exhausted.
pub const ORBITE_STATUS_RESOURCE_EXHAUSTED: orbite_status = 9;
/// A deadline passed.
pub const ORBITE_STATUS_TIMED_OUT: orbite_status = 10;
/// The peer or region is no longer the one this side knew.
pub const ORBITE_STATUS_STALE_PEER: orbite_status = 11;
/// Cleanup could not be confirmed; resources stay retained.
pub const ORBITE_STATUS_UNQUIESCED: orbite_status = 12;
/// At least one request of the batch failed (see orbite_batch_results).
pub const ORBITE_STATUS_TRANSFER_FAILED: orbite_status = 13;
/// A peer broke the wire protocol.
pub const ORBITE_STATUS_PROTOCOL_ERROR: orbite_status = 14;
/// Not supported by this build, driver or peer.
pub const ORBITE_STATUS_NOT_SUPPORTED: orbite_status = 15;
/// The CUDA driver failed.
pub const ORBITE_STATUS_CUDA_ERROR: orbite_status = 16;
/// An operating-system I/O error.
pub const ORBITE_STATUS_IO_ERROR: orbite_status = 17;
/// The output buffer is too small; *out_len holds the size needed.
pub const ORBITE_STATUS_BUFFER_TOO_SMALL: orbite_status = 18;
/// Cancelled before it started.
pub const ORBITE_STATUS_CANCELLED: orbite_status = 19;
/// A panic was caught inside the library (a bug; please report it).
pub const ORBITE_STATUS_PANIC: orbite_status = 20;

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

/// Nothing changed remotely.
pub const ORBITE_REMOTE_EFFECT_NONE: u32 = 0;
/// The WRITE was applied in full.
pub const ORBITE_REMOTE_EFFECT_APPLIED: u32 = 1;
/// The WRITE may have changed any part of the remote range.
pub const ORBITE_REMOTE_EFFECT_UNKNOWN: u32 = 2;

/// An engine (opaque).
pub struct orbite_engine {
    pub(crate) engine: Engine,
}

/// A submitted batch (opaque). Use from one thread at a time.
pub struct orbite_batch {
    pub(crate) shared: Arc<BatchShared>,
}

/// Memory allocated by the library (opaque).
pub struct orbite_allocation {
    pub(crate) alloc: Allocation,
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
