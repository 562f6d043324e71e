//! `orbite-peer`: a stand-alone peer process for tests and manual poking.
//!
//! Source mode (default): registers one or more buffers filled with a
//! deterministic pattern, prints one JSON line describing itself, then obeys
//! commands on stdin, one per line.
//!
//! ```text
//! orbite-peer [--size BYTES] [--allocs N] [--shared | --mmap] [--access rw|r|w|none]
//!             [--seed N] [--config JSON] [--extra BYTES] [--engines N] [--setuid UID]
//! -> {"endpoint":"IP:PORT","endpoints":[...],"addr":A,"addrs":[A,...],"len":N,"pid":P,"extra_addr":X,"extra_len":M}
//! With `--engines N`, N engines in this process, engine I registering
//! buffer I (pattern SEED+I) and listening at endpoints[I]; the commands
//! other than `verifyn` act on engine 0. `--mmap`: buffers of their own
//! anonymous mappings (plain host memory, which `unmap` can take away);
//! `--setuid UID`: run as that user (and its group) from the start.
//! commands:
//!   verify SEED OFF LEN   buffer 0's [OFF, OFF+LEN) holds pattern SEED -> "ok" | "bad AT"
//!   verifyn I SEED OFF LEN  the same for buffer I
//!   fill SEED             refill buffer 0 with pattern SEED -> "ok"
//!   reregister            unregister buffer 0 and register it again (new epoch) -> "ok"
//!   unregister MS         unregister buffer 0 within MS -> "ok" | "err STATUS message"
//!   unmap OFF LEN         unmap [OFF, OFF+LEN) of an `--mmap` buffer 0 without
//!                         unregistering it (as an application freeing registered
//!                         memory would) -> "ok" | "err ..."
//!   close_source MS       close the source side -> "ok" | "err STATUS message"
//!   stats                 -> the engine's stats JSON
//!   retained              -> the engine's retained resources JSON
//!   close                 close the engine (10 s) -> "closed" and exit 0
//!   exit                  exit at once (no close)
//! ```
//!
//! Requester mode: `orbite-peer --connect ENDPOINT --read ADDR:LEN [--config JSON]`
//! connects, READs the range (transport auto), prints `ok FNV64` and obeys
//! `read` (again), `write ADDR LEN SEED` (WRITEs LEN bytes of pattern SEED
//! to ADDR -> "ok" | "err STATUS message"), `flush`, `stats`, `lat N` (N
//! READs one at a time over SHM only -> `p50_us X p99_us Y`) and `exit`
//! (exit at once, no close).
//!
//! Importer mode: `orbite-peer --import IPC_NAME ...`, a hostile importer
//! speaking the SHM channel itself (`common/importer.rs`).

#[path = "common/commands.rs"]
mod commands;
#[path = "common/importer.rs"]
mod importer;

use orbite::{
    allocate_shared_host, Access, Allocation, Engine, EngineConfig, Op, Request, SubmitOptions, Transport,
    TransportKind,
};
use std::io::{BufRead, Write};
use std::time::Duration;

/// The byte at offset `i` of pattern `seed`.
fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(seed.wrapping_mul(7)).wrapping_add(i >> 12)) as u8
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
}

fn parse_access(s: &str) -> Access {
    match s {
        "rw" => Access::READ_WRITE,
        "r" => Access::READ,
        "w" => Access::WRITE,
        "none" => Access::NONE,
        other => die(&format!("unknown access {other:?} (rw, r, w or none)")),
    }
}

fn die(msg: &str) -> ! {
    eprintln!("orbite-peer: {msg}");
    std::process::exit(2)
}

/// Memory the peer owns: plain heap, an anonymous mapping of its own
/// (never unmapped but by `unmap`: it lives until the process exits), or a
/// library shared allocation.
enum Buf {
    Heap(Vec<u8>),
    Mapped(u64, usize),
    Shared(Allocation),
}

impl Buf {
    fn new(len: usize, shared: bool, mapped: bool) -> Buf {
        if shared {
            Buf::Shared(allocate_shared_host(len as u64).unwrap_or_else(|e| die(&e.to_string())))
        } else if mapped {
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // SAFETY: a fresh anonymous mapping; checked below.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, rw, flags, -1, 0) };
            if p == libc::MAP_FAILED {
                die(&format!("mmap of {len} bytes failed: {}", std::io::Error::last_os_error()));
            }
            Buf::Mapped(p as u64, len)
        } else {
            Buf::Heap(vec![0u8; len])
        }
    }
    fn slice(&mut self) -> &mut [u8] {
        match self {
            Buf::Heap(v) => v,
            // SAFETY: the mapping made in `new`, of `len` bytes; a test that
            // unmaps part of it never asks for the slice again.
            Buf::Mapped(p, len) => unsafe { std::slice::from_raw_parts_mut(*p as *mut u8, *len) },
            // SAFETY: a shared allocation maps at least `len()` bytes and
            // lives as long as `self`.
            Buf::Shared(a) => unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, a.len() as usize) },
        }
    }
    fn addr(&mut self) -> u64 {
        self.slice().as_mut_ptr() as u64
    }
}

struct Args {
    size: usize,
    allocs: usize,
    shared: bool,
    mapped: bool,
    setuid: Option<u32>,
    extra: usize,
    access: Access,
    seed: u64,
    config: String,
    connect: Option<String>,
    read: Option<(u64, u64)>,
    engines: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        size: 16 << 20,
        allocs: 1,
        shared: false,
        mapped: false,
        setuid: None,
        extra: 0,
        access: Access::READ_WRITE,
        seed: 1,
        config: String::new(),
        connect: None,
        read: None,
        engines: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| die(&format!("{k} needs a value")));
        match k.as_str() {
            "--size" => a.size = val().parse().unwrap_or_else(|_| die("--size BYTES")),
            "--allocs" => a.allocs = val().parse().unwrap_or_else(|_| die("--allocs N")),
            "--extra" => a.extra = val().parse().unwrap_or_else(|_| die("--extra BYTES")),
            "--shared" => a.shared = true,
            "--mmap" => a.mapped = true,
            "--setuid" => a.setuid = Some(val().parse().unwrap_or_else(|_| die("--setuid UID"))),
            "--access" => a.access = parse_access(&val()),
            "--seed" => a.seed = val().parse().unwrap_or_else(|_| die("--seed N")),
            "--config" => a.config = val(),
            "--engines" => a.engines = val().parse().unwrap_or_else(|_| die("--engines N")),
            "--connect" => a.connect = Some(val()),
            "--read" => {
                let v = val();
                let (x, y) = v.split_once(':').unwrap_or_else(|| die("--read ADDR:LEN"));
                a.read = Some((x.parse().unwrap_or_else(|_| die("ADDR")), y.parse().unwrap_or_else(|_| die("LEN"))));
            }
            "-h" | "--help" => {
                println!("see the module documentation in src/bin/orbite-peer.rs");
                std::process::exit(0)
            }
            other => die(&format!("unknown argument {other:?}")),
        }
    }
    a
}

fn reply(line: &str) {
    println!("{line}");
    std::io::stdout().flush().ok();
}

fn requester(a: &Args, engine: &Engine) -> ! {
    let endpoint = a.connect.clone().expect("connect");
    let (addr, len) = a.read.unwrap_or_else(|| die("requester mode needs --read ADDR:LEN"));
    let mut local = vec![0u8; len as usize];
    engine.register_memory(local.as_mut_ptr() as u64, len, Access::NONE).unwrap_or_else(|e| die(&e.to_string()));
    let peer = engine.connect(&endpoint, None).unwrap_or_else(|e| die(&e.to_string()));
    let read = |local: &mut Vec<u8>| -> String {
        let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: addr, len };
        match engine.submit(peer, &[r], SubmitOptions::default()).and_then(|b| b.wait(Duration::from_secs(60))) {
            Ok(()) => format!("ok {}", fnv(local)),
            Err(e) => format!("err {} {}", e.status(), e.message()),
        }
    };
    let write = |w: &[&str]| -> String {
        let num =
            |i: usize| -> u64 { w.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| die("write ADDR LEN SEED")) };
        let (to, len, seed) = (num(1), num(2), num(3));
        let data: Vec<u8> = (0..len).map(|i| pattern(seed, i)).collect();
        let at = data.as_ptr() as u64;
        let r = engine.register_memory(at, len, Access::NONE).and_then(|id| {
            let req = Request { op: Op::Write, local_addr: at, remote_addr: to, len };
            let done =
                engine.submit(peer, &[req], SubmitOptions::default()).and_then(|b| b.wait(Duration::from_secs(60)));
            done.and(engine.unregister_memory(id, Some(Duration::from_secs(10))))
        });
        match r {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("err {} {}", e.status(), e.message()),
        }
    };
    reply(&read(&mut local));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match line.trim() {
            "read" => reply(&read(&mut local)),
            _ if words.first() == Some(&"write") => reply(&write(&words)),
            "flush" => reply(&match engine.flush_nvlink_cache(None) {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("err {} {}", e.status(), e.message()),
            }),
            "stats" => reply(&engine.stats().to_json()),
            "exit" => std::process::exit(0),
            lat if lat.starts_with("lat ") => {
                let n = lat[4..].trim().parse().unwrap_or(1usize).max(1);
                reply(&latency(engine, peer, &mut local, addr, n));
            }
            other => reply(&format!("unknown command {other:?}")),
        }
    }
    std::process::exit(0)
}

/// `lat N`: N READs of the range one at a time over SHM only (each an
/// import of its own with `shm_cache_entries: 0`); their p50 and p99.
fn latency(engine: &Engine, peer: u64, local: &mut [u8], addr: u64, n: usize) -> String {
    let r = Request { op: Op::Read, local_addr: local.as_mut_ptr() as u64, remote_addr: addr, len: local.len() as u64 };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: None };
    let mut us = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = std::time::Instant::now();
        if let Err(e) = engine.submit(peer, &[r], opts).and_then(|b| b.wait(Duration::from_secs(60))) {
            return format!("err {} {}", e.status(), e.message());
        }
        us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    format!("p50_us {:.1} p99_us {:.1}", us[n / 2], us[(n * 99 / 100).min(n - 1)])
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--import") {
        importer::main(&args[1..]);
    }
    let a = parse_args();
    if let Some(uid) = a.setuid {
        // SAFETY: setgid and setuid take integers; checked.
        if unsafe { libc::setgid(uid) } != 0 || unsafe { libc::setuid(uid) } != 0 {
            die(&format!("cannot run as user {uid}: {}", std::io::Error::last_os_error()));
        }
    }
    let engines: Vec<Engine> = (0..a.engines.max(1))
        .map(|_| EngineConfig::from_json(&a.config).and_then(Engine::new).unwrap_or_else(|e| die(&e.to_string())))
        .collect();
    let engine = &engines[0];
    if a.connect.is_some() {
        requester(&a, engine);
    }
    let allocs = if engines.len() > 1 { engines.len() } else { a.allocs.max(1) };
    let mut bufs: Vec<Buf> = (0..allocs).map(|_| Buf::new(a.size.max(1), a.shared, a.mapped)).collect();
    let mut ids = Vec::new();
    for (n, b) in bufs.iter_mut().enumerate() {
        for (i, x) in b.slice().iter_mut().enumerate() {
            *x = pattern(a.seed + n as u64, i as u64);
        }
        let addr = b.addr();
        let owner = &engines[n % engines.len()];
        ids.push(owner.register_memory(addr, a.size as u64, a.access).unwrap_or_else(|e| die(&e.to_string())));
    }
    // An optional region with the opposite access, for permission tests.
    let mut extra = vec![0u8; a.extra.max(1)];
    if a.extra > 0 {
        let other = if a.access.can_read() { Access::WRITE } else { Access::READ };
        engine
            .register_memory(extra.as_mut_ptr() as u64, a.extra as u64, other)
            .unwrap_or_else(|e| die(&e.to_string()));
    }
    let addrs: Vec<u64> = bufs.iter_mut().map(|b| b.addr()).collect();
    reply(
        &serde_json::json!({
            "endpoint": engine.endpoint(), "addr": addrs[0],
            "endpoints": engines.iter().map(|e| e.endpoint()).collect::<Vec<_>>(), "addrs": addrs, "len": a.size,
            "pid": std::process::id(), "extra_addr": extra.as_ptr() as u64, "extra_len": a.extra,
        })
        .to_string(),
    );
    let verify = |b: &mut Buf, s: u64, off: usize, len: usize| -> String {
        let buf = b.slice();
        match (off..off + len).find(|&i| i >= buf.len() || buf[i] != pattern(s, (i - off) as u64)) {
            None => "ok".to_string(),
            Some(at) => format!("bad {at}"),
        }
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (line, from) = match commands::command(engine, line) {
            Ok(c) => c,
            Err(answer) => {
                reply(&answer);
                continue;
            }
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { w.get(i).and_then(|x| x.parse().ok()).unwrap_or(0) };
        let out = match w.first().copied().unwrap_or("") {
            // `notes N MS`: take N notifications, each within MS; they must
            // say 0, 1, ... N-1 in that order.
            "notes" => (0..num(1))
                .find_map(|i| match engine.take_notification(Duration::from_millis(num(2))) {
                    Ok(n) if n.msg == i.to_string().as_bytes() => None,
                    Ok(n) => Some(format!("bad {i}: got {:?}", String::from_utf8_lossy(&n.msg))),
                    Err(e) => Some(format!("bad {i}: {e}")),
                })
                .unwrap_or_else(|| "ok".into()),
            "verify" => verify(&mut bufs[0], num(1), num(2) as usize, num(3) as usize),
            "verifyn" => match bufs.get_mut(num(1) as usize) {
                Some(b) => verify(b, num(2), num(3) as usize, num(4) as usize),
                None => "bad index".into(),
            },
            "fill" => {
                for (i, x) in bufs[0].slice().iter_mut().enumerate() {
                    *x = pattern(num(1), i as u64);
                }
                "ok".into()
            }
            "reregister" => {
                engine.unregister_memory(ids[0], None).unwrap_or_else(|e| die(&e.to_string()));
                ids[0] =
                    engine.register_memory(addrs[0], a.size as u64, a.access).unwrap_or_else(|e| die(&e.to_string()));
                "ok".into()
            }
            "unregister" => match engine.unregister_memory(ids[0], Some(Duration::from_millis(num(1)))) {
                Ok(()) => "ok".into(),
                Err(e) => format!("err {} {}", e.status(), e.message()),
            },
            "unmap" => match bufs[0] {
                Buf::Mapped(p, len) if num(1) + num(2) <= len as u64 => {
                    // SAFETY: a page-aligned part of the mapping made in
                    // `Buf::new`, which nothing here touches again; the
                    // registration stays (that is the point).
                    match unsafe { libc::munmap((p + num(1)) as *mut libc::c_void, num(2) as usize) } {
                        0 => "ok".into(),
                        _ => format!("err munmap: {}", std::io::Error::last_os_error()),
                    }
                }
                _ => "err unmap needs an --mmap buffer and a range inside it".into(),
            },
            "close_source" => match engine.close_source(Some(Duration::from_millis(num(1)))) {
                Ok(()) => "ok".into(),
                Err(e) => format!("err {} {}", e.status(), e.message()),
            },
            "stats" => engine.stats().to_json(),
            "retained" => engine.retained_resources().to_string(),
            "close" => {
                let r = engine.close(Some(Duration::from_secs(10)));
                reply(&match &r {
                    Ok(()) => "closed".to_string(),
                    Err(e) => format!("close failed: {e}"),
                });
                std::process::exit(if r.is_ok() { 0 } else { 1 });
            }
            "exit" => std::process::exit(0),
            _ => format!("unknown command {line:?}"),
        };
        reply(&format!("{from}{out}"));
    }
}
