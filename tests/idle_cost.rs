//! What idle or stalled connections cost an engine. In a test binary of its
//! own: it measures this process's CPU time, which tests running beside it
//! would disturb.

use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

/// 250 connections that sent half a frame header cost almost no CPU while
/// they wait for their handshake deadline (no polling loop).
#[test]
fn half_headers_cost_no_cpu() {
    let src = Engine::from_json(r#"{"handshake_timeout_ms": 30000}"#).unwrap();
    let ep = src.endpoint();
    let conns: Vec<TcpStream> = (0..250)
        .map(|_| {
            let mut s = TcpStream::connect(&ep).unwrap();
            s.write_all(&FrameHeader::encode(MsgKind::Describe, 10)[..8]).unwrap();
            s
        })
        .collect();
    let cpu = || {
        // utime + stime of this process, in clock ticks.
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        f[11] + f[12]
    };
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // Let the serving threads start and block, then measure a window.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (c0, t0) = (cpu(), Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = (cpu() - c0) as f64 / hz;
    let share = used / t0.elapsed().as_secs_f64();
    assert!(share < 0.10, "250 half headers cost {:.1}% of a core", share * 100.0);
    assert_eq!(src.stats().incoming_connections, 250);
    drop(conns);
}
