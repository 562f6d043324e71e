//! The KV pattern's baselines: one contiguous 2-thread memcpy of the same
//! bytes, the same runs copied by hand with 2 threads (what this machine's
//! memory gives the scattered pattern), and one contiguous device copy.

use super::*;

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One 2-thread memcpy of `bytes` between two fresh buffers (faulted in
/// first): the best of 3, GB/s.
pub(super) fn memcpy_gbps(bytes: u64) -> f64 {
    let n = bytes as usize;
    let src = vec![7u8; n];
    let mut dst = vec![0u8; n];
    let at = dst.as_mut_ptr() as usize;
    let gbps = best_of_3_gbps(bytes, |half| {
        let (from, len) = if half == 0 { (0, n / 2) } else { (n / 2, n - n / 2) };
        // SAFETY: each half writes its own disjoint part of `dst`, which
        // outlives the threads; nothing reads it meanwhile.
        let d = unsafe { std::slice::from_raw_parts_mut((at + from) as *mut u8, len) };
        d.copy_from_slice(&src[from..from + len]);
    });
    std::hint::black_box(&mut dst);
    gbps
}

/// Runs `copy(0)` and `copy(1)` (the two halves of a copy of `bytes`) on
/// two threads at once, three times: the best rate, GB/s.
pub(super) fn best_of_3_gbps(bytes: u64, copy: impl Fn(usize) + Sync) -> f64 {
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| copy(0));
            copy(1);
        });
        best = best.max(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// The same runs copied by hand with 2 threads, from a private buffer of
/// the remote layout into the local allocation: what the memory system
/// gives this scattered pattern (the ceiling an engine could reach),
/// best of 3, GB/s.
pub(super) fn runs_memcpy_gbps(runs: &[Run], bs: u64, local: u64, remote_len: u64) -> f64 {
    let src = vec![3u8; remote_len as usize];
    let half = runs.len() / 2;
    let copy = |part: &[Run]| {
        for r in part {
            let (from, len) = ((r.remote * bs) as usize, (r.len * bs) as usize);
            // SAFETY: the local allocation holds every run's local range
            // (the plan packs them into its regions); nothing else uses it now.
            let dst = unsafe { std::slice::from_raw_parts_mut((local + r.local * bs) as *mut u8, len) };
            dst.copy_from_slice(&src[from..from + len]);
        }
    };
    let bytes: u64 = runs.iter().map(|r| r.len * bs).sum();
    best_of_3_gbps(bytes, |part| copy(if part == 0 { &runs[..half] } else { &runs[half..] }))
}

/// One contiguous device copy of `bytes` (the CUDA paths' baseline).
pub(super) fn device_copy_gbps(bytes: u64) -> f64 {
    #[cfg(feature = "cuda")]
    return crate::cuda::contiguous_copy_gbps(bytes).unwrap_or_else(|e| crate::die(&e));
    #[cfg(not(feature = "cuda"))]
    crate::die(&format!("a device copy of {bytes} bytes needs the cuda feature"))
}
