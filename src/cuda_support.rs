//! The CUDA entry points as the rest of the library sees them, identical in
//! every build. Without the `cuda` feature each reports, truthfully, that
//! this build has no CUDA support; with it, each first probes the driver
//! (without panicking when libcuda is missing) and answers `Unavailable`
//! with the reason when there is no usable driver or device. Every other
//! transport keeps working either way.

use crate::error::{Error, Result};
use crate::memory::Allocation;

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::*;

    pub(super) const NO_CUDA: &str =
        "this build of liborbite has no CUDA support (rebuild with the `cuda` feature; CMake enables it with -DORBITE_CUDA=ON)";

    pub(super) fn ready() -> Result<()> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn allocate_device(_: i32, _: u64, _: bool) -> Result<Allocation> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn allocate_pinned_host(_: u64) -> Result<Allocation> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn record_producer_stream(_: u64, _: u64) -> Result<()> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn free_device(_: i32, _: u64) -> Result<()> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn free_pinned_host(_: u64) -> Result<()> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn driver_json() -> serde_json::Value {
        serde_json::json!({"cuda_available": false, "reason": NO_CUDA})
    }
    pub(super) fn allocate_mnnvl(_: i32, _: u64) -> Result<Allocation> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn allocate_egm(_: i32, _: u64) -> Result<Allocation> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
    pub(super) fn free_vmm(_: u64) -> Result<()> {
        Err(Error::Unavailable(NO_CUDA.into()))
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use crate::cuda::{driver, memory};

    pub(super) fn ready() -> Result<()> {
        driver::driver().map(|_| ())
    }
    pub(super) fn allocate_device(device: i32, len: u64, ipc: bool) -> Result<Allocation> {
        memory::allocate_device(device, len, ipc)
    }
    pub(super) fn allocate_pinned_host(len: u64) -> Result<Allocation> {
        driver::driver()?;
        memory::allocate_pinned_host(len)
    }
    pub(super) fn record_producer_stream(addr: u64, stream: u64) -> Result<()> {
        driver::driver()?;
        memory::record_producer_stream(addr, stream)
    }
    pub(super) fn free_device(device: i32, addr: u64) -> Result<()> {
        memory::free_device(device, addr)
    }
    pub(super) fn free_pinned_host(addr: u64) -> Result<()> {
        memory::free_pinned_host(addr)
    }
    pub(super) fn allocate_mnnvl(device: i32, len: u64) -> Result<Allocation> {
        crate::cuda::mnnvl::allocate_mnnvl(device, len)
    }
    pub(super) fn allocate_egm(numa_node: i32, len: u64) -> Result<Allocation> {
        driver::driver()?;
        crate::cuda::mnnvl::allocate_egm(numa_node, len)
    }
    pub(super) fn free_vmm(addr: u64) -> Result<()> {
        crate::cuda::mnnvl::free(addr)
    }
    pub(super) fn driver_json() -> serde_json::Value {
        match driver::driver() {
            Ok(d) => serde_json::json!({
                "cuda_available": true, "driver_version": d.version, "devices": d.devices,
                "memcpy_batch_v2": d.batch_v2, "fabric_symbols": d.fabric_symbols,
            }),
            Err(e) => serde_json::json!({"cuda_available": false, "reason": e.message()}),
        }
    }
}

fn with_what<T>(what: &str, r: Result<T>) -> Result<T> {
    r.map_err(|e| Error::from_status(e.status(), format!("{what}: {}", e.message())))
}

/// Why CUDA transports are not advertised, or `None` when they can be.
pub fn unavailable_reason() -> Option<String> {
    imp::ready().err().map(|e| e.message().to_string())
}

/// CUDA device memory (`ipc`: exportable, 2 MiB rounded and zeroed).
pub fn allocate_device(device: i32, len: u64, ipc: bool) -> Result<Allocation> {
    let what = if ipc { "cuda_allocate_ipc" } else { "cuda_allocate" };
    with_what(&format!("{what}(device {device})"), imp::allocate_device(device, len, ipc))
}

/// Pinned host memory.
pub fn allocate_pinned_host(len: u64) -> Result<Allocation> {
    with_what("cuda_allocate_pinned_host", imp::allocate_pinned_host(len))
}

/// MNNVL device memory: a fabric-exportable VMM allocation on `device`,
/// rounded to the driver's granularity. A typed error when CUDA cannot
/// supply it; never a silent fallback to ordinary device memory.
pub fn allocate_mnnvl(device: i32, len: u64) -> Result<Allocation> {
    with_what(&format!("allocate_mnnvl(device {device})"), imp::allocate_mnnvl(device, len))
}

/// EGM host memory on a NUMA node, exportable across the fabric.
pub fn allocate_egm(numa_node: i32, len: u64) -> Result<Allocation> {
    with_what(&format!("allocate_egm(numa node {numa_node})"), imp::allocate_egm(numa_node, len))
}

/// The checked release of MNNVL/EGM memory (unmap, release, free the range).
pub fn free_vmm(addr: u64) -> Result<()> {
    imp::free_vmm(addr)
}

/// Producer-stream hand-off for the allocation holding `addr`.
pub fn record_producer_stream(addr: u64, stream: u64) -> Result<()> {
    with_what("record_producer_stream", imp::record_producer_stream(addr, stream))
}

/// Frees CUDA device memory.
pub fn free_device(device: i32, addr: u64) -> Result<()> {
    imp::free_device(device, addr)
}

/// Frees CUDA pinned host memory.
pub fn free_pinned_host(addr: u64) -> Result<()> {
    imp::free_pinned_host(addr)
}

/// The driver as probed, as JSON (for `orbite_cuda_retained_resources_json`).
pub fn driver_json() -> serde_json::Value {
    imp::driver_json()
}

/// Retained resources of every live engine of the process (by endpoint),
/// with the CUDA driver as probed, as JSON.
pub fn retained_resources_json() -> String {
    let mut v = driver_json();
    v["engines"] = crate::engine::retained_resources_all();
    v.to_string()
}
