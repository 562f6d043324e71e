//! Sealed connections report failures as what they are (issue 58, item
//! 11): a keyed source runs in an `orbite-peer` process, the requester
//! here, and between them a relay that knows no key. A plain frame the
//! relay says after the key's proof is never believed; peers that seal
//! differently are refused `PERMISSION_DENIED` naming the mismatch; a
//! changed record the source finds is told to the requester, sealed, as
//! `PERMISSION_DENIED`. A relay that read the handshake's nonces in
//! passing (they travel in the clear) can neither seal a record the
//! requester takes nor open one: the session keys need the shared key.

mod common;

use common::relay::Relay;
use common::*;
use orbite::control::auth::{NONCE_LEN, TAG_LEN};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message;
use orbite::control::seal::{Opener, SessionKeys, WireSecurity};
use orbite::*;
use std::sync::{Arc, Mutex};

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

/// A relay flips one bit inside the requester's first sealed record (its
/// Describe, right after the key's proof): the source refuses the
/// connection and says why in a sealed Error frame, which the requester
/// believes and reports: `PERMISSION_DENIED` naming the record that
/// failed its check (a plain Error there would be taken for words of a
/// relay without the key, the source's reason lost). Guards
/// `transport/tcp/handshake.rs` `open`: `send_error_on(stream, Some(&mut
/// tx), &e)` (the refusal of the first sealed frame is sealed).
#[test]
fn a_first_sealed_record_damaged_on_its_way_is_refused_in_a_sealed_error() {
    let key = key_file("sealed-first", 0x3c);
    let src = source(&keyed(&key, "integrity"));
    let req = Engine::from_json(&keyed(&key, "integrity")).unwrap();
    // Where the first sealed record starts on the way up: past
    // AuthChallenge and AuthProof, as a clean connection shows.
    let clean = Relay::to(&src.endpoint);
    req.connect(&clean.endpoint(), Some(LONG)).unwrap();
    let up = clean.leg(0).seen_up.lock().unwrap().clone();
    let (sent, at) = frames(&up, 2);
    assert_eq!((sent[0].0, sent[1].0), (MsgKind::AuthChallenge, MsgKind::AuthProof));
    // A byte of the record's body, past its 4-byte length.
    let relay = Relay::flipping_up(&src.endpoint, at as u64 + 8);
    let e = req.connect(&relay.endpoint(), Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("sealed record 0 failed its check"), "{e}");
    assert!(!e.message().contains("plain"), "the source's refusal came plain: {e}");
    req.close(Some(LONG)).unwrap();
    src.close();
}

/// Bytes the source sends before its first sealed record: AuthResponse
/// (nonce, mode, tag), then AuthOk.
const AFTER_PROOF: u64 = (2 * FRAME_HEADER_LEN + NONCE_LEN + 1 + TAG_LEN) as u64;

/// The frames at the start of `bytes` (`n` of them): each kind and body,
/// and where the next byte is.
fn frames(bytes: &[u8], n: usize) -> (Vec<(MsgKind, &[u8])>, usize) {
    let (mut out, mut at) = (Vec::new(), 0);
    for _ in 0..n {
        let h = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let body = &bytes[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + h.body_len as usize];
        out.push((h.kind, body));
        at += FRAME_HEADER_LEN + h.body_len as usize;
    }
    (out, at)
}

/// The session keys of the connection whose first bytes up (`up`) and
/// down (`down`) a relay saw, as it derives them from the nonces it read
/// there under `key` (its guess of the shared key), for the side
/// `connector` says.
fn keys_seen(up: &[u8], down: &[u8], key: &[u8], connector: bool, wire: WireSecurity) -> SessionKeys {
    let ((challenge, _), (response, _)) = (frames(up, 1), frames(down, 1));
    assert_eq!((challenge[0].0, response[0].0), (MsgKind::AuthChallenge, MsgKind::AuthResponse));
    SessionKeys::derive(key, &challenge[0].1[..NONCE_LEN], &response[0].1[..NONCE_LEN], connector, wire)
}

/// The plaintext of the first record of `bytes`, opened by `rx`.
fn open_first(mut rx: Opener, bytes: &[u8]) -> Result<Vec<u8>> {
    rx.received(&bytes[..4])?;
    let rest = rx.wanted();
    rx.received(&bytes[4..4 + rest])?;
    let mut plain = vec![0u8; 1 << 16];
    let n = rx.take(&mut plain)?;
    plain.truncate(n);
    Ok(plain)
}

/// An Error frame (RESOURCE_EXHAUSTED, the relay's words), sealed as the
/// source's first record under the keys a relay derives from the nonces
/// it saw and `key`.
fn forged_error(up: &[u8], down: &[u8], key: &[u8]) -> Vec<u8> {
    let (mut tx, _) = keys_seen(up, down, key, false, WireSecurity::Integrity).split();
    let body = message::encode_error(Status::ResourceExhausted, "forged by the relay");
    let mut frame = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
    frame.extend(body);
    tx.seal_all(&frame);
    tx.pending().to_vec()
}

/// A relay that read the handshake's nonces in passing but does not know
/// the key derives session keys from them (under a key of its own) and
/// seals an Error frame of its own (RESOURCE_EXHAUSTED, its words) where
/// the source's sealed Describe is due: the requester finds that record's
/// check failed and refuses the connection `PERMISSION_DENIED`, believing
/// nothing of it. The same forgery sealed under the shared key is
/// believed (the relay reads and seals right: only the key is missing).
/// Guards `control/seal.rs` `SessionKeys::derive`: `for part in [key,
/// nonce_c, nonce_s]` (the shared key bound into the session keys;
/// without it, whoever saw the handshake seals as either engine).
#[test]
fn session_keys_need_the_shared_key_to_seal() {
    let key = key_file("sealed-nonces", 0x3c);
    let src = source(&keyed(&key, "integrity"));
    let req = Engine::from_json(&keyed(&key, "integrity")).unwrap();
    let relay = Relay::forging(&src.endpoint, AFTER_PROOF, |up, down| forged_error(up, down, &[0x77; 48]));
    let e = req.connect(&relay.endpoint(), Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("sealed record 0 failed its check"), "{e}");
    assert!(!e.message().contains("forged by the relay"), "the relay's words were believed: {e}");
    let shared = std::fs::read(&key).unwrap();
    let knowing = Relay::forging(&src.endpoint, AFTER_PROOF, move |up, down| forged_error(up, down, &shared));
    let e = req.connect(&knowing.endpoint(), Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(e.status(), Status::ResourceExhausted, "{e}");
    assert!(e.message().contains("forged by the relay"), "{e}");
    // Without a forgery the same pair connects.
    req.connect(&Relay::to(&src.endpoint).endpoint(), Some(LONG)).unwrap();
    req.close(Some(LONG)).unwrap();
    src.close();
}

/// With `wire_security: "encrypt"`, a relay that read the handshake's
/// nonces in passing cannot open the requester's first sealed record (its
/// Describe): keys derived from the nonces under any key but the shared
/// one fail the record's check; under the shared key the same bytes open
/// as a Describe (the relay looks at the right bytes). Guards the same
/// line as `session_keys_need_the_shared_key_to_seal`.
#[test]
fn session_keys_need_the_shared_key_to_open() {
    let key = key_file("sealed-nonces-read", 0x5a);
    let src = source(&keyed(&key, "encrypt"));
    let req = Engine::from_json(&keyed(&key, "encrypt")).unwrap();
    // The relay keeps what came down before the first record (the
    // server's nonce), and says nothing of its own.
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let keep = seen.clone();
    let relay = Relay::forging(&src.endpoint, AFTER_PROOF, move |_, down| {
        *keep.lock().unwrap() = down.to_vec();
        Vec::new()
    });
    req.connect(&relay.endpoint(), Some(LONG)).unwrap();
    let down = seen.lock().unwrap().clone();
    assert_eq!(down.len() as u64, AFTER_PROOF, "the relay saw the handshake down");
    let up = relay.leg(0).seen_up.lock().unwrap().clone();
    // Up: AuthChallenge, AuthProof, then the requester's sealed Describe.
    let (shake, at) = frames(&up, 2);
    assert_eq!((shake[0].0, shake[1].0), (MsgKind::AuthChallenge, MsgKind::AuthProof));
    let opener = |k: &[u8]| keys_seen(&up, &down, k, false, WireSecurity::Encrypt).split().1;
    let e = open_first(opener(&[0x77; 48]), &up[at..]).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("sealed record 0 failed its check"), "{e}");
    let plain = open_first(opener(&std::fs::read(&key).unwrap()), &up[at..]).unwrap();
    assert_eq!(frames(&plain, 1).0[0].0, MsgKind::Describe, "under the shared key the record opens");
    req.close(Some(LONG)).unwrap();
    src.close();
}
