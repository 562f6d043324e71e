//! A source that ends a connection tells the peer why, and what it told
//! arrives even when the peer kept sending: the source closes gracefully
//! (what it owes leaves, then its FIN, and the peer's bytes are drained)
//! instead of closing with bytes unread, which makes the kernel reset the
//! connection and drop what it had not sent yet.

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
