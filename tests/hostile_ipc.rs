//! IPC requesters that push a source's I/O threads to their edges: a
//! channel that pipelines export requests and never reads its answers, a
//! WRITE grant still waiting for another engine's reader when its own
//! engine closes, a Hello naming its pid with another start time, a
//! header announcing a payload kind's body, channels opened and lost
//! again and again, a Hello naming another boot, a request carrying a
//! file descriptor, and more exports over one channel than its grant
//! board has slots.

mod common;

use common::*;
use orbite::control::frame::{FrameHeader, MsgKind, MAX_CONTROL_BODY};
use orbite::control::Identity;
use orbite::transport::ipc::board::SLOTS;
use orbite::transport::ipc::channel::Channel;
use orbite::transport::ipc::messages::{
    decode_reject, ExportOffer, ExportRef, ExportRequest, NO_SLOT, OP_READ, OP_WRITE,
};
use orbite::*;
use std::time::{Duration, Instant};

const SZ: u64 = 1 << 20;

/// An engine with the allocation registered, and the region's epoch.
fn engine(cfg: &str, a: &Allocation) -> (Engine, u64) {
    let e = Engine::from_json(cfg).unwrap();
    e.register_memory(a.addr(), SZ, Access::READ_WRITE).unwrap();
    let d = describe_of(&e.endpoint());
    let epoch = d.regions.iter().find(|r| r.contains(a.addr(), 1)).unwrap().epoch;
    (e, epoch)
}

fn request(epoch: u64, addr: u64, tag: u64, ops: u32, wait_ms: u32) -> Vec<u8> {
    let r = ExportRequest { tag, region_epoch: epoch, addr, len: 4096, ops, wait_ms };
    let mut v = FrameHeader::encode(MsgKind::ExportRequest, r.encode().len() as u32).to_vec();
    v.extend_from_slice(&r.encode());
    v
}

/// After a refusal: the refused channel is ended (its next read finds it
/// closed, within LONG), nothing is exported or charged, and a new
/// requester is still welcome; then the source closes and `a` is freed.
fn the_channel_ends_and_the_source_serves_on(mut ch: Channel, src: Engine, a: Allocation) {
    let deadline = Instant::now() + LONG;
    let mut tick = || if Instant::now() < deadline { Ok(()) } else { Err(Error::TimedOut("the end".into())) };
    let after = ch.recv(&mut tick).map(|f| f.kind);
    assert_eq!(after.map_err(|e| e.status()), Err(Status::Unavailable), "the refused channel stays open");
    let st = src.stats().ipc["shm"].clone();
    assert_eq!((st.exports.open, st.mapping_bytes_charged), (0, 0), "{st:?}");
    let (_, kind, _) = ipc_hello(&src.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(kind, MsgKind::IpcWelcome);
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}

/// Writes all of `b` on the channel's socket (retrying up to `LONG`);
/// false once the source has cut it.
fn raw_send(ch: &Channel, b: &[u8]) -> bool {
    let mut at = 0;
    let t0 = Instant::now();
    while at < b.len() && t0.elapsed() < LONG {
        // SAFETY: send on our own socket from a valid buffer.
        let n = unsafe { libc::send(ch.raw_fd(), b[at..].as_ptr().cast(), b.len() - at, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) {
                std::thread::yield_now();
                continue;
            }
            return false;
        }
        at += n as usize;
    }
    at == b.len()
}

/// 4000 export requests in one stream, no offer ever answered: the
/// channel holds at most 8 offers (before, it held 512, the whole mapping
/// budget, and an honest SHM requester was refused RESOURCE_EXHAUSTED),
/// the rest are refused; when the channel ends every offer is given back;
/// a TCP peer on the same I/O thread keeps moving throughout.
#[test]
fn pipelined_export_requests_never_read_are_bounded() {
    let a = allocate_shared_host(SZ).unwrap();
    let cfg = r#"{"io_threads": 1, "handshake_timeout_ms": 2000, "offer_timeout_ms": 600000}"#;
    let (src, epoch) = engine(cfg, &a);
    let good = Engine::from_json("").unwrap();
    let local = vec![0u8; 65536];
    good.register_memory(local.as_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
    let gp = good.connect(&src.endpoint(), None).unwrap();
    let (ch, k, _) = ipc_hello(&src.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(k, MsgKind::IpcWelcome);
    let all: Vec<u8> = (0..4000).flat_map(|t| request(epoch, a.addr(), t + 1, OP_READ, 0)).collect();
    let mut peak = 0;
    std::thread::scope(|sc| {
        let w = sc.spawn(|| raw_send(&ch, &all));
        // Meanwhile, and after, the TCP peer on the same I/O thread moves.
        while !w.is_finished() {
            peak = peak.max(src.stats().ipc["shm"].exports.open);
            let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 65536 };
            let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(LONG) };
            good.submit(gp, &[r], opts).unwrap().wait(LONG).unwrap();
        }
        w.join().unwrap();
    });
    // Every request is answered: at most 8 offers, the rest refused.
    let mut ch = ch;
    let deadline = Instant::now() + LONG;
    let mut tick = || match Instant::now() >= deadline {
        true => Err(Error::TimedOut("answers".into())),
        false => Ok(()),
    };
    let (mut offers, mut refused) = (0, 0);
    for _ in 0..4000 {
        match ch.recv(&mut tick).unwrap().kind {
            MsgKind::ExportOffer => offers += 1,
            MsgKind::ExportReject => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    peak = peak.max(src.stats().ipc["shm"].exports.open);
    assert_eq!((offers, refused), (8, 3992));
    assert!(peak <= 8, "a requester that pipelines requests held {peak} offers");
    drop(ch);
    eventually("every offer is given back", || src.stats().ipc["shm"].exports.open == 0);
    good.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}

/// A requester that names its own pid, which the kernel verifies, with a
/// start time that is not its process's (what a process that took over
/// an exited one's pid would send with the old identity) is refused
/// STALE_PEER, naming both start times, and served nothing: its channel
/// is closed before any export request is read, and nothing is exported.
/// Guards `transport/ipc/source.rs` `handshake`'s
/// `process_start_time(pid) != requester.process.start_time`.
#[test]
fn a_hello_with_this_pid_and_another_start_time_is_refused_as_stale() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, epoch) = engine(r#"{"io_threads": 1}"#, &a);
    let mut claimed = Identity::fresh().unwrap();
    let (pid, real) = (claimed.process.pid, claimed.process.start_time);
    claimed.process.start_time = real + 1;
    let (ch, kind, body) = ipc_hello(&src.endpoint(), TransportKind::Shm, claimed, None);
    assert_eq!(kind, MsgKind::ExportReject);
    let e = decode_reject(&body).unwrap().1;
    assert_eq!(e.status(), Status::StalePeer, "{e}");
    let says = format!("requester claims pid {pid} (start {}), the kernel says pid {pid} (start {real})", real + 1);
    assert_eq!(e.message(), says);
    // Nothing served: a request on the channel finds it closed.
    let _ = raw_send(&ch, &request(epoch, a.addr(), 1, OP_READ, 0));
    the_channel_ends_and_the_source_serves_on(ch, src, a);
}

/// One allocation served by two engines of this process; a reader process
/// holds it through engine 1 (one export there); a raw writer asks engine 2
/// for a WRITE grant of it, and is offered one at once: exports of one
/// allocation coexist (nothing waits for another importer). Returns
/// (engine 1, engine 2, the reader, the writer's channel).
fn writer_beside_reader(a: &Allocation, wait_ms: u32) -> (Engine, Engine, PeerProc, Channel) {
    let (e1, _) = engine(r#"{"io_threads": 1}"#, a);
    let (e2, epoch2) = engine(r#"{"io_threads": 1}"#, a);
    let reader =
        PeerProc::spawn_requester(&e1.endpoint(), &format!("{}:4096", a.addr()), r#"{"shm_cache_entries": 2}"#);
    assert_eq!(e1.stats().ipc["shm"].exports.open, 1);
    let (mut ch, k, _) = ipc_hello(&e2.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(k, MsgKind::IpcWelcome);
    assert!(raw_send(&ch, &request(epoch2, a.addr() + 8192, 9, OP_WRITE, wait_ms)));
    let deadline = Instant::now() + LONG;
    let mut tick = || if Instant::now() < deadline { Ok(()) } else { Err(orbite::Error::TimedOut("offer".into())) };
    assert_eq!(ch.recv(&mut tick).unwrap().kind, MsgKind::ExportOffer, "a WRITE grant waited for a reader");
    (e1, e2, reader, ch)
}

/// A raw writer holds an unanswered WRITE offer on engine 2 beside a
/// reader's import on engine 1. Engine 2 closes at once (the offer is
/// released with its channel), and once the reader gives back nothing
/// stays exported and the allocation can be freed.
#[test]
fn an_engine_closing_with_an_offer_beside_a_reader_leaves_nothing_exported() {
    let a = allocate_shared_host(SZ).unwrap();
    let (e1, e2, mut reader, ch) = writer_beside_reader(&a, 60_000);
    assert_eq!(e2.stats().ipc["shm"].exports.open, 1);
    let t0 = Instant::now();
    e2.close(Some(Duration::from_secs(30))).unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "engine 2 took {took:?} to close");
    assert_eq!(e2.stats().ipc["shm"].exports.open, 0);
    assert_eq!(reader.cmd("flush"), "ok");
    reader.kill();
    e1.close(Some(Duration::from_secs(30))).unwrap();
    drop(ch);
    free_eventually(a);
}

/// A raw writer's offer beside a reader's import charges engine 2 the
/// allocation once; the writer hangs up, and the charge and the region
/// lease go back at once while the reader still holds its import.
#[test]
fn a_channel_that_hangs_up_with_an_offer_gives_its_charge_back_at_once() {
    let a = allocate_shared_host(SZ).unwrap();
    let (e1, e2, mut reader, ch) = writer_beside_reader(&a, 600_000);
    assert_eq!(e2.stats().ipc["shm"].mapping_bytes_charged, a.physical_len());
    drop(ch);
    eventually("the offer is released", || e2.stats().ipc["shm"].exports.open == 0);
    let st = e2.stats().ipc["shm"].clone();
    assert_eq!((st.mapping_bytes_charged, st.exports.open, st.exports.retained), (0, 0, 0));
    // The reader kept its import throughout.
    assert_eq!(e1.stats().ipc["shm"].exports.open, 1);
    assert_eq!(reader.cmd("flush"), "ok");
    reader.kill();
    e2.close(Some(LONG)).unwrap();
    e1.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}

/// A requester announces a `WriteRequest`-kind frame (a payload kind, whose
/// frames on a data connection may carry a GiB) with a body one byte
/// beyond the control bound, and sends no body: the source refuses it from
/// its header (PROTOCOL_ERROR naming its size, the channel closed) instead
/// of waiting to gather it, and serves the next channel. Guards
/// `transport/ipc/proto/source.rs` `parse`'s `h.body_len >
/// MAX_CONTROL_BODY` (round 9 I10: bounded by the kind's `max_body`, the
/// header passed and the source waited for the body until its stall
/// bound, then ended the channel as "not completed").
#[test]
fn a_payload_kind_header_beyond_the_control_bound_is_refused_at_once() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, _) = engine(r#"{"io_threads": 1}"#, &a);
    let (mut ch, k, _) = ipc_hello(&src.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(k, MsgKind::IpcWelcome);
    let len = MAX_CONTROL_BODY + 1;
    assert!(raw_send(&ch, &FrameHeader::encode(MsgKind::WriteRequest, len)));
    let deadline = Instant::now() + LONG;
    let mut tick = || if Instant::now() < deadline { Ok(()) } else { Err(Error::TimedOut("refusal".into())) };
    let f = ch.recv(&mut tick).expect("an answer to the header");
    assert_eq!(f.kind, MsgKind::ExportReject);
    let e = decode_reject(&f.body).unwrap().1;
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert_eq!(e.message(), format!("IPC frame of {len} bytes is too large"));
    the_channel_ends_and_the_source_serves_on(ch, src, a);
}

/// The grant boards process `pid` holds: its descriptors of a board's
/// memory file (`/proc/PID/fd` links to `/memfd:orbite-board`).
fn boards_held(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("/memfd:orbite-board"))
        .count()
}

/// A source process gives each Unix IPC channel a grant board (a mapped
/// memory file) and lets it go with its channel: requesters that open 4
/// channels, hang them up, and come back, 3 times over, find the source
/// holding exactly 4 boards while they are open and none once every
/// channel has ended; boards do not pile up one per channel ever opened.
/// Guards `transport/ipc/export/ending.rs` `connection_lost`'s
/// `t.boards.remove(&conn);` (round 9 I12: without it every lost channel's
/// board stayed mapped in the export table).
#[test]
fn a_lost_channel_lets_its_grant_board_go() {
    let mut src = PeerProc::spawn(&["--size", "4096"]);
    let incoming = |src: &mut PeerProc| src.stats()["incoming_connections"].as_u64().expect("incoming_connections");
    assert_eq!(boards_held(src.pid), 0);
    for round in 0..3 {
        let channels: Vec<Channel> = (0..4)
            .map(|_| {
                let (ch, k, _) = ipc_hello(&src.endpoint, TransportKind::Shm, Identity::fresh().unwrap(), None);
                assert_eq!(k, MsgKind::IpcWelcome);
                ch
            })
            .collect();
        assert_eq!(boards_held(src.pid), 4, "round {round}: boards with 4 channels open");
        drop(channels);
        // Every channel (and every control connection of the hellos) ended.
        let t0 = Instant::now();
        while incoming(&mut src) != 0 {
            assert!(t0.elapsed() < LONG, "round {round}: the channels never ended");
            std::thread::yield_now();
        }
        assert_eq!(boards_held(src.pid), 0, "round {round}: boards of lost channels kept");
    }
    src.close();
}

/// A requester that names its own pid and start time, both of which the
/// kernel verifies, but another boot (its boot id changed: what a hello
/// replayed from another host would carry) is refused STALE_PEER, saying
/// SHM needs the same host, and served nothing: its channel is closed
/// before any export request is read, and nothing is exported. Guards
/// `transport/ipc/source.rs` `handshake`'s
/// `if !ctx.identity.same_boot(&requester) {` (round 11 K4).
#[test]
fn a_hello_naming_another_boot_is_refused_as_stale() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, epoch) = engine(r#"{"io_threads": 1}"#, &a);
    let mut claimed = Identity::fresh().unwrap();
    claimed.boot_id[0] ^= 0xff;
    let (ch, kind, body) = ipc_hello(&src.endpoint(), TransportKind::Shm, claimed, None);
    assert_eq!(kind, MsgKind::ExportReject);
    let e = decode_reject(&body).unwrap().1;
    assert_eq!(e.status(), Status::StalePeer, "{e}");
    assert_eq!(e.message(), "requester runs on another boot; SHM needs the same host");
    // Nothing served: a request on the channel finds it closed.
    let _ = raw_send(&ch, &request(epoch, a.addr(), 1, OP_READ, 0));
    the_channel_ends_and_the_source_serves_on(ch, src, a);
}

/// A welcomed requester sends a well-formed export request with a file
/// descriptor attached (SCM_RIGHTS): requesters never pass descriptors to
/// a source, so the source refuses it as PROTOCOL_ERROR naming the
/// descriptor, offers nothing and closes the channel; the source goes on
/// serving. Guards `transport/ipc/source.rs` `IpcServed::serve`'s
/// `if fds {` (round 11 K5: without it the request was offered).
#[test]
fn a_file_descriptor_from_the_requester_is_a_protocol_error() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, epoch) = engine(r#"{"io_threads": 1}"#, &a);
    let (mut ch, k, _) = ipc_hello(&src.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(k, MsgKind::IpcWelcome);
    let passed = std::fs::File::open("/dev/null").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&passed);
    let deadline = Instant::now() + LONG;
    let mut tick = || if Instant::now() < deadline { Ok(()) } else { Err(Error::TimedOut("refusal".into())) };
    let req = ExportRequest { tag: 1, region_epoch: epoch, addr: a.addr(), len: 4096, ops: OP_READ, wait_ms: 0 };
    ch.send(MsgKind::ExportRequest, &req.encode(), &[fd], &mut tick).unwrap();
    let f = ch.recv(&mut tick).expect("an answer to the request");
    assert_eq!(f.kind, MsgKind::ExportReject, "a request carrying a descriptor was served");
    let e = decode_reject(&f.body).unwrap().1;
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert_eq!(e.message(), "a file descriptor arrived from the requester");
    the_channel_ends_and_the_source_serves_on(ch, src, a);
}

/// One channel asks for, and declines, one export more than its grant
/// board has slots, one at a time: every offer carries a slot on the
/// board (the fast path), since each declined offer gives its slot back;
/// nothing stays exported. Guards `transport/ipc/export/mod.rs`
/// `SlotHold::drop`'s `self.on.free.lock().give_back(self.index);`
/// (round 11 K11: without it the channel's board filled after `SLOTS`
/// exports, and every later offer came with `NO_SLOT`: round trips only).
#[test]
fn an_ended_export_gives_its_board_slot_back() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, epoch) = engine(r#"{"io_threads": 1}"#, &a);
    let (mut ch, k, _) = ipc_hello(&src.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(k, MsgKind::IpcWelcome);
    let deadline = Instant::now() + LONG;
    for n in 0..=SLOTS as u64 {
        let req =
            ExportRequest { tag: n + 1, region_epoch: epoch, addr: a.addr(), len: 4096, ops: OP_READ, wait_ms: 0 };
        let f = ch.call(MsgKind::ExportRequest, &req.encode(), deadline, "export request").unwrap();
        assert_eq!(f.kind, MsgKind::ExportOffer, "request {n}");
        let o = ExportOffer::decode(&f.body).unwrap();
        assert_ne!(o.slot, NO_SLOT, "export {n} of one channel got no board slot");
        let decline = ExportRef { export_id: o.export_id, token: o.token, value: 0, extra: 0 };
        let f = ch.call(MsgKind::ExportAnswer, &decline.encode(), deadline, "decline").unwrap();
        assert_eq!(f.kind, MsgKind::Ack, "decline {n}");
    }
    let st = src.stats().ipc["shm"].clone();
    assert_eq!((st.exports.open, st.mapping_bytes_charged), (0, 0), "{st:?}");
    drop(ch);
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}
