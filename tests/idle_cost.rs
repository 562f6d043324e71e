//! What idle or stalled connections cost an engine. In a test binary of its
//! own: it measures this process's CPU time, which tests running beside it
//! would disturb.

mod common;

use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

/// 250 connections that sent half a frame header cost almost no CPU while
/// they wait for their handshake deadline (no polling loop).
#[test]
fn half_headers_cost_no_cpu() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // All 250 kept waiting in their handshake (by default one address
    // keeps 16 and the oldest are closed).
    let cfg = r#"{"handshake_timeout_ms": 30000, "max_pending_handshakes": 256,
                  "max_pending_handshakes_per_address": 256}"#;
    let src = Engine::from_json(cfg).unwrap();
    let ep = src.endpoint();
    let conns: Vec<TcpStream> = (0..250)
        .map(|_| {
            let mut s = TcpStream::connect(&ep).unwrap();
            s.write_all(&FrameHeader::encode(MsgKind::Describe, 10)[..8]).unwrap();
            s
        })
        .collect();
    // Let the serving threads start and block, then measure a window.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let share = cpu_share_over(std::time::Duration::from_secs(2));
    assert!(share < 0.10, "250 half headers cost {:.1}% of a core", share * 100.0);
    assert_eq!(src.stats().incoming_connections, 250);
    drop(conns);
}

/// This binary's tests measure the process's CPU time: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// utime + stime of this process, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11] + f[12]) as f64 / hz
}

/// The share of a core this process used over the next `window`.
fn cpu_share_over(window: std::time::Duration) -> f64 {
    let (c0, t0) = (cpu_seconds(), Instant::now());
    std::thread::sleep(window);
    (cpu_seconds() - c0) / t0.elapsed().as_secs_f64()
}

/// 2000 small READs one after the other between two engines of this
/// process, with `io_poll_us` as given; returns the engines' polled turns.
fn ping_pong(poll_us: u32) -> (Engine, Engine, u64) {
    let cfg = format!(r#"{{"io_threads": 1, "io_poll_us": {poll_us}}}"#);
    let src = Engine::from_json(&cfg).unwrap();
    let remote = vec![7u8; 4096];
    src.register_memory(remote.as_ptr() as u64, 4096, Access::READ).unwrap();
    let req = Engine::from_json(&cfg).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::WRITE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote.as_ptr() as u64, len: 4096 };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(common::LONG) };
    for _ in 0..2000 {
        req.submit(peer, &[r], opts).unwrap().wait(common::LONG).unwrap();
    }
    assert!(local.iter().all(|b| *b == 7));
    let polled = src.stats().io.polled_turns + req.stats().io.polled_turns;
    (src, req, polled)
}

/// I/O threads whose events come close together poll for the next one
/// (some of 2000 back-to-back round trips are caught polling; none with
/// `io_poll_us` 0), and stop once the traffic does: the engines, still
/// connected, then cost almost no CPU. The polling run uses the largest
/// window (10 ms): on two loaded cores a round trip can take longer than
/// the default 200 us, and then no turn of the 2000 is close enough to poll.
/// Where the host is busy enough that yields come back late, polling is off
/// by design (`sync/spin.rs`); such a run must show its late yields, and up
/// to 20 runs are watched for one that polls.
#[test]
fn io_threads_poll_only_while_events_come_close_together() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_s, _r, polled) = ping_pong(0);
    assert_eq!(polled, 0);
    drop((_s, _r));
    // A busy host turns polling off (`orbite::sync::spin`: a yield that
    // came back late), as designed; a run that polled nothing must show
    // the late yield that explains it, and the next run is watched.
    // A late yield keeps polling off for up to a second after it, into
    // the next run, so the late yields are counted from the first run on.
    let mut runs = Vec::new();
    let late_before = orbite::sync::spin::late_yields();
    let (src, req) = loop {
        let (src, req, polled) = ping_pong(10_000);
        let late = orbite::sync::spin::late_yields() - late_before;
        runs.push((polled, late));
        assert!(polled > 0 || late > 0, "no turn of 2000 round trips was caught polling, and no late yield turned polling off: (polled, late yields so far) {runs:?}");
        if polled > 0 || runs.len() == 20 {
            break (src, req);
        }
    };
    let share = cpu_share_over(std::time::Duration::from_secs(1));
    assert!(share < 0.10, "idle engines cost {:.1}% of a core after their traffic", share * 100.0);
    assert_eq!(req.stats().peers_alive, 1);
    drop(src);
}

/// Timers come from the cores: two engines connected over TCP, their READ
/// done, wake no I/O thread while nothing is due (the reactor used to tick
/// every connection every 50 ms under its lock whatever was due: about 20
/// wake-ups a second per thread). A turn is checked once more, a tick
/// later; then nothing is due, so windows of a second are watched until
/// one passes without a wake-up (the first may hold that check, late on a
/// loaded machine).
#[test]
fn an_idle_connected_pair_wakes_no_io_thread() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = r#"{"io_threads": 1}"#;
    let src = Engine::from_json(cfg).unwrap();
    let remote = vec![9u8; 4096];
    src.register_memory(remote.as_ptr() as u64, 4096, Access::READ).unwrap();
    let req = Engine::from_json(cfg).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::WRITE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote.as_ptr() as u64, len: 4096 };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(common::LONG) };
    req.submit(peer, &[r], opts).unwrap().wait(common::LONG).unwrap();
    assert!(local.iter().all(|b| *b == 9));
    let wakeups = || src.stats().io.wakeups + req.stats().io.wakeups;
    let mut seen = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..5 {
        let before = wakeups();
        cpu.push(cpu_share_over(std::time::Duration::from_secs(1)));
        seen.push(wakeups() - before);
        if seen.last() == Some(&0) {
            break;
        }
    }
    eprintln!("idle pair: I/O wake-ups per 1 s window {seen:?}, CPU share {cpu:.4?}");
    assert_eq!(seen.last(), Some(&0), "idle engines woke their I/O threads in every 1 s window: {seen:?}");
    assert_eq!(req.stats().peers_alive, 1);
}
