//! `orbite-bench`: measures OrbiTE transports and, in the same run, the
//! baselines a reader needs to judge the figures (single-thread memcpy over
//! the same working set for SHM; a plain TCP socket stream between two
//! processes on loopback for TCP; plain device-to-device (or pinned host to
//! device) CUDA copies for NVLink and MNNVL, which move device memory on
//! both sides and need the `cuda` feature).
//!
//! With no arguments it starts its own target process on loopback and
//! measures every transport available on this machine. `--mode target` and
//! `--mode initiator --endpoint IP:PORT` run the two sides on different
//! hosts. `--help` lists every option.

#[cfg(feature = "cuda")]
mod cuda;
mod kv_flow;
mod kv_pattern;
mod plot;

use orbite::{allocate_shared_host, Access, Engine, Op, Request, SubmitOptions, Transport, TransportKind};
use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const HELP: &str = "orbite-bench: throughput and latency of OrbiTE transports, with baselines

usage: orbite-bench [options]
  --mode auto|target|initiator|kv-flow
                                 auto (default): start a target on loopback and measure;
                                 target: serve a buffer and print its endpoint;
                                 initiator: measure against --endpoint;
                                 kv-flow: the multi-process KV pool flow, one prefill and
                                 N decodes (options: --mode kv-flow --help)
  --endpoint IP:PORT             the target (initiator mode)
  --auth-key FILE                both engines use this auth_key_file (TCP then sealed)
  --wire-security integrity|encrypt
                                 with --auth-key: what the sealing protects (default integrity)
  --name NAME --etcd URL          target: publish under NAME in etcd (discovery); initiator:
                                 find the target by NAME instead of --endpoint
  --listen IP:PORT               where a target listens (default 127.0.0.1:0)
  --transport LIST               tcp, shm, cma, nvlink, mnnvl, auto (repeatable or comma list;
                                 default: every transport available here). nvlink and mnnvl
                                 move device memory and need a build with the cuda feature
  --memory device|host|mixed|foreign
                                 NVLink/MNNVL: the initiator's memory (device memory, pinned
                                 host memory, or both alternately; default device); the
                                 target always serves device memory. foreign: both sides
                                 register memory from malloc, which tcp, cma and auto move
                                 (default transports then tcp, shm, cma; shm moves its own
                                 shared memory beside them, for comparison). Each cma point
                                 is followed by cma_raw: process_vm_readv/writev alone, one
                                 thread, the same blocks (what the kernel gives one caller),
                                 and cma_raw_par: the same calls, each batch split over as
                                 many threads as the copy pool copies with (the kernel's
                                 limit for the pool; absent on one core)
  --devices A,B                  NVLink/MNNVL: the target's device and the initiator's (default 0,0)
  --op LIST                      read, write (default both)
  --block-size LIST              sizes with B/KiB/MiB/GiB suffixes (default 4KiB,64KiB,1MiB,8MiB)
  --batch-size N                 requests per submission (default 16; up to 1048576 as one submit)
  --pattern seq|random|kv        remote blocks in address order (default), or distinct blocks
                                 scattered over the working set (KV-cache shaped); kv: one
                                 descriptor-heavy submission over many regions, contiguous
                                 runs coalesced or not (options: --pattern kv --help)
  --latency                      latency mode: batch 1, p50/p99 against a raw ping-pong in the
                                 same run (a Unix socket pair for shm, TCP loopback for tcp)
  --notify                       also measure notifications: each WRITE point again with a
                                 notification per batch (op write+n; baseline: the same point
                                 without, ratio of p50s), and standalone notifications per
                                 second (op notify) against the raw ping-pong
  --direct                       SHM, NVLink, MNNVL: copy each request through a direct route
                                 (orbite_direct_copy, on the thread, no batch) instead of
                                 submitting batches; --batch-size requests per timed round
  --threads N                    submitting threads (default 1)
  --readers N                    also measure READ with N initiator processes at once, each with
                                 its own engine and cache, all reading the one target buffer
                                 (the aggregate of the N; default 1: no such points)
  --peers N                      TCP, SHM: N target processes, one engine connected to all,
                                 batches spread over them (aggregate GB/s, p99 per batch)
  --duration SECONDS             time per point (default 3)
  --buffer-size SIZE             working set on each side, blocks rotate over it (default 1GiB)
  --json FILE                    one JSON object per point, one per line
  --plot FILE.svg                throughput against block size, baselines dashed
  --no-baseline                  skip the baselines
";

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

#[derive(Debug, Clone)]
struct Opts {
    mode: String,
    endpoint: Option<String>,
    /// `--name`: the target's engine name (discovery through `--etcd`).
    name: Option<String>,
    etcd: Option<String>,
    /// `--auth-key`: both engines authenticate with this key file (and
    /// seal their TCP connections).
    auth_key: Option<String>,
    /// `--wire-security`: what sealing protects (with `--auth-key`).
    wire_security: Option<String>,
    listen: String,
    transports: Vec<String>,
    ops: Vec<Op>,
    block_sizes: Vec<u64>,
    batch: usize,
    threads: usize,
    readers: usize,
    peers: usize,
    random: bool,
    latency: bool,
    notify: bool,
    /// `--direct`: copies through direct routes instead of batches.
    direct: bool,
    duration: f64,
    buffer_size: u64,
    json: Option<String>,
    plot: Option<String>,
    baselines: bool,
    memory: String,
    devices: (i32, i32),
    // internal: the socket-baseline child and the spawned target
    connect: Option<String>,
    until_stdin_closes: bool,
    target_kind: String,
}

fn die(msg: &str) -> ! {
    eprintln!("orbite-bench: {msg}");
    std::process::exit(2)
}

fn parse_size(s: &str) -> u64 {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mul) = [
        ("gib", 1u64 << 30),
        ("mib", 1 << 20),
        ("kib", 1 << 10),
        ("g", 1 << 30),
        ("m", 1 << 20),
        ("k", 1 << 10),
        ("b", 1),
    ]
    .iter()
    .find(|(suf, _)| lower.ends_with(suf))
    .map(|(suf, m)| (&t[..t.len() - suf.len()], *m))
    .unwrap_or((t, 1));
    let n: u64 = num.trim().parse().unwrap_or_else(|_| die(&format!("bad size {s:?} (e.g. 4KiB, 1MiB)")));
    if n == 0 {
        die(&format!("size {s:?} is zero"));
    }
    n * mul
}

fn list(v: &str) -> Vec<String> {
    v.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect()
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        mode: "auto".into(),
        endpoint: None,
        name: None,
        etcd: None,
        auth_key: None,
        wire_security: None,
        listen: "127.0.0.1:0".into(),
        transports: Vec::new(),
        ops: Vec::new(),
        block_sizes: Vec::new(),
        batch: 16,
        threads: 1,
        readers: 1,
        peers: 1,
        random: false,
        latency: false,
        notify: false,
        direct: false,
        duration: 3.0,
        buffer_size: 1 << 30,
        json: None,
        plot: None,
        baselines: true,
        memory: "device".into(),
        devices: (0, 0),
        connect: None,
        until_stdin_closes: false,
        target_kind: "host".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| die(&format!("{k} needs a value")));
        match k.as_str() {
            "--mode" => o.mode = val(),
            "--endpoint" => o.endpoint = Some(val()),
            "--name" => o.name = Some(val()),
            "--etcd" => o.etcd = Some(val()),
            "--auth-key" => o.auth_key = Some(val()),
            "--wire-security" => o.wire_security = Some(val()),
            "--listen" => o.listen = val(),
            "--transport" => o.transports.extend(list(&val())),
            "--op" => {
                for x in list(&val()) {
                    o.ops.push(match x.as_str() {
                        "read" => Op::Read,
                        "write" => Op::Write,
                        _ => die(&format!("unknown op {x:?} (read, write)")),
                    })
                }
            }
            "--block-size" => o.block_sizes.extend(list(&val()).iter().map(|s| parse_size(s))),
            "--batch-size" => o.batch = val().parse().unwrap_or_else(|_| die("--batch-size N")),
            "--threads" => o.threads = val().parse().unwrap_or_else(|_| die("--threads N")),
            "--readers" => o.readers = val().parse().unwrap_or_else(|_| die("--readers N")),
            "--peers" => o.peers = val().parse().unwrap_or_else(|_| die("--peers N")),
            "--pattern" => {
                o.random = match val().as_str() {
                    "seq" => false,
                    "random" => true,
                    other => die(&format!("unknown pattern {other:?} (seq, random)")),
                }
            }
            "--latency" => o.latency = true,
            "--notify" => o.notify = true,
            "--direct" => o.direct = true,
            "--duration" => o.duration = val().parse().unwrap_or_else(|_| die("--duration SECONDS")),
            "--buffer-size" => o.buffer_size = parse_size(&val()),
            "--json" => o.json = Some(val()),
            "--plot" => o.plot = Some(val()),
            "--no-baseline" => o.baselines = false,
            "--memory" => o.memory = val(),
            "--devices" => {
                let v = val();
                let d: Vec<i32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
                let [a, b] = d[..] else { die(&format!("--devices A,B, not {v:?}")) };
                o.devices = (a, b);
            }
            "--target-kind" => o.target_kind = val(),
            "--connect" => o.connect = Some(val()),
            "--until-stdin-closes" => o.until_stdin_closes = true,
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0)
            }
            other => die(&format!("unknown option {other:?} (see --help)")),
        }
    }
    for t in &o.transports {
        if !["tcp", "shm", "cma", "nvlink", "mnnvl", "auto"].contains(&t.as_str()) {
            die(&format!("unknown transport {t:?} (tcp, shm, cma, nvlink, mnnvl, auto)"));
        }
    }
    if !["device", "host", "mixed", "foreign"].contains(&o.memory.as_str()) {
        die(&format!("unknown memory {:?} (device, host, mixed, foreign)", o.memory));
    }
    if o.ops.is_empty() {
        o.ops = vec![Op::Read, Op::Write];
    }
    if o.block_sizes.is_empty() {
        o.block_sizes = vec![4 << 10, 64 << 10, 1 << 20, 8 << 20];
    }
    if o.batch == 0 || o.threads == 0 || o.readers == 0 || o.duration <= 0.0 {
        die("--batch-size, --threads, --readers and --duration must be positive");
    }
    if o.batch > 1 << 20 {
        die("--batch-size is at most 1048576");
    }
    if o.latency {
        o.batch = 1;
    }
    o
}

/// Fills (and so faults in) a buffer.
fn touch(p: *mut u8, len: usize) {
    // SAFETY: callers pass memory they own of at least `len` bytes.
    let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
    for (i, b) in s.iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
}

/// Why NVLink and MNNVL cannot be measured by this build.
#[cfg_attr(feature = "cuda", allow(dead_code))]
const NO_CUDA_BUILD: &str =
    "NVLink and MNNVL need orbite-bench built with the cuda feature (cargo build --release --features cuda)";

fn is_cuda_transport(t: &str) -> bool {
    t == "nvlink" || t == "mnnvl"
}

/// Memory from the C library's `malloc`, as an application allocates its
/// own buffers (`--memory foreign`), touched once; freed when dropped.
struct Foreign {
    addr: u64,
}

impl Foreign {
    fn new(len: u64) -> Foreign {
        // SAFETY: malloc of `len` bytes; checked below.
        let p = unsafe { libc::malloc(len as usize) };
        if p.is_null() {
            die(&format!("malloc of {len} bytes failed"));
        }
        touch(p.cast(), len as usize);
        Foreign { addr: p as u64 }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        // SAFETY: the pointer malloc returned in `new`, freed once; its
        // registration ended with its engine, before this drop.
        unsafe { libc::free(self.addr as *mut libc::c_void) };
    }
}

/// What keeps a target's memory alive.
enum Served {
    Allocation(orbite::Allocation),
    Foreign(Foreign),
}

impl Served {
    fn addr(&self) -> u64 {
        match self {
            Served::Allocation(a) => a.addr(),
            Served::Foreign(f) => f.addr,
        }
    }
}

/// The target's engine and the memory it serves: shared host memory, memory
/// from malloc (`--target-kind foreign`), or (`--target-kind nvlink|mnnvl`)
/// device memory on the first of `--devices`.
fn target_memory(o: &Opts) -> (Engine, Served) {
    if is_cuda_transport(&o.target_kind) {
        #[cfg(feature = "cuda")]
        return cuda::target(&o.target_kind, &o.listen, o.devices.0, o.buffer_size, &engine_keys(o, None))
            .map(|(e, a)| (e, Served::Allocation(a)))
            .unwrap_or_else(|e| die(&e));
        #[cfg(not(feature = "cuda"))]
        die(NO_CUDA_BUILD);
    }
    let engine = Engine::from_json(&format!(r#"{{"listen": "{}"{}}}"#, o.listen, engine_keys(o, None)))
        .unwrap_or_else(|e| die(&e.to_string()));
    let served = match o.target_kind.as_str() {
        "foreign" => Served::Foreign(Foreign::new(o.buffer_size)),
        _ => {
            let alloc = allocate_shared_host(o.buffer_size).unwrap_or_else(|e| die(&e.to_string()));
            touch(alloc.addr() as *mut u8, o.buffer_size as usize);
            Served::Allocation(alloc)
        }
    };
    engine.register_memory(served.addr(), o.buffer_size, Access::READ_WRITE).unwrap_or_else(|e| die(&e.to_string()));
    (engine, served)
}

fn run_target(o: &Opts) {
    let (engine, alloc) = target_memory(o);
    println!(
        "{}",
        serde_json::json!({"endpoint": engine.endpoint(), "addr": alloc.addr(), "len": o.buffer_size,
            "pid": std::process::id()})
    );
    std::io::stdout().flush().ok();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Notifications (`--notify`) are taken as they come, as a receiver would.
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = engine.take_notification(Duration::from_millis(100));
            }
        });
        if o.until_stdin_closes {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        } else {
            eprintln!("orbite-bench target: serving {} bytes at {}; Ctrl-C to stop", o.buffer_size, engine.endpoint());
            loop {
                std::thread::park();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let _ = engine.close(Some(Duration::from_secs(10)));
}

/// The socket-baseline child: connects and streams blocks until `duration`.
fn run_socket_source(o: &Opts) {
    let addr = o.connect.clone().unwrap_or_else(|| die("--connect"));
    let bs = o.block_sizes[0] as usize;
    let mut buf = vec![0u8; o.buffer_size as usize];
    touch(buf.as_mut_ptr(), buf.len());
    let mut s = TcpStream::connect(&addr).unwrap_or_else(|e| die(&e.to_string()));
    let _ = s.set_nodelay(true);
    let end = Instant::now() + Duration::from_secs_f64(o.duration);
    let n = (buf.len() / bs).max(1);
    let mut k = 0usize;
    while Instant::now() < end {
        let off = (k % n) * bs;
        if s.write_all(&buf[off..off + bs.min(buf.len())]).is_err() {
            break;
        }
        k += 1;
    }
}

fn socket_baseline(o: &Opts, bs: u64) -> f64 {
    socket_stream_gbps(o.buffer_size, o.duration, bs)
}

/// A plain TCP stream of `bs`-byte writes over loopback between two
/// processes for `duration` seconds, rotating over `buffer_size` bytes on
/// each side: GB/s received.
fn socket_stream_gbps(buffer_size: u64, duration: f64, bs: u64) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| die(&e.to_string()));
    let addr = l.local_addr().expect("addr").to_string();
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--mode", "socket-source", "--connect", &addr, "--block-size", &bs.to_string()])
        .args(["--buffer-size", &buffer_size.to_string(), "--duration", &duration.to_string()])
        .spawn()
        .unwrap_or_else(|e| die(&format!("spawn baseline: {e}")));
    let (mut s, _) = l.accept().unwrap_or_else(|e| die(&e.to_string()));
    let mut buf = vec![0u8; buffer_size as usize];
    touch(buf.as_mut_ptr(), buf.len());
    let n = (buf.len() as u64 / bs).max(1) as usize;
    let mut total = 0u64;
    let mut k = 0usize;
    let t0 = Instant::now();
    loop {
        let off = (k % n) * bs as usize;
        let end = (off + bs as usize).min(buf.len());
        match s.read(&mut buf[off..end]) {
            Ok(0) | Err(_) => break,
            Ok(m) => {
                total += m as u64;
                if m == end - off {
                    k += 1;
                }
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let _ = child.wait();
    total as f64 / secs / 1e9
}

/// A stride near 0.618 n that is coprime with n (1 for n <= 2).
fn coprime_stride(n: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut s = (n as f64 * 0.618) as u64 | 1;
    while s > 1 && gcd(s, n) != 1 {
        s -= 2;
    }
    s.max(1)
}

/// Round trips of 64 bytes for `duration` over a raw stream pair, the echo
/// side on its own thread: a Unix socket pair (what an IPC round trip costs
/// at least) or, for tcp, a loopback TCP connection. (name, p50 us, p99 us).
fn pingpong_baseline(transport: &str, duration: f64) -> (String, f64, f64) {
    fn run<S: Read + Write + Send + 'static>(mut a: S, mut b: S, duration: f64) -> Vec<f64> {
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while b.read_exact(&mut buf).is_ok() {
                if b.write_all(&buf).is_err() {
                    break;
                }
            }
        });
        let mut buf = [7u8; 64];
        let mut lat = Vec::new();
        let end = Instant::now() + Duration::from_secs_f64(duration);
        while Instant::now() < end {
            let t0 = Instant::now();
            if a.write_all(&buf).is_err() || a.read_exact(&mut buf).is_err() {
                break;
            }
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        drop(a);
        let _ = echo.join();
        lat
    }
    let (name, mut lat) = if transport == "tcp" {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| die(&e.to_string()));
        let a = TcpStream::connect(l.local_addr().expect("addr")).unwrap_or_else(|e| die(&e.to_string()));
        let (b, _) = l.accept().unwrap_or_else(|e| die(&e.to_string()));
        let _ = (a.set_nodelay(true), b.set_nodelay(true));
        ("tcp_pingpong", run(a, b, duration))
    } else {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| die(&e.to_string()));
        ("unix_pingpong", run(a, b, duration))
    };
    lat.sort_by(|x, y| x.partial_cmp(y).expect("finite"));
    (name.into(), percentile(&lat, 0.5), percentile(&lat, 0.99))
}

/// Single-thread memcpy over the working set, or, with `--threads N`, N
/// threads each copying its own slice (the most a host can copy with N cores).
fn memcpy_baseline(o: &Opts, bs: u64) -> f64 {
    if o.threads > 1 {
        let one = Opts { threads: 1, buffer_size: o.buffer_size / o.threads as u64, ..o.clone() };
        let rates: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..o.threads).map(|_| s.spawn(|| memcpy_baseline(&one, bs))).collect();
            hs.into_iter().map(|h| h.join().expect("memcpy thread")).collect()
        });
        return rates.iter().sum();
    }
    let len = o.buffer_size as usize;
    let mut src = vec![0u8; len];
    let mut dst = vec![0u8; len];
    touch(src.as_mut_ptr(), len);
    touch(dst.as_mut_ptr(), len);
    let bs = (bs as usize).min(len);
    let n = len / bs;
    let mut bytes = 0u64;
    let mut k = 0usize;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(o.duration);
    while Instant::now() < end {
        for _ in 0..16 {
            let so = (k % n) * bs;
            let doff = ((k * 7 + 3) % n) * bs;
            dst[doff..doff + bs].copy_from_slice(&src[so..so + bs]);
            k += 1;
            bytes += bs as u64;
        }
    }
    std::hint::black_box(&dst);
    bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// A target process started by this run; it exits when its stdin closes.
struct Target {
    child: std::process::Child,
    endpoint: String,
    /// The target process's pid (the raw cross-memory calls of `cma_raw`).
    pid: u32,
}

fn spawn_target(o: &Opts, kind: &str) -> Target {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--mode", "target", "--until-stdin-closes", "--buffer-size", &o.buffer_size.to_string()])
        .args(["--target-kind", kind, "--devices", &format!("{},{}", o.devices.0, o.devices.1)])
        .args(o.auth_key.iter().flat_map(|k| ["--auth-key", k.as_str()]))
        .args(o.wire_security.iter().flat_map(|w| ["--wire-security", w.as_str()]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| die(&format!("spawn target: {e}")));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("target line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| die(&format!("target said {line:?}")));
    let pid = v["pid"].as_u64().unwrap_or(0) as u32;
    Target { endpoint: v["endpoint"].as_str().expect("endpoint").to_string(), child, pid }
}

impl Drop for Target {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn transport_of(name: &str) -> Transport {
    match name {
        "tcp" => Transport::Only(TransportKind::Tcp),
        "shm" => Transport::Only(TransportKind::Shm),
        "nvlink" => Transport::Only(TransportKind::Nvlink),
        "mnnvl" => Transport::Only(TransportKind::Mnnvl),
        "cma" => Transport::Only(TransportKind::Cma),
        _ => Transport::Auto,
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// One transport's setup: the engine, its peer, the remote region, the
/// local buffers (requests rotate over them), and what keeps them alive.
struct Setup {
    engine: Engine,
    /// The target's endpoint.
    endpoint: String,
    peer: u64,
    remote: u64,
    remote_len: u64,
    locals: Vec<u64>,
    memory: String,
    _allocs: Vec<orbite::Allocation>,
    /// Local memory from malloc (`--memory foreign`).
    _foreign: Option<Foreign>,
    _target: Option<Target>,
    /// More targets (`--peers`): (peer, remote region address, length).
    others: Vec<(u64, u64, u64)>,
    _others: Vec<Target>,
}

impl Setup {
    /// A setup with one target (no `--peers`): `allocs` are the local
    /// buffers, of memory kind `memory`.
    fn new(
        engine: Engine,
        endpoint: String,
        peer: u64,
        region: &orbite::RegionInfo,
        allocs: Vec<orbite::Allocation>,
        memory: &str,
        target: Option<Target>,
    ) -> Setup {
        Setup {
            engine,
            endpoint,
            peer,
            remote: region.addr,
            remote_len: region.len,
            locals: allocs.iter().map(|a| a.addr()).collect(),
            memory: memory.to_string(),
            _allocs: allocs,
            _foreign: None,
            _target: target,
            others: Vec::new(),
            _others: Vec::new(),
        }
    }
}

/// Runs one point: `threads` threads submit batches for `duration`. Returns
/// the requests completed, the measured seconds (from the first measured
/// submission to the last completion), the latencies and the failures.
fn measure(c: &Setup, o: &Opts, transport: &str, op: Op, bs: u64, notify: bool) -> (u64, f64, Vec<f64>, u64) {
    let opts = SubmitOptions { transport: transport_of(transport), timeout: Some(Duration::from_secs(60)) };
    let per_local = o.buffer_size / o.threads as u64 / bs;
    let per_thread = per_local.max(1);
    // Batches go to the targets in turn (`--peers`); each target's remote
    // region is its own.
    let targets: Vec<(u64, u64, u64)> =
        std::iter::once((c.peer, c.remote, c.remote_len)).chain(c.others.iter().copied()).collect();
    let remote_blocks = (targets.iter().map(|t| t.2).min().unwrap_or(c.remote_len) / bs).max(1);
    // Random: distinct blocks scattered over the working set (a stride
    // coprime with the block count visits every block once per cycle).
    let stride = if o.random { coprime_stride(remote_blocks) } else { 1 };
    // `--direct`: one route per target, opened before the clock starts.
    let routes: Vec<orbite::DirectRoute> = match o.direct && transport != "tcp" {
        true => targets
            .iter()
            .map(|&(peer, remote, len)| {
                c.engine
                    .open_direct(peer, remote, len, opts.transport, None)
                    .unwrap_or_else(|e| die(&format!("--direct: {e}")))
            })
            .collect(),
        false => Vec::new(),
    };
    let end = Instant::now() + Duration::from_secs_f64(o.duration);
    type Run = (u64, Vec<f64>, u64, Option<(Instant, Instant)>);
    let results: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..o.threads)
            .map(|t| {
                let targets = &targets;
                let routes = &routes;
                s.spawn(move || {
                    let mut k = t as u64 * 7919;
                    let mut turn = t;
                    let (mut done, mut failed) = (0u64, 0u64);
                    let mut first_error: Option<String> = None;
                    let mut lat = Vec::new();
                    let mut reqs = Vec::with_capacity(o.batch);
                    let mut warm = true;
                    let mut span: Option<(Instant, Instant)> = None;
                    while warm || Instant::now() < end {
                        reqs.clear();
                        let (peer, remote, _) = targets[turn % targets.len()];
                        turn += 1;
                        for _ in 0..o.batch {
                            let local = c.locals[(k % c.locals.len() as u64) as usize];
                            reqs.push(Request {
                                op,
                                local_addr: local + t as u64 * per_thread * bs + (k % per_thread) * bs,
                                remote_addr: remote + (k.wrapping_mul(stride) % remote_blocks) * bs,
                                len: bs,
                            });
                            k += 1;
                        }
                        let t0 = Instant::now();
                        let r = match routes.get((turn - 1) % targets.len()) {
                            // One copy per request through the target's route.
                            Some(route) => Ok(reqs.iter().fold((0u64, None), |(ok, why), r| {
                                match c.engine.copy_direct(route, r, opts.timeout) {
                                    Ok((_, None)) => (ok + 1, why),
                                    Ok((_, Some(e))) | Err(e) => (ok, why.or(Some(e))),
                                }
                            })),
                            None => {
                                let submitted = match notify {
                                    true => c.engine.submit_with_notification(peer, &reqs, opts, b"bench"),
                                    false => c.engine.submit(peer, &reqs, opts),
                                };
                                submitted.map(|b| {
                                    let w = b.wait(Duration::from_secs(60));
                                    let ok =
                                        b.results().iter().filter(|x| x.status == orbite::Status::Ok).count() as u64;
                                    let why = w.err().map(|e| (0..reqs.len()).find_map(|i| b.error(i)).unwrap_or(e));
                                    (ok, why)
                                })
                            }
                        };
                        let t1 = Instant::now();
                        let (ok, why) = r.unwrap_or_else(|e| (0, Some(e)));
                        if let (Some(e), false) = (why, warm) {
                            first_error.get_or_insert_with(|| e.to_string());
                        }
                        if !warm {
                            done += ok;
                            failed += o.batch as u64 - ok;
                            lat.push((t1 - t0).as_secs_f64() * 1e6);
                            span = Some((span.map_or(t0, |s| s.0), t1));
                        }
                        warm = false;
                    }
                    if let Some(e) = first_error {
                        eprintln!("\n{transport} {}: {failed} requests failed; the first: {e}", fmt_size(bs));
                    }
                    (done, lat, failed, span)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    let first = results.iter().filter_map(|r| r.3.map(|s| s.0)).min();
    let last = results.iter().filter_map(|r| r.3.map(|s| s.1)).max();
    let secs = match (first, last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let mut lat: Vec<f64> = results.iter().flat_map(|r| r.1.iter().copied()).collect();
    lat.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let done: u64 = results.iter().map(|r| r.0).sum();
    let failed: u64 = results.iter().map(|r| r.2).sum();
    (done, secs, lat, failed)
}

/// The cross-memory calls alone, by `threads` threads at once: each
/// `--batch-size` batch of `bs`-byte blocks is split into `threads` shares
/// of consecutive blocks (as even as whole blocks allow), thread `t` moving
/// share `t` of every batch with one `process_vm_readv` (READ) or
/// `process_vm_writev` (WRITE) per batch, between the setup's local buffer
/// and the target's, rotating over both as [`measure`] does, for
/// `--duration`. The threads never wait for one another, so this is what
/// the kernel's calls give that many callers on this machine: one thread
/// (`cma_raw`) is what a CMA point without its copy pool can approach; as
/// many threads as the copy pool has copiers (`cma_raw_par`, see
/// [`copiers`]) is what it can approach with them. GB/s and calls per
/// second; `None` without a target process of this run.
fn cma_raw(c: &Setup, o: &Opts, op: Op, bs: u64, threads: usize) -> Option<(f64, f64)> {
    let pid = c._target.as_ref()?.pid as libc::pid_t;
    let blocks = (c.remote_len / bs).max(1);
    let per_local = (o.buffer_size / bs).max(1);
    let n = o.batch.min(1024) as u64;
    let threads = (threads as u64).clamp(1, n);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(o.duration);
    let results: Vec<Option<(u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                // This thread's share of each batch: blocks [from, to).
                let (from, to) = (n * t / threads, n * (t + 1) / threads);
                s.spawn(move || {
                    let m = (to - from) as usize;
                    let (mut local, mut remote) = (Vec::with_capacity(m), Vec::with_capacity(m));
                    let (mut batch, mut bytes, mut calls) = (0u64, 0u64, 0u64);
                    while Instant::now() < end {
                        local.clear();
                        remote.clear();
                        for j in from..to {
                            let k = batch * n + j;
                            let l = c.locals[0] + (k % per_local) * bs;
                            let r = c.remote + (k % blocks) * bs;
                            local.push(libc::iovec { iov_base: l as *mut libc::c_void, iov_len: bs as usize });
                            remote.push(libc::iovec { iov_base: r as *mut libc::c_void, iov_len: bs as usize });
                        }
                        batch += 1;
                        // SAFETY: the local ranges lie in this setup's
                        // registered buffer of `buffer_size` bytes, alive
                        // across the call (the scope outlives no borrow of
                        // the setup); the kernel checks the target's ranges.
                        let moved = unsafe {
                            match op {
                                Op::Read => {
                                    libc::process_vm_readv(pid, local.as_ptr(), m as _, remote.as_ptr(), m as _, 0)
                                }
                                Op::Write => {
                                    libc::process_vm_writev(pid, local.as_ptr(), m as _, remote.as_ptr(), m as _, 0)
                                }
                            }
                        };
                        if moved < 0 {
                            eprintln!("\ncma_raw ({threads} threads): {}", std::io::Error::last_os_error());
                            return None;
                        }
                        bytes += moved as u64;
                        calls += 1;
                    }
                    Some((bytes, calls))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("cma_raw thread")).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let (bytes, calls) = results.into_iter().try_fold((0, 0), |(b, k), r| r.map(|(rb, rk)| (b + rb, k + rk)))?;
    Some((bytes as f64 / secs / 1e9, calls as f64 / secs))
}

/// How many threads copy one large group in the library's copy pool: the
/// caller and a pool thread per further core, one pool thread per core up
/// to 8 (`transport::ipc::backends::cpu_copy`'s pool and its `helpers`).
fn copiers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(8)
}

fn fmt_size(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

fn max_inflight(o: &Opts) -> u64 {
    (o.batch as u64 * o.threads as u64 * o.block_sizes.iter().max().copied().unwrap_or(1 << 20))
        .max(1 << 30)
        .next_power_of_two()
        .min(1 << 40)
}

/// The keys every engine of the run shares, for its JSON config: `,
/// "auth_key_file": ...` with `--auth-key`, and `, "name": ...,
/// "discovery": {...}` when `--name` and `--etcd` are given: the target's
/// own name, or for an initiator (`role`) a name of its own beside the
/// target's. "" without them.
fn engine_keys(o: &Opts, role: Option<&str>) -> String {
    let wire =
        o.wire_security.as_ref().map(|w| format!(r#", "wire_security": {}"#, serde_json::Value::from(w.as_str())));
    let key = o
        .auth_key
        .as_ref()
        .map(|k| format!(r#", "auth_key_file": {}{}"#, serde_json::Value::from(k.as_str()), wire.unwrap_or_default()));
    let key = key.unwrap_or_default();
    let (Some(target), Some(etcd)) = (&o.name, &o.etcd) else { return key };
    let name = match role {
        None => target.clone(),
        Some(r) => format!("orbite-bench-{}-{r}", std::process::id()),
    };
    format!(r#"{key}, "name": "{name}", "discovery": {{"etcd": ["{etcd}"]}}"#)
}

/// `cfg` (a JSON object) with the discovery keys of an initiator engine.
fn initiator_json(o: &Opts, cfg: &str, role: &str) -> String {
    let keys = engine_keys(o, Some(role));
    match cfg.rfind('}') {
        Some(end) if !keys.is_empty() => format!("{}{keys}}}", &cfg[..end]),
        _ => cfg.to_string(),
    }
}

/// Connects `engine` to the target (by `--name` through discovery, or at
/// `endpoint`) and finds the largest region it publishes. Also returns the
/// target's endpoint.
fn connect(
    engine: &Engine,
    o: &Opts,
    endpoint: &str,
) -> Result<(u64, orbite::control::message::RegionInfo, String), String> {
    let (peer, endpoint) = match &o.name {
        Some(name) => {
            let p = engine.connect_name(name, None).map_err(|e| format!("connect to {name:?}: {e}"))?;
            (p, engine.peer_endpoint(p).map_err(|e| e.to_string())?)
        }
        None => (engine.connect(endpoint, None).map_err(|e| format!("connect {endpoint}: {e}"))?, endpoint.to_string()),
    };
    let regions = engine.peer_regions(peer, None).map_err(|e| e.to_string())?;
    let region = regions.iter().max_by_key(|r| r.len).copied().ok_or("the target publishes no region")?;
    Ok((peer, region, endpoint))
}

/// Whether transport `t` is measured on memory from malloc: CMA always
/// (it moves nothing else), TCP and auto with `--memory foreign`; SHM never
/// (it moves only the library's shared memory).
fn foreign_for(o: &Opts, t: &str) -> bool {
    t == "cma" || (t != "shm" && o.memory == "foreign")
}

/// TCP, SHM, CMA and auto: shared host memory on both sides, or memory
/// from malloc (`foreign`).
fn host_setup(o: &Opts, endpoint: Option<&str>, foreign: bool) -> Result<Setup, String> {
    let kind = if foreign { "foreign" } else { "host" };
    let target = (endpoint.is_none() && o.name.is_none()).then(|| spawn_target(o, kind));
    let endpoint =
        endpoint.map(str::to_string).or_else(|| target.as_ref().map(|t| t.endpoint.clone())).unwrap_or_default();
    let cfg = format!(
        r#"{{"shm_cache_entries": 64, "max_inflight_bytes": {}, "max_transfer_bytes": 67108864}}"#,
        max_inflight(o)
    );
    let engine = Engine::from_json(&initiator_json(o, &cfg, "host")).map_err(|e| e.to_string())?;
    let (peer, region, endpoint) = connect(&engine, o, &endpoint)?;
    // `--peers N`: N-1 more targets, all connected to this engine.
    let _others: Vec<Target> = match (target.is_some(), o.peers > 1) {
        (true, true) => (1..o.peers).map(|_| spawn_target(o, kind)).collect(),
        _ => Vec::new(),
    };
    let mut others = Vec::new();
    for t in &_others {
        let (p, r, _) = connect(&engine, &Opts { name: None, ..o.clone() }, &t.endpoint)?;
        others.push((p, r.addr, r.len));
    }
    if foreign {
        let local = Foreign::new(o.buffer_size);
        engine.register_memory(local.addr, o.buffer_size, Access::NONE).map_err(|e| e.to_string())?;
        let mut s = Setup::new(engine, endpoint, peer, &region, Vec::new(), "foreign", target);
        s.locals = vec![local.addr];
        return Ok(Setup { others, _others, _foreign: Some(local), ..s });
    }
    let local = allocate_shared_host(o.buffer_size).map_err(|e| e.to_string())?;
    touch(local.addr() as *mut u8, o.buffer_size as usize);
    engine.register_memory(local.addr(), o.buffer_size, Access::NONE).map_err(|e| e.to_string())?;
    Ok(Setup { others, _others, ..Setup::new(engine, endpoint, peer, &region, vec![local], "shared_host", target) })
}

/// NVLink and MNNVL: the target serves device memory; the initiator's is
/// `--memory`.
#[cfg(feature = "cuda")]
fn cuda_setup(o: &Opts, kind: &str, endpoint: Option<&str>) -> Result<Setup, String> {
    let target = (endpoint.is_none() && o.name.is_none()).then(|| spawn_target(o, kind));
    let endpoint =
        endpoint.map(str::to_string).or_else(|| target.as_ref().map(|t| t.endpoint.clone())).unwrap_or_default();
    let cfg = initiator_json(o, &cuda::initiator_config(kind, max_inflight(o)), kind);
    let engine = Engine::from_json(&cfg).map_err(|e| e.to_string())?;
    let (peer, region, endpoint) = connect(&engine, o, &endpoint)?;
    let allocs = cuda::local(&engine, &o.memory, o.devices.1, o.buffer_size)?;
    Ok(Setup::new(engine, endpoint, peer, &region, allocs, &o.memory, target))
}

#[cfg(not(feature = "cuda"))]
fn cuda_setup(_: &Opts, _: &str, _: Option<&str>) -> Result<Setup, String> {
    Err(NO_CUDA_BUILD.into())
}

/// The baseline of one point, measured in this run (memoised per key).
fn baseline_for(
    o: &Opts,
    t: &str,
    op: Op,
    bs: u64,
    memo: &mut std::collections::HashMap<(String, u64, bool), (String, f64)>,
) -> (String, f64) {
    if !o.baselines {
        return ("none".into(), 0.0);
    }
    let cuda_op = is_cuda_transport(t).then_some(op == Op::Read);
    let key = (
        if t == "tcp" {
            "tcp"
        } else if cuda_op.is_some() {
            "cuda"
        } else {
            "memcpy"
        }
        .to_string(),
        bs,
        cuda_op == Some(true),
    );
    memo.entry(key.clone())
        .or_insert_with(|| match key.0.as_str() {
            "tcp" => ("tcp_socket".into(), socket_baseline(o, bs)),
            "memcpy" => ("memcpy".into(), memcpy_baseline(o, bs)),
            _ => cuda_baseline(o, op, bs),
        })
        .clone()
}

#[cfg(feature = "cuda")]
fn cuda_baseline(o: &Opts, op: Op, bs: u64) -> (String, f64) {
    let (a, b) = o.devices;
    cuda::baseline(op, &o.memory, a, b, bs, o.batch, o.buffer_size, o.duration).unwrap_or_else(|e| die(&e))
}

#[cfg(not(feature = "cuda"))]
fn cuda_baseline(_: &Opts, _: Op, _: u64) -> (String, f64) {
    die(NO_CUDA_BUILD)
}

fn run_initiator(o: &Opts, endpoint: Option<&str>) -> Vec<Point> {
    let wanted: Vec<String> = if o.transports.is_empty() && o.memory == "foreign" {
        vec!["tcp".into(), "shm".into(), "cma".into()]
    } else if o.transports.is_empty() {
        vec!["tcp".into(), "shm".into(), "nvlink".into(), "mnnvl".into()]
    } else {
        o.transports.clone()
    };
    // One setup for the host transports, one per CUDA transport; each
    // transport is probed with one small request first.
    let mut host: Option<(bool, Setup)> = None;
    let mut runs: Vec<(String, Setup)> = Vec::new();
    for t in wanted {
        let setup = if is_cuda_transport(&t) {
            cuda_setup(o, &t, endpoint)
        } else {
            match host.take() {
                Some((foreign, h)) if foreign == foreign_for(o, &t) => Ok(h),
                _ => host_setup(o, endpoint, foreign_for(o, &t)),
            }
        };
        let setup = match setup {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipping {t}: {e}");
                continue;
            }
        };
        let r = Request { op: Op::Read, local_addr: setup.locals[0], remote_addr: setup.remote, len: 64 };
        let opts = SubmitOptions { transport: transport_of(&t), timeout: Some(Duration::from_secs(30)) };
        let probe = setup.engine.submit(setup.peer, &[r], opts).and_then(|b| b.wait(Duration::from_secs(30)));
        // A cached SHM export lends the target buffer exclusively: release it.
        let _ = setup.engine.flush_nvlink_cache(None);
        if let Err(e) = probe {
            eprintln!("skipping {t}: {e}");
            if !is_cuda_transport(&t) {
                host = Some((foreign_for(o, &t), setup));
            }
            continue;
        }
        runs.push((t, setup));
    }
    let mut memo = std::collections::HashMap::new();
    let total = runs.len() * o.ops.len() * o.block_sizes.len();
    let mut points = Vec::new();
    let mut n = 0;
    for (t, setup) in &runs {
        for &op in &o.ops {
            for &bs in &o.block_sizes {
                n += 1;
                let left = (total - n + 1) as f64 * o.duration;
                eprint!("\r[{n}/{total}] {t} {} {}: about {left:.0}s left          ", op_name(op), fmt_size(bs));
                let _ = std::io::stderr().flush();
                let (done, secs, lat, failed) = measure(setup, o, t, op, bs, false);
                let _ = setup.engine.flush_nvlink_cache(None);
                let (baseline, base) =
                    if o.latency { ("none".to_string(), 0.0) } else { baseline_for(o, t, op, bs, &mut memo) };
                let bytes = done * bs;
                let gbps = if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 };
                let at = points.len();
                points.push(Point {
                    transport: t.clone(),
                    memory: setup.memory.clone(),
                    op: op_name(op).into(),
                    block_size: bs,
                    batch_size: o.batch,
                    threads: o.threads,
                    readers: 1,
                    bytes,
                    seconds: secs,
                    gbps,
                    ops_per_sec: if secs > 0.0 { done as f64 / secs } else { 0.0 },
                    p50_us: percentile(&lat, 0.5),
                    p99_us: percentile(&lat, 0.99),
                    baseline: baseline.clone(),
                    baseline_gbps: base,
                    ratio_to_baseline: if base > 0.0 { gbps / base } else { 0.0 },
                    baseline_p50_us: 0.0,
                    baseline_p99_us: 0.0,
                    requests_failed: failed,
                    peers: setup.others.len() + 1,
                });
                if o.latency {
                    let p = points.last_mut().expect("pushed");
                    let (name, p50, p99) = pingpong_baseline(t, o.duration);
                    (p.baseline, p.baseline_gbps, p.baseline_p50_us, p.baseline_p99_us) = (name, 0.0, p50, p99);
                    p.ratio_to_baseline = if p50 > 0.0 { p.p50_us / p50 } else { 0.0 };
                }
                if op == Op::Write && o.notify {
                    eprint!("\r[{n}/{total}] {t} write {} with notifications          ", fmt_size(bs));
                    let _ = std::io::stderr().flush();
                    let plain = points.last().expect("pushed").clone();
                    let (done, secs, lat, failed) = measure(setup, o, t, op, bs, true);
                    let _ = setup.engine.flush_nvlink_cache(None);
                    let bytes = done * bs;
                    let p50 = percentile(&lat, 0.5);
                    points.push(Point {
                        op: "write+n".into(),
                        bytes,
                        seconds: secs,
                        gbps: if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 },
                        ops_per_sec: if secs > 0.0 { done as f64 / secs } else { 0.0 },
                        p50_us: p50,
                        p99_us: percentile(&lat, 0.99),
                        baseline: "without_notify".into(),
                        baseline_gbps: plain.gbps,
                        ratio_to_baseline: if plain.p50_us > 0.0 { p50 / plain.p50_us } else { 0.0 },
                        baseline_p50_us: plain.p50_us,
                        baseline_p99_us: plain.p99_us,
                        requests_failed: failed,
                        ..plain
                    });
                }
                if op == Op::Read && o.readers > 1 {
                    eprint!("\r[{n}/{total}] {t} read {} with {} readers          ", fmt_size(bs), o.readers);
                    let _ = std::io::stderr().flush();
                    let mut p = readers_point(o, t, &setup.endpoint, bs);
                    p.memory = setup.memory.clone();
                    p.baseline = baseline.clone();
                    p.baseline_gbps = base;
                    p.ratio_to_baseline = if base > 0.0 { p.gbps / base } else { 0.0 };
                    points.push(p);
                }
                if t == "cma" && o.baselines && !o.latency {
                    // One thread, then the copy pool's copiers (when more).
                    let par = copiers();
                    let runs = std::iter::once(("cma_raw", 1)).chain((par > 1).then_some(("cma_raw_par", par)));
                    for (name, threads) in runs {
                        let Some((raw, _calls)) = cma_raw(setup, o, op, bs, threads) else { continue };
                        let plain = points[at].clone();
                        points.push(Point {
                            transport: name.into(),
                            threads,
                            gbps: raw,
                            ops_per_sec: raw * 1e9 / bs as f64,
                            p50_us: 0.0,
                            p99_us: 0.0,
                            ratio_to_baseline: if base > 0.0 { raw / base } else { 0.0 },
                            requests_failed: 0,
                            ..plain
                        });
                    }
                }
            }
        }
    }
    if o.notify {
        for (t, setup) in &runs {
            eprint!("\r{t}: standalone notifications                    ");
            let _ = std::io::stderr().flush();
            points.push(notify_point(o, t, setup));
        }
    }
    eprintln!();
    for (_, setup) in &runs {
        let _ = setup.engine.close(Some(Duration::from_secs(30)));
    }
    points
}

/// Standalone notifications to the target for `duration`, one at a time
/// (each returns once the target queued it): the rate and the latency of
/// one, against the raw ping-pong of the connection's kind.
fn notify_point(o: &Opts, t: &str, c: &Setup) -> Point {
    let end = Instant::now() + Duration::from_secs_f64(o.duration);
    let (mut lat, mut failed, mut full) = (Vec::new(), 0u64, 0u64);
    let mut first_error = None;
    let start = Instant::now();
    while Instant::now() < end {
        let t0 = Instant::now();
        // A full inbox (the target's taker fell behind) is back-pressure, not
        // a failure: the sender waits and sends again, as a real one would;
        // the wait counts in that notification's latency.
        let sent = loop {
            match c.engine.notify(c.peer, b"bench", Some(Duration::from_secs(30))) {
                Err(e) if e.status() == orbite::Status::ResourceExhausted && t0.elapsed() < Duration::from_secs(30) => {
                    full += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                r => break r,
            }
        };
        match sent {
            Ok(()) => lat.push(t0.elapsed().as_secs_f64() * 1e6),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if full > 0 {
        eprintln!("\n{t}: the target's inbox was full {full} times (its taker fell behind); those notifications were sent again");
    }
    if let Some(e) = first_error {
        eprintln!("\n{t}: {failed} standalone notifications failed; the first: {e}");
    }
    lat.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    // Notifications travel on the control connection (TCP) whatever the
    // data transport.
    let (name, base50, base99) = pingpong_baseline("tcp", o.duration);
    let p50 = percentile(&lat, 0.5);
    Point {
        transport: t.to_string(),
        memory: c.memory.clone(),
        op: "notify".into(),
        block_size: 5,
        batch_size: 1,
        threads: 1,
        readers: 1,
        bytes: lat.len() as u64 * 5,
        seconds: secs,
        gbps: 0.0,
        ops_per_sec: if secs > 0.0 { lat.len() as f64 / secs } else { 0.0 },
        p50_us: p50,
        p99_us: percentile(&lat, 0.99),
        baseline: name,
        baseline_gbps: 0.0,
        ratio_to_baseline: if base50 > 0.0 { p50 / base50 } else { 0.0 },
        baseline_p50_us: base50,
        baseline_p99_us: base99,
        requests_failed: failed,
        peers: 1,
    }
}

/// A reader process of a `--readers` point: its own engine and cache against
/// the shared target, ready when set up, measuring READ on "go".
fn run_reader(o: &Opts) {
    let endpoint = o.endpoint.clone().unwrap_or_else(|| die("--mode reader needs --endpoint"));
    let t = o.transports.first().cloned().unwrap_or_else(|| "auto".into());
    let setup = if is_cuda_transport(&t) {
        cuda_setup(o, &t, Some(&endpoint))
    } else {
        host_setup(o, Some(&endpoint), foreign_for(o, &t))
    }
    .unwrap_or_else(|e| die(&e));
    println!("ready");
    std::io::stdout().flush().ok();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).ok();
    let (done, secs, lat, failed) = measure(&setup, o, &t, Op::Read, o.block_sizes[0], false);
    println!(
        "{}",
        serde_json::json!({"done": done, "seconds": secs, "failed": failed,
            "p50_us": percentile(&lat, 0.5), "p99_us": percentile(&lat, 0.99)})
    );
    let _ = setup.engine.close(Some(Duration::from_secs(30)));
}

/// `--readers N` for one transport and block size: N reader processes read
/// the target at once; the aggregate of their bytes over the longest span.
fn readers_point(o: &Opts, t: &str, endpoint: &str, bs: u64) -> Point {
    let exe = std::env::current_exe().expect("current_exe");
    let mut children: Vec<std::process::Child> = (0..o.readers)
        .map(|_| {
            Command::new(&exe)
                .args(["--mode", "reader", "--endpoint", endpoint, "--transport", t, "--op", "read"])
                .args(["--block-size", &bs.to_string(), "--batch-size", &o.batch.to_string()])
                .args(["--threads", &o.threads.to_string(), "--duration", &o.duration.to_string()])
                .args(["--buffer-size", &o.buffer_size.to_string(), "--memory", &o.memory])
                .args(["--devices", &format!("{},{}", o.devices.0, o.devices.1)])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| die(&format!("spawn reader: {e}")))
        })
        .collect();
    let mut outs: Vec<std::io::BufReader<std::process::ChildStdout>> =
        children.iter_mut().map(|c| std::io::BufReader::new(c.stdout.take().expect("stdout"))).collect();
    for out in &mut outs {
        let mut line = String::new();
        out.read_line(&mut line).ok();
        if line.trim() != "ready" {
            die(&format!("a reader did not start: {line:?}"));
        }
    }
    for c in &mut children {
        let _ = writeln!(c.stdin.as_mut().expect("stdin"), "go");
    }
    let (mut done, mut secs, mut failed, mut p50, mut p99) = (0u64, 0f64, 0u64, 0f64, 0f64);
    for (c, out) in children.iter_mut().zip(&mut outs) {
        let mut line = String::new();
        out.read_line(&mut line).ok();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|_| die(&format!("a reader said {line:?}")));
        done += v["done"].as_u64().unwrap_or(0);
        failed += v["failed"].as_u64().unwrap_or(0);
        secs = secs.max(v["seconds"].as_f64().unwrap_or(0.0));
        p50 = p50.max(v["p50_us"].as_f64().unwrap_or(0.0));
        p99 = p99.max(v["p99_us"].as_f64().unwrap_or(0.0));
        drop(c.stdin.take());
        let _ = c.wait();
    }
    let bytes = done * bs;
    Point {
        transport: t.to_string(),
        memory: String::new(),
        op: "read".into(),
        block_size: bs,
        batch_size: o.batch,
        threads: o.threads,
        readers: o.readers,
        bytes,
        seconds: secs,
        gbps: if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 },
        ops_per_sec: if secs > 0.0 { done as f64 / secs } else { 0.0 },
        p50_us: p50,
        p99_us: p99,
        baseline: String::new(),
        baseline_gbps: 0.0,
        ratio_to_baseline: 0.0,
        baseline_p50_us: 0.0,
        baseline_p99_us: 0.0,
        requests_failed: failed,
        peers: 1,
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Read => "read",
        Op::Write => "write",
    }
}

fn print_table(points: &[Point]) {
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

fn main() {
    if let Some(mode) = kv_flow::wanted() {
        return kv_flow::main(&mode);
    }
    if kv_pattern::wanted() {
        return kv_pattern::main();
    }
    let o = parse_opts();
    match o.mode.as_str() {
        "target" => run_target(&o),
        "socket-source" => run_socket_source(&o),
        "reader" => run_reader(&o),
        "initiator" | "auto" => {
            let endpoint = if o.mode == "initiator" && o.name.is_none() {
                Some(
                    o.endpoint
                        .clone()
                        .unwrap_or_else(|| die("--mode initiator needs --endpoint IP:PORT or --name NAME")),
                )
            } else {
                None
            };
            let points = run_initiator(&o, endpoint.as_deref());
            if points.is_empty() {
                die("no requested transport could be measured (see the lines above)");
            }
            print_table(&points);
            if let Some(path) = &o.json {
                let mut f = std::fs::File::create(path).unwrap_or_else(|e| die(&format!("{path}: {e}")));
                for p in &points {
                    writeln!(f, "{}", serde_json::to_string(p).expect("json")).expect("write json");
                }
            }
            if let Some(path) = &o.plot {
                let title = format!("OrbiTE throughput (batch {}, {} thread(s))", o.batch, o.threads);
                std::fs::write(path, plot::svg(&points, &title)).unwrap_or_else(|e| die(&format!("{path}: {e}")));
            }
            if points.iter().any(|p| p.requests_failed > 0) {
                std::process::exit(1);
            }
        }
        other => die(&format!("unknown mode {other:?} (auto, target, initiator, kv-flow)")),
    }
}
