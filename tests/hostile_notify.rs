//! A hostile sender of notifications, alone in its test binary so that the
//! process's memory measures this engine only: a flood of full-size
//! notifications, frames larger than the receiver's limit, and a sender
//! name that breaks the rules. The receiver holds at most
//! `notification_queue` messages, answers every frame (queued, or why
//! not), keeps serving a well-behaved peer, and cuts off only the frame it
//! cannot parse.

mod hostile;
use hostile::*;
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::notify_frame::{decode_ack, Notify};
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn frame(kind: MsgKind, body: &[u8]) -> Vec<u8> {
    let mut v = FrameHeader::encode(kind, body.len() as u32).to_vec();
    v.extend_from_slice(body);
    v
}

/// Reads one frame: its kind and body.
fn read_frame(s: &mut TcpStream) -> (MsgKind, Vec<u8>) {
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = FrameHeader::decode(&h).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).unwrap();
    (h.kind, body)
}

#[test]
fn a_notification_flood_and_oversize_frames_stay_within_the_bound() {
    let mut g = Good::new(r#"{"notification_queue": 8, "notification_max_bytes": 1024}"#);
    let rss0 = proc_status("VmRSS:");
    let mut s = TcpStream::connect(g.src.endpoint()).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(&describe_bytes()).unwrap();
    assert_eq!(read_frame(&mut s).0, MsgKind::Describe);
    const FLOOD: u64 = 20_000;
    let mut reader = s.try_clone().unwrap();
    // Answers are read beside the flood, as a peer that keeps reading.
    let answers = std::thread::spawn(move || {
        let mut verdicts = Vec::new();
        for _ in 0..FLOOD + 2 {
            let (kind, body) = read_frame(&mut reader);
            assert_eq!(kind, MsgKind::NotifyAck);
            let (tag, v) = decode_ack(&body).unwrap();
            verdicts.push((tag, v.map_err(|e| e.status())));
        }
        (verdicts, reader)
    });
    let mut out = Vec::new();
    for tag in 0..FLOOD {
        out.extend(frame(MsgKind::Notify, &Notify { tag, name: "flood".into(), msg: vec![0xAB; 1024] }.encode()));
        if out.len() > 1 << 20 {
            s.write_all(&out).unwrap();
            out.clear();
        }
    }
    // One byte over the limit, and a whole control frame's worth of it.
    out.extend(frame(MsgKind::Notify, &Notify { tag: FLOOD, name: "flood".into(), msg: vec![1; 1025] }.encode()));
    let mut huge = FLOOD.wrapping_add(1).to_le_bytes().to_vec();
    huge.resize(1 << 20, 7);
    out.extend(frame(MsgKind::Notify, &huge));
    s.write_all(&out).unwrap();
    let (verdicts, mut reader) = answers.join().unwrap();
    let ok = verdicts.iter().filter(|(_, v)| v.is_ok()).count();
    let full = verdicts.iter().filter(|(_, v)| *v == Err(Status::ResourceExhausted)).count();
    assert_eq!((ok, full), (8, FLOOD as usize - 8));
    assert_eq!(verdicts[..8].iter().map(|(t, _)| *t).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
    assert_eq!(verdicts[FLOOD as usize], (FLOOD, Err(Status::InvalidArgument)));
    assert_eq!(verdicts[FLOOD as usize + 1], (FLOOD + 1, Err(Status::InvalidArgument)));
    let st = g.src.stats().notifications;
    assert_eq!((st.received, st.rejected, st.queued), (8, FLOOD - 8 + 2, 8));
    // The well-behaved peer is served; the queue holds what it accepted.
    g.transfer();
    for _ in 0..8 {
        let n = g.src.take_notification(Duration::ZERO).unwrap();
        assert_eq!((n.sender.as_str(), n.msg.len()), ("flood", 1024));
    }
    assert_eq!(g.src.take_notification(Duration::ZERO).unwrap_err().status(), Status::TimedOut);
    // A sender name that breaks the rules is a protocol error: the
    // connection ends with an Error frame naming it.
    s.write_all(&frame(MsgKind::Notify, &Notify { tag: 1, name: "a b".into(), msg: vec![] }.encode())).unwrap();
    let (kind, body) = read_frame(&mut reader);
    assert_eq!(kind, MsgKind::Error);
    let (status, text) = orbite::control::message::decode_error(&body).unwrap();
    assert_eq!(status, Status::ProtocolError);
    assert!(text.contains("sender name"), "{text}");
    g.transfer();
    let rss = proc_status("VmRSS:");
    assert!(rss < rss0 + 32 * 1024, "RSS grew from {rss0} kB to {rss} kB");
}

/// A peer that names itself by an endpoint that is not IP:port — 65 535
/// bytes, or a short one hiding another name behind a NUL — is refused at
/// the handshake with a protocol error naming the endpoint: it can queue
/// no notification under a name the receiver's 128-byte buffer (the C
/// API's promise, the C++ `take_notification`'s array) cannot hold, nor
/// one C would read as another sender. The honest peer's notification is
/// then the next one taken, named by its real endpoint. Guards
/// `control/message.rs` `Describe::decode`'s `check_endpoint`.
#[test]
fn a_sender_cannot_name_itself_by_an_endpoint_it_made_up() {
    let g = Good::new("");
    for lie in [format!("127.0.0.1:1{}", "9".repeat(65_000)), "127.0.0.1:1\0boss".to_string()] {
        let d = orbite::control::message::Describe {
            identity: orbite::control::Identity::fresh().unwrap(),
            capabilities: 1,
            fabric_domain: [0; 16],
            endpoint: lie.clone(),
            ipc_name: String::new(),
            regions: vec![],
        };
        let mut s = TcpStream::connect(g.src.endpoint()).unwrap();
        s.write_all(&frame(MsgKind::Describe, &d.encode())).unwrap();
        let _ = s
            .write_all(&frame(MsgKind::Notify, &Notify { tag: 1, name: String::new(), msg: b"lie".to_vec() }.encode()));
        let text = error_text(&mut s).unwrap_or_else(|| panic!("no refusal for {:?}", &lie[..20]));
        assert!(text.contains("Describe endpoint"), "{text}");
    }
    g.req.notify(g.peer, b"honest", Some(LONG)).unwrap();
    let n = g.src.take_notification(LONG).expect("the honest notification");
    assert_eq!((n.sender.as_str(), n.msg.as_slice()), (g.req.endpoint().as_str(), &b"honest"[..]));
    let none = g.src.take_notification(Duration::from_millis(0)).unwrap_err();
    assert_eq!(none.status(), Status::TimedOut, "{none}");
}

/// A notification admitted but never published gives its place back: a
/// sender's valid notification followed, in the same write, by a frame
/// that ends the connection (a sender name that breaks the rules) is
/// admitted and then dropped with the connection before its OK could
/// leave. The receiver's queue holds one: the honest peer's notification
/// is still accepted and is the only one taken. Guards
/// `transport/inbox.rs` `Admitted::drop`'s `held -= 1` (without it the
/// dropped notification kept its place for good, and every later one was
/// refused RESOURCE_EXHAUSTED).
#[test]
fn a_notification_dropped_with_its_connection_gives_its_place_back() {
    let g = Good::new(r#"{"notification_queue": 1}"#);
    let mut s = TcpStream::connect(g.src.endpoint()).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(&describe_bytes()).unwrap();
    assert_eq!(read_frame(&mut s).0, MsgKind::Describe);
    let mut out = frame(MsgKind::Notify, &Notify { tag: 1, name: "dropped".into(), msg: b"never".to_vec() }.encode());
    out.extend(frame(MsgKind::Notify, &Notify { tag: 2, name: "a b".into(), msg: vec![] }.encode()));
    s.write_all(&out).unwrap();
    let text = error_text(&mut s).expect("the connection ends with an Error frame");
    assert!(text.contains("sender name"), "{text}");
    g.req.notify(g.peer, b"honest", Some(LONG)).unwrap();
    let n = g.src.take_notification(LONG).expect("the honest notification");
    assert_eq!((n.sender.as_str(), n.msg.as_slice()), (g.req.endpoint().as_str(), &b"honest"[..]));
    let none = g.src.take_notification(Duration::ZERO).unwrap_err();
    assert_eq!(none.status(), Status::TimedOut, "{none}");
    let st = g.src.stats().notifications;
    assert_eq!((st.received, st.rejected), (1, 0));
}

/// A sender name of multi-byte characters, long enough that the Error
/// naming it is cut at the reason's bound: the cut falls inside a
/// character for one of the three alignments sent, and the receiver still
/// answers each with an Error frame (its reason cut at a character
/// boundary, at most 1024 bytes) and keeps serving. Guards the
/// character-boundary cut of `message::encode_error` (slicing the text at
/// 1024 bytes panicked the receiver's I/O thread).
#[test]
fn a_long_multibyte_sender_name_is_refused_with_its_reason_cut_whole() {
    let g = Good::new("");
    for pad in 0..3 {
        let mut s = TcpStream::connect(g.src.endpoint()).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        s.write_all(&describe_bytes()).unwrap();
        assert_eq!(read_frame(&mut s).0, MsgKind::Describe);
        let name = format!("{}{}", "a".repeat(pad), "\u{20ac}".repeat(400));
        s.write_all(&frame(MsgKind::Notify, &Notify { tag: 1, name, msg: vec![] }.encode())).unwrap();
        let text = error_text(&mut s).unwrap_or_else(|| panic!("pad {pad}: the connection ends with an Error frame"));
        assert!(text.len() <= 1024 && text.len() > 1000, "pad {pad}: {} bytes", text.len());
        assert!(text.contains("\u{20ac}\u{20ac}"), "pad {pad}: {text}");
    }
    g.req.notify(g.peer, b"honest", Some(LONG)).unwrap();
    let n = g.src.take_notification(LONG).expect("the honest notification");
    assert_eq!(n.msg.as_slice(), &b"honest"[..]);
}
