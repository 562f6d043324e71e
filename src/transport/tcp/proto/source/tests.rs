//! The TCP source core without sockets: a fake host (one region of
//! memory in a Vec), requests fed as bytes in any split, the answers read
//! back from what the core offers to send, time passed in.

use super::*;
use crate::control::message::DATA_RESPONSE_LEN;

const BASE: u64 = 0x10_0000;
const LEN: usize = 8 << 20;
const EPOCH: u64 = 3;

/// One registered region, `mem`, at `BASE`; counts what the core asked.
struct Host {
    mem: Vec<u8>,
    held: std::rc::Rc<()>,
    served: (u64, u64),
    failed: u64,
    describes: u64,
    refuse_notify: bool,
    /// When set, every request is refused PERMISSION_DENIED with this text.
    refusal: Option<String>,
    /// Torn WRITEs told: tag, bytes landed, why.
    torn: Vec<(u64, u64, String)>,
}

impl Host {
    fn new() -> Host {
        let mem = (0..LEN).map(|i| (i * 7 + 1) as u8).collect();
        let held = std::rc::Rc::new(());
        Host {
            mem,
            held,
            served: (0, 0),
            failed: 0,
            describes: 0,
            refuse_notify: false,
            refusal: None,
            torn: Vec::new(),
        }
    }
    /// Leases of requests still held by the core.
    fn holds(&self) -> usize {
        std::rc::Rc::strong_count(&self.held) - 1
    }
}

impl SourceHost for Host {
    type Held = std::rc::Rc<()>;
    type Admitted = String;
    fn validate(&mut self, req: &DataRequest, write: bool) -> Result<Self::Held> {
        if let Some(text) = &self.refusal {
            return Err(Error::PermissionDenied(text.clone()));
        }
        if req.region_epoch != EPOCH {
            return Err(Error::StalePeer("another epoch".into()));
        }
        if req.addr < BASE || req.addr + req.len > BASE + LEN as u64 {
            return Err(Error::OutOfRange("outside".into()));
        }
        if write && req.addr == BASE {
            return Err(Error::PermissionDenied("the first byte is read-only here".into()));
        }
        Ok(self.held.clone())
    }
    fn describe(&mut self) -> Vec<u8> {
        self.describes += 1;
        vec![0xd5; 4000]
    }
    fn admit(&mut self, n: Notify) -> Result<String> {
        if self.refuse_notify {
            return Err(Error::ResourceExhausted("full".into()));
        }
        Ok(String::from_utf8_lossy(&n.msg).into_owned())
    }
    fn notify_max(&self) -> usize {
        64
    }
    fn land(&mut self, addr: u64, bytes: &[u8]) {
        let at = (addr - BASE) as usize;
        self.mem[at..at + bytes.len()].copy_from_slice(bytes);
    }
    fn served(&mut self, ok: bool, bytes: u64) {
        if ok {
            self.served.0 += 1;
            self.served.1 += bytes;
        } else {
            self.failed += 1;
        }
    }
    fn notify_rejected(&mut self) {}
    fn torn(&mut self, req: &DataRequest, landed: u64, held: Self::Held, why: &str) {
        drop(held);
        self.torn.push((req.tag, landed, why.to_string()));
    }
}

fn limits() -> Limits {
    Limits { stall: Duration::from_secs(5), min_rate: 0 }
}

fn frame(kind: MsgKind, body: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader::encode(kind, body.len() as u32).to_vec();
    f.extend_from_slice(body);
    f
}

fn read_req(tag: u64, addr: u64, len: u64) -> Vec<u8> {
    frame(MsgKind::ReadRequest, &DataRequest { tag, region_epoch: EPOCH, addr, len }.encode())
}

fn write_req(tag: u64, addr: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = DataRequest { tag, region_epoch: EPOCH, addr, len: payload.len() as u64 }.encode().to_vec();
    body.extend_from_slice(payload);
    frame(MsgKind::WriteRequest, &body)
}

/// Sends everything the core offers, reading memory segments from the
/// host; returns the bytes and what came after (idle, close).
fn drain(c: &mut SourceCore<Host>, h: &mut Host, now: Instant) -> (Vec<u8>, AfterSend) {
    let mut out = Vec::new();
    loop {
        let (segs, skip) = c.transmit(now);
        let mut bytes = Vec::new();
        for s in &segs {
            match s {
                Segment::Bytes(b) => bytes.extend_from_slice(b),
                Segment::Memory { addr, len } => {
                    let at = (*addr - BASE) as usize;
                    bytes.extend_from_slice(&h.mem[at..at + *len as usize]);
                }
            }
        }
        let n = bytes.len() - skip;
        out.extend_from_slice(&bytes[skip..]);
        if n > 0 {
            c.sent(n, now);
        }
        match c.after_send(h) {
            AfterSend::More => continue,
            other => return (out, other),
        }
    }
}

/// Splits answers into (kind, fixed/body) frames.
fn frames(mut b: &[u8]) -> Vec<(MsgKind, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let h = FrameHeader::decode(b[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let end = FRAME_HEADER_LEN + h.body_len as usize;
        out.push((h.kind, b[FRAME_HEADER_LEN..end].to_vec()));
        b = &b[end..];
    }
    out
}

fn response(body: &[u8]) -> DataResponse {
    DataResponse::decode(body[..DATA_RESPONSE_LEN].try_into().unwrap()).unwrap()
}

#[test]
fn reads_and_writes_in_any_split_are_answered_in_order_with_their_bytes() {
    let now = Instant::now();
    let payload: Vec<u8> = (0..10_000).map(|i| (i % 13) as u8).collect();
    let mut wire = read_req(1, BASE + 100, 300);
    wire.extend(write_req(2, BASE + 5000, &payload));
    wire.extend(write_req(3, BASE, &payload[..10])); // refused: its payload is dropped
    wire.extend(read_req(4, BASE + 5000, 10_000));
    for split in [1usize, 7, 16, 33, 4096, wire.len()] {
        let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
        for piece in wire.chunks(split) {
            c.received(piece, now, &mut h).unwrap();
        }
        let (out, after) = drain(&mut c, &mut h, now);
        assert_eq!(after, AfterSend::Idle);
        let f = frames(&out);
        assert_eq!(
            f.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [MsgKind::ReadResponse, MsgKind::WriteResponse, MsgKind::WriteResponse, MsgKind::ReadResponse]
        );
        assert_eq!((response(&f[0].1).tag, response(&f[0].1).status), (1, Status::Ok));
        let expect: Vec<u8> = (100..400).map(|i| (i * 7 + 1) as u8).collect();
        assert_eq!(&f[0].1[DATA_RESPONSE_LEN..], &expect[..], "split {split}");
        assert_eq!(response(&f[1].1).status, Status::Ok);
        assert_eq!(response(&f[2].1).status, Status::PermissionDenied);
        assert_eq!(&f[3].1[DATA_RESPONSE_LEN..], &payload[..], "the WRITE landed (split {split})");
        assert_eq!(h.mem[0], 1, "the refused WRITE's payload was dropped");
        assert_eq!(h.holds(), 0, "nothing stays held once sent");
        assert_eq!(h.served, (3, 300 + 10_000 + 10_000));
    }
}

/// A refusal's reason longer than the bound (two ASCII bytes, then 400
/// three-byte characters) is cut at the last character boundary within
/// 1024 bytes (1022 here), so the requester's strict UTF-8 decode reads
/// it. Guards `refuse`'s `cut_at_char` (cut as bytes at 1024, the answer
/// ends inside a character).
#[test]
fn a_long_refusal_reason_is_cut_at_a_character_boundary() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    h.refusal = Some(format!("xy{}", "\u{20ac}".repeat(400)));
    c.received(&read_req(9, BASE, 16), now, &mut h).unwrap();
    let (out, _) = drain(&mut c, &mut h, now);
    let f = frames(&out);
    assert_eq!((f.len(), f[0].0), (1, MsgKind::ReadResponse));
    assert_eq!((response(&f[0].1).tag, response(&f[0].1).status), (9, Status::PermissionDenied));
    let text = std::str::from_utf8(&f[0].1[DATA_RESPONSE_LEN..]).expect("whole characters");
    assert_eq!(text, format!("xy{}", "\u{20ac}".repeat(340)));
}

#[test]
fn a_write_payload_read_straight_into_memory_lands_without_the_buffer() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let payload = vec![0xabu8; 100_000];
    let wire = write_req(9, BASE + 4096, &payload);
    let head = FRAME_HEADER_LEN + DATA_REQUEST_LEN;
    c.received(&wire[..head], now, &mut h).unwrap();
    assert_eq!(c.recv(now), Recv::Direct { addr: BASE + 4096, len: 100_000 });
    assert_eq!(c.payload_left(), Some(100_000));
    // The driver reads 60 000 bytes into memory, then the rest arrives in
    // its buffer.
    h.mem[4096..4096 + 60_000].fill(0xab);
    c.landed(60_000, now, &mut h);
    assert_eq!(c.recv(now), Recv::Direct { addr: BASE + 4096 + 60_000, len: 40_000 });
    c.received(&wire[head + 60_000..], now, &mut h).unwrap();
    assert_eq!(c.recv(now), Recv::Buffer);
    assert!(h.mem[4096..4096 + 100_000].iter().all(|b| *b == 0xab));
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(response(&frames(&out)[0].1), DataResponse { tag: 9, status: Status::Ok });
}

/// Issue 31: a read of many DescribeRequests queued a whole Describe for
/// each (16 bytes in, kilobytes out). One waits at a time; those that come
/// meanwhile are answered by one more, once it has left. Issue 58: and one
/// is built per turn at most (a peer reading its Describes as fast as it
/// asks for them kept the I/O thread building tables of thousands of
/// regions): the one due is built in the next turn, which the driver runs
/// at once. Guards `after_send`'s `!self.turn_described` (without it the
/// first drain builds both).
#[test]
fn describe_requests_queue_one_describe_at_a_time() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire: Vec<u8> = (0..4096).flat_map(|_| frame(MsgKind::DescribeRequest, &[])).collect();
    c.received(&wire, now, &mut h).unwrap();
    assert_eq!(h.describes, 1, "one Describe queued for the requests of a turn");
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(frames(&out).len(), 1);
    assert_eq!(h.describes, 1, "one Describe a turn");
    assert!(c.describe_deferred());
    c.begin_turn(&mut h);
    assert_eq!(h.describes, 2, "the ones that came meanwhile get one more, once the first left");
    assert!(!c.describe_deferred());
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(frames(&out).len(), 1);
    assert_eq!(h.served, (0, 0));
}

/// Issue 58: a Describe built in this turn that has already left does not
/// let another DescribeRequest of the same turn build a second one (the
/// peer reading as fast as it asks would get one per request): it is due,
/// built once the next turn begins. Guards `header`'s
/// `|| self.turn_described` (without it the second read builds a second
/// Describe in the turn).
#[test]
fn a_describe_that_left_does_not_free_the_turns_next() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&frame(MsgKind::DescribeRequest, &[]), now, &mut h).unwrap();
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(frames(&out).len(), 1);
    assert_eq!(h.describes, 1);
    c.received(&frame(MsgKind::DescribeRequest, &[]), now, &mut h).unwrap();
    assert_eq!(h.describes, 1, "one Describe a turn, even once the first left");
    assert!(c.describe_deferred());
    let (out, _) = drain(&mut c, &mut h, now);
    assert!(out.is_empty(), "nothing more leaves in this turn");
    c.begin_turn(&mut h);
    assert_eq!(h.describes, 2, "the due one is built when the next turn begins");
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(frames(&out).iter().map(|(k, _)| *k).collect::<Vec<_>>(), [MsgKind::Describe]);
}

/// Issue 58: a peer streaming DescribeRequests without reading its
/// Describes kept the I/O thread reading and parsing them for ever (each
/// folded into the one Describe due, nothing ever held reading back).
/// While a Describe waits with another asked for, the peer is not read
/// (what was read is still handled); reading resumes once the Describe
/// has left. Guards `answers_full`'s `describe_due` (without it `recv`
/// answers `Buffer` below).
#[test]
fn reading_pauses_while_a_describe_waits_with_another_asked_for() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&frame(MsgKind::DescribeRequest, &[]), now, &mut h).unwrap();
    assert_eq!(c.recv(now), Recv::Buffer, "one Describe waits: reading goes on");
    let mut wire = frame(MsgKind::DescribeRequest, &[]);
    wire.extend(write_req(1, BASE + 8, b"later"));
    c.received(&wire, now, &mut h).unwrap();
    assert_eq!(h.served.0, 1, "what was read is handled");
    assert!(c.answers_full());
    assert_eq!(c.recv(now), Recv::Paused, "nothing more is read while the Describe waits");
    let (out, _) = drain(&mut c, &mut h, now);
    let kinds = |out: &[u8]| frames(out).iter().map(|(k, _)| *k).collect::<Vec<_>>();
    assert_eq!(kinds(&out), [MsgKind::Describe, MsgKind::WriteResponse]);
    assert_eq!(c.recv(now), Recv::Paused, "the one due is not built yet");
    c.begin_turn(&mut h);
    assert!(!c.answers_full());
    assert_eq!(c.recv(now), Recv::Buffer, "reading resumes once the first left");
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(kinds(&out), [MsgKind::Describe]);
}

/// The answers' bound holds per frame, not per read: one read holding 2000
/// READs queues answers up to the bound, the rest waits (stashed, reading
/// paused) and is handled as the answers leave.
#[test]
fn the_answer_bound_holds_before_each_frame() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire: Vec<u8> = (0..2000).flat_map(|t| read_req(t, BASE, 4096)).collect();
    c.received(&wire, now, &mut h).unwrap();
    // Turns go by without the peer reading its answers.
    while !c.answers_full() {
        c.begin_turn(&mut h);
        c.resume(now, &mut h).unwrap();
    }
    assert!(c.answers_full() && c.stashed());
    assert_eq!(c.recv(now), Recv::Paused);
    assert_eq!(h.served.0, 512, "1024 items: a header item and a payload item per READ");
    let mut tags = Vec::new();
    for _ in 0..20 {
        let (out, _) = drain(&mut c, &mut h, now);
        tags.extend(frames(&out).iter().map(|(_, b)| response(b).tag));
        c.begin_turn(&mut h);
        c.resume(now, &mut h).unwrap();
        if !c.stashed() && !c.answers_full() {
            let (out, _) = drain(&mut c, &mut h, now);
            tags.extend(frames(&out).iter().map(|(_, b)| response(b).tag));
            break;
        }
    }
    assert_eq!(tags, (0..2000).collect::<Vec<u64>>());
    assert_eq!(c.recv(now), Recv::Buffer);
}

/// Checked only when its next deadline comes (the I/O thread's timers
/// tick a handler only when it is due), after a check at the end of a
/// turn, a frame left unfinished still fails at the stall bound: the
/// deadline includes a check every quarter bound, without which `check`
/// takes each gap for this process not running and restarts the bound
/// for ever (the Describe flooder of tests/hostile_describe_stream.rs was
/// never cut).
#[test]
fn checked_only_at_its_deadlines_a_stalled_frame_still_fails_at_the_bound() {
    let t0 = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 16)[..10], t0, &mut h).unwrap();
    assert!(c.check(t0).is_ok());
    let mut checks = 0;
    let failed_at = loop {
        let at = c.next_deadline().expect("a bound runs");
        checks += 1;
        assert!(checks <= 10, "no failure in 10 checks at the deadlines the core gave");
        if let Err(e) = c.check(at) {
            assert_eq!(e.status(), Status::ProtocolError, "{e}");
            break at;
        }
    };
    assert_eq!((failed_at, checks), (t0 + Duration::from_secs(5), 4));
}

#[test]
fn a_frame_left_unfinished_fails_at_the_stall_bound_but_not_while_paused() {
    let t0 = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 16)[..10], t0, &mut h).unwrap();
    assert_eq!(c.next_deadline(), Some(t0 + Duration::from_secs(5)));
    for ms in (0..=5000).step_by(50) {
        let at = t0 + Duration::from_millis(ms);
        if ms < 5000 {
            assert!(c.check(at).is_ok(), "{ms}");
            continue;
        }
        let e = c.check(at).unwrap_err();
        assert_eq!(e.status(), Status::ProtocolError, "{e}");
    }
    // This process stopped (SIGSTOP) past the bound: not the peer's fault,
    // the bound restarts from the first check after the pause.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 16)[..10], t0, &mut h).unwrap();
    assert!(c.check(t0).is_ok());
    assert!(c.check(t0 + Duration::from_secs(8)).is_ok(), "a check after our own 8 s pause");
    for ms in (8050..13_000).step_by(50) {
        assert!(c.check(t0 + Duration::from_millis(ms)).is_ok(), "{ms}");
    }
    let e = c.check(t0 + Duration::from_secs(13)).unwrap_err();
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    // A paused connection's bounds wait: the answers, not the peer, hold it.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire: Vec<u8> = (0..600).flat_map(|t| read_req(t, BASE, 4096)).collect();
    c.received(&wire, t0, &mut h).unwrap();
    assert_eq!(c.recv(t0), Recv::Paused);
    assert!(c.check(t0 + Duration::from_secs(3)).is_ok());
}

#[test]
fn a_slow_payload_fails_at_the_minimum_rate() {
    let t0 = Instant::now();
    let (mut c, mut h) = (SourceCore::new(Limits { stall: Duration::from_secs(3), min_rate: 1 << 20 }), Host::new());
    let wire = write_req(1, BASE + 8, &vec![1u8; 4 << 20]);
    c.received(&wire[..FRAME_HEADER_LEN + DATA_REQUEST_LEN + 1000], t0, &mut h).unwrap();
    // 4 MiB at 1 MiB/s after 3 s of allowance: 7 s in all. A MiB every
    // 1.9 s keeps the stall bound (each MiB within 3 s), not the rate. The
    // driver checks every tick (50 ms).
    let mut first_failure = None;
    for ms in (0..=7000u64).step_by(50) {
        let now = t0 + Duration::from_millis(ms);
        if ms > 0 && ms % 1900 == 0 && ms <= 5700 {
            c.landed(1 << 20, now, &mut h);
        }
        if let Err(e) = c.check(now) {
            first_failure = Some((ms, e));
            break;
        }
    }
    let (ms, e) = first_failure.expect("the rate bound fails");
    assert_eq!(ms, 7000);
    assert!(e.message().contains("min_payload_rate_kib"), "{e}");
}

/// Guards `*o = (*o).max(at)` in `Pace::restart`: a WRITE whose
/// request used the turn's last frame waits, reading paused, for the
/// next turn (1 s on); resuming restarts its stall bound from there (to
/// 3 s) but keeps its rate deadline (6 MiB at 512 KiB/s after 2 s of
/// allowance: 14 s), later than that. Its payload then comes at a MiB a
/// second, twice the minimum rate, and lands whole, answered OK. Were
/// the rate deadline cut to the restarted stall bound, the transfer
/// would fail "slower than min_payload_rate_kib" at 3 s, a MiB in,
/// because the source paused.
#[test]
fn a_paced_payload_resumed_after_a_pause_keeps_its_rate_deadline() {
    const MIB: usize = 1 << 20;
    let t0 = Instant::now();
    let limits = Limits { stall: Duration::from_secs(2), min_rate: 512 << 10 };
    let (mut c, mut h) = (SourceCore::new(limits), Host::new());
    let payload: Vec<u8> = (0..6 * MIB).map(|i| (i % 251) as u8).collect();
    let wire = write_req(1, BASE + 8, &payload);
    let reads: Vec<u8> = (0..TURN_FRAMES as u64 - 1).flat_map(|t| read_req(100 + t, BASE, 8)).collect();
    c.begin_turn(&mut h);
    c.received(&[&reads[..], &wire[..FRAME_HEADER_LEN + DATA_REQUEST_LEN]].concat(), t0, &mut h).unwrap();
    assert_eq!(c.recv(t0), Recv::Paused, "the turn's frames are used");
    let (out, _) = drain(&mut c, &mut h, t0);
    assert_eq!(frames(&out).len(), TURN_FRAMES as usize - 1, "the READs' answers left");
    let feed = |c: &mut SourceCore<Host>, h: &mut Host, ms: u64, now: Instant| {
        if ms == 1000 {
            c.begin_turn(h);
            assert_eq!(c.recv(now), Recv::Direct { addr: BASE + 8, len: 6 << 20 }, "reading resumes");
        }
        if ms % 1000 == 500 && (1500..=6500).contains(&ms) {
            let i = (ms as usize - 1500) / 1000;
            c.received(&payload[i * MIB..(i + 1) * MIB], now, h).unwrap();
        }
    };
    let failed = first_failure((&mut c, &mut h), t0, 8000, feed);
    assert!(failed.is_none(), "a payload at twice the minimum rate failed: {failed:?}");
    assert!(h.mem[8..8 + 6 * MIB] == payload[..], "the payload landed whole");
    assert_eq!(h.served, (TURN_FRAMES as u64, (6 * MIB) as u64 + 8 * (TURN_FRAMES as u64 - 1)));
    let (out, _) = drain(&mut c, &mut h, t0 + Duration::from_secs(8));
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].0, response(&f[0].1).tag, response(&f[0].1).status), (MsgKind::WriteResponse, 1, Status::Ok));
}

/// The first tick (of 50 ms, up to `end_ms`) at which `check` fails,
/// calling `feed(ms)` before each check.
fn first_failure(
    (c, h): (&mut SourceCore<Host>, &mut Host),
    t0: Instant,
    end_ms: u64,
    feed: impl Fn(&mut SourceCore<Host>, &mut Host, u64, Instant),
) -> Option<(u64, Error)> {
    for ms in (0..=end_ms).step_by(50) {
        let now = t0 + Duration::from_millis(ms);
        feed(c, h, ms, now);
        if let Err(e) = c.check(now) {
            return Some((ms, e));
        }
    }
    None
}

/// Guards `| Want::Discard { pace, .. }` in `check`: the payload of a
/// refused WRITE (read and discarded, no frame deadline) that stops after
/// 10 of its 64 KiB ends the connection at the stall bound, 5 s.
#[test]
fn a_refused_writes_frozen_payload_fails_at_the_stall_bound() {
    let t0 = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire = write_req(1, BASE, &vec![1u8; 64 << 10]); // BASE: refused
    c.received(&wire[..FRAME_HEADER_LEN + DATA_REQUEST_LEN + 10], t0, &mut h).unwrap();
    let (ms, e) = first_failure((&mut c, &mut h), t0, 8000, |_, _, _, _| {}).expect("the stall bound fails");
    assert_eq!(ms, 5000);
    assert!(e.message().contains("payload made no progress"), "{e}");
    assert_eq!((h.mem[0], h.failed), (1, 0), "nothing landed, no answer yet");
}

/// Guards `self.mark = self.done + MIB` in `Pace::advance`: with no rate
/// bound, a WRITE payload dribbled a byte every 4 s after its first MiB
/// ends at the stall bound (5 s after that MiB), not never.
#[test]
fn a_payload_dribbled_a_byte_at_a_time_fails_at_the_stall_bound() {
    let t0 = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire = write_req(1, BASE + 8, &vec![1u8; 4 << 20]);
    c.received(&wire[..FRAME_HEADER_LEN + DATA_REQUEST_LEN], t0, &mut h).unwrap();
    c.landed(1 << 20, t0, &mut h);
    let dribble = |c: &mut SourceCore<Host>, h: &mut Host, ms: u64, now: Instant| {
        if ms > 0 && ms % 4000 == 0 {
            c.landed(1, now, h);
        }
    };
    let (ms, e) = first_failure((&mut c, &mut h), t0, 20_000, dribble).expect("the stall bound fails");
    assert_eq!(ms, 5000);
    assert!(e.message().contains("payload made no progress"), "{e}");
}

#[test]
fn a_notification_becomes_visible_once_its_acknowledgement_has_left() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let n = Notify { tag: 5, name: String::new(), msg: b"blocks of request 17".to_vec() };
    c.received(&frame(MsgKind::Notify, &n.encode()), now, &mut h).unwrap();
    assert!(c.take_published().is_empty(), "not before its ACK left");
    let (out, _) = drain(&mut c, &mut h, now);
    assert_eq!(frames(&out)[0].0, MsgKind::NotifyAck);
    assert_eq!(c.take_published(), vec!["blocks of request 17".to_string()]);
    // Too large: its bytes are dropped and it is refused.
    let big = Notify { tag: 6, name: String::new(), msg: vec![0; 500] };
    c.received(&frame(MsgKind::Notify, &big.encode()), now, &mut h).unwrap();
    let (out, _) = drain(&mut c, &mut h, now);
    let (tag, verdict) = crate::control::notify_frame::decode_ack(&frames(&out)[0].1).unwrap();
    assert_eq!((tag, verdict.unwrap_err().status()), (6, Status::InvalidArgument));
    assert!(c.take_published().is_empty());
}

#[test]
fn goodbye_and_eof_close_after_the_answers_and_a_cut_frame_is_an_error() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let mut wire = read_req(1, BASE, 64);
    wire.extend(frame(MsgKind::Goodbye, &[]));
    wire.extend(read_req(2, BASE, 64)); // after Goodbye: never read
    c.received(&wire, now, &mut h).unwrap();
    assert_eq!(c.recv(now), Recv::Ended);
    let (out, after) = drain(&mut c, &mut h, now);
    assert_eq!((frames(&out).len(), after), (1, AfterSend::Close));
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 64)[..20], now, &mut h).unwrap();
    assert_eq!(c.eof().unwrap_err().status(), Status::Unavailable);
    // Cut inside a header (its bytes gathered while a header is still
    // wanted): not an orderly close either; a close between frames is.
    // Guards `eof`'s `|| !self.partial.is_empty()`.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 64)[..5], now, &mut h).unwrap();
    assert_eq!(c.eof(), Err(Error::Unavailable("peer closed the connection mid-frame".into())));
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 64), now, &mut h).unwrap();
    assert_eq!(c.eof(), Ok(()));
}

#[test]
fn a_protocol_error_is_told_unless_an_answer_is_half_sent_and_releases_what_is_held() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 4096), now, &mut h).unwrap();
    assert_eq!(h.holds(), 1);
    let mut bad = FrameHeader::encode(MsgKind::ReadRequest, 32);
    bad[0] = 0;
    let e = c.received(&bad, now, &mut h).unwrap_err();
    let told = c.fail(&e, &mut h).expect("nothing half sent: the peer is told");
    assert_eq!(frames(&told)[0].0, MsgKind::Error);
    assert_eq!(h.holds(), 0, "the READ's hold went with the connection");
    assert_eq!(c.recv(now), Recv::Ended);
    // Half an answer sent: nothing more may go on the stream.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&read_req(1, BASE, 4096), now, &mut h).unwrap();
    c.transmit(now);
    c.sent(10, now);
    assert!(c.fail(&Error::Protocol("bad".into()), &mut h).is_none());
}

/// Issue 58, the Describe flood: a read of many cheap frames (16-byte
/// DescribeRequests, or small WRITEs) kept the I/O thread parsing 4 MiB of
/// them in one turn while its other connections waited. A turn handles
/// `TURN_FRAMES` frames at most; the rest waits, read, for the next turn
/// (reading paused meanwhile). Guards `feed`'s `self.turn_used()` check
/// (without it the first turn handles all 1000) and `recv`'s (without it
/// a turn that used its frames at a read's end reads on).
#[test]
fn a_turn_handles_at_most_turn_frames_frames() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire: Vec<u8> = (0..1000).flat_map(|t| write_req(t, BASE + 64 + t * 8, &t.to_le_bytes())).collect();
    c.begin_turn(&mut h);
    c.received(&wire, now, &mut h).unwrap();
    assert_eq!(h.served.0, TURN_FRAMES as u64, "one turn's frames handled");
    assert!(c.stashed() && !c.answers_full());
    assert_eq!(c.recv(now), Recv::Paused, "nothing more is read in this turn");
    let mut turns = 1;
    while c.stashed() {
        c.begin_turn(&mut h);
        c.resume(now, &mut h).unwrap();
        turns += 1;
        assert_eq!(h.served.0, 1000.min(turns * TURN_FRAMES as u64), "turn {turns}");
    }
    assert_eq!(c.recv(now), Recv::Buffer);
    for t in 0..1000u64 {
        let at = (64 + t * 8) as usize;
        assert_eq!(h.mem[at..at + 8], t.to_le_bytes(), "WRITE {t}");
    }
    let (out, _) = drain(&mut c, &mut h, now);
    let tags: Vec<u64> = frames(&out).iter().map(|(_, b)| response(b).tag).collect();
    assert_eq!(tags, (0..1000).collect::<Vec<u64>>());
    // A turn that used its frames exactly at the end of what was read
    // reads nothing more until the next.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let wire: Vec<u8> = (0..TURN_FRAMES as u64).flat_map(|t| read_req(t, BASE, 8)).collect();
    c.received(&wire, now, &mut h).unwrap();
    assert!(!c.stashed() && !c.answers_full());
    assert_eq!(c.recv(now), Recv::Paused);
    c.begin_turn(&mut h);
    assert_eq!(c.recv(now), Recv::Buffer);
    assert_eq!(h.served.0, TURN_FRAMES as u64);
}

/// Issue 58, the torn WRITE: a connection that ends while a WRITE's
/// payload lands leaves its range part new, part old. The host hears of
/// it with the bytes that landed (whatever ended the connection), and the
/// WRITE counts as failed; one cut before any of its payload landed only
/// fails, and one that landed whole is no loss. Guards `close`'s
/// `Want::Landing` arm.
#[test]
fn a_write_cut_mid_payload_is_told_torn_with_what_landed() {
    let now = Instant::now();
    let payload = vec![0xabu8; 100_000];
    let wire = write_req(9, BASE + 4096, &payload);
    let head = FRAME_HEADER_LEN + DATA_REQUEST_LEN;
    // Cut after 1000 bytes, by a failure.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&wire[..head + 1000], now, &mut h).unwrap();
    let e = c.eof().unwrap_err();
    assert!(c.fail(&e, &mut h).is_none(), "not a protocol error: nothing told");
    assert_eq!(h.torn, vec![(9, 1000, e.to_string())]);
    assert_eq!((h.failed, h.served.0, h.holds()), (1, 0, 0));
    c.end(&mut h);
    assert_eq!(h.torn.len(), 1, "told once");
    // Cut after 60 000 bytes read straight into memory, by the end alone.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&wire[..head], now, &mut h).unwrap();
    c.landed(60_000, now, &mut h);
    c.end(&mut h);
    assert_eq!(h.torn, vec![(9, 60_000, "the connection ended".to_string())]);
    assert_eq!((h.failed, h.holds()), (1, 0));
    // Cut before any payload: failed, not torn.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&wire[..head], now, &mut h).unwrap();
    c.end(&mut h);
    assert_eq!((h.torn.len(), h.failed, h.holds()), (0, 1, 0));
    // Landed whole, its answer not sent yet: served, not torn.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    c.received(&wire, now, &mut h).unwrap();
    c.end(&mut h);
    assert_eq!((h.torn.len(), h.failed, h.served.0, h.holds()), (0, 0, 1, 0));
}

/// A ReadRequest's body is exactly its 32-byte fixed part: a SHORTER one
/// fails at its header, before its bytes are read, and validates nothing.
/// Guards `header`'s `h.body_len as usize != DATA_REQUEST_LEN` (with `>`
/// the core read 32 bytes whatever the header said, taking 16 from the
/// next frame: misframed, and the short request validated as a READ).
#[test]
fn a_read_request_shorter_than_its_fixed_part_is_a_protocol_error_at_once() {
    let now = Instant::now();
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let mut wire = FrameHeader::encode(MsgKind::ReadRequest, 16).to_vec();
    wire.extend_from_slice(&[0u8; 16]);
    wire.extend(read_req(2, BASE, 64));
    let e = c.received(&wire, now, &mut h).unwrap_err();
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(e.to_string().contains("ReadRequest body of 16 bytes"), "{e}");
    assert_eq!((h.holds(), h.served, h.failed), (0, (0, 0), 0), "nothing validated or served");
    // Alone (no next frame to borrow from) it fails at once as well,
    // not at the stall bound.
    let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
    let short = FrameHeader::encode(MsgKind::ReadRequest, 31);
    let e = c.received(&short, now, &mut h).unwrap_err();
    assert!(e.to_string().contains("ReadRequest body of 31 bytes"), "{e}");
}

/// The answers' byte bound, exactly: READs whose answers (header, fixed
/// part and payload) are 64 KiB each fill it at the 64th (`OUT_BYTES_MAX`
/// waiting: no more is handled, the rest stashed); answers one byte
/// shorter leave room for a 65th. Guards `full`'s `self.bytes >=
/// OUT_BYTES_MAX` (sweep B).
#[test]
fn the_answers_byte_bound_is_full_at_exactly_out_bytes_max() {
    let now = Instant::now();
    let fixed = (crate::control::frame::FRAME_HEADER_LEN + DATA_RESPONSE_LEN) as u64;
    for (answer, handled) in [(64 << 10, 64u64), ((64 << 10) - 1, 65)] {
        let (mut c, mut h) = (SourceCore::new(limits()), Host::new());
        let wire: Vec<u8> = (0..100).flat_map(|t| read_req(t, BASE, answer - fixed)).collect();
        c.received(&wire, now, &mut h).unwrap();
        assert_eq!(h.served.0, handled, "answers of {answer} bytes");
        assert_eq!(c.queued(), (handled * answer, 2 * handled as usize), "answers of {answer} bytes");
        assert!(c.answers_full() && c.stashed(), "answers of {answer} bytes");
        assert_eq!(c.recv(now), Recv::Paused, "answers of {answer} bytes");
    }
}
