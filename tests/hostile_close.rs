//! A source that ends a connection tells the peer why, and what it told
//! arrives even when the peer kept sending: the source closes gracefully
//! (what it owes leaves, then its FIN, and the peer's bytes are drained)
//! instead of closing with bytes unread, which makes the kernel reset the
//! connection and drop what it had not sent yet; and what it owes leaves
//! before its FIN even when the socket was full as it failed.

mod common;

use common::{eventually, raw_control_over};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message;
use orbite::*;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::FromRawFd;
use std::time::Duration;

/// A connection to `endpoint` whose receive buffer is the smallest the
/// kernel allows (set before the handshake, so the window it offers stays
/// that small): what the source writes beyond it waits in the source's
/// socket until this side reads.
fn connect_small_window(endpoint: &str) -> TcpStream {
    let Some(SocketAddr::V4(a)) = endpoint.to_socket_addrs().unwrap().find(SocketAddr::is_ipv4) else {
        panic!("{endpoint} has no IPv4 address")
    };
    // SAFETY: a new socket; its descriptor is owned by the stream below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a socket this function owns.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on our socket with a valid int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: connect our socket to a valid sockaddr_in of its size.
    let r = unsafe {
        libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    s
}

/// The frames in `bytes`, whole ones only.
fn frames(bytes: &[u8]) -> Vec<(MsgKind, Vec<u8>)> {
    let (mut out, mut at) = (Vec::new(), 0);
    while bytes.len() >= at + FRAME_HEADER_LEN {
        let h = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let end = at + FRAME_HEADER_LEN + h.body_len as usize;
        if end > bytes.len() {
            break;
        }
        out.push((h.kind, bytes[at + FRAME_HEADER_LEN..end].to_vec()));
        at = end;
    }
    out
}

/// A peer asks for a Describe larger than its window (the source's
/// answer waits, mostly unsent, in the source's socket), then sends a
/// frame the source refuses followed by more bytes and its end, and reads
/// only once the source let the connection go. It still receives the
/// whole Describe, then the Error frame naming the refused frame, then
/// the end. Guards `tcp/linger.rs` `Linger::turn` draining the peer's
/// bytes (without the drain the source's socket closes with them unread:
/// the kernel resets the connection and drops the unsent Describe tail
/// and the Error frame).
#[test]
fn the_error_frame_reaches_a_peer_that_sent_more_after_the_refused_frame() {
    const REGIONS: usize = 200;
    const PAGE: usize = 4096;
    let src = Engine::from_json(r#"{"io_threads": 1}"#).unwrap();
    let mem = vec![3u8; REGIONS * PAGE];
    for i in 0..REGIONS {
        src.register_memory(mem.as_ptr() as u64 + (i * PAGE) as u64, PAGE as u64, Access::READ).unwrap();
    }
    let (mut s, d) = raw_control_over(connect_small_window(&src.endpoint()));
    assert_eq!(d.regions.len(), REGIONS);
    s.write_all(&FrameHeader::encode(MsgKind::DescribeRequest, 0)).unwrap();
    // The answer's first bytes came: the source wrote it (one send, done
    // before its I/O thread reads what follows).
    s.peek(&mut [0u8; 1]).unwrap();
    let mut refused = FrameHeader::encode(MsgKind::Describe, 0).to_vec();
    refused[6] = 200;
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let more = vec![0x5au8; 1 << 20];
        let _ = w.write_all(&[&refused[..], &more].concat());
        let _ = w.shutdown(Shutdown::Write);
    });
    eventually("the source let the connection go", || src.stats().io.connections_per_thread.iter().sum::<usize>() == 0);
    writer.join().unwrap();
    let mut got = Vec::new();
    let r = s.read_to_end(&mut got);
    let f = frames(&got);
    let kinds: Vec<MsgKind> = f.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, [MsgKind::Describe, MsgKind::Error], "got {} bytes, then {r:?}", got.len());
    let (st, text) = message::decode_error(&f[1].1).unwrap();
    assert_eq!(st, Status::ProtocolError, "{text}");
    assert!(text.contains("unknown message type"), "{text}");
    r.unwrap();
    assert_eq!(src.stats().events.protocol_errors, 1);
    src.close(Some(Duration::from_secs(30))).unwrap();
}

/// Bytes of one READ's answer here (frame header, fixed part, payload):
/// 16 KiB, so that every sealed record the source makes (16, 32 or
/// 64 KiB of plaintext, or all that waits) ends at an answer's end and
/// no answer is ever half sent when the connection fails.
const ANSWER: u64 = 16 << 10;

/// Bytes the peer's socket still holds unacknowledged (`SIOCOUTQ`).
fn unacked(s: &TcpStream) -> i32 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ on our own socket writes one int into `n`.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(r, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    n
}

/// A sealed peer asks for 16 KiB READs without ever reading, as fast as
/// the source takes its requests: the source's socket fills (the last
/// sealed record half sent, its tail still owed), the answers reach their
/// bound and the source stops reading, and its stall bound (1 s) fails
/// the connection "peer not reading" with no answer half sent, so the
/// Error frame is told, sealed behind the owed tail, which the full
/// socket cannot take. (Sealed, an answer counts as sent once it is in a
/// record, and 16 KiB answers end every record; plain, the kernel's cut
/// falls inside an answer and `SourceCore::fail` tells nothing.) Only
/// once the source's graceful close drained the requests it had left
/// unread (its first turn ran) does the peer read: every answer, whole,
/// then that Error frame (PROTOCOL_ERROR, "peer not reading"), then the
/// end. Guards `tcp/linger.rs` `Linger::turn`'s `self.owed.is_empty() &&
/// !self.shut`: shutting the write side while bytes are owed puts the
/// FIN before them, and the peer loses the reason (verified: without
/// `self.owed.is_empty()` the peer read 7 answers, then a reset).
#[test]
fn an_error_frame_owed_behind_a_full_socket_leaves_before_the_fin() {
    use orbite::control::auth::AuthKey;
    use orbite::control::message::{DataRequest, DataResponse, Describe, DATA_RESPONSE_LEN};
    use orbite::control::pipe::Got;
    use orbite::control::seal::WireSecurity;
    use orbite::control::wire::Wire;
    use orbite::transport::tcp::handshake;
    use std::io::ErrorKind;
    use std::time::Instant;

    let path = common::key_file("close-owed", 0x3c);
    let src = Engine::from_json(&format!(
        r#"{{"io_threads": 1, "auth_key_file": "{path}", "wire_security": "integrity", "handshake_timeout_ms": 1000}}"#
    ))
    .unwrap();
    let mem = common::pattern_vec(11, 1 << 20);
    src.register_memory(mem.as_ptr() as u64, mem.len() as u64, Access::READ).unwrap();
    let key = AuthKey::load(&path).unwrap().with_wire(WireSecurity::Integrity);
    let ours = Describe {
        identity: orbite::control::Identity::fresh().unwrap(),
        capabilities: TransportKind::Tcp.capability_bit(),
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    let (s, d, seal) = handshake::connect(&src.endpoint(), common::LONG, Some(&key), &ours).unwrap();
    let mut wire = Wire::sealed(seal.expect("a keyed connection is sealed"));
    let region = d.regions[0];
    let len = ANSWER - (FRAME_HEADER_LEN + DATA_RESPONSE_LEN) as u64;
    let offset = |tag: u64| (tag % 60) * ANSWER;
    // READs, 64 to a batch, written until the socket takes no more and
    // again while the source has not failed the connection.
    s.set_nonblocking(true).unwrap();
    let (mut tag, mut batch, mut skip) = (0u64, Vec::new(), 0usize);
    let t0 = Instant::now();
    while src.stats().events.protocol_errors == 0 {
        assert!(t0.elapsed() < common::LONG, "the source never failed a peer that does not read");
        if skip == batch.len() {
            batch.clear();
            for _ in 0..64 {
                batch.extend_from_slice(&FrameHeader::encode(MsgKind::ReadRequest, 32));
                let r = DataRequest { tag, region_epoch: region.epoch, addr: region.addr + offset(tag), len };
                batch.extend_from_slice(&r.encode());
                tag += 1;
            }
            skip = 0;
        }
        match wire.send(&s, &[&batch], skip as u64, usize::MAX) {
            Ok(n) => skip += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("writing requests: {e}"),
        }
    }
    assert!(tag * 48 < 12 << 20, "{tag} requests written: past the close's drain bound");
    assert_eq!(src.stats().events.protocol_errors, 1);
    // The close drains what the source left unread: its first turn ran.
    eventually("the source's close drained the requests", || {
        unacked(&s) == 0 || s.take_error().ok().flatten().is_some()
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut plain = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let end = loop {
        assert!(t0.elapsed() < common::LONG, "the stream never ended");
        match wire.read(&s, &mut buf) {
            Ok(Got::Bytes(n)) => plain.extend_from_slice(&buf[..n]),
            Ok(Got::Drained) => {}
            Ok(Got::Eof) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    // Our end (the source's close waits for it); a reset socket has none.
    let _ = s.shutdown(Shutdown::Write);
    let f = frames(&plain);
    let answers = f.len().saturating_sub(1);
    let kinds: Vec<MsgKind> = f.iter().map(|(k, _)| *k).collect();
    let mut want = vec![MsgKind::ReadResponse; answers];
    want.push(MsgKind::Error);
    assert_eq!(kinds, want, "{} bytes, then {end:?}", plain.len());
    assert_eq!(f.iter().map(|(_, b)| b.len() + FRAME_HEADER_LEN).sum::<usize>(), plain.len(), "a frame cut short");
    for (t, (_, body)) in f[..answers].iter().enumerate() {
        let r = DataResponse::decode(body[..DATA_RESPONSE_LEN].try_into().unwrap()).unwrap();
        assert_eq!((r.tag, r.status), (t as u64, Status::Ok));
        let at = offset(t as u64) as usize;
        assert!(body[DATA_RESPONSE_LEN..] == mem[at..at + len as usize], "answer {t}'s bytes");
    }
    assert!(answers > 0 && (answers as u64) < tag, "{answers} of {tag} answers");
    let (st, text) = message::decode_error(&f[answers].1).unwrap();
    assert_eq!(st, Status::ProtocolError, "{text}");
    assert!(text.contains("peer not reading"), "{text}");
    end.unwrap();
    eventually("the source let the connection go", || src.stats().io.connections_per_thread.iter().sum::<usize>() == 0);
    assert_eq!(src.stats().events.protocol_errors, 1);
    src.close(Some(Duration::from_secs(30))).unwrap();
}
