mod common;
use common::{pattern_vec, raw_control};
use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::*;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static READ_BACK: std::sync::OnceLock<Arc<AtomicU64>> = std::sync::OnceLock::new();
#[test]
#[ignore]
fn measure() {
    let regions: usize = std::env::var("REGIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    const BLOCK: usize = 4096;
    let src = Engine::from_json(r#"{"io_threads": 1, "handshake_timeout_ms": 60000}"#).unwrap();
    let blocks: Vec<Vec<u8>> = (0..regions as u64).map(|i| pattern_vec(i, BLOCK)).collect();
    for b in &blocks {
        src.register_memory(b.as_ptr() as u64, BLOCK as u64, Access::READ).unwrap();
    }
    let req = Engine::from_json("{}").unwrap();
    let mut local = vec![0u8; BLOCK];
    req.register_memory(local.as_mut_ptr() as u64, BLOCK as u64, Access::READ_WRITE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(30)) };
    let mut run = |k0: usize| -> Vec<f64> {
        let mut v = Vec::new();
        for k in k0..k0 + n {
            let r = Request {
                op: Op::Read,
                local_addr: local.as_mut_ptr() as u64,
                remote_addr: blocks[k % regions].as_ptr() as u64,
                len: BLOCK as u64,
            };
            let t = Instant::now();
            req.submit(peer, &[r], opts).unwrap().wait(Duration::from_secs(60)).unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v
    };
    let q = run(0);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (mut flooder, _d) = raw_control(&src.endpoint());
    if std::env::var("READER").is_ok() {
        let mut r = flooder.try_clone().unwrap();
        let rd = Arc::new(AtomicU64::new(0));
        let rd2 = rd.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut b = vec![0u8; 1 << 20];
            while let Ok(n) = r.read(&mut b) {
                if n == 0 {
                    break;
                }
                rd2.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
        READ_BACK.set(rd).ok();
    }
    let (st, se) = (stop.clone(), sent.clone());
    let t = std::thread::spawn(move || {
        let flood: Vec<u8> = (0..4096).flat_map(|_| FrameHeader::encode(MsgKind::DescribeRequest, 0)).collect();
        while !st.load(Ordering::Relaxed) {
            if flooder.write_all(&flood).is_err() {
                break;
            }
            se.fetch_add(flood.len() as u64, Ordering::Relaxed);
        }
    });
    // let the flood start
    while sent.load(Ordering::Relaxed) < 1 << 20 {
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    let s0 = sent.load(Ordering::Relaxed);
    let f = run(n);
    let secs = t0.elapsed().as_secs_f64();
    let s1 = sent.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let p = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q) as usize];
    println!("regions {regions} n {n}: quiet p50 {:.1} us p90 {:.1} us p99 {:.1} us mean {:.1} | flood p50 {:.1} us p90 {:.1} us p99 {:.1} us mean {:.1}; flood {:.1} MB/s ({:.1} s)",
        p(&q, 0.5), p(&q, 0.9), p(&q, 0.99), q.iter().sum::<f64>() / q.len() as f64, p(&f, 0.5), p(&f, 0.9), p(&f, 0.99), f.iter().sum::<f64>() / f.len() as f64, (s1 - s0) as f64 / secs / 1e6, secs);
    if let Some(r) = READ_BACK.get() {
        let r = r.load(Ordering::Relaxed);
        println!("flooder read back {:.1} MB ({:.1} MB/s)", r as f64 / 1e6, r as f64 / secs / 1e6);
    }
    drop(t);
    std::process::exit(0);
}
