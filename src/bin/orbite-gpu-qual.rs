//! `orbite-gpu-qual`: the GPU side of the hardware qualification
//! (`tests/hardware/qualify.py` drives it). Built with `--features cuda`.
//!
//! Source role: `orbite-gpu-qual source [--allocs N] [--size BYTES] [--seed S] [--config JSON]
//! [--kind ipc|adopted|mnnvl|egm] [--device D] [--numa N]`
//! allocates `allocate_ipc` device memory on device D (or, `adopted`, one plain `cuMemAlloc`
//! allocation on D holding every buffer as an adopted sub-range; or MNNVL memory on D, or EGM
//! memory on NUMA node N), fills it with a pattern, registers it, prints one JSON line, then obeys
//! stdin commands:
//! `verify I SEED OFF LEN` (allocation I at OFF holds LEN bytes of pattern SEED from 0),
//! `produce I SEED` (a producer stream held at a gate, then rewriting allocation I with pattern
//! SEED, handed to the engine with `record_producer_stream`), `open` (opens every gate),
//! `close_source MS`, `stats`, `close`, `exit`.
//!
//! Requester role: `orbite-gpu-qual requester --endpoint EP --mode MODE --memory device|host|mixed
//! [--seed S] [--device D] [--source-device A] [--source-memory device|host]
//! [--transport nvlink|mnnvl] [--handle posix_fd|fabric] [--fabric-domain HEX] [--egm]
//! [--bw-reps N] [--bw-batch N] [--baseline-gbps G] [--remote-checks]`
//! runs one qualification mode against the source and prints `PASS ...` or `FAIL ...` lines,
//! `WAIT ...` lines where the orchestrator acts (it answers `continue ...`), and, with
//! `--remote-checks`, `CHECK I SEED OFF LEN` lines that the orchestrator answers with the source's
//! `verify` result (the bytes a WRITE left at the source).
//!
//! `--baseline-gbps G` (the bandwidth mode, against the CPU stand-in for the driver only) takes G
//! GB/s as the baseline instead of timing plain copies, so that a test sets the verdict and checks
//! the gate, not the machine's speed; with any other driver the mode fails: on a GPU the baseline
//! is always measured.
//!
//! Topology: `orbite-gpu-qual topology --devices A,B` prints one JSON line: the visible devices
//! and, for A != B, `cuDeviceCanAccessPeer` and the P2P attributes in both directions.

#[path = "orbite-gpu-qual/bandwidth.rs"]
mod bandwidth;
#[path = "common/commands.rs"]
mod commands;
#[path = "orbite-gpu-qual/source.rs"]
mod source;

use cudarc::driver::sys;
use orbite::cuda::driver::{check, primary_context, ContextGuard};
use orbite::cuda::raw::{self, device_to_host, host_to_device};
use orbite::{
    allocate_egm, allocate_mnnvl, allocate_pinned_host, cuda_adopt, Access, Allocation, CudaMemory, Engine, Op,
    Request, SubmitOptions, Transport, TransportKind,
};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use bandwidth::bandwidth;
use source::source;

fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(seed.wrapping_mul(7)).wrapping_add(i >> 12)) as u8
}

fn pattern_vec(seed: u64, len: u64) -> Vec<u8> {
    (0..len).map(|i| pattern(seed, i)).collect()
}

fn die(m: &str) -> ! {
    println!("FAIL setup {m}");
    std::process::exit(1)
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().ok();
}

fn arg(args: &[String], k: &str) -> Option<String> {
    args.iter().position(|a| a == k).and_then(|i| args.get(i + 1).cloned())
}

fn num<T: std::str::FromStr>(args: &[String], k: &str, default: T) -> T {
    arg(args, k).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `cuDeviceCanAccessPeer` and the P2P attributes from `a` to `b`.
fn peer_json(a: i32, b: i32) -> Result<serde_json::Value, String> {
    use sys::CUdevice_P2PAttribute_enum as P;
    let dev = |o: i32| -> Result<sys::CUdevice, String> {
        let mut d = 0;
        // SAFETY: the driver was probed (main); writes one device handle.
        check(unsafe { sys::cuDeviceGet(&mut d, o) }, "cuDeviceGet").map_err(|e| e.to_string())?;
        Ok(d)
    };
    let (da, db) = (dev(a)?, dev(b)?);
    let mut can = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, da, db) }, "cuDeviceCanAccessPeer")
        .map_err(|e| e.to_string())?;
    let attr = |at: P| -> Result<i32, String> {
        let mut v = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDeviceGetP2PAttribute(&mut v, at, da, db) }, "cuDeviceGetP2PAttribute")
            .map_err(|e| e.to_string())?;
        Ok(v)
    };
    Ok(serde_json::json!({
        "from": a, "to": b, "can_access_peer": can,
        "access_supported": attr(P::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)?,
        "native_atomic_supported": attr(P::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)?,
        "performance_rank": attr(P::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
    }))
}

fn topology(args: &[String]) {
    let devices: Vec<i32> =
        arg(args, "--devices").unwrap_or_else(|| "0,0".into()).split(',').filter_map(|x| x.parse().ok()).collect();
    let visible = orbite::cuda::driver::driver().map(|d| d.devices).unwrap_or(0);
    let [a, b] = devices[..] else { die("--devices A,B") };
    if a < 0 || b < 0 || a >= visible || b >= visible {
        die(&format!("devices {a},{b}: {visible} visible"));
    }
    let pairs = if a == b { Ok(vec![]) } else { peer_json(a, b).and_then(|x| Ok(vec![x, peer_json(b, a)?])) };
    match pairs {
        Ok(p) => say(&serde_json::json!({"visible": visible, "devices": [a, b], "pairs": p}).to_string()),
        Err(e) => die(&e),
    }
}

struct Req {
    e: Engine,
    peer: u64,
    remote: Vec<u64>,
    len: u64,
    local: Vec<Allocation>,
    device: i32,
}

static TRANSPORT: std::sync::OnceLock<TransportKind> = std::sync::OnceLock::new();

/// Guard bytes around copied ranges, and their value.
const G: u64 = 4096;
const GUARD: u8 = 0xa5;

/// The transport under qualification (`--transport nvlink|mnnvl`).
fn nv() -> SubmitOptions {
    let t = *TRANSPORT.get().unwrap_or(&TransportKind::Nvlink);
    SubmitOptions { transport: Transport::Only(t), timeout: Some(Duration::from_secs(60)) }
}

impl Req {
    /// Local buffer `i`: device (on `--device`), pinned host, or alternating for "mixed".
    fn new(args: &[String], cfg: &str) -> Req {
        let ep = arg(args, "--endpoint").unwrap_or_else(|| die("--endpoint"));
        let remote: Vec<u64> =
            arg(args, "--remote").unwrap_or_default().split(',').filter_map(|x| x.parse().ok()).collect();
        let len: u64 = num(args, "--len", 8 << 20);
        let device: i32 = num(args, "--device", 0);
        let memory = arg(args, "--memory").unwrap_or_else(|| "device".into());
        let e = Engine::from_json(cfg).unwrap_or_else(|e| die(&e.to_string()));
        let local: Vec<Allocation> = (0..2)
            .map(|i| {
                let host = memory == "host" || (memory == "mixed" && i == 1);
                let a = if host { allocate_pinned_host(len) } else { CudaMemory::allocate(device, len) }
                    .unwrap_or_else(|e| die(&e.to_string()));
                e.register_memory(a.addr(), len, Access::NONE).unwrap_or_else(|e| die(&e.to_string()));
                a
            })
            .collect();
        let peer = e.connect(&ep, None).unwrap_or_else(|x| die(&x.to_string()));
        Req { e, peer, remote, len, local, device }
    }

    fn run(&self, reqs: &[Request]) -> Result<(), String> {
        let b = self.e.submit(self.peer, reqs, nv()).map_err(|x| x.to_string())?;
        b.wait(Duration::from_secs(60)).map_err(|x| format!("{x}: {:?}", b.results()))
    }

    fn fill_local(&self, i: usize, value: u8) -> Result<(), String> {
        host_to_device(self.local[i].addr(), &vec![value; self.len as usize]).map_err(|x| x.to_string())
    }

    fn check_guard(&self, i: usize, off: u64, len: u64) -> Result<(), String> {
        let mut host = vec![0u8; len as usize];
        device_to_host(&mut host, self.local[i].addr() + off).map_err(|x| x.to_string())?;
        match host.iter().position(|b| *b != GUARD) {
            None => Ok(()),
            Some(at) => Err(format!("guard byte {} of local buffer {i} was overwritten", off + at as u64)),
        }
    }

    fn check_local(&self, i: usize, off: u64, len: u64, seed: u64, roff: u64) -> Result<(), String> {
        let mut host = vec![0u8; len as usize];
        device_to_host(&mut host, self.local[i].addr() + off).map_err(|x| x.to_string())?;
        match (0..host.len()).find(|&k| host[k] != pattern(seed, roff + k as u64)) {
            None => Ok(()),
            Some(at) => Err(format!("byte {at} of local buffer {i} is wrong")),
        }
    }
}

static REMOTE_CHECKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// With `--remote-checks` (qualify.py answers them), asks the orchestrator
/// to have the source verify that its allocation `i` at `off` holds `len`
/// bytes of pattern `seed`; without it (a helper run alone), nothing.
fn check_remote(i: usize, seed: u64, off: u64, len: u64) -> Result<(), String> {
    if !REMOTE_CHECKS.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    say(&format!("CHECK {i} {seed} {off} {len}"));
    match wait_continue().as_str() {
        "ok" => Ok(()),
        other => Err(format!("the source's allocation {i} at {off} does not hold the written bytes: {other}")),
    }
}

/// One of several readers of one source allocation (the `readers` mode of
/// qualify.py): READs it through a relocation cache, says `HOLDING` and
/// keeps its READ-only import while the others read too; READs again
/// through the same import; says `WAIT release`, then gives it back.
fn hold_read(r: &Req, seed: u64, stat_key: &str) -> Result<String, String> {
    let (l0, a, len) = (r.local[0].addr(), r.remote[0], r.len);
    r.run(&[rd(l0, a, len)])?;
    r.check_local(0, 0, len, seed, 0)?;
    say("HOLDING");
    wait_continue();
    let t0 = Instant::now();
    r.run(&[rd(l0, a, len)])?;
    let secs = t0.elapsed().as_secs_f64();
    r.check_local(0, 0, len, seed, 0)?;
    let st = &r.e.stats().ipc[stat_key];
    if st.imports.opened != 1 {
        return Err(format!("wanted both READs through one cached import, got {st:?}"));
    }
    say("WAIT release");
    wait_continue();
    r.e.flush_nvlink_cache(None).map_err(|x| x.to_string())?;
    Ok(format!(
        "read twice through one cached READ-only import ({:.2} GB/s), then gave it back",
        len as f64 / secs / 1e9
    ))
}

/// The writer of qualify.py's `readers` mode: says `WRITING`, then WRITEs
/// half of the allocation the readers hold their imports of; the WRITE
/// lands at once beside them (imports of one allocation coexist: nothing
/// waits for another importer), and the source checks the bytes.
fn write_beside(r: &Req) -> Result<String, String> {
    let half = r.len / 2;
    host_to_device(r.local[1].addr(), &pattern_vec(77, half)).map_err(|x| x.to_string())?;
    let w = Request { op: Op::Write, local_addr: r.local[1].addr(), remote_addr: r.remote[0], len: half };
    say("WRITING");
    let t0 = Instant::now();
    r.run(&[w])?;
    let secs = t0.elapsed().as_secs_f64();
    check_remote(0, 77, 0, half)?;
    Ok(format!("landed beside the readers' imports in {:.1} ms", secs * 1e3))
}

/// KV-shaped traffic (issue 34): the allocation as 128 blocks in runs of
/// 1 to 8 blocks, one request per block, one submission each way. READ:
/// remote runs in address order land in local places in reverse run order
/// (each run contiguous on both sides, no two runs contiguous locally), so
/// each run must move as one native copy; every byte is checked. WRITE:
/// pattern 77 from local buffer 1, block for block, checked by the source.
/// Reports each way's posting share (submit return against end to end) and
/// WRITE time over READ time.
fn kv(r: &Req, seed: u64, stat_key: &str) -> Result<String, String> {
    let (l0, l1, a, len) = (r.local[0].addr(), r.local[1].addr(), r.remote[0], r.len);
    let block = len / 128;
    // Runs 1..=8 blocks (cycling), covering the 128 blocks.
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let (mut at, mut n) = (0u64, 1u64);
    while at < 128 {
        let take = n.min(128 - at);
        runs.push((at, take));
        at += take;
        n = n % 8 + 1;
    }
    // Local places: the runs packed in reverse order.
    let mut place = vec![0u64; runs.len()];
    let mut next = 0;
    for (i, &(_, n)) in runs.iter().enumerate().rev() {
        place[i] = next;
        next += n;
    }
    let copies = || r.e.stats().ipc[stat_key].imports.copies_issued;
    let timed = |reqs: &[Request]| -> Result<(f64, f64), String> {
        let t0 = Instant::now();
        let b = r.e.submit(r.peer, reqs, nv()).map_err(|x| x.to_string())?;
        let posted = t0.elapsed().as_secs_f64();
        b.wait(Duration::from_secs(60)).map_err(|x| format!("{x}: {:?}", b.results()))?;
        Ok((posted, t0.elapsed().as_secs_f64()))
    };
    let reads: Vec<Request> = runs
        .iter()
        .zip(&place)
        .flat_map(|(&(s, n), &p)| (0..n).map(move |k| rd(l0 + (p + k) * block, a + (s + k) * block, block)))
        .collect();
    let c0 = copies();
    let (read_post, read_all) = timed(&reads)?;
    let read_copies = copies() - c0;
    for (&(s, n), &p) in runs.iter().zip(&place) {
        r.check_local(0, p * block, n * block, seed, s * block)?;
    }
    host_to_device(l1, &pattern_vec(77, len)).map_err(|x| x.to_string())?;
    let writes: Vec<Request> = runs
        .iter()
        .flat_map(|&(s, n)| {
            (0..n).map(move |k| Request {
                op: Op::Write,
                local_addr: l1 + (s + k) * block,
                remote_addr: a + (s + k) * block,
                len: block,
            })
        })
        .collect();
    let c1 = copies();
    let (write_post, write_all) = timed(&writes)?;
    let write_copies = copies() - c1;
    check_remote(0, 77, 0, len)?;
    // The WRITE runs follow each other on both sides: one copy for all.
    if read_copies != runs.len() as u64 || write_copies != 1 {
        return Err(format!(
            "{} READ runs issued {read_copies} copies, the contiguous WRITE {write_copies} (want {} and 1)",
            runs.len(),
            runs.len()
        ));
    }
    Ok(format!(
        "{} requests of {block} bytes in {} runs: {read_copies} READ copies, {write_copies} WRITE copy; posting \
         {:.0}% of {:.2} ms (READ), {:.0}% of {:.2} ms (WRITE); write_read_ratio={:.2}",
        reads.len(),
        runs.len(),
        read_post / read_all * 100.0,
        read_all * 1e3,
        write_post / write_all * 100.0,
        write_all * 1e3,
        write_all / read_all
    ))
}

/// The `producer` mode: the source has handed its stack's producer stream
/// over, held at a gate, that rewrites the allocation with pattern `seed`.
/// Says `READING`, READs the whole allocation (the source's answer waits
/// for the producer: qualify.py opens the gate only once it saw the wait
/// begin and this READ still unanswered), then checks every byte is the
/// producer's.
fn producer(r: &Req, seed: u64) -> Result<String, String> {
    let (l0, a, len) = (r.local[0].addr(), r.remote[0], r.len);
    r.fill_local(0, GUARD)?;
    say("READING");
    let t0 = Instant::now();
    r.run(&[rd(l0, a, len)])?;
    let secs = t0.elapsed().as_secs_f64();
    r.check_local(0, 0, len, seed, 0)?;
    Ok(format!("{len} bytes read after the producer stream ran ({:.0} ms after the READ was submitted)", secs * 1e3))
}

/// The `no-p2p` mode (`--devices A,B` with no peer path between A and B):
/// a READ into memory on B of the source's allocation on A is refused
/// NOT_SUPPORTED before anything is posted (effect NONE, the local bytes
/// untouched, the engine's message naming the missing path), and the same
/// READ into memory on A, which reaches it, moves every byte.
fn no_p2p(r: &Req, source_device: i32, seed: u64) -> Result<String, String> {
    let (l0, a, len) = (r.local[0].addr(), r.remote[0], r.len);
    if r.device == source_device {
        return Err(format!("--device and --source-device are both {source_device}: the mode needs two GPUs"));
    }
    r.fill_local(0, GUARD)?;
    let b = r.e.submit(r.peer, &[rd(l0, a, len)], nv()).map_err(|x| x.to_string())?;
    let why = match b.wait(Duration::from_secs(60)) {
        Ok(()) => {
            return Err(format!(
                "a READ into GPU {} of memory on GPU {source_device}, which it has no path to, succeeded",
                r.device
            ))
        }
        Err(x) => x.message().to_string(),
    };
    let want =
        vec![orbite::RequestResult { status: orbite::Status::NotSupported, remote_effect: orbite::RemoteEffect::None }];
    if b.results() != want {
        return Err(format!(
            "the READ without a path ended {:?} ({why}); want NOT_SUPPORTED, effect NONE",
            b.results()
        ));
    }
    r.check_guard(0, 0, len)?;
    let near = CudaMemory::allocate(source_device, len).map_err(|x| x.to_string())?;
    r.e.register_memory(near.addr(), len, Access::NONE).map_err(|x| x.to_string())?;
    r.run(&[rd(near.addr(), a, len)])?;
    let mut host = vec![0u8; len as usize];
    device_to_host(&mut host, near.addr()).map_err(|x| x.to_string())?;
    if let Some(at) = (0..host.len()).find(|&k| host[k] != pattern(seed, k as u64)) {
        return Err(format!("byte {at} read into GPU {source_device} is wrong"));
    }
    Ok(format!("GPU {} refused NOT_SUPPORTED before posting ({why}); GPU {source_device} read {len} bytes", r.device))
}

fn rd(local: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Read, local_addr: local, remote_addr: remote, len }
}

fn result(mode: &str, r: Result<String, String>) {
    match r {
        Ok(detail) => say(&format!("PASS {mode} {detail}")),
        Err(why) => {
            say(&format!("FAIL {mode} {why}"));
            std::process::exit(1)
        }
    }
}

fn wait_continue() -> String {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).ok();
    line.trim().to_string()
}

fn requester(args: &[String]) {
    let mode = arg(args, "--mode").unwrap_or_else(|| die("--mode"));
    let seed: u64 = num(args, "--seed", 1);
    REMOTE_CHECKS.store(args.iter().any(|a| a == "--remote-checks"), std::sync::atomic::Ordering::Relaxed);
    let cache =
        matches!(mode.as_str(), "cache" | "source-close" | "requester-exit" | "stale" | "bandwidth" | "hold-read");
    let transport = arg(args, "--transport").unwrap_or_else(|| "nvlink".into());
    let memory = arg(args, "--memory").unwrap_or_else(|| "device".into());
    let entries = if cache { 4 } else { 0 };
    let cfg = if transport == "mnnvl" {
        let handle = arg(args, "--handle").unwrap_or_else(|| "posix_fd".into());
        let domain = arg(args, "--fabric-domain").map(|d| format!(r#", "fabric_domain": "{d}""#)).unwrap_or_default();
        let egm = if args.iter().any(|a| a == "--egm") { r#", "egm": true"# } else { "" };
        let _ = TRANSPORT.set(TransportKind::Mnnvl);
        format!(r#"{{"mnnvl": {{"handle_type": "{handle}"{domain}{egm}}}, "nvlink_cache_entries": {entries}}}"#)
    } else {
        format!(r#"{{"nvlink": true, "nvlink_cache_entries": {entries}}}"#)
    };
    let r = Req::new(args, &cfg);
    let stat_key = if transport == "mnnvl" { "mnnvl" } else { "nvlink" };
    let (a, len) = (r.remote[0], r.len);
    let l0 = r.local[0].addr();
    match mode.as_str() {
        "healthy" => result(
            &mode,
            (|| {
                // A guarded READ: the bytes around the copied range keep
                // their guard value.
                r.fill_local(0, GUARD)?;
                r.run(&[rd(l0 + G, a + G, len - 2 * G)])?;
                r.check_local(0, G, len - 2 * G, seed, G)?;
                r.check_guard(0, 0, G)?;
                r.check_guard(0, len - G, G)?;
                r.run(&[rd(l0, a, len)])?;
                r.check_local(0, 0, len, seed, 0)?;
                // WRITE local[0] (now the source pattern) shifted into the
                // second half, stopping G bytes short of the end: the source
                // checks the written bytes; then read the half back: the
                // written bytes, then the untouched tail.
                let w = Request { op: Op::Write, local_addr: l0, remote_addr: a + len / 2, len: len / 2 - G };
                r.run(&[w])?;
                check_remote(0, seed, len / 2, len / 2 - G)?;
                r.run(&[rd(r.local[1].addr(), a + len / 2, len / 2)])?;
                r.check_local(1, 0, len / 2 - G, seed, 0)?;
                r.check_local(1, len / 2 - G, G, seed, len - G)?;
                Ok(format!("{len} bytes read and written, guard bytes intact"))
            })(),
        ),
        "batch" => result(
            &mode,
            (|| {
                let b = *r.remote.get(1).ok_or("the batch mode needs two source allocations")?;
                let s = len / 4;
                r.run(&[rd(l0, a + 2 * s, s), rd(l0 + s, a, s), rd(l0 + 2 * s, b + s, s)])?;
                r.check_local(0, 0, s, seed, 2 * s)?;
                r.check_local(0, s, s, seed, 0)?;
                r.check_local(0, 2 * s, s, seed + 1, s)?;
                let st = r.e.stats();
                Ok(format!("3 slices, {} imports", st.ipc[stat_key].imports.opened))
            })(),
        ),
        "cache" => result(
            &mode,
            (|| {
                let s = len / 8;
                // The WRITE's bytes: pattern 77, checked by the source below.
                host_to_device(r.local[1].addr(), &pattern_vec(77, len)).map_err(|x| x.to_string())?;
                std::thread::scope(|sc| -> Result<(), String> {
                    let hs: Vec<_> = (0..4u64)
                        .map(|t| {
                            let r = &r;
                            sc.spawn(move || r.run(&[rd(l0 + t * s, a + t * s, s)]))
                        })
                        .collect();
                    let w = Request { op: Op::Write, local_addr: r.local[1].addr(), remote_addr: a + 6 * s, len: s };
                    r.run(&[w])?;
                    for h in hs {
                        h.join().map_err(|_| "thread panicked")??;
                    }
                    Ok(())
                })?;
                for t in 0..4 {
                    r.check_local(0, t * s, s, seed, t * s)?;
                }
                check_remote(0, 77, 6 * s, s)?;
                r.e.flush_nvlink_cache(None).map_err(|x| x.to_string())?;
                // The READs share a READ-only import and the WRITE has a
                // writable one (which READs after it use too): fewer imports
                // than groups, each closed once by the flush.
                let st = &r.e.stats().ipc[stat_key];
                if st.imports.opened != st.imports.closed || !(1..5).contains(&st.imports.opened) {
                    return Err(format!("wanted fewer imports than the 5 groups, each closed once, got {st:?}"));
                }
                Ok(format!(
                    "4 READs + 1 WRITE (bytes checked by the source) through {} cached import(s), closed once each",
                    st.imports.opened
                ))
            })(),
        ),
        "source-close" | "requester-exit" | "stale" => {
            let cached = r.run(&[rd(l0, a, len)]).and_then(|_| r.check_local(0, 0, len, seed, 0));
            if let Err(why) = cached {
                result(&mode, Err(why));
            }
            say(&format!("WAIT {mode}"));
            let cmd = wait_continue();
            match mode.as_str() {
                "requester-exit" => std::process::exit(0),
                "source-close" => {
                    // The source closed with our import out: it revoked it,
                    // and this live requester gave it back on its own (the
                    // source's close returned on the receipt; the requester
                    // counts the close once the receipt's ACK is back).
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let verdict = loop {
                        let st = r.e.stats().ipc[stat_key].clone();
                        match (st.imports.cached, st.imports.retained, st.imports.closed) {
                            (0, 0, 1) => break Ok("revoked by the closing source and given back".into()),
                            _ if Instant::now() >= deadline => {
                                break Err(format!("the revoked import was not given back: {st:?}"))
                            }
                            _ => std::thread::sleep(Duration::from_millis(5)),
                        }
                    };
                    result(&mode, verdict);
                }
                _ => {
                    // The source was restarted on the same endpoint.
                    let old = r.run(&[rd(l0, a, 16)]);
                    let new_remote: u64 = cmd.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
                    let ep = arg(args, "--endpoint").unwrap_or_default();
                    let verdict = match old {
                        Ok(()) => Err("a request to the stale peer succeeded".to_string()),
                        Err(_) => r.e.connect(&ep, None).map_err(|x| x.to_string()).and_then(|p2| {
                            let b = r.e.submit(p2, &[rd(l0, new_remote, len)], nv()).map_err(|x| x.to_string())?;
                            b.wait(Duration::from_secs(60)).map_err(|x| x.to_string())?;
                            r.check_local(0, 0, len, seed + 10, 0)
                                .map(|_| "stale peer refused, new identity served".into())
                        }),
                    };
                    result(&mode, verdict);
                }
            }
        }
        "hold-read" => result(&mode, hold_read(&r, seed, stat_key)),
        "write-beside" => result(&mode, write_beside(&r)),
        "bandwidth" => result(&mode, bandwidth(&r, args, &memory)),
        "kv" => result(&mode, kv(&r, seed, stat_key)),
        "producer" => result(&mode, producer(&r, seed)),
        "no-p2p" => result(&mode, no_p2p(&r, num(args, "--source-device", 0), seed)),
        other => die(&format!("unknown mode {other}")),
    }
    let _ = r.e.close(Some(Duration::from_secs(30)));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(why) = orbite::cuda::unavailable_reason() {
        die(&format!("no usable CUDA: {why}"));
    }
    match args.first().map(String::as_str) {
        Some("source") => source(&args),
        Some("requester") => requester(&args),
        Some("topology") => topology(&args),
        _ => die("usage: orbite-gpu-qual source|requester|topology ..."),
    }
}
