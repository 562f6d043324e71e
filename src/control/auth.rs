//! Mutual authentication with a shared key (config `auth_key_file`).
//!
//! Before anything else on a control connection or an IPC channel, the
//! connecting side and the serving side each prove that they know the key,
//! without sending it:
//!
//! 1. connector -> server `AuthChallenge { nonce_c, wire_c }`
//! 2. server -> connector `AuthResponse { nonce_s, wire_s, HMAC(key, "server" | T) }`
//! 3. connector -> server `AuthProof { HMAC(key, "client" | T) }`
//! 4. server -> connector `AuthOk` (or an `Error` frame, then the server closes)
//!
//! where `T = nonce_c | nonce_s | wire_c | wire_s` and `wire_*` is the
//! `wire_security` each side seals with (one byte). Nonces are 32 fresh
//! random bytes on each side, so a recorded exchange cannot be replayed;
//! the labels keep a server's answer from serving as a client's proof.
//! Each side learns the other's `wire_security` under the key's proof, so
//! on a connection to be sealed a mismatch is refused at once,
//! `PERMISSION_DENIED` naming both modes, instead of failing its first
//! record later. HMAC-SHA256 and its constant-time comparison come from
//! the RustCrypto `hmac`/`sha2` crates. Both sides then derive the
//! connection's session keys from the key and both nonces
//! (`control::seal`): a TCP control connection is sealed with them from
//! its Describe on, a fabric channel (the IPC protocol over TCP) from its
//! IpcHello on (tagged, or encrypted with `wire_security: "encrypt"`). An
//! IPC channel over a Unix socket is not sealed (the kernel joins its two
//! ends; nobody can sit in between; docs/security.md).

use super::frame::MsgKind;
use super::seal::{SessionKeys, WireSecurity};
use super::{io, message};
use crate::error::{Error, Result};
use crate::sync::deadline::Deadline;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of an HMAC-SHA256 tag.
pub const TAG_LEN: usize = 32;
/// The shortest key accepted.
pub const MIN_KEY_LEN: usize = 32;
/// The longest key file read.
pub const MAX_KEY_LEN: usize = 4096;

const SERVER_LABEL: &[u8] = b"orbite-auth-v2 server";
const CLIENT_LABEL: &[u8] = b"orbite-auth-v2 client";

/// A shared secret, read from a key file, and what the connections it
/// seals protect (`wire_security`).
#[derive(Clone)]
pub struct AuthKey(Arc<Vec<u8>>, WireSecurity);

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

impl AuthKey {
    /// Reads the key file at `path`: a regular file of `MIN_KEY_LEN` to
    /// `MAX_KEY_LEN` bytes that neither group nor others may read or write.
    /// Anything else is `InvalidConfig` naming `auth_key_file`.
    pub fn load(path: &str) -> Result<AuthKey> {
        use std::os::unix::fs::MetadataExt;
        let bad = |what: String| Error::InvalidConfig(format!("key `auth_key_file`: {path}: {what}"));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:o} lets group or others access the key; make it readable by its owner only (chmod 600)",
                meta.mode() & 0o777
            )));
        }
        // The size the file claims bounds the read; what was read decides.
        let sizes = |len: u64| format!("{len} bytes; a key has {MIN_KEY_LEN} to {MAX_KEY_LEN} bytes");
        if meta.len() > MAX_KEY_LEN as u64 {
            return Err(bad(sizes(meta.len())));
        }
        let key = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(bad(sizes(key.len() as u64)));
        }
        Ok(AuthKey(Arc::new(key), WireSecurity::default()))
    }

    /// The same key, sealing connections with `wire`.
    pub fn with_wire(self, wire: WireSecurity) -> AuthKey {
        AuthKey(self.0, wire)
    }

    /// A key from bytes (at least `MIN_KEY_LEN`).
    pub fn from_bytes(key: &[u8]) -> Result<AuthKey> {
        if key.len() < MIN_KEY_LEN {
            return Err(Error::InvalidArgument(format!("a key has at least {MIN_KEY_LEN} bytes, got {}", key.len())));
        }
        Ok(AuthKey(Arc::new(key.to_vec()), WireSecurity::default()))
    }

    fn hmac(&self, label: &[u8], a: &[u8], b: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(a);
        m.update(b);
        m
    }

    /// What this key's connections are sealed with.
    pub fn wire(&self) -> WireSecurity {
        self.1
    }

    fn tag(&self, label: &[u8], a: &[u8], b: &[u8]) -> [u8; TAG_LEN] {
        self.hmac(label, a, b).finalize().into_bytes().into()
    }

    /// Whether `tag` is the key's tag of (label, a, b), compared in constant time.
    fn verify(&self, label: &[u8], a: &[u8], b: &[u8], tag: &[u8]) -> bool {
        self.hmac(label, a, b).verify_slice(tag).is_ok()
    }

    /// The key's tag of `data` under `label` (HMAC-SHA256): what a record
    /// published for peers holding the same key carries.
    pub fn sign(&self, label: &[u8], data: &[u8]) -> [u8; TAG_LEN] {
        self.tag(label, data, &[])
    }

    /// Whether `tag` is the key's tag of `data` under `label`, compared in
    /// constant time.
    pub fn check(&self, label: &[u8], data: &[u8], tag: &[u8]) -> bool {
        self.verify(label, data, &[], tag)
    }
}

/// The frames the exchange sends and receives, each bounded by the
/// deadline of the handshake it belongs to.
pub trait FrameIo {
    /// Sends one frame.
    fn send_frame(&mut self, kind: MsgKind, body: &[u8]) -> Result<()>;
    /// Receives one frame (kind and body).
    fn recv_frame(&mut self) -> Result<(MsgKind, Vec<u8>)>;
}

/// The longest body an authentication frame (or the first frame of a
/// connection that should have authenticated) may announce.
pub const MAX_AUTH_BODY: u32 = 1024;

/// A control socket within the deadline of its handshake: each frame read
/// or written must finish within `bound`, which the engine stopping may
/// end first.
pub struct Bounded<'a, S> {
    /// The socket.
    pub stream: &'a mut S,
    /// When the handshake must be over, and what stops it.
    pub bound: Deadline<'a>,
}

fn handshake_late() -> Error {
    Error::TimedOut("the peer did not complete the handshake in time".into())
}

impl<S: Read + AsRawFd> FrameIo for Bounded<'_, S> {
    fn send_frame(&mut self, kind: MsgKind, body: &[u8]) -> Result<()> {
        let mut tick = self.bound.ticker(handshake_late);
        io::write_frame(&mut *self.stream, kind, body, &mut tick)
    }
    fn recv_frame(&mut self) -> Result<(MsgKind, Vec<u8>)> {
        let mut tick = self.bound.ticker(handshake_late);
        let h = match io::read_header(&mut *self.stream, &mut tick)? {
            io::HeaderRead::Frame(h) => h,
            io::HeaderRead::Eof => {
                return Err(Error::Unavailable("the peer closed the connection during the handshake".into()))
            }
        };
        if h.body_len > MAX_AUTH_BODY {
            return Err(Error::Protocol(format!("{:?} of {} bytes during authentication", h.kind, h.body_len)));
        }
        Ok((h.kind, io::read_body(&mut *self.stream, h.body_len, &mut tick)?))
    }
}

fn nonce() -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    crate::random::fill(&mut n)?;
    Ok(n)
}

fn exact<const N: usize>(body: &[u8], what: &str) -> Result<[u8; N]> {
    body.try_into().map_err(|_| Error::Protocol(format!("{what} body has {} bytes, expected {N}", body.len())))
}

/// The byte that names a `wire_security` in the exchange.
fn wire_byte(w: WireSecurity) -> u8 {
    match w {
        WireSecurity::Integrity => 0,
        WireSecurity::Encrypt => 1,
    }
}

fn wire_of(b: u8) -> Result<WireSecurity> {
    match b {
        0 => Ok(WireSecurity::Integrity),
        1 => Ok(WireSecurity::Encrypt),
        other => Err(Error::Protocol(format!("unknown wire_security {other} in the authentication"))),
    }
}

/// Decodes the `AuthChallenge` body: the connector's nonce and
/// `wire_security`.
fn decode_challenge(body: &[u8]) -> Result<([u8; NONCE_LEN], WireSecurity)> {
    let b: [u8; NONCE_LEN + 1] = exact(body, "AuthChallenge")?;
    Ok((b[..NONCE_LEN].try_into().expect("a nonce"), wire_of(b[NONCE_LEN])?))
}

/// Decodes the `AuthResponse` body: the server's nonce and
/// `wire_security`, then its tag.
pub fn decode_response(body: &[u8]) -> Result<([u8; NONCE_LEN], WireSecurity, [u8; TAG_LEN])> {
    let b: [u8; NONCE_LEN + 1 + TAG_LEN] = exact(body, "AuthResponse")?;
    let n = b[..NONCE_LEN].try_into().expect("a nonce");
    let t = b[NONCE_LEN + 1..].try_into().expect("a tag");
    Ok((n, wire_of(b[NONCE_LEN])?, t))
}

/// The exchange's modes, as both tags cover them: the connector's, then
/// the server's.
fn modes(connector: WireSecurity, server: WireSecurity) -> [u8; 2] {
    [wire_byte(connector), wire_byte(server)]
}

/// The refusal of a connection to be sealed whose two ends seal
/// differently (`ours` here, `theirs` at `peer`).
fn mismatch(peer: &str, ours: WireSecurity, theirs: WireSecurity) -> Error {
    Error::PermissionDenied(format!(
        "wire_security mismatch: {peer} seals with \"{}\", this engine with \"{}\"; configure the same on both",
        theirs.name(),
        ours.name()
    ))
}

/// The connecting side: proves knowledge of `key` and checks that the
/// server knows it too. `PermissionDenied` names which side failed; with
/// `sealed` (the connection will be sealed under the keys returned), also
/// a server that seals with another `wire_security` — told to it by the
/// proof, which covers both modes.
pub fn connect(io: &mut impl FrameIo, key: &AuthKey, peer: &str, sealed: bool) -> Result<SessionKeys> {
    let mine = nonce()?;
    let mut challenge = mine.to_vec();
    challenge.push(wire_byte(key.1));
    io.send_frame(MsgKind::AuthChallenge, &challenge)?;
    let (kind, body) = io.recv_frame()?;
    let (theirs, wire, tag) = match kind {
        MsgKind::AuthResponse => decode_response(&body)?,
        MsgKind::Error => {
            let (st, text) = message::decode_error(&body)?;
            return Err(Error::from_status(st, format!("{peer} refused authentication: {text}")));
        }
        other => return Err(Error::Protocol(format!("{peer} answered an authentication challenge with {other:?}"))),
    };
    let modes = modes(key.1, wire);
    if !key.verify(SERVER_LABEL, &[&mine[..], &theirs[..]].concat(), &modes, &tag) {
        return Err(Error::PermissionDenied(format!("{peer} does not know this engine's auth key")));
    }
    io.send_frame(MsgKind::AuthProof, &key.tag(CLIENT_LABEL, &[&mine[..], &theirs[..]].concat(), &modes))?;
    if sealed && wire != key.1 {
        // The server learns it from the proof and refuses; nothing it
        // says is needed to know why.
        return Err(mismatch(peer, key.1, wire));
    }
    let (kind, body) = io.recv_frame()?;
    match kind {
        MsgKind::AuthOk if body.is_empty() => Ok(SessionKeys::derive(&key.0, &mine, &theirs, true, key.1)),
        MsgKind::Error => {
            let (st, text) = message::decode_error(&body)?;
            Err(Error::from_status(st, format!("{peer} refused authentication: {text}")))
        }
        other => Err(Error::Protocol(format!("{peer} ended authentication with {other:?}"))),
    }
}

/// The serving side, given the connection's first frame. With a key, the
/// first frame must be an `AuthChallenge` and the connector must prove the
/// key; without one, an `AuthChallenge` is refused (both sides must agree).
/// With `sealed`, a connector that proved the key but seals with another
/// `wire_security` is refused too, naming both. On `Err` the caller
/// counts the failure, then tells the peer with [`refusal`] and closes.
pub fn accept(
    io: &mut impl FrameIo,
    key: Option<&AuthKey>,
    first: (MsgKind, &[u8]),
    sealed: bool,
) -> Result<Option<SessionKeys>> {
    let (key, (theirs, wire)) = match (key, first) {
        (None, (MsgKind::AuthChallenge, _)) => {
            return Err(Error::PermissionDenied(
                "this engine has no auth_key_file; configure the same key on both engines, or none".into(),
            ))
        }
        (None, _) => return Ok(None),
        (Some(k), (MsgKind::AuthChallenge, body)) => (k, decode_challenge(body)?),
        (Some(_), (kind, _)) => {
            return Err(Error::PermissionDenied(format!(
                "this engine requires authentication (auth_key_file) before {kind:?}; configure the same key"
            )))
        }
    };
    let mine = nonce()?;
    let modes = modes(wire, key.1);
    let transcript = [&theirs[..], &mine[..]].concat();
    let mut body = mine.to_vec();
    body.push(wire_byte(key.1));
    body.extend_from_slice(&key.tag(SERVER_LABEL, &transcript, &modes));
    io.send_frame(MsgKind::AuthResponse, &body)?;
    let (kind, proof) = io.recv_frame()?;
    if kind != MsgKind::AuthProof {
        return Err(Error::Protocol(format!("expected AuthProof, got {kind:?}")));
    }
    if proof.len() != TAG_LEN || !key.verify(CLIENT_LABEL, &transcript, &modes, &proof) {
        return Err(Error::PermissionDenied("the peer does not know this engine's auth key".into()));
    }
    if sealed && wire != key.1 {
        return Err(mismatch("the peer", key.1, wire));
    }
    io.send_frame(MsgKind::AuthOk, &[])?;
    Ok(Some(SessionKeys::derive(&key.0, &theirs, &mine, false, key.1)))
}

/// The `Error` frame body that tells a peer why it was refused.
pub fn refusal(e: &Error) -> Vec<u8> {
    message::encode_error(e.status(), e.message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;
    use std::sync::mpsc::{channel, Receiver, Sender};

    /// One end of an in-memory frame pipe.
    struct Pipe(Sender<(MsgKind, Vec<u8>)>, Receiver<(MsgKind, Vec<u8>)>);

    impl FrameIo for Pipe {
        fn send_frame(&mut self, kind: MsgKind, body: &[u8]) -> Result<()> {
            self.0.send((kind, body.to_vec())).map_err(|_| Error::Unavailable("closed".into()))
        }
        fn recv_frame(&mut self) -> Result<(MsgKind, Vec<u8>)> {
            self.1.recv().map_err(|_| Error::Unavailable("closed".into()))
        }
    }

    fn pipes() -> (Pipe, Pipe) {
        let (a, b) = (channel(), channel());
        (Pipe(a.0, b.1), Pipe(b.0, a.1))
    }

    type Keys = Result<Option<SessionKeys>>;

    fn run(client_key: Option<&[u8]>, server_key: Option<&[u8]>) -> (Keys, Keys) {
        let wire = WireSecurity::default();
        run_sealed(client_key.map(|k| (k, wire)), server_key.map(|k| (k, wire)), true)
    }

    /// One exchange between a client and a server with these keys (and
    /// `wire_security`s), on a connection to be `sealed` or not.
    fn run_sealed(
        client_key: Option<(&[u8], WireSecurity)>,
        server_key: Option<(&[u8], WireSecurity)>,
        sealed: bool,
    ) -> (Keys, Keys) {
        let (mut c, mut s) = pipes();
        let server_key = server_key.map(|(k, w)| AuthKey::from_bytes(k).unwrap().with_wire(w));
        let t = std::thread::spawn(move || {
            let (kind, body) = s.recv_frame()?;
            accept(&mut s, server_key.as_ref(), (kind, &body), sealed)
                .inspect_err(|e| drop(s.send_frame(MsgKind::Error, &refusal(e))))
        });
        let r = match client_key {
            Some((k, w)) => connect(&mut c, &AuthKey::from_bytes(k).unwrap().with_wire(w), "peer", sealed).map(Some),
            None => c.send_frame(MsgKind::Describe, b"d").map(|_| None),
        };
        drop(c);
        (r, t.join().unwrap())
    }

    #[test]
    fn the_same_key_passes_both_ways_and_any_other_is_refused() {
        let k = [7u8; 32];
        let (c, s) = run(Some(&k), Some(&k));
        let (c, s) = (c.unwrap().unwrap(), s.unwrap().unwrap());
        // Both ends derived the same session keys, one per direction.
        assert_eq!((c.send, c.recv), (s.recv, s.send));
        assert_ne!(c.send, c.recv);
        let (again, _) = run(Some(&k), Some(&k));
        assert_ne!(again.unwrap().unwrap().send, c.send, "fresh nonces, fresh session keys");
        let mut other = k;
        other[31] ^= 1;
        let (c, s) = run(Some(&other), Some(&k));
        assert_eq!(c.unwrap_err().status(), Status::PermissionDenied, "the client learns the server knows another key");
        assert!(s.is_err());
        let (c, s) = run(None, Some(&k));
        assert!(c.is_ok(), "the Describe was sent");
        assert!(s.unwrap_err().message().contains("requires authentication"));
        let (c, s) = run(Some(&k), None);
        assert!(c.unwrap_err().message().contains("no auth_key_file"));
        assert_eq!(s.unwrap_err().status(), Status::PermissionDenied);
        let (c, s) = run(None, None);
        assert!(c.is_ok() && s.is_ok());
    }

    /// Keyed peers that seal with different `wire_security` are refused at
    /// the authentication, each naming both modes, when the connection is
    /// to be sealed; a connection that stays unsealed (a Unix IPC channel)
    /// does not care. A relay that changes a mode byte on the way breaks
    /// the proofs, which cover both.
    #[test]
    fn a_wire_security_mismatch_is_refused_naming_both_modes() {
        let k = [7u8; 32];
        let (i, e) = (WireSecurity::Integrity, WireSecurity::Encrypt);
        for (cw, sw) in [(i, e), (e, i)] {
            let (c, s) = run_sealed(Some((&k, cw)), Some((&k, sw)), true);
            let (c, s) = (c.unwrap_err(), s.unwrap_err());
            for (err, ours, theirs) in [(&c, cw, sw), (&s, sw, cw)] {
                assert_eq!(err.status(), Status::PermissionDenied, "{err}");
                let names = format!("seals with \"{}\", this engine with \"{}\"", theirs.name(), ours.name());
                assert!(err.message().contains("wire_security mismatch") && err.message().contains(&names), "{err}");
            }
            let (c, s) = run_sealed(Some((&k, cw)), Some((&k, sw)), false);
            assert!(c.is_ok() && s.is_ok(), "an unsealed connection refused for its modes");
        }
        // The same mode passes.
        let (c, s) = run_sealed(Some((&k, e)), Some((&k, e)), true);
        assert!(c.unwrap().is_some() && s.unwrap().is_some());
    }

    /// A client that does not know the key but sends a proof of the right
    /// length (or of another length) is refused by the server, which then
    /// sends no AuthOk.
    #[test]
    fn the_server_refuses_a_proof_it_cannot_verify() {
        let key = AuthKey::from_bytes(&[5u8; 32]).unwrap();
        for proof in [vec![0u8; TAG_LEN], vec![0u8; TAG_LEN + 1], Vec::new()] {
            let (mut c, mut s) = pipes();
            let k = key.clone();
            let t = std::thread::spawn(move || {
                let (kind, body) = s.recv_frame()?;
                let r = accept(&mut s, Some(&k), (kind, &body), true);
                drop(s);
                r
            });
            c.send_frame(MsgKind::AuthChallenge, &[0u8; NONCE_LEN + 1]).unwrap();
            let (kind, _) = c.recv_frame().unwrap();
            assert_eq!(kind, MsgKind::AuthResponse);
            c.send_frame(MsgKind::AuthProof, &proof).unwrap();
            let e = t.join().unwrap().unwrap_err();
            assert_eq!(e.status(), Status::PermissionDenied, "a proof of {} bytes: {e}", proof.len());
            assert!(c.recv_frame().is_err(), "the server went on after a bad proof");
        }
    }

    /// An AuthOk that carries a body is not the protocol's: the client
    /// refuses it.
    #[test]
    fn the_client_refuses_an_auth_ok_with_a_body() {
        let key = AuthKey::from_bytes(&[6u8; 32]).unwrap();
        let (mut c, mut s) = pipes();
        let k = key.clone();
        let t = std::thread::spawn(move || {
            let (_, challenge) = s.recv_frame().unwrap();
            let mine = [4u8; NONCE_LEN];
            let mut body = mine.to_vec();
            body.push(0);
            body.extend_from_slice(&k.tag(SERVER_LABEL, &[&challenge[..NONCE_LEN], &mine[..]].concat(), &[0, 0]));
            s.send_frame(MsgKind::AuthResponse, &body).unwrap();
            s.recv_frame().unwrap();
            s.send_frame(MsgKind::AuthOk, b"x").unwrap();
        });
        let e = connect(&mut c, &key, "peer", true).unwrap_err();
        assert_eq!(e.status(), Status::ProtocolError, "{e}");
        t.join().unwrap();
    }

    /// Debug output never shows the key.
    #[test]
    fn a_key_prints_without_its_bytes() {
        let key = AuthKey::from_bytes(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(format!("{key:?}"), "AuthKey(..)");
    }

    /// A key file of 31 or 4097 bytes is refused naming its size; 32 and
    /// 4096 are keys.
    #[test]
    fn key_files_hold_32_to_4096_bytes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("orbite-key-sizes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (len, ok) in [(31usize, false), (32, true), (4096, true), (4097, false)] {
            let path = dir.join(format!("k{len}"));
            std::fs::write(&path, vec![1u8; len]).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            match AuthKey::load(path.to_str().unwrap()) {
                Ok(_) => assert!(ok, "a key of {len} bytes was accepted"),
                Err(e) => {
                    assert!(!ok, "a key of {len} bytes was refused: {e}");
                    assert!(e.message().contains(&format!("{len} bytes; a key has 32 to 4096")), "{e}");
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A key given as bytes holds at least 32 of them, as a key file does:
    /// 0, 1 and 31 bytes are refused INVALID_ARGUMENT naming the length,
    /// 32 is a key that signs. No engine path reaches `from_bytes` (the
    /// config's `auth_key_file`, from JSON, the C API and `EngineConfig`
    /// alike, is read by `AuthKey::load`, `key_files_hold_32_to_4096_bytes`);
    /// it is the public Rust constructor. Guards `if key.len() <
    /// MIN_KEY_LEN {` (round 12 L15).
    #[test]
    fn a_key_from_bytes_holds_at_least_32_bytes() {
        for len in [0usize, 1, 31] {
            let e = AuthKey::from_bytes(&vec![9u8; len]).unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument, "{e}");
            assert_eq!(e.message(), format!("a key has at least 32 bytes, got {len}"));
        }
        let key = AuthKey::from_bytes(&[9u8; 32]).unwrap();
        let tag = key.sign(b"label", b"data");
        assert!(key.check(b"label", b"data", &tag));
    }

    /// During the handshake a frame announcing MAX_AUTH_BODY bytes is read,
    /// one announcing a byte more is refused before its body is read.
    #[test]
    fn authentication_frames_are_bounded() {
        use crate::control::frame::FrameHeader;
        use std::io::Write;
        for (len, ok) in [(MAX_AUTH_BODY, true), (MAX_AUTH_BODY + 1, false)] {
            let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.write_all(&FrameHeader::encode(MsgKind::AuthProof, len)).unwrap();
            a.write_all(&vec![0u8; len as usize]).unwrap();
            let stop = crate::sync::deadline::never_stop;
            let mut io = Bounded { stream: &mut b, bound: Deadline::after(std::time::Duration::from_secs(30), &stop) };
            match io.recv_frame() {
                Ok((kind, body)) => {
                    assert!(ok, "a body of {len} bytes was read");
                    assert_eq!((kind, body.len()), (MsgKind::AuthProof, len as usize));
                }
                Err(e) => {
                    assert!(!ok, "a body of {len} bytes was refused: {e}");
                    assert_eq!(e.status(), Status::ProtocolError, "{e}");
                }
            }
        }
    }

    #[test]
    fn a_server_that_replays_the_clients_nonce_is_refused() {
        // A reflected challenge (the server echoing the client's own nonce
        // with a tag under the client label) proves nothing.
        let key = AuthKey::from_bytes(&[3u8; 40]).unwrap();
        let (mut c, mut s) = pipes();
        let k2 = key.clone();
        let t = std::thread::spawn(move || {
            let (_, challenge) = s.recv_frame().unwrap();
            let n = &challenge[..NONCE_LEN];
            let mut body = challenge.clone();
            body.extend_from_slice(&k2.tag(CLIENT_LABEL, &[n, n].concat(), &[0, 0]));
            s.send_frame(MsgKind::AuthResponse, &body).unwrap();
        });
        assert_eq!(connect(&mut c, &key, "peer", true).unwrap_err().status(), Status::PermissionDenied);
        t.join().unwrap();
    }

    #[test]
    fn key_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("orbite-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("key");
        std::fs::write(&p, [1u8; 32]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = p.to_str().unwrap();
        assert!(AuthKey::load(path).unwrap_err().message().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        AuthKey::load(path).unwrap();
        std::fs::write(&p, [1u8; 31]).unwrap();
        assert!(AuthKey::load(path).unwrap_err().message().contains("31 bytes"));
        assert_eq!(AuthKey::load("/nonexistent/key").unwrap_err().status(), Status::InvalidConfig);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
