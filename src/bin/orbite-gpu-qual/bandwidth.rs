//! The bandwidth mode: the transport's throughput over a range of sizes
//! against plain device copies of the same bytes timed on this machine (or
//! a fixed baseline, against the CPU stand-in for the driver), and the
//! verdict against the qualification's gate.

use super::*;

/// The same-run baseline of the bandwidth mode: plain copies between a
/// buffer where the source's memory sits (device `src_device`, or pinned
/// host memory) and the requester's local buffer, outside OrbiTE.
pub(super) struct Baseline {
    pub(super) other: u64,
    pub(super) other_host: bool,
    pub(super) other_device: i32,
    pub(super) local: u64,
    pub(super) ctx: orbite::cuda::driver::Ctx,
    pub(super) what: String,
}

impl Baseline {
    fn new(r: &Req, src_device: i32, src_host: bool, local_host: bool) -> Result<Baseline, String> {
        let other = if src_host { raw::alloc_pinned_host(r.len) } else { raw::alloc_device(src_device, r.len, false) }
            .map_err(|e| e.to_string())?;
        let ctx = primary_context(if local_host { src_device } else { r.device }).map_err(|e| e.to_string())?;
        if !src_host && !local_host && src_device != r.device {
            // Peer access as the IPC import has it (lazily enabled there).
            let g = ContextGuard::bind(ctx).map_err(|e| e.to_string())?;
            let peer = primary_context(src_device).map_err(|e| e.to_string())?;
            // SAFETY: both contexts are retained primary contexts; no memory is touched.
            let q = unsafe { sys::cuCtxEnablePeerAccess(peer as sys::CUcontext, 0) };
            if q != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                check(q, "cuCtxEnablePeerAccess").map_err(|e| e.to_string())?;
            }
            g.restore().map_err(|e| e.to_string())?;
        }
        let side = |host: bool, d: i32| if host { "pinned host".to_string() } else { format!("device {d}") };
        let what = format!("{} <-> {}", side(src_host, src_device), side(local_host, r.device));
        Ok(Baseline { other, other_host: src_host, other_device: src_device, local: r.local[0].addr(), ctx, what })
    }

    /// Seconds for `n` copies of `len` bytes in the direction of `op`.
    fn time(&self, op: Op, n: u32, len: u64) -> Result<f64, String> {
        let (dst, src) = if op == Op::Read { (self.local, self.other) } else { (self.other, self.local) };
        let g = ContextGuard::bind(self.ctx).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        for _ in 0..n {
            // SAFETY: both buffers hold `len` bytes and outlive the copies,
            // which are drained below.
            let q = unsafe { sys::cuMemcpyAsync(dst, src, len as usize, std::ptr::null_mut()) };
            check(q, "cuMemcpyAsync (baseline)").map_err(|e| e.to_string())?;
        }
        raw::synchronize_context().map_err(|e| e.to_string())?;
        let secs = t0.elapsed().as_secs_f64();
        g.restore().map_err(|e| e.to_string())?;
        Ok(secs)
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = if self.other_host {
            raw::free_pinned_host(self.other)
        } else {
            raw::free_device(self.other_device, self.other)
        };
    }
}

/// The name the driver gives device `ordinal` (`cuDeviceGetName`).
pub(super) fn device_name(ordinal: i32) -> Result<String, String> {
    let mut d = 0;
    // SAFETY: the driver was probed (main); writes one device handle.
    check(unsafe { sys::cuDeviceGet(&mut d, ordinal) }, "cuDeviceGet").map_err(|e| e.to_string())?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: writes at most name.len() bytes, NUL-terminated, into `name`.
    check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, d) }, "cuDeviceGetName")
        .map_err(|e| e.to_string())?;
    // SAFETY: the driver NUL-terminated it within the buffer.
    Ok(unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
}

/// What `--baseline-gbps` asks for: `Ok(None)` without it; the fixed
/// baseline with the CPU stand-in for the driver (tests/fakecuda names its
/// devices "fakecuda device N"); an error with a real driver, where the
/// baseline is always measured.
pub(super) fn fixed_baseline(args: &[String], device: i32) -> Result<Option<f64>, String> {
    let Some(v) = arg(args, "--baseline-gbps") else { return Ok(None) };
    let gbps: f64 = v.parse().ok().filter(|g: &f64| g.is_finite() && *g > 0.0).ok_or("--baseline-gbps G: G > 0")?;
    let name = device_name(device)?;
    if !name.starts_with("fakecuda device") {
        return Err(format!(
            "--baseline-gbps is for the CPU stand-in for the driver only; device {device} is {name:?}: on a GPU the \
             baseline is measured"
        ));
    }
    Ok(Some(gbps))
}

/// The median of `v` (not empty).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The bandwidth mode: for READ and WRITE, `batch` whole-buffer requests per
/// submission through the (cached) import, against the same copies done
/// plainly, the two interleaved rep by rep so that whatever else the
/// machine does falls on both alike. The ratio is the median of the reps'
/// ratios; GB/s are from the median times. Prints the figures; qualify.py
/// applies the threshold. With `--baseline-gbps` (the stand-in only) the
/// plain copies are not run: each rep's baseline time is what G GB/s would
/// take.
pub(super) fn bandwidth(r: &Req, args: &[String], memory: &str) -> Result<String, String> {
    let reps: u32 = num(args, "--bw-reps", 11);
    let batch: u32 = num(args, "--bw-batch", 16);
    let src_device: i32 = num(args, "--source-device", 0);
    let src_host = arg(args, "--source-memory").as_deref() == Some("host");
    let fixed = fixed_baseline(args, r.device)?;
    let base = Baseline::new(r, src_device, src_host, memory == "host")?;
    let plain_time = |op: Op, n: u32, len: u64| match fixed {
        Some(gbps) => Ok(len as f64 * n as f64 / (gbps * 1e9)),
        None => base.time(op, n, len),
    };
    let (a, len, l0) = (r.remote[0], r.len, r.local[0].addr());
    let mut line = Vec::new();
    for op in [Op::Read, Op::Write] {
        let reqs: Vec<Request> = (0..batch).map(|_| Request { op, local_addr: l0, remote_addr: a, len }).collect();
        r.run(&reqs)?; // warm: opens (and caches) the import
        plain_time(op, batch, len)?;
        let (mut ipc, mut plain, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            let t0 = Instant::now();
            r.run(&reqs)?;
            let t = t0.elapsed().as_secs_f64();
            let b = plain_time(op, batch, len)?;
            ipc.push(t);
            plain.push(b);
            ratio.push(b / t);
        }
        let bytes = len as f64 * batch as f64;
        let (g, b) = (bytes / median(ipc) / 1e9, bytes / median(plain) / 1e9);
        let name = if op == Op::Read { "read" } else { "write" };
        line.push(format!("{name}_gbps={g:.3} {name}_base_gbps={b:.3} {name}_ratio={:.3}", median(ratio)));
    }
    let what = match fixed {
        Some(g) => format!("fixed {g} GB/s (CPU stand-in; {} not timed)", base.what),
        None => base.what.clone(),
    };
    say(&format!("BANDWIDTH {} baseline=\"{what}\"", line.join(" ")));
    Ok(format!("{len} bytes x {batch} per submission, median of {reps}"))
}
