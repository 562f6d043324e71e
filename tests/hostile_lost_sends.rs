//! Sources that break the connection while the requester is sending: the
//! requester's failed send is applied only after its turn read what the
//! socket holds (`tcp/requester.rs` `Sent::Lost`), so answers that arrived
//! before the break still land, and every request ends exactly once, with
//! a status and a remote effect that say what happened.

mod common;

use common::{pattern_vec, read_request, reset};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message::{encode_error, DataResponse, DATA_REQUEST_LEN};
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The WRITE that is being sent when the source breaks: far more than
/// loopback's buffers take.
const BIG: u64 = 64 * MIB;
/// READs answered before the break.
const READS: u64 = 32;

/// A requester, its memory and a real source whose Describe the fake
/// sources publish.
struct Setup {
    src: Engine,
    req: Engine,
    remote: Vec<u8>,
    local: Vec<u8>,
}

fn setup() -> Setup {
    let src = Engine::from_json("").unwrap();
    let remote = pattern_vec(5, BIG as usize);
    src.register_memory(remote.as_ptr() as u64, BIG, Access::READ_WRITE).unwrap();
    let req = Engine::from_json("").unwrap();
    let local = pattern_vec(6, 2 * BIG as usize);
    req.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();
    Setup { src, req, remote, local }
}

impl Setup {
    /// `READS` gapped READs of 4 KiB (remote offset i*8 KiB into local
    /// offset BIG + i*8 KiB), then one WRITE of `BIG` from local 0.
    fn requests(&self) -> Vec<Request> {
        let (l, r) = (self.local.as_ptr() as u64, self.remote.as_ptr() as u64);
        let mut v: Vec<Request> = (0..READS)
            .map(|i| Request {
                op: Op::Read,
                local_addr: l + BIG + i * 8 * KIB,
                remote_addr: r + i * 8 * KIB,
                len: 4 * KIB,
            })
            .collect();
        v.push(Request { op: Op::Write, local_addr: l, remote_addr: r, len: BIG });
        v
    }

    /// Submits `requests()` to `peer`; waits for the batch to end (well
    /// within the deadline); returns it and how often its end hook ran.
    fn run(&self, peer: u64) -> (Batch, Arc<AtomicUsize>) {
        let opts =
            SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(60)) };
        let b = self.req.submit(peer, &self.requests(), opts).unwrap();
        let ends = Arc::new(AtomicUsize::new(0));
        let e = ends.clone();
        b.on_end(move || {
            e.fetch_add(1, Ordering::SeqCst);
        });
        let t0 = Instant::now();
        assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
        assert!(t0.elapsed() < Duration::from_secs(30), "ended only after {:?}", t0.elapsed());
        (b, ends)
    }

    /// READ `i` landed the source's exact bytes.
    fn read_landed(&self, i: u64) -> bool {
        let (l, r) = (((BIG + i * 8 * KIB) as usize), (i * 8 * KIB) as usize);
        self.local[l..l + 4096] == self.remote[r..r + 4096]
    }

    /// READ `i` left its local bytes untouched.
    fn read_untouched(&self, i: u64) -> bool {
        let l = (BIG + i * 8 * KIB) as usize;
        self.local[l..l + 4096] == pattern_vec(6, 2 * BIG as usize)[l..l + 4096]
    }
}

/// Reads the next request frame: its kind and tag (a WRITE's payload is
/// left in the socket).
fn next_request(s: &mut TcpStream) -> (MsgKind, u64) {
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = FrameHeader::decode(&h).unwrap();
    let mut fixed = [0u8; DATA_REQUEST_LEN];
    s.read_exact(&mut fixed).unwrap();
    (h.kind, u64::from_le_bytes(fixed[..8].try_into().unwrap()))
}

/// A READ answer of `tag` carrying `bytes`.
fn read_answer(tag: u64, bytes: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader::encode(MsgKind::ReadResponse, (16 + bytes.len()) as u32).to_vec();
    f.extend_from_slice(&DataResponse { tag, status: Status::Ok }.encode());
    f.extend_from_slice(bytes);
    f
}

/// A source that takes every request and 1 MiB of the big WRITE's payload
/// (the requester is still sending it, blocked on a full socket), then
/// answers all the READs exactly in one write and resets the connection
/// at once: the answers and the reset arrive together, so the requester's
/// next turn finds its send failed AND the answers in its socket. The
/// READs whose answers were delivered land exactly and end OK (the
/// requester reads what the socket held before it applies its failed
/// send), the rest fail UNAVAILABLE with effect NONE; the WRITE fails with remote effect
/// UNKNOWN (part of it left); every request ends once, the end hook runs
/// once, and the requester closes promptly. Guards the deferral of
/// `Sent::Lost` to the end of the turn's reads (`if let Some(e) =
/// c.lost.take()` after `receive` in `TcpConnection::turn`: applied before
/// the reads, the answers in the socket are dropped and the READs fail).
#[test]
fn answers_that_came_before_a_reset_mid_send_still_land() {
    let s = setup();
    // The answers and the reset race the requester's turn (it may read the
    // answers before the reset lands, when the deferral does not matter):
    // five rounds, each on a fresh connection.
    for _ in 0..5 {
        reset_after_answers(&s);
    }
    s.req.close(Some(Duration::from_secs(30))).unwrap();
}

/// One round of [`answers_that_came_before_a_reset_mid_send_still_land`].
fn reset_after_answers(s: &Setup) {
    let pattern = pattern_vec(5, BIG as usize);
    let peer = common::connect_fake_source(&s.req, &s.src.endpoint(), move |mut c| {
        let mut answers = Vec::new();
        loop {
            let (kind, tag) = next_request(&mut c);
            if kind == MsgKind::WriteRequest {
                break;
            }
            assert_eq!(kind, MsgKind::ReadRequest);
            let off = (answers.len() as u64 * 8 * KIB) as usize;
            answers.push(read_answer(tag, &pattern[off..off + 4096]));
        }
        assert_eq!(answers.len() as u64, READS);
        let mut sink = vec![0u8; MIB as usize];
        c.read_exact(&mut sink).unwrap();
        c.write_all(&answers.concat()).unwrap();
        reset(c);
    });
    let (b, ends) = s.run(peer);
    let r = b.results();
    // What the source's kernel had not delivered when it reset is lost
    // with its send queue: the READs answered in time are a prefix, at
    // least the first (the requester's receive buffer takes far more than
    // one answer); the rest fail UNAVAILABLE with nothing done.
    let landed = r[..READS as usize].iter().take_while(|x| x.status == Status::Ok).count();
    assert!(landed >= 1, "no READ landed: {:?}", b.error(0));
    for (i, x) in r[..READS as usize].iter().enumerate() {
        if i < landed {
            assert_eq!(x.remote_effect, RemoteEffect::None);
            assert!(s.read_landed(i as u64), "READ {i}'s bytes");
        } else {
            assert_eq!((x.status, x.remote_effect), (Status::Unavailable, RemoteEffect::None), "READ {i}");
        }
    }
    let w = READS as usize;
    assert!(!matches!(r[w].status, Status::Ok | Status::Pending), "{r:?}");
    assert_eq!(r[w].remote_effect, RemoteEffect::Unknown, "{:?}", b.error(w));
    ended_once(&ends);
}

/// The end hook ran, and once (it may run just after `wait` saw the end).
fn ended_once(ends: &AtomicUsize) {
    common::eventually("the end hook ran", || ends.load(Ordering::SeqCst) > 0);
    assert_eq!(ends.load(Ordering::SeqCst), 1);
}

/// A source that answers the first READ with a valid Error frame, then
/// sends 1 MiB of garbage and its end while the requester is still
/// sending the WRITE. The connection ends with the source's status and
/// message (the garbage after the Error is never parsed); every READ fails
/// with effect NONE and its local bytes untouched, the WRITE with effect
/// UNKNOWN; each ends once. Guards that a peer's Error frame ends the
/// connection with its own reason, not the failed send's.
#[test]
fn an_error_frame_then_garbage_ends_every_request_once_with_its_reason() {
    let s = setup();
    let peer = common::connect_fake_source(&s.req, &s.src.endpoint(), move |mut c| {
        read_request(&mut c);
        let body = encode_error(Status::ResourceExhausted, "fake source: out of everything");
        let mut f = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
        f.extend_from_slice(&body);
        f.extend(std::iter::repeat_n(0xa5u8, MIB as usize));
        let _ = c.write_all(&f);
        let mut sink = vec![0u8; MIB as usize];
        let _ = c.read_exact(&mut sink);
        drop(c);
    });
    let (b, ends) = s.run(peer);
    let r = b.results();
    for (i, x) in r[..READS as usize].iter().enumerate() {
        assert!(!matches!(x.status, Status::Ok | Status::Pending), "READ {i}: {x:?}");
        assert_eq!(x.remote_effect, RemoteEffect::None, "READ {i}: {:?}", b.error(i));
        assert!(s.read_untouched(i as u64), "READ {i} wrote local bytes");
    }
    let w = READS as usize;
    assert!(!matches!(r[w].status, Status::Ok | Status::Pending), "{r:?}");
    assert_eq!(r[w].remote_effect, RemoteEffect::Unknown, "{:?}", b.error(w));
    let why = b.error(0).unwrap().to_string();
    assert!(why.contains("out of everything"), "{why}");
    ended_once(&ends);
    s.req.close(Some(Duration::from_secs(30))).unwrap();
}
