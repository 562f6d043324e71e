//! The cooperative IPC protocol over SHM between real processes: the seed's
//! qualification shapes, the relocation cache, closes, killed processes,
//! stale identities and injected faults.

mod common;

use common::*;
use orbite::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The uncached protocol (the relocation cache is on by default): an
/// import per subbatch, closed with its receipt.
const UNCACHED: &str = r#"{"shm_cache_entries": 0}"#;

fn engine(json: &str) -> Engine {
    Engine::from_json(json).expect("engine")
}

fn shm() -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) }
}

fn local(e: &Engine, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    e.register_memory(v.as_mut_ptr() as u64, len as u64, Access::NONE).unwrap();
    v
}

fn rd(local: &[u8], loff: usize, remote: u64, len: u64) -> Request {
    Request { op: Op::Read, local_addr: local.as_ptr() as u64 + loff as u64, remote_addr: remote, len }
}

fn wr(local: &[u8], loff: usize, remote: u64, len: u64) -> Request {
    Request { op: Op::Write, local_addr: local.as_ptr() as u64 + loff as u64, remote_addr: remote, len }
}

fn go(e: &Engine, peer: u64, reqs: &[Request], opts: SubmitOptions) -> Vec<RequestResult> {
    let b = e.submit(peer, reqs, opts).unwrap();
    let _ = b.wait(LONG);
    assert_ne!(b.poll(), Status::Pending);
    b.results()
}

fn all_ok(r: &[RequestResult]) -> bool {
    r.iter().all(|x| x.status == Status::Ok)
}

fn src_ipc(src: &mut PeerProc, key: &str) -> u64 {
    src.stats()["ipc"]["shm"][key].as_u64().unwrap()
}

fn region_id(e: &Engine, peer: u64, addr: u64) -> u64 {
    e.peer_regions(peer, None).unwrap().iter().find(|r| r.addr == addr).expect("region").id
}

#[test]
fn healthy_read_write_and_selection() {
    let mut src = PeerProc::spawn(&["--shared", "--size", &(4 * MIB).to_string(), "--seed", "2"]);
    let e = engine("");
    let mut l = local(&e, 4 * MIB as usize);
    let p = e.connect(&src.endpoint, None).unwrap();
    assert!(all_ok(&go(&e, p, &[rd(&l, 0, src.addr, 4 * MIB)], shm())));
    assert!((0..4 * MIB as usize).all(|i| l[i] == pattern(2, i as u64)));
    for (i, b) in l.iter_mut().enumerate().take(MIB as usize) {
        *b = pattern(6, i as u64);
    }
    // Auto picks SHM for shared memory (policy: mnnvl, nvlink, shm, tcp).
    let r = go(&e, p, &[wr(&l, 0, src.addr + 5, MIB)], SubmitOptions::default());
    assert_eq!(r[0], RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied });
    assert_eq!(src.cmd(&format!("verify 6 5 {MIB}")), "ok");
    let st = e.stats();
    assert_eq!(st.transports["shm"].requests_completed, 2);
    assert_eq!(st.transports["shm"].bytes_completed, 5 * MIB, "byte accounting counts requested bytes only");
    assert_eq!(st.transports["tcp"].requests_completed, 0);
    // Cached (the default): the READ-only import, then a writable one that
    // replaced it (the READ-only one was closed), charged once.
    let ipc = &st.ipc["shm"];
    assert_eq!((ipc.imports.opened, ipc.imports.closed, ipc.imports.cached), (2, 1, 1));
    assert_eq!(ipc.mapping_bytes_charged, 4 * MIB);
    assert_eq!(src_ipc(&mut src, "exports_open"), 1);
    e.flush_nvlink_cache(Some(LONG)).unwrap();
    assert_eq!(e.stats().ipc["shm"].mapping_bytes_charged, 0);
    assert_eq!(src_ipc(&mut src, "exports_open"), 0);
    // Without a cache AUTO prefers TCP (each subbatch would map the whole
    // allocation), and says so in the stats' notes.
    let u = engine(UNCACHED);
    let ul = local(&u, 4096);
    let up = u.connect(&src.endpoint, None).unwrap();
    let b = u.submit(up, &[rd(&ul, 0, src.addr, 4096)], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp));
    assert!(u.stats().notes.iter().any(|n| n.contains("shm_cache_entries is 0")), "{:?}", u.stats().notes);
    u.close(Some(LONG)).unwrap();

    // Plain heap memory is never exported over SHM: Auto takes CMA (TCP
    // where CMA cannot reach the peer), SHM is refused.
    let heap = PeerProc::spawn(&["--size", "65536", "--seed", "4"]);
    let hp = e.connect(&heap.endpoint, None).unwrap();
    assert!(all_ok(&go(&e, hp, &[rd(&l, 0, heap.addr, 65536)], SubmitOptions::default())));
    assert!((0..65536).all(|i| l[i] == pattern(4, i as u64)));
    assert_eq!(e.stats().transports["cma"].requests_completed, 1);
    assert_eq!(e.stats().transports["tcp"].requests_completed, 0);
    let err = e.submit(hp, &[rd(&l, 0, heap.addr, 16)], shm()).err().unwrap();
    assert_eq!(err.status(), Status::NotSupported, "{err}");
    e.close(Some(LONG)).unwrap();
    src.close();
    heap.close();
}

#[test]
fn three_out_of_order_slices_over_two_allocations() {
    let src = PeerProc::spawn(&["--shared", "--allocs", "2", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let e = engine("");
    let mut l = local(&e, 3 * 8192);
    let p = e.connect(&src.endpoint, None).unwrap();
    let r = go(&e, p, &[rd(&l, 0, a + 8192, 8192), rd(&l, 8192, a, 8192), rd(&l, 16384, b + 4096, 8192)], shm());
    assert!(all_ok(&r));
    assert!((0..8192).all(|i| l[i] == pattern(1, 8192 + i as u64)));
    assert!((0..8192).all(|i| l[8192 + i] == pattern(1, i as u64)));
    assert!((0..8192).all(|i| l[16384 + i] == pattern(2, 4096 + i as u64)));
    // Two subbatches: the two slices of A share one import.
    assert_eq!(e.stats().ipc["shm"].imports.opened, 2);
    // WRITE the same three slices back in another order, then verify remotely.
    for (i, x) in l.iter_mut().enumerate() {
        *x = pattern(9, i as u64);
    }
    let r = go(&e, p, &[wr(&l, 16384, b, 8192), wr(&l, 0, a + 4 * 8192, 8192), wr(&l, 8192, a + 8192, 8192)], shm());
    assert!(r.iter().all(|x| *x == RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied }));
    // Read the three slices back over TCP (an independent path) and compare.
    let back = local(&e, 3 * 8192);
    let tcp = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(LONG) };
    let r =
        go(&e, p, &[rd(&back, 0, b, 8192), rd(&back, 8192, a + 4 * 8192, 8192), rd(&back, 16384, a + 8192, 8192)], tcp);
    assert!(all_ok(&r));
    assert_eq!(&back[0..8192], &l[16384..24576]);
    assert_eq!(&back[8192..16384], &l[0..8192]);
    assert_eq!(&back[16384..24576], &l[8192..16384]);
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn overlapping_destinations_run_in_order() {
    let src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "3"]);
    let e = engine("");
    let mut l = local(&e, 4096);
    for (i, x) in l.iter_mut().enumerate().skip(200).take(100) {
        *x = (i as u8) ^ 0x5a;
    }
    let p = e.connect(&src.endpoint, None).unwrap();
    let a = src.addr;
    let reqs = [
        rd(&l, 0, a, 100),          // local [0,100)
        rd(&l, 50, a + 1000, 100),  // overlaps the first destination: must land after it
        wr(&l, 200, a + 5000, 100), // writes remote [5000,5100)
        rd(&l, 400, a + 5000, 100), // reads what the WRITE wrote: ordered after it
    ];
    let r = go(&e, p, &reqs, shm());
    assert!(all_ok(&r));
    assert!((0..50).all(|i| l[i] == pattern(3, i as u64)));
    assert!((0..100).all(|i| l[50 + i] == pattern(3, 1000 + i as u64)));
    assert!((0..100).all(|i| l[400 + i] == ((200 + i) as u8) ^ 0x5a));
    assert_eq!(e.stats().ipc["shm"].imports.opened, 1);
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn cache_four_concurrent_reads_share_one_import_and_a_write_trades_it_for_a_writable_one() {
    let mut src = PeerProc::spawn(&["--shared", "--size", &(4 * MIB).to_string(), "--seed", "5"]);
    let e = engine(r#"{"shm_cache_entries": 4}"#);
    let p = e.connect(&src.endpoint, None).unwrap();
    let a = src.addr;
    // Registered up front and kept to the end (a freed, still registered
    // buffer's memory could come back to a later allocation, which its
    // registration would overlap).
    let locals: Vec<Vec<u8>> = (0..4).map(|_| local(&e, MIB as usize)).collect();
    std::thread::scope(|s| {
        for (t, l) in (0..4u64).zip(&locals) {
            let e = &e;
            s.spawn(move || {
                let r = go(e, p, &[rd(l, 0, a + t * MIB / 2, MIB / 2)], shm());
                assert!(all_ok(&r), "{r:?}");
                assert!((0..(MIB / 2) as usize).all(|i| l[i] == pattern(5, t * MIB / 2 + i as u64)));
            });
        }
    });
    // One READ-only import served the four readers.
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.cached, st.imports.closed), (1, 1, 0), "{st:?}");
    // A WRITE gives the READ-only import back (the source lends the
    // allocation alone to a writer) and caches a writable one.
    let mut w = local(&e, MIB as usize);
    for (i, x) in w.iter_mut().enumerate() {
        *x = pattern(8, i as u64);
    }
    let r = go(&e, p, &[wr(&w, 0, a + 3 * MIB, MIB)], shm());
    assert_eq!(r[0].remote_effect, RemoteEffect::Applied, "{r:?} {:?}", e.stats().ipc);
    // Later READs use the writable import: nothing new is opened.
    let l = local(&e, 4096);
    assert!(all_ok(&go(&e, p, &[rd(&l, 0, a + 3 * MIB, 4096)], shm())));
    assert!((0..4096).all(|i| l[i] == pattern(8, i as u64)));
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.cached, st.imports.closed), (2, 1, 1), "{st:?}");
    assert_eq!(src_ipc(&mut src, "exports_open"), 1, "the export stays for the cache lifetime");
    assert_eq!(src.cmd(&format!("verify 8 {} {MIB}", 3 * MIB)), "ok");
    e.flush_nvlink_cache(Some(LONG)).unwrap();
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.cached, st.imports.closed), (2, 0, 2));
    assert_eq!(st.mapping_bytes_charged, 0);
    assert_eq!(src_ipc(&mut src, "exports_open"), 0);
    let shm = &src.stats()["transports"]["shm"];
    let (served, claimed) = (shm["served_requests"].as_u64().unwrap(), shm["claimed_requests"].as_u64().unwrap());
    assert_eq!(served + claimed, 6, "{shm}");
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn lru_with_one_and_two_entries() {
    let src = PeerProc::spawn(&["--shared", "--allocs", "3", "--size", &(2 * MIB).to_string()]);
    let (a, b, c) = (src.addrs[0], src.addrs[1], src.addrs[2]);

    let e1 = engine(r#"{"shm_cache_entries": 1}"#);
    let l1 = local(&e1, 4096);
    let p1 = e1.connect(&src.endpoint, None).unwrap();
    let (ra, rb) = (region_id(&e1, p1, a), region_id(&e1, p1, b));
    assert!(all_ok(&go(&e1, p1, &[rd(&l1, 0, a, 4096)], shm())));
    assert!(all_ok(&go(&e1, p1, &[rd(&l1, 0, b, 4096)], shm())));
    let st = e1.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.cached), (2, 1, 1));
    assert_eq!(e1.retained_resources()["shm"]["cached_regions"], serde_json::json!([rb]));
    let _ = ra;

    let e2 = engine(r#"{"shm_cache_entries": 2}"#);
    let l2 = local(&e2, 4096);
    let p2 = e2.connect(&src.endpoint, None).unwrap();
    let (ra, rc) = (region_id(&e2, p2, a), region_id(&e2, p2, c));
    // e1 still holds B: e2 uses A, then C... but first free B from e1.
    e1.flush_nvlink_cache(Some(LONG)).unwrap();
    for addr in [a, b, a, c] {
        assert!(all_ok(&go(&e2, p2, &[rd(&l2, 0, addr, 4096)], shm())));
    }
    // B was the least recently used idle entry when C arrived.
    let st = e2.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.cached), (3, 1, 2));
    assert_eq!(e2.retained_resources()["shm"]["cached_regions"], serde_json::json!([ra, rc]));
    e1.close(Some(LONG)).unwrap();
    e2.close(Some(LONG)).unwrap();
    assert_eq!(e2.stats().ipc["shm"].imports.closed, 3);
    src.close();
}

#[test]
fn flush_under_concurrent_submissions() {
    let src = PeerProc::spawn(&["--shared", "--allocs", "2", "--size", &(2 * MIB).to_string(), "--seed", "7"]);
    let e = engine(r#"{"shm_cache_entries": 2}"#);
    let p = e.connect(&src.endpoint, None).unwrap();
    let addrs = src.addrs.clone();
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Registered before any thread starts and kept until every one ended:
    // a buffer freed while still registered could be handed out again to a
    // later thread's allocation, which its registration would overlap.
    let locals: Vec<Vec<u8>> = (0..3).map(|_| local(&e, 65536)).collect();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (t, l) in locals.iter().enumerate() {
            let (e, addrs, stop) = (&e, &addrs, &stop);
            hs.push(s.spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) || n < 20 {
                    let which = (t + n as usize) % 2;
                    let off = (n * 4096) % MIB;
                    let r = go(e, p, &[rd(l, 0, addrs[which] + off, 65536)], shm());
                    assert!(all_ok(&r), "{r:?}");
                    assert!((0..65536).all(|i| l[i] == pattern(7 + which as u64, off + i as u64)));
                    n += 1;
                }
                n
            }));
        }
        for _ in 0..10 {
            e.flush_nvlink_cache(Some(LONG)).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let total: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(total >= 60);
    });
    e.flush_nvlink_cache(Some(LONG)).unwrap();
    let st = e.stats().ipc["shm"].clone();
    assert_eq!(st.imports.cached, 0);
    assert_eq!(st.imports.opened, st.imports.closed);
    assert_eq!(e.stats().transports["shm"].requests_failed, 0);
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn source_close_revokes_live_imports_and_waits_only_for_a_silent_requester() {
    // The source is this process; the requester holding a cached import is
    // an orbite-peer process.
    let src = engine("");
    let a = allocate_shared_host(2 * MIB).unwrap();
    src.register_memory(a.addr(), 2 * MIB, Access::READ).unwrap();
    let spec = format!("{}:4096", a.addr());
    let cfg = r#"{"shm_cache_entries": 1}"#;
    let mut req = PeerProc::spawn_requester(&src.endpoint(), &spec, cfg);
    assert_eq!(src.stats().ipc["shm"].exports.open, 1, "the requester caches its import");
    // A live requester gives its import back when asked: the close is OK.
    src.close_source(Some(LONG)).unwrap();
    assert_eq!(src.stats().ipc["shm"].exports.open, 0);
    // The source released the export before its ACK left; the requester
    // counts the import closed once it has read the ACK.
    let t0 = Instant::now();
    let st = loop {
        let st: serde_json::Value = serde_json::from_str(&req.cmd("stats")).unwrap();
        if st["ipc"]["shm"]["imports_closed"] != 0 || t0.elapsed() > LONG {
            break st;
        }
        std::thread::yield_now();
    };
    assert_eq!(st["ipc"]["shm"]["imports_cached"], 0);
    assert_eq!(st["ipc"]["shm"]["imports_closed"], 1);
    req.kill();
    src.close(Some(LONG)).unwrap();

    // A silent (frozen) requester leaves the export retained and the close
    // Unquiesced; once it resumes it gives the import back.
    let src = engine("");
    src.register_memory(a.addr(), 2 * MIB, Access::READ).unwrap();
    let req = PeerProc::spawn_requester(&src.endpoint(), &spec, cfg);
    req.signal(libc::SIGSTOP);
    let e = src.close_source(Some(Duration::from_millis(500))).unwrap_err();
    assert_eq!(e.status(), Status::Unquiesced, "{e}");
    assert_eq!(src.stats().ipc["shm"].exports.open, 1, "the export stays retained");
    req.signal(libc::SIGCONT);
    src.close_source(Some(LONG)).unwrap();
    req.kill();
    src.close(Some(LONG)).unwrap();
    a.free().unwrap();
}
#[test]
fn requester_exit_with_a_live_import() {
    let src = engine("");
    let a = allocate_shared_host(2 * MIB).unwrap();
    let rid = src.register_memory(a.addr(), 2 * MIB, Access::READ).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orbite-peer"))
        .args([
            "--connect",
            &src.endpoint(),
            "--read",
            &format!("{}:4096", a.addr()),
            "--config",
            r#"{"shm_cache_entries": 1}"#,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::{BufRead, Write};
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ok "), "{line}");
    assert_eq!(src.stats().ipc["shm"].exports.open, 1);
    // The requester exits without closing. Before it is reaped it is a
    // zombie, whose memory (and mapping) the kernel already released: the
    // source's watch on it reclaims the export while the source runs.
    writeln!(child.stdin.as_mut().unwrap(), "exit").unwrap();
    let t0 = Instant::now();
    while src.stats().ipc["shm"].exports.reclaimed_after_exit != 1 {
        assert!(t0.elapsed() < LONG, "the export was never reclaimed");
        std::thread::sleep(Duration::from_millis(2));
    }
    let st = src.stats().ipc["shm"].clone();
    assert_eq!((st.exports.open, st.exports.retained, st.mapping_bytes_charged), (0, 0, 0));
    child.wait().unwrap();
    src.close_source(Some(LONG)).unwrap();
    let st = src.stats().ipc["shm"].clone();
    assert_eq!((st.exports.open, st.exports.retained, st.mapping_bytes_charged), (0, 0, 0));
    src.unregister_memory(rid, None).unwrap_or(());
    drop(src);
    a.free().unwrap();
}

#[test]
fn exporter_killed_with_a_live_import() {
    let src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string()]);
    let e = engine(r#"{"shm_cache_entries": 1}"#);
    let l = local(&e, 4096);
    let p = e.connect(&src.endpoint, None).unwrap();
    assert!(all_ok(&go(&e, p, &[rd(&l, 0, src.addr, 4096)], shm())));
    let addr = src.addr;
    src.kill();
    let t0 = Instant::now();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(Duration::from_secs(20)) };
    match e.submit(p, &[rd(&l, 0, addr, 16)], opts) {
        Err(err) => assert!(matches!(err.status(), Status::Unavailable | Status::StalePeer), "{err}"),
        Ok(b) => {
            assert!(b.wait(LONG).is_err());
            assert_eq!(b.results()[0].remote_effect, RemoteEffect::None);
        }
    }
    // The exporter provably exited: its export went with it, so the cached
    // import is unmapped and released without a receipt.
    e.flush_nvlink_cache(Some(Duration::from_secs(20))).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(60), "never hangs");
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.retained, st.imports.cached, st.imports.released_after_exit), (0, 0, 1));
    assert_eq!(st.mapping_bytes_charged, 0);
    e.close(Some(Duration::from_secs(20))).unwrap();
}
#[test]
fn restarted_source_on_the_same_endpoint_is_stale() {
    let src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let endpoint = src.endpoint.clone();
    let e = engine(r#"{"shm_cache_entries": 2}"#);
    let l = local(&e, 4096);
    let p = e.connect(&endpoint, None).unwrap();
    assert!(all_ok(&go(&e, p, &[rd(&l, 0, src.addr, 4096)], shm())));
    src.kill();
    let cfg = format!(r#"{{"listen": "{endpoint}"}}"#);
    let mut again = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "2", "--config", &cfg]);
    assert_eq!(again.endpoint, endpoint);
    // The old peer is gone: refused, not silently served by the new process.
    let err = e.submit(p, &[rd(&l, 0, again.addr, 16)], shm()).err().expect("stale peer refused");
    assert!(matches!(err.status(), Status::Unavailable | Status::StalePeer), "{err}");
    // A new connection sees the new identity and gets a new import.
    let p2 = e.connect(&endpoint, None).unwrap();
    assert!(all_ok(&go(&e, p2, &[rd(&l, 0, again.addr, 4096)], shm())));
    assert!((0..4096).all(|i| l[i] == pattern(2, i as u64)));
    assert_eq!(e.stats().ipc["shm"].imports.opened, 2);
    assert_eq!(src_ipc(&mut again, "exports_open"), 1);
    // Closing: the new import closes with its receipt; the old one's
    // exporter provably exited, so it is released without one.
    e.close(Some(LONG)).unwrap();
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.retained, st.imports.released_after_exit, st.imports.closed), (0, 1, 1));
    assert_eq!(src_ipc(&mut again, "exports_open"), 0);
    drop(e);
    again.close();
}

/// Injected faults over the uncached protocol: a failed native close, one
/// and then two lost ACKs, a failed completion. Each failed group reports
/// its WRITEs' remote effect UNKNOWN (the copy may have written the
/// source's memory), its READs' NONE. Guards `outcome`'s
/// `RemoteEffect::of_uncertain(op)` (`transport/ipc/requester/finished.rs`)
/// (round 10 J9), and the retained import's accounting.
#[test]
fn injected_faults_failed_close_lost_ack_failed_completion() {
    let mut src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let e = engine(UNCACHED);
    let l = local(&e, 65536);
    let p = e.connect(&src.endpoint, None).unwrap();
    let a = src.addr;

    // Failed native close: the group fails Unquiesced, WRITE effect Unknown,
    // the import stays retained and the source keeps its export.
    e.faults().fail_close.store(1, Ordering::SeqCst);
    let r = go(&e, p, &[wr(&l, 0, a, 4096), rd(&l, 8192, a + 8192, 16)], shm());
    assert_eq!(r[0], RequestResult { status: Status::Unquiesced, remote_effect: RemoteEffect::Unknown });
    assert_eq!(r[1], RequestResult { status: Status::Unquiesced, remote_effect: RemoteEffect::None });
    assert_eq!(e.stats().ipc["shm"].imports.retained, 1);
    assert_eq!(src_ipc(&mut src, "exports_open"), 1);
    // The process-wide report (orbite_cuda_retained_resources_json) shows it.
    let all: serde_json::Value = serde_json::from_str(&retained_resources_json()).unwrap();
    assert_eq!(all["engines"][e.endpoint()]["shm"]["retained_imports"], 1, "{all}");
    // The retained export does not fence the allocation off: writes
    // through the source's own side (TCP) still land beside it.
    let tcp = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(LONG) };
    let r = go(&e, p, &[wr(&l, 0, a, 16)], tcp);
    assert_eq!(r[0], RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied });
    e.close(Some(Duration::from_secs(5))).unwrap_err();
    drop(e);
    src.kill();

    let mut src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let e = engine(UNCACHED);
    let l = local(&e, 65536);
    let p = e.connect(&src.endpoint, None).unwrap();
    let a = src.addr;
    // One lost ACK: the receipt alone is retried, the request completes.
    e.faults().lose_ack.store(1, Ordering::SeqCst);
    let r = go(&e, p, &[rd(&l, 0, a, 4096)], shm());
    assert!(all_ok(&r));
    assert_eq!(e.stats().ipc["shm"].imports.closed, 1);
    // Two lost ACKs: the request fails (WRITE effect Unknown), the native
    // close is never repeated, and a later flush retries only the receipt.
    e.faults().lose_ack.store(2, Ordering::SeqCst);
    let r = go(&e, p, &[wr(&l, 0, a, 4096)], shm());
    assert_eq!(r[0].remote_effect, RemoteEffect::Unknown);
    assert_ne!(r[0].status, Status::Ok);
    assert_eq!(e.stats().ipc["shm"].imports.retained, 1);
    e.flush_nvlink_cache(Some(LONG)).unwrap();
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.retained, st.imports.closed), (0, 2));
    assert_eq!(src_ipc(&mut src, "exports_open"), 0);
    // Failed completion: Unquiesced, retained, no receipt.
    e.faults().fail_completion.store(1, Ordering::SeqCst);
    let r = go(&e, p, &[rd(&l, 0, a, 4096)], shm());
    assert_eq!(r[0].status, Status::Unquiesced);
    assert_eq!(e.stats().ipc["shm"].imports.retained, 1);
    assert_eq!(src_ipc(&mut src, "exports_open"), 1);
    drop(e);
    src.kill();
}

#[test]
fn resource_exhausted_retries_once_then_falls_through() {
    let cfg = r#"{"max_inflight_bytes": 2097152, "max_transfer_bytes": 1048576}"#;
    let src = PeerProc::spawn(&[
        "--shared",
        "--allocs",
        "2",
        "--size",
        &(2 * MIB).to_string(),
        "--seed",
        "1",
        "--config",
        cfg,
    ]);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    // X keeps A exported: the source's mapping budget (2 MiB) is now full.
    let x = engine(r#"{"shm_cache_entries": 1}"#);
    let lx = local(&x, 4096);
    let px = x.connect(&src.endpoint, None).unwrap();
    assert!(all_ok(&go(&x, px, &[rd(&lx, 0, a, 4096)], shm())));

    let y = engine("");
    let ly = local(&y, 8192);
    let py = y.connect(&src.endpoint, None).unwrap();
    // SHM only: explicit ResourceExhausted before any grant, one retry each, then final.
    let r = go(&y, py, &[rd(&ly, 0, b, 4096), rd(&ly, 4096, b + 4096, 4096)], shm());
    assert!(
        r.iter().all(|x| *x == RequestResult { status: Status::ResourceExhausted, remote_effect: RemoteEffect::None }),
        "{r:?}"
    );
    assert_eq!(y.stats().ipc["shm"].imports.opened, 0);
    // Auto: the unposted rejection falls through to TCP.
    let r = go(&y, py, &[rd(&ly, 0, b, 4096), rd(&ly, 4096, b + 4096, 4096)], SubmitOptions::default());
    assert!(all_ok(&r), "{r:?}");
    assert!((0..8192).all(|i| ly[i] == pattern(2, i as u64)));
    assert_eq!(y.stats().transports["tcp"].requests_completed, 2);
    // A is exported to X: TCP reads and writes it beside X's import.
    let tcp = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(LONG) };
    assert!(all_ok(&go(&y, py, &[rd(&ly, 0, a, 16)], tcp)));
    assert!(all_ok(&go(&y, py, &[wr(&ly, 0, a, 16)], tcp)));
    x.close(Some(LONG)).unwrap();
    let r = go(&y, py, &[wr(&ly, 0, a, 16)], SubmitOptions::default());
    assert!(all_ok(&r));
    y.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn uncertain_entries_stay_retained_outside_the_cache_bound() {
    let src = PeerProc::spawn(&["--shared", "--allocs", "2", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let e = engine(r#"{"shm_cache_entries": 1}"#);
    let l = local(&e, 4096);
    let p = e.connect(&src.endpoint, None).unwrap();
    // An unconfirmed completion leaves A's entry uncertain: retained, never
    // evicted, never closed.
    e.faults().fail_completion.store(1, Ordering::SeqCst);
    assert_eq!(go(&e, p, &[rd(&l, 0, a, 4096)], shm())[0].status, Status::Unquiesced);
    assert_eq!(e.stats().ipc["shm"].imports.retained, 1);
    // It does not count against the cache's one slot: a new key is served.
    assert!(all_ok(&go(&e, p, &[rd(&l, 0, b, 4096)], shm())));
    assert!((0..4096).all(|i| l[i] == pattern(2, i as u64)));
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.retained, st.imports.cached, st.imports.opened), (1, 1, 2));
    // A itself stays unavailable, saying why.
    let r = e.submit(p, &[rd(&l, 0, a, 16)], shm()).unwrap();
    assert!(r.wait(LONG).is_err());
    let why = r.error(0).unwrap();
    assert!(why.message().contains("retained") && why.message().contains("injected fault"), "{why}");
    drop(e);
    src.kill();
}

/// A READ-only import whose completion was not confirmed (an injected
/// completion failure, uncached): the READ fails UNQUIESCED and the import
/// is retained. A flush then fails UNQUIESCED naming it: it stays retained,
/// no close receipt goes out and the source keeps its export, since the
/// copy may still read the source's memory. (Holding back only writable
/// ones, the flush sent the READ-only import's close receipt without its
/// native close and answered OK.) Guards `flush_where`'s
/// `if !ent.native_closed` (`transport/ipc/requester/cached.rs`) (round 10
/// J16).
#[test]
fn a_read_only_import_with_an_unconfirmed_completion_is_never_released_by_a_flush() {
    let mut src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let e = engine(UNCACHED);
    let l = local(&e, 4096);
    let p = e.connect(&src.endpoint, None).unwrap();
    e.faults().fail_completion.store(1, Ordering::SeqCst);
    let r = go(&e, p, &[rd(&l, 0, src.addr, 4096)], shm());
    assert_eq!(r[0], RequestResult { status: Status::Unquiesced, remote_effect: RemoteEffect::None });
    let err = e.flush_nvlink_cache(Some(LONG)).unwrap_err();
    assert_eq!(err.status(), Status::Unquiesced, "{err}");
    assert!(err.message().contains("its native close or completion was not confirmed"), "{err}");
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.retained, st.imports.closed), (1, 0));
    assert_eq!(src_ipc(&mut src, "exports_open"), 1);
    drop(e);
    src.kill();
}

/// A requester whose mapping budget (`max_inflight_bytes` 3 MiB) holds one
/// of the source's 2 MiB allocations mapped, not two, reading them in turn
/// (A, B, A) through its relocation cache: each new import first evicts
/// the idle cached one (closed with its receipt) and is then served, so
/// every READ lands its bytes, never RESOURCE_EXHAUSTED, and the source
/// ends with one export open. (Without the eviction, B was refused
/// RESOURCE_EXHAUSTED while A's idle import held the budget.) Guards
/// `open`'s `None if self.cache.evict_lru_idle(&close) => continue`
/// (`transport/ipc/requester/opening.rs`) (round 10 J11).
#[test]
fn a_new_import_over_the_mapping_budget_evicts_an_idle_cached_one() {
    let mut src = PeerProc::spawn(&["--shared", "--allocs", "2", "--size", &(2 * MIB).to_string(), "--seed", "1"]);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let e = engine(r#"{"max_inflight_bytes": 3145728, "max_transfer_bytes": 1048576}"#);
    let l = local(&e, 4096);
    let p = e.connect(&src.endpoint, None).unwrap();
    for (addr, seed) in [(a, 1), (b, 2), (a, 1)] {
        let r = go(&e, p, &[rd(&l, 0, addr, 4096)], shm());
        assert_eq!(r[0], RequestResult { status: Status::Ok, remote_effect: RemoteEffect::None });
        assert!((0..4096).all(|i| l[i] == pattern(seed, i as u64)), "the READ's bytes");
    }
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.cached), (3, 2, 1));
    assert_eq!(src_ipc(&mut src, "exports_open"), 1);
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn two_peers_importing_from_each_other_close_together() {
    let cfg = r#"{"shm_cache_entries": 2}"#;
    let (x, y) = (engine(cfg), engine(cfg));
    let (ax, ay) = (allocate_shared_host(MIB).unwrap(), allocate_shared_host(MIB).unwrap());
    x.register_memory(ax.addr(), MIB, Access::READ).unwrap();
    y.register_memory(ay.addr(), MIB, Access::READ).unwrap();
    let (lx, ly) = (local(&x, 4096), local(&y, 4096));
    let px = x.connect(&y.endpoint(), None).unwrap();
    let py = y.connect(&x.endpoint(), None).unwrap();
    assert!(all_ok(&go(&x, px, &[rd(&lx, 0, ay.addr(), 4096)], shm())));
    assert!(all_ok(&go(&y, py, &[rd(&ly, 0, ax.addr(), 4096)], shm())));
    assert_eq!((x.stats().ipc["shm"].imports.cached, y.stats().ipc["shm"].imports.cached), (1, 1));
    // Each close releases its own import before waiting for the export the
    // other holds, so closing both at once finishes.
    std::thread::scope(|s| {
        let hx = s.spawn(|| x.close(Some(LONG)));
        let hy = s.spawn(|| y.close(Some(LONG)));
        hx.join().unwrap().unwrap();
        hy.join().unwrap().unwrap();
    });
    drop((x, y));
    ax.free().unwrap();
    ay.free().unwrap();
}

#[test]
fn a_pending_completion_moves_to_the_lazy_progress_worker() {
    let mut src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "3"]);
    let e = engine(UNCACHED);
    let l = local(&e, 4096);
    let p = e.connect(&src.endpoint, None).unwrap();
    assert_eq!(e.stats().ipc["shm"].progress_workers, 0, "the worker starts lazily");
    // Not ready by its deadline: submit returns with the group on the
    // worker; at the deadline it is reported Unquiesced, and the worker
    // polls on.
    e.faults().pending_polls.store(u32::MAX, Ordering::SeqCst);
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(Duration::from_secs(3)) };
    let b = e.submit(p, &[rd(&l, 0, src.addr, 4096)], opts).unwrap();
    assert_eq!(b.poll(), Status::Pending);
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.pending_groups, st.imports.late_groups, st.progress_workers), (1, 0, 1));
    assert!(b.wait(LONG).is_err());
    assert_eq!(b.results()[0], RequestResult { status: Status::Unquiesced, remote_effect: RemoteEffect::None });
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.pending_groups, st.imports.late_groups, st.imports.closed), (1, 1, 0));
    // The completion comes late: the import is closed with its receipt by
    // itself (no flush), and the next submission is served.
    e.faults().pending_polls.store(0, Ordering::SeqCst);
    eventually("the late completion closes the import", || e.stats().ipc["shm"].imports.late_completions == 1);
    let st = e.stats().ipc["shm"].clone();
    assert_eq!(
        (st.pending_groups, st.imports.late_groups, st.imports.closed, st.imports.retained),
        (0, 0, 1, 0),
        "{st:?}"
    );
    assert_eq!(src.stats()["ipc"]["shm"]["exports_open"], 0);
    assert!(all_ok(&go(&e, p, &[rd(&l, 0, src.addr, 4096)], shm())));
    e.close(Some(LONG)).unwrap();
    drop(e);
    drop(src);

    // Ready after a few polls: the worker finishes the group (close and
    // receipt) and completes the batch.
    let src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "3"]);
    let e = engine(UNCACHED);
    let l = local(&e, 4096);
    let p = e.connect(&src.endpoint, None).unwrap();
    e.faults().pending_polls.store(5, Ordering::SeqCst);
    let b = e.submit(p, &[rd(&l, 0, src.addr, 4096)], shm()).unwrap();
    b.wait(LONG).unwrap();
    assert!((0..4096).all(|i| l[i] == pattern(3, i as u64)));
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.opened, st.imports.closed, st.pending_groups, st.progress_workers), (1, 1, 0, 1));
    e.close(Some(LONG)).unwrap();
    src.close();
}

/// The serving shape of a prefill pool: four requester processes, each with
/// a relocation cache, READ one source allocation at once (each keeps its
/// READ-only import: four exports of one allocation, charged once), and
/// nothing falls through to TCP. A fifth requester's WRITE into the
/// allocation lands at once beside them (imports coexist: nothing waits
/// for another importer), and the reader of that MiB sees it through the
/// import it kept.
#[test]
fn four_cached_reader_processes_share_one_allocation_and_a_writer_lands_beside_them() {
    let mut src = PeerProc::spawn(&["--shared", "--size", &(4 * MIB).to_string(), "--seed", "6"]);
    let a = src.addr;
    let cfg = r#"{"shm_cache_entries": 2}"#;
    let mut readers: Vec<PeerProc> =
        (0..4).map(|t| PeerProc::spawn_requester(&src.endpoint, &format!("{}:{MIB}", a + t * MIB), cfg)).collect();
    assert_eq!(src_ipc(&mut src, "exports_open"), 4, "one allocation lent to four readers at once");
    assert_eq!(src_ipc(&mut src, "mapping_bytes_charged"), 4 * MIB, "the allocation is charged once");
    for (t, r) in readers.iter_mut().enumerate() {
        let want = fnv(&(0..MIB).map(|i| pattern(6, t as u64 * MIB + i)).collect::<Vec<u8>>());
        assert_eq!(r.cmd("read"), format!("ok {want}"), "reader {t} reads its MiB again through its cache");
        let st = r.stats();
        assert_eq!(st["ipc"]["shm"]["imports_opened"], 1, "{st}");
        assert_eq!(st["ipc"]["shm"]["imports_cached"], 1, "{st}");
        assert_eq!(st["transports"]["tcp"]["requests_completed"], 0, "{st}");
    }
    let e = engine("");
    let mut l = local(&e, 4096);
    l.iter_mut().enumerate().for_each(|(i, x)| *x = pattern(9, i as u64));
    let p = e.connect(&src.endpoint, None).unwrap();
    let write = [wr(&l, 0, a + 3 * MIB, 4096)];
    // The readers keep their imports; the WRITE does not wait for them.
    let short = SubmitOptions { timeout: Some(Duration::from_millis(300)), ..shm() };
    assert_eq!(
        go(&e, p, &write, short),
        vec![RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied }]
    );
    assert_eq!(src_ipc(&mut src, "exports_open"), 5);
    assert_eq!(src_ipc(&mut src, "mapping_bytes_charged"), 4 * MIB, "still charged once");
    assert_eq!(src.cmd(&format!("verify 9 {} 4096", 3 * MIB)), "ok");
    // Reader 3 reads the written bytes through the import it kept.
    let mut want: Vec<u8> = (0..MIB).map(|i| pattern(6, 3 * MIB + i)).collect();
    want[..4096].copy_from_slice(&l);
    assert_eq!(readers[3].cmd("read"), format!("ok {}", fnv(&want)));
    assert_eq!(readers[3].stats()["ipc"]["shm"]["imports_opened"], 1);
    for r in &mut readers {
        assert_eq!(r.cmd("flush"), "ok");
    }
    assert_eq!(e.flush_nvlink_cache(Some(LONG)).map(|_| ()), Ok(()));
    assert_eq!(src_ipc(&mut src, "exports_open"), 0);
    for r in readers {
        r.kill();
    }
    e.close(Some(LONG)).unwrap();
    src.close();
}
