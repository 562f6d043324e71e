//! A connection that breaks the protocol is closed with an Error frame;
//! the engine keeps serving well-behaved peers.

use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN, PROTOCOL_VERSION};
use orbite::control::message;
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Sends `bytes`, then reads until EOF; returns the Error frame's text if
/// the engine sent one.
fn hostile(endpoint: &str, bytes: &[u8]) -> Option<(Status, String)> {
    let mut s = TcpStream::connect(endpoint).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(bytes).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    if all.len() < FRAME_HEADER_LEN {
        return None;
    }
    let h = FrameHeader::decode(all[..FRAME_HEADER_LEN].try_into().unwrap()).ok()?;
    if h.kind != MsgKind::Error {
        return None;
    }
    message::decode_error(&all[FRAME_HEADER_LEN..FRAME_HEADER_LEN + h.body_len as usize]).ok()
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let mut remote = vec![5u8; 4096];
    src.register_memory(remote.as_mut_ptr() as u64, 4096, Access::READ).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let mut local = vec![0u8; 4096];
    req.register_memory(local.as_mut_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let ep = src.endpoint();

    let mut bad_magic = FrameHeader::encode(MsgKind::Describe, 0).to_vec();
    bad_magic[0] ^= 0xff;
    let (st, text) = hostile(&ep, &bad_magic).expect("error frame");
    assert_eq!(st, Status::ProtocolError);
    assert!(text.contains("magic"), "{text}");

    let mut bad_version = FrameHeader::encode(MsgKind::Describe, 0).to_vec();
    bad_version[4] = 77;
    assert!(hostile(&ep, &bad_version).unwrap().1.contains("version"));

    let mut unknown = FrameHeader::encode(MsgKind::Describe, 0).to_vec();
    unknown[6] = 200;
    assert!(hostile(&ep, &unknown).unwrap().1.contains("unknown message type"));

    let oversized = FrameHeader::encode(MsgKind::Describe, u32::MAX);
    assert!(hostile(&ep, &oversized).unwrap().1.contains("exceeds"));

    // A valid frame out of order: a READ before the handshake.
    let mut early = FrameHeader::encode(MsgKind::ReadRequest, 32).to_vec();
    early.extend_from_slice(&[0u8; 32]);
    assert!(hostile(&ep, &early).unwrap().1.contains("expected Describe first"));

    // A truncated Describe body.
    let mut trunc = FrameHeader::encode(MsgKind::Describe, 10).to_vec();
    trunc.extend_from_slice(&[0u8; 10]);
    assert!(hostile(&ep, &trunc).unwrap().1.contains("truncated"));

    // The well-behaved peer is unaffected throughout.
    let b = req
        .submit(
            peer,
            &[Request {
                op: Op::Read,
                local_addr: local.as_ptr() as u64,
                remote_addr: remote.as_ptr() as u64,
                len: 4096,
            }],
            SubmitOptions::default(),
        )
        .unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    assert!(local.iter().all(|b| *b == 5));
    assert!(src.stats().events.protocol_errors >= 6);
    req.close(None).unwrap();
    src.close(None).unwrap();
}

/// The body of a handshake Describe of a fresh identity publishing
/// `regions`.
fn describe_body(regions: Vec<RegionInfo>) -> Vec<u8> {
    message::Describe {
        identity: orbite::control::Identity::fresh().unwrap(),
        capabilities: TransportKind::Tcp.capability_bit(),
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions,
    }
    .encode()
}

/// Sends `head` and `body` as a new connection's first frame to `src` and
/// returns the kind and body of the first frame it answers.
fn first_answer(src: &Engine, head: &[u8], body: &[u8]) -> (MsgKind, Vec<u8>) {
    let mut s = TcpStream::connect(src.endpoint()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head).unwrap();
    s.write_all(body).unwrap();
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = FrameHeader::decode(&h).unwrap();
    let mut b = vec![0u8; h.body_len as usize];
    s.read_exact(&mut b).unwrap();
    (h.kind, b)
}

/// A peer whose Describe publishes a region that wraps the address space
/// (0xffff_ffff_ffff_f000 + 0x2000: `addr + len` overflows wherever the
/// region is checked) is refused at the handshake with PROTOCOL_ERROR
/// naming the region malformed, before the engine answers with its own
/// Describe; an honest peer connects after it. Guards
/// `addr.checked_add(len).is_none()` in `control/message.rs`'s
/// `Describe::decode` (without it the lying Describe is accepted).
#[test]
fn a_describe_region_that_wraps_the_address_space_is_refused_at_the_handshake() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let region = RegionInfo {
        id: 1,
        epoch: 1,
        addr: 0xffff_ffff_ffff_f000,
        len: 0x2000,
        access: Access::READ_WRITE,
        kind: MemoryKind::SharedHost,
    };
    let body = describe_body(vec![region]);
    let head = FrameHeader::encode(MsgKind::Describe, body.len() as u32);
    let (kind, b) = first_answer(&src, &head, &body);
    assert_eq!(kind, MsgKind::Error, "the lying Describe was answered");
    let (st, text) = message::decode_error(&b).unwrap();
    assert_eq!(st, Status::ProtocolError, "{text}");
    assert!(text.contains("malformed") && text.contains("0xfffffffffffff000+8192"), "{text}");
    let req = Engine::new(EngineConfig::default()).unwrap();
    req.connect(&src.endpoint(), None).unwrap();
    req.close(None).unwrap();
    src.close(None).unwrap();
}

/// A peer whose handshake Describe (a whole, valid body) comes under a
/// frame header of an OLDER protocol version (0, and the one before this
/// build's) is refused at once with PROTOCOL_ERROR naming that version,
/// not answered with the engine's Describe as if it spoke this build's
/// wire format; an honest peer connects after it. Guards `version !=
/// PROTOCOL_VERSION` in `control/frame.rs`'s `FrameHeader::decode` (with
/// `>` only newer versions are refused; round 6 F2).
#[test]
fn a_describe_under_an_older_protocol_version_is_refused_naming_it() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    for version in [0, PROTOCOL_VERSION - 1] {
        let body = describe_body(vec![]);
        let mut head = FrameHeader::encode(MsgKind::Describe, body.len() as u32);
        head[4..6].copy_from_slice(&version.to_le_bytes());
        let (kind, b) = first_answer(&src, &head, &body);
        assert_eq!(kind, MsgKind::Error, "version {version}: the Describe was answered");
        let (st, text) = message::decode_error(&b).unwrap();
        assert_eq!(st, Status::ProtocolError, "{text}");
        let want = format!("unsupported protocol version {version} (this build speaks {PROTOCOL_VERSION})");
        assert!(text.contains(&want), "{text}");
    }
    let req = Engine::new(EngineConfig::default()).unwrap();
    req.connect(&src.endpoint(), None).unwrap();
    req.close(None).unwrap();
    src.close(None).unwrap();
}
