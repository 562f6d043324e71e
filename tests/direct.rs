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
        Pair::publishing(access, &[LEN], "{}")
    }

    /// The allocation published as consecutive regions of `lens` bytes
    /// from its start (the first one's id in `rid`), to a requester of
    /// configuration `req_cfg`.
    fn publishing(access: Access, lens: &[u64], req_cfg: &str) -> Pair {
        let src = Engine::new(EngineConfig::default()).unwrap();
        let req = Engine::from_json(req_cfg).unwrap();
        let a = allocate_shared_host(LEN).unwrap();
        // SAFETY: the allocation maps LEN bytes.
        let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, LEN as usize) };
        for (i, b) in remote.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let mut at = a.addr();
        let rids: Vec<u64> = lens
            .iter()
            .map(|&len| {
                at += len;
                src.register_memory(at - len, len, access).unwrap()
            })
            .collect();
        let rid = rids[0];
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

/// A route of length 0 is INVALID_ARGUMENT "the route's length is 0",
/// before any peer is asked: at the start of the peer's region, at an
/// address no region holds and toward a peer that does not exist alike;
/// the same range of length 1 opens. Guards `if len == 0 {` in
/// `engine/direct.rs`'s `open_direct` (round 14 N5: without it, a route
/// of length 0 was opened, or NOT_FOUND).
#[test]
fn a_route_of_length_zero_is_an_invalid_argument() {
    let p = Pair::new(Access::READ_WRITE);
    for (peer, addr) in [(p.peer, p.a.addr()), (p.peer, 0x1000), (p.peer + 1000, p.a.addr())] {
        let opened = p.req.open_direct(peer, addr, 0, Transport::Auto, Some(T));
        let e = opened.err().unwrap_or_else(|| panic!("a route of length 0 to peer {peer} at 0x{addr:x} opened"));
        assert_eq!(e.status(), Status::InvalidArgument, "peer {peer} at 0x{addr:x}: {e}");
        assert_eq!(e.message(), "the route's length is 0");
    }
    let route = p.req.open_direct(p.peer, p.a.addr(), 1, Transport::Auto, Some(T)).unwrap();
    assert_eq!(route.region().id, p.rid);
    drop(route);
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
    let done = std::sync::atomic::AtomicU64::new(0);
    let (req, a) = (&p.req, p.a.addr());
    let flushes = std::thread::scope(|s| {
        let flusher = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                req.flush_nvlink_cache(Some(T)).unwrap();
                n += 1;
                // Three more copies before the next flush: the one a flush
                // may have overlapped, one that opens the import again,
                // and one that finds it held (else a flusher that always
                // wins the race leaves no copy to go through a held import).
                let seen = done.load(std::sync::atomic::Ordering::Acquire);
                while done.load(std::sync::atomic::Ordering::Acquire) < seen + 3
                    && !stop.load(std::sync::atomic::Ordering::Relaxed)
                {
                    std::thread::yield_now();
                }
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
            done.fetch_add(1, std::sync::atomic::Ordering::Release);
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

/// A route to a region covering half of its allocation: the import its
/// copies hold maps the whole allocation, so a copy past the route's
/// region would reach bytes the peer never published (the held import
/// asks no source). A READ and a WRITE running past the region's end, and
/// a READ wholly beyond it, are refused OUT_OF_RANGE with no remote
/// effect, nothing moved either way; copies inside it still go through
/// the held import. Guards the `contains` check of `direct_outcome`
/// (`engine/direct.rs`): without it the three copies move through the
/// held import and end OK.
#[test]
fn a_direct_copy_past_the_routes_region_is_refused_though_its_import_maps_it() {
    const HALF: u64 = LEN / 2;
    let mut p = Pair::publishing(Access::READ_WRITE, &[HALF], "{}");
    let route = p.req.open_direct(p.peer, p.a.addr(), HALF, Transport::Auto, None).unwrap();
    assert_eq!((route.region().id, route.region().len), (p.rid, HALF));
    // A WRITE first: the route holds the writable import, which serves
    // READs and WRITEs alike.
    p.local[..8192].iter_mut().for_each(|b| *b = 0x5A);
    let (r, e) = p.copy(&route, p.req(Op::Write, 0, 0, 4096));
    assert_eq!(r.status, Status::Ok, "{e:?}");
    let (r, e) = p.copy(&route, p.req(Op::Read, 4096, 8192, 4096));
    assert_eq!(r.status, Status::Ok, "{e:?}");
    assert!((0..4096).all(|i| p.local[4096 + i] == ((8192 + i) % 251) as u8));
    assert_eq!(p.req.stats().ipc["shm"].imports.direct_copies, 1, "the READ went through the held import");
    p.local.iter_mut().for_each(|b| *b = 0xEE);
    let past = [
        ("a READ across the region's end", p.req(Op::Read, 0, HALF - 4096, 8192)),
        ("a READ beyond the region", p.req(Op::Read, 0, HALF + 4096, 4096)),
        ("a WRITE across the region's end", p.req(Op::Write, 0, HALF - 4096, 8192)),
    ];
    for (what, q) in past {
        let (r, e) = p.copy(&route, q);
        assert_eq!((r.status, r.remote_effect), (Status::OutOfRange, RemoteEffect::None), "{what}: {e:?}");
        assert!(e.unwrap().message().contains("outside region"), "{what}");
        assert!(p.local.iter().all(|&b| b == 0xEE), "{what}: local bytes changed");
    }
    let changed = (HALF - 4096..LEN).filter(|&i| p.remote()[i as usize] != (i % 251) as u8).count();
    assert_eq!(changed, 0, "remote bytes changed at or past the region's end");
    assert_eq!(p.req.stats().ipc["shm"].imports.direct_copies, 1, "a copy past the region went through");
    p.close();
}

/// A held import whose IPC channel ended is never used again by its
/// route, though its source still lives and its board slot still grants
/// (the source keeps the export, whose close receipt the lost channel
/// took with it, published): once the link is on its new channel (it logs
/// so), the route's next READ takes the full path, which closes the old
/// import and opens a new one, with exact bytes. Guards `!imp.current()`
/// in `copy_held` (`transport/ipc/requester/held.rs`): without it the
/// READ goes through the old channel's import (counted as a direct copy,
/// no import opened).
#[test]
fn a_held_import_of_a_lost_channel_is_not_used_once_the_link_has_a_new_one() {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::{Arc, Condvar, Mutex};
    const HALF: u64 = LEN / 2;
    let up = Arc::new((Mutex::new(false), Condvar::new()));
    let seen = up.clone();
    orbite::log::set_sink(Some(Box::new(move |_, m| {
        if m.contains("shm channel re-established") {
            *seen.0.lock().unwrap() = true;
            seen.1.notify_all();
        }
    })))
    .unwrap();
    let mut p = Pair::publishing(Access::READ, &[HALF, HALF], r#"{"log_level": "info"}"#);
    let route = p.req.open_direct(p.peer, p.a.addr(), HALF, Transport::Auto, None).unwrap();
    assert_eq!(p.copy(&route, p.req(Op::Read, 0, 0, 4096)).0.status, Status::Ok);
    assert_eq!(p.copy(&route, p.req(Op::Read, 0, 4096, 4096)).0.status, Status::Ok);
    let imports = p.req.stats().ipc["shm"].imports.clone();
    assert_eq!((imports.opened, imports.direct_copies), (1, 1), "{imports:?}");
    // The first import of the other region loses its handle with the
    // channel: the link re-establishes it in the background.
    p.req.faults().lose_handle.store(1, SeqCst);
    let shm = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
    let b = p.req.submit(p.peer, &[p.req(Op::Read, 8192, HALF, 4096)], shm).unwrap();
    let _ = b.wait(T);
    assert_eq!(b.results()[0].status, Status::Unavailable, "{:?}", b.error(0));
    assert_eq!(p.req.faults().lose_handle.load(SeqCst), 0, "the handle was not lost");
    let (done, cv) = &*up;
    let (re, wait) = cv.wait_timeout_while(done.lock().unwrap(), T, |up| !*up).unwrap();
    assert!(*re && !wait.timed_out(), "the channel was not re-established");
    drop(re);
    p.local[..4096].iter_mut().for_each(|b| *b = 0xEE);
    let (r, e) = p.copy(&route, p.req(Op::Read, 0, 300, 4096));
    assert_eq!((r.status, r.remote_effect), (Status::Ok, RemoteEffect::None), "{e:?}");
    assert!((0..4096).all(|i| p.local[i] == ((300 + i) % 251) as u8), "the READ's bytes");
    let imports = p.req.stats().ipc["shm"].imports.clone();
    assert_eq!(imports.direct_copies, 1, "the READ went through the lost channel's import: {imports:?}");
    assert_eq!(imports.opened, 2, "{imports:?}");
    orbite::log::set_sink(None).unwrap();
    p.close();
}

/// A route holding its region's import (no flush) while the peer
/// unregisters the region and registers the same memory again, under a
/// new epoch: the old route's next READ moves nothing and fails with the
/// peer's typed refusal of the old epoch (the unregistration revoked the
/// grant, and the requester gave the withdrawn import back, so nothing is
/// left to copy through); a new route reaches the region again. The
/// held import's own epoch test in `held()` cannot be reached (see its
/// comment): this is what a re-registration meets instead.
#[test]
fn a_route_held_across_a_re_registration_copies_nothing_through_the_old_import() {
    let mut p = Pair::new(Access::READ_WRITE);
    let route = p.route().unwrap();
    assert_eq!(p.copy(&route, p.req(Op::Read, 0, 0, 4096)).0.status, Status::Ok);
    assert_eq!(p.copy(&route, p.req(Op::Read, 0, 4096, 4096)).0.status, Status::Ok);
    assert_eq!(p.req.stats().ipc["shm"].imports.direct_copies, 1, "the route holds its import");
    p.src.unregister_memory(p.rid, Some(T)).unwrap();
    let again = p.src.register_memory(p.a.addr(), LEN, Access::READ_WRITE).unwrap();
    assert_ne!(again, p.rid);
    p.local[..4096].iter_mut().for_each(|b| *b = 0xEE);
    let (r, e) = p.copy(&route, p.req(Op::Read, 0, 0, 4096));
    assert_eq!((r.status, r.remote_effect), (Status::StalePeer, RemoteEffect::None), "{e:?}");
    assert!(p.local[..4096].iter().all(|&b| b == 0xEE), "bytes moved through the old route");
    assert_eq!(p.req.stats().ipc["shm"].imports.direct_copies, 1, "a copy went through the old import");
    p.rid = again;
    let fresh = p.route().unwrap();
    let (r, e) = p.copy(&fresh, p.req(Op::Read, 0, 100, 4096));
    assert_eq!(r.status, Status::Ok, "{e:?}");
    assert!((0..4096).all(|i| p.local[i] == ((100 + i) % 251) as u8));
    p.close();
}
