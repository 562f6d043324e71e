//! Calls that wait on a peer end as soon as its connection is lost, never
//! at their deadline: a source process killed (SIGKILL) while SHM is in use
//! and a Describe is awaited.

mod common;

use common::relay::Relay;
use common::*;
use orbite::*;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

/// `peer_regions` asked of an SHM source that is then killed answers
/// `UNAVAILABLE` as soon as the connection's end is read, not after the
/// default timeout (30 s): before, a Describe waiter was woken only by an
/// answer. The source is frozen while the Describe request travels, so
/// the request is surely waiting when the process dies; the control
/// connection runs through a relay, whose count of bytes sent up says the
/// request left (the waiter had released the connection's lock to wait).
/// Guards the wake on `Event::DescribeLost` in `tcp/requester.rs`.
#[test]
fn peer_regions_of_a_source_killed_while_it_is_asked_fails_at_once() {
    let src = PeerProc::spawn(&["--shared", "--size", "65536", "--seed", "3"]);
    let relay = Relay::to(&src.endpoint);
    // The default timeout: a waiter not woken by the end waits 30 s.
    let e = Engine::from_json("{}").unwrap();
    let local = vec![0u8; 65536];
    e.register_memory(local.as_ptr() as u64, 65536, Access::NONE).unwrap();
    let p = e.connect(&relay.endpoint(), None).unwrap();
    let read = [Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: src.addr, len: 65536 }];
    let shm = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) };
    let b = e.submit(p, &read, shm).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(local, pattern_vec(3, 65536));
    assert_eq!(e.stats().transports["shm"].requests_completed, 1);

    src.freeze();
    let leg = relay.leg(0);
    let before = leg.up.load(SeqCst);
    let e = std::sync::Arc::new(e);
    let (tx, rx) = std::sync::mpsc::channel();
    let asker = e.clone();
    std::thread::spawn(move || {
        let r = asker.peer_regions(p, None);
        let _ = tx.send((r.map(|_| ()).map_err(|e| (e.status(), e.message().to_string())), Instant::now()));
    });
    eventually("the Describe request reaches the frozen source", || leg.up.load(SeqCst) > before);
    let killed = Instant::now();
    src.kill();
    let (got, at) = rx.recv_timeout(LONG).expect("peer_regions never returned");
    let took = at.saturating_duration_since(killed);
    eprintln!("peer_regions answered {:?} after the kill", took);
    let (status, why) = got.expect_err("a killed source published regions");
    assert_eq!(status, Status::Unavailable, "{why}");
    assert!(why.contains("closed the connection"), "{why}");
    assert!(took < Duration::from_secs(5), "peer_regions waited {took:?} after the source died");
    // From then on the peer has no transport left, and answers at once.
    assert_eq!(e.peer_transports(p).unwrap(), Vec::<TransportKind>::new());
    let t0 = Instant::now();
    assert_eq!(e.peer_regions(p, None).unwrap_err().status(), Status::Unavailable);
    assert!(t0.elapsed() < Duration::from_secs(5));
    e.close(Some(LONG)).unwrap();
}
