//! CMA between real processes: plain host memory a source registered (its
//! heap, or mappings of its own) READ and WRITTEN by this process with
//! cross-memory attach, chosen by AUTO; the source taking its memory away
//! (unmapped without unregistering, or unregistered) while a grant is
//! cached; another user, and another PID namespace, refused and moved over
//! TCP.

mod common;

use common::*;
use orbite::*;
use std::time::Instant;

const MIB: u64 = 1 << 20;

fn engine(json: &str) -> Engine {
    Engine::from_json(json).expect("engine")
}

fn local(e: &Engine, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    e.register_memory(v.as_mut_ptr() as u64, len as u64, Access::NONE).unwrap();
    v
}

fn rd(local: &[u8], loff: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Read, local_addr: local.as_ptr() as u64 + loff, remote_addr: remote, len }
}

fn wr(local: &[u8], loff: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Write, local_addr: local.as_ptr() as u64 + loff, remote_addr: remote, len }
}

fn only(k: TransportKind) -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(k), timeout: Some(LONG) }
}

fn auto() -> SubmitOptions {
    SubmitOptions { transport: Transport::Auto, timeout: Some(LONG) }
}

/// Submits, waits, and returns the batch (ended).
fn go(e: &Engine, peer: u64, reqs: &[Request], opts: SubmitOptions) -> Batch {
    let b = e.submit(peer, reqs, opts).unwrap();
    let _ = b.wait(LONG);
    assert_ne!(b.poll(), Status::Pending);
    b
}

fn all_ok(b: &Batch) -> bool {
    b.results().iter().all(|x| x.status == Status::Ok)
}

fn carried_by(b: &Batch, n: usize) -> Vec<Option<TransportKind>> {
    (0..n).map(|i| b.transport(i).unwrap()).collect()
}

/// Guards the CMA path end to end: AUTO picks it for a peer's plain heap
/// memory (no test of this file passes over TCP: the stats say CMA);
/// scattered and contiguous READs land the source's exact bytes, WRITEs
/// land exactly (checked by the source), a large READ spreads over the copy
/// pool, later submissions go through the cached grant without a round
/// trip, and a forced CMA onto library shared memory is NOT_SUPPORTED.
#[test]
fn reads_and_writes_of_heap_memory_move_over_cma_exactly() {
    let mut src = PeerProc::spawn(&["--size", &(8 * MIB).to_string(), "--seed", "3"]);
    let shared = PeerProc::spawn(&["--shared", "--size", &(2 * MIB).to_string()]);
    let e = engine("");
    let mut l = local(&e, 8 * MIB as usize);
    let p = e.connect(&src.endpoint, None).unwrap();
    assert!(e.peer_transports(p).unwrap().contains(&TransportKind::Cma));
    // Contiguous: 1 MiB at the start.
    let b = go(&e, p, &[rd(&l, 0, src.addr, MIB)], auto());
    assert!(all_ok(&b), "{:?}", b.error(0));
    assert_eq!(carried_by(&b, 1), [Some(TransportKind::Cma)]);
    assert!((0..MIB as usize).all(|i| l[i] == pattern(3, i as u64)));
    // Scattered: 16 blocks of 4 KiB from shuffled places into other ones.
    let blocks: Vec<(u64, u64)> = (0..16u64).map(|k| ((k * 7 % 16) * 4096 + 3 * MIB, (k * 5 % 16) * 8192)).collect();
    let reqs: Vec<Request> = blocks.iter().map(|&(r, lo)| rd(&l, 2 * MIB + lo, src.addr + r, 4096)).collect();
    let b = go(&e, p, &reqs, auto());
    assert!(all_ok(&b));
    assert_eq!(carried_by(&b, 16), vec![Some(TransportKind::Cma); 16]);
    for &(r, lo) in &blocks {
        let at = (2 * MIB + lo) as usize;
        assert!((0..4096).all(|i| l[at + i] == pattern(3, r + i as u64)), "block at remote {r}");
    }
    // WRITEs: local block k (pattern 20+k) to remote block 7-k, then a
    // contiguous MiB of pattern 9.
    for k in 0..8usize {
        l[k * 4096..(k + 1) * 4096].copy_from_slice(&pattern_vec(20 + k as u64, 4096));
    }
    let reqs: Vec<Request> = (0..8u64).map(|k| wr(&l, k * 4096, src.addr + (7 - k) * 4096, 4096)).collect();
    let b = go(&e, p, &reqs, auto());
    assert!(b
        .results()
        .iter()
        .all(|r| *r == RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied }));
    for k in 0..8u64 {
        assert_eq!(src.cmd(&format!("verify {} {} 4096", 20 + k, (7 - k) * 4096)), "ok", "block {k}");
    }
    l.copy_from_slice(&pattern_vec(9, 8 * MIB as usize));
    let b = go(&e, p, &[wr(&l, 0, src.addr + MIB, MIB)], auto());
    assert!(all_ok(&b));
    assert_eq!(src.cmd(&format!("verify 9 {MIB} {MIB}")), "ok");
    // Large: one 6 MiB READ (the copy pool takes part).
    l.fill(0);
    let b = go(&e, p, &[rd(&l, 0, src.addr + 2 * MIB, 6 * MIB)], auto());
    assert!(all_ok(&b));
    assert!((0..6 * MIB as usize).all(|i| l[i] == pattern(3, 2 * MIB + i as u64)));
    let st = e.stats();
    assert_eq!(st.transports["cma"].requests_completed, 1 + 16 + 8 + 1 + 1);
    assert_eq!(st.transports["tcp"].requests_completed, 0);
    let ipc = &st.ipc["cma"];
    // One READ-only import, then the writable one that replaced it; later
    // submissions through the cache's board.
    assert_eq!(ipc.imports.opened, 2);
    assert!(ipc.imports.groups_without_round_trip >= 2, "{ipc:?}");
    assert_eq!(ipc.mapping_bytes_charged, 0, "cma maps nothing");
    // Forced CMA onto a peer's library shared memory: refused, nothing sent.
    let sp = e.connect(&shared.endpoint, None).unwrap();
    let err = e.submit(sp, &[rd(&l, 0, shared.addr, 4096)], only(TransportKind::Cma)).err().unwrap();
    assert_eq!(err.status(), Status::NotSupported, "{err}");
    assert!(err.message().contains("cma moves host memory"), "{err}");
    e.close(Some(LONG)).unwrap();
    src.close();
    shared.close();
}

/// Guards direct routes over CMA (`open_direct`'s candidates, `held`'s
/// CPU transports): AUTO opens the route to a peer's heap region over CMA,
/// each copy lands exactly on the caller's thread, and after the first
/// (which opens the import) they go through the held import.
#[test]
fn a_direct_route_reaches_heap_memory_over_cma() {
    let mut src = PeerProc::spawn(&["--size", &MIB.to_string(), "--seed", "7"]);
    let e = engine("");
    let mut l = local(&e, 8192);
    let p = e.connect(&src.endpoint, None).unwrap();
    let route = e.open_direct(p, src.addr, MIB, Transport::Auto, Some(LONG)).unwrap();
    assert_eq!(route.transport(), TransportKind::Cma);
    for k in 0..4u64 {
        let (r, why) = e.copy_direct(&route, &rd(&l, 0, src.addr + k * 4096, 4096), Some(LONG)).unwrap();
        assert_eq!(r.status, Status::Ok, "{why:?}");
        assert!((0..4096).all(|i| l[i] == pattern(7, k * 4096 + i as u64)), "copy {k}");
    }
    l[4096..].copy_from_slice(&pattern_vec(12, 4096));
    let (r, _) = e.copy_direct(&route, &wr(&l, 4096, src.addr + 8192, 4096), Some(LONG)).unwrap();
    assert_eq!(r, RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied });
    assert_eq!(src.cmd("verify 12 8192 4096"), "ok");
    assert!(e.stats().ipc["cma"].imports.direct_copies >= 3, "{:?}", e.stats().ipc["cma"]);
    e.close(Some(LONG)).unwrap();
    src.close();
}

/// Guards the failure of a copy into memory the source took away: after a
/// READ cached the grant, the source unmaps half its buffer without
/// unregistering; a READ over it fails IO_ERROR naming the range (effect
/// NONE), a WRITE into it fails (effect UNKNOWN, as any failed WRITE of an
/// IPC group), the mapped half still moves exactly, and the source lives
/// on (it answers). Then an unregistration revokes the cached grant at
/// once: requests are refused without touching the memory, and the
/// unregistration ends once the import is given back.
#[test]
fn memory_the_source_takes_away_fails_requests_exactly() {
    let mut src = PeerProc::spawn(&["--mmap", "--size", &(4 * MIB).to_string(), "--seed", "5"]);
    let e = engine("");
    let l = local(&e, 4 * MIB as usize);
    let p = e.connect(&src.endpoint, None).unwrap();
    let b = go(&e, p, &[rd(&l, 0, src.addr, 4 * MIB)], auto());
    assert!(all_ok(&b));
    assert_eq!(carried_by(&b, 1), [Some(TransportKind::Cma)]);
    // READs of the whole buffer go on while the source unmaps its second
    // half: each ends OK with the source's exact bytes, or IO_ERROR; once
    // the unmap returned, every one fails.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let (base, unmapped, after_done) = (src.addr, AtomicBool::new(false), AtomicUsize::new(0));
    let outcomes = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut seen = Vec::new();
            let l3 = local(&e, 4 * MIB as usize);
            // Until a READ begun after the unmap returned has ended.
            while after_done.load(SeqCst) == 0 {
                let after = unmapped.load(SeqCst);
                let st = go(&e, p, &[rd(&l3, 0, base, 4 * MIB)], auto()).results()[0].status;
                let exact = st == Status::Ok && (0..4 * MIB as usize).all(|i| l3[i] == pattern(5, i as u64));
                seen.push((after, st, exact));
                after_done.fetch_add(after as usize, SeqCst);
            }
            seen
        });
        assert_eq!(src.cmd(&format!("unmap {} {}", 2 * MIB, 2 * MIB)), "ok");
        unmapped.store(true, SeqCst);
        reader.join().unwrap()
    });
    assert!(outcomes.iter().all(|&(_, st, exact)| exact || st == Status::IoError), "{outcomes:?}");
    assert!(outcomes.iter().filter(|o| o.0).all(|&(_, st, _)| st == Status::IoError), "{outcomes:?}");
    assert!(outcomes.iter().any(|o| o.0), "{outcomes:?}");
    let b = go(&e, p, &[rd(&l, 0, src.addr + MIB, 2 * MIB)], auto());
    let r = b.results()[0];
    assert_eq!(r, RequestResult { status: Status::IoError, remote_effect: RemoteEffect::None });
    let why = b.error(0).unwrap();
    assert!(why.message().contains(&format!("at the source's 0x{:x} ", src.addr + 2 * MIB)), "{why}");
    assert!(why.message().contains("not mapped"), "{why}");
    let b = go(&e, p, &[wr(&l, 0, src.addr + 3 * MIB, 4096)], auto());
    assert_eq!(b.results()[0].status, Status::IoError);
    assert_eq!(b.results()[0].remote_effect, RemoteEffect::Unknown);
    let mut l2 = local(&e, 2 * MIB as usize);
    let b = go(&e, p, &[rd(&l2, 0, src.addr, 2 * MIB)], auto());
    assert!(all_ok(&b), "{:?}", b.error(0));
    assert!((0..2 * MIB as usize).all(|i| l2[i] == pattern(5, i as u64)));
    assert!(src.stats()["regions"].as_u64().unwrap() >= 1, "the source lives on");
    assert_eq!(e.stats().transports["tcp"].requests_completed, 0);
    // Unregistered while the grant is cached: the unregistration revokes
    // the grant at once (requests are refused and write nothing) and waits
    // for the import, which this requester then gives back.
    src.send("unregister 60000");
    let until = Instant::now() + LONG;
    let refused = loop {
        l2.fill(0);
        let st = go(&e, p, &[rd(&l2, 0, src.addr, 4096)], auto()).results()[0].status;
        if st != Status::Ok {
            break st;
        }
        assert!(Instant::now() < until, "the unregistration never revoked the grant");
    };
    assert!(matches!(refused, Status::Unavailable | Status::NotFound), "{refused:?}");
    assert!(l2.iter().all(|&x| x == 0), "a refused READ wrote");
    e.flush_nvlink_cache(Some(LONG)).unwrap();
    assert_eq!(src.reply(), "ok");
    let b = go(&e, p, &[rd(&l2, 0, src.addr, 4096)], auto());
    assert_eq!(b.results()[0].status, Status::NotFound, "{:?}", b.error(0));
    e.close(Some(LONG)).unwrap();
    src.close();
}

/// Guards the same-user rule: a source running as another user (nobody),
/// whose IPC channel this user may open (`ipc_allowed_uids`), is never
/// reached with CMA although the kernel would let root do it: AUTO moves
/// its heap memory over TCP, the stats' notes and the transports say why,
/// and the source itself refuses a CMA channel from this user.
#[test]
fn another_user_is_refused_and_its_memory_moves_over_tcp() {
    let cfg = r#"{"ipc_allowed_uids": [0]}"#;
    let src = PeerProc::spawn(&["--setuid", "65534", "--size", &MIB.to_string(), "--seed", "4", "--config", cfg]);
    let e = engine(r#"{"ipc_allowed_uids": [65534]}"#);
    let l = local(&e, MIB as usize);
    let p = e.connect(&src.endpoint, None).unwrap();
    let b = go(&e, p, &[rd(&l, 0, src.addr, MIB)], auto());
    assert!(all_ok(&b), "{:?}", b.error(0));
    assert_eq!(carried_by(&b, 1), [Some(TransportKind::Tcp)]);
    assert!((0..MIB as usize).all(|i| l[i] == pattern(4, i as u64)));
    assert!(!e.peer_transports(p).unwrap().contains(&TransportKind::Cma));
    let notes = e.stats().notes;
    assert!(notes.iter().any(|n| n.contains("cma cannot be used") && n.contains("user 65534")), "{notes:?}");
    let err = e.submit(p, &[rd(&l, 0, src.addr, 4096)], only(TransportKind::Cma)).err().unwrap();
    assert_eq!(err.status(), Status::Unavailable, "{err}");
    assert!(err.message().contains("never crosses users"), "{err}");
    // The source's side: a CMA channel from this user is refused.
    let (_ch, kind, body) =
        ipc_hello(&src.endpoint, TransportKind::Cma, orbite::control::Identity::fresh().unwrap(), None);
    assert_eq!(kind, orbite::control::frame::MsgKind::ExportReject);
    let (_, why) = orbite::transport::ipc::messages::decode_reject(&body).unwrap();
    assert_eq!(why.status(), Status::PermissionDenied, "{why}");
    e.close(Some(LONG)).unwrap();
}

/// Guards the PID-namespace rule for heap memory: a source in a PID
/// namespace of its own (a container beside this one; its pid there names
/// another process here) is never reached with CMA; AUTO moves its memory
/// over TCP and says why (engine/peers.rs `Inner::ipc_links`).
#[test]
fn a_source_in_another_pid_namespace_moves_over_tcp() {
    let src = PeerProc::spawn_in_pid_namespace(&["--size", "65536", "--seed", "6"]);
    let e = engine("");
    let l = local(&e, 65536);
    let p = e.connect(&src.endpoint, None).unwrap();
    let b = go(&e, p, &[rd(&l, 0, src.addr, 65536)], auto());
    assert!(all_ok(&b), "{:?}", b.error(0));
    assert_eq!(carried_by(&b, 1), [Some(TransportKind::Tcp)]);
    assert!((0..65536).all(|i| l[i] == pattern(6, i as u64)));
    let notes = e.stats().notes;
    assert!(notes.iter().any(|n| n.contains("another PID namespace")), "{notes:?}");
    assert_eq!(e.peer_transports(p).unwrap(), vec![TransportKind::Tcp]);
    e.close(Some(LONG)).unwrap();
}
