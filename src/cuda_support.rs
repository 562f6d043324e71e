//! The CUDA entry points as the rest of the library sees them. In a build
//! without the `cuda` feature every one of them reports, truthfully, that
//! this build has no CUDA support: callers get `Unavailable` with the reason
//! and every other transport keeps working.

use crate::error::{Error, Result};
use crate::memory::Allocation;

const NO_CUDA: &str = "this build of liborbite has no CUDA support (rebuild with the `cuda` feature; CMake enables it with -DORBITE_CUDA=ON)";

fn unavailable(what: &str) -> Error {
    Error::Unavailable(format!("{what}: {NO_CUDA}"))
}

/// Why CUDA transports are not advertised, or `None` when they can be.
pub fn unavailable_reason() -> Option<String> {
    Some(NO_CUDA.to_string())
}

/// CUDA device memory (`ipc`: exportable, 2 MiB rounded and zeroed).
pub fn allocate_device(device: i32, _len: u64, ipc: bool) -> Result<Allocation> {
    let what = if ipc { "cuda_allocate_ipc" } else { "cuda_allocate" };
    Err(unavailable(&format!("{what}(device {device})")))
}

/// Pinned host memory.
pub fn allocate_pinned_host(_len: u64) -> Result<Allocation> {
    Err(unavailable("cuda_allocate_pinned_host"))
}

/// MNNVL device memory.
pub fn allocate_mnnvl(device: i32, _len: u64) -> Result<Allocation> {
    Err(unavailable(&format!("allocate_mnnvl(device {device})")))
}

/// EGM host memory on a NUMA node.
pub fn allocate_egm(numa_node: i32, _len: u64) -> Result<Allocation> {
    Err(unavailable(&format!("allocate_egm(numa node {numa_node})")))
}

/// Producer-stream hand-off for a region.
pub fn record_producer_stream(_region: u64, _stream: u64) -> Result<()> {
    Err(unavailable("record_producer_stream"))
}

/// Retained CUDA resources, as JSON.
pub fn retained_resources_json() -> String {
    serde_json::json!({
        "cuda_available": false,
        "reason": NO_CUDA,
        "retained_exports": [],
        "retained_imports": [],
        "quarantined_streams": 0,
    })
    .to_string()
}
