//! Two engines in one process over loopback TCP: the basic round trips.

mod common;

use orbite::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn read_and_write_round_trip_in_process() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let mut remote = pattern(1 << 20, 3);
    let mut local = vec![0u8; 1 << 20];
    src.register_memory(remote.as_mut_ptr() as u64, remote.len() as u64, Access::READ_WRITE).unwrap();
    req.register_memory(local.as_mut_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let b = req
        .submit(
            peer,
            &[Request {
                op: Op::Read,
                local_addr: local.as_ptr() as u64,
                remote_addr: remote.as_ptr() as u64,
                len: 1 << 20,
            }],
            SubmitOptions::default(),
        )
        .unwrap();
    b.wait(T).unwrap();
    assert_eq!(local, remote);
    let w = pattern(4097, 9);
    local[..4097].copy_from_slice(&w);
    let b = req
        .submit(
            peer,
            &[Request {
                op: Op::Write,
                local_addr: local.as_ptr() as u64,
                remote_addr: remote.as_ptr() as u64 + 5,
                len: 4097,
            }],
            SubmitOptions::default(),
        )
        .unwrap();
    b.wait(T).unwrap();
    assert_eq!(b.results()[0], RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied });
    assert_eq!(&remote[5..5 + 4097], &w[..]);
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
}

#[test]
fn cuda_registration_helpers_check_memory_kinds() {
    let e = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(4096).unwrap();
    let err = e.register_cuda_memory_batch(&[(&a, Access::READ)]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("not CUDA memory"), "{err}");
    let err = e.register_host_memory(&a, Access::READ).unwrap_err();
    assert!(err.message().contains("allocate_pinned_host"), "{err}");
    assert!(e.regions().is_empty(), "nothing registered on failure");
    // Without CUDA (or a driver) the CUDA allocations say why.
    for r in [
        orbite::CudaMemory::allocate(0, 16),
        orbite::CudaMemory::allocate_ipc(0, 16),
        orbite::allocate_pinned_host(16),
        orbite::allocate_mnnvl(0, 16),
        orbite::allocate_egm(0, 16),
    ] {
        let err = r.expect_err("no CUDA device here");
        assert!(matches!(err.status(), Status::Unavailable | Status::NotSupported), "{err}");
    }
    a.free().unwrap();
}

/// Which transport carried each request, and the transports each side can
/// use: a shared allocation goes over SHM under AUTO, heap memory over TCP
/// (CMA, which each engine offers, needs two processes).
#[test]
fn batches_say_which_transport_carried_each_request() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    assert_eq!(src.transports(), [TransportKind::Tcp, TransportKind::Shm, TransportKind::Cma]);
    let shared = allocate_shared_host(8192).unwrap();
    let mut heap = pattern(4096, 5);
    src.register_memory(shared.addr(), 8192, Access::READ).unwrap();
    src.register_memory(heap.as_mut_ptr() as u64, 4096, Access::READ).unwrap();
    let mut local = vec![0u8; 8192];
    req.register_memory(local.as_mut_ptr() as u64, 8192, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    assert_eq!(req.peer_transports(peer).unwrap(), [TransportKind::Tcp, TransportKind::Shm]);
    assert_eq!(req.peer_transports(peer + 1).unwrap_err().status(), Status::NotFound);
    let read = |remote: u64, at: usize| Request {
        op: Op::Read,
        local_addr: local.as_ptr() as u64 + at as u64,
        remote_addr: remote,
        len: 4096,
    };
    let b = req.submit(peer, &[read(shared.addr(), 0)], SubmitOptions::default()).unwrap();
    b.wait(T).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm));
    let b = req.submit(peer, &[read(heap.as_ptr() as u64, 4096)], SubmitOptions::default()).unwrap();
    b.wait(T).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp));
    assert_eq!(b.result(0).unwrap(), RequestResult { status: Status::Ok, remote_effect: RemoteEffect::None });
    assert_eq!(b.transport(1).unwrap_err().status(), Status::OutOfRange);
    assert_eq!(b.result(1).unwrap_err().status(), Status::OutOfRange);
    assert_eq!(&local[4096..], &heap[..]);
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    shared.free().unwrap();
}

/// A submission of no requests to a connected peer is INVALID_ARGUMENT "a
/// submission needs at least one request", with a notification or without
/// (Rust callers reach this; the C ABI refuses count 0 itself), and the
/// peer then serves a one-request batch as before. Guards `if
/// requests.is_empty() {` in `engine/check.rs`'s `check_submission`
/// (round 14 N4: without it, an empty batch was submitted).
#[test]
fn a_submission_of_no_requests_is_an_invalid_argument() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let remote = pattern(4096, 5);
    let mut local = vec![0u8; 4096];
    src.register_memory(remote.as_ptr() as u64, 4096, Access::READ).unwrap();
    req.register_memory(local.as_mut_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(T)).unwrap();
    let opts = || SubmitOptions { timeout: Some(T), ..SubmitOptions::default() };
    let refused = [req.submit(peer, &[], opts()), req.submit_with_notification(peer, &[], opts(), b"done")];
    for (k, r) in refused.into_iter().enumerate() {
        let err = r.err().unwrap_or_else(|| panic!("submission {k} of no requests was accepted"));
        assert_eq!(err.status(), Status::InvalidArgument, "{k}: {err}");
        assert_eq!(err.message(), "a submission needs at least one request", "{k}");
    }
    let one =
        Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote.as_ptr() as u64, len: 4096 };
    req.submit(peer, &[one], opts()).unwrap().wait(T).unwrap();
    assert_eq!(local, remote);
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
}

/// A connect to port 0 is refused INVALID_ARGUMENT before any socket is
/// opened, with the endpoint named, whether the host is an IP or
/// `localhost`; no peer is added. Guards `control/endpoint.rs`'s
/// `host == "localhost" && port != 0` (without the port check,
/// "localhost:0" was connected to and failed UNAVAILABLE).
#[test]
fn a_connect_to_port_zero_is_an_invalid_argument() {
    let e = Engine::new(EngineConfig::default()).unwrap();
    for ep in ["127.0.0.1:0", "localhost:0"] {
        let err = e.connect(ep, Some(T)).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{ep}: {err}");
        assert!(err.message().contains(&format!("{ep:?} is not an endpoint")), "{err}");
    }
    assert_eq!(e.stats().peers_alive, 0);
    e.close(Some(T)).unwrap();
}

/// A new connection goes to the least loaded I/O thread: six requesters
/// connected one after another to a source with three I/O threads leave
/// two connections on each (`io.connections_per_thread`). Guards
/// `.min_by_key(|w| w.conns.load(..))` in `transport/reactor.rs`'s `pick`
/// (round 11 K13: the most loaded thread took them, 4, 1 and 1).
#[test]
fn connections_spread_over_the_io_threads() {
    let src = Engine::from_json(r#"{"io_threads": 3}"#).unwrap();
    let mut reqs = Vec::new();
    for n in 1..=6usize {
        let req = Engine::from_json(r#"{"transport_policy": ["tcp"]}"#).unwrap();
        req.connect(&src.endpoint(), Some(T)).unwrap();
        reqs.push(req);
        common::eventually("the source serves every connection so far", || {
            src.stats().io.connections_per_thread.iter().sum::<usize>() == n
        });
    }
    assert_eq!(src.stats().io.connections_per_thread, [2, 2, 2]);
    for req in reqs {
        req.close(Some(T)).unwrap();
    }
    src.close(Some(T)).unwrap();
}

/// How a call ended: `Ok(())` accepted, `Err((status, message))` refused.
type Outcome = std::result::Result<(), (Status, String)>;

/// One row of a refusal table: the case, the status and message its call
/// must be refused with, and how the call ended.
type Case<'a> = (&'a str, Status, String, Outcome);

/// How `r` ended, for the refusal tables below.
fn outcome<T>(r: Result<T>) -> Outcome {
    r.map(drop).map_err(|e| (e.status(), e.message().to_string()))
}

/// The rows of a refusal table whose call was not refused with exactly
/// the status and message expected.
fn mismatches(cases: Vec<Case<'_>>) -> Vec<Case<'_>> {
    cases.into_iter().filter(|(_, status, text, got)| got.as_ref().err() != Some(&(*status, text.clone()))).collect()
}

/// A requester whose requester side is closed refuses a connect
/// UNAVAILABLE "the requester side is closed" (no peer is added); once the
/// whole engine is closed, every entry that would start work is refused
/// UNAVAILABLE "the engine is closed", not with what a lower layer says of
/// the same call (the peer table, the regions and the requester side are
/// gone by then: NOT_FOUND, or UNAVAILABLE naming another cause), and does
/// nothing: no region is registered, no peer added. Guards
/// `self.check_open()?` in `register_memory`, `check_submission`,
/// `notify`, `connect`, `connect_name`, `open_direct`, `copy_direct`,
/// `flush_nvlink_cache` and `record_producer_stream`, `if
/// self.inner.closed.load(..)` in `check_open`, and `connect`'s `if
/// !self.inner.requester_gate.is_open()`.
#[test]
fn every_entry_of_a_closed_engine_is_refused_as_closed_and_does_nothing() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(4096).unwrap();
    src.register_memory(a.addr(), 4096, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; 4096];
    let l = local.as_mut_ptr() as u64;
    let lid = req.register_memory(l, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(T)).unwrap();
    let route = req.open_direct(peer, a.addr(), 4096, Transport::Auto, Some(T)).unwrap();
    assert_eq!(route.transport(), TransportKind::Shm);
    req.close_requester(Some(T)).unwrap();
    let e = req.connect(&src.endpoint(), Some(T)).unwrap_err();
    assert_eq!((e.status(), e.message()), (Status::Unavailable, "the requester side is closed"));
    assert_eq!(req.stats().peers, 0, "a peer was added past close_requester");

    req.close(Some(T)).unwrap();
    let r = Request { op: Op::Read, local_addr: l, remote_addr: a.addr(), len: 4096 };
    let opts = SubmitOptions { timeout: Some(T), ..SubmitOptions::default() };
    let more = vec![0u8; 4096];
    let closed = |case, got| (case, Status::Unavailable, "the engine is closed".to_string(), got);
    let wrong = mismatches(vec![
        closed("register_memory", outcome(req.register_memory(more.as_ptr() as u64, 4096, Access::READ))),
        closed("submit", outcome(req.submit(peer, &[r], opts))),
        closed("submit_with_notification", outcome(req.submit_with_notification(peer, &[r], opts, b"done"))),
        closed("notify", outcome(req.notify(peer, b"done", Some(T)))),
        closed("connect", outcome(req.connect(&src.endpoint(), Some(T)))),
        closed("connect_name", outcome(req.connect_name("src", Some(T)))),
        closed("open_direct", outcome(req.open_direct(peer, a.addr(), 4096, Transport::Auto, Some(T)))),
        closed("copy_direct", outcome(req.copy_direct(&route, &r, Some(T)))),
        closed("flush_nvlink_cache", outcome(req.flush_nvlink_cache(Some(T)))),
        closed("record_producer_stream", outcome(req.record_producer_stream(lid, 0))),
    ]);
    assert!(wrong.is_empty(), "entries not refused as closed (case, status, message, got): {wrong:#?}");
    assert!(req.regions().is_empty(), "a region was registered on a closed engine: {:?}", req.regions());
    assert_eq!(req.stats().peers, 0, "a peer was added to a closed engine");
    drop((route, req));
    src.close(Some(T)).unwrap();
    drop(src);
    common::free_eventually(a);
    drop(local);
}

/// A peer id or region id the engine never gave out is NOT_FOUND naming
/// it, at every entry that takes one, and nothing is done: the one
/// region registered stays the only one. Guards the lookups of
/// `Engine::peer` (submit, notify, open_direct, peer_regions,
/// peer_endpoint, peer_transports, disconnect), of
/// `RegionTable::unregister` and of `record_producer_stream`.
#[test]
fn an_unknown_peer_or_region_id_is_not_found_naming_it() {
    let e = Engine::new(EngineConfig::default()).unwrap();
    let mut local = vec![0u8; 4096];
    let l = local.as_mut_ptr() as u64;
    let lid = e.register_memory(l, 4096, Access::NONE).unwrap();
    assert_ne!(lid, 78);
    let r = Request { op: Op::Read, local_addr: l, remote_addr: 0x10000, len: 16 };
    let opts = SubmitOptions { timeout: Some(T), ..SubmitOptions::default() };
    let no_peer = |case, got| (case, Status::NotFound, "no peer with id 77".to_string(), got);
    let no_region = |case, got| (case, Status::NotFound, "no region with id 78 is registered".to_string(), got);
    let wrong = mismatches(vec![
        no_peer("submit", outcome(e.submit(77, &[r], opts))),
        no_peer("submit_with_notification", outcome(e.submit_with_notification(77, &[r], opts, b"done"))),
        no_peer("notify", outcome(e.notify(77, b"done", Some(T)))),
        no_peer("open_direct", outcome(e.open_direct(77, 0x10000, 16, Transport::Auto, Some(T)))),
        no_peer("peer_regions", outcome(e.peer_regions(77, Some(T)))),
        no_peer("peer_endpoint", outcome(e.peer_endpoint(77))),
        no_peer("peer_transports", outcome(e.peer_transports(77))),
        no_peer("disconnect", outcome(e.disconnect(77, Some(T)))),
        no_region("unregister_memory", outcome(e.unregister_memory(78, Some(T)))),
        no_region("record_producer_stream", outcome(e.record_producer_stream(78, 0))),
    ]);
    assert!(
        wrong.is_empty(),
        "unknown ids not refused as NOT_FOUND naming them (case, status, message, got): {wrong:#?}"
    );
    assert_eq!(e.regions().iter().map(|g| g.id).collect::<Vec<_>>(), vec![lid]);
    e.close(Some(T)).unwrap();
    drop(local);
}

/// A registration of a NULL address, of length 0, of a range that wraps
/// the address space or that overlaps a registered region (by its last
/// byte) is INVALID_ARGUMENT naming the cause, and registers nothing; the
/// range right after the region registers. A config built in Rust with
/// no transport in `transport_policy` is refused by `Engine::new`,
/// INVALID_CONFIG naming the key (JSON cannot express it: its parser
/// refuses the empty list first). Guards `addr == 0`, `len == 0`, the
/// `checked_add` and `r.end() > addr` of `RegionTable::register`, and
/// `self.transport_policy.is_empty()` in `EngineConfig::validate`.
#[test]
fn a_registration_of_a_bad_range_is_invalid_naming_the_cause() {
    let e = Engine::new(EngineConfig::default()).unwrap();
    let buf = vec![0u8; 8192];
    let b = buf.as_ptr() as u64;
    let id = e.register_memory(b, 4096, Access::READ).unwrap();
    let invalid = |case, text: String, got| (case, Status::InvalidArgument, text, got);
    let wrong = mismatches(vec![
        invalid("NULL", "addr is NULL".into(), outcome(e.register_memory(0, 16, Access::READ))),
        invalid("length 0", "length is 0".into(), outcome(e.register_memory(b + 4096, 0, Access::READ))),
        invalid(
            "wrapping",
            "range 0xfffffffffffffff0+32 wraps the address space".into(),
            outcome(e.register_memory(u64::MAX - 15, 32, Access::READ)),
        ),
        invalid(
            "overlapping",
            format!("range 0x{:x}+16 overlaps region {id} (0x{b:x}+4096)", b + 4095),
            outcome(e.register_memory(b + 4095, 16, Access::READ)),
        ),
    ]);
    assert!(wrong.is_empty(), "bad ranges not refused naming the cause (case, status, message, got): {wrong:#?}");
    assert_eq!(e.regions().iter().map(|g| (g.id, g.addr, g.len)).collect::<Vec<_>>(), vec![(id, b, 4096)]);
    e.register_memory(b + 4096, 4096, Access::READ).unwrap();
    e.close(Some(T)).unwrap();
    drop(buf);

    let none = EngineConfig { transport_policy: Vec::new(), ..EngineConfig::default() };
    let err = Engine::new(none).err().expect("an engine with no transport in its policy started");
    assert_eq!(
        (err.status(), err.message()),
        (Status::InvalidConfig, "key `transport_policy`: must name at least one transport")
    );
}

/// A submission whose request `i` has length 0, a local address in no
/// registered region, or a local range crossing its region's end is
/// refused whole, with the status of the cause and a message naming
/// request `i`; a direct copy of length 0 says the same of its one
/// request; a submission whose notification is larger than this engine's
/// `notification_max_bytes` (64) is INVALID_ARGUMENT naming both sizes.
/// None of them moves a byte (every request is a WRITE of the peer's
/// region) or sends a notification; then a notification of exactly 64
/// bytes goes with its WRITE. Guards `nonzero`'s index, the index in
/// `lease_local`'s message, and `self.check_notification(msg)?` in
/// `submit_with_notification` (without it, the peer, whose limit is
/// larger, took the notification).
#[test]
fn a_submissions_bad_request_or_notification_is_refused_naming_it_and_moves_nothing() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::from_json(r#"{"notification_max_bytes": 64}"#).unwrap();
    let a = allocate_shared_host(4096).unwrap();
    // SAFETY: the allocation maps 4096 bytes, zeroed, and outlives the slice.
    let remote = unsafe { std::slice::from_raw_parts(a.addr() as *const u8, 4096) };
    src.register_memory(a.addr(), 4096, Access::READ_WRITE).unwrap();
    let local = pattern(8192, 9);
    let l = local.as_ptr() as u64;
    let lid = req.register_memory(l, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(T)).unwrap();
    let opts = SubmitOptions { timeout: Some(T), ..SubmitOptions::default() };
    let w = |off: u64, len: u64| Request { op: Op::Write, local_addr: l + off, remote_addr: a.addr() + off, len };
    let route = req.open_direct(peer, a.addr(), 4096, Transport::Auto, Some(T)).unwrap();
    let case = |case, status, text: String, got| (case, status, text, got);
    let wrong = mismatches(vec![
        case(
            "length 0",
            Status::InvalidArgument,
            "request 1: length is 0".into(),
            outcome(req.submit(peer, &[w(0, 16), w(16, 0)], opts)),
        ),
        case(
            "unregistered",
            Status::NotFound,
            format!("request 2: local address 0x{:x} is in no registered region", l + 4096),
            outcome(req.submit(peer, &[w(0, 16), w(16, 16), w(4096, 16)], opts)),
        ),
        case(
            "crossing",
            Status::OutOfRange,
            format!("request 1: local range 0x{:x}+200 crosses the end of region {lid} (0x{l:x}+4096)", l + 4000),
            outcome(req.submit(peer, &[w(0, 16), w(4000, 200)], opts)),
        ),
        case(
            "direct length 0",
            Status::InvalidArgument,
            "the request's length is 0".into(),
            outcome(req.copy_direct(&route, &w(0, 0), Some(T))),
        ),
        case(
            "notification of 65 bytes",
            Status::InvalidArgument,
            "a notification of 65 bytes exceeds notification_max_bytes (64)".into(),
            outcome(req.submit_with_notification(peer, &[w(0, 16)], opts, &[b'n'; 65])),
        ),
    ]);
    assert!(wrong.is_empty(), "bad submissions not refused naming the cause (case, status, message, got): {wrong:#?}");
    assert!(remote.iter().all(|&b| b == 0), "a refused submission wrote the peer's memory");
    let e = src.take_notification(Duration::ZERO).unwrap_err();
    assert_eq!((e.status(), e.message()), (Status::TimedOut, "no notification came within 0 ms"));
    req.submit_with_notification(peer, &[w(0, 4096)], opts, &[b'n'; 64]).unwrap().wait(T).unwrap();
    assert_eq!(remote, &local[..4096]);
    assert_eq!(src.take_notification(T).unwrap().msg, vec![b'n'; 64]);
    drop(route);
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    drop((req, src));
    common::free_eventually(a);
}

/// A shared host allocation of 0 bytes, or of more bytes than a mapping
/// can hold (2^63, already a multiple of the 2 MiB rounding), is
/// INVALID_ARGUMENT naming the length, before any memory file is made (a
/// file of 2^63 bytes is refused later with another message). Guards
/// `.filter(|p| *p <= isize::MAX as u64)` in `memfd.rs`'s
/// `shared_physical` and `len == 0` in `allocate_shared_host`.
#[test]
fn a_shared_allocation_of_no_or_too_many_bytes_is_invalid_naming_its_length() {
    let invalid = |case, text: &str, got| (case, Status::InvalidArgument, text.to_string(), got);
    let wrong = mismatches(vec![
        invalid("0 bytes", "length is 0", outcome(allocate_shared_host(0))),
        invalid("2^63 bytes", "length 9223372036854775808 is too large", outcome(allocate_shared_host(1 << 63))),
    ]);
    assert!(wrong.is_empty(), "allocations not refused naming the length (case, status, message, got): {wrong:#?}");
}

/// Calls naming a peer that is gone (its engine closed) or a name that
/// cannot be an engine's are refused before anything is sent: a notify
/// and a submission to the gone peer name it ("peer N is gone: " and the
/// cause), the notify counted `not_sent` and nothing sent; a connect_name
/// of a malformed name is INVALID_ARGUMENT naming the rule it breaks (on
/// an engine without discovery, which refuses a well-formed name
/// UNAVAILABLE). Guards `p.conn.dead_reason()` in `notify`, the describe
/// check of `submit_inner`, and `check_name(name)` in `connect_name`.
#[test]
fn a_call_to_a_gone_peer_or_a_malformed_name_is_refused_naming_it() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let mut local = vec![0u8; 4096];
    let l = local.as_mut_ptr() as u64;
    req.register_memory(l, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    common::eventually("the closed source is seen gone", || req.peer_transports(peer).unwrap().is_empty());
    let r = Request { op: Op::Read, local_addr: l, remote_addr: 0x10000, len: 16 };
    let opts = SubmitOptions { timeout: Some(T), ..SubmitOptions::default() };
    let gone = format!("peer {peer} is gone: ");
    for (case, got) in
        [("notify", outcome(req.notify(peer, b"late", Some(T)))), ("submit", outcome(req.submit(peer, &[r], opts)))]
    {
        let Err((status, text)) = got else { panic!("{case} to a gone peer was accepted") };
        assert_eq!(status, Status::Unavailable, "{case}: {text}");
        assert!(text.starts_with(&gone), "{case}: {text}");
    }
    let n = req.stats().notifications;
    assert_eq!((n.sent, n.not_sent), (0, 1), "the notify to a gone peer was not counted unsent, or was sent");
    let invalid = |case, text: &str, got| (case, Status::InvalidArgument, text.to_string(), got);
    let wrong = mismatches(vec![
        invalid("empty name", "a name is 1 to 64 bytes; \"\" has 0", outcome(req.connect_name("", Some(T)))),
        invalid(
            "name with a slash",
            "a name holds only A-Z a-z 0-9 . _ -; \"a/b\" holds '/'",
            outcome(req.connect_name("a/b", Some(T))),
        ),
        (
            "well-formed name",
            Status::Unavailable,
            "no discovery is configured (config `discovery`)".into(),
            outcome(req.connect_name("a.b_c-9", Some(T))),
        ),
    ]);
    assert!(wrong.is_empty(), "names not refused naming the cause (case, status, message, got): {wrong:#?}");
    assert_eq!(req.stats().peers, 1, "a connect_name added a peer");
    req.close(Some(T)).unwrap();
    drop(local);
}
