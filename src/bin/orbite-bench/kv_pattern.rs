//! `orbite-bench --pattern kv`: one descriptor-heavy KV transfer, the shape
//! P/D disaggregation produces: a submission of 100 000+ block requests
//! over about a hundred registered regions on each side, consecutive blocks
//! of a sequence contiguous on both sides in runs of 1 to 32 blocks. It
//! reports, separately, the posting time (until `submit` returns) and the
//! end-to-end time (until the batch completes), requests per second, the
//! copies the engine issued (`ipc.<t>.copies_issued`), and the same run's
//! baselines: one contiguous 2-thread memcpy of the same bytes (SHM) or a
//! raw TCP stream (TCP), and the same runs copied by hand with 2 threads
//! (`pattern`: what this machine's memory gives the scattered pattern).
//! Each point runs with coalescing on and off.
//!
//! NVLink and MNNVL (the `cuda` feature) run the same workload on device
//! memory at both ends (device 0): the target's one `allocate_ipc` or
//! `allocate_mnnvl` allocation cut into the regions, the initiator's own
//! device allocation, through a relocation cache (large submissions then
//! move in windows, one native batch each); the baseline is one contiguous
//! device copy of the same bytes, and the posting share is what the
//! descriptor-heavy issue asks of the CUDA paths.
//!
//! The target is this binary again (`--role kv-target`): it allocates
//! `--regions` regions (shared host memory, or device memory with
//! `--target-memory nvlink|mnnvl`), fills each 8-byte word with its offset
//! in the whole allocation (so READs are checked), registers each, prints
//! its endpoint and serves until its stdin closes.

use orbite::{allocate_shared_host, Access, Engine, Op, Request, SubmitOptions, Transport, TransportKind};
use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod baselines;
mod target;

use baselines::{device_copy_gbps, median, memcpy_gbps, runs_memcpy_gbps};
use target::{spawn_target, target, Mem, Target};

pub const HELP: &str = "orbite-bench --pattern kv: one descriptor-heavy KV transfer

usage: orbite-bench --pattern kv [options]
  --transport LIST        shm, tcp, and with the cuda feature nvlink, mnnvl (default shm,tcp)
  --op LIST               read, write (default both)
  --requests N            block requests in the one submission (default 120000)
  --block-size SIZE       bytes per block request (default 8KiB)
  --regions N             registered regions on each side (default 101)
  --run-length MEAN       mean contiguous run, in blocks: lengths 1 to 32, geometric
                          with this mean before the cap (default 4; 1: fully scattered)
  --order shuffled|address  runs in random order (default), or in address order
  --spread K              the target's regions K times larger, each run's offset in
                          its region K times what packed gives (default 1: packed);
                          with --run-length 1 --block-size 4KiB --spread 31 every
                          block lies on its own page, 124 KiB from the next
  --coalesce both|on|off  engine config `coalesce` (default both: a point each)
  --repeat N              measured submissions per point; the median is shown (default 5)
  --seed N                the runs' lengths and order (default 1)
  --config JSON           more keys for the initiator's engine config (default {})
  --json FILE             one JSON object per point, one per line
The first submission of each point (fresh import: page faults on first
touch) is reported apart as `first_ms`. Exit status 1 if any request failed
or a READ brought wrong bytes.
";

/// Longest run, in blocks.
const MAX_RUN: u64 = 32;

/// Whether the command line asks for this workload.
pub fn wanted() -> bool {
    let a: Vec<String> = std::env::args().collect();
    a.windows(2).any(|w| w[0] == "--pattern" && w[1] == "kv")
        || a.windows(2).any(|w| w[0] == "--role" && w[1] == "kv-target")
}

#[derive(Debug, Clone)]
struct KvOpts {
    role: String,
    transports: Vec<String>,
    ops: Vec<Op>,
    requests: u64,
    block_size: u64,
    regions: u64,
    run_length: f64,
    address_order: bool,
    /// Remote room per block (`--spread`): 1 packs the runs.
    spread: u64,
    coalesce: Vec<bool>,
    repeat: usize,
    seed: u64,
    json: Option<String>,
    /// More initiator config keys (a JSON object).
    config: String,
    /// Target: bytes per region.
    region_bytes: u64,
    /// Target: shared host memory ("shm"), or device memory for "nvlink"
    /// or "mnnvl".
    target_memory: String,
}

fn parse() -> KvOpts {
    let mut o = KvOpts {
        role: "initiator".into(),
        transports: Vec::new(),
        ops: Vec::new(),
        requests: 120_000,
        block_size: 8 << 10,
        regions: 101,
        run_length: 4.0,
        address_order: false,
        spread: 1,
        coalesce: vec![true, false],
        repeat: 5,
        seed: 1,
        json: None,
        config: "{}".into(),
        region_bytes: 0,
        target_memory: "shm".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| super::die(&format!("{k} needs a value")));
        let num = |v: String, what: &str| -> u64 {
            v.parse().ok().filter(|n| *n > 0).unwrap_or_else(|| super::die(&format!("{what} takes a positive integer")))
        };
        match k.as_str() {
            "--pattern" => {
                let _ = val();
            }
            "--role" => o.role = val(),
            "--transport" => o.transports.extend(super::list(&val())),
            "--op" => {
                for x in super::list(&val()) {
                    o.ops.push(match x.as_str() {
                        "read" => Op::Read,
                        "write" => Op::Write,
                        other => super::die(&format!("unknown op {other:?} (read, write)")),
                    });
                }
            }
            "--requests" => o.requests = num(val(), "--requests"),
            "--block-size" => o.block_size = super::parse_size(&val()),
            "--regions" => o.regions = num(val(), "--regions"),
            "--run-length" => {
                o.run_length = val()
                    .parse()
                    .ok()
                    .filter(|m: &f64| (1.0..=MAX_RUN as f64).contains(m))
                    .unwrap_or_else(|| super::die("--run-length takes a mean from 1 to 32"))
            }
            "--order" => {
                o.address_order = match val().as_str() {
                    "shuffled" => false,
                    "address" => true,
                    other => super::die(&format!("unknown order {other:?} (shuffled, address)")),
                }
            }
            "--coalesce" => {
                o.coalesce = match val().as_str() {
                    "both" => vec![true, false],
                    "on" => vec![true],
                    "off" => vec![false],
                    other => super::die(&format!("--coalesce both|on|off, not {other:?}")),
                }
            }
            "--repeat" => o.repeat = num(val(), "--repeat") as usize,
            "--spread" => o.spread = num(val(), "--spread").max(1),
            "--seed" => o.seed = num(val(), "--seed"),
            "--json" => o.json = Some(val()),
            "--config" => o.config = val(),
            "--region-bytes" => o.region_bytes = num(val(), "--region-bytes"),
            "--target-memory" => o.target_memory = val(),
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => super::die(&format!("unknown option {other:?} for --pattern kv (see --pattern kv --help)")),
        }
    }
    if o.block_size == 0 || o.block_size % 8 != 0 {
        super::die("--block-size must be a positive multiple of 8 bytes");
    }
    if o.transports.is_empty() {
        o.transports = vec!["shm".into(), "tcp".into()];
    }
    if o.ops.is_empty() {
        o.ops = vec![Op::Read, Op::Write];
    }
    o
}

pub fn main() {
    let o = parse();
    match o.role.as_str() {
        "kv-target" => target(&o),
        "initiator" => initiator(&o),
        other => super::die(&format!("unknown role {other:?}")),
    }
}

/// xorshift64*: the runs' lengths and order, reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

/// A run: `len` blocks at block `remote` of the target's allocation and
/// block `local` of the initiator's.
#[derive(Debug, Clone, Copy)]
struct Run {
    remote: u64,
    local: u64,
    len: u64,
}

/// Blocks per region on each side: room for every request, and for local
/// runs packed whole into regions.
fn blocks_per_region(o: &KvOpts) -> u64 {
    o.requests.div_ceil(o.regions) + MAX_RUN
}

/// The workload: runs over the remote regions (each region cut into runs,
/// no run crossing a region's end), `--requests` blocks in all, then packed
/// whole into the local regions in another random order.
fn plan(o: &KvOpts) -> Vec<Run> {
    let mut rng = Rng(o.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let per = blocks_per_region(o);
    // Geometric lengths with the asked mean, capped at MAX_RUN.
    let p = 1.0 / o.run_length;
    let len_of = |rng: &mut Rng| -> u64 {
        if p >= 1.0 {
            return 1;
        }
        let u = rng.unit().max(f64::MIN_POSITIVE);
        ((u.ln() / (1.0 - p).ln()).floor() as u64 + 1).min(MAX_RUN)
    };
    let mut runs = Vec::new();
    let mut left = o.requests;
    'regions: for r in 0..o.regions {
        let mut at = 0;
        while at < per {
            let len = len_of(&mut rng).min(per - at).min(left);
            runs.push(Run { remote: (r * per + at) * o.spread, local: 0, len });
            at += len;
            left -= len;
            if left == 0 {
                break 'regions;
            }
        }
    }
    assert_eq!(left, 0, "the regions hold every request");
    // Local places: in their own random order, packed into the regions.
    let mut order: Vec<usize> = (0..runs.len()).collect();
    rng.shuffle(&mut order);
    let (mut region, mut at) = (0u64, 0u64);
    for i in order {
        if at + runs[i].len > per {
            (region, at) = (region + 1, 0);
        }
        runs[i].local = region * per + at;
        at += runs[i].len;
    }
    assert!(region < o.regions, "the local regions hold every run");
    if !o.address_order {
        rng.shuffle(&mut runs);
    }
    runs
}

/// One measured point.
#[derive(Debug, Clone, serde::Serialize)]
struct KvPoint {
    transport: String,
    op: String,
    coalesce: bool,
    requests: u64,
    block_size: u64,
    regions: u64,
    runs: u64,
    bytes: u64,
    /// Copies the engine issued per submission (TCP: frames).
    copies_issued: u64,
    /// The first submission, through a fresh import.
    first_ms: f64,
    /// Medians of the measured submissions.
    posting_ms: f64,
    /// The caller's own CPU time in `submit` (its thread's CPU clock): the
    /// poster's work apart from the time it waited for a core.
    posting_cpu_ms: f64,
    end_to_end_ms: f64,
    posting_share: f64,
    gbps: f64,
    requests_per_sec: f64,
    baseline: String,
    baseline_gbps: f64,
    ratio_to_baseline: f64,
    /// The same runs copied by hand, 2 threads: the pattern's ceiling.
    pattern_memcpy_gbps: f64,
    ratio_to_pattern: f64,
    requests_failed: u64,
    wrong_bytes: u64,
}

/// The calling thread's CPU time, in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID
    // needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn initiator(o: &KvOpts) {
    let runs = plan(o);
    let bs = o.block_size;
    let bytes = o.requests * bs;
    let region_bytes = blocks_per_region(o) * bs;
    let total = region_bytes * o.regions;
    // The host side (SHM, TCP): one target and one local allocation for both.
    let mut host: Option<(Target, orbite::Allocation, f64)> = None;
    let mut points = Vec::new();
    for t in &o.transports {
        let kind = match t.as_str() {
            "shm" => TransportKind::Shm,
            "tcp" => TransportKind::Tcp,
            "nvlink" if cfg!(feature = "cuda") => TransportKind::Nvlink,
            "mnnvl" if cfg!(feature = "cuda") => TransportKind::Mnnvl,
            other => super::die(&format!(
                "--pattern kv measures shm, tcp and (built with the cuda feature) nvlink, mnnvl; not {other:?}"
            )),
        };
        let mem = if matches!(kind, TransportKind::Shm | TransportKind::Tcp) { Mem::Host } else { Mem::Device };
        // Device memory: a target of its own, local memory on device 0.
        let mut device: Option<(Target, orbite::Allocation)> = None;
        let (target_endpoint, target_addr, local_addr, pattern_gbps) = match mem {
            Mem::Host => {
                let (target, local, pattern_gbps) = host.get_or_insert_with(|| {
                    let target = spawn_target(o, "shm");
                    let local = allocate_shared_host(total).unwrap_or_else(|e| super::die(&e.to_string()));
                    super::touch(local.addr() as *mut u8, total as usize);
                    let g = runs_memcpy_gbps(&runs, bs, local.addr(), total * o.spread);
                    (target, local, g)
                });
                (target.endpoint.clone(), target.addr, local.addr(), *pattern_gbps)
            }
            Mem::Device => {
                let target = spawn_target(o, t);
                let local = orbite::CudaMemory::allocate(0, total).unwrap_or_else(|e| super::die(&e.to_string()));
                let v = (target.endpoint.clone(), target.addr, local.addr(), 0.0);
                device = Some((target, local));
                v
            }
        };
        let (baseline, baseline_gbps) = match kind {
            TransportKind::Tcp => ("tcp_stream_1MiB".to_string(), super::socket_stream_gbps(1 << 30, 3.0, 1 << 20)),
            TransportKind::Shm => ("memcpy_2_threads".to_string(), memcpy_gbps(bytes)),
            _ => ("cuda_d2d_contiguous".to_string(), device_copy_gbps(bytes)),
        };
        for &coalesce in &o.coalesce {
            let mut cfg = serde_json::json!({
                "coalesce": coalesce,
                "max_inflight_bytes": (bytes * 2).max(1 << 30),
                "max_transfer_bytes": 64 << 20,
            });
            #[cfg(feature = "cuda")]
            if mem == Mem::Device {
                for (k, v) in super::cuda::kv_initiator_keys(t).as_object().expect("object") {
                    cfg[k] = v.clone();
                }
            }
            let more: serde_json::Value = serde_json::from_str(&o.config)
                .ok()
                .filter(serde_json::Value::is_object)
                .unwrap_or_else(|| super::die("--config takes a JSON object"));
            for (k, v) in more.as_object().expect("object") {
                cfg[k] = v.clone();
            }
            let cfg = cfg.to_string();
            let engine = Engine::from_json(&cfg).unwrap_or_else(|e| super::die(&e.to_string()));
            for r in 0..o.regions {
                engine
                    .register_memory(local_addr + r * region_bytes, region_bytes, Access::NONE)
                    .unwrap_or_else(|e| super::die(&e.to_string()));
            }
            let peer = engine.connect(&target_endpoint, None).unwrap_or_else(|e| super::die(&e.to_string()));
            let (local_base, remote_base) = (local_addr, target_addr);
            for &op in &o.ops {
                let reqs: Vec<Request> = runs
                    .iter()
                    .flat_map(|r| {
                        (0..r.len).map(move |k| Request {
                            op,
                            local_addr: local_base + (r.local + k) * bs,
                            remote_addr: remote_base + (r.remote + k) * bs,
                            len: bs,
                        })
                    })
                    .collect();
                let sides = Sides { mem, local: local_base, local_len: total, remote: remote_base };
                let p = point(o, &engine, peer, kind, op, coalesce, &reqs, runs.len() as u64, sides);
                let of = |x: f64| if x > 0.0 { p.gbps / x } else { 0.0 };
                points.push(KvPoint {
                    baseline: baseline.clone(),
                    baseline_gbps,
                    ratio_to_baseline: of(baseline_gbps),
                    pattern_memcpy_gbps: pattern_gbps,
                    ratio_to_pattern: of(pattern_gbps),
                    ..p
                });
            }
            let _ = engine.close(Some(Duration::from_secs(30)));
        }
        drop(device);
    }
    print(&points);
    if let Some(path) = &o.json {
        let mut f = std::fs::File::create(path).unwrap_or_else(|e| super::die(&format!("{path}: {e}")));
        for p in &points {
            writeln!(f, "{}", serde_json::to_string(p).expect("json")).expect("write json");
        }
    }
    if points.iter().any(|p| p.requests_failed > 0 || p.wrong_bytes > 0) {
        std::process::exit(1);
    }
}

/// The memory a point's requests name: where the local blocks live (and
/// the local allocation), and the remote allocation's first byte.
#[derive(Debug, Clone, Copy)]
struct Sides {
    mem: Mem,
    local: u64,
    /// The local allocation's length (read back whole from device memory).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    local_len: u64,
    remote: u64,
}

impl Sides {
    /// Fills every local byte with 0xa5 (before a READ: one that moved
    /// nothing is then seen).
    fn poison(&self, reqs: &[Request]) {
        match self.mem {
            Mem::Host => {
                for r in reqs {
                    // SAFETY: inside the registered local allocation, idle now.
                    unsafe { std::ptr::write_bytes(r.local_addr as *mut u8, 0xa5, 8) };
                }
            }
            Mem::Device => {
                #[cfg(feature = "cuda")]
                super::cuda::write(self.local, &vec![0xa5; self.local_len as usize]).unwrap_or_else(|e| super::die(&e));
            }
        }
    }

    /// The READ blocks whose first or last word is not its remote offset's.
    fn wrong_blocks(&self, reqs: &[Request]) -> u64 {
        let local: Option<Vec<u8>> = match self.mem {
            Mem::Host => None,
            #[cfg(feature = "cuda")]
            Mem::Device => Some(super::cuda::read(self.local, self.local_len).unwrap_or_else(|e| super::die(&e))),
            #[cfg(not(feature = "cuda"))]
            Mem::Device => None,
        };
        let word = |addr: u64| -> u64 {
            match &local {
                Some(bytes) => {
                    let at = (addr - self.local) as usize;
                    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
                }
                // SAFETY: the local range is inside the initiator's
                // registered allocation, alive for the run; the batch has
                // completed.
                None => unsafe { std::ptr::read_unaligned(addr as *const u64) },
            }
        };
        reqs.iter()
            .filter(|r| {
                let off = r.remote_addr - self.remote;
                let last = r.len - 8;
                word(r.local_addr) != off || word(r.local_addr + last) != off + last
            })
            .count() as u64
    }
}

/// The copies issued so far on `kind` (IPC transports), or, for TCP, the
/// requests that moved in the frame of the one before them.
fn copies_issued(engine: &Engine, kind: TransportKind) -> u64 {
    let st = engine.stats();
    match kind {
        TransportKind::Tcp => st.transports[kind.name()].requests_coalesced,
        _ => st.ipc.get(kind.name()).map_or(0, |s| s.imports.copies_issued),
    }
}

#[allow(clippy::too_many_arguments)]
fn point(
    o: &KvOpts,
    engine: &Engine,
    peer: u64,
    kind: TransportKind,
    op: Op,
    coalesce: bool,
    reqs: &[Request],
    runs: u64,
    sides: Sides,
) -> KvPoint {
    let opts = SubmitOptions { transport: Transport::Only(kind), timeout: Some(Duration::from_secs(120)) };
    let (mut posting, mut posting_cpu, mut e2e, mut first) = (Vec::new(), Vec::new(), Vec::new(), 0.0);
    let (mut failed, mut wrong, mut copies) = (0u64, 0u64, 0u64);
    for i in 0..=o.repeat {
        if op == Op::Read {
            // Poison the destinations: a READ that moved nothing is seen.
            sides.poison(reqs);
        }
        let before = copies_issued(engine, kind);
        let (t0, cpu0) = (Instant::now(), thread_cpu_seconds());
        let batch = engine.submit(peer, reqs, opts).unwrap_or_else(|e| super::die(&format!("submit: {e}")));
        let (posted, posted_cpu) = (t0.elapsed().as_secs_f64(), thread_cpu_seconds() - cpu0);
        let res = batch.wait(Duration::from_secs(120));
        let ended = t0.elapsed().as_secs_f64();
        if res.is_err() {
            let results = batch.results();
            let bad: Vec<usize> = (0..results.len()).filter(|&i| results[i].status != orbite::Status::Ok).collect();
            if let Some(e) = bad.first().and_then(|&i| batch.error(i)) {
                eprintln!("{} of {} requests failed; the first: {e}", bad.len(), results.len());
            }
            failed += bad.len() as u64;
        }
        copies = match kind {
            TransportKind::Tcp => reqs.len() as u64 - (copies_issued(engine, kind) - before),
            _ => copies_issued(engine, kind) - before,
        };
        if op == Op::Read {
            wrong += sides.wrong_blocks(reqs);
        }
        if i == 0 {
            first = ended * 1e3;
        } else {
            posting.push(posted * 1e3);
            posting_cpu.push(posted_cpu * 1e3);
            e2e.push(ended * 1e3);
        }
    }
    let (posting_ms, end_to_end_ms) = (median(posting), median(e2e));
    let bytes = reqs.iter().map(|r| r.len).sum::<u64>();
    KvPoint {
        transport: kind.name().to_string(),
        op: super::op_name(op).to_string(),
        coalesce,
        requests: reqs.len() as u64,
        block_size: o.block_size,
        regions: o.regions,
        runs,
        bytes,
        copies_issued: copies,
        first_ms: first,
        posting_ms,
        posting_cpu_ms: median(posting_cpu),
        end_to_end_ms,
        posting_share: posting_ms / end_to_end_ms,
        gbps: bytes as f64 / (end_to_end_ms / 1e3) / 1e9,
        requests_per_sec: reqs.len() as f64 / (end_to_end_ms / 1e3),
        baseline: String::new(),
        baseline_gbps: 0.0,
        ratio_to_baseline: 0.0,
        pattern_memcpy_gbps: 0.0,
        ratio_to_pattern: 0.0,
        requests_failed: failed,
        wrong_bytes: wrong,
    }
}

fn print(points: &[KvPoint]) {
    println!(
        "{:<5} {:<6} {:<8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>8} {:>10} {:>7} {:>7} {:>9} {:<17} {:>7} {:>6} {:>8} {:>6}",
        "tport",
        "op",
        "coalesce",
        "requests",
        "runs",
        "copies",
        "first_ms",
        "post_ms",
        "post_cpu",
        "e2e_ms",
        "post%",
        "GB/s",
        "Mreq/s",
        "baseline",
        "base",
        "ratio",
        "pattern",
        "ratio"
    );
    for p in points {
        println!(
            "{:<5} {:<6} {:<8} {:>8} {:>7} {:>8} {:>9.1} {:>9.2} {:>8.2} {:>10.2} {:>6.1}% {:>7.2} {:>9.2} {:<17} {:>7.2} {:>6.2} {:>8.2} {:>6.2}",
            p.transport,
            p.op,
            p.coalesce,
            p.requests,
            p.runs,
            p.copies_issued,
            p.first_ms,
            p.posting_ms,
            p.posting_cpu_ms,
            p.end_to_end_ms,
            p.posting_share * 100.0,
            p.gbps,
            p.requests_per_sec / 1e6,
            p.baseline,
            p.baseline_gbps,
            p.ratio_to_baseline,
            p.pattern_memcpy_gbps,
            p.ratio_to_pattern
        );
        if p.requests_failed > 0 || p.wrong_bytes > 0 {
            println!("  {} requests failed, {} blocks read wrong", p.requests_failed, p.wrong_bytes);
        }
    }
}
