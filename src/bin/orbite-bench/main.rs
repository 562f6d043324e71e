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

mod baselines;
#[cfg(feature = "cuda")]
mod cuda;
mod kv_flow;
mod kv_pattern;
mod options;
mod plot;
mod report;
mod setups;

use baselines::{baseline_for, cma_raw, copiers, pingpong_baseline, run_socket_source, socket_stream_gbps};
use options::{die, list, parse_opts, parse_size, Opts};
use report::{fmt_size, op_name, percentile, print_table, Point};
use setups::{cuda_setup, foreign_for, host_setup, is_cuda_transport, target_memory, touch, transport_of, Setup};

use orbite::{allocate_shared_host, Access, Engine, Op, Request, SubmitOptions, Transport, TransportKind};
use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
