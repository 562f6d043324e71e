//! Peers that die, freeze and come back: a long-lived requester with a
//! relocation cache recovers by itself, a closing source gets its exports
//! back at once, a dead source is reported as TCP reports it, and nothing
//! is chosen or refused silently.

mod common;

use common::*;
use orbite::*;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn shm() -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) }
}

fn wr(local: &[u8], remote: u64, len: u64) -> Request {
    Request { op: Op::Write, local_addr: local.as_ptr() as u64, remote_addr: remote, len }
}

fn rd(local: &[u8], remote: u64, len: u64) -> Request {
    Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote, len }
}

/// A decode worker (this engine, a cache of 4) writes into ten prefill
/// processes in turn, each killed after a WRITE or in the middle of the
/// next one (its import cached either way); the eleventh is
/// served over SHM, every dead prefill's import is released by itself, and
/// the mapping budget holds only the live import.
#[test]
fn a_long_lived_requester_outlives_ten_crashed_sources() {
    let e = Engine::from_json(r#"{"shm_cache_entries": 4}"#).unwrap();
    let mut local = pattern_vec(3, (8 * MIB) as usize);
    e.register_memory(local.as_mut_ptr() as u64, 8 * MIB, Access::NONE).unwrap();
    for round in 0..10 {
        let src = PeerProc::spawn(&["--shared", "--size", &(8 * MIB).to_string(), "--access", "rw"]);
        let p = e.connect(&src.endpoint, Some(LONG)).unwrap();
        let remote = src.addr;
        // A WRITE that completed: its import stays cached.
        e.submit(p, &[wr(&local, remote, 4096)], shm()).unwrap().wait(LONG).unwrap();
        if round % 2 == 0 {
            src.kill();
        } else {
            // Killed while an 8 MiB WRITE is under way: whatever the WRITE's
            // outcome, nothing is left behind.
            std::thread::scope(|s| {
                let w = s.spawn(|| e.submit(p, &[wr(&local, remote, 8 * MIB)], shm()).map(|b| b.wait(LONG)));
                src.kill();
                let _ = w.join().unwrap();
            });
        }
    }
    let src = PeerProc::spawn(&["--shared", "--size", &(8 * MIB).to_string(), "--access", "rw"]);
    let p = e.connect(&src.endpoint, Some(LONG)).unwrap();
    let b = e.submit(p, &[wr(&local, src.addr, 4096)], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm), "notes: {:?}", b.notes());
    let st = e.stats().ipc["shm"].clone();
    assert_eq!(st.imports.released_after_exit, 10, "{st:?}");
    assert_eq!((st.imports.retained, st.imports.cached), (0, 1), "{st:?}");
    assert_eq!(st.mapping_bytes_charged, 8 * MIB, "only the live import is charged");
    e.close(Some(LONG)).unwrap();
    assert_eq!(e.stats().ipc["shm"].mapping_bytes_charged, 0);
    drop(src);
}

/// A source frozen past a deadline and resumed: a cached READ-only grant
/// keeps serving READs (the board needs no answer from the source), a WRITE
/// that needs a new grant times out, submissions meanwhile fail fast
/// instead of blocking, and once it runs again the pair resumes over SHM by
/// itself — the import granted on the lost channel is given back through
/// the new one, and both engines close cleanly.
#[test]
fn a_frozen_source_that_resumes_is_served_again_over_shm() {
    let e = Engine::from_json(r#"{"shm_cache_entries": 2}"#).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let mut src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string(), "--seed", "4"]);
    let p = e.connect(&src.endpoint, Some(LONG)).unwrap();
    e.submit(p, &[rd(&local, src.addr, 4096)], shm()).unwrap().wait(LONG).unwrap();
    src.freeze();
    let short =
        SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(Duration::from_millis(800)) };
    e.submit(p, &[rd(&local, src.addr, 4096)], short).unwrap().wait(LONG).unwrap();
    // Both READs ran inside the published grant: the first right after it,
    // the second with the source frozen.
    assert_eq!(e.stats().ipc["shm"].imports.groups_without_round_trip, 2, "the frozen source's grant served a READ");
    let b = e.submit(p, &[wr(&local, src.addr, 4096)], short).unwrap();
    assert!(b.wait(LONG).is_err());
    assert_eq!(b.results()[0].status, Status::TimedOut, "{:?}", b.error(0));
    // The channel is being re-established: a forced SHM submission fails at
    // once, and AUTO moves to TCP (queued; the frozen peer answers later).
    let t0 = Instant::now();
    let b = e.submit(p, &[wr(&local, src.addr, 4096)], short).unwrap();
    let forced = t0.elapsed();
    assert!(b.wait(LONG).is_err());
    let why = b.error(0).unwrap();
    assert_eq!(why.status(), Status::Unavailable, "{why}");
    assert!(why.message().contains("re-established"), "{why}");
    assert!(forced < Duration::from_millis(800), "the submission blocked {forced:?} on a frozen peer");
    assert_eq!(e.stats().peers_alive, 1, "a frozen peer is not a dead one");
    src.signal(libc::SIGCONT);
    // Resumed: within one deadline the pair is served over SHM again, with
    // no flush from the user.
    let deadline = Instant::now() + LONG;
    loop {
        // While the old import holds the allocation, TCP may be refused.
        let b = e.submit(p, &[rd(&local, src.addr, 4096)], SubmitOptions::default()).unwrap();
        if b.wait(LONG).is_ok() && b.transport(0).unwrap() == Some(TransportKind::Shm) {
            break;
        }
        assert!(Instant::now() < deadline, "never back on SHM: {:?} {:?}", b.notes(), b.error(0));
        // The background reconnection is in progress; ask again.
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!((0..4096).all(|i| local[i] == pattern(4, i as u64)));
    e.close(Some(LONG)).unwrap();
    let st = e.stats().ipc["shm"].clone();
    assert_eq!((st.imports.retained, st.imports.opened, st.imports.closed), (0, 2, 2), "{st:?}");
    assert_eq!(src.cmd("close_source 10000"), "ok", "the source got every import back");
    src.close();
}

/// A source closing while two requesters hold cached imports asks for them
/// back: both give them when asked (each received a Revoke; without it the
/// close would wait for its deadline and fail UNQUIESCED) and every close
/// is OK. How long that takes is printed, not judged: speed is
/// orbite-bench's.
#[test]
fn a_closing_source_gets_cached_imports_back_at_once() {
    let src = Engine::from_json("").unwrap();
    let pools: Vec<Allocation> = (0..2).map(|_| allocate_shared_host(2 * MIB).unwrap()).collect();
    for a in &pools {
        src.register_memory(a.addr(), 2 * MIB, Access::READ).unwrap();
    }
    let cfg = r#"{"shm_cache_entries": 2}"#;
    let mut reqs: Vec<PeerProc> =
        pools.iter().map(|a| PeerProc::spawn_requester(&src.endpoint(), &format!("{}:4096", a.addr()), cfg)).collect();
    assert_eq!(src.stats().ipc["shm"].exports.open, 2);
    let t0 = Instant::now();
    src.close(Some(LONG)).unwrap();
    let took = t0.elapsed();
    println!("source close with two cached importers: {took:?}");
    for r in &mut reqs {
        let st: serde_json::Value = serde_json::from_str(&r.cmd("stats")).unwrap();
        assert!(st["revokes_received"].as_u64().unwrap() >= 1, "given back unasked: {st}");
        assert_eq!(st["ipc"]["shm"]["imports_cached"], 0);
        assert_eq!(st["ipc"]["shm"]["imports_retained"], 0);
    }
    drop(reqs);
    for a in pools {
        a.free().unwrap();
    }
}

/// After `close_source` the engine still listens (its requester side
/// lives on) but serves no new connection: a requester connecting is
/// refused UNAVAILABLE, told that the source side is closed, and the
/// refusal is counted. Guards `engine/accept.rs` `tcp_accept_loop`'s
/// `|| !self.source_gate.is_open()`.
#[test]
fn a_connection_after_close_source_is_refused_and_counted() {
    let src = Engine::from_json("").unwrap();
    src.close_source(Some(LONG)).unwrap();
    let req = Engine::from_json("").unwrap();
    let err = req.connect(&src.endpoint(), Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(err.status(), Status::Unavailable, "{err}");
    assert!(err.message().contains("the source side is closed"), "{err}");
    let st = src.stats();
    assert_eq!((st.events.connections_refused, st.incoming_connections), (1, 0));
    assert_eq!(req.stats().peers, 0);
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
}

/// `close_source`, once nothing is served, ends the connections it
/// served: right after it returns the source holds none, and a requester
/// connected to it hears its peer gone (peers_alive 0) and has a new
/// submission refused UNAVAILABLE, never one left waiting on a source
/// that no longer serves. Guards `self.inner.listeners.stop_incoming()`
/// in `Engine::close_source` (round 16 Q2: without it the connection
/// stayed open, served by a closed source).
#[test]
fn close_source_ends_the_connections_it_served() {
    let src = Engine::from_json("").unwrap();
    let remote = vec![5u8; 4096];
    let addr = remote.as_ptr() as u64;
    src.register_memory(addr, 4096, Access::READ).unwrap();
    let req = Engine::from_json("").unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let tcp = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(LONG) };
    req.submit(p, &[rd(&local, addr, 4096)], tcp).unwrap().wait(LONG).unwrap();
    assert_eq!(local, remote);
    assert_eq!(src.stats().incoming_connections, 1);
    src.close_source(Some(LONG)).unwrap();
    assert_eq!(src.stats().incoming_connections, 0);
    eventually("the requester hears its peer gone", || req.stats().peers_alive == 0);
    let err = req.submit(p, &[rd(&local, addr, 16)], tcp).map(drop).unwrap_err();
    assert_eq!(err.status(), Status::Unavailable, "{err}");
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
}

/// A dead source's IPC channel reports the peer gone, as TCP does.
#[test]
fn a_dead_shm_source_is_reported_like_a_dead_tcp_peer() {
    let e = Engine::from_json(r#"{"shm_cache_entries": 1}"#).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let src = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string()]);
    let p = e.connect(&src.endpoint, Some(LONG)).unwrap();
    let addr = src.addr;
    e.submit(p, &[rd(&local, addr, 4096)], shm()).unwrap().wait(LONG).unwrap();
    src.kill();
    // Either the submission is refused (the peer is known gone) or its
    // request fails: Unavailable, never a sticky timeout.
    match e.submit(p, &[rd(&local, addr, 16)], shm()) {
        Err(err) => assert_eq!(err.status(), Status::Unavailable, "{err}"),
        Ok(b) => {
            assert!(b.wait(LONG).is_err());
            assert_eq!(b.results()[0].status, Status::Unavailable, "{:?}", b.error(0));
        }
    }
    assert_eq!(e.stats().peers_alive, 0);
    let again = e.submit(p, &[rd(&local, addr, 16)], shm()).err().expect("the peer is gone");
    assert_eq!(again.status(), Status::Unavailable, "{again}");
    e.disconnect(p, Some(LONG)).unwrap();
    e.close(Some(LONG)).unwrap();
}

/// A pool larger than the default mapping budget: forcing SHM says which
/// key to raise on which side; AUTO moves to TCP and says why, in the
/// batch's notes and in the stats; with the key raised on both sides SHM
/// serves it.
#[test]
fn sizing_that_rules_out_shm_is_said_not_silent() {
    let src = Engine::from_json("").unwrap();
    let pool = allocate_shared_host(2048 * MIB).unwrap();
    src.register_memory(pool.addr(), 2048 * MIB, Access::READ).unwrap();
    let req = Engine::from_json("").unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    // Both sides say it before any grant: at registration and at connect.
    let noted = |e: &Engine, what: &str| e.stats().notes.iter().any(|n| n.contains(what));
    assert!(noted(&src, "raise max_inflight_bytes on this engine"), "{:?}", src.stats().notes);
    assert!(noted(&req, "larger than this engine's max_inflight_bytes"), "{:?}", req.stats().notes);
    let b = req.submit(p, &[rd(&local, pool.addr() + MIB, 4096)], shm()).unwrap();
    assert!(b.wait(LONG).is_err());
    let why = b.error(0).unwrap();
    assert_eq!(why.status(), Status::ResourceExhausted);
    assert!(why.message().contains("raise max_inflight_bytes on the source"), "{why}");
    let b = req.submit(p, &[rd(&local, pool.addr() + MIB, 4096)], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp));
    let notes = b.notes().join("\n");
    assert!(notes.contains("moved from shm to tcp") && notes.contains("max_inflight_bytes"), "{notes}");
    assert_eq!(req.stats().transports["shm"].requests_fell_through, 1);
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();

    let big = r#"{"max_inflight_bytes": 4294967296}"#;
    let src = Engine::from_json(big).unwrap();
    src.register_memory(pool.addr(), 2048 * MIB, Access::READ).unwrap();
    // Only the source raised it: the requester's side is named now.
    let req = Engine::from_json("").unwrap();
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let b = req.submit(p, &[rd(&local, pool.addr() + MIB, 4096)], shm()).unwrap();
    assert!(b.wait(LONG).is_err());
    assert!(b.error(0).unwrap().message().contains("raise max_inflight_bytes on the requester"));
    req.close(Some(LONG)).unwrap();
    let req = Engine::from_json(big).unwrap();
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let b = req.submit(p, &[rd(&local, pool.addr() + MIB, 4096)], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm));
    assert!(b.notes().is_empty(), "{:?}", b.notes());
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    pool.free().unwrap();
}

/// A shared allocation larger than the mapping budget (2 MiB against
/// `max_inflight_bytes` 1 MiB): registered for peers (READ) the engine
/// notes, naming the region, that peers can reach it over TCP only and
/// which key to raise; registered local-only (Access::NONE), where no peer
/// reaches it at all, it notes nothing. Guards `engine/regions.rs`
/// `register_memory`'s `access != Access::NONE &&` (round 11 K14: without
/// it a local-only destination buffer got the TCP-only note too).
#[test]
fn the_tcp_only_note_is_for_regions_peers_may_access() {
    let a = allocate_shared_host(2 * MIB).unwrap();
    let budget = r#"{"max_inflight_bytes": 1048576, "max_transfer_bytes": 1048576}"#;
    let local = Engine::from_json(budget).unwrap();
    let before = local.stats().notes;
    local.register_memory(a.addr(), 2 * MIB, Access::NONE).unwrap();
    assert_eq!(local.stats().notes, before, "a local-only region was noted");
    let shared = Engine::from_json(budget).unwrap();
    let before = shared.stats().notes;
    let id = shared.register_memory(a.addr(), 2 * MIB, Access::READ).unwrap();
    let said = format!(
        "region {id} lies in a shared_host allocation of {} bytes, more than max_inflight_bytes (1048576): peers can \
         reach it over TCP only; raise max_inflight_bytes on this engine (and on the requesters)",
        a.physical_len()
    );
    let added: Vec<String> = shared.stats().notes.into_iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(added, [said]);
    local.close(Some(LONG)).unwrap();
    shared.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}

/// The TCP-only notes begin one byte past the mapping budget, on both
/// sides: a shared allocation of exactly `max_inflight_bytes` registered
/// for peers, or published by a source to a requester whose budget it
/// exactly fills, is noted by no one; with a budget one byte smaller the
/// registering engine notes it lies past its budget and the connecting
/// requester notes the peer's region is larger than its own, each naming
/// its budget. Guards `engine/regions.rs` `register_memory`'s
/// `o.physical > budget` and `engine/peers.rs` `connect`'s `r.len >
/// budget` (sweep B: with `>=` an allocation that fits the budget exactly
/// is said to be reachable over TCP only).
#[test]
fn the_tcp_only_notes_begin_one_byte_past_the_mapping_budget() {
    let a = allocate_shared_host(2 * MIB).unwrap();
    let len = a.physical_len();
    assert_eq!(len, 2 * MIB);
    let with_budget = |budget: u64| {
        Engine::from_json(&format!(r#"{{"max_inflight_bytes": {budget}, "max_transfer_bytes": 1048576}}"#)).unwrap()
    };
    let added = |e: &Engine, before: &[String]| -> Vec<String> {
        e.stats().notes.into_iter().filter(|n| !before.contains(n)).collect()
    };
    let src = Engine::from_json("").unwrap();
    let region = src.register_memory(a.addr(), len, Access::READ).unwrap();
    for (budget, noted) in [(len, false), (len - 1, true)] {
        let registering = with_budget(budget);
        let before = registering.stats().notes;
        let id = registering.register_memory(a.addr(), len, Access::READ).unwrap();
        let said = added(&registering, &before);
        let want = format!(
            "region {id} lies in a shared_host allocation of {len} bytes, more than max_inflight_bytes ({budget}): \
             peers can reach it over TCP only; raise max_inflight_bytes on this engine (and on the requesters)"
        );
        assert_eq!(said, if noted { vec![want] } else { vec![] }, "registered against a budget of {budget}");
        registering.close(Some(LONG)).unwrap();

        let requester = with_budget(budget);
        let before = requester.stats().notes;
        let peer = requester.connect(&src.endpoint(), Some(LONG)).unwrap();
        let said = added(&requester, &before);
        let want = format!(
            "peer {peer} ({}) region {region} ({len} bytes of shared_host memory) is larger than this engine's \
             max_inflight_bytes ({budget}): it can only be reached over TCP; raise max_inflight_bytes here (and on \
             the source)",
            src.endpoint()
        );
        assert_eq!(said, if noted { vec![want] } else { vec![] }, "published to a budget of {budget}");
        requester.close(Some(LONG)).unwrap();
    }
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}

/// The stats' notes keep the latest 32 findings, as documented: 40
/// regions registered in a shared host allocation larger than
/// `max_inflight_bytes` leave 32 notes, those of the last 32 regions in
/// the order they came, never 33. Guards `engine/mod.rs` `Inner::note`'s
/// `if n.len() == 32` (with `> 32` the stats held 33).
#[test]
fn the_stats_keep_the_latest_32_notes() {
    let e = Engine::from_json(r#"{"max_inflight_bytes": 1048576, "max_transfer_bytes": 1048576}"#).unwrap();
    let pool = allocate_shared_host(2 * MIB).unwrap();
    let ids: Vec<u64> =
        (0..40).map(|k| e.register_memory(pool.addr() + k * 4096, 4096, Access::READ).unwrap()).collect();
    let notes = e.stats().notes;
    assert_eq!(notes.len(), 32, "{notes:?}");
    let noted: Vec<u64> = notes
        .iter()
        .map(|n| {
            assert!(n.contains("more than max_inflight_bytes (1048576)"), "{n}");
            n.strip_prefix("region ").and_then(|r| r.split(' ').next()).and_then(|id| id.parse().ok()).unwrap()
        })
        .collect();
    assert_eq!(noted, ids[8..].to_vec());
    e.close(Some(LONG)).unwrap();
    pool.free().unwrap();
}

/// The same refusal (the source's mapping budget cannot hold the export,
/// RESOURCE_EXHAUSTED, nothing posted) under AUTO on a requester whose
/// `transport_policy` leaves TCP out: the request fails with SHM's
/// refusal, nothing falls through, no byte moves over TCP, the local bytes
/// are untouched. Guards `&& self.inner.config.transport_policy
/// .contains(&TransportKind::Tcp)` in `engine/submit.rs`'s `run_ipc`
/// (round 8 H14: without it the READ moved over TCP and ended OK).
#[test]
fn auto_without_tcp_in_the_policy_never_falls_through_to_tcp() {
    let src = Engine::from_json(r#"{"max_inflight_bytes": 1048576, "max_transfer_bytes": 1048576}"#).unwrap();
    let pool = allocate_shared_host(4 * MIB).unwrap();
    // SAFETY: the allocation is 4 MiB long, mapped, and written by nobody else.
    unsafe { std::ptr::write_bytes(pool.addr() as *mut u8, 0x5a, (4 * MIB) as usize) };
    src.register_memory(pool.addr(), 4 * MIB, Access::READ).unwrap();
    let req = Engine::from_json(r#"{"transport_policy": ["shm"]}"#).unwrap();
    let local = vec![0x11u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let b = req.submit(p, &[rd(&local, pool.addr() + MIB, 4096)], SubmitOptions::default()).unwrap();
    assert_eq!(b.wait(LONG).unwrap_err().status(), Status::TransferFailed);
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm));
    let why = b.error(0).unwrap();
    assert_eq!(why.status(), Status::ResourceExhausted, "{why}");
    assert!(why.message().contains("raise max_inflight_bytes on the source"), "{why}");
    assert!(local.iter().all(|b| *b == 0x11), "bytes landed");
    let st = req.stats();
    let (shm, tcp) = (&st.transports["shm"], &st.transports["tcp"]);
    assert_eq!((shm.requests_failed, shm.requests_fell_through), (1, 0), "{}", st.to_json());
    assert_eq!((tcp.requests_completed, tcp.requests_failed, tcp.wire_bytes_sent), (0, 0, 0), "{}", st.to_json());
    assert_eq!(src.stats().transports["tcp"].served_requests, 0);
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    pool.free().unwrap();
}

/// A source closing while its only export is retained (no close receipt;
/// the requester's channel was lost as the export's handle arrived, so
/// nothing was mapped) still asks the requester for its imports back: the
/// requester gets the Revoke, releases the lost grant through its new
/// channel, and the source's close is OK with nothing left. Without the
/// Revoke nothing would release it and the close would end UNQUIESCED at
/// its deadline. Guards `Engine::close_source`'s `counts().open +
/// t.exports.counts().retained > 0` (round 17 R4: counting open exports
/// only, no Revoke went out while every export was retained).
#[test]
fn a_closing_source_asks_for_a_retained_export_back() {
    let src = Engine::from_json("").unwrap();
    let a = allocate_shared_host(MIB).unwrap();
    src.register_memory(a.addr(), MIB, Access::READ).unwrap();
    let req = Engine::from_json(r#"{"shm_cache_entries": 0}"#).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    req.faults().lose_handle.store(1, std::sync::atomic::Ordering::SeqCst);
    let b = req.submit(p, &[rd(&local, a.addr(), 4096)], shm()).unwrap();
    assert!(b.wait(LONG).is_err());
    let r = b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::Unavailable, RemoteEffect::None), "{:?}", b.error(0));
    let held = || {
        let st = src.stats().ipc["shm"].exports;
        (st.open, st.retained)
    };
    eventually("the source saw the channel lost", || held() == (0, 1));
    assert_eq!(req.stats().events.revokes_received, 0);
    src.close_source(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(held(), (0, 0));
    assert_eq!(req.stats().events.revokes_received, 1);
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    a.free().unwrap();
}
