//! The TCP requester core without sockets: requests submitted, what it
//! sends read back frame by frame, answers fed in any split, time passed
//! in; completions and holds counted exactly.

use super::*;
use crate::control::frame::MsgKind;
use crate::control::identity::Identity;
use crate::control::message::DATA_REQUEST_LEN;
use std::rc::Rc;

mod answers_checked;

/// A completion record: its request's number, and whether its batch was
/// cancelled.
struct Rec(u32, bool);

impl Startable for Rec {
    fn start(&self) -> bool {
        !self.1
    }
}

type Core = RequesterCore<Rec, Rc<()>, u32>;

fn core() -> Core {
    RequesterCore::new("peer 1".into(), Describe::bare(Identity::fresh().unwrap()))
}

fn send(id: u32, op: Op, local: u64, remote: u64, len: u64, deadline: Instant, hold: &Rc<()>) -> Send<Rec, Rc<()>> {
    Send {
        op,
        local_addr: local,
        remote_addr: remote,
        len,
        region_epoch: 1,
        deadline,
        done: Rec(id, false),
        hold: hold.clone(),
    }
}

/// Sends everything, WRITE payload read from `local` (local addresses are
/// offsets into it); returns the bytes.
fn drain(c: &mut Core, local: &[u8], now: Instant) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let (segs, skip) = c.transmit(now);
        if segs.is_empty() {
            return out;
        }
        let mut bytes = Vec::new();
        for s in &segs {
            match s {
                Segment::Bytes(b) => bytes.extend_from_slice(b),
                Segment::Memory { addr, len } => {
                    bytes.extend_from_slice(&local[*addr as usize..(*addr + *len) as usize])
                }
            }
        }
        out.extend_from_slice(&bytes[skip as usize..]);
        let n = bytes.len() as u64 - skip;
        assert!(c.sent(n));
    }
}

/// The requests in what was sent: (kind, tag, remote addr, len, payload).
fn requests(mut b: &[u8]) -> Vec<(MsgKind, DataRequest, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let h = FrameHeader::decode(b[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let body = &b[FRAME_HEADER_LEN..FRAME_HEADER_LEN + h.body_len as usize];
        let r = DataRequest::decode(body[..DATA_REQUEST_LEN].try_into().unwrap()).unwrap();
        out.push((h.kind, r, body[DATA_REQUEST_LEN..].to_vec()));
        b = &b[FRAME_HEADER_LEN + h.body_len as usize..];
    }
    out
}

fn answer(kind: MsgKind, tag: u64, status: Status, rest: &[u8]) -> Vec<u8> {
    let fixed = DataResponse { tag, status }.encode();
    let mut f = FrameHeader::encode(kind, (fixed.len() + rest.len()) as u32).to_vec();
    f.extend_from_slice(&fixed);
    f.extend_from_slice(rest);
    f
}

/// Feeds `wire` in pieces of `split`, landing READ payload into `mem`.
fn feed(c: &mut Core, wire: &[u8], split: usize, mem: &mut [u8]) {
    for piece in wire.chunks(split) {
        let mut land = |addr: u64, b: &[u8]| mem[addr as usize..addr as usize + b.len()].copy_from_slice(b);
        assert!(c.received(piece, &mut land).unwrap());
    }
}

fn outcomes(c: &mut Core) -> Vec<(u32, Status, RemoteEffect)> {
    c.take_done()
        .into_iter()
        .map(|(r, o)| (r.0, o.result.as_ref().err().map_or(Status::Ok, |e| e.status()), o.effect))
        .collect()
}

#[test]
fn answers_in_any_split_complete_each_request_with_its_bytes_and_free_its_hold() {
    let now = Instant::now();
    let later = now + Duration::from_secs(60);
    for split in [1usize, 5, 16, 17, 1000, 1 << 20] {
        let (mut c, hold) = (core(), Rc::new(()));
        let local: Vec<u8> = (0..8192).map(|i| (i % 251) as u8).collect();
        assert!(c.submit(vec![
            send(1, Op::Read, 0, 0x1000, 100, later, &hold),
            send(2, Op::Write, 4096, 0x2000, 300, later, &hold),
            send(3, Op::Read, 200, 0x3000, 50, later, &hold),
        ]));
        let sent = requests(&drain(&mut c, &local, now));
        assert_eq!(
            sent.iter().map(|r| (r.0, r.1.addr, r.1.len)).collect::<Vec<_>>(),
            [
                (MsgKind::ReadRequest, 0x1000, 100),
                (MsgKind::WriteRequest, 0x2000, 300),
                (MsgKind::ReadRequest, 0x3000, 50)
            ]
        );
        assert_eq!(sent[1].2, &local[4096..4396], "the WRITE's payload, by address");
        assert_eq!(Rc::strong_count(&hold), 4);
        let mut wire = answer(MsgKind::ReadResponse, sent[0].1.tag, Status::Ok, &[7u8; 100]);
        wire.extend(answer(MsgKind::WriteResponse, sent[1].1.tag, Status::Ok, &[]));
        wire.extend(answer(MsgKind::ReadResponse, sent[2].1.tag, Status::OutOfRange, b"outside"));
        let mut mem = vec![0u8; 8192];
        feed(&mut c, &wire, split, &mut mem);
        assert_eq!(
            outcomes(&mut c),
            [
                (1, Status::Ok, RemoteEffect::None),
                (2, Status::Ok, RemoteEffect::Applied),
                (3, Status::OutOfRange, RemoteEffect::None)
            ]
        );
        assert!(mem[..100].iter().all(|b| *b == 7), "split {split}");
        assert_eq!(Rc::strong_count(&hold), 1, "every hold freed");
        assert_eq!(c.outstanding(), 0);
    }
}

#[test]
fn a_read_payload_read_straight_into_memory_completes_when_all_landed() {
    let now = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Read, 512, 0x1000, 100_000, now + Duration::from_secs(9), &hold)]);
    let tag = requests(&drain(&mut c, &[], now))[0].1.tag;
    let wire = answer(MsgKind::ReadResponse, tag, Status::Ok, &vec![3u8; 100_000]);
    let mut mem = vec![0u8; 200_000];
    feed(&mut c, &wire[..FRAME_HEADER_LEN + DATA_RESPONSE_LEN], 1 << 20, &mut mem);
    assert_eq!(c.recv(), Recv::Direct { addr: 512, len: 100_000 });
    c.landed(60_000);
    assert_eq!(c.recv(), Recv::Direct { addr: 60_512, len: 40_000 });
    assert!(outcomes(&mut c).is_empty());
    c.landed(40_000);
    assert_eq!(outcomes(&mut c), [(1, Status::Ok, RemoteEffect::None)]);
    assert_eq!((c.recv(), Rc::strong_count(&hold)), (Recv::Buffer, 1));
}

/// From the last round's races: a WRITE answered before its payload left
/// ended its batch while its memory was still being sent. Its answer now
/// waits on its entry until the buffer is settled.
#[test]
fn a_write_answered_before_its_payload_left_completes_only_once_it_has() {
    let now = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    let local = vec![9u8; 100_000];
    c.submit(vec![send(1, Op::Write, 0, 0x1000, 100_000, now + Duration::from_secs(9), &hold)]);
    let (segs, _) = c.transmit(now);
    let total: u64 = segs
        .iter()
        .map(|s| match s {
            Segment::Bytes(b) => b.len() as u64,
            Segment::Memory { len, .. } => *len,
        })
        .sum();
    assert!(!c.sent(1000));
    let mut tag_bytes = vec![];
    // The tag is the first request's: 1.
    tag_bytes.extend(answer(MsgKind::WriteResponse, 1, Status::Ok, &[]));
    feed(&mut c, &tag_bytes, 1 << 20, &mut []);
    assert!(outcomes(&mut c).is_empty(), "not while its payload is still being sent");
    assert_eq!(Rc::strong_count(&hold), 2);
    assert!(c.sent(total - 1000));
    assert_eq!(outcomes(&mut c), [(1, Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(Rc::strong_count(&hold), 1);
    let _ = local;
}

/// Issue 36: a request that passes its deadline fails alone; its answer,
/// when it comes, is dropped (payload and all), and the answers after it
/// complete their own requests on the same connection.
#[test]
fn a_late_request_fails_alone_and_the_stream_stays_in_step() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![
        send(1, Op::Read, 0, 0x1000, 4096, t0 + Duration::from_secs(1), &hold),
        send(2, Op::Write, 0, 0x2000, 16, t0 + Duration::from_secs(1), &hold),
        send(3, Op::Read, 4096, 0x3000, 64, t0 + Duration::from_secs(60), &hold),
    ]);
    let sent = requests(&drain(&mut c, &[0u8; 8192], t0));
    assert_eq!(c.next_deadline(), Some(t0 + Duration::from_secs(1)));
    c.expire(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(
        outcomes(&mut c),
        [(1, Status::TimedOut, RemoteEffect::None), (2, Status::TimedOut, RemoteEffect::Unknown)]
    );
    assert_eq!(Rc::strong_count(&hold), 2, "the late ones' memory is free at once");
    // The late answers come, then the live one's.
    let mut wire = answer(MsgKind::ReadResponse, sent[0].1.tag, Status::Ok, &[1u8; 4096]);
    wire.extend(answer(MsgKind::WriteResponse, sent[1].1.tag, Status::Ok, &[]));
    wire.extend(answer(MsgKind::ReadResponse, sent[2].1.tag, Status::Ok, &[5u8; 64]));
    let mut mem = vec![0u8; 8192];
    feed(&mut c, &wire, 777, &mut mem);
    assert_eq!(outcomes(&mut c), [(3, Status::Ok, RemoteEffect::None)]);
    assert!(mem[..4096].iter().all(|b| *b == 0), "the late READ's payload never lands");
    assert!(mem[4096..4160].iter().all(|b| *b == 5));
    assert_eq!(c.dropped, 2);
    // An answer nobody asked for is still a protocol error.
    let stray = answer(MsgKind::ReadResponse, 999, Status::Ok, &[]);
    let mut land = |_: u64, _: &[u8]| {};
    assert_eq!(c.received(&stray, &mut land).unwrap_err().status(), Status::ProtocolError);
}

/// A READ answered with fewer bytes than it asked for (or more) is a
/// protocol error naming both counts, and no byte of it lands: the
/// request must not end OK with the rest of its range left stale. Guards
/// `receive.rs`'s `Op::Read if rest != e.len`.
#[test]
fn a_read_answered_short_or_long_is_a_protocol_error_and_lands_nothing() {
    for got in [4000usize, 4097] {
        let t0 = Instant::now();
        let (mut c, hold) = (core(), Rc::new(()));
        c.submit(vec![send(1, Op::Read, 0, 0x1000, 4096, t0 + Duration::from_secs(60), &hold)]);
        let sent = requests(&drain(&mut c, &[], t0));
        let wire = answer(MsgKind::ReadResponse, sent[0].1.tag, Status::Ok, &vec![9u8; got]);
        let mut landed = 0usize;
        let mut land = |_: u64, b: &[u8]| landed += b.len();
        let e = c.received(&wire, &mut land).unwrap_err();
        assert_eq!(e.status(), Status::ProtocolError, "{e}");
        assert!(e.message().contains(&format!("carries {got} bytes, asked for 4096")), "{e}");
        assert_eq!(landed, 0, "{got} bytes: nothing lands");
        assert_eq!(outcomes(&mut c), [(1, Status::ProtocolError, RemoteEffect::None)]);
    }
}

/// A READ answered by a WriteResponse (OK, no payload) for its tag is a
/// protocol error and lands nothing: taken as the READ's answer it would
/// complete the READ OK with none of its bytes (C9 of the third mutant
/// round). Guards `answer`'s `e.op == want`.
#[test]
fn a_read_answered_as_a_write_is_a_protocol_error_and_lands_nothing() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Read, 0, 0x1000, 4096, t0 + Duration::from_secs(60), &hold)]);
    let sent = requests(&drain(&mut c, &[], t0));
    let wire = answer(MsgKind::WriteResponse, sent[0].1.tag, Status::Ok, &[]);
    let mut landed = 0usize;
    let mut land = |_: u64, b: &[u8]| landed += b.len();
    let e = c.received(&wire, &mut land).unwrap_err();
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(e.message().contains("of the other direction"), "{e}");
    assert_eq!(landed, 0);
    // The driver ends the connection with that error: the READ fails with
    // it, none of its bytes having come.
    c.kill(e, t0);
    assert_eq!(outcomes(&mut c), [(1, Status::ProtocolError, RemoteEffect::None)]);
    assert_eq!(Rc::strong_count(&hold), 1, "its memory let go");
}

#[test]
fn a_read_late_mid_payload_has_the_rest_dropped() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![
        send(1, Op::Read, 0, 0x1000, 10_000, t0 + Duration::from_secs(1), &hold),
        send(2, Op::Read, 20_000, 0x2000, 8, t0 + Duration::from_secs(60), &hold),
    ]);
    let sent = requests(&drain(&mut c, &[], t0));
    let mut wire = answer(MsgKind::ReadResponse, sent[0].1.tag, Status::Ok, &[4u8; 10_000]);
    wire.extend(answer(MsgKind::ReadResponse, sent[1].1.tag, Status::Ok, &[6u8; 8]));
    let mut mem = vec![0u8; 30_000];
    let cut = FRAME_HEADER_LEN + DATA_RESPONSE_LEN + 3000;
    feed(&mut c, &wire[..cut], 1 << 20, &mut mem);
    assert_eq!(c.payload_left(), Some(7000));
    c.expire(t0 + Duration::from_secs(2)).unwrap();
    assert_eq!(outcomes(&mut c), [(1, Status::TimedOut, RemoteEffect::None)]);
    assert_eq!(c.payload_left(), Some(7000), "the rest is read and dropped");
    feed(&mut c, &wire[cut..], 1 << 20, &mut mem);
    assert!(mem[3000..10_000].iter().all(|b| *b == 0), "nothing lands after the failure");
    assert_eq!(outcomes(&mut c), [(2, Status::Ok, RemoteEffect::None)]);
    assert!(mem[20_000..20_008].iter().all(|b| *b == 6));
    assert_eq!(Rc::strong_count(&hold), 1);
}

/// A READ whose payload is landing keeps its deadline among the core's
/// wake-ups. Three READs, due at 1 s, 2 s and 60 s: the first fails
/// unanswered at 1 s (which also settles the queue's lower bound), then
/// the second's answer header and part of its payload arrive:
/// `next_deadline` is the second's 2 s, not the third's 60 s; checked
/// only then, it fails there, mid-payload. Guards `next_deadline`'s
/// chain of the landing payload's deadline in `end.rs` (round 7 G10:
/// without it the wake-up was the third READ's, and a stalled payload
/// failed only then).
#[test]
fn a_read_mid_payload_is_woken_for_at_its_own_deadline() {
    let t0 = Instant::now();
    let [first, second, third] = [1, 2, 60].map(|s| t0 + Duration::from_secs(s));
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![
        send(1, Op::Read, 0, 0x1000, 8, first, &hold),
        send(2, Op::Read, 100, 0x2000, 10_000, second, &hold),
        send(3, Op::Read, 20_000, 0x3000, 8, third, &hold),
    ]);
    let sent = requests(&drain(&mut c, &[], t0));
    c.expire(first).unwrap();
    assert_eq!(outcomes(&mut c), [(1, Status::TimedOut, RemoteEffect::None)]);
    assert_eq!(c.next_deadline(), Some(second));
    let wire = answer(MsgKind::ReadResponse, sent[1].1.tag, Status::Ok, &[4u8; 10_000]);
    let mut mem = vec![0u8; 30_000];
    feed(&mut c, &wire[..FRAME_HEADER_LEN + DATA_RESPONSE_LEN + 3000], 1 << 20, &mut mem);
    assert_eq!(c.payload_left(), Some(7000));
    assert_eq!(c.next_deadline(), Some(second), "the landing READ's deadline left out of the wake-ups");
    c.expire(second).unwrap();
    assert_eq!(outcomes(&mut c), [(2, Status::TimedOut, RemoteEffect::None)]);
    assert_eq!(c.next_deadline(), Some(third));
    assert_eq!(Rc::strong_count(&hold), 2, "the failed READs' holds let go, the third's kept");
}

#[test]
fn a_write_late_while_leaving_is_failed_and_its_memory_held_until_it_left() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Write, 0, 0x1000, 100_000, t0 + Duration::from_secs(1), &hold)]);
    let (segs, _) = c.transmit(t0);
    let total: u64 = segs
        .iter()
        .map(|s| match s {
            Segment::Bytes(b) => b.len() as u64,
            Segment::Memory { len, .. } => *len,
        })
        .sum();
    assert!(!c.sent(500));
    c.expire(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(outcomes(&mut c), [(1, Status::TimedOut, RemoteEffect::Unknown)]);
    assert_eq!(Rc::strong_count(&hold), 2, "still held: its bytes are leaving");
    assert_eq!(c.next_deadline(), Some(t0 + Duration::from_secs(1) + WRITE_OVERRUN));
    assert!(c.sent(total - 500));
    assert_eq!(Rc::strong_count(&hold), 1, "free once its bytes left");
    // Its answer is dropped.
    feed(&mut c, &answer(MsgKind::WriteResponse, 1, Status::Ok, &[]), 3, &mut []);
    assert_eq!((c.dropped, outcomes(&mut c).len()), (1, 0));
    // A payload that cannot leave for a minute past its deadline ends it.
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Write, 0, 0x1000, 100_000, t0 + Duration::from_secs(1), &hold)]);
    c.transmit(t0);
    c.sent(10);
    c.expire(t0 + Duration::from_secs(1)).unwrap();
    let e = c.expire(t0 + Duration::from_secs(1) + WRITE_OVERRUN).unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "{e}");
    c.kill(e, Instant::now());
    assert_eq!(Rc::strong_count(&hold), 1);
}

#[test]
fn a_killed_connection_fails_everything_with_its_effects() {
    let t0 = Instant::now();
    let later = t0 + Duration::from_secs(60);
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Read, 0, 0x1000, 8, later, &hold), send(2, Op::Write, 0, 0x2000, 8, later, &hold)]);
    drain(&mut c, &[0u8; 16], t0);
    c.submit(vec![send(3, Op::Write, 0, 0x3000, 8, later, &hold)]);
    c.notify(|t| t.to_le_bytes().to_vec(), later, 77);
    let e = c.kill(Error::Unavailable("peer 1 closed the connection".into()), Instant::now());
    assert_eq!(e.status(), Status::Unavailable);
    let mut got = outcomes(&mut c);
    got.sort_by_key(|o| o.0);
    assert_eq!(
        got,
        [
            (1, Status::Unavailable, RemoteEffect::None),
            (2, Status::Unavailable, RemoteEffect::Unknown),
            (3, Status::Unavailable, RemoteEffect::None)
        ]
    );
    match c.take_events().as_slice() {
        [Event::NotifyAnswer(77, Err(e), false)] => assert_eq!(e.status(), Status::Unavailable),
        _ => panic!("the notification is answered with the reason"),
    }
    assert_eq!(Rc::strong_count(&hold), 1);
    // Later submissions fail at once.
    assert!(!c.submit(vec![send(4, Op::Read, 0, 0x1000, 8, later, &hold)]));
    assert_eq!(outcomes(&mut c), [(4, Status::Unavailable, RemoteEffect::None)]);
}

#[test]
fn a_cancelled_or_late_request_is_failed_before_it_is_sent() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    let mut cancelled = send(1, Op::Read, 0, 0x1000, 8, t0 + Duration::from_secs(9), &hold);
    cancelled.done.1 = true;
    c.submit(vec![cancelled, send(2, Op::Read, 0, 0x1000, 8, t0, &hold)]);
    assert!(drain(&mut c, &[], t0).is_empty());
    assert_eq!(
        outcomes(&mut c),
        [(1, Status::Cancelled, RemoteEffect::None), (2, Status::TimedOut, RemoteEffect::None)]
    );
    assert_eq!(Rc::strong_count(&hold), 1);
}

#[test]
fn revoke_describe_and_notification_verdicts_are_events() {
    let t0 = Instant::now();
    let mut c = core();
    c.notify(|t| t.to_le_bytes().to_vec(), t0 + Duration::from_secs(9), 5);
    let sent = drain(&mut c, &[], t0);
    let tag = u64::from_le_bytes(sent[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 8].try_into().unwrap());
    let mut wire = FrameHeader::encode(MsgKind::Revoke, 0).to_vec();
    let ack = crate::control::notify_frame::encode_ack(tag, &Ok(()));
    wire.extend(FrameHeader::encode(MsgKind::NotifyAck, ack.len() as u32));
    wire.extend(ack);
    let (d, _) = c.describe();
    let mut fresh = (*d).clone();
    fresh.endpoint = "127.0.0.1:9".into();
    let body = fresh.encode();
    wire.extend(FrameHeader::encode(MsgKind::Describe, body.len() as u32));
    wire.extend(body);
    feed(&mut c, &wire, 3, &mut []);
    let ev = c.take_events();
    assert!(matches!(ev.as_slice(), [Event::Revoke, Event::NotifyAnswer(5, Ok(()), true), Event::Described]));
    assert_eq!((c.describe().0.endpoint.as_str(), c.describe().1), ("127.0.0.1:9", 1));
    // Goodbye ends the stream in order.
    let mut land = |_: u64, _: &[u8]| {};
    assert!(!c.received(&FrameHeader::encode(MsgKind::Goodbye, 0), &mut land).unwrap());
    assert!(c.closed_by_peer());
}

/// A Describe request the connection's end leaves unanswered is an event
/// (its waiter must learn the end now, not at its deadline); one that was
/// answered is not reported again. Guards the `DescribeLost` of `finish`.
#[test]
fn the_end_reports_a_describe_request_left_unanswered() {
    let t0 = Instant::now();
    let mut c = core();
    c.request_describe().unwrap();
    assert_eq!(drain(&mut c, &[], t0), FrameHeader::encode(MsgKind::DescribeRequest, 0).to_vec());
    let body = (*c.describe().0).encode();
    let mut wire = FrameHeader::encode(MsgKind::Describe, body.len() as u32).to_vec();
    wire.extend(body);
    feed(&mut c, &wire, 5, &mut []);
    assert!(matches!(c.take_events().as_slice(), [Event::Described]));
    // Asked again, and the connection ends before the answer.
    c.request_describe().unwrap();
    drain(&mut c, &[], t0);
    c.kill(Error::Unavailable("peer 1 closed the connection".into()), t0);
    assert!(matches!(c.take_events().as_slice(), [Event::DescribeLost]));
    // Once dead, a request is refused at once and nothing more is reported.
    assert_eq!(c.request_describe().unwrap_err().status(), Status::Unavailable);
    c.kill(Error::Unavailable("again".into()), t0);
    assert!(c.take_events().is_empty());
}

/// One submission's requests as the TCP executor stages them: their
/// deadline given once, before they are pushed.
fn staged(deadline: Instant, reqs: Vec<Send<Rec, Rc<()>>>) -> Sends<Rec, Rc<()>> {
    let mut s = Sends::due_at(reqs.len(), deadline);
    reqs.into_iter().for_each(|r| s.push(r));
    s
}

/// A request still queued behind a buffer the socket has not taken fails
/// at its deadline, TIMED_OUT with effect none and its hold let go, while
/// the WRITE in the buffer keeps its own deadline; without a deadline due
/// nothing queued is touched. The submissions are staged as the executor
/// stages them (`Sends::due_at`), with deadlines far, soon, far again:
/// the earliest is the one due. Guards `due: Some(deadline)` in `due_at`
/// (None: nothing is ever due) and the earliest kept in `submit`.
#[test]
fn a_queued_request_fails_at_its_deadline_behind_a_stuck_buffer() {
    let t0 = Instant::now();
    let mut c = core();
    let (hw, hr) = (Rc::new(()), Rc::new(()));
    let far = t0 + Duration::from_secs(3600);
    c.submit(staged(far, vec![send(1, Op::Write, 0, 0x1000, 1 << 20, far, &hw)]));
    assert_eq!(c.next_deadline(), Some(far));
    let (segs, _) = c.transmit(t0);
    assert!(!segs.is_empty(), "the WRITE is in the buffer");
    drop(segs);
    c.sent(100);
    let soon = t0 + Duration::from_secs(1);
    c.submit(staged(soon, vec![send(2, Op::Read, 0, 0x2000, 64, soon, &hr)]));
    assert_eq!(c.next_deadline(), Some(soon));
    let later = t0 + Duration::from_secs(1800);
    c.submit(staged(later, vec![send(3, Op::Read, 0, 0x3000, 64, later, &hr)]));
    assert_eq!(c.next_deadline(), Some(soon), "a later submission hid the earliest deadline");
    c.expire(t0 + Duration::from_millis(999)).unwrap();
    assert!(c.take_done().is_empty(), "expired before its deadline");
    c.expire(t0 + Duration::from_secs(1)).unwrap();
    let done = c.take_done();
    assert_eq!(done.len(), 1);
    let (rec, out) = &done[0];
    assert_eq!((rec.0, out.effect), (2, RemoteEffect::None));
    assert_eq!(out.result.as_ref().unwrap_err().status(), Status::TimedOut);
    assert_eq!(Rc::strong_count(&hr), 2, "the expired READ's memory is let go");
    assert_eq!(Rc::strong_count(&hw), 2, "the WRITE still holds its memory");
    assert_eq!(c.outstanding(), 2, "only the WRITE and the later READ are left");
    assert_eq!(c.next_deadline(), Some(later));
}

/// A core whose WRITE of 1 MiB, due in an hour, is stuck 100 bytes in
/// (the socket takes no more); with the start and that hour.
fn behind_a_stuck_write(hw: &Rc<()>) -> (Core, Instant, Instant) {
    let t0 = Instant::now();
    let mut c = core();
    let far = t0 + Duration::from_secs(3600);
    c.submit(staged(far, vec![send(1, Op::Write, 0, 0x1000, 1 << 20, far, hw)]));
    drop(c.transmit(t0));
    c.sent(100);
    (c, t0, far)
}

/// The requests ended since the last look, with each one's failure status.
fn failed_statuses(c: &mut Core) -> Vec<(u32, Status)> {
    c.take_done().into_iter().map(|(r, o)| (r.0, o.result.unwrap_err().status())).collect()
}

/// Requests pushed into a `Sends` that was not given their submission's
/// deadline (the TCP executor's staged chunks, emptied when a budget wait
/// sends them ahead) still have their deadline watched. Guards the
/// comparison in `Sends::push` (without it the READ below waits an hour).
#[test]
fn requests_pushed_into_an_emptied_sends_keep_their_deadline() {
    let (hw, hr) = (Rc::new(()), Rc::new(()));
    let (mut c, t0, _) = behind_a_stuck_write(&hw);
    let soon = t0 + Duration::from_secs(1);
    let mut rest = Sends::default();
    rest.push(send(2, Op::Read, 0, 0x2000, 64, soon, &hr));
    c.submit(rest);
    assert_eq!(c.next_deadline(), Some(soon));
    c.expire(soon).unwrap();
    let done = failed_statuses(&mut c);
    assert_eq!(done, [(2, Status::TimedOut)]);
}

/// A `Sends` made without a deadline keeps the EARLIEST of the deadlines
/// pushed into it, whatever their order: a READ due in an hour, then one
/// due in 1 s, queued behind a stuck WRITE, are watched from the 1 s one,
/// which fails TIMED_OUT at its deadline while the hour's stays queued.
/// Guards `r.deadline < d` in `Sends::push` (with `>` the latest is kept
/// and the 1 s READ waits an hour; round 6 F4).
#[test]
fn a_sends_keeps_the_earliest_deadline_pushed_into_it_in_any_order() {
    let (hw, hr) = (Rc::new(()), Rc::new(()));
    let (mut c, t0, far) = behind_a_stuck_write(&hw);
    let soon = t0 + Duration::from_secs(1);
    let mut rest = Sends::default();
    rest.push(send(2, Op::Read, 0, 0x2000, 64, far, &hr));
    assert_eq!(rest.due, Some(far));
    rest.push(send(3, Op::Read, 0, 0x3000, 64, soon, &hr));
    assert_eq!(rest.due, Some(soon), "the later deadline pushed first hid the earlier");
    c.submit(rest);
    assert_eq!(c.next_deadline(), Some(soon));
    c.expire(soon - Duration::from_millis(1)).unwrap();
    assert!(c.take_done().is_empty(), "expired before its deadline");
    c.expire(soon).unwrap();
    let done = failed_statuses(&mut c);
    assert_eq!(done, [(3, Status::TimedOut)]);
    assert_eq!((c.outstanding(), Rc::strong_count(&hr)), (2, 2), "the WRITE and READ 2 are left");
    assert_eq!(c.next_deadline(), Some(far));
}

/// One submission's requests queued together behind a stuck buffer: at
/// a deadline, those due fail and the one not due stays queued, to be sent
/// alone once the buffer left. Guards `expire_queued`'s walk through a
/// submission (failing it whole, or keeping it whole, fails this).
#[test]
fn a_submission_queued_whole_expires_request_by_request() {
    let t0 = Instant::now();
    let mut c = core();
    let (hw, hr) = (Rc::new(()), Rc::new(()));
    let (soon, far) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(3600));
    c.submit(vec![send(1, Op::Write, 0, 0x1000, 1 << 20, far, &hw)]);
    drop(c.transmit(t0));
    c.sent(100);
    c.submit(vec![
        send(2, Op::Read, 0, 0x2000, 64, soon, &hr),
        send(3, Op::Read, 0, 0x3000, 64, far, &hr),
        send(4, Op::Read, 0, 0x4000, 64, soon, &hr),
    ]);
    c.expire(soon).unwrap();
    let done = failed_statuses(&mut c);
    assert_eq!(done, [(2, Status::TimedOut), (4, Status::TimedOut)]);
    assert_eq!((c.outstanding(), Rc::strong_count(&hr)), (2, 2), "the WRITE and READ 3 are left");
    assert_eq!(c.next_deadline(), Some(far));
    let head = (FRAME_HEADER_LEN + DATA_REQUEST_LEN) as u64;
    assert!(c.sent(head + (1 << 20) - 100));
    let out = drain(&mut c, &[], soon);
    assert_eq!(out.len(), FRAME_HEADER_LEN + DATA_REQUEST_LEN, "one READ frame");
    let r = DataRequest::decode(out[FRAME_HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!(r.addr, 0x3000);
}

/// A connection lost while WRITE payload is leaving: each WRITE says how
/// much of its payload left (the first wholly, the second 100 of 300
/// bytes, the third none: its header had not left, effect none). Guards
/// `settle`'s `reaching` (what a coalesced run splits by) and its first
/// byte rule.
#[test]
fn a_write_cut_mid_payload_says_how_much_of_it_left() {
    let now = Instant::now();
    let later = now + Duration::from_secs(60);
    let (mut c, hold) = (core(), Rc::new(()));
    assert!(c.submit(vec![
        send(1, Op::Write, 0, 0x1000, 200, later, &hold),
        send(2, Op::Write, 200, 0x2000, 300, later, &hold),
        send(3, Op::Write, 500, 0x3000, 50, later, &hold),
    ]));
    let head = (FRAME_HEADER_LEN + DATA_REQUEST_LEN) as u64;
    let (segs, skip) = c.transmit(now);
    assert_eq!((segs.len(), skip), (6, 0));
    drop(segs);
    // All of the first frame and 100 bytes of the second one's payload.
    assert!(!c.sent(head + 200 + head + 100));
    c.send_failed(Error::Unavailable("cut".into()), now);
    let done: Vec<(u32, RemoteEffect, Option<u64>)> =
        c.take_done().into_iter().map(|(r, o)| (r.0, o.effect, o.reached)).collect();
    assert_eq!(
        done,
        [(1, RemoteEffect::Unknown, Some(200)), (2, RemoteEffect::Unknown, Some(100)), (3, RemoteEffect::None, None)]
    );
    assert_eq!(Rc::strong_count(&hold), 1, "every hold let go");
}

/// Guards `self.abandoned.len() > ABANDONED_MAX` in `expire`: a source
/// that never answers may leave ABANDONED_MAX READs abandoned at their
/// deadline on one connection; one more ends it TIMED_OUT.
#[test]
fn more_than_abandoned_max_unanswered_requests_end_the_connection() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    let late = t0 + Duration::from_secs(1);
    c.submit((0..ABANDONED_MAX as u32).map(|i| send(i, Op::Read, 0, 0x1000, 1, late, &hold)).collect::<Vec<_>>());
    drain(&mut c, &[], t0);
    c.expire(late).unwrap();
    assert_eq!(outcomes(&mut c).len(), ABANDONED_MAX);
    let later = late + Duration::from_secs(1);
    c.submit(vec![send(0, Op::Read, 0, 0x1000, 1, later, &hold)]);
    drain(&mut c, &[], late);
    let e = c.expire(later).unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "{e}");
    assert!(e.message().contains("more than 65536 requests to peer 1 passed their deadline unanswered"), "{e}");
}
