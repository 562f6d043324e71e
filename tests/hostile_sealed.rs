//! Sealed connections report failures as what they are (issue 58, item
//! 11): a keyed source runs in an `orbite-peer` process, the requester
//! here, and between them a relay that knows no key. A plain frame the
//! relay says after the key's proof is never believed; peers that seal
//! differently are refused `PERMISSION_DENIED` naming the mismatch; a
//! changed record the source finds is told to the requester, sealed, as
//! `PERMISSION_DENIED`.

mod common;

use common::relay::Relay;
use common::*;
use orbite::control::auth::{NONCE_LEN, TAG_LEN};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message;
use orbite::*;

const MIB: u64 = 1 << 20;

fn keyed(key: &str, wire: &str) -> String {
    format!(r#"{{"auth_key_file": "{key}", "wire_security": "{wire}"}}"#)
}

/// A keyed source process with 1 MiB of pattern 5, read-write.
fn source(config: &str) -> PeerProc {
    PeerProc::spawn(&["--size", &MIB.to_string(), "--seed", "5", "--config", config])
}

/// A relay without the key puts a plain Error frame of its own
/// (RESOURCE_EXHAUSTED, text of its choice) where the source's sealed
/// Describe is due, right after the key's proof: the requester does not
/// believe it and refuses the connection `PERMISSION_DENIED`, naming the
/// plain frame. Guards `transport/tcp/handshake.rs` `connect`: a plain
/// frame after the proof is refused (before, the relay chose the status
/// and text `connect` returned).
#[test]
fn a_plain_error_a_relay_forges_after_the_keys_proof_is_not_believed() {
    let key = key_file("sealed-forged", 0x3c);
    let src = source(&keyed(&key, "integrity"));
    // What comes down before the Describe: AuthResponse (nonce, mode,
    // tag), then AuthOk.
    let after_proof = (2 * FRAME_HEADER_LEN + NONCE_LEN + 1 + TAG_LEN) as u64;
    let body = message::encode_error(Status::ResourceExhausted, "forged by the relay");
    let mut forged = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
    forged.extend(body);
    let relay = Relay::injecting(&src.endpoint, Some((after_proof, forged)));
    let req = Engine::from_json(&keyed(&key, "integrity")).unwrap();
    let e = req.connect(&relay.endpoint(), Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("plain Error frame after the key's proof"), "{e}");
    assert!(!e.message().contains("forged by the relay"), "the relay's words were believed: {e}");
    // Without the relay's words the same pair connects.
    let clean = Relay::to(&src.endpoint);
    req.connect(&clean.endpoint(), Some(LONG)).unwrap();
    req.close(Some(LONG)).unwrap();
    src.close();
}

/// Keyed engines that seal differently (`wire_security` "integrity" on
/// one side, "encrypt" on the other, both ways round) are refused at the
/// authentication with `PERMISSION_DENIED` naming the mismatch and both
/// modes, at once (well under the source's handshake timeout, at which
/// the first record's failure used to show as TIMED_OUT or UNAVAILABLE).
/// Guards `control/auth.rs` `connect`: `sealed && wire != key.1`.
#[test]
fn a_wire_security_mismatch_is_refused_naming_it() {
    let key = key_file("sealed-mismatch", 0x3c);
    for (theirs, ours) in [("encrypt", "integrity"), ("integrity", "encrypt")] {
        let src = source(&format!(
            r#"{{"auth_key_file": "{key}", "wire_security": "{theirs}", "handshake_timeout_ms": 60000}}"#
        ));
        let req = Engine::from_json(&keyed(&key, ours)).unwrap();
        let t0 = std::time::Instant::now();
        let e = req.connect(&src.endpoint, Some(LONG)).map(|_| ()).unwrap_err();
        assert_eq!(e.status(), Status::PermissionDenied, "{theirs} source, {ours} requester: {e}");
        let names = format!("seals with \"{theirs}\", this engine with \"{ours}\"");
        assert!(e.message().contains("wire_security mismatch") && e.message().contains(&names), "{e}");
        // Milliseconds; the bound only rules out waiting for a timeout.
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "took {:?}", t0.elapsed());
        req.close(Some(LONG)).unwrap();
        src.close();
    }
}

/// A relay flips one bit inside a WRITE's payload on its way to the
/// source: the source finds the record's tag wrong and tells the
/// requester so in a sealed Error frame, which the requester reports:
/// the WRITE ends `PERMISSION_DENIED` naming the record that failed its
/// check (before, the source just closed and the requester reported
/// UNAVAILABLE). Guards `transport/tcp/proto/source/mod.rs` `fail`:
/// `Error::PermissionDenied(_)` is told too.
#[test]
fn a_tamper_the_source_finds_reaches_the_requester_as_permission_denied() {
    let key = key_file("sealed-tamper", 0x3c);
    let src = source(&keyed(&key, "integrity"));
    let relay = Relay::to(&src.endpoint);
    let req = Engine::from_json(&keyed(&key, "integrity")).unwrap();
    let peer = req.connect(&relay.endpoint(), Some(LONG)).unwrap();
    let local = pattern_vec(9, MIB as usize);
    req.register_memory(local.as_ptr() as u64, MIB, Access::NONE).unwrap();
    relay.leg(0).flip_up_ahead(MIB / 2);
    let w = Request { op: Op::Write, local_addr: local.as_ptr() as u64, remote_addr: src.addr, len: MIB };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(LONG) };
    let b = req.submit(peer, &[w], opts).unwrap();
    let e = b.wait(LONG).unwrap_err();
    assert_eq!(b.results()[0].status, Status::PermissionDenied, "{e}");
    assert!(e.message().contains("failed its check"), "{e}");
    req.close(Some(LONG)).unwrap();
    src.close();
}
