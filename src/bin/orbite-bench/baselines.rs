//! The baselines each point is judged against, measured in the same run:
//! a plain TCP socket stream between two processes, a raw ping-pong's round
//! trip, single-thread memcpy over the same working set, the kernel's
//! `process_vm_readv`/`process_vm_writev` alone (`cma_raw`, one thread or
//! split like the copy pool), and CUDA device copies.

use super::*;
#[cfg(not(feature = "cuda"))]
use setups::NO_CUDA_BUILD;

/// The socket-baseline child: connects and streams blocks until `duration`.
pub(super) fn run_socket_source(o: &Opts) {
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

pub(super) fn socket_baseline(o: &Opts, bs: u64) -> f64 {
    socket_stream_gbps(o.buffer_size, o.duration, bs)
}

/// A plain TCP stream of `bs`-byte writes over loopback between two
/// processes for `duration` seconds, rotating over `buffer_size` bytes on
/// each side: GB/s received.
pub(super) fn socket_stream_gbps(buffer_size: u64, duration: f64, bs: u64) -> f64 {
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

/// Round trips of 64 bytes for `duration` over a raw stream pair, the echo
/// side on its own thread: a Unix socket pair (what an IPC round trip costs
/// at least) or, for tcp, a loopback TCP connection. (name, p50 us, p99 us).
pub(super) fn pingpong_baseline(transport: &str, duration: f64) -> (String, f64, f64) {
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
pub(super) fn memcpy_baseline(o: &Opts, bs: u64) -> f64 {
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
pub(super) fn cma_raw(c: &Setup, o: &Opts, op: Op, bs: u64, threads: usize) -> Option<(f64, f64)> {
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
pub(super) fn copiers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(8)
}

/// The baseline of one point, measured in this run (memoised per key).
pub(super) fn baseline_for(
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
pub(super) fn cuda_baseline(o: &Opts, op: Op, bs: u64) -> (String, f64) {
    let (a, b) = o.devices;
    cuda::baseline(op, &o.memory, a, b, bs, o.batch, o.buffer_size, o.duration).unwrap_or_else(|e| die(&e))
}

#[cfg(not(feature = "cuda"))]
pub(super) fn cuda_baseline(_: &Opts, _: Op, _: u64) -> (String, f64) {
    die(NO_CUDA_BUILD)
}
