//! What the TCP requester core checks in a source's answers and control
//! frames: late answers taken once, answers to a WRITE still leaving,
//! bodies where none belong, lying control frames, overlong reasons.

use super::*;

/// The error a lying answer `wire` ends the connection with.
fn refused(c: &mut Core, wire: &[u8]) -> Error {
    let mut land = |_: u64, _: &[u8]| panic!("a lying answer landed bytes");
    c.received(wire, &mut land).expect_err("a lying answer was taken")
}

/// A READ (4096 bytes, tag 1) and a WRITE (16 bytes, tag 2), sent and
/// failed at their deadline: the core, now.
fn both_late() -> (Core, Vec<u64>, Instant) {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![
        send(1, Op::Read, 0, 0x1000, 4096, t0 + Duration::from_secs(1), &hold),
        send(2, Op::Write, 0, 0x2000, 16, t0 + Duration::from_secs(1), &hold),
    ]);
    let tags = requests(&drain(&mut c, &[0u8; 16], t0)).iter().map(|r| r.1.tag).collect();
    c.expire(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(outcomes(&mut c).len(), 2);
    (c, tags, t0)
}

/// The answer to a request already failed at its deadline is checked as
/// any answer is before it is dropped: one of another length, another
/// direction, a WRITE success with a body, or an overlong failure text is
/// a protocol error naming the mismatch (dropped, its bytes would be read
/// as the next frames), and a second answer to the same tag is an unknown
/// tag. Guards `abandoned_answer`: its `remove` (not `get`), and each arm
/// of `fits`.
#[test]
fn a_late_answer_is_checked_as_any_answer_and_taken_once() {
    let long = vec![b'x'; MAX_REASON + 3];
    let fine = vec![b'x'; MAX_REASON + 2];
    for (i, case) in [
        (MsgKind::ReadResponse, 0usize, Status::Ok, vec![0u8; 4000]),
        (MsgKind::ReadResponse, 0, Status::Ok, vec![0u8; 4097]),
        (MsgKind::WriteResponse, 1, Status::Ok, vec![0u8; 1]),
        (MsgKind::WriteResponse, 0, Status::Ok, vec![]),
        (MsgKind::ReadResponse, 1, Status::Ok, vec![0u8; 16]),
        (MsgKind::ReadResponse, 0, Status::PermissionDenied, long.clone()),
    ]
    .into_iter()
    .enumerate()
    {
        let (mut c, tags, _) = both_late();
        let tag = tags[case.1];
        let e = refused(&mut c, &answer(case.0, tag, case.2, &case.3));
        assert_eq!(e.status(), Status::ProtocolError, "case {i}: {e}");
        assert!(e.message().contains(&format!("for tag {tag} does not match its request")), "case {i}: {e}");
    }
    // Honest late answers (a failure with the longest text) are dropped,
    // once: the second answer to a tag is nobody's.
    let (mut c, tags, _) = both_late();
    let mut wire = answer(MsgKind::ReadResponse, tags[0], Status::PermissionDenied, &fine);
    wire.extend(answer(MsgKind::WriteResponse, tags[1], Status::Ok, &[]));
    feed(&mut c, &wire, 1 << 20, &mut []);
    assert_eq!(c.dropped, 2);
    let e = refused(&mut c, &answer(MsgKind::WriteResponse, tags[1], Status::Ok, &[]));
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(e.message().contains(&format!("WriteResponse for unknown tag {}", tags[1])), "{e}");
}

/// A WRITE (100 000 bytes) with only its first 1000 bytes sent: the core,
/// its tag and the wire's total.
fn write_still_leaving() -> (Core, u64, Rc<()>) {
    let now = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Write, 0, 0x1000, 100_000, now + Duration::from_secs(60), &hold)]);
    let (segs, _) = c.transmit(now);
    let Segment::Bytes(b) = &segs[0] else { panic!("the request's header first") };
    let tag =
        DataRequest::decode(b[FRAME_HEADER_LEN..FRAME_HEADER_LEN + DATA_REQUEST_LEN].try_into().unwrap()).unwrap().tag;
    assert!(!c.sent(1000));
    (c, tag, hold)
}

/// The answer to a WRITE whose payload is still leaving is checked as
/// one that came after: a second answer to it, a success with a body or
/// a failure text past MAX_REASON is a protocol error (kept on its entry,
/// the second would replace the first). Guards `answer`'s
/// `e.early.is_some()` arm and `early_answer`'s two refusals.
#[test]
fn an_answer_to_a_write_still_leaving_is_checked_and_taken_once() {
    let (mut c, tag, _hold) = write_still_leaving();
    feed(&mut c, &answer(MsgKind::WriteResponse, tag, Status::Ok, &[]), 1 << 20, &mut []);
    let e = refused(&mut c, &answer(MsgKind::WriteResponse, tag, Status::PermissionDenied, &[]));
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(e.message().contains(&format!("WriteResponse for tag {tag} answered twice")), "{e}");
    let (mut c, tag, _hold) = write_still_leaving();
    let e = refused(&mut c, &answer(MsgKind::WriteResponse, tag, Status::Ok, &[7]));
    assert_eq!((e.status(), e.message()), (Status::ProtocolError, "WRITE success carries a body"));
    let (mut c, tag, _hold) = write_still_leaving();
    let e = refused(&mut c, &answer(MsgKind::WriteResponse, tag, Status::PermissionDenied, &[b'x'; MAX_REASON + 3]));
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(e.message().contains(&format!("failure text of {} bytes is too long", MAX_REASON + 3)), "{e}");
}

/// A WRITE whose payload left, answered OK with a body: a protocol error,
/// the WRITE failed with effect UNKNOWN (its bytes reached the source; the
/// body would be read as the next frame). Guards `answer`'s
/// `Op::Write if rest != 0`.
#[test]
fn a_write_success_with_a_body_is_a_protocol_error() {
    let t0 = Instant::now();
    let (mut c, hold) = (core(), Rc::new(()));
    c.submit(vec![send(1, Op::Write, 0, 0x1000, 16, t0 + Duration::from_secs(60), &hold)]);
    let sent = requests(&drain(&mut c, &[3u8; 16], t0));
    let e = refused(&mut c, &answer(MsgKind::WriteResponse, sent[0].1.tag, Status::Ok, &[0u8; 4]));
    assert_eq!((e.status(), e.message()), (Status::ProtocolError, "WRITE success carries a body"));
    assert_eq!(outcomes(&mut c), [(1, Status::ProtocolError, RemoteEffect::Unknown)]);
    assert_eq!(Rc::strong_count(&hold), 1);
}

/// Control frames a lying source may send: a Revoke with a body, a
/// NotifyAck for a tag never sent, an Error frame saying OK (still the
/// end: UNAVAILABLE, not a success or the caller's INVALID_ARGUMENT), and
/// a stream that ends inside a frame header (not an orderly close).
/// Guards `complete`'s `Goodbye | Revoke if h.body_len != 0`,
/// `control_frame`'s unknown NotifyAck tag and Error status, and `eof`'s
/// `(Want::Header, true)`.
#[test]
fn lying_control_frames_end_the_connection_naming_why() {
    let mut c = core();
    let mut revoke = FrameHeader::encode(MsgKind::Revoke, 4).to_vec();
    revoke.extend([0u8; 4]);
    let e = refused(&mut c, &revoke);
    assert_eq!((e.status(), e.message()), (Status::ProtocolError, "Revoke with a body"));
    assert!(c.take_events().is_empty());

    let mut c = core();
    let ack = crate::control::notify_frame::encode_ack(77, &Ok(()));
    let mut wire = FrameHeader::encode(MsgKind::NotifyAck, ack.len() as u32).to_vec();
    wire.extend(ack);
    let e = refused(&mut c, &wire);
    assert_eq!((e.status(), e.message()), (Status::ProtocolError, "NotifyAck for unknown tag 77"));

    let mut c = core();
    let body = crate::control::message::encode_error(Status::Ok, "all fine");
    let mut wire = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
    wire.extend(body);
    let e = refused(&mut c, &wire);
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert_eq!(e.message(), "peer 1 closed the connection: all fine");

    let mut c = core();
    feed(&mut c, &FrameHeader::encode(MsgKind::Goodbye, 0)[..7], 1 << 20, &mut []);
    let e = c.eof().expect_err("a stream cut inside a header ended in order");
    assert_eq!((e.status(), e.message()), (Status::Unavailable, "peer closed the connection mid-frame"));
    assert!(!c.closed_by_peer());
}

/// A Describe request the source answered is not reported lost when the
/// connection ends later (its waiter has its answer; a stale count would
/// fail the next one's at once). Guards `control_frame`'s
/// `self.describes_awaited = self.describes_awaited.saturating_sub(1);`.
#[test]
fn an_answered_describe_request_is_not_reported_lost_at_the_end() {
    let t0 = Instant::now();
    let mut c = core();
    c.request_describe().unwrap();
    drain(&mut c, &[], t0);
    let body = (*c.describe().0).encode();
    let mut wire = FrameHeader::encode(MsgKind::Describe, body.len() as u32).to_vec();
    wire.extend(body);
    feed(&mut c, &wire, 1 << 20, &mut []);
    assert!(matches!(c.take_events().as_slice(), [Event::Described]));
    c.kill(Error::Unavailable("peer 1 closed the connection".into()), t0);
    assert!(c.take_events().is_empty(), "an answered Describe request reported lost");
}

/// A NotifyAck whose refusal text is one byte past MAX_REASON ends the
/// connection naming it (a source may not hand the caller unbounded
/// text). Guards `control/notify_frame.rs` `decode_ack`'s
/// `if text.len() > MAX_REASON {`.
#[test]
fn a_notify_ack_with_an_overlong_reason_is_a_protocol_error() {
    let t0 = Instant::now();
    let mut c = core();
    c.notify(|t| t.to_le_bytes().to_vec(), t0 + Duration::from_secs(9), 5);
    let sent = drain(&mut c, &[], t0);
    let tag = u64::from_le_bytes(sent[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 8].try_into().unwrap());
    let mut ack = tag.to_le_bytes().to_vec();
    ack.extend((Status::PermissionDenied as u32).to_le_bytes());
    ack.extend(((MAX_REASON + 1) as u16).to_le_bytes());
    ack.extend(vec![b'r'; MAX_REASON + 1]);
    let mut wire = FrameHeader::encode(MsgKind::NotifyAck, ack.len() as u32).to_vec();
    wire.extend(ack);
    let e = refused(&mut c, &wire);
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert_eq!(e.message(), format!("NotifyAck reason of {} bytes is too long", MAX_REASON + 1));
}

/// A failure answer's text is taken up to MAX_REASON + 2 bytes (a
/// reason and its length) and refused one byte past it, both for an
/// answer to a request sent whole and for one to a WRITE still leaving:
/// the longest fails its request with the source's status and text; one
/// byte more is a protocol error naming its length. Guards `answer`'s and
/// `early_answer`'s `rest > MAX_REASON as u64 + 2` (sweep B).
#[test]
fn a_failure_text_is_taken_up_to_its_bound_and_refused_one_byte_past() {
    let t0 = Instant::now();
    let fine = vec![b'r'; MAX_REASON + 2];
    let long = vec![b'r'; MAX_REASON + 3];
    let sent_read = || {
        let (mut c, hold) = (core(), Rc::new(()));
        c.submit(vec![send(1, Op::Read, 0, 0x1000, 64, t0 + Duration::from_secs(60), &hold)]);
        let tag = requests(&drain(&mut c, &[0u8; 64], t0))[0].1.tag;
        (c, tag)
    };
    let (mut c, tag) = sent_read();
    feed(&mut c, &answer(MsgKind::ReadResponse, tag, Status::PermissionDenied, &fine), 1 << 20, &mut []);
    let done = c.take_done();
    assert_eq!(done.len(), 1);
    let e = done[0].1.result.as_ref().expect_err("the READ failed");
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert_eq!(e.message(), format!("peer 1: {}", String::from_utf8(fine.clone()).unwrap()));
    let (mut c, tag) = sent_read();
    let e = refused(&mut c, &answer(MsgKind::ReadResponse, tag, Status::PermissionDenied, &long));
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert_eq!(e.message(), format!("failure text of {} bytes is too long", MAX_REASON + 3));
    assert_eq!(outcomes(&mut c), [(1, Status::ProtocolError, RemoteEffect::None)]);
    // A WRITE still leaving: the longest text is taken (kept on its entry).
    let (mut c, tag, _hold) = write_still_leaving();
    feed(&mut c, &answer(MsgKind::WriteResponse, tag, Status::PermissionDenied, &fine), 1 << 20, &mut []);
    assert!(c.take_done().is_empty(), "kept on its entry while its payload leaves");
}
