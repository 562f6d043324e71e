//! Requesters that push a source served on I/O threads to its edges:
//! pipelining thousands of small READs in one write (reading stops while
//! answers wait and must resume), frames split at every byte, Goodbye
//! behind queued answers, an oversized notification cut at odd places.
mod common;

use common::{pattern_vec, raw_control};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message::{DataRequest, DataResponse, Describe, DATA_RESPONSE_LEN};
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn read_frame(s: &mut TcpStream) -> std::io::Result<(FrameHeader, Vec<u8>)> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h)?;
    let h = FrameHeader::decode(&h).unwrap();
    let mut b = vec![0u8; h.body_len as usize];
    s.read_exact(&mut b)?;
    Ok((h, b))
}

fn read_req(tag: u64, d: &Describe, off: u64, len: u64) -> Vec<u8> {
    let r = d.regions[0];
    let mut f = FrameHeader::encode(MsgKind::ReadRequest, 32).to_vec();
    f.extend_from_slice(&DataRequest { tag, region_epoch: r.epoch, addr: r.addr + off, len }.encode());
    f
}

/// An honest pipelining requester: writes N small READs at once, then
/// reads the N answers. Every answer must come.
fn pipeline(n: u64, len: u64, extra: &[u8]) {
    let src = Engine::from_json(r#"{"handshake_timeout_ms": 3000}"#).unwrap();
    let remote = pattern_vec(3, 1 << 20);
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ).unwrap();
    let (mut s, d) = raw_control(&src.endpoint());
    let mut frames = extra.to_vec();
    for tag in 0..n {
        frames.extend(read_req(tag, &d, (tag * 64) % (1 << 19), len));
    }
    s.write_all(&frames).unwrap();
    let t0 = Instant::now();
    let mut got = 0u64;
    let mut describes = 0;
    while got < n {
        match read_frame(&mut s) {
            Ok((h, _)) if h.kind == MsgKind::Describe => describes += 1,
            Ok((h, b)) => {
                assert_eq!(h.kind, MsgKind::ReadResponse, "{:?}", String::from_utf8_lossy(&b));
                let r = DataResponse::decode(b[..DATA_RESPONSE_LEN].try_into().unwrap()).unwrap();
                assert_eq!((r.tag, r.status), (got, Status::Ok));
                got += 1;
            }
            Err(e) => panic!("after {got}/{n} answers ({describes} describes, {:?}): {e}", t0.elapsed()),
        }
    }
    src.close(Some(Duration::from_secs(10))).unwrap();
}

/// 3000 READs of 8 bytes (48-byte frames) in one write: reading pauses
/// while 1024 answers wait, and neither the paused frame's bound (it was
/// cut "too slow") nor the lost readable edge (it hung) ends the stream.
#[test]
fn pipelined_small_reads_all_answered() {
    pipeline(3000, 8, &[]);
}

/// The same with a DescribeRequest in front, so the first 64 KiB read ends
/// on a frame boundary (the variant that hung with no bound running).
#[test]
fn pipelined_small_reads_frame_aligned() {
    let extra = FrameHeader::encode(MsgKind::DescribeRequest, 0).to_vec();
    pipeline(3000, 8, &extra);
}

fn engine(cfg: &str) -> (Engine, Vec<u8>) {
    let src = Engine::from_json(cfg).unwrap();
    let remote = pattern_vec(3, 1 << 20);
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ_WRITE).unwrap();
    (src, remote)
}

/// Every frame split at every byte (one byte per write, Nagle off).
#[test]
fn byte_by_byte_frames() {
    let (src, remote) = engine(r#"{"handshake_timeout_ms": 3000}"#);
    let (mut s, d) = raw_control(&src.endpoint());
    s.set_nodelay(true).unwrap();
    let r = d.regions[0];
    let mut frames = read_req(1, &d, 100, 16);
    let mut w = FrameHeader::encode(MsgKind::WriteRequest, 32 + 8).to_vec();
    w.extend_from_slice(&DataRequest { tag: 2, region_epoch: r.epoch, addr: r.addr + 200, len: 8 }.encode());
    w.extend_from_slice(b"ABCDEFGH");
    frames.extend(w);
    frames.extend(FrameHeader::encode(MsgKind::DescribeRequest, 0));
    // (zero-length READ/WRITE: PROTOCOL_ERROR "data request length 0 is invalid", by design)
    for (i, b) in frames.iter().enumerate() {
        if let Err(e) = s.write_all(&[*b]) {
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            panic!("byte {i}/{}: {e}; source sent {:?}", frames.len(), String::from_utf8_lossy(&rest));
        }
        // The attack's pace (each byte its own segment), not synchronisation.
        std::thread::sleep(Duration::from_millis(2));
    }
    let (h, b) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, MsgKind::ReadResponse);
    assert_eq!(&b[DATA_RESPONSE_LEN..], &remote[100..116]);
    let (h, b) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, MsgKind::WriteResponse, "{}", String::from_utf8_lossy(&b));
    assert_eq!(&remote[200..208], b"ABCDEFGH");
    let (h, _) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, MsgKind::Describe);
    src.close(Some(Duration::from_secs(10))).unwrap();
}

/// Goodbye right behind pipelined READs: every answer leaves, then EOF.
#[test]
fn goodbye_with_answers_queued() {
    let (src, _remote) = engine("");
    let (mut s, d) = raw_control(&src.endpoint());
    let mut frames = Vec::new();
    for tag in 0..200 {
        frames.extend(read_req(tag, &d, 0, 65536));
    }
    frames.extend(FrameHeader::encode(MsgKind::Goodbye, 0));
    s.write_all(&frames).unwrap();
    for tag in 0..200 {
        let (h, b) = read_frame(&mut s).unwrap_or_else(|e| panic!("answer {tag}: {e}"));
        assert_eq!(h.kind, MsgKind::ReadResponse);
        assert_eq!(DataResponse::decode(b[..16].try_into().unwrap()).unwrap().tag, tag);
    }
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    let t0 = Instant::now();
    while src.stats().incoming_connections != 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "record not reaped");
        std::thread::yield_now();
    }
    src.close(Some(Duration::from_secs(10))).unwrap();
}

/// A Notify frame larger than notification_max_bytes, split in odd pieces,
/// then a valid READ: the notify is refused (NotifyAck) and the READ served.
#[test]
fn oversize_notify_split_weirdly() {
    let (src, remote) = engine("");
    let (mut s, d) = raw_control(&src.endpoint());
    s.set_nodelay(true).unwrap();
    let body_len = 4096 + 5000;
    let mut f = FrameHeader::encode(MsgKind::Notify, body_len as u32).to_vec();
    f.extend_from_slice(&77u64.to_le_bytes());
    f.extend(std::iter::repeat_n(0xAB, body_len - 8));
    f.extend(read_req(5, &d, 8, 8));
    let cuts = [1usize, 15, 17, 23, 24, 25, 4000, 9000, 9111];
    let mut at = 0;
    for c in cuts.iter().chain(std::iter::once(&f.len())) {
        let c = (*c).min(f.len());
        s.write_all(&f[at..c]).unwrap();
        at = c;
        // The attack's pace (each piece its own segment).
        std::thread::sleep(Duration::from_millis(30));
    }
    let (h, b) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, MsgKind::NotifyAck, "{:?}", String::from_utf8_lossy(&b));
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 77);
    let (h, b) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, MsgKind::ReadResponse);
    assert_eq!(&b[16..], &remote[8..16]);
    assert_eq!(src.stats().notifications.rejected, 1);
}

/// Writes `frames` to the source `src` on the raw connection `s`: the
/// source answers one Error frame, PROTOCOL_ERROR naming `why`, sends
/// nothing after it and counts one protocol error; then `src` closes.
fn refused_at_once(src: Engine, mut s: TcpStream, frames: &[u8], why: &str) {
    s.write_all(frames).unwrap();
    let (h, b) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, MsgKind::Error, "{:?}: {}", h.kind, String::from_utf8_lossy(&b));
    let (status, said) = orbite::control::message::decode_error(&b).unwrap();
    assert_eq!(status, Status::ProtocolError, "{said}");
    assert!(said.contains(why), "{said}");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the source sent more after its Error frame: {} bytes", rest.len());
    assert_eq!(src.stats().events.protocol_errors, 1);
    src.close(Some(Duration::from_secs(10))).unwrap();
}

/// A ReadRequest whose header names a body shorter than the request's
/// 32-byte fixed part, then a valid READ: the source answers the short
/// frame at once with PROTOCOL_ERROR naming it and closes, serving
/// nothing (it never borrows the next frame's bytes to fill the short
/// one). Guards `h.body_len as usize != DATA_REQUEST_LEN` in
/// `tcp/proto/source/receive.rs` (with `>` the short request took 16 bytes
/// of the READ behind it: the stream misframed).
#[test]
fn a_read_request_shorter_than_its_fixed_part_is_refused_at_once() {
    let (src, _remote) = engine("");
    let (s, d) = raw_control(&src.endpoint());
    let mut frames = FrameHeader::encode(MsgKind::ReadRequest, 16).to_vec();
    frames.extend_from_slice(&read_req(1, &d, 0, 64)[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 16]);
    frames.extend(read_req(2, &d, 0, 64));
    refused_at_once(src, s, &frames, "ReadRequest body of 16 bytes");
}

/// A ReadRequest whose header names a body LONGER than its 32-byte fixed
/// part (40 bytes: the surplus 8 the first half of a READ's header, whose
/// second half and request follow): the source answers it at once with
/// PROTOCOL_ERROR naming it and closes, serving nothing. Guards
/// `h.body_len as usize != DATA_REQUEST_LEN` in
/// `tcp/proto/source/receive.rs` against a `<` (round 7 G7: the long
/// request was served as a READ of its fixed part, and its surplus read
/// as the next frame's header: the READ smuggled behind it was served
/// too).
#[test]
fn a_read_request_longer_than_its_fixed_part_is_refused_at_once() {
    let (src, _remote) = engine("");
    let (s, d) = raw_control(&src.endpoint());
    let mut frames = FrameHeader::encode(MsgKind::ReadRequest, 32 + 8).to_vec();
    frames.extend_from_slice(&read_req(1, &d, 0, 64)[FRAME_HEADER_LEN..]);
    // Its body's last 8 bytes are the first 8 of this READ's header.
    frames.extend(read_req(2, &d, 0, 64));
    refused_at_once(src, s, &frames, "ReadRequest body of 40 bytes");
}

/// A WriteRequest whose body is shorter than its fixed part and its length
/// (32 + 32 bytes for a WRITE of 64), followed by a READ: PROTOCOL_ERROR
/// naming the mismatch, and not one byte of the region changes (taken at
/// its length, the WRITE would land the next frame's bytes in registered
/// memory and answer OK). Guards `transport/tcp/proto/source/receive.rs`
/// `if h.body_len as u64 != DATA_REQUEST_LEN as u64 + req.len`.
#[test]
fn a_write_request_shorter_than_its_length_is_refused_and_lands_nothing() {
    let (src, remote) = engine("");
    let (s, d) = raw_control(&src.endpoint());
    let r = d.regions[0];
    let mut frames = FrameHeader::encode(MsgKind::WriteRequest, 32 + 32).to_vec();
    frames.extend_from_slice(&DataRequest { tag: 1, region_epoch: r.epoch, addr: r.addr + 200, len: 64 }.encode());
    frames.extend_from_slice(&[0xab; 32]);
    frames.extend(read_req(2, &d, 0, 64));
    refused_at_once(src, s, &frames, "WriteRequest body of 64 bytes does not match its length 64");
    assert!(remote == pattern_vec(3, 1 << 20), "the region's bytes changed");
}

/// A WriteRequest whose body is LONGER than its fixed part and its length
/// (32 + 64 + 16 bytes for a WRITE of 64: the 16 extra bytes the header of
/// a READ), its 80 bytes, then a READ: PROTOCOL_ERROR naming the mismatch
/// at once, and not one byte of the region changes. (Taken at its length,
/// the WRITE landed its 64 bytes in registered memory, and the 16 extra
/// bytes were read as the next frame's header: the READ behind them was
/// misframed, refused as "data request length ... is invalid".) Guards
/// `transport/tcp/proto/source/receive.rs`
/// `if h.body_len as u64 != DATA_REQUEST_LEN as u64 + req.len` against a
/// `<` (round 6 F3).
#[test]
fn a_write_request_longer_than_its_length_is_refused_and_lands_nothing() {
    let (src, remote) = engine("");
    let (s, d) = raw_control(&src.endpoint());
    let r = d.regions[0];
    let mut frames = FrameHeader::encode(MsgKind::WriteRequest, 32 + 64 + 16).to_vec();
    frames.extend_from_slice(&DataRequest { tag: 1, region_epoch: r.epoch, addr: r.addr + 200, len: 64 }.encode());
    frames.extend_from_slice(&[0xab; 64]);
    frames.extend_from_slice(&FrameHeader::encode(MsgKind::ReadRequest, 32));
    frames.extend(read_req(2, &d, 0, 64));
    refused_at_once(src, s, &frames, "WriteRequest body of 112 bytes does not match its length 64");
    assert!(remote == pattern_vec(3, 1 << 20), "the region's bytes changed");
}

/// A DescribeRequest carrying an 8-byte body: the source answers at once
/// with PROTOCOL_ERROR naming it and closes, sending no Describe (taken
/// as a request, its body would be read as the next frame). Guards
/// `transport/tcp/proto/source/receive.rs`
/// `MsgKind::DescribeRequest if h.body_len != 0 => Err(`.
#[test]
fn a_describe_request_with_a_body_is_refused_at_once() {
    let (src, _remote) = engine("");
    let (s, d) = raw_control(&src.endpoint());
    let mut frames = FrameHeader::encode(MsgKind::DescribeRequest, 8).to_vec();
    frames.extend_from_slice(&read_req(1, &d, 0, 64)[..8]);
    refused_at_once(src, s, &frames, "DescribeRequest with a body");
}

/// Requests the source refuses on their merits (out of its region, of a
/// region epoch it does not hold, a WRITE to a READ-only region) are
/// answered with their status, one by one, between two it serves, and
/// each is counted in the source's `served_failed` for TCP; the two
/// served READs alone are `served_requests` (32 bytes), and the refused
/// WRITE lands nothing. Guards `host.served(false, 0)` in the TCP
/// source's `refuse` (round 15 O9: without it a source refusing every
/// request showed no failure in its stats).
#[test]
fn requests_the_source_refuses_are_counted_served_failed() {
    let src = Engine::from_json("").unwrap();
    let remote = pattern_vec(3, 1 << 20);
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ).unwrap();
    let (mut s, d) = raw_control(&src.endpoint());
    let r = d.regions[0];
    let mut frames = read_req(1, &d, 0, 16);
    frames.extend(read_req(2, &d, (1 << 20) - 8, 16));
    frames.extend(FrameHeader::encode(MsgKind::ReadRequest, 32));
    frames.extend(DataRequest { tag: 3, region_epoch: r.epoch + 1, addr: r.addr, len: 16 }.encode());
    frames.extend(FrameHeader::encode(MsgKind::WriteRequest, 32 + 8));
    frames.extend(DataRequest { tag: 4, region_epoch: r.epoch, addr: r.addr, len: 8 }.encode());
    frames.extend(b"ABCDEFGH");
    frames.extend(read_req(5, &d, 16, 16));
    s.write_all(&frames).unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        let (h, b) = read_frame(&mut s).unwrap();
        let a = DataResponse::decode(b[..DATA_RESPONSE_LEN].try_into().unwrap()).unwrap();
        got.push((a.tag, h.kind, a.status));
    }
    use MsgKind::{ReadResponse as Read, WriteResponse as Write};
    let want = [
        (1, Read, Status::Ok),
        (2, Read, Status::OutOfRange),
        (3, Read, Status::StalePeer),
        (4, Write, Status::PermissionDenied),
        (5, Read, Status::Ok),
    ];
    assert_eq!(got, want);
    let tcp = src.stats().transports["tcp"].clone();
    assert_eq!((tcp.served_failed, tcp.served_requests, tcp.served_bytes), (3, 2, 32));
    assert!(remote == pattern_vec(3, 1 << 20), "the refused WRITE landed");
    src.close(Some(Duration::from_secs(10))).unwrap();
}

/// A peer without the key opens a keyed engine with an AuthChallenge
/// announcing exactly `MAX_AUTH_BODY` bytes, then one more: the first's
/// body is read and checked (PERMISSION_DENIED, "authentication not
/// completed", naming its length), the second is refused from its header
/// alone, before any body byte is sent ("requires authentication").
/// Each counts as one failed authentication. Guards
/// `transport/tcp/handshake.rs` `open`'s `first.body_len >
/// auth::MAX_AUTH_BODY` (sweep B).
#[test]
fn an_auth_challenge_of_the_longest_body_is_read_and_one_byte_more_refused_from_its_header() {
    use orbite::control::auth::MAX_AUTH_BODY;
    let key = common::key_file("auth-bound", 5);
    let src = Engine::from_json(&format!(r#"{{"auth_key_file": "{key}"}}"#)).unwrap();
    let cases = [
        (MAX_AUTH_BODY, true, format!("authentication not completed: AuthChallenge body has {MAX_AUTH_BODY} bytes")),
        (MAX_AUTH_BODY + 1, false, "requires authentication (auth_key_file) before AuthChallenge".to_string()),
    ];
    for (n, (announced, with_body, why)) in cases.into_iter().enumerate() {
        let mut s = TcpStream::connect(src.endpoint()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut frame = FrameHeader::encode(MsgKind::AuthChallenge, announced).to_vec();
        if with_body {
            frame.extend(vec![7u8; announced as usize]);
        }
        s.write_all(&frame).unwrap();
        let (h, body) = read_frame(&mut s).unwrap_or_else(|e| panic!("{announced} bytes: no answer: {e}"));
        assert_eq!(h.kind, MsgKind::Error, "{announced} bytes");
        let (st, text) = orbite::control::message::decode_error(&body).unwrap();
        assert_eq!(st, Status::PermissionDenied, "{announced} bytes: {text}");
        assert!(text.contains(&why), "{announced} bytes: {text}");
        assert_eq!(src.stats().events.auth_failures, n as u64 + 1, "{announced} bytes");
    }
    src.close(Some(Duration::from_secs(10))).unwrap();
}
