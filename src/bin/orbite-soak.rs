//! `orbite-soak`: a bounded soak test. This process is the source (one
//! shared allocation for SHM and one heap buffer for TCP); it starts N
//! requester processes of M threads each. Every thread owns a disjoint slice
//! of both remote buffers and loops for the duration: it WRITEs a fresh
//! deterministic pattern in batches of random blocks (over TCP or SHM, chosen
//! per submission), READs it back into another buffer, and compares every
//! byte. At the end each requester checks its stats (completed + failed =
//! submitted, nothing in flight, nothing retained) and the source checks its
//! own (no export open or retained, no request refused).
//!
//! Every engine authenticates with a shared key (a fresh private key file
//! the source writes and removes) and encrypts its TCP connections with it
//! (`wire_security: "encrypt"`), unless `--no-auth`.
//!
//! ```text
//! orbite-soak [--processes N] [--threads M] [--duration SECONDS] [--size BYTES] [--no-auth]
//! ```
//! Exit status 0 when every byte verified and every count balanced.

use orbite::{allocate_shared_host, Access, Engine, Op, Request, Status, SubmitOptions, Transport, TransportKind};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn arg<T: std::str::FromStr>(args: &[String], k: &str, d: T) -> T {
    args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// An engine config: `fields` (JSON members, may be empty) plus the key
/// file, with encrypted TCP connections.
fn config(fields: &str, key: &str) -> String {
    let auth = match key.is_empty() {
        true => String::new(),
        false => format!(r#""auth_key_file": {key:?}, "wire_security": "encrypt""#),
    };
    let sep = if fields.is_empty() || auth.is_empty() { "" } else { ", " };
    format!("{{{fields}{sep}{auth}}}")
}

/// A fresh private key file of 48 random bytes; returns its path.
fn write_key() -> String {
    use std::os::unix::fs::OpenOptionsExt;
    let mut key = [0u8; 48];
    orbite::random::fill(&mut key).unwrap_or_else(|x| fail(&x.to_string()));
    let path = std::env::temp_dir().join(format!("orbite-soak-{}.key", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap_or_else(|x| fail(&format!("{}: {x}", path.display())));
    std::io::Write::write_all(&mut f, &key).unwrap_or_else(|x| fail(&x.to_string()));
    path.to_string_lossy().into_owned()
}

fn fail(m: &str) -> ! {
    eprintln!("orbite-soak: FAIL: {m}");
    std::process::exit(1)
}

/// xorshift64: deterministic per (process, thread).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9).wrapping_add(seed.wrapping_mul(131)) >> 7) as u8
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Report {
    submitted: u64,
    completed: u64,
    failed: u64,
    bytes_verified: u64,
    mismatches: u64,
    tcp_requests: u64,
    shm_requests: u64,
}

impl Report {
    fn add(&mut self, r: &Report) {
        self.submitted += r.submitted;
        self.completed += r.completed;
        self.failed += r.failed;
        self.bytes_verified += r.bytes_verified;
        self.mismatches += r.mismatches;
        self.tcp_requests += r.tcp_requests;
        self.shm_requests += r.shm_requests;
    }
}

fn requester(args: &[String]) {
    let endpoint: String = arg(args, "--endpoint", String::new());
    let index: u64 = arg(args, "--index", 0);
    let threads: u64 = arg(args, "--threads", 2);
    let processes: u64 = arg(args, "--processes", 1);
    let duration: f64 = arg(args, "--duration", 10.0);
    let shared: u64 = arg(args, "--shared", 0);
    let heap: u64 = arg(args, "--heap", 0);
    let size: u64 = arg(args, "--size", 0);
    let key: String = arg(args, "--auth-key-file", String::new());
    let e = Engine::from_json(&config(r#""shm_cache_entries": 2, "default_timeout_ms": 60000"#, &key))
        .unwrap_or_else(|x| fail(&x.to_string()));
    let peer = e.connect(&endpoint, None).unwrap_or_else(|x| fail(&x.to_string()));
    let slice = size / (processes * threads);
    let end = Instant::now() + Duration::from_secs_f64(duration);
    let reports: Vec<Report> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let e = &e;
                s.spawn(move || {
                    let mut rep = Report::default();
                    let mut out = vec![0u8; slice as usize];
                    let mut back = vec![0u8; slice as usize];
                    e.register_memory(out.as_mut_ptr() as u64, slice, Access::NONE).unwrap();
                    e.register_memory(back.as_mut_ptr() as u64, slice, Access::NONE).unwrap();
                    let mut rng = Rng(0x1234_5678 ^ (index << 32) ^ (t + 1));
                    let mine = (index * threads + t) * slice;
                    let mut round = 0u64;
                    while Instant::now() < end {
                        round += 1;
                        let use_shm = rng.next() % 2 == 0;
                        let (base, kind) =
                            if use_shm { (shared, TransportKind::Shm) } else { (heap, TransportKind::Tcp) };
                        let opts = SubmitOptions { transport: Transport::Only(kind), timeout: None };
                        // Random blocks inside this thread's slice.
                        let n = 1 + rng.next() % 8;
                        let mut blocks = Vec::new();
                        for _ in 0..n {
                            let len = 1 + rng.next() % (slice / 8).max(1);
                            let off = rng.next() % (slice - len + 1);
                            blocks.push((off, len));
                        }
                        let seed = round * 1000 + t;
                        for &(off, len) in &blocks {
                            for k in 0..len {
                                out[(off + k) as usize] = pattern(seed, off + k);
                            }
                            // A READ that silently did nothing must not pass on stale bytes.
                            back[off as usize..(off + len) as usize].fill(!pattern(seed, off));
                        }
                        let batch = |op: Op, local: u64| -> Vec<Request> {
                            blocks
                                .iter()
                                .map(|&(off, len)| Request {
                                    op,
                                    local_addr: local + off,
                                    remote_addr: base + mine + off,
                                    len,
                                })
                                .collect()
                        };
                        let writes = batch(Op::Write, out.as_ptr() as u64);
                        let reads = batch(Op::Read, back.as_ptr() as u64);
                        for reqs in [&writes, &reads] {
                            rep.submitted += reqs.len() as u64;
                            match e.submit(peer, reqs, opts) {
                                Ok(b) => {
                                    let _ = b.wait(Duration::from_secs(120));
                                    for (i, r) in b.results().iter().enumerate() {
                                        if r.status == Status::Ok {
                                            rep.completed += 1;
                                        } else {
                                            if rep.failed == 0 {
                                                eprintln!("orbite-soak: first failure: {:?}", b.error(i));
                                            }
                                            rep.failed += 1;
                                        }
                                    }
                                }
                                Err(x) => fail(&format!("submit: {x}")),
                            }
                        }
                        if use_shm {
                            rep.shm_requests += 2 * n;
                        } else {
                            rep.tcp_requests += 2 * n;
                        }
                        // Later blocks win where blocks overlap: compare with
                        // what the local buffer holds after all writes.
                        for &(off, len) in &blocks {
                            let (a, b) =
                                (&out[off as usize..(off + len) as usize], &back[off as usize..(off + len) as usize]);
                            rep.bytes_verified += len;
                            if a != b {
                                rep.mismatches += 1;
                            }
                        }
                    }
                    rep
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| fail("thread panicked"))).collect()
    });
    let mut total = Report::default();
    for r in &reports {
        total.add(r);
    }
    let st = e.stats();
    let done: u64 = st.transports.values().map(|t| t.requests_completed + t.requests_failed).sum();
    if done != total.submitted || st.inflight_bytes != 0 {
        fail(&format!(
            "stats do not balance: {} ended vs {} submitted, {} bytes in flight",
            done, total.submitted, st.inflight_bytes
        ));
    }
    if let Err(x) = e.close(Some(Duration::from_secs(60))) {
        fail(&format!("close: {x}"));
    }
    let st = e.stats();
    if st.ipc.values().any(|i| i.imports.retained > 0 || i.imports.cached > 0) {
        fail(&format!("imports left after close: {:?}", st.ipc));
    }
    println!("{}", serde_json::to_string(&total).unwrap());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--role") {
        return requester(&args);
    }
    let processes: u64 = arg(&args, "--processes", 3);
    let threads: u64 = arg(&args, "--threads", 2);
    let duration: f64 = arg(&args, "--duration", 45.0);
    let size: u64 = arg(&args, "--size", 16 << 20);
    let size = size / (processes * threads * 8) * (processes * threads * 8);
    let key = if args.iter().any(|a| a == "--no-auth") { String::new() } else { write_key() };
    let src = Engine::from_json(&config("", &key)).unwrap_or_else(|x| fail(&x.to_string()));
    let shared = allocate_shared_host(size).unwrap_or_else(|x| fail(&x.to_string()));
    let mut heap = vec![0u8; size as usize];
    src.register_memory(shared.addr(), size, Access::READ_WRITE).unwrap();
    src.register_memory(heap.as_mut_ptr() as u64, size, Access::READ_WRITE).unwrap();
    let exe = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|i| {
            Command::new(&exe)
                .args(["--role", "requester", "--endpoint", &src.endpoint(), "--index", &i.to_string()])
                .args(["--threads", &threads.to_string(), "--processes", &processes.to_string()])
                .args(["--duration", &duration.to_string(), "--size", &size.to_string()])
                .args(["--shared", &shared.addr().to_string(), "--heap", &(heap.as_ptr() as u64).to_string()])
                .args(if key.is_empty() { vec![] } else { vec!["--auth-key-file", key.as_str()] })
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|x| fail(&x.to_string()))
        })
        .collect();
    let mut total = Report::default();
    let mut bad = 0;
    for mut c in children {
        let mut line = String::new();
        BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).ok();
        let st = c.wait().unwrap();
        match serde_json::from_str::<Report>(&line) {
            Ok(r) if st.success() => total.add(&r),
            _ => bad += 1,
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let st = src.stats();
    let ipc = &st.ipc["shm"];
    println!(
        "soak: {processes} processes x {threads} threads, {secs:.1} s: {} requests submitted ({} tcp, {} shm), {} completed, {} failed, {:.1} MB verified, {} mismatches",
        total.submitted, total.tcp_requests, total.shm_requests, total.completed, total.failed,
        total.bytes_verified as f64 / 1e6, total.mismatches
    );
    let mut problems = Vec::new();
    if bad > 0 {
        problems.push(format!("{bad} requester processes failed"));
    }
    if total.mismatches > 0 || total.failed > 0 || total.completed != total.submitted {
        problems.push("requests failed or bytes differ".to_string());
    }
    if ipc.exports.open + ipc.exports.retained > 0 {
        problems.push(format!("exports left: {ipc:?}"));
    }
    if st.transports.values().any(|t| t.served_failed > 0) {
        problems.push("the source refused requests".to_string());
    }
    if st.events.auth_failures > 0 {
        problems.push(format!("{} connections failed authentication", st.events.auth_failures));
    }
    if let Err(x) = src.close(Some(Duration::from_secs(60))) {
        problems.push(format!("source close: {x}"));
    }
    drop(heap);
    let _ = shared.free();
    if !key.is_empty() {
        let _ = std::fs::remove_file(&key);
    }
    if problems.is_empty() {
        println!("soak: 1 passed, 0 failed");
    } else {
        println!("soak: 0 passed, 1 failed: {}", problems.join("; "));
        std::process::exit(1);
    }
}
