//! `orbite-gpu-qual`: the GPU side of the hardware qualification
//! (`tests/hardware/qualify.py` drives it). Built with `--features cuda`.
//!
//! Source role: `orbite-gpu-qual source [--allocs N] [--size BYTES] [--seed S] [--config JSON] [--kind ipc|mnnvl|egm]`
//! allocates `allocate_ipc` device memory (or MNNVL / EGM memory), fills it with a pattern, registers
//! it, prints one JSON line, then obeys stdin commands: `verify I SEED OFF LEN`,
//! `close_source MS`, `stats`, `close`, `exit`.
//!
//! Requester role: `orbite-gpu-qual requester --endpoint EP --mode MODE --memory device|host|mixed [--seed S]
//! [--transport nvlink|mnnvl] [--handle posix_fd|fabric] [--fabric-domain HEX]`
//! runs one qualification mode against the source and prints `PASS ...` or
//! `FAIL ...` lines (and `WAIT ...` lines where the orchestrator acts).

use orbite::cuda::memory::{device_copy_gbps, device_to_host, host_to_device};
use orbite::{
    allocate_egm, allocate_mnnvl, allocate_pinned_host, Access, Allocation, CudaMemory, Engine, Op, Request,
    SubmitOptions, Transport, TransportKind,
};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(seed.wrapping_mul(7)).wrapping_add(i >> 12)) as u8
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

fn fill(a: &Allocation, seed: u64) {
    let bytes: Vec<u8> = (0..a.len()).map(|i| pattern(seed, i)).collect();
    host_to_device(a.addr(), &bytes).unwrap_or_else(|e| die(&e.to_string()));
}

fn source(args: &[String]) {
    let allocs: usize = arg(args, "--allocs").and_then(|v| v.parse().ok()).unwrap_or(1);
    let size: u64 = arg(args, "--size").and_then(|v| v.parse().ok()).unwrap_or(8 << 20);
    let seed: u64 = arg(args, "--seed").and_then(|v| v.parse().ok()).unwrap_or(1);
    let cfg = arg(args, "--config").unwrap_or_else(|| r#"{"nvlink": true}"#.into());
    let kind = arg(args, "--kind").unwrap_or_else(|| "ipc".into());
    let mnnvl = kind == "mnnvl";
    let e = Engine::from_json(&cfg).unwrap_or_else(|e| die(&e.to_string()));
    if mnnvl && cfg.contains("\"fabric\"") && !orbite::cuda::fabric::fabric_export_works(0).unwrap_or(false) {
        die("fabric handles are not supported here: a real fabric export fails (no IMEX channel?)");
    }
    let bufs: Vec<Allocation> = (0..allocs)
        .map(|n| {
            let a = match kind.as_str() {
                "mnnvl" => allocate_mnnvl(0, size),
                "egm" => allocate_egm(0, size),
                _ => CudaMemory::allocate_ipc(0, size),
            }
            .unwrap_or_else(|e| die(&e.to_string()));
            fill(&a, seed + n as u64);
            e.register_memory(a.addr(), size, Access::READ_WRITE).unwrap_or_else(|e| die(&e.to_string()));
            a
        })
        .collect();
    say(&serde_json::json!({"endpoint": e.endpoint(), "addrs": bufs.iter().map(|b| b.addr()).collect::<Vec<_>>(),
        "len": size, "pid": std::process::id()})
    .to_string());
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| -> u64 { w.get(i).and_then(|x| x.parse().ok()).unwrap_or(0) };
        let out = match w.first().copied().unwrap_or("") {
            "verify" => {
                let b = &bufs[n(1) as usize];
                let mut host = vec![0u8; n(4) as usize];
                match device_to_host(&mut host, b.addr() + n(3)) {
                    Ok(()) => match (0..host.len()).find(|&i| host[i] != pattern(n(2), i as u64)) {
                        None => "ok".to_string(),
                        Some(at) => format!("bad {at}"),
                    },
                    Err(e) => format!("err {e}"),
                }
            }
            "close_source" => match e.close_source(Some(Duration::from_millis(n(1)))) {
                Ok(()) => "ok".into(),
                Err(x) => format!("err {} {}", x.status(), x.message()),
            },
            "stats" => e.stats().to_json(),
            "close" => {
                let r = e.close(Some(Duration::from_secs(30)));
                say(if r.is_ok() { "closed" } else { "close failed" });
                std::process::exit(if r.is_ok() { 0 } else { 1 })
            }
            "exit" => std::process::exit(0),
            _ => format!("unknown {line:?}"),
        };
        say(&out);
    }
}

struct Req {
    e: Engine,
    peer: u64,
    remote: Vec<u64>,
    len: u64,
    local: Vec<Allocation>,
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
    /// Local buffer `i`: device, pinned host, or alternating for "mixed".
    fn new(args: &[String], cfg: &str) -> Req {
        let ep = arg(args, "--endpoint").unwrap_or_else(|| die("--endpoint"));
        let remote: Vec<u64> =
            arg(args, "--remote").unwrap_or_default().split(',').filter_map(|x| x.parse().ok()).collect();
        let len: u64 = arg(args, "--len").and_then(|v| v.parse().ok()).unwrap_or(8 << 20);
        let memory = arg(args, "--memory").unwrap_or_else(|| "device".into());
        let e = Engine::from_json(cfg).unwrap_or_else(|e| die(&e.to_string()));
        let local: Vec<Allocation> = (0..2)
            .map(|i| {
                let host = memory == "host" || (memory == "mixed" && i == 1);
                let a = if host { allocate_pinned_host(len) } else { CudaMemory::allocate(0, len) }
                    .unwrap_or_else(|e| die(&e.to_string()));
                e.register_memory(a.addr(), len, Access::NONE).unwrap_or_else(|e| die(&e.to_string()));
                a
            })
            .collect();
        let peer = e.connect(&ep, None).unwrap_or_else(|x| die(&x.to_string()));
        Req { e, peer, remote, len, local }
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
    let seed: u64 = arg(args, "--seed").and_then(|v| v.parse().ok()).unwrap_or(1);
    let cache = matches!(mode.as_str(), "cache" | "source-close" | "requester-exit" | "stale");
    let transport = arg(args, "--transport").unwrap_or_else(|| "nvlink".into());
    let entries = if cache { 4 } else { 0 };
    let cfg = if transport == "mnnvl" {
        let handle = arg(args, "--handle").unwrap_or_else(|| "posix_fd".into());
        let domain = arg(args, "--fabric-domain").map(|d| format!(r#", "fabric_domain": "{d}""#)).unwrap_or_default();
        let _ = TRANSPORT.set(TransportKind::Mnnvl);
        format!(r#"{{"mnnvl": {{"handle_type": "{handle}"{domain}}}, "nvlink_cache_entries": {entries}}}"#)
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
                // second half, stopping G bytes short of the end, then read
                // the half back: the written bytes, then the untouched tail.
                let w = Request { op: Op::Write, local_addr: l0, remote_addr: a + len / 2, len: len / 2 - G };
                r.run(&[w])?;
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
                Ok(format!("3 slices, {} imports", st.ipc[stat_key].imports_opened))
            })(),
        ),
        "cache" => result(
            &mode,
            (|| {
                let s = len / 8;
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
                r.e.flush_nvlink_cache(None).map_err(|x| x.to_string())?;
                let st = &r.e.stats().ipc[stat_key];
                if (st.imports_opened, st.imports_closed) != (1, 1) {
                    return Err(format!("wanted one import and one close, got {st:?}"));
                }
                Ok("4 READs + 1 WRITE through one import, one final close".into())
            })(),
        ),
        "source-close" | "requester-exit" | "stale" => {
            result(
                &mode,
                r.run(&[rd(l0, a, len)]).and_then(|_| r.check_local(0, 0, len, seed, 0)).map(|_| "cached".into()),
            );
            say(&format!("WAIT {mode}"));
            let cmd = wait_continue();
            match mode.as_str() {
                "requester-exit" => std::process::exit(0),
                "source-close" => {
                    result(&mode, r.e.flush_nvlink_cache(None).map(|_| "flushed".into()).map_err(|x| x.to_string()))
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
        "bandwidth" => {
            let reps = 20u32;
            let mut out = Vec::new();
            for op in [Op::Read, Op::Write] {
                let t0 = Instant::now();
                for _ in 0..reps {
                    let q = Request { op, local_addr: l0, remote_addr: a, len };
                    if let Err(x) = r.run(&[q]) {
                        result(&mode, Err(x));
                    }
                }
                out.push(len as f64 * reps as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
            let base = device_copy_gbps(len, reps).unwrap_or(0.0);
            say(&format!(
                "BANDWIDTH read_gbps={:.2} write_gbps={:.2} d2d_gbps={:.2} read_ratio={:.2} write_ratio={:.2}",
                out[0],
                out[1],
                base,
                out[0] / base.max(1e-9),
                out[1] / base.max(1e-9)
            ));
            result(&mode, Ok(format!("{len} bytes x {reps}")));
        }
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
        _ => die("usage: orbite-gpu-qual source|requester ..."),
    }
}
