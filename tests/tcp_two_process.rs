//! Engine core over TCP between real processes on loopback: round trips
//! verified byte for byte, every rejection, concurrency, and killed peers.

mod common;

use common::*;
use orbite::*;
use std::time::{Duration, Instant};

/// An engine of `json` whose requests for a peer's heap memory go over
/// TCP, the transport these tests are about (CMA would carry them).
fn engine(json: &str) -> Engine {
    let mut c = EngineConfig::from_json(json).expect("config");
    c.cma = false;
    Engine::new(c).expect("engine")
}

fn local_buf(e: &Engine, len: usize) -> (Vec<u8>, u64) {
    let mut v = vec![0u8; len];
    let id = e.register_memory(v.as_mut_ptr() as u64, len as u64, Access::NONE).unwrap();
    (v, id)
}

fn req(op: Op, local: &[u8], loff: usize, remote: u64, len: u64) -> Request {
    Request { op, local_addr: local.as_ptr() as u64 + loff as u64, remote_addr: remote, len }
}

fn run(e: &Engine, peer: u64, reqs: &[Request]) -> Batch {
    let b = e.submit(peer, reqs, SubmitOptions::default()).unwrap();
    let _ = b.wait(LONG);
    assert_ne!(b.poll(), Status::Pending);
    b
}

#[test]
fn round_trips_byte_for_byte() {
    let mut src = PeerProc::spawn(&["--size", &(64u64 << 20).to_string(), "--seed", "3"]);
    let e = engine(r#"{"max_transfer_bytes": 4194304}"#);
    let (mut local, _) = local_buf(&e, 64 << 20);
    let peer = e.connect(&src.endpoint, None).unwrap();

    // 1 byte.
    let b = run(&e, peer, &[req(Op::Read, &local, 5, src.addr + 77, 1)]);
    assert_eq!(b.results()[0].status, Status::Ok);
    assert_eq!(local[5], pattern(3, 77));
    assert_eq!((local[4], local[6]), (0, 0));

    // 4097 bytes at odd offsets, both directions.
    let b = run(&e, peer, &[req(Op::Read, &local, 1001, src.addr + 4093, 4097)]);
    assert_eq!(b.results()[0].status, Status::Ok);
    assert!((0..4097).all(|i| local[1001 + i] == pattern(3, 4093 + i as u64)));
    let w = pattern_vec(11, 4097);
    local[3..3 + 4097].copy_from_slice(&w);
    let b = run(&e, peer, &[req(Op::Write, &local, 3, src.addr + 12345, 4097)]);
    assert_eq!(b.results()[0], RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied });
    assert_eq!(src.cmd("verify 11 12345 4097"), "ok");

    // 64 MiB in 1 MiB blocks (READ), verified in full.
    src.cmd("fill 5");
    let reqs: Vec<_> =
        (0..64u64).map(|i| req(Op::Read, &local, (i << 20) as usize, src.addr + (i << 20), 1 << 20)).collect();
    let b = run(&e, peer, &reqs);
    assert!(b.results().iter().all(|r| r.status == Status::Ok));
    let bad = (0..local.len()).filter(|&i| local[i] != pattern(5, i as u64)).count();
    assert_eq!(bad, 0);

    // 64 MiB in 1 MiB blocks (WRITE), verified by the source.
    for (i, b) in local.iter_mut().enumerate() {
        *b = pattern(9, i as u64);
    }
    let reqs: Vec<_> =
        (0..64u64).map(|i| req(Op::Write, &local, (i << 20) as usize, src.addr + (i << 20), 1 << 20)).collect();
    let b = run(&e, peer, &reqs);
    assert!(b.results().iter().all(|r| r.status == Status::Ok && r.remote_effect == RemoteEffect::Applied));
    assert_eq!(src.cmd(&format!("verify 9 0 {}", 64 << 20)), "ok");

    // 1000 small requests in one batch, scattered, results in order.
    src.cmd("fill 21");
    local.iter_mut().for_each(|b| *b = 0);
    let reqs: Vec<_> = (0..1000u64)
        .map(|i| req(Op::Read, &local, (i * 97) as usize, src.addr + i * 4099 + 1, 33 + (i % 50)))
        .collect();
    let b = run(&e, peer, &reqs);
    let results = b.results();
    assert_eq!(results.len(), 1000);
    assert!(results.iter().all(|r| r.status == Status::Ok));
    // Later requests overwrite earlier ones where the local ranges overlap,
    // so check the bytes of the non-overlapped tail of each request.
    for i in 0..1000u64 {
        let len = 33 + (i % 50);
        let start = if i < 999 { 97 } else { 0 };
        for j in start.min(len)..len {
            assert_eq!(local[(i * 97 + j) as usize], pattern(21, i * 4099 + 1 + j), "request {i} byte {j}");
        }
    }
    let st = e.stats();
    assert_eq!(st.transports["tcp"].requests_failed, 0);
    assert_eq!(st.inflight_bytes, 0);
    e.close(Some(LONG)).unwrap();
    src.close();
}

/// A submission larger than `max_inflight_bytes` over TCP: admitted in
/// several steps (as many chunks at a time as the budget holds, the
/// staged ones sent before waiting for room), a request split into chunks
/// across two steps, every byte exact, every request OK, the budget given
/// back in full. Guards the TCP executor's admission (src/transport/tcp/executor.rs):
/// without the staged chunks sent before the wait for room, every request
/// past the first step's fails TIMED_OUT; a step that took more than it
/// handed out, or handed out more than it took, leaves `inflight_bytes`
/// off zero.
#[test]
fn a_submission_larger_than_the_budget_is_admitted_in_steps() {
    const KIB: u64 = 1024;
    let mut src = PeerProc::spawn(&["--size", &(16u64 << 20).to_string(), "--seed", "4"]);
    let e = engine(r#"{"max_inflight_bytes": 1048576, "max_transfer_bytes": 65536}"#);
    let (mut local, _) = local_buf(&e, 16 << 20);
    let peer = e.connect(&src.endpoint, None).unwrap();

    // READ: 2000 gapped 4 KiB blocks (8 MB: 8 steps of 256 chunks at
    // least), then one of 200 KiB (4 chunks) where a step ends.
    let mut reqs: Vec<_> = (0..2000u64)
        .map(|i| req(Op::Read, &local, (i * 8 * KIB) as usize, src.addr + i * 8 * KIB + 1, 4 * KIB))
        .collect();
    reqs.insert(255, req(Op::Read, &local, (16 << 20) - 200 * KIB as usize, src.addr + 3, 200 * KIB));
    let b = run(&e, peer, &reqs);
    assert!(
        b.results().iter().all(|r| r.status == Status::Ok),
        "{:?}",
        b.results().iter().find(|r| r.status != Status::Ok)
    );
    for r in &reqs {
        let at = (r.local_addr - local.as_ptr() as u64) as usize;
        let remote = r.remote_addr - src.addr;
        let bad = (0..r.len).filter(|&j| local[at + j as usize] != pattern(4, remote + j)).count();
        assert_eq!(bad, 0, "request at remote offset {remote}");
    }
    assert_eq!(local[4 * KIB as usize], 0, "a gap was written");
    assert_eq!(e.stats().inflight_bytes, 0);

    // WRITE: 4 MiB in 1024 contiguous 4 KiB requests (64 coalesced chunks,
    // 16 per step).
    for (i, b) in local[..4 << 20].iter_mut().enumerate() {
        *b = pattern(13, i as u64);
    }
    let reqs: Vec<_> =
        (0..1024u64).map(|i| req(Op::Write, &local, (i * 4 * KIB) as usize, src.addr + i * 4 * KIB, 4 * KIB)).collect();
    let b = run(&e, peer, &reqs);
    assert!(b.results().iter().all(|r| r.status == Status::Ok && r.remote_effect == RemoteEffect::Applied));
    assert_eq!(src.cmd(&format!("verify 13 0 {}", 4 << 20)), "ok");
    let st = e.stats();
    assert_eq!((st.transports["tcp"].requests_failed, st.inflight_bytes), (0, 0));
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn every_rejection_is_typed() {
    let mut src = PeerProc::spawn(&["--size", "65536", "--access", "r", "--extra", "4096"]);
    let e = engine("");
    let (local, lid) = local_buf(&e, 65536);
    let peer = e.connect(&src.endpoint, None).unwrap();

    // Unknown peer, zero length, local address outside any region: the submit fails.
    let good = req(Op::Read, &local, 0, src.addr, 16);
    assert!(matches!(e.submit(9999, &[good], SubmitOptions::default()), Err(Error::NotFound(_))));
    let zero = Request { len: 0, ..good };
    assert!(matches!(e.submit(peer, &[zero], SubmitOptions::default()), Err(Error::InvalidArgument(_))));
    let nowhere = Request { local_addr: 64, ..good };
    assert!(matches!(e.submit(peer, &[nowhere], SubmitOptions::default()), Err(Error::NotFound(_))));
    let local_cross = Request { local_addr: local.as_ptr() as u64 + 65530, ..good };
    assert!(matches!(e.submit(peer, &[local_cross], SubmitOptions::default()), Err(Error::OutOfRange(_))));

    // Remote outcomes, per request, in order.
    let reqs = [
        req(Op::Read, &local, 0, 4096, 16),                 // outside any region
        req(Op::Read, &local, 0, src.addr + 65536 - 8, 16), // crosses the region's end
        req(Op::Read, &local, 0, src.extra_addr, 16),       // write-only region
        req(Op::Write, &local, 0, src.addr, 16),            // read-only region
        req(Op::Read, &local, 100, src.addr + 1, 10),       // fine
    ];
    let b = run(&e, peer, &reqs);
    let r = b.results();
    assert_eq!(r[0], RequestResult { status: Status::NotFound, remote_effect: RemoteEffect::None });
    assert_eq!(r[1].status, Status::OutOfRange);
    assert_eq!(r[2].status, Status::PermissionDenied);
    assert_eq!(r[3], RequestResult { status: Status::PermissionDenied, remote_effect: RemoteEffect::None });
    assert_eq!(r[4].status, Status::Ok);
    assert!(matches!(b.wait(LONG), Err(Error::TransferFailed(m)) if m.contains("request 0")));
    assert!(b.error(2).unwrap().message().contains("does not allow remote READ"));

    // Stale epoch after re-registration: the request names the old epoch.
    assert_eq!(src.cmd("reregister"), "ok");
    let b = run(&e, peer, &[good]);
    assert_eq!(b.results()[0].status, Status::StalePeer);
    assert!(b.error(0).unwrap().message().contains("re-registered"));
    // After refreshing the peer's regions, the same request succeeds.
    let regions = e.peer_regions(peer, None).unwrap();
    assert!(regions.iter().any(|r| r.addr == src.addr));
    let b = run(&e, peer, &[good]);
    assert_eq!(b.results()[0].status, Status::Ok);

    // Submit after close.
    e.close(Some(LONG)).unwrap();
    assert!(matches!(e.submit(peer, &[good], SubmitOptions::default()), Err(Error::Unavailable(_))));
    assert!(matches!(e.unregister_memory(lid, None), Err(Error::NotFound(_))));
    src.close();
}

/// Failed requests count their bytes: three requests to a real source
/// process that fail (outside any region, across the region's end, a
/// WRITE of a read-only region) and one that succeeds leave the requester's
/// `transports.tcp` with exactly the failed requests' lengths in
/// `bytes_failed` and the good one's in `bytes_completed`. Guards
/// `p.bytes_failed.fetch_add(bytes, ..)` in `counters.rs`'s
/// `record_requests` (round 11 K1: without it `bytes_failed` stays 0).
#[test]
fn failed_requests_count_their_bytes_in_bytes_failed() {
    let src = PeerProc::spawn(&["--size", "65536", "--access", "r"]);
    let e = engine("");
    let (local, _) = local_buf(&e, 65536);
    let peer = e.connect(&src.endpoint, None).unwrap();
    let reqs = [
        req(Op::Read, &local, 0, 4096, 100),                  // outside any region
        req(Op::Read, &local, 0, src.addr + 65536 - 8, 1000), // crosses the region's end
        req(Op::Write, &local, 0, src.addr, 10000),           // read-only region
        req(Op::Read, &local, 0, src.addr, 7),                // fine
    ];
    let b = run(&e, peer, &reqs);
    let got: Vec<Status> = b.results().iter().map(|r| r.status).collect();
    assert_eq!(got, [Status::NotFound, Status::OutOfRange, Status::PermissionDenied, Status::Ok]);
    let st = e.stats();
    let tcp = &st.transports["tcp"];
    assert_eq!((tcp.requests_failed, tcp.bytes_failed), (3, 100 + 1000 + 10000), "{}", st.to_json());
    assert_eq!((tcp.requests_completed, tcp.bytes_completed), (1, 7), "{}", st.to_json());
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn threads_and_two_requesters_share_a_source() {
    let mut src = PeerProc::spawn(&["--size", &(8u64 << 20).to_string(), "--seed", "4"]);
    let e1 = engine("");
    let e2 = engine("");
    let p1 = e1.connect(&src.endpoint, None).unwrap();
    let p2 = e2.connect(&src.endpoint, None).unwrap();
    let (addr, len) = (src.addr, src.len);
    // Registered up front and kept to the end (a freed, still registered
    // buffer's memory could come back to a later allocation, which its
    // registration would overlap).
    let who = [(&e1, p1), (&e1, p1), (&e1, p1), (&e2, p2), (&e2, p2)];
    let mut locals: Vec<Vec<u8>> = who
        .iter()
        .map(|(e, _)| {
            let v = vec![0u8; 1 << 20];
            e.register_memory(v.as_ptr() as u64, v.len() as u64, Access::NONE).unwrap();
            v
        })
        .collect();
    std::thread::scope(|s| {
        for (t, ((e, p), local)) in who.into_iter().zip(locals.iter_mut()).enumerate() {
            s.spawn(move || {
                for round in 0..20u64 {
                    let off = ((t as u64 * 7 + round * 13) % 7) << 20;
                    let n = 1 + (round * 65537 + t as u64 * 4099) % (1 << 20);
                    let b = e
                        .submit(
                            p,
                            &[Request {
                                op: Op::Read,
                                local_addr: local.as_ptr() as u64,
                                remote_addr: addr + off,
                                len: n,
                            }],
                            SubmitOptions::default(),
                        )
                        .unwrap();
                    b.wait(LONG).unwrap();
                    assert!(
                        (0..n as usize).all(|i| local[i] == pattern(4, off + i as u64)),
                        "thread {t} round {round}"
                    );
                }
                assert!(len >= 8 << 20);
            });
        }
    });
    assert_eq!(e1.stats().transports["tcp"].requests_completed, 60);
    assert_eq!(e2.stats().transports["tcp"].requests_completed, 40);
    let served: serde_json::Value = serde_json::from_str(&src.cmd("stats")).unwrap();
    assert_eq!(served["transports"]["tcp"]["served_requests"], 100);
    e1.close(Some(LONG)).unwrap();
    e2.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn peer_killed_before_and_during_transfers() {
    let e = engine(r#"{"default_timeout_ms": 60000}"#);
    let (local, _) = local_buf(&e, 32 << 20);
    let keeper = PeerProc::spawn(&["--size", "4096", "--seed", "8"]);
    let kp = e.connect(&keeper.endpoint, None).unwrap();

    // Killed before: the next submission is refused or fails, within the deadline.
    let a = PeerProc::spawn(&["--size", "4096"]);
    let pa = e.connect(&a.endpoint, None).unwrap();
    let aaddr = a.addr;
    a.kill();
    let t0 = Instant::now();
    let r = req(Op::Read, &local, 0, aaddr, 16);
    match e.submit(pa, &[r], SubmitOptions { timeout: Some(Duration::from_secs(30)), ..Default::default() }) {
        Err(err) => assert_eq!(err.status(), Status::Unavailable),
        Ok(b) => {
            assert!(b.wait(LONG).is_err());
            assert_eq!(b.results()[0].remote_effect, RemoteEffect::None);
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(40));

    // Killed during: freeze the source (SIGSTOP) so requests are in flight
    // and unanswered, then SIGKILL it. Every request ends within the
    // deadline; WRITEs that were sent report remote effect Unknown.
    let b = PeerProc::spawn(&["--size", &(32u64 << 20).to_string()]);
    let pb = e.connect(&b.endpoint, None).unwrap();
    b.freeze();
    let mut reqs: Vec<Request> =
        (0..8u64).map(|i| req(Op::Write, &local, (i << 20) as usize, b.addr + (i << 20), 1 << 20)).collect();
    reqs.push(req(Op::Read, &local, 16 << 20, b.addr, 1 << 20));
    let batch =
        e.submit(pb, &reqs, SubmitOptions { timeout: Some(Duration::from_secs(60)), ..Default::default() }).unwrap();
    assert_eq!(batch.poll(), Status::Pending);
    // Wait until the first WRITE's bytes are on the wire (the frozen source
    // cannot answer, so the batch stays pending).
    let before = Instant::now();
    while e.stats().transports["tcp"].wire_bytes_sent < (1 << 20) {
        assert!(before.elapsed() < LONG, "nothing was sent");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    b.kill();
    assert!(batch.wait(LONG).is_err());
    assert!(t0.elapsed() < Duration::from_secs(60));
    let res = batch.results();
    assert!(res.iter().all(|r| r.status != Status::Ok && r.status != Status::Pending), "{res:?}");
    assert!(res[..8].iter().all(|r| matches!(r.remote_effect, RemoteEffect::Unknown | RemoteEffect::None)));
    assert!(res[..8].iter().any(|r| r.remote_effect == RemoteEffect::Unknown), "a sent WRITE must be Unknown: {res:?}");
    assert_eq!(res[8].remote_effect, RemoteEffect::None);

    // The engine keeps serving the other peer.
    let ok = run(&e, kp, &[req(Op::Read, &local, 0, keeper.addr, 4096)]);
    assert_eq!(ok.results()[0].status, Status::Ok);
    assert!((0..4096).all(|i| local[i] == pattern(8, i as u64)));
    let st = e.stats();
    assert_eq!(st.inflight_bytes, 0);
    assert_eq!(st.peers_alive, 1);
    e.close(Some(LONG)).unwrap();
    keeper.close();
}

/// A source killed in the middle of coalesced READs (issue 34): eight
/// contiguous 1 MiB READs travel as one frame, the source is frozen with
/// them unanswered, then killed. Each of the eight ends on its own, failed
/// with no remote effect, and a WRITE after them (its own frame) too, with
/// an effect of its own. Guards `transport/tcp/requester.rs`
/// `Record::finish` fanning the unit's outcome out to every member
/// (without it, seven READs never end and the batch is never complete).
#[test]
fn a_source_killed_under_coalesced_reads_ends_each_of_them() {
    let e = engine(r#"{"default_timeout_ms": 60000}"#);
    let (local, _) = local_buf(&e, 16 << 20);
    let b = PeerProc::spawn(&["--size", &(16u64 << 20).to_string()]);
    let pb = e.connect(&b.endpoint, None).unwrap();
    b.freeze();
    let mut reqs: Vec<Request> =
        (0..8u64).map(|i| req(Op::Read, &local, (i << 20) as usize, b.addr + (i << 20), 1 << 20)).collect();
    reqs.push(req(Op::Write, &local, 8 << 20, b.addr + (8 << 20), 4096));
    let batch =
        e.submit(pb, &reqs, SubmitOptions { timeout: Some(Duration::from_secs(60)), ..Default::default() }).unwrap();
    assert_eq!(e.stats().transports["tcp"].requests_coalesced, 7, "eight READs in one frame");
    assert_eq!(batch.poll(), Status::Pending);
    b.kill();
    assert!(batch.wait(LONG).is_err());
    let res = batch.results();
    for (i, r) in res[..8].iter().enumerate() {
        assert_eq!(r.remote_effect, RemoteEffect::None, "READ {i}: {res:?}");
        assert!(r.status != Status::Ok && r.status != Status::Pending, "READ {i}: {res:?}");
        assert_eq!(batch.error(i).map(|x| x.status()), Some(res[0].status), "READ {i} got its own outcome");
    }
    assert!(res[8].status != Status::Ok && res[8].status != Status::Pending, "{res:?}");
    let st = e.stats();
    assert_eq!((st.transports["tcp"].requests_failed, st.inflight_bytes), (9, 0));
    e.close(Some(LONG)).unwrap();
}

#[test]
fn silent_peer_times_out_within_the_deadline() {
    let e = engine("");
    let (local, _) = local_buf(&e, 1 << 20);
    let src = PeerProc::spawn(&["--size", &(1u64 << 20).to_string()]);
    let p = e.connect(&src.endpoint, None).unwrap();
    src.freeze();
    let t0 = Instant::now();
    let b = e
        .submit(
            p,
            &[req(Op::Write, &local, 0, src.addr, 4096), req(Op::Read, &local, 8192, src.addr, 4096)],
            SubmitOptions { timeout: Some(Duration::from_millis(1500)), ..Default::default() },
        )
        .unwrap();
    assert!(b.wait(LONG).is_err());
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(30), "{took:?}");
    let r = b.results();
    assert_eq!(r[0], RequestResult { status: Status::TimedOut, remote_effect: RemoteEffect::Unknown });
    assert_eq!(r[1], RequestResult { status: Status::TimedOut, remote_effect: RemoteEffect::None });
    src.signal(libc::SIGCONT);
    src.kill();
    e.close(Some(LONG)).unwrap();
}

/// A request queued behind a payload the frozen source's socket does not
/// take still ends at its own deadline: a 32 MiB WRITE (deadline 120 s)
/// fills the socket of a frozen source; a READ submitted after it with a
/// 1 s deadline never reaches the wire and ends TIMED_OUT, effect none,
/// while the WRITE is still pending. Guards `tcp/proto/requester/end.rs`
/// `expire`'s `expire_queued` (without it the READ waits for the queue to
/// reach it: until the WRITE's deadline and its overrun end the
/// connection, three minutes on).
#[test]
fn a_request_queued_behind_a_stuck_payload_ends_at_its_deadline() {
    let e = engine("");
    let (local, _) = local_buf(&e, 33 << 20);
    let src = PeerProc::spawn(&["--size", &(33u64 << 20).to_string()]);
    let p = e.connect(&src.endpoint, None).unwrap();
    src.freeze();
    let write = e
        .submit(
            p,
            &[req(Op::Write, &local, 0, src.addr, 32 << 20)],
            SubmitOptions { timeout: Some(Duration::from_secs(120)), ..Default::default() },
        )
        .unwrap();
    let read = e
        .submit(
            p,
            &[req(Op::Read, &local, 32 << 20, src.addr + (32 << 20), 4096)],
            SubmitOptions { timeout: Some(Duration::from_secs(1)), ..Default::default() },
        )
        .unwrap();
    let err = read.wait(LONG).unwrap_err();
    assert_eq!(read.results()[0], RequestResult { status: Status::TimedOut, remote_effect: RemoteEffect::None });
    assert!(read.error(0).unwrap().message().contains("before the request was sent"), "{err}");
    assert_eq!(write.poll(), Status::Pending, "the WRITE's own deadline is two minutes away");
    src.signal(libc::SIGCONT);
    src.kill();
    e.close(Some(LONG)).unwrap();
}

/// Many small WRITEs and READs in one submission travel coalesced (frames
/// and payloads in one sendmsg each way): every byte lands where its
/// request says, and every READ gets its own bytes. Guards
/// `transport/tcp/requester.rs` `Outbuf`/`flush` (payload order and
/// offsets) and `transport/tcp/source.rs` `Answers`.
#[test]
fn coalesced_small_requests_keep_every_byte_in_place() {
    let src = PeerProc::spawn(&["--size", &(4u64 << 20).to_string(), "--seed", "2"]);
    let e = engine("");
    let (mut local, _) = local_buf(&e, 4 << 20);
    let peer = e.connect(&src.endpoint, None).unwrap();
    // 300 WRITEs of 1..=9000 bytes at scattered, disjoint places of the
    // first 3 MiB, from a pattern-13 buffer (local offset = remote offset).
    let w = pattern_vec(13, 3 << 20);
    local[..3 << 20].copy_from_slice(&w);
    let mut reqs = Vec::new();
    let mut spans = Vec::new();
    for i in 0..300u64 {
        let off = (i * 10_007) % ((3 << 20) - 10_000);
        let off = off - off % 16 + (i % 16);
        let len = 1 + (i * 7919) % 9000;
        if spans.iter().any(|&(a, b): &(u64, u64)| off < b && a < off + len) {
            continue;
        }
        spans.push((off, off + len));
        reqs.push(req(Op::Write, &local, off as usize, src.addr + off, len));
    }
    // And READs of the untouched last MiB into the local last MiB.
    for i in 0..64u64 {
        let off = (3 << 20) + i * 16384;
        reqs.push(req(Op::Read, &local, off as usize, src.addr + off, 16384));
    }
    let b = run(&e, peer, &reqs);
    assert!(
        b.results().iter().all(|r| r.status == Status::Ok),
        "{:?}",
        b.results().iter().find(|r| r.status != Status::Ok)
    );
    // Read the first 3 MiB back: the spans hold pattern 13, the rest the
    // source's own pattern 2.
    let (back, _) = local_buf(&e, 3 << 20);
    let whole: Vec<Request> =
        (0..3u64).map(|m| req(Op::Read, &back, (m << 20) as usize, src.addr + (m << 20), 1 << 20)).collect();
    assert!(run(&e, peer, &whole).results().iter().all(|r| r.status == Status::Ok));
    for (i, got) in back.iter().enumerate() {
        let written = spans.iter().any(|&(a, z)| (a..z).contains(&(i as u64)));
        let want = if written { pattern(13, i as u64) } else { pattern(2, i as u64) };
        assert_eq!(*got, want, "byte {i}");
    }
    assert!((3 << 20..4 << 20).all(|i| local[i] == pattern(2, i as u64)));
    e.close(Some(LONG)).unwrap();
    src.close();
}
