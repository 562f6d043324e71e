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
