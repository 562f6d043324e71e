//! Sources that misbehave against a requester whose connections share one
//! I/O thread (`io_threads: 1`): a stalled, silent, flooding or lying
//! source ends only its own requests (at their deadline, or with
//! PROTOCOL_ERROR), and the honest peer served by the same thread keeps
//! moving bytes meanwhile. A silent source also holds `close_requester`
//! fenced: the requester side refuses submissions, the source side serves.

mod common;

use common::{describe_of, pattern_vec, read_request};
use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::control::message::DataResponse;
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The honest source's region, which the fake sources publish too: as
/// large as the largest request sent to them (a requester refuses a range
/// past the end of the region it starts in).
const LEN: usize = 64 << 20;

/// An honest source, and a requester with one I/O thread connected to it.
struct Honest {
    src: Engine,
    req: Engine,
    peer: u64,
    remote: Vec<u8>,
    local: Vec<u8>,
}

impl Honest {
    fn new() -> Honest {
        let src = Engine::from_json("").unwrap();
        let remote = pattern_vec(9, LEN);
        src.register_memory(remote.as_ptr() as u64, LEN as u64, Access::READ_WRITE).unwrap();
        let req = Engine::from_json(r#"{"io_threads": 1}"#).unwrap();
        let local = vec![0u8; 64 << 20];
        req.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        Honest { src, req, peer, remote, local }
    }

    /// 50 READs of 64 KiB from the honest source, each checked.
    fn fifty_reads(&mut self) {
        let opts =
            SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(60)) };
        for i in 0..50u64 {
            self.local[..65536].fill(0);
            let off = (i % 16) * 65536;
            let r = Request {
                op: Op::Read,
                local_addr: self.local.as_ptr() as u64,
                remote_addr: self.remote.as_ptr() as u64 + off,
                len: 65536,
            };
            self.req.submit(self.peer, &[r], opts).unwrap().wait(Duration::from_secs(60)).unwrap();
            assert!(self.local[..65536] == self.remote[off as usize..off as usize + 65536]);
        }
    }

    /// A fake source: it answers the handshake with the honest source's
    /// Describe (TCP only), then `behave`s. Returns its peer id.
    fn connect_fake(&self, behave: impl FnOnce(TcpStream) + Send + 'static) -> u64 {
        common::connect_fake_source(&self.req, &self.src.endpoint(), behave)
    }

    /// A 4096-byte READ (its local bytes 0xee) from the lying source
    /// `fake`: it fails PROTOCOL_ERROR with effect NONE, its message naming
    /// `why`, none of its bytes landed; the honest source still serves.
    fn read_fails_landing_nothing(&mut self, fake: u64, why: &str) {
        let b = self.submit(fake, Op::Read, 4096, Duration::from_secs(60));
        let e = b.wait(Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.status(), Status::TransferFailed);
        let r = &b.results()[0];
        assert_eq!((r.status, r.remote_effect), (Status::ProtocolError, RemoteEffect::None), "{:?}", b.error(0));
        let m = b.error(0).unwrap().message().to_string();
        assert!(m.contains(why), "{m}");
        assert!(self.local[..4096].iter().all(|b| *b == 0xee), "{why}: some bytes landed");
        self.fifty_reads();
    }

    fn submit(&self, peer: u64, op: Op, len: u64, timeout: Duration) -> Batch {
        let r = Request { op, local_addr: self.local.as_ptr() as u64, remote_addr: self.remote.as_ptr() as u64, len };
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(timeout) };
        self.req.submit(peer, &[r], opts).unwrap()
    }
}

#[test]
fn a_source_stalled_mid_header_times_out_alone() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = h.connect_fake(move |mut s| {
        read_request(&mut s);
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, 16)[..8]).unwrap();
        let _ = rx.recv();
    });
    let t0 = Instant::now();
    let b = h.submit(fake, Op::Read, 4096, Duration::from_secs(3));
    h.fifty_reads();
    assert!(t0.elapsed() < Duration::from_secs(3), "the honest peer waited for the stalled one");
    assert_eq!(b.poll(), Status::Pending);
    let e = b.wait(Duration::from_secs(60)).unwrap_err();
    assert_eq!(e.status(), Status::TransferFailed);
    assert_eq!(b.results()[0].status, Status::TimedOut, "{:?}", b.error(0));
    drop(tx);
    h.fifty_reads();
}

#[test]
fn a_source_that_never_reads_fails_its_write_at_the_deadline_unknown() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = h.connect_fake(move |_s| {
        let _ = rx.recv();
    });
    let t0 = Instant::now();
    let b = h.submit(fake, Op::Write, 64 << 20, Duration::from_secs(3));
    h.fifty_reads();
    assert!(t0.elapsed() < Duration::from_secs(3), "the honest peer waited for the silent one");
    let e = b.wait(Duration::from_secs(60)).unwrap_err();
    assert_eq!(e.status(), Status::TransferFailed);
    let r = &b.results()[0];
    assert_eq!(r.status, Status::TimedOut, "{:?}", b.error(0));
    assert_eq!(r.remote_effect, RemoteEffect::Unknown, "part of the WRITE left");
    drop(tx);
    h.fifty_reads();
}

#[test]
fn a_source_answering_an_unknown_tag_ends_its_connection_with_protocol_error() {
    let mut h = Honest::new();
    let fake = h.connect_fake(|mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag: tag + 1000, status: Status::Ok }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + 4096) as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        let _ = s.write_all(&[0u8; 4096]);
        let _ = s.read_to_end(&mut Vec::new());
    });
    let b = h.submit(fake, Op::Read, 4096, Duration::from_secs(60));
    let e = b.wait(Duration::from_secs(60)).unwrap_err();
    assert_eq!(e.status(), Status::TransferFailed);
    assert_eq!(b.results()[0].status, Status::ProtocolError, "{:?}", b.error(0));
    assert!(b.error(0).unwrap().message().contains("unknown tag"), "{:?}", b.error(0));
    let r =
        Request { op: Op::Read, local_addr: h.local.as_ptr() as u64, remote_addr: h.remote.as_ptr() as u64, len: 1 };
    let later = h.req.submit(fake, &[r], SubmitOptions::default()).err().expect("a submit to the cut peer");
    assert_eq!(later.status(), Status::Unavailable);
    assert!(later.message().contains("unknown tag"), "{later}");
    h.fifty_reads();
    assert_eq!(h.req.stats().peers_alive, 1);
}

/// A source answering a 4096-byte READ with 4000 bytes (then, on another
/// connection, 4100): the READ fails PROTOCOL_ERROR naming both lengths,
/// none of the answer's bytes land in the local memory, and the lying
/// connection alone ends (before a short answer could end OK, the rest of
/// the local range keeping its old bytes). Guards
/// `transport/tcp/proto/requester/receive.rs` `Op::Read if rest != e.len`.
#[test]
fn a_read_answered_short_or_long_fails_and_lands_nothing() {
    let mut h = Honest::new();
    for got in [4000usize, 4100] {
        h.local[..4096].fill(0xee);
        let fake = h.connect_fake(move |mut s| {
            let tag = read_request(&mut s);
            let fixed = DataResponse { tag, status: Status::Ok }.encode();
            s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + got) as u32)).unwrap();
            s.write_all(&fixed).unwrap();
            let _ = s.write_all(&vec![0x5a; got]);
            let _ = s.read_to_end(&mut Vec::new());
        });
        h.read_fails_landing_nothing(fake, &format!("READ answer carries {got} bytes, asked for 4096"));
    }
    assert_eq!(h.req.stats().peers_alive, 1);
}

/// A lying source answers a READ's tag with a WriteResponse OK (no
/// payload): the READ fails PROTOCOL_ERROR naming the other direction,
/// none of its local bytes change, and the lying connection alone ends
/// (taken as the READ's answer, it would complete OK with none of its
/// bytes read). Guards `transport/tcp/proto/requester/receive.rs`
/// `Some(e) if e.op == want => {}`.
#[test]
fn a_read_answered_with_a_write_response_fails_and_lands_nothing() {
    let mut h = Honest::new();
    h.local[..4096].fill(0xee);
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag, status: Status::Ok }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::WriteResponse, fixed.len() as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    h.read_fails_landing_nothing(fake, "of the other direction");
    assert_eq!(h.req.stats().peers_alive, 1);
}

#[test]
fn a_source_flooding_describes_does_not_starve_the_thread_it_shares() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut d = describe_of(&h.src.endpoint());
    d.capabilities = TransportKind::Tcp.capability_bit();
    d.ipc_name = String::new();
    let body = d.encode();
    let mut frame = FrameHeader::encode(MsgKind::Describe, body.len() as u32).to_vec();
    frame.extend(&body);
    let burst: Vec<u8> = frame.iter().copied().cycle().take(frame.len() * 256).collect();
    let fake = h.connect_fake(move |mut s| {
        // Unsolicited Describes (same epoch: valid frames) as fast as the
        // requester takes them, until the test ends.
        while rx.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
            if s.write_all(&burst).is_err() {
                break;
            }
        }
    });
    h.fifty_reads();
    assert_eq!(h.req.stats().peers_alive, 2, "the flooding peer is still connected (its frames are valid)");
    drop(tx);
    let _ = h.req.disconnect(fake, Some(Duration::from_secs(5)));
}

#[test]
fn a_failure_answer_whose_text_stalls_ends_at_the_deadline() {
    let h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag, status: Status::PermissionDenied }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + 100) as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        s.write_all(&[b'x'; 10]).unwrap();
        let _ = rx.recv();
    });
    let b = h.submit(fake, Op::Read, 4096, Duration::from_secs(2));
    assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    assert_eq!(b.results()[0].status, Status::TimedOut, "{:?}", b.error(0));
    drop(tx);
}

/// A source that answers a WRITE as soon as it read its fixed part, before
/// its payload: the request stays pending (its local memory leased) until
/// every payload byte has left, then ends with the source's answer; bytes
/// the caller writes after that never reach the peer.
#[test]
fn a_write_answered_early_holds_its_memory_until_the_payload_left() {
    let mut h = Honest::new();
    const LEN: usize = 32 << 20;
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (seen_tx, seen) = std::sync::mpsc::channel::<usize>();
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag, status: Status::PermissionDenied }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::WriteResponse, fixed.len() as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        let _ = wait.recv();
        let mut buf = vec![0u8; LEN];
        s.read_exact(&mut buf).unwrap();
        seen_tx.send(buf.iter().filter(|&&b| b == 0x11).count()).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    h.local[..LEN].fill(0x11);
    let b = h.submit(fake, Op::Write, LEN as u64, Duration::from_secs(120));
    // 32 MiB cannot all sit in the socket: the payload is still leaving.
    assert!(b.wait(Duration::from_secs(1)).is_err());
    assert_eq!(b.poll(), Status::Pending, "the WRITE ended while its payload was still being sent");
    go.send(()).unwrap();
    assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    let r = &b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::PermissionDenied, RemoteEffect::None), "{:?}", b.error(0));
    h.local[..LEN].fill(0xEE);
    assert_eq!(seen.recv_timeout(Duration::from_secs(60)).unwrap(), LEN, "the peer got other bytes than the WRITE's");
    h.fifty_reads();
}

/// A queued READ whose deadline passes before its frame can leave fails on
/// the I/O thread while a notification waits for its batch: the batch's
/// end hook queues the notification on the same connection (no lock of
/// the connection may be held then: this deadlocked the thread), the
/// notification ends at its own deadline, and the honest peer on the same
/// thread is still served.
#[test]
fn a_request_failed_before_it_left_releases_a_notification_without_deadlock() {
    let mut h = Honest::new();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let fake = h.connect_fake(move |mut s| {
        // Nothing is read until told: the big WRITE fills the socket.
        let _ = wait.recv();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let w = h.submit(fake, Op::Write, 32 << 20, Duration::from_secs(120));
    let submitted = Instant::now();
    let r = h.submit(fake, Op::Read, 4096, Duration::from_secs(1));
    std::thread::scope(|sc| {
        let req = &h.req;
        let notified = sc.spawn(move || req.notify(fake, b"after the read", Some(Duration::from_secs(4))));
        // Let the READ's deadline pass while it is still queued.
        std::thread::sleep((submitted + Duration::from_millis(1500)).saturating_duration_since(Instant::now()));
        go.send(()).unwrap();
        assert_eq!(r.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
        assert_eq!(r.results()[0].status, Status::TimedOut, "{:?}", r.error(0));
        let n = notified.join().unwrap();
        assert!(n.is_err(), "the fake source never acknowledges a notification");
    });
    h.fifty_reads();
    drop(w);
}

/// A READ answer whose 1 MiB payload stops after 100 KB: while it waits
/// for the rest (woken only once a good part is there), the request still
/// ends TIMED_OUT at its deadline, and the honest peer on the same thread
/// is served meanwhile.
#[test]
fn a_payload_that_stops_midway_ends_at_the_deadline() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag, status: Status::Ok }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + (1 << 20)) as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        s.write_all(&vec![7u8; 100_000]).unwrap();
        let _ = rx.recv();
    });
    let t0 = Instant::now();
    // Into the second half of the local buffer (the honest READs use its
    // first 64 KiB).
    let r = Request {
        op: Op::Read,
        local_addr: h.local.as_ptr() as u64 + (32 << 20),
        remote_addr: h.remote.as_ptr() as u64,
        len: 1 << 20,
    };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(3)) };
    let b = h.req.submit(fake, &[r], opts).unwrap();
    h.fifty_reads();
    assert!(t0.elapsed() < Duration::from_secs(3), "the honest peer waited for the stalled one");
    assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    assert_eq!(b.results()[0].status, Status::TimedOut, "{:?}", b.error(0));
    drop(tx);
}

#[test]
fn a_revoke_flood_runs_one_give_back_at_a_time() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = h.connect_fake(move |mut s| {
        let flood: Vec<u8> = (0..2000).flat_map(|_| FrameHeader::encode(MsgKind::Revoke, 0)).collect();
        s.write_all(&flood).unwrap();
        let _ = rx.recv();
    });
    // No two passes of this peer ever run at once: the engine counts a pass that starts
    // while another runs (a thread per revoke would). Sampling threads by
    // name instead cannot tell a pass from a thread that finished its pass
    // and is still exiting, nor from other tests' engines. The folding
    // itself is proven deterministically in sync/single_runner.rs.
    common::eventually("2000 revokes received", || h.req.stats().events.revokes_received == 2000);
    // A pass is due for the last revoke once it is counted: wait for it.
    common::eventually("a give-back pass ran", || h.req.stats().events.revoke_passes >= 1);
    h.fifty_reads();
    assert!(h.req.peer_transports(fake).unwrap().contains(&TransportKind::Tcp));
    let passes = h.req.stats().events.revoke_passes;
    // 2000 frames read in a burst or two fold into a handful of passes; a
    // thread per revoke runs exactly 2000.
    assert!((1..2000).contains(&passes), "{passes} passes for 2000 revokes");
    assert_eq!(h.req.stats().events.revoke_passes_overlapping, 0, "two give-back passes of one peer ran at once");
    drop(tx);
}

/// An answer that comes after its READ failed at its deadline is read and
/// dropped: none of its bytes land, the engine's stats count it (exactly 1
/// in `answers_dropped`, so an operator sees late answers from a slow
/// peer), and the connection stays in step: the next READ on it is served
/// with exactly its bytes. Guards the fold of the core's dropped count
/// into `events.answers_dropped` in `transport/tcp/requester.rs`'s
/// `outputs` (without it the count stayed 0).
#[test]
fn a_late_answer_is_dropped_counted_and_the_connection_stays_in_step() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let answer = |s: &mut TcpStream, tag: u64, fill: u8| {
        let fixed = DataResponse { tag, status: Status::Ok }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + 4096) as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        s.write_all(&[fill; 4096]).unwrap();
    };
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        // Answered only once the requester has failed the READ.
        rx.recv().unwrap();
        answer(&mut s, tag, 0x77);
        let tag = read_request(&mut s);
        answer(&mut s, tag, 0x55);
        let _ = rx.recv();
    });
    h.local[..4096].fill(0xee);
    let b = h.submit(fake, Op::Read, 4096, Duration::from_secs(2));
    assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    assert_eq!(b.results()[0].status, Status::TimedOut, "{:?}", b.error(0));
    assert_eq!(h.req.stats().events.answers_dropped, 0);
    tx.send(()).unwrap();
    // The late answer comes before this one's on the same connection.
    let r = Request {
        op: Op::Read,
        local_addr: h.local.as_ptr() as u64 + (1 << 20),
        remote_addr: h.remote.as_ptr() as u64,
        len: 4096,
    };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(60)) };
    h.req.submit(fake, &[r], opts).unwrap().wait(Duration::from_secs(60)).unwrap();
    assert!(h.local[1 << 20..(1 << 20) + 4096].iter().all(|b| *b == 0x55), "the next READ's bytes");
    assert!(h.local[..4096].iter().all(|b| *b == 0xee), "the late answer's bytes landed");
    assert_eq!(h.req.stats().events.answers_dropped, 1);
    drop(tx);
}

/// What a fake source saw of one request frame: its kind, remote range and
/// (for a WRITE) the FNV-1a of its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    write: bool,
    addr: u64,
    len: u64,
    fnv: u64,
}

/// A source that reads nothing until told, then serves every READ (from
/// pattern 9 at `base`) and WRITE (accepted) it is sent, recording each in
/// `seen`, until the requester goes.
fn stalled_then_serving(
    base: u64,
    go: std::sync::mpsc::Receiver<()>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
) -> impl FnOnce(TcpStream) + Send + 'static {
    use orbite::control::frame::FRAME_HEADER_LEN;
    use orbite::control::message::{DataRequest, DATA_REQUEST_LEN, DATA_RESPONSE_LEN};
    move |mut s| {
        let _ = go.recv();
        loop {
            let mut h = [0u8; FRAME_HEADER_LEN];
            if s.read_exact(&mut h).is_err() {
                return;
            }
            let h = FrameHeader::decode(&h).unwrap();
            let mut body = vec![0u8; h.body_len as usize];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            let write = match h.kind {
                MsgKind::ReadRequest => false,
                MsgKind::WriteRequest => true,
                _ => continue,
            };
            let r = DataRequest::decode(body[..DATA_REQUEST_LEN].try_into().unwrap()).unwrap();
            let answer = DataResponse { tag: r.tag, status: Status::Ok }.encode();
            let sent = if write {
                seen.lock().unwrap().push(Seen {
                    write,
                    addr: r.addr,
                    len: r.len,
                    fnv: common::fnv(&body[DATA_REQUEST_LEN..]),
                });
                s.write_all(&FrameHeader::encode(MsgKind::WriteResponse, DATA_RESPONSE_LEN as u32))
                    .and_then(|()| s.write_all(&answer))
            } else {
                seen.lock().unwrap().push(Seen { write, addr: r.addr, len: r.len, fnv: 0 });
                let data: Vec<u8> = (r.addr - base..r.addr - base + r.len).map(|i| common::pattern(9, i)).collect();
                s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (DATA_RESPONSE_LEN + data.len()) as u32))
                    .and_then(|()| s.write_all(&answer))
                    .and_then(|()| s.write_all(&data))
            };
            if sent.is_err() {
                return;
            }
        }
    }
}

/// `Batch::cancel_request` on requests still queued behind a source that
/// does not read (64 WRITEs of 1 MiB: the socket holds a few, the rest wait
/// unstarted): exactly the request asked ends `Cancelled` with remote effect
/// None and never reaches the source; every sibling, in its batch and in
/// the batches behind it, succeeds with exactly its bytes. A coalesced READ
/// run with one request asked moves whole; one whose every request was
/// asked is refused whole.
#[test]
fn cancelling_one_queued_request_ends_it_alone() {
    const MIB: usize = 1 << 20;
    const WRITES: usize = 64;
    const CUT: usize = 62;
    let mut h = Honest::new();
    for k in 0..WRITES {
        h.local[k * MIB..(k + 1) * MIB].copy_from_slice(&pattern_vec(100 + k as u64, MIB));
    }
    let dst = vec![0u8; 128 << 10];
    h.req.register_memory(dst.as_ptr() as u64, dst.len() as u64, Access::READ_WRITE).unwrap();
    let base = h.remote.as_ptr() as u64;
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let fake = h.connect_fake(stalled_then_serving(base, wait, seen.clone()));
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(60)) };
    let req = |op, local: u64, remote: u64, len: u64| Request { op, local_addr: local, remote_addr: remote, len };

    // 64 WRITEs of 1 MiB, each from its own slice of local onto the remote region.
    let writes: Vec<Request> =
        (0..WRITES).map(|k| req(Op::Write, h.local.as_ptr() as u64 + (k * MIB) as u64, base, MIB as u64)).collect();
    let w = h.req.submit(fake, &writes, opts).unwrap();
    // Behind them: 8 READs of 4 KiB with gaps between them (8 units) ...
    let d = dst.as_ptr() as u64;
    let gapped: Vec<Request> = (0..8u64).map(|k| req(Op::Read, d + k * 8192, base + k * 8192, 4096)).collect();
    let a = h.req.submit(fake, &gapped, opts).unwrap();
    // ... 4 contiguous ones (one coalesced unit of 16 KiB) ...
    let run: Vec<Request> =
        (0..4u64).map(|k| req(Op::Read, d + 65536 + k * 4096, base + 100_000 + k * 4096, 4096)).collect();
    let b = h.req.submit(fake, &run, opts).unwrap();
    // ... and 2 contiguous ones, both to be cancelled.
    let pair: Vec<Request> =
        (0..2u64).map(|k| req(Op::Read, d + 98304 + k * 4096, base + 200_000 + k * 4096, 4096)).collect();
    let c = h.req.submit(fake, &pair, opts).unwrap();
    assert_eq!(w.poll(), Status::Pending, "the source reads nothing yet");

    w.cancel_request(CUT).unwrap();
    a.cancel_request(5).unwrap();
    b.cancel_request(1).unwrap();
    c.cancel_request(0).unwrap();
    c.cancel_request(1).unwrap();
    let e = w.cancel_request(WRITES).unwrap_err();
    assert_eq!(e.status(), Status::OutOfRange);
    assert!(e.message().contains("request index 64: the batch holds 64 requests"), "{e}");
    drop(go);

    let long = Duration::from_secs(60);
    let cancelled = RequestResult { status: Status::Cancelled, remote_effect: RemoteEffect::None };
    assert_eq!(w.wait(long).unwrap_err().status(), Status::TransferFailed);
    for (k, r) in w.results().iter().enumerate() {
        if k == CUT {
            assert_eq!(*r, cancelled, "{:?}", w.error(k));
        } else {
            assert_eq!(*r, RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied }, "write {k}");
        }
    }
    assert_eq!(a.wait(long).unwrap_err().status(), Status::TransferFailed);
    for (k, r) in a.results().iter().enumerate() {
        let got = &dst[k * 8192..k * 8192 + 4096];
        if k == 5 {
            assert_eq!(*r, cancelled, "{:?}", a.error(k));
            assert!(got.iter().all(|&x| x == 0), "the cancelled READ wrote nothing");
        } else {
            assert_eq!(r.status, Status::Ok, "read {k}: {:?}", a.error(k));
            assert!(got == &h.remote[k * 8192..k * 8192 + 4096], "read {k}'s bytes");
        }
    }
    b.wait(long).unwrap();
    assert!(dst[65536..81920] == h.remote[100_000..100_000 + 16384], "the coalesced run's bytes");
    assert_eq!(c.wait(long).unwrap_err().status(), Status::TransferFailed);
    assert_eq!(c.results(), vec![cancelled; 2]);
    assert!(dst[98304..106496].iter().all(|&x| x == 0));

    // What reached the source: every WRITE but the cancelled one, with its
    // bytes; the gapped READs but the cancelled one; the run as one frame.
    let mut got = seen.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<Seen> = (0..WRITES)
        .filter(|&k| k != CUT)
        .map(|k| Seen { write: true, addr: base, len: MIB as u64, fnv: common::fnv(&h.local[k * MIB..(k + 1) * MIB]) })
        .chain((0..8u64).filter(|&k| k != 5).map(|k| Seen { write: false, addr: base + k * 8192, len: 4096, fnv: 0 }))
        .chain([Seen { write: false, addr: base + 100_000, len: 16384, fnv: 0 }])
        .collect();
    want.sort();
    assert_eq!(got, want);
    h.fifty_reads();
}

/// A source that dies in the middle of a coalesced WRITE run (64 WRITEs of
/// 1 MiB that follow each other on both sides: one frame): it reads the
/// frame and 1 MiB + 1 byte of its payload, then closes with the rest
/// unread. Each request says what it may have done: the two whose bytes
/// the source read, and those the kernel's buffers took, UNKNOWN; every
/// later one NONE (nothing of it left), never an UNKNOWN after a NONE.
/// Guards `BatchShared::complete_run` splitting the unit's outcome by the
/// bytes that left (without it: 64 UNKNOWN) and `TcpExecutor::run` coalescing
/// WRITEs (63 coalesced).
#[test]
fn a_source_dying_mid_write_run_leaves_the_rest_of_the_run_none() {
    const MIB: u64 = 1 << 20;
    let src = Engine::from_json("").unwrap();
    let remote = vec![0u8; 64 << 20];
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ_WRITE).unwrap();
    let req = Engine::from_json("").unwrap();
    let local = pattern_vec(3, 64 << 20);
    req.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ).unwrap();
    let fake = common::connect_fake_source(&req, &src.endpoint(), |mut s| {
        read_request(&mut s);
        let mut got = vec![0u8; MIB as usize + 1];
        s.read_exact(&mut got).unwrap();
    });
    let reqs: Vec<Request> = (0..64u64)
        .map(|i| Request {
            op: Op::Write,
            local_addr: local.as_ptr() as u64 + i * MIB,
            remote_addr: remote.as_ptr() as u64 + i * MIB,
            len: MIB,
        })
        .collect();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(60)) };
    let b = req.submit(fake, &reqs, opts).unwrap();
    let _ = b.wait(Duration::from_secs(60));
    let r = b.results();
    assert!(r.iter().all(|x| !matches!(x.status, Status::Ok | Status::Pending)), "{r:?}");
    let unknown = r.iter().take_while(|x| x.remote_effect == RemoteEffect::Unknown).count();
    assert!(r[unknown..].iter().all(|x| x.remote_effect == RemoteEffect::None), "{r:?}");
    // Two were read; the kernel holds a few MiB at most on loopback.
    assert!((2..=32).contains(&unknown), "{unknown} UNKNOWN: {r:?}");
    assert_eq!(req.stats().transports["tcp"].requests_coalesced, 63);
}

/// A TCP WRITE that times out waiting for the in-flight budget before
/// any of its bytes were queued certainly did not happen: TIMED_OUT with
/// remote effect NONE, so a caller may retry it. One whose FIRST piece
/// was queued and whose second timed out waiting may have moved bytes:
/// UNKNOWN. `max_inflight_bytes` 2 MiB, pieces of 1 MiB; a fake source
/// that reads one request and never answers holds the WRITEs' budget. Guards `let uncertain = budget && k > 0;` in
/// `tcp/executor.rs` (with `budget` alone the never-sent WRITE is UNKNOWN).
#[test]
fn a_write_that_timed_out_waiting_for_the_budget_before_leaving_is_none() {
    const MIB: u64 = 1 << 20;
    let src = Engine::from_json("").unwrap();
    let remote = vec![0u8; 4 << 20];
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ_WRITE).unwrap();
    let req = Engine::from_json(r#"{"max_inflight_bytes": 2097152, "max_transfer_bytes": 1048576}"#).unwrap();
    let local = pattern_vec(4, 4 << 20);
    req.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = common::connect_fake_source(&req, &src.endpoint(), move |mut s| {
        read_request(&mut s);
        let _ = rx.recv();
    });
    let write = |len: u64, timeout: Duration| {
        let r = Request { op: Op::Write, local_addr: local.as_ptr() as u64, remote_addr: remote.as_ptr() as u64, len };
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(timeout) };
        req.submit(fake, &[r], opts).unwrap()
    };
    let outcome = |b: &Batch| {
        assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
        (b.results()[0].status, b.results()[0].remote_effect, b.error(0).map(|e| e.to_string()))
    };
    // Holds 1 MiB of the 2 until the source answers (never).
    let first = write(MIB, Duration::from_secs(60));
    // 2 pieces: the first fits and is queued, the second waits and times out.
    let split = write(2 * MIB, Duration::from_millis(300));
    let (status, effect, why) = outcome(&split);
    assert_eq!((status, effect), (Status::TimedOut, RemoteEffect::Unknown), "{why:?}");
    // Another 1 MiB WRITE fills the budget (the split one's piece went
    // with it): the next WRITE's first (only) piece waits, times out, and
    // never left.
    let filler = write(MIB, Duration::from_secs(60));
    let never = write(MIB, Duration::from_millis(300));
    let (status, effect, why) = outcome(&never);
    assert_eq!((status, effect), (Status::TimedOut, RemoteEffect::None), "{why:?}");
    assert!(why.as_deref().is_some_and(|w| w.contains("no admission")), "{why:?}");
    assert_eq!((first.poll(), filler.poll()), (Status::Pending, Status::Pending));
    drop(tx);
    let _ = (first.wait(Duration::from_secs(60)), filler.wait(Duration::from_secs(60)));
    req.close(Some(Duration::from_secs(60))).unwrap();
}

/// A source answering a READ with a ReadResponse of 15 bytes, one short of
/// its fixed part (then more bytes, as the next frame would be): the READ
/// fails PROTOCOL_ERROR naming the short frame, nothing lands, no thread
/// panics and the honest peer still serves (read as a fixed part, the
/// answer took a byte of the next frame and its payload length
/// underflowed). Guards `transport/tcp/proto/requester/receive.rs`
/// `if (h.body_len as usize) < DATA_RESPONSE_LEN {`.
#[test]
fn a_data_answer_shorter_than_its_fixed_part_is_refused() {
    let mut h = Honest::new();
    h.local[..4096].fill(0xee);
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag, status: Status::Ok }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() - 1) as u32)).unwrap();
        s.write_all(&fixed[..fixed.len() - 1]).unwrap();
        let _ = s.write_all(&[0x5a; 4096 + 64]);
        let _ = s.read_to_end(&mut Vec::new());
    });
    h.read_fails_landing_nothing(fake, "ReadResponse of 15 bytes is too short");
    assert_eq!(h.req.stats().peers_alive, 1);
}

/// A source answering a READ with status PENDING (not an outcome): the
/// READ fails PROTOCOL_ERROR naming the status and the lying connection
/// ends (decoded, PENDING became the caller's INVALID_ARGUMENT on a
/// connection kept open). Guards `control/message.rs` DataResponse::decode
/// `.filter(|s| *s != Status::Pending)`.
#[test]
fn a_data_answer_with_status_pending_ends_its_connection() {
    let mut h = Honest::new();
    h.local[..4096].fill(0xee);
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let fixed = DataResponse { tag, status: Status::Pending }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, fixed.len() as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    h.read_fails_landing_nothing(fake, "response carries unknown status 1");
    assert_eq!(h.req.stats().peers_alive, 1, "the lying connection ended");
}

/// A source that, with a READ pending, sends a Describe naming the next
/// engine epoch (another incarnation on the same connection), then answers
/// the READ honestly: the READ fails PROTOCOL_ERROR naming the epoch,
/// nothing lands and the connection ends (taken as the peer's Describe,
/// the requester would hold another engine's identity on this
/// connection). Guards `transport/tcp/proto/requester/receive.rs`
/// `if d.identity.engine_epoch != self.describe.identity.engine_epoch {`.
#[test]
fn a_describe_naming_a_later_engine_epoch_ends_the_connection() {
    let mut h = Honest::new();
    h.local[..4096].fill(0xee);
    let mut d = describe_of(&h.src.endpoint());
    d.capabilities = TransportKind::Tcp.capability_bit();
    d.ipc_name = String::new();
    let mut later = d.clone();
    later.identity.engine_epoch += 1;
    let fake = common::connect_fake_source_as(&h.req, &d, move |mut s| {
        let tag = read_request(&mut s);
        let body = later.encode();
        s.write_all(&FrameHeader::encode(MsgKind::Describe, body.len() as u32)).unwrap();
        s.write_all(&body).unwrap();
        let fixed = DataResponse { tag, status: Status::Ok }.encode();
        let _ = s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + 4096) as u32));
        let _ = s.write_all(&fixed);
        let _ = s.write_all(&[0x5a; 4096]);
        let _ = s.read_to_end(&mut Vec::new());
    });
    h.read_fails_landing_nothing(fake, "changed its engine epoch");
    assert_eq!(h.req.stats().peers_alive, 1, "the lying connection ended");
}

/// `connect` to a listener whose kernel accepts the connection but whose
/// process never answers (a frozen source: the backlog completes the TCP
/// handshake) ends TIMED_OUT at its timeout, naming the handshake, well
/// under the 60 s the test waits for it (before, it blocked the caller
/// for ever). Guards `transport/tcp/handshake.rs` connect's tick
/// `return Err(Error::TimedOut(format!("{endpoint} did not complete the
/// handshake in time")));`.
#[test]
fn connecting_to_a_source_that_never_answers_times_out() {
    let req = Engine::from_json("").unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let (done, rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = done.send(req.connect(&ep, Some(Duration::from_secs(1))));
    });
    let (s, _) = l.accept().unwrap();
    let got = rx.recv_timeout(Duration::from_secs(60)).expect("connect never returned");
    let e = got.expect_err("a connect to a silent source");
    assert_eq!(e.status(), Status::TimedOut, "{e}");
    assert!(e.message().contains("did not complete the handshake"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}", t0.elapsed());
    drop(s);
}

/// `connect` to a listener that reads the requester's Describe and then
/// answers `answer` (raw bytes) and ends its side: the error.
fn handshake_answered(answer: Vec<u8>) -> Error {
    let req = Engine::from_json("").unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut h = [0u8; 16];
        s.read_exact(&mut h).unwrap();
        let h = FrameHeader::decode(&h).unwrap();
        assert_eq!(h.kind, MsgKind::Describe);
        s.read_exact(&mut vec![0u8; h.body_len as usize]).unwrap();
        s.write_all(&answer).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let e = req.connect(&ep, Some(Duration::from_secs(60))).map(|_| ()).expect_err("a connect the source refused");
    drop(req);
    fake.join().unwrap();
    e
}

/// A source that answers the handshake's Describe with another frame
/// (a Revoke), with an Error frame, or by closing: `connect` fails with
/// PROTOCOL_ERROR naming the frame, with the source's own status and text
/// (RESOURCE_EXHAUSTED: try later, not a broken peer), UNAVAILABLE
/// naming the handshake, or (half a header, then the end) UNAVAILABLE
/// naming the cut frame. Guards `transport/tcp/handshake.rs` `connect`:
/// `other => return Err(Error::Protocol(format!("{endpoint} answered the
/// handshake with {other:?}")))`, the Error arm's
/// `Error::from_status(st, ...)` and the `HeaderRead::Eof` arm, and
/// `control/io.rs` `read_full`'s `Ok(0) if done == 0 && eof_ok`.
#[test]
fn a_source_answering_the_handshake_with_no_describe_is_refused_naming_why() {
    let e = handshake_answered(FrameHeader::encode(MsgKind::Revoke, 0).to_vec());
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(e.message().ends_with("answered the handshake with Revoke"), "{e}");

    let body = orbite::control::message::encode_error(Status::ResourceExhausted, "no slot left");
    let mut refusal = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
    refusal.extend(body);
    let e = handshake_answered(refusal);
    assert_eq!(e.status(), Status::ResourceExhausted, "{e}");
    assert!(e.message().ends_with("refused the connection: no slot left"), "{e}");

    let e = handshake_answered(Vec::new());
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().ends_with("closed the connection during the handshake"), "{e}");

    // Half a header, then the end: cut mid-frame, not an orderly close.
    let e = handshake_answered(FrameHeader::encode(MsgKind::Describe, 64)[..8].to_vec());
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().ends_with("peer closed the connection mid-frame"), "{e}");
}

/// A source that answers a READ after its deadline, and then lies in that
/// late answer (4000 bytes for 4096, on one connection) or answers it a
/// second time (on another): the READ already failed TIMED_OUT, nothing
/// lands, and the lie ends the connection naming it (dropped unchecked,
/// the late answer's bytes would be read as the next frames, and a second
/// answer would be taken for nobody's). Guards
/// `transport/tcp/proto/requester/receive.rs` `abandoned_answer`:
/// `(true, true, Op::Read) => rest == len` and the late tag's
/// `self.abandoned.remove(&resp.tag)`.
#[test]
fn a_late_answer_that_lies_ends_its_connection() {
    let mut h = Honest::new();
    for (got, twice, why) in [(4000usize, false, "does not match its request"), (4096, true, "for unknown tag")] {
        h.local[..4096].fill(0xee);
        let (late, go) = std::sync::mpsc::channel::<()>();
        let fake = h.connect_fake(move |mut s| {
            let tag = read_request(&mut s);
            let _ = go.recv();
            let fixed = DataResponse { tag, status: Status::Ok }.encode();
            for _ in 0..if twice { 2 } else { 1 } {
                let _ = s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + got) as u32));
                let _ = s.write_all(&fixed);
                let _ = s.write_all(&vec![0x5a; got]);
            }
            let _ = s.read_to_end(&mut Vec::new());
        });
        let b = h.submit(fake, Op::Read, 4096, Duration::from_secs(1));
        assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
        assert_eq!(b.results()[0].status, Status::TimedOut, "{:?}", b.error(0));
        late.send(()).unwrap();
        let r = Request {
            op: Op::Read,
            local_addr: h.local.as_ptr() as u64,
            remote_addr: h.remote.as_ptr() as u64,
            len: 1,
        };
        // A READ after the lie: refused at submit, or failed with the
        // connection's end (kept, it would wait for its deadline).
        let (st, m) = match h.req.submit(fake, &[r], SubmitOptions { timeout: Some(Duration::from_secs(30)), ..tcp() })
        {
            Err(e) => (e.status(), e.message().to_string()),
            Ok(b) => {
                let _ = b.wait(Duration::from_secs(60));
                (b.results()[0].status, b.error(0).map(|e| e.message().to_string()).unwrap_or_default())
            }
        };
        assert!(matches!(st, Status::Unavailable | Status::ProtocolError), "{st:?}: {m}");
        assert!(m.contains(why), "{st:?}: {m}");
        assert!(h.local[..4096].iter().all(|b| *b == 0xee), "the late answer landed");
    }
    h.fifty_reads();
    assert_eq!(h.req.stats().peers_alive, 1);
}

fn tcp() -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: None }
}

/// A Describe frame of `d`.
fn describe_frame(d: &orbite::control::message::Describe) -> Vec<u8> {
    let body = d.encode();
    let mut f = FrameHeader::encode(MsgKind::Describe, body.len() as u32).to_vec();
    f.extend(body);
    f
}

/// A source whose handshake Describe breaks one of its bounds: more than
/// MAX_REGIONS regions, engine epoch 0, an endpoint past MAX_ENDPOINT
/// bytes (a valid IP:port, its port zero-padded) or an IPC name past
/// MAX_IPC_NAME bytes: `connect` fails PROTOCOL_ERROR naming the bound,
/// and the requester keeps no such peer. Guards `control/message.rs`
/// `Describe::decode`'s `if n > MAX_REGIONS {` and `if engine_epoch == 0
/// {`, and the length clauses of `check_endpoint` and `check_ipc_name`.
#[test]
fn a_describe_past_its_bounds_is_refused_at_the_handshake() {
    use orbite::control::message::{MAX_ENDPOINT, MAX_IPC_NAME, MAX_REGIONS};
    let honest = orbite::control::message::Describe {
        identity: orbite::control::Identity::fresh().unwrap(),
        capabilities: TransportKind::Tcp.capability_bit(),
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:9".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    let region = orbite::control::message::RegionInfo {
        id: 1,
        epoch: 1,
        addr: 1 << 30,
        len: 4096,
        access: Access::READ,
        kind: MemoryKind::Host,
    };
    let mut many = honest.clone();
    many.regions =
        (1..=MAX_REGIONS as u64 + 1).map(|id| orbite::control::message::RegionInfo { id, ..region }).collect();
    let mut epoch0 = honest.clone();
    epoch0.identity.engine_epoch = 0;
    let mut long_endpoint = honest.clone();
    long_endpoint.endpoint = format!("127.0.0.1:{:0>width$}", 9, width = MAX_ENDPOINT - 9);
    assert!(long_endpoint.endpoint.parse::<std::net::SocketAddr>().is_ok());
    let mut long_name = honest.clone();
    long_name.ipc_name = "n".repeat(MAX_IPC_NAME + 1);
    for (d, why) in [
        (many, format!("Describe publishes {} regions (limit {MAX_REGIONS})", MAX_REGIONS + 1)),
        (epoch0, "Describe carries engine epoch 0".to_string()),
        (long_endpoint, format!("is not IP:port of at most {MAX_ENDPOINT} bytes")),
        (long_name, "IPC name".to_string()),
    ] {
        let e = handshake_answered(describe_frame(&d));
        assert_eq!(e.status(), Status::ProtocolError, "{why}: {e}");
        assert!(e.message().contains(&why), "{why}: {e}");
    }
}

/// A source answering a READ with a nonzero reserved field in the
/// answer's fixed part: the READ fails PROTOCOL_ERROR naming the field,
/// nothing lands, and the lying connection alone ends. Guards
/// `control/message.rs` `DataResponse::decode`'s
/// `if b[12..16] != [0, 0, 0, 0] {`.
#[test]
fn a_data_answer_with_a_reserved_field_set_is_refused() {
    let mut h = Honest::new();
    h.local[..4096].fill(0xee);
    let fake = h.connect_fake(move |mut s| {
        let tag = read_request(&mut s);
        let mut fixed = DataResponse { tag, status: Status::Ok }.encode();
        fixed[15] = 1;
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + 4096) as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        let _ = s.write_all(&[0x5a; 4096]);
        let _ = s.read_to_end(&mut Vec::new());
    });
    h.read_fails_landing_nothing(fake, "response reserved field is not 0");
    assert_eq!(h.req.stats().peers_alive, 1);
}

/// A source that, with a READ pending, announces a control frame (a
/// Describe) or a WRITE's answer one byte past MAX_CONTROL_BODY: the
/// request fails PROTOCOL_ERROR from the header alone, naming the limit,
/// nothing lands, and the requester never gathers (or waits for) the
/// announced body. Guards `control/frame.rs` `MsgKind::max_body`'s
/// `_ => MAX_CONTROL_BODY as u64` and its `WriteRequest | ReadResponse`
/// arm (a WriteResponse is bounded as a control frame).
#[test]
fn an_oversize_control_frame_from_a_source_is_refused_from_its_header() {
    let mut h = Honest::new();
    let over = orbite::control::frame::MAX_CONTROL_BODY + 1;
    for (op, kind) in [(Op::Read, MsgKind::Describe), (Op::Write, MsgKind::WriteResponse)] {
        h.local[..4096].fill(0xee);
        let fake = h.connect_fake(move |mut s| {
            let tag = read_request(&mut s);
            if op == Op::Write {
                s.read_exact(&mut [0u8; 4096]).unwrap();
            }
            let _ = s.write_all(&FrameHeader::encode(kind, over));
            let _ = s.write_all(&DataResponse { tag, status: Status::PermissionDenied }.encode());
            let _ = s.read_to_end(&mut Vec::new());
        });
        let b = h.submit(fake, op, 4096, Duration::from_secs(30));
        assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
        assert_eq!(b.results()[0].status, Status::ProtocolError, "{kind:?}: {:?}", b.error(0));
        let m = b.error(0).unwrap().message().to_string();
        assert!(m.contains(&format!("{kind:?} frame of {over} bytes exceeds the limit of {} bytes", over - 1)), "{m}");
        assert!(h.local[..4096].iter().all(|b| *b == 0xee));
    }
    h.fifty_reads();
    assert_eq!(h.req.stats().peers_alive, 1);
}

/// `close_requester` while a silent source holds a READ: it times out and
/// leaves the requester side fenced, its peers still known. A submission
/// to either peer is then refused UNAVAILABLE naming the requester side
/// (no batch), while the same engine's source side still serves a peer
/// of its own; once the silent source goes, the close completes. Guards
/// `engine/submit.rs` `submit_inner`'s
/// `if !self.inner.requester_gate.is_open() {` (the source side's gate,
/// open, would let the submission through).
#[test]
fn a_fenced_requester_side_refuses_submissions_while_its_source_side_serves() {
    let mut h = Honest::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let silent = h.connect_fake(move |mut s| {
        read_request(&mut s);
        let _ = rx.recv();
    });
    let held = h.submit(silent, Op::Read, 4096, Duration::from_secs(120));
    let e = h.req.close_requester(Some(Duration::from_millis(200))).unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "{e}");
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(60)) };
    let r =
        Request { op: Op::Read, local_addr: h.local.as_ptr() as u64, remote_addr: h.remote.as_ptr() as u64, len: 16 };
    for peer in [h.peer, silent] {
        let e = h.req.submit(peer, &[r], opts).err().expect("a submission past close_requester");
        assert_eq!((e.status(), e.message()), (Status::Unavailable, "the requester side is closed"), "peer {peer}");
    }
    // Its source side still serves: another engine reads its memory.
    h.local[..4096].copy_from_slice(&pattern_vec(5, 4096));
    let other = Engine::from_json("").unwrap();
    let got = vec![0u8; 4096];
    other.register_memory(got.as_ptr() as u64, 4096, Access::READ_WRITE).unwrap();
    let p = other.connect(&h.req.endpoint(), None).unwrap();
    let r = Request { op: Op::Read, local_addr: got.as_ptr() as u64, remote_addr: h.local.as_ptr() as u64, len: 4096 };
    other.submit(p, &[r], opts).unwrap().wait(Duration::from_secs(60)).unwrap();
    assert!(got == h.local[..4096], "the source side served other bytes");
    other.close(Some(Duration::from_secs(60))).unwrap();
    // The silent source goes: its READ fails, and the close completes.
    drop(tx);
    assert_eq!(held.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    h.req.close_requester(Some(Duration::from_secs(60))).unwrap();
}

/// A batch of two READs to a fake source that fails the first at once
/// (PERMISSION_DENIED) and holds the second's answer: a notification made
/// meanwhile waits for the second too, so it times out unsent (counted
/// `not_sent`, never on the wire); once the second READ landed its exact
/// bytes, the next notification is the first the source reads. Guards
/// `q.deps.iter().all(|b| b.requests_ended())` in `transport/tcp/outbox.rs`'s
/// pump (round 8 H3: with `|| b.first_error().is_some()` the failed request
/// released the notification while its sibling was still landing).
#[test]
fn a_notification_waits_for_every_request_of_a_batch_with_one_failed() {
    use orbite::control::frame::FRAME_HEADER_LEN;
    use orbite::control::message::{DataRequest, DATA_REQUEST_LEN, DATA_RESPONSE_LEN};
    use orbite::control::notify_frame::{encode_ack, Notify};
    let h = Honest::new();
    let base = h.remote.as_ptr() as u64;
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (first_note, noted) = std::sync::mpsc::channel::<Vec<u8>>();
    let fake = h.connect_fake(move |mut s| {
        let frame = |s: &mut TcpStream| {
            let mut hd = [0u8; FRAME_HEADER_LEN];
            s.read_exact(&mut hd).unwrap();
            let hd = FrameHeader::decode(&hd).unwrap();
            let mut body = vec![0u8; hd.body_len as usize];
            s.read_exact(&mut body).unwrap();
            (hd.kind, body)
        };
        let request = |body: &[u8]| DataRequest::decode(body[..DATA_REQUEST_LEN].try_into().unwrap()).unwrap();
        let first = request(&frame(&mut s).1);
        let second = request(&frame(&mut s).1);
        let refused = DataResponse { tag: first.tag, status: Status::PermissionDenied }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, DATA_RESPONSE_LEN as u32)).unwrap();
        s.write_all(&refused).unwrap();
        let _ = wait.recv();
        let data: Vec<u8> =
            (second.addr - base..second.addr - base + second.len).map(|i| common::pattern(9, i)).collect();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (DATA_RESPONSE_LEN + data.len()) as u32)).unwrap();
        s.write_all(&DataResponse { tag: second.tag, status: Status::Ok }.encode()).unwrap();
        s.write_all(&data).unwrap();
        // The first notification on the wire (any other frame skipped).
        let note = loop {
            let (kind, body) = frame(&mut s);
            if kind == MsgKind::Notify {
                break Notify::decode(&body).unwrap();
            }
        };
        let ack = encode_ack(note.tag, &Ok(()));
        s.write_all(&FrameHeader::encode(MsgKind::NotifyAck, ack.len() as u32)).unwrap();
        s.write_all(&ack).unwrap();
        first_note.send(note.msg).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let local = h.local.as_ptr() as u64;
    // Apart on both sides: two requests, never one coalesced.
    let reqs = [
        Request { op: Op::Read, local_addr: local, remote_addr: base, len: 4096 },
        Request { op: Op::Read, local_addr: local + (3 << 20), remote_addr: base + (1 << 20), len: 4096 },
    ];
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(120)) };
    let b = h.req.submit(fake, &reqs, opts).unwrap();
    common::eventually("the first READ failed", || b.results()[0].status == Status::PermissionDenied);
    assert_eq!(b.results()[1].status, Status::Pending);
    let e = h.req.notify(fake, b"early", Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "{e}");
    assert!(e.message().contains("requests submitted before it had not ended"), "{e}");
    let n = h.req.stats().notifications;
    assert_eq!((n.sent, n.not_sent), (0, 1));
    go.send(()).unwrap();
    assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    let r = b.results();
    assert_eq!((r[0].status, r[1].status), (Status::PermissionDenied, Status::Ok), "{:?}", b.error(1));
    let landed = (3 << 20)..(3 << 20) + 4096;
    assert!(h.local[landed] == h.remote[1 << 20..(1 << 20) + 4096], "the second READ's bytes");
    h.req.notify(fake, b"after", Some(Duration::from_secs(60))).unwrap();
    assert_eq!(noted.recv_timeout(Duration::from_secs(60)).unwrap(), b"after", "the early one reached the wire");
    let n = h.req.stats().notifications;
    assert_eq!((n.sent, n.delivered, n.not_sent), (1, 1, 1));
}
