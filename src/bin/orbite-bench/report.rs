//! What `orbite-bench` reports: one measured [`Point`], the percentiles of
//! its latencies, sizes and operations in words, and the table printed at
//! the end of a sweep.

use super::*;

/// One measured point.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Point {
    pub transport: String,
    /// The initiator's memory: `shared_host` (TCP, SHM), `foreign` (memory
    /// from malloc on both sides: TCP, CMA), or `device`, `host`, `mixed`
    /// (NVLink, MNNVL: the target serves device memory).
    pub memory: String,
    pub op: String,
    pub block_size: u64,
    pub batch_size: usize,
    pub threads: usize,
    /// Initiator processes reading the target at once (1: this process).
    pub readers: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub baseline: String,
    pub baseline_gbps: f64,
    /// Throughput points: gbps / baseline_gbps. Latency points
    /// (`--latency`): p50 / baseline_p50_us (lower is better).
    pub ratio_to_baseline: f64,
    /// Latency points: the raw ping-pong's round trip, p50 and p99.
    pub baseline_p50_us: f64,
    pub baseline_p99_us: f64,
    pub requests_failed: u64,
    /// Sources the point's batches were spread over (`--peers`).
    pub peers: usize,
}

pub(super) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

pub(super) fn fmt_size(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

pub(super) fn op_name(op: Op) -> &'static str {
    match op {
        Op::Read => "read",
        Op::Write => "write",
    }
}

pub(super) fn print_table(points: &[Point]) {
    println!(
        "{:<8} {:<11} {:<6} {:>8} {:>5} {:>4} {:>4} {:>9} {:>12} {:>10} {:>10} {:>15} {:>9} {:>6}",
        "transp",
        "memory",
        "op",
        "block",
        "batch",
        "thr",
        "rdrs",
        "GB/s",
        "req/s",
        "p50 us",
        "p99 us",
        "baseline",
        "base GB/s",
        "ratio"
    );
    for p in points {
        println!(
            "{:<8} {:<11} {:<6} {:>8} {:>5} {:>4} {:>4} {:>9.3} {:>12.0} {:>10.1} {:>10.1} {:>15} {:>9.3} {:>6.2}{}",
            p.transport,
            p.memory,
            p.op,
            fmt_size(p.block_size),
            p.batch_size,
            p.threads,
            p.readers,
            p.gbps,
            p.ops_per_sec,
            p.p50_us,
            p.p99_us,
            p.baseline,
            p.baseline_gbps,
            p.ratio_to_baseline,
            match (p.requests_failed, p.peers) {
                (0, 1) => String::new(),
                (0, n) => format!("  ({n} peers)"),
                (f, 1) => format!("  ({f} failed)"),
                (f, n) => format!("  ({f} failed, {n} peers)"),
            }
        );
    }
}
