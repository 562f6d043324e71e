//! Direct routes (`Engine::open_direct`, `Engine::copy_direct`): one
//! request at a time through the relocation cache and the grant board, on
//! the caller's thread, between two engines of one process over SHM.

use orbite::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const LEN: u64 = 1 << 20;

/// A source publishing one shared allocation (bytes `i % 251`) and a
/// requester with a registered local buffer, connected.
struct Pair {
    src: Engine,
    req: Engine,
    a: Allocation,
    rid: u64,
    local: Vec<u8>,
    peer: u64,
}

impl Pair {
    fn new(access: Access) -> Pair {
        let src = Engine::new(EngineConfig::default()).unwrap();
        let req = Engine::new(EngineConfig::default()).unwrap();
        let a = allocate_shared_host(LEN).unwrap();
        // SAFETY: the allocation maps LEN bytes.
        let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, LEN as usize) };
        for (i, b) in remote.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let rid = src.register_memory(a.addr(), LEN, access).unwrap();
        let mut local = vec![0u8; 1 << 16];
        req.register_memory(local.as_mut_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        Pair { src, req, a, rid, local, peer }
    }

    fn remote(&self) -> &[u8] {
        // SAFETY: the allocation maps LEN bytes and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.a.addr() as *const u8, LEN as usize) }
    }

    fn route(&self) -> Result<DirectRoute> {
        self.req.open_direct(self.peer, self.a.addr(), LEN, Transport::Auto, None)
    }

    fn req(&self, op: Op, local_off: u64, remote_off: u64, len: u64) -> Request {
        Request { op, local_addr: self.local.as_ptr() as u64 + local_off, remote_addr: self.a.addr() + remote_off, len }
    }

    fn copy(&self, route: &DirectRoute, r: Request) -> (RequestResult, Option<Error>) {
        self.req.copy_direct(route, &r, Some(T)).unwrap()
    }

    fn close(self) {
        self.req.close(Some(T)).unwrap();
        self.src.close(Some(T)).unwrap();
        drop((self.req, self.src));
        self.a.free().unwrap();
    }
}

/// READs and WRITEs through one route move exact bytes and say so, the
/// first opening the import and every later one entering its board slot
/// (no round trip), counted in the shm statistics like a submission's.
/// Guards `copy_direct`'s `run_group` call and its outcome mapping.
#[test]
fn a_direct_route_reads_and_writes_exact_bytes_without_a_round_trip() {
    let p = Pair::new(Access::READ_WRITE);
    let route = p.route().unwrap();
    assert_eq!(route.transport(), TransportKind::Shm);
    assert_eq!(route.region().id, p.rid);
    for (k, off) in [7u64, 4096 * 3 + 1, LEN - 8192].into_iter().enumerate() {
        let (r, e) = p.copy(&route, p.req(Op::Read, 0, off, 8192));
        assert_eq!((r.status, r.remote_effect, e.is_none()), (Status::Ok, RemoteEffect::None, true), "read {k}");
        assert!((0..8192).all(|i| p.local[i] == ((off as usize + i) % 251) as u8), "read {k} bytes");
    }
    let mut p = p;
    p.local[..4096].iter_mut().for_each(|b| *b = 0xA5);
    let (r, e) = p.copy(&route, p.req(Op::Write, 0, 12345, 4096));
    assert_eq!((r.status, r.remote_effect, e.is_none()), (Status::Ok, RemoteEffect::Applied, true));
    assert!(p.remote()[12345..12345 + 4096].iter().all(|&b| b == 0xA5));
    assert_eq!(p.remote()[12344], (12344 % 251) as u8, "nothing before the range changed");
    assert_eq!(p.remote()[12345 + 4096], ((12345 + 4096) % 251) as u8, "nothing after it");
    let st = p.req.stats();
    assert_eq!(st.transports["shm"].requests_completed, 4, "{}", st.to_json());
    assert_eq!(st.transports["shm"].bytes_completed, 3 * 8192 + 4096);
    let imports = &st.ipc["shm"].imports;
    // The READ-only import the first READ opened, then the writable one
    // the WRITE needed.
    assert_eq!(imports.opened, 2, "{imports:?}");
    assert_eq!(imports.groups_with_round_trips, 0, "{imports:?}");
    assert_eq!(imports.groups_without_round_trip, 4, "{imports:?}");
    // The second and third READs went through the import the first one
    // left held; the WRITE needed the writable one (the full path).
    assert_eq!(imports.direct_copies, 2, "{imports:?}");
    p.close();
}

/// What the route's region or the call forbids is refused before anything
/// moves: a WRITE to a READ-only region and a range outside the region as
/// the request's outcome (remote effect NONE, the remote bytes unchanged);
/// unregistered local memory, a zero length and another engine's route as
/// the call's error. Guards the `allowed` and `contains` checks of
/// `direct_outcome` and the lease and engine checks of `copy_direct`.
#[test]
fn a_direct_route_refuses_what_the_region_or_the_call_forbids() {
    let p = Pair::new(Access::READ);
    let route = p.route().unwrap();
    let (r, e) = p.copy(&route, p.req(Op::Write, 0, 0, 4096));
    assert_eq!((r.status, r.remote_effect), (Status::PermissionDenied, RemoteEffect::None), "{e:?}");
    assert!(e.unwrap().message().contains("without WRITE access"));
    assert_eq!(p.remote()[..4096].iter().enumerate().filter(|(i, &b)| b != (i % 251) as u8).count(), 0);
    let (r, e) = p.copy(&route, p.req(Op::Read, 0, LEN - 4096, 8192));
    assert_eq!((r.status, r.remote_effect), (Status::OutOfRange, RemoteEffect::None), "{e:?}");
    let stray = vec![0u8; 4096];
    let bad = Request { local_addr: stray.as_ptr() as u64, ..p.req(Op::Read, 0, 0, 4096) };
    let e = p.req.copy_direct(&route, &bad, None).unwrap_err();
    assert_eq!(e.status(), Status::NotFound, "{e}");
    assert!(e.message().starts_with("local "), "{e}");
    let e = p.req.copy_direct(&route, &p.req(Op::Read, 0, 0, 0), None).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = p.src.copy_direct(&route, &p.req(Op::Read, 0, 0, 4096), None).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("another engine"), "{e}");
    // Only the two refused requests were counted, as failed.
    let shm = p.req.stats().transports["shm"].clone();
    assert_eq!((shm.requests_completed, shm.requests_failed), (0, 2));
    p.close();
}

/// A route is opened only where an IPC transport maps the peer's memory:
/// forced TCP is NOT_SUPPORTED, plain host memory of the peer (TCP only)
/// UNAVAILABLE, naming why per transport, and a range no region holds
/// NOT_FOUND. Guards `open_direct`'s transport choice.
#[test]
fn a_direct_route_opens_only_where_an_ipc_transport_maps_the_region() {
    let p = Pair::new(Access::READ_WRITE);
    let tcp = Transport::Only(TransportKind::Tcp);
    let e = p.req.open_direct(p.peer, p.a.addr(), 4096, tcp, None).err().unwrap();
    assert_eq!(e.status(), Status::NotSupported, "{e}");
    let host = vec![0u8; 8192];
    p.src.register_memory(host.as_ptr() as u64, 8192, Access::READ).unwrap();
    let e = p.req.open_direct(p.peer, host.as_ptr() as u64, 8192, Transport::Auto, None).err().unwrap();
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().contains("shm: cannot carry the peer's host memory"), "{e}");
    let e = p.req.open_direct(p.peer, p.a.addr() + LEN - 1, 2, Transport::Auto, None).err().unwrap();
    assert_eq!(e.status(), Status::NotFound, "{e}");
    p.close();
}

/// A route whose region the peer unregistered fails its next copy (the
/// source revoked the grant: the copy takes the round trip and is
/// refused), moving nothing; the region registered again is reached by a
/// new route. A closed requester refuses the call. Guards the route
/// holding no grant of its own: every copy goes through the cache and the
/// board.
#[test]
fn a_route_to_an_unregistered_region_fails_and_a_new_one_reaches_it_again() {
    let mut p = Pair::new(Access::READ_WRITE);
    let route = p.route().unwrap();
    assert_eq!(p.copy(&route, p.req(Op::Read, 0, 0, 4096)).0.status, Status::Ok);
    p.req.flush_nvlink_cache(Some(T)).unwrap();
    p.src.unregister_memory(p.rid, Some(T)).unwrap();
    p.local[..4096].iter_mut().for_each(|b| *b = 0xEE);
    let (r, e) = p.copy(&route, p.req(Op::Read, 0, 0, 4096));
    assert_ne!(r.status, Status::Ok, "a READ of an unregistered region");
    assert_eq!(r.remote_effect, RemoteEffect::None);
    assert!(e.is_some());
    assert!(p.local[..4096].iter().all(|&b| b == 0xEE), "nothing moved");
    p.rid = p.src.register_memory(p.a.addr(), LEN, Access::READ_WRITE).unwrap();
    let fresh = p.route().unwrap();
    assert_eq!(fresh.region().id, p.rid);
    let (r, e) = p.copy(&fresh, p.req(Op::Read, 0, 100, 4096));
    assert_eq!(r.status, Status::Ok, "{e:?}");
    assert!((0..4096).all(|i| p.local[i] == ((100 + i) % 251) as u8));
    p.req.close_requester(Some(T)).unwrap();
    let e = p.req.copy_direct(&fresh, &p.req(Op::Read, 0, 0, 4096), None).unwrap_err();
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    p.close();
}

/// A route copying in a loop while another thread flushes the relocation
/// cache again and again: each flush closes the import the route holds
/// (its native close unmaps it), and the route goes on through the full
/// path and holds the new import. Every copy ends OK with exact bytes, and
/// none touches an unmapped import (the process would die of SIGSEGV).
/// Guards `stop_direct_copies` in `close_import` and the `unmapping` check
/// of `enter_direct`.
#[test]
fn direct_copies_through_a_held_import_survive_flushes_that_unmap_it() {
    let mut p = Pair::new(Access::READ_WRITE);
    let route = p.route().unwrap();
    let local = p.local.as_mut_ptr() as u64;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (req, a) = (&p.req, p.a.addr());
    let flushes = std::thread::scope(|s| {
        let flusher = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                req.flush_nvlink_cache(Some(T)).unwrap();
                n += 1;
            }
            n
        });
        for k in 0..4000u64 {
            let off = (k * 4096) % (LEN - 65536);
            let r = Request { op: Op::Read, local_addr: local, remote_addr: a + off, len: 65536 };
            let (res, e) = req.copy_direct(&route, &r, Some(T)).unwrap();
            assert_eq!(res.status, Status::Ok, "copy {k}: {e:?}");
            // SAFETY: the local buffer holds 64 KiB and no one else writes it now.
            let got = unsafe { std::slice::from_raw_parts(local as *const u8, 65536) };
            assert!(got.iter().enumerate().all(|(i, &b)| b == ((off as usize + i) % 251) as u8), "copy {k} bytes");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flusher.join().unwrap()
    });
    let imports = p.req.stats().ipc["shm"].imports.clone();
    assert!(flushes > 0);
    assert!(imports.direct_copies > 0, "no copy went through a held import: {imports:?}");
    assert!(imports.opened > 1, "no flush closed the held import: {imports:?}");
    p.local[0] = 0;
    p.close();
}
