//! Seed rows of the cooperative IPC protocol (docs/seed-traceability.md),
//! on CPU: the protocol is written once (`transport/ipc`) and SHM runs it
//! here, so a test of its requester, source and submission logic is a test
//! of the code NVLink and MNNVL run. Each test is written so that deleting
//! the line it guards (named in its comment and in the traceability
//! document) turns it red. Sources are real `orbite-peer` processes on
//! loopback, or, where the requester's own checks are the subject, a
//! hostile source that lies (`tests/hostile_source`).

mod common;
mod hostile_source;

use common::{pattern, PeerProc, LONG};
use hostile_source::{Answer, Hostile, Script, EPOCH, LEN};
use orbite::control::frame::MsgKind;
use orbite::control::Identity;
use orbite::transport::ipc::messages::{decode_reject, ExportOffer, ExportRequest, OP_READ, OP_WRITE};
use orbite::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn only(t: TransportKind) -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(t), timeout: Some(LONG) }
}

fn rd(local: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Read, local_addr: local, remote_addr: remote, len }
}

fn wr(local: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Write, local_addr: local, remote_addr: remote, len }
}

fn res(status: Status, remote_effect: RemoteEffect) -> RequestResult {
    RequestResult { status, remote_effect }
}

/// Submits and waits; the per-request results.
fn go(e: &Engine, peer: u64, reqs: &[Request], opts: SubmitOptions) -> Vec<RequestResult> {
    let b = e.submit(peer, reqs, opts).unwrap();
    let _ = b.wait(LONG);
    b.results()
}

/// The seed's rows are of the uncached protocol: an import per subbatch,
/// closed with its receipt (the relocation cache is on by default).
const UNCACHED: &str = r#"{"shm_cache_entries": 0}"#;

/// A requester engine with `len` bytes of registered local memory (filled
/// with `fill`), connected to `endpoint`.
struct Local {
    e: Engine,
    peer: u64,
    mem: Allocation,
}

impl Local {
    fn new(config: &str, endpoint: &str, len: u64, fill: u8) -> Local {
        let e = Engine::from_json(config).unwrap();
        let mem = allocate_shared_host(len).unwrap();
        // SAFETY: a shared allocation maps `len` writable bytes.
        unsafe { std::ptr::write_bytes(mem.addr() as *mut u8, fill, len as usize) };
        e.register_memory(mem.addr(), len, Access::NONE).unwrap();
        let peer = e.connect(endpoint, None).unwrap();
        Local { e, peer, mem }
    }

    fn at(&self, off: u64) -> u64 {
        self.mem.addr() + off
    }

    fn bytes(&self, off: u64, len: u64) -> &[u8] {
        // SAFETY: the allocation maps at least off+len bytes (callers stay
        // inside) and lives as long as self.
        unsafe { std::slice::from_raw_parts((self.mem.addr() + off) as *const u8, len as usize) }
    }

    fn shm(&self) -> orbite::engine::stats::IpcStats {
        self.e.stats().ipc["shm"].clone()
    }
}

/// An `orbite-peer` SHM source: `allocs` shared allocations of `size`
/// bytes, pattern 1, 2, ...
fn shm_source(size: u64, allocs: usize) -> PeerProc {
    PeerProc::spawn(&["--shared", "--size", &size.to_string(), "--allocs", &allocs.to_string()])
}

fn src_shm(p: &mut PeerProc, key: &str) -> u64 {
    p.stats()["ipc"]["shm"][key].as_u64().unwrap()
}

// ---------------------------------------------------------------------------
// X2: the requester validates the grant (operation, range, both epochs, a
// fresh token) and the handle; guards `transport/ipc/requester/mod.rs` `open`'s
// `valid` (one clause per case) and its `ExportHandle names another export`.

const HOSTILE_FILL: fn(u64) -> u8 = |i| pattern(5, i);

/// Reads 4 KiB at offset 8 KiB of the hostile source's region.
fn read_from(h: &Hostile) -> (Local, Vec<RequestResult>) {
    let l = Local::new(UNCACHED, &h.endpoint, 64 * KIB, 0xee);
    let out = go(&l.e, l.peer, &[rd(l.at(0), h.addr + 8 * KIB, 4 * KIB)], only(TransportKind::Shm));
    (l, out)
}

#[test]
fn x2_the_requester_refuses_every_bad_grant_and_declines_it() {
    type Edit = fn(&mut ExportOffer, &ExportRequest);
    let cases: [(&str, Edit); 8] = [
        ("another operation", |o, _| o.ops = OP_WRITE),
        ("a range starting after the request", |o, r| o.grant_addr = r.addr + 1),
        ("a range ending before the request's end", |o, r| o.grant_len = r.len - 1),
        ("a range beyond the physical extent", |o, _| o.grant_len = o.base + o.physical - o.grant_addr + 4096),
        ("a base after the granted range", |o, r| o.base = r.addr + 4096),
        ("another region epoch", |o, _| o.region_epoch = EPOCH + 1),
        ("a zero token", |o, _| o.token = 0),
        ("another request's tag", |o, _| o.tag += 1),
    ];
    for (what, edit) in cases {
        let h = Hostile::start(Script::answering(Answer::Offer(edit)), HOSTILE_FILL);
        let (l, out) = read_from(&h);
        assert_eq!(out, vec![res(Status::ProtocolError, RemoteEffect::None)], "{what}");
        assert_eq!(h.requests().len(), 1, "{what}: one export request, no retry");
        let offered = 101;
        assert_eq!(h.answers(), vec![(offered, false)], "{what}: the offer must be declined, never accepted");
        assert!(l.bytes(0, 4 * KIB).iter().all(|b| *b == 0xee), "{what}: bytes moved");
        assert_eq!(l.shm().imports.opened, 0, "{what}");
    }
    // A good offer, then the handle of another export: refused after the accept.
    let h = Hostile::start(Script::answering(Answer::WrongHandle), HOSTILE_FILL);
    let (l, out) = read_from(&h);
    assert_eq!(out, vec![res(Status::ProtocolError, RemoteEffect::None)]);
    assert_eq!(h.answers(), vec![(101, true)]);
    assert!(l.bytes(0, 4 * KIB).iter().all(|b| *b == 0xee));
    assert_eq!(l.shm().imports.opened, 0);
    // The honest source is served (the harness itself is not what refuses).
    let h = Hostile::start(Script::honest(), HOSTILE_FILL);
    let (l, out) = read_from(&h);
    assert_eq!(out, vec![res(Status::Ok, RemoteEffect::None)]);
    assert_eq!(h.answers(), vec![(101, true)]);
    assert!(l.bytes(0, 4 * KIB).iter().enumerate().all(|(i, b)| *b == pattern(5, 8 * KIB + i as u64)));
    assert_eq!(h.frames(MsgKind::CloseReceipt).len(), 1);
}

/// The hostile source's bytes at `off` (its region is this process's memory).
fn source_bytes(h: &Hostile, off: u64, len: u64) -> &[u8] {
    // SAFETY: the hostile source keeps its LEN-byte region mapped for the
    // process's life; callers stay inside it.
    unsafe { std::slice::from_raw_parts((h.addr + off) as *const u8, len as usize) }
}

/// One submission of a READ (to local 0) and a WRITE (from local 16 KiB to
/// the source's `write_at`) of 4 KiB, in one region: one group needing
/// READ and WRITE.
fn read_and_write(l: &Local, h: &Hostile, write_at: u64) -> Vec<RequestResult> {
    let reqs = [rd(l.at(0), h.addr + 8 * KIB, 4 * KIB), wr(l.at(16 * KIB), h.addr + write_at, 4 * KIB)];
    go(&l.e, l.peer, &reqs, only(TransportKind::Shm))
}

/// `read_and_write` on the cached import (its local READ range filled
/// with 0xee), against a source that refuses revalidation: one
/// revalidation, both requests `PERMISSION_DENIED`, no byte moved either
/// way, still the one import.
fn a_mixed_group_is_revalidated_and_refused(l: &Local, h: &Hostile) {
    let out = read_and_write(l, h, 128 * KIB);
    let refused = res(Status::PermissionDenied, RemoteEffect::None);
    assert_eq!(out, vec![refused, refused]);
    assert_eq!(h.frames(MsgKind::Revalidate).len(), 1, "one revalidation");
    assert!(l.bytes(0, 4 * KIB).iter().all(|b| *b == 0xee), "the refused READ landed");
    let kept = source_bytes(h, 128 * KIB, 4 * KIB);
    assert!(kept.iter().enumerate().all(|(i, b)| *b == pattern(5, 128 * KIB + i as u64)), "the refused WRITE landed");
    assert_eq!(l.shm().imports.opened, 1);
}

/// A source offering READ for a group that asked READ and WRITE: the
/// offer is declined and both requests fail PROTOCOL_ERROR, no byte moved
/// either way (before the check asked only for some operation in common,
/// the requester mapped a READ grant read-only and wrote into it). Guards
/// `transport/ipc/proto/requester.rs` `o.ops & r.ops == r.ops`.
#[test]
fn x2_an_offer_granting_read_to_a_read_and_write_group_is_declined() {
    let h = Hostile::start(Script::answering(Answer::Offer(|o, _| o.ops = OP_READ)), HOSTILE_FILL);
    let l = Local::new(UNCACHED, &h.endpoint, 64 * KIB, 0xee);
    let out = read_and_write(&l, &h, 64 * KIB);
    let refused = res(Status::ProtocolError, RemoteEffect::None);
    assert_eq!(out, vec![refused, refused]);
    assert_eq!(h.requests().iter().map(|r| r.ops).collect::<Vec<_>>(), vec![OP_READ | OP_WRITE]);
    assert_eq!(h.answers(), vec![(101, false)], "the offer must be declined, never accepted");
    assert!(l.bytes(0, 4 * KIB).iter().all(|b| *b == 0xee), "the READ landed");
    assert!(source_bytes(&h, 64 * KIB, 4 * KIB).iter().enumerate().all(|(i, b)| *b == pattern(5, 64 * KIB + i as u64)));
    assert_eq!(l.shm().imports.opened, 0);
}

/// A source whose board slot for a READ|WRITE grant says READ only (it
/// withdrew WRITE) and that refuses revalidation: a cached import's next
/// group needing READ and WRITE does not enter the slot; it revalidates
/// and both requests fail with the source's PERMISSION_DENIED, the WRITE's
/// bytes not landed, the READ's not copied. Guards
/// `transport/ipc/board.rs` `enter`'s `w.ops() & need == need`.
#[test]
fn x2_a_board_slot_allowing_only_some_of_a_groups_operations_is_not_entered() {
    let script = Script {
        board: Some(|granted| granted & OP_READ),
        revalidate: Some(Status::PermissionDenied),
        ..Script::honest()
    };
    let h = Hostile::start(script, HOSTILE_FILL);
    let l = Local::new("", &h.endpoint, 64 * KIB, 0xee);
    // The first group is served on its fresh offer (no slot needed).
    assert_eq!(
        read_and_write(&l, &h, 64 * KIB),
        vec![res(Status::Ok, RemoteEffect::None), res(Status::Ok, RemoteEffect::Applied)]
    );
    assert!(source_bytes(&h, 64 * KIB, 4 * KIB).iter().all(|b| *b == 0xee), "the first WRITE's bytes");
    assert!(h.frames(MsgKind::Revalidate).is_empty());
    // The next one, on the cached import whose slot allows READ alone.
    // SAFETY: the allocation maps 64 KiB, none of it in use now.
    unsafe { std::ptr::write_bytes(l.at(0) as *mut u8, 0xee, 4 * KIB as usize) };
    a_mixed_group_is_revalidated_and_refused(&l, &h);
}

/// A source publishing its region WRITE-only, whose board slot for the
/// WRITE grant claims READ too, and that refuses revalidation: the cached
/// import's next group, needing READ and WRITE, does not enter the slot
/// on the board's word (its grant did not name READ); it revalidates and
/// both requests fail with the source's PERMISSION_DENIED, the READ's
/// bytes not copied, the WRITE's not landed. (The cache keys every
/// READ-only import apart, so a group needing more than its import's
/// grant is always a mixed one like this.) Guards
/// `transport/ipc/requester/mod.rs` `Import::enter`'s `ops &
/// !self.offer.ops != 0` (all of the group's operations in the grant, not
/// one).
#[test]
fn x2_a_board_slot_wider_than_its_grant_is_not_entered_for_a_mixed_group() {
    let script = Script {
        access: Access::WRITE,
        board: Some(|granted| granted | OP_READ),
        revalidate: Some(Status::PermissionDenied),
        ..Script::honest()
    };
    let h = Hostile::start(script, HOSTILE_FILL);
    let l = Local::new("", &h.endpoint, 64 * KIB, 0xee);
    // A WRITE alone: an import for WRITE (all the region allows), served
    // on its fresh offer.
    let w = [wr(l.at(16 * KIB), h.addr + 64 * KIB, 4 * KIB)];
    assert_eq!(go(&l.e, l.peer, &w, only(TransportKind::Shm)), vec![res(Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(h.requests().iter().map(|r| r.ops).collect::<Vec<_>>(), vec![OP_WRITE]);
    assert!(source_bytes(&h, 64 * KIB, 4 * KIB).iter().all(|b| *b == 0xee), "the first WRITE's bytes");
    // A READ and a WRITE in one group, on the cached WRITE import whose
    // slot claims READ and WRITE.
    a_mixed_group_is_revalidated_and_refused(&l, &h);
}

/// A source whose grant board is sealed against growing only, which it
/// shrinks to nothing once the requester has it and names in its offer:
/// the requester never maps it (a board it mapped would fault its next
/// access: SIGBUS, the requester process gone), so each use of its cached
/// import revalidates, and every READ lands. Guards
/// `memory/owners.rs` `is_sealed_memfd`'s `have & seals == seals`.
#[test]
fn x2_a_board_sealed_against_growing_only_is_never_used() {
    let h = Hostile::start(Script { shrinkable_board: true, ..Script::honest() }, HOSTILE_FILL);
    let l = Local::new("", &h.endpoint, 64 * KIB, 0xee);
    for _ in 0..2 {
        let (lo, remote) = (l.at(0), h.addr + 8 * KIB);
        assert_eq!(
            go(&l.e, l.peer, &[rd(lo, remote, 4 * KIB)], only(TransportKind::Shm)),
            vec![res(Status::Ok, RemoteEffect::None)]
        );
        assert!(l.bytes(0, 4 * KIB).iter().enumerate().all(|(i, b)| *b == pattern(5, 8 * KIB + i as u64)));
    }
    assert_eq!(h.frames(MsgKind::Revalidate).len(), 1, "the cached import's use was revalidated");
    assert_eq!(l.shm().imports.opened, 1);
}

// ---------------------------------------------------------------------------
// X8: identities and epochs detect stale peers, on both sides.

/// The source checks the engine epoch a requester's IpcHello expects.
/// Guards `transport/ipc/source.rs` `serve_inner`'s
/// `hello.expected_source_epoch != ctx.identity.engine_epoch`.
#[test]
fn x8_the_source_refuses_a_hello_for_another_engine_epoch() {
    let src = shm_source(MIB, 1);
    let real = common::describe_of(&src.endpoint).identity.engine_epoch;
    let (_, kind, body) =
        common::ipc_hello(&src.endpoint, TransportKind::Shm, Identity::fresh().unwrap(), Some(real ^ 1));
    assert_eq!(kind, MsgKind::ExportReject);
    let e = decode_reject(&body).unwrap().1;
    assert_eq!(e.status(), Status::StalePeer, "{e}");
    assert!(e.message().contains("expects source epoch"), "{e}");
    let (_, kind, _) = common::ipc_hello(&src.endpoint, TransportKind::Shm, Identity::fresh().unwrap(), Some(real));
    assert_eq!(kind, MsgKind::IpcWelcome, "the current epoch is welcome");
}

/// The requester checks that the IPC channel's Welcome names the engine its
/// Describe named. Guards `transport/ipc/link.rs` `connect`'s
/// `w.identity != self.source`.
#[test]
fn x8_the_requester_refuses_a_channel_of_another_engine() {
    let script = Script { welcome: |i| i.engine_epoch ^= 1, ..Script::honest() };
    let h = Hostile::start(script, HOSTILE_FILL);
    let (l, out) = read_from(&h);
    assert_eq!(out, vec![res(Status::StalePeer, RemoteEffect::None)]);
    assert!(h.requests().is_empty(), "nothing may be asked of another engine");
    assert!(l.e.peer_transports(l.peer).unwrap().iter().all(|t| *t != TransportKind::Shm), "the link is dead");
}

/// The Welcome's whole identity must be the Describe's, not its engine
/// epoch alone: one naming the same epoch with another process start time
/// or another boot is another engine's channel. Guards
/// `transport/ipc/link.rs` `connect`'s `w.identity != self.source`
/// (compared by epoch only, both are taken and the READ lands).
#[test]
fn x8_the_requester_refuses_a_welcome_of_the_same_epoch_from_another_process() {
    let edits: [fn(&mut Identity); 2] = [|i| i.process.start_time ^= 1, |i| i.boot_id[0] ^= 0xff];
    for welcome in edits {
        let h = Hostile::start(Script { welcome, ..Script::honest() }, HOSTILE_FILL);
        let (l, out) = read_from(&h);
        assert_eq!(out, vec![res(Status::StalePeer, RemoteEffect::None)]);
        assert!(h.requests().is_empty(), "nothing may be asked of another engine");
        assert!(l.e.peer_transports(l.peer).unwrap().iter().all(|t| *t != TransportKind::Shm), "the link is dead");
    }
}

// ---------------------------------------------------------------------------
// S2: IPC transports need the same boot; both sides check it.

/// Guards `engine/peers.rs` `ipc_links`' `!ipc::same_boot(...)`.
#[test]
fn s2_the_requester_refuses_shm_to_a_peer_of_another_boot() {
    let script = Script { describe: |i| i.boot_id[0] ^= 0xff, ..Script::honest() };
    let h = Hostile::start(script, HOSTILE_FILL);
    let l = Local::new(UNCACHED, &h.endpoint, 64 * KIB, 0xee);
    assert_eq!(l.e.peer_transports(l.peer).unwrap(), vec![TransportKind::Tcp]);
    let e = l.e.submit(l.peer, &[rd(l.at(0), h.addr, 16)], only(TransportKind::Shm)).err().expect("another boot");
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().contains("another host or boot"), "{e}");
    assert!(h.seen.lock().unwrap().is_empty(), "no IPC channel was opened");
}

/// Guards `transport/ipc/source.rs` `serve_inner`'s `same_boot` check (the
/// pid and start time are honest, only the boot differs).
#[test]
fn s2_the_source_refuses_a_requester_of_another_boot() {
    let src = shm_source(MIB, 1);
    let mut me = Identity::fresh().unwrap();
    me.boot_id[0] ^= 0xff;
    let (_, kind, body) = common::ipc_hello(&src.endpoint, TransportKind::Shm, me, None);
    assert_eq!(kind, MsgKind::ExportReject);
    let e = decode_reject(&body).unwrap().1;
    assert_eq!(e.status(), Status::StalePeer, "{e}");
    assert!(e.message().contains("another boot"), "{e}");
}

// ---------------------------------------------------------------------------

/// M12: a posted WRITE whose completion is uncertain is terminal under Auto:
/// Unquiesced with an Unknown effect, on SHM, never re-run over TCP (which
/// the policy would allow). Guards `transport/ipc/executor.rs` `IpcExecutor::run`: only an
/// unposted group (`GroupError::NotPosted`) may fall through.
#[test]
fn m12_an_uncertain_write_never_falls_through_to_tcp() {
    let mut src = shm_source(MIB, 1);
    // With the default cache (without one, AUTO would not choose SHM).
    let l = Local::new("{}", &src.endpoint, MIB, 0x42);
    l.e.faults().fail_completion.store(1, Ordering::SeqCst);
    let b = l.e.submit(l.peer, &[wr(l.at(0), src.addr, 64 * KIB)], SubmitOptions::default()).unwrap();
    let _ = b.wait(LONG);
    assert_eq!(b.results(), vec![res(Status::Unquiesced, RemoteEffect::Unknown)]);
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm));
    let st = l.e.stats();
    assert_eq!(st.transports["tcp"].requests_completed + st.transports["tcp"].requests_failed, 0, "{st:?}");
    assert_eq!(src.stats()["transports"]["tcp"]["served_requests"], 0);
    assert_eq!(l.shm().imports.retained, 1);
    assert_eq!(src_shm(&mut src, "exports_open"), 1, "the export stays retained");
}

/// M12 over a whole AUTO submission of two groups (two regions): the
/// first group's two WRITEs fail after posting (their completion
/// unconfirmed: UNQUIESCED, effect UNKNOWN), the second's READ and WRITE
/// complete. Every request went over SHM and ends there; none over TCP on
/// either side (a WRITE sent again would be written twice), none counted
/// as fallen through, and the failed group does not stop the next one.
/// Guards `transport/ipc/executor.rs` `IpcExecutor::run` (only `GroupError::NotPosted`
/// reaches `fall_through`) and `transport/ipc/requester/mod.rs`
/// `run_group` (a group whose completion failed after posting is `Done`,
/// never handed back as `NotPosted`).
#[test]
fn m12_posted_groups_that_failed_are_never_sent_again_over_tcp() {
    let mut src = shm_source(MIB, 2);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let l = Local::new("{}", &src.endpoint, MIB, 0x42);
    l.e.faults().fail_completion.store(1, Ordering::SeqCst);
    let reqs = [
        wr(l.at(0), a, 4 * KIB),
        wr(l.at(64 * KIB), a + 64 * KIB, 4 * KIB),
        rd(l.at(128 * KIB), b, 4 * KIB),
        wr(l.at(192 * KIB), b + 64 * KIB, 4 * KIB),
    ];
    let batch = l.e.submit(l.peer, &reqs, SubmitOptions { transport: Transport::Auto, timeout: Some(LONG) }).unwrap();
    let _ = batch.wait(LONG);
    let uncertain = res(Status::Unquiesced, RemoteEffect::Unknown);
    assert_eq!(
        batch.results(),
        vec![uncertain, uncertain, res(Status::Ok, RemoteEffect::None), res(Status::Ok, RemoteEffect::Applied)]
    );
    let kinds: Vec<_> = (0..reqs.len()).map(|i| batch.transport(i).unwrap()).collect();
    assert_eq!(kinds, vec![Some(TransportKind::Shm); 4]);
    assert!(l.bytes(128 * KIB, 4 * KIB).iter().enumerate().all(|(i, x)| *x == pattern(2, i as u64)), "the READ");
    let st = l.e.stats();
    let (tcp, shm) = (&st.transports["tcp"], &st.transports["shm"]);
    assert_eq!((tcp.requests_completed, tcp.requests_failed, tcp.requests_fell_through), (0, 0, 0), "{st:?}");
    assert_eq!((shm.requests_completed, shm.requests_failed, shm.requests_fell_through), (2, 2, 0), "{st:?}");
    assert_eq!(src.stats()["transports"]["tcp"]["served_requests"], 0);
}

/// X5: the per-request account. A submission of two groups (two regions):
/// the first group's completion fails, so each of its requests fails with
/// its own effect (READ None, WRITE Unknown), and the second group's
/// requests complete; a WRITE whose close receipt is never acknowledged is
/// not completed although its bytes arrived. Guards
/// `transport/ipc/requester/mod.rs` `finish` (`fail_all` over the group only)
/// and `close_import`'s receipt.
#[test]
fn x5_only_acknowledged_requests_complete_and_each_failure_is_accounted() {
    let mut src = shm_source(MIB, 2);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let l = Local::new(UNCACHED, &src.endpoint, MIB, 0x42);
    l.e.faults().fail_completion.store(1, Ordering::SeqCst);
    let reqs = [
        wr(l.at(0), a, 4 * KIB),
        rd(l.at(64 * KIB), a + 8 * KIB, 4 * KIB),
        rd(l.at(128 * KIB), b, 4 * KIB),
        wr(l.at(0), b + 64 * KIB, 4 * KIB),
    ];
    let out = go(&l.e, l.peer, &reqs, only(TransportKind::Shm));
    assert_eq!(
        out,
        vec![
            res(Status::Unquiesced, RemoteEffect::Unknown),
            res(Status::Unquiesced, RemoteEffect::None),
            res(Status::Ok, RemoteEffect::None),
            res(Status::Ok, RemoteEffect::Applied),
        ]
    );
    // Both attempts of the receipt lose their acknowledgement.
    let l2 = Local::new(UNCACHED, &src.endpoint, MIB, 0x42);
    l2.e.faults().lose_ack.store(2, Ordering::SeqCst);
    // SAFETY: the local allocation maps MIB writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(common::pattern_vec(9, 4096).as_ptr(), l2.at(0) as *mut u8, 4096) };
    let out = go(&l2.e, l2.peer, &[wr(l2.at(0), b + 128 * KIB, 4 * KIB)], only(TransportKind::Shm));
    assert_eq!(out[0].remote_effect, RemoteEffect::Unknown, "{out:?}");
    assert_eq!(out[0].status, Status::Unavailable, "{out:?}");
    assert_eq!(src.cmd(&format!("verifyn 1 9 {} 4096", 128 * KIB)), "ok", "the bytes did arrive");
    assert_eq!(l2.shm().imports.retained, 1);
}

/// E1: the completion is queried once on the caller: a ready group finishes
/// there (the batch is complete when `submit` returns, no worker started);
/// a group whose one query says "not yet" moves to the progress worker.
/// Guards `transport/ipc/requester/mod.rs` `run_group`'s `match
/// (posted.imp.mapping.query(), defer)`.
#[test]
fn e1_one_query_on_the_caller_decides_between_finishing_and_the_worker() {
    let src = shm_source(MIB, 1);
    let l = Local::new(UNCACHED, &src.endpoint, MIB, 0);
    let b = l.e.submit(l.peer, &[rd(l.at(0), src.addr, 64 * KIB)], only(TransportKind::Shm)).unwrap();
    assert_eq!(b.poll(), Status::Ok, "a ready group completes on the caller");
    assert_eq!(l.shm().progress_workers, 0);
    l.e.faults().pending_polls.store(1, Ordering::SeqCst);
    let b = l.e.submit(l.peer, &[rd(l.at(0), src.addr, 64 * KIB)], only(TransportKind::Shm)).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(l.shm().progress_workers, 1, "one 'not yet' from the single query hands the group to the worker");
    assert!(l.bytes(0, 64 * KIB).iter().enumerate().all(|(i, v)| *v == pattern(1, i as u64)));
}

/// B3: the source grants exactly the requested envelope within the whole
/// allocation, and the requester counts only requested bytes (two 4 KiB
/// slices 1 MiB apart: 8 KiB, not the envelope). Guards
/// `transport/ipc/export/mod.rs` `offer`'s `grant_addr: req.addr, grant_len:
/// req.len` and the requester's per-request byte accounting.
#[test]
fn b3_the_grant_is_the_envelope_and_only_requested_bytes_count() {
    let src = shm_source(4 * MIB, 1);
    let o = common::ipc_export_request(&src.endpoint, TransportKind::Shm, src.addr + MIB, 8 * KIB).unwrap();
    assert_eq!((o.grant_addr, o.grant_len), (src.addr + MIB, 8 * KIB), "{o:?}");
    assert_eq!((o.base, o.physical), (src.addr, 4 * MIB), "{o:?}");
    assert_eq!(o.ops, OP_READ);
    let l = Local::new(UNCACHED, &src.endpoint, MIB, 0);
    let out = go(
        &l.e,
        l.peer,
        &[rd(l.at(0), src.addr, 4 * KIB), rd(l.at(8 * KIB), src.addr + MIB, 4 * KIB)],
        only(TransportKind::Shm),
    );
    assert_eq!(out, vec![res(Status::Ok, RemoteEffect::None); 2]);
    let st = l.e.stats();
    assert_eq!(st.transports["shm"].bytes_completed, 8 * KIB, "{st:?}");
    assert_eq!(st.ipc["shm"].imports.opened, 1, "one group, one import");
}

/// B4 (as this stage changed it): requests naming one region form one group
/// (one import each group, no cache) however far apart their blocks lie (an
/// import maps the whole allocation); independent requests of one region
/// join one group across the submission, dependent ones keep consecutive
/// runs; B1: requests naming one region share an import across local
/// allocations. Guards `transport/ipc/groups.rs` `group`.
#[test]
fn b4_groups_are_regions_regrouped_only_when_independent() {
    let src = shm_source(4 * MIB, 2);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let l = Local::new(r#"{"max_transfer_bytes": 1048576, "shm_cache_entries": 0}"#, &src.endpoint, MIB, 0);
    let opened = |reqs: &[Request]| {
        let before = l.shm().imports.opened;
        assert!(go(&l.e, l.peer, reqs, only(TransportKind::Shm)).iter().all(|r| r.status == Status::Ok));
        l.shm().imports.opened - before
    };
    // B1: one envelope, from two local allocations: one import.
    let other = allocate_shared_host(64 * KIB).unwrap();
    l.e.register_memory(other.addr(), 64 * KIB, Access::NONE).unwrap();
    assert_eq!(opened(&[rd(l.at(0), a, 4 * KIB), rd(other.addr(), a + 512 * KIB, 4 * KIB)]), 1, "one envelope");
    assert_eq!(opened(&[rd(l.at(0), a, 4 * KIB), rd(l.at(4 * KIB), a + 3 * MIB, 4 * KIB)]), 1, "wider than 1 MiB");
    // A, B, A, independent: two groups; the same with the last READ landing
    // where the first one did: three, in input order.
    assert_eq!(opened(&[rd(l.at(0), a, 4 * KIB), rd(l.at(4 * KIB), b, 4 * KIB), rd(l.at(8 * KIB), a, 4 * KIB)]), 2);
    assert_eq!(opened(&[rd(l.at(0), a, 4 * KIB), rd(l.at(4 * KIB), b, 4 * KIB), rd(l.at(0), a, 4 * KIB)]), 3);
}

/// B5: an explicit ResourceExhausted before any grant permits one retry as
/// a single request, for each request of the group; any other refusal is
/// not retried. Guards `transport/ipc/executor.rs` `IpcExecutor::run`'s
/// `e.status() == Status::ResourceExhausted && !retried`.
#[test]
fn b5_only_resource_exhausted_is_retried_once_per_request() {
    let two = |h: &Hostile| {
        let l = Local::new(UNCACHED, &h.endpoint, 64 * KIB, 0);
        go(
            &l.e,
            l.peer,
            &[rd(l.at(0), h.addr, 4 * KIB), rd(l.at(4 * KIB), h.addr + 8 * KIB, 4 * KIB)],
            only(TransportKind::Shm),
        )
    };
    let h = Hostile::start(Script::answering(Answer::Reject(Status::ResourceExhausted)), HOSTILE_FILL);
    assert_eq!(two(&h), vec![res(Status::ResourceExhausted, RemoteEffect::None); 2]);
    let asked: Vec<(u64, u64)> = h.requests().iter().map(|r| (r.addr - h.addr, r.len)).collect();
    assert_eq!(asked, vec![(0, 12 * KIB), (0, 4 * KIB), (8 * KIB, 4 * KIB), (8 * KIB, 4 * KIB)]);
    for st in [Status::Unavailable, Status::PermissionDenied] {
        let h = Hostile::start(Script::answering(Answer::Reject(st)), HOSTILE_FILL);
        assert_eq!(two(&h), vec![res(st, RemoteEffect::None); 2]);
        assert_eq!(h.requests().len(), 1, "{st:?} is not retried");
    }
}

struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// C9: `flush_nvlink_cache` closes cached imports through their receipts
/// while submissions keep running on other threads (admission stays open):
/// the submitters run until the flusher has closed imports under them, every
/// submission succeeds with the right bytes, and in the end every import
/// opened was closed and the source holds no export. Guards
/// `engine/mod.rs` `flush_nvlink_cache` (no admission fence) and
/// `transport/ipc/cache.rs` `flush` (waits for an entry's users).
#[test]
fn c9_flushes_race_submissions_without_failing_them() {
    let mut src = shm_source(MIB, 1);
    let l = Local::new(r#"{"shm_cache_entries": 4}"#, &src.endpoint, MIB, 0);
    let done = AtomicBool::new(false);
    let closed_under_load = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (l, done, closed) = (&l, &done, &closed_under_load);
            let src_addr = src.addr;
            s.spawn(move || {
                // Stops the flusher however this thread ends (a failed
                // assertion included).
                let _stop = SetOnDrop(done);
                let mut n = 0;
                while n < 50 || closed.load(Ordering::SeqCst) < 3 {
                    let off = t * 256 * KIB;
                    let out = go(&l.e, l.peer, &[rd(l.at(off), src_addr + off, 256 * KIB)], only(TransportKind::Shm));
                    assert_eq!(out, vec![res(Status::Ok, RemoteEffect::None)], "submission {n} of thread {t}");
                    assert!(l.bytes(off, 256 * KIB).iter().enumerate().all(|(i, v)| *v == pattern(1, off + i as u64)));
                    n += 1;
                }
            });
        }
        let (l, done, closed) = (&l, &done, &closed_under_load);
        s.spawn(move || {
            while !done.load(Ordering::SeqCst) {
                l.e.flush_nvlink_cache(Some(LONG)).unwrap();
                closed.store(l.shm().imports.closed, Ordering::SeqCst);
            }
        });
    });
    l.e.flush_nvlink_cache(Some(LONG)).unwrap();
    let st = l.shm();
    assert!(st.imports.opened >= 3, "the flushes closed imports under the submitters: {st:?}");
    assert_eq!((st.imports.opened, st.imports.cached, st.imports.retained), (st.imports.closed, 0, 0), "{st:?}");
    assert_eq!(src_shm(&mut src, "exports_open"), 0);
}

/// C10: `close_requester` called directly while a group is in flight on the
/// progress worker: it waits for it (the batch is complete when it
/// returns), closes the imports through their receipts, and fences later
/// submissions. Guards `engine/mod.rs` `close_requester`'s
/// `requester_gate.close_and_wait` and its flush.
#[test]
fn c10_close_requester_waits_for_work_in_flight_then_fences() {
    let mut src = shm_source(MIB, 1);
    let l = Local::new(r#"{"shm_cache_entries": 2}"#, &src.endpoint, MIB, 0);
    // The completion answers "not yet" 10000 more times: the group stays
    // on the progress worker for at least two seconds.
    l.e.faults().pending_polls.store(10_001, Ordering::SeqCst);
    let b = l.e.submit(l.peer, &[rd(l.at(0), src.addr, 512 * KIB)], only(TransportKind::Shm)).unwrap();
    assert_eq!(b.poll(), Status::Pending, "the group is in flight");
    l.e.close_requester(Some(LONG)).unwrap();
    // It waited for the group: every "not yet" was consumed by the worker
    // before it returned (and the batch reads complete: the test below).
    assert_eq!(l.e.faults().pending_polls.load(Ordering::SeqCst), 0, "close_requester did not wait");
    b.wait(LONG).unwrap();
    assert!(l.bytes(0, 512 * KIB).iter().enumerate().all(|(i, v)| *v == pattern(1, i as u64)));
    let st = l.shm();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.cached), (1, 1, 0), "{st:?}");
    assert_eq!(src_shm(&mut src, "exports_open"), 0);
    // Fenced: its peers are gone and no new one may be connected.
    let e = l.e.submit(l.peer, &[rd(l.at(0), src.addr, 16)], only(TransportKind::Shm)).err().expect("no peer");
    assert_eq!(e.status(), Status::NotFound, "{e}");
    let e = l.e.connect(&src.endpoint, None).expect_err("fenced");
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().contains("requester side is closed"), "{e}");
}

/// C10: when `close_requester` returns, the batch it waited for reads
/// complete (once a bug: the deferred completion dropped its requester-gate
/// guard before recording the outcomes). Guards `transport/ipc/executor.rs`
/// `deferred_completion`'s order: outcomes first, then the guard.
#[test]
fn c10_close_requester_returns_with_the_waited_for_batch_complete() {
    let src = shm_source(MIB, 1);
    let l = Local::new(UNCACHED, &src.endpoint, MIB, 0);
    l.e.faults().pending_polls.store(1_001, Ordering::SeqCst);
    let b = l.e.submit(l.peer, &[rd(l.at(0), src.addr, 512 * KIB)], only(TransportKind::Shm)).unwrap();
    assert_eq!(b.poll(), Status::Pending);
    l.e.close_requester(Some(LONG)).unwrap();
    assert_eq!(b.poll(), Status::Ok, "close_requester returned before the group it waited for was recorded");
}

/// The hostile source itself: a request for WRITE is offered WRITE, so the
/// X2 refusals above come from the requester's checks, not from a harness
/// that cannot serve.
#[test]
fn the_hostile_harness_serves_an_honest_write() {
    let h = Hostile::start(Script::honest(), |_| 0);
    let l = Local::new(UNCACHED, &h.endpoint, 64 * KIB, 0x77);
    let out = go(&l.e, l.peer, &[wr(l.at(0), h.addr + LEN - 4 * KIB, 4 * KIB)], only(TransportKind::Shm));
    assert_eq!(out, vec![res(Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(h.requests()[0].ops, OP_WRITE);
}

/// A source whose offer claims a physical extent of twice its memory
/// file (the grant inside it, so the offer itself passes): the requester
/// accepts, then refuses the handle (a memory file shorter than the
/// extent it would map), the READ fails `PROTOCOL_ERROR` and lands
/// nothing, and no import opens. (Mapped past the file's end, a use of
/// the extent past it would fault this process.) Guards `ShmBackend::import`
/// (src/transport/ipc/backends/shm.rs): its `(st.st_size as u64) < physical`.
#[test]
fn x2_a_handle_shorter_than_the_offered_extent_is_refused() {
    let h = Hostile::start(Script::answering(Answer::Offer(|o, _| o.physical = 2 * LEN)), HOSTILE_FILL);
    let (l, out) = read_from(&h);
    assert_eq!(out, vec![res(Status::ProtocolError, RemoteEffect::None)]);
    assert_eq!(h.answers(), vec![(101, true)], "the offer itself is sound: accepted");
    assert!(l.bytes(0, 4 * KIB).iter().all(|b| *b == 0xee), "bytes moved");
    assert_eq!(l.shm().imports.opened, 0);
}
