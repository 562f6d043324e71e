//! NVLink and MNNVL points (built with the `cuda` feature): the target
//! serves device memory (`allocate_ipc` for NVLink, `allocate_mnnvl` for
//! MNNVL) on device A, the initiator moves it to and from its own device
//! memory on device B, pinned host memory, or both alternately
//! (`--memory device|host|mixed`), and the baseline is plain
//! `cuMemcpyAsync` copies of the same block size and batch in the same run:
//! device A to device B (with peer access enabled where A != B), or pinned
//! host memory to device B for host memory.

use orbite::cuda::driver::{check, primary_context, ContextGuard};
use orbite::cuda::raw;
use orbite::{allocate_mnnvl, allocate_pinned_host, Access, Allocation, CudaMemory, Engine, Op};
use std::time::{Duration, Instant};

/// The target's engine config and memory for `kind` (`nvlink` or `mnnvl`).
/// `extra`: more keys for its config (`, "k": v ...`), or "".
pub fn target(kind: &str, listen: &str, device: i32, len: u64, extra: &str) -> Result<(Engine, Allocation), String> {
    let cfg = match kind {
        "nvlink" => format!(r#"{{"listen": "{listen}", "nvlink": true{extra}}}"#),
        _ => format!(r#"{{"listen": "{listen}", "mnnvl": {{"handle_type": "posix_fd"}}{extra}}}"#),
    };
    let e = Engine::from_json(&cfg).map_err(|e| e.to_string())?;
    let a = if kind == "nvlink" { CudaMemory::allocate_ipc(device, len) } else { allocate_mnnvl(device, len) }
        .map_err(|e| e.to_string())?;
    e.register_memory(a.addr(), len, Access::READ_WRITE).map_err(|e| e.to_string())?;
    Ok((e, a))
}

/// The initiator's engine config for `kind`.
pub fn initiator_config(kind: &str, max_inflight: u64) -> String {
    let transport = if kind == "nvlink" { r#""nvlink": true"# } else { r#""mnnvl": {"handle_type": "posix_fd"}"# };
    format!(
        r#"{{{transport}, "nvlink_cache_entries": 64, "max_inflight_bytes": {max_inflight}, "max_transfer_bytes": 67108864}}"#
    )
}

/// The initiator's local memory: device memory on `device`, pinned host
/// memory, or one of each ("mixed"), each `len` bytes, registered.
pub fn local(e: &Engine, memory: &str, device: i32, len: u64) -> Result<Vec<Allocation>, String> {
    let kinds: &[bool] = match memory {
        "device" => &[false],
        "host" => &[true],
        _ => &[false, true],
    };
    kinds
        .iter()
        .map(|host| {
            let a = if *host { allocate_pinned_host(len) } else { CudaMemory::allocate(device, len) }
                .map_err(|e| e.to_string())?;
            e.register_memory(a.addr(), len, Access::NONE).map_err(|e| e.to_string())?;
            Ok(a)
        })
        .collect()
}

/// Plain copies of `bs`-byte blocks, `batch` per drained round, for
/// `duration`, between a buffer on the target's device and the local
/// memory kind (device on `local_device`, or pinned host): GB/s from the
/// measured elapsed time, and the baseline's name.
#[allow(clippy::too_many_arguments)]
pub fn baseline(
    op: Op,
    memory: &str,
    target_device: i32,
    local_device: i32,
    bs: u64,
    batch: usize,
    buffer: u64,
    duration: f64,
) -> Result<(String, f64), String> {
    let host = memory == "host";
    let remote = raw::alloc_device(target_device, buffer, false).map_err(|e| e.to_string())?;
    let local = if host { raw::alloc_pinned_host(buffer) } else { raw::alloc_device(local_device, buffer, false) };
    let local = match local {
        Ok(l) => l,
        Err(e) => {
            let _ = raw::free_device(target_device, remote);
            return Err(e.to_string());
        }
    };
    let local_device = if host { None } else { Some(local_device) };
    let r = copy_for(op, remote, local, target_device, local_device, bs, batch, buffer, duration);
    let _ = raw::free_device(target_device, remote);
    let _ = match local_device {
        None => raw::free_pinned_host(local),
        Some(d) => raw::free_device(d, local),
    };
    let name = if host { "cuda_pinned_h2d" } else { "cuda_d2d" };
    r.map(|g| (name.to_string(), g))
}

#[allow(clippy::too_many_arguments)]
fn copy_for(
    op: Op,
    remote: u64,
    local: u64,
    remote_device: i32,
    local_device: Option<i32>,
    bs: u64,
    batch: usize,
    buffer: u64,
    duration: f64,
) -> Result<f64, String> {
    let ctx = primary_context(local_device.unwrap_or(remote_device)).map_err(|e| e.to_string())?;
    let g = ContextGuard::bind(ctx).map_err(|e| e.to_string())?;
    if local_device.is_some_and(|d| d != remote_device) {
        let peer = primary_context(remote_device).map_err(|e| e.to_string())?;
        // SAFETY: both are retained primary contexts; no memory is touched.
        let q = unsafe { cudarc::driver::sys::cuCtxEnablePeerAccess(peer as _, 0) };
        if q != cudarc::driver::sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            check(q, "cuCtxEnablePeerAccess").map_err(|e| e.to_string())?;
        }
    }
    let (dst, src) = if op == Op::Read { (local, remote) } else { (remote, local) };
    let blocks = (buffer / bs).max(1);
    let mut k = 0u64;
    let mut bytes = 0u64;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(duration);
    while Instant::now() < end {
        for _ in 0..batch {
            let off_s = (k % blocks) * bs;
            let off_d = ((k * 7 + 3) % blocks) * bs;
            // SAFETY: both buffers hold `buffer` bytes and every block lies
            // inside; the copies are drained before the buffers are freed.
            let q = unsafe {
                cudarc::driver::sys::cuMemcpyAsync(
                    dst + off_d,
                    src + off_s,
                    bs.min(buffer) as usize,
                    std::ptr::null_mut(),
                )
            };
            check(q, "cuMemcpyAsync (baseline)").map_err(|e| e.to_string())?;
            k += 1;
            bytes += bs.min(buffer);
        }
        raw::synchronize_context().map_err(|e| e.to_string())?;
    }
    let secs = t0.elapsed().as_secs_f64();
    g.restore().map_err(|e| e.to_string())?;
    Ok(bytes as f64 / secs / 1e9)
}

/// `--pattern kv` on device memory: the target's engine config and its
/// one allocation of `len` bytes on device 0 for `kind` (`nvlink`:
/// `allocate_ipc`, `mnnvl`: `allocate_mnnvl` with POSIX-fd handles).
pub fn kv_target(kind: &str, len: u64) -> Result<(String, Allocation), String> {
    let (cfg, a) = match kind {
        "nvlink" => (r#"{"nvlink": true}"#, CudaMemory::allocate_ipc(0, len)),
        "mnnvl" => (r#"{"mnnvl": {"handle_type": "posix_fd"}}"#, allocate_mnnvl(0, len)),
        other => return Err(format!("no device memory for {other:?}")),
    };
    Ok((cfg.to_string(), a.map_err(|e| e.to_string())?))
}

/// `--pattern kv`: the initiator's config keys for `kind` (a cache large
/// enough for every region, so that large submissions move in windows).
pub fn kv_initiator_keys(kind: &str) -> serde_json::Value {
    match kind {
        "nvlink" => serde_json::json!({"nvlink": true, "nvlink_cache_entries": 256}),
        _ => serde_json::json!({"mnnvl": {"handle_type": "posix_fd"}, "nvlink_cache_entries": 256}),
    }
}

/// Writes `bytes` into device memory at `addr`, 64 MiB at a time.
pub fn write(addr: u64, bytes: &[u8]) -> Result<(), String> {
    for (i, chunk) in bytes.chunks(64 << 20).enumerate() {
        raw::host_to_device(addr + (i as u64) * (64 << 20), chunk).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Reads `len` bytes of device memory at `addr`, 64 MiB at a time.
pub fn read(addr: u64, len: u64) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; len as usize];
    for (i, chunk) in out.chunks_mut(64 << 20).enumerate() {
        raw::device_to_host(chunk, addr + (i as u64) * (64 << 20)).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// One contiguous device-to-device copy of `bytes` on device 0, the best
/// of 3 (after one to warm up): GB/s, the same run's ceiling for one
/// transfer of that many bytes.
pub fn contiguous_copy_gbps(bytes: u64) -> Result<f64, String> {
    let a = raw::alloc_device(0, bytes, false).map_err(|e| e.to_string())?;
    let b = match raw::alloc_device(0, bytes, false) {
        Ok(b) => b,
        Err(e) => {
            let _ = raw::free_device(0, a);
            return Err(e.to_string());
        }
    };
    let timed = (|| -> Result<f64, String> {
        let g = ContextGuard::bind(primary_context(0).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        let mut best = 0f64;
        for rep in 0..4 {
            let t0 = Instant::now();
            // SAFETY: both allocations hold `bytes` bytes; the copy is
            // drained before they are freed.
            let q = unsafe { cudarc::driver::sys::cuMemcpyAsync(b, a, bytes as usize, std::ptr::null_mut()) };
            check(q, "cuMemcpyAsync (baseline)").map_err(|e| e.to_string())?;
            raw::synchronize_context().map_err(|e| e.to_string())?;
            if rep > 0 {
                best = best.max(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
        }
        g.restore().map_err(|e| e.to_string())?;
        Ok(best)
    })();
    let _ = raw::free_device(0, a);
    let _ = raw::free_device(0, b);
    timed
}
