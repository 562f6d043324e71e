//! The CUDA driver, and nothing above it: presence and optional-symbol
//! probing, raw device and pinned allocations, VMM (fabric and POSIX-fd
//! handles, EGM placement), IPC handles, streams, events, the stream pool
//! and host pins. It builds no `Allocation`, holds no transport backend and
//! reads no engine config; `memory::cuda` turns its allocations into owned
//! ones and the NVLink/MNNVL backends in `transport` copy through it.
//!
//! The stream pool and the VMM state machine are plain Rust (tested on CPU
//! and model-checked); everything that calls the driver is compiled under
//! the `cuda` feature, through cudarc with dynamic loading, so that a build
//! needs no CUDA toolkit and a machine without a driver still runs every
//! other transport. Without the feature, [`ready`] and [`driver_json`] say
//! so truthfully.

use crate::error::Result;

pub mod fabric_cause;
pub mod stream_pool;
pub mod vmm;

#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
pub mod fabric;
#[cfg(feature = "cuda")]
pub mod host_pin;
#[cfg(feature = "cuda")]
pub mod imex;
#[cfg(feature = "cuda")]
pub mod nvml;
#[cfg(feature = "cuda")]
pub mod raw;
#[cfg(feature = "cuda")]
pub mod streams;
#[cfg(feature = "cuda")]
pub mod vmm_driver;

/// Why a build without the `cuda` feature has no CUDA.
pub const NO_CUDA: &str =
    "this build of liborbite has no CUDA support (rebuild with the `cuda` feature; CMake enables it with -DORBITE_CUDA=ON)";

/// `Ok` when a usable driver with a device is present (probed once per
/// process); otherwise the typed reason (`Unavailable`, or `NotSupported`
/// for a missing symbol).
pub fn ready() -> Result<()> {
    #[cfg(feature = "cuda")]
    return driver::driver().map(|_| ());
    #[cfg(not(feature = "cuda"))]
    Err(crate::error::Error::Unavailable(NO_CUDA.into()))
}

/// Why the CUDA transports cannot be offered, or `None` when they can.
pub fn unavailable_reason() -> Option<String> {
    ready().err().map(|e| e.message().to_string())
}

/// The driver as probed, as JSON (`cuda_available`, and the version,
/// devices and optional symbols, or the reason).
pub fn driver_json() -> serde_json::Value {
    #[cfg(feature = "cuda")]
    if let Ok(d) = driver::driver() {
        return serde_json::json!({
            "cuda_available": true, "driver_version": d.version, "devices": d.devices,
            "memcpy_batch_v2": d.batch_v2, "fabric_symbols": d.fabric_symbols,
        });
    }
    serde_json::json!({"cuda_available": false, "reason": unavailable_reason().unwrap_or_default()})
}
