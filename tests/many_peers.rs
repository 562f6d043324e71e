//! One engine connected to 1000 peers (ten processes of 100 engines each,
//! on loopback): its threads stay bounded by its I/O threads, an idle
//! connection costs little memory, every byte READ and WRITTEN is checked,
//! and 100 peers killed mid-transfer end their requests with exact
//! outcomes while the other 900 go on. In a test binary of its own: it
//! counts this process's threads and resident memory.

mod common;

use common::{eventually, pattern_vec, raise_fd_limit, rss_kib, threads, PeerProc};
use orbite::*;
use std::time::Duration;

const PROCESSES: usize = 10;
const PER_PROCESS: usize = 100;
/// Bytes each peer engine registers.
const REGION: usize = 64 * 1024;
/// READ from each peer, and WRITE to it (at `WRITE_AT`).
const READ_LEN: usize = 16 * 1024;
const WRITE_LEN: usize = 4 * 1024;
const WRITE_AT: usize = 32 * 1024;

/// The READ and WRITE of peer `i`: READ its region's first READ_LEN bytes
/// into `local[i]`'s first half, WRITE pattern 5000+i from the second half.
fn requests(peer_addr: u64, local: &[u8], i: usize) -> [Request; 2] {
    let base = local.as_ptr() as u64 + (i * 2 * READ_LEN) as u64;
    [
        Request { op: Op::Read, local_addr: base, remote_addr: peer_addr, len: READ_LEN as u64 },
        Request {
            op: Op::Write,
            local_addr: base + READ_LEN as u64,
            remote_addr: peer_addr + WRITE_AT as u64,
            len: WRITE_LEN as u64,
        },
    ]
}

#[test]
fn a_thousand_peers_bounded_threads_exact_bytes_and_100_killed() {
    raise_fd_limit(4096);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let mut procs: Vec<PeerProc> = (0..PROCESSES)
        .map(|p| {
            let seed = (1000 * (p + 1)).to_string();
            PeerProc::spawn(&["--engines", &PER_PROCESS.to_string(), "--size", &REGION.to_string(), "--seed", &seed])
        })
        .collect();
    // Peer n = process n / 100, engine n % 100; its region holds pattern
    // 1000 * (process + 1) + engine.
    let seed_of = |n: usize| (1000 * (n / PER_PROCESS + 1) + n % PER_PROCESS) as u64;
    let peers_total = PROCESSES * PER_PROCESS;

    let before = threads();
    let engine = Engine::from_json("").unwrap();
    let idle = threads() - before;
    assert!(idle <= 3, "an idle engine runs {idle} threads");

    let mut local = vec![0u8; peers_total * 2 * READ_LEN];
    for i in 0..peers_total {
        let w = pattern_vec(5000 + i as u64, WRITE_LEN);
        let at = i * 2 * READ_LEN + READ_LEN;
        local[at..at + WRITE_LEN].copy_from_slice(&w);
    }
    engine.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();

    let rss0 = rss_kib();
    let mut ids = Vec::with_capacity(peers_total);
    for p in &procs {
        assert_eq!(p.endpoints.len(), PER_PROCESS);
        for ep in &p.endpoints {
            ids.push(engine.connect(ep, None).unwrap());
        }
    }
    let per_conn = (rss_kib().saturating_sub(rss0)) * 1024 / peers_total as u64;
    assert!(per_conn <= 64 * 1024, "an idle connection costs {per_conn} bytes resident");
    let connected = threads() - before;
    assert!(connected <= 2 * cores + 8, "{connected} threads with {peers_total} peers connected ({cores} cores)");
    let st = engine.stats();
    eprintln!("idle engine: {idle} threads; {peers_total} peers: {connected} threads, {per_conn} bytes resident per idle connection, io {:?}", st.io);
    assert_eq!(st.peers_alive, peers_total);
    assert_eq!(st.io.threads, st.io.threads_max as usize);
    assert_eq!(st.io.connections_per_thread.iter().sum::<usize>(), peers_total);

    let addrs: Vec<u64> = procs.iter().flat_map(|p| p.addrs.iter().copied()).collect();
    let addr_of = |n: usize| addrs[n];
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(120)) };

    // Round 1: every peer at once.
    let batches: Vec<Batch> =
        (0..peers_total).map(|n| engine.submit(ids[n], &requests(addr_of(n), &local, n), opts).unwrap()).collect();
    let busy = threads() - before;
    for (n, b) in batches.iter().enumerate() {
        b.wait(Duration::from_secs(120)).unwrap_or_else(|e| panic!("peer {n}: {e}"));
    }
    assert!(busy <= 2 * cores + 8, "{busy} threads while 1000 peers transfer");
    for n in 0..peers_total {
        let at = n * 2 * READ_LEN;
        assert!(local[at..at + READ_LEN] == pattern_vec(seed_of(n), READ_LEN)[..], "peer {n}: READ bytes differ");
    }
    for (p, proc_) in procs.iter_mut().enumerate() {
        for e in 0..PER_PROCESS {
            let n = p * PER_PROCESS + e;
            let v = proc_.cmd(&format!("verifyn {e} {} {WRITE_AT} {WRITE_LEN}", 5000 + n));
            assert_eq!(v, "ok", "peer {n}: WRITE bytes");
        }
    }

    // Round 2: the last process (peers 900..999) is frozen, so its peers'
    // requests are surely in flight; then it is killed. Their requests end
    // UNAVAILABLE (a READ with no remote effect, a WRITE whose frame left
    // with an unknown one) while the other 900 complete.
    local.iter_mut().enumerate().filter(|(i, _)| (i / READ_LEN) % 2 == 0).for_each(|(_, x)| *x = 0);
    let victim = procs.pop().unwrap();
    victim.freeze();
    let batches: Vec<Batch> =
        (0..peers_total).map(|n| engine.submit(ids[n], &requests(addr_of(n), &local, n), opts).unwrap()).collect();
    let survivors = PROCESSES * PER_PROCESS - PER_PROCESS;
    for (n, b) in batches.iter().enumerate().take(survivors) {
        b.wait(Duration::from_secs(120)).unwrap_or_else(|e| panic!("peer {n}: {e}"));
    }
    for b in &batches[survivors..] {
        assert_eq!(b.poll(), Status::Pending, "a frozen peer's batch ended before the kill");
    }
    victim.kill();
    for (n, b) in batches.iter().enumerate().skip(survivors) {
        let e = b.wait(Duration::from_secs(120)).expect_err("a killed peer's batch succeeded");
        assert_eq!(e.status(), Status::TransferFailed, "peer {n}: {e}");
        let r = b.results();
        assert_eq!(r[0].status, Status::Unavailable, "peer {n} READ: {:?}", b.error(0));
        assert_eq!(r[0].remote_effect, RemoteEffect::None, "peer {n} READ");
        assert_eq!(r[1].status, Status::Unavailable, "peer {n} WRITE: {:?}", b.error(1));
        assert_eq!(r[1].remote_effect, RemoteEffect::Unknown, "peer {n} WRITE");
    }
    for n in 0..survivors {
        let at = n * 2 * READ_LEN;
        assert!(local[at..at + READ_LEN] == pattern_vec(seed_of(n), READ_LEN)[..], "peer {n}: READ bytes differ");
    }
    let st = engine.stats();
    assert_eq!(st.peers_alive, survivors);
    // The dead connections leave their I/O threads once their requests ended.
    eventually("the killed peers' connections are gone from the I/O threads", || {
        engine.stats().io.connections_per_thread.iter().sum::<usize>() == survivors
    });

    // Round 3: the 900 go on.
    let batches: Vec<Batch> =
        (0..survivors).map(|n| engine.submit(ids[n], &requests(addr_of(n), &local, n), opts).unwrap()).collect();
    for (n, b) in batches.iter().enumerate() {
        b.wait(Duration::from_secs(120)).unwrap_or_else(|e| panic!("peer {n} after the kill: {e}"));
    }
    assert!(threads() - before <= 2 * cores + 8);
    engine.close(Some(Duration::from_secs(60))).unwrap();
    for p in procs {
        p.close();
    }
}
