//! Both sides of the control handshake: the requester connects,
//! authenticates when the engines share a key (`control::auth`), and speaks
//! first with its Describe; the source answers with its own. Each side is
//! bounded by its deadline; a source that refuses answers with an Error
//! frame, which the requester returns as the status it names. With a key,
//! both Describes and everything after them travel sealed (`wire`), a
//! refusal after the key's proof too: a plain frame after the proof is
//! never believed (something on the path without the key sent it). The
//! halves of the seal go on to the connection's driver.

use crate::control::auth::{self, AuthKey};
use crate::control::endpoint;
use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::io::{self, HeaderRead, TICK};
use crate::control::message::{self, Describe};
use crate::control::seal::{Opener, Sealer};
use crate::error::{Error, Result, Status};
use crate::sync::deadline::{never_stop, Deadline};
use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The two halves of a sealed connection.
pub type Seal = (Sealer, Opener);

/// Requester side: connects to `endpoint`, sends `ours` and reads the
/// peer's Describe, all within `timeout`. Returns the connected stream
/// (read/write timeouts set to the I/O tick), the peer's Describe, and
/// with a key the connection's seal.
pub fn connect(
    endpoint: &str,
    timeout: Duration,
    key: Option<&AuthKey>,
    ours: &Describe,
) -> Result<(TcpStream, Describe, Option<Seal>)> {
    let addr = endpoint::parse(endpoint)?;
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            Error::TimedOut(format!("connecting to {endpoint}: no answer within {timeout:?}"))
        }
        _ => Error::Unavailable(format!("cannot connect to {endpoint}: {e}")),
    })?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(TICK)).map_err(|e| Error::io("set_read_timeout", &e))?;
    s.set_write_timeout(Some(TICK)).map_err(|e| Error::io("set_write_timeout", &e))?;
    let mut seal = match key {
        Some(key) => Some(
            auth::connect(
                &mut auth::Bounded { stream: &mut s, bound: Deadline { at: deadline, stop: &never_stop } },
                key,
                endpoint,
                true,
            )?
            .split(),
        ),
        None => None,
    };
    let mut tick = || {
        if Instant::now() >= deadline {
            return Err(Error::TimedOut(format!("{endpoint} did not complete the handshake in time")));
        }
        Ok(())
    };
    let (h, body) = match &mut seal {
        Some((tx, rx)) => {
            crate::control::wire::write_frame(&mut s, tx, MsgKind::Describe, &ours.encode(), &mut tick)?;
            // The source answers sealed, a refusal (no slot left) too: a
            // plain frame here — its magic no record length can equal —
            // was sent by something on the path without the key, and
            // nothing it says (an Error's status or text) is believed.
            let mut start = [0u8; 4];
            io::read_full(&mut s, &mut start, &mut tick, false)?;
            if let Some(h) = plain_header(&mut s, start, &mut tick)? {
                return Err(Error::PermissionDenied(format!(
                    "{endpoint} answered the sealed handshake with a plain {:?} frame after the key's proof: \
                     something on the path without the key sent it; the connection is refused",
                    h.kind
                )));
            }
            crate::control::wire::read_frame(&mut s, rx, &start, &mut tick)?
        }
        None => {
            io::write_frame(&mut s, MsgKind::Describe, &ours.encode(), &mut tick)?;
            let h = match io::read_header(&mut s, &mut tick)? {
                HeaderRead::Eof => {
                    return Err(Error::Unavailable(format!("{endpoint} closed the connection during the handshake")))
                }
                HeaderRead::Frame(h) => h,
            };
            (h, io::read_body(&mut s, h.body_len, &mut tick)?)
        }
    };
    let peer = match h.kind {
        MsgKind::Describe => Describe::decode(&body)?,
        MsgKind::Error => {
            let (st, text) = message::decode_error(&body)?;
            return Err(Error::from_status(st, format!("{endpoint} refused the connection: {text}")));
        }
        other => return Err(Error::Protocol(format!("{endpoint} answered the handshake with {other:?}"))),
    };
    Ok((s, peer, seal))
}

/// What an incoming connection opened with, after any authentication: its
/// first frame's header, the body when it was read already (sealed), and
/// the seal of a sealed control connection.
pub struct Opened {
    /// The first frame's header.
    pub header: FrameHeader,
    /// Its body, if read (a sealed first frame).
    pub body: Option<Vec<u8>>,
    /// The connection's seal (a keyed control connection).
    pub seal: Option<Seal>,
}

impl Opened {
    /// Tells the peer why its connection ends ([`send_error`]): sealed
    /// when the connection is, since a keyed peer believes nothing plain
    /// after the key's proof.
    pub fn refuse(&mut self, stream: &mut TcpStream, e: &Error) {
        send_error_on(stream, self.seal.as_mut().map(|(tx, _)| tx), e);
    }
}

/// Source side, first step of every incoming TCP connection: reads the
/// first frame header within `timeout`. With `key` — or when the peer
/// starts authenticating — the authentication runs first, and the frame
/// returned is the first one after it, sealed: a control connection's
/// Describe or a fabric channel's `IpcHello` (a keyed connection whose
/// next frame is plain is refused: a relay could have passed the proof
/// through and spoken in its own name). `Ok(None)`: the peer left
/// before speaking. A failed authentication is counted in
/// `auth_failures`; it and every protocol error, or (after the proof) a
/// record that failed its check, are told to the peer in an `Error` frame
/// — sealed after the proof — before `Err` returns.
pub fn open(
    stream: &mut TcpStream,
    key: Option<&AuthKey>,
    timeout: Duration,
    stop: &dyn Fn() -> Result<()>,
    auth_failures: &AtomicU64,
) -> Result<Option<Opened>> {
    let bound = Deadline::after(timeout, stop);
    let deadline = bound.at;
    let mut tick = bound.ticker(|| Error::Protocol("no complete first frame within the handshake timeout".into()));
    let first = match io::read_header(&mut *stream, &mut tick) {
        Ok(HeaderRead::Eof) => return Ok(None),
        Ok(HeaderRead::Frame(h)) => h,
        Err(e) => {
            if e.status() == Status::ProtocolError {
                send_error(stream, &e);
            }
            return Err(e);
        }
    };
    if key.is_none() && first.kind != MsgKind::AuthChallenge {
        return Ok(Some(Opened { header: first, body: None, seal: None }));
    }
    let authenticated = if first.body_len > auth::MAX_AUTH_BODY {
        Err(Error::PermissionDenied(format!(
            "this engine requires authentication (auth_key_file) before {:?}; configure the same key",
            first.kind
        )))
    } else {
        let body = io::read_body(&mut *stream, first.body_len, &mut tick)?;
        let mut io = auth::Bounded { stream: &mut *stream, bound: Deadline { at: deadline, stop } };
        auth::accept(&mut io, key, (first.kind, &body), true)
    };
    let keys = match authenticated {
        Ok(k) => k.expect("a key was configured: the exchange ran"),
        Err(e) => {
            // Any failure of the exchange (a wrong proof, or a peer that
            // gives up once it finds this engine's key is not its own) is
            // a failed authentication.
            auth_failures.fetch_add(1, Ordering::Relaxed);
            let e = match e {
                Error::PermissionDenied(_) => e,
                other => Error::PermissionDenied(format!("authentication not completed: {}", other.message())),
            };
            send_error(stream, &e);
            return Err(e);
        }
    };
    let (mut tx, mut rx) = keys.split();
    let first = sealed_first(&mut *stream, &mut rx, &mut tick);
    match first {
        Ok(Some((header, body))) => Ok(Some(Opened { header, body: Some(body), seal: Some((tx, rx)) })),
        Ok(None) => Ok(None),
        Err(e) => {
            if matches!(e.status(), Status::ProtocolError | Status::PermissionDenied) {
                send_error_on(stream, Some(&mut tx), &e);
            }
            Err(e)
        }
    }
}

/// After the key's proof, the connection's first frame, sealed; `None`:
/// the peer left first. A plain frame is refused.
fn sealed_first(stream: &mut TcpStream, rx: &mut Opener, tick: io::Tick<'_>) -> Result<Option<(FrameHeader, Vec<u8>)>> {
    // A plain frame header starts with the magic, which no record length
    // can equal (records are at most RECORD_MAX bytes).
    let mut start = [0u8; 4];
    if !io::read_full(&mut *stream, &mut start, tick, true)? {
        return Ok(None);
    }
    if let Some(header) = plain_header(&mut *stream, start, tick)? {
        return Err(Error::PermissionDenied(format!(
            "a connection to an engine with auth_key_file must be sealed after the key's proof, not a plain {:?}",
            header.kind
        )));
    }
    crate::control::wire::read_frame(stream, rx, &start, tick).map(Some)
}

/// After the authentication, whether the 4 bytes read (`start`) begin a
/// plain frame — they are the magic, which no record length can equal —
/// and if so its header (the rest read here); `None`: a sealed record.
fn plain_header(s: &mut impl Read, start: [u8; 4], tick: io::Tick<'_>) -> Result<Option<FrameHeader>> {
    if start != crate::control::frame::MAGIC.to_le_bytes() {
        return Ok(None);
    }
    let rest = io::read_body(s, (FRAME_HEADER_LEN - 4) as u32, tick)?;
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[..4].copy_from_slice(&start);
    h[4..].copy_from_slice(&rest);
    FrameHeader::decode(&h).map(Some)
}

/// Source side: given the connection's first frame, reads the requester's
/// Describe within `timeout` (a peer too slow is a protocol error; `stop`
/// ends the wait when the engine stops) and answers with `mine()`, sealed
/// when the connection is.
pub fn answer(
    first: &mut Opened,
    r: &mut impl Read,
    w: &mut TcpStream,
    timeout: Duration,
    stop: &dyn Fn() -> Result<()>,
    mine: impl FnOnce() -> Describe,
) -> Result<Describe> {
    let mut tick =
        Deadline::after(timeout, stop).ticker(|| Error::Protocol("no Describe within the handshake timeout".into()));
    if first.header.kind != MsgKind::Describe {
        return Err(Error::Protocol(format!("expected Describe first, got {:?}", first.header.kind)));
    }
    let body = match first.body.take() {
        Some(b) => b,
        None => io::read_body(r, first.header.body_len, &mut tick)?,
    };
    let peer = Describe::decode(&body)?;
    match &mut first.seal {
        Some((tx, _)) => crate::control::wire::write_frame(w, tx, MsgKind::Describe, &mine().encode(), &mut tick)?,
        None => io::write_frame(w, MsgKind::Describe, &mine().encode(), &mut tick)?,
    }
    Ok(peer)
}

/// Tells the peer why its connection ends (an `Error` frame, within one
/// second; a peer that does not read it is not waited for).
pub fn send_error(stream: &mut TcpStream, e: &Error) {
    send_error_on(stream, None, e);
}

/// [`send_error`], sealed with `tx` when given.
fn send_error_on(stream: &mut TcpStream, tx: Option<&mut Sealer>, e: &Error) {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut tick = || {
        if Instant::now() >= deadline {
            return Err(Error::TimedOut("error frame".into()));
        }
        Ok(())
    };
    let body = message::encode_error(e.status(), e.message());
    let _ = match tx {
        Some(tx) => crate::control::wire::write_frame(stream, tx, MsgKind::Error, &body, &mut tick),
        None => io::write_frame(stream, MsgKind::Error, &body, &mut tick),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Identity;
    use std::net::TcpListener;

    /// A keyed source that authenticates the requester, then refuses it
    /// (no slot left) in an Error frame: sealed, the requester reports the
    /// status named; plain — what a relay without the key could say in
    /// the source's place — it is refused `PERMISSION_DENIED`, and
    /// nothing of it is believed.
    #[test]
    fn a_refusal_after_the_authentication_is_believed_only_sealed() {
        for sealed in [true, false] {
            let key = AuthKey::from_bytes(&[6u8; 32]).unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let endpoint = l.local_addr().unwrap().to_string();
            let k = key.clone();
            let source = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                s.set_read_timeout(Some(TICK)).unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut tick = || Ok(());
                let h = match io::read_header(&mut s, &mut tick).unwrap() {
                    HeaderRead::Frame(h) => h,
                    HeaderRead::Eof => panic!("no challenge"),
                };
                let body = io::read_body(&mut s, h.body_len, &mut tick).unwrap();
                let keys = auth::accept(
                    &mut auth::Bounded { stream: &mut s, bound: Deadline { at: deadline, stop: &never_stop } },
                    Some(&k),
                    (h.kind, &body),
                    true,
                )
                .unwrap()
                .unwrap();
                let (mut tx, _) = keys.split();
                let no_slot = Error::ResourceExhausted("no slot left".into());
                send_error_on(&mut s, sealed.then_some(&mut tx), &no_slot);
                // Keep the socket until the requester read the refusal.
                let _ = s.read(&mut [0u8; 1 << 16]);
            });
            let ours = Describe::bare(Identity::fresh().unwrap());
            let e = connect(&endpoint, Duration::from_secs(60), Some(&key), &ours).map(|_| ()).unwrap_err();
            if sealed {
                assert_eq!(e.status(), crate::error::Status::ResourceExhausted, "{e}");
                assert!(e.message().contains("no slot left"), "{e}");
            } else {
                assert_eq!(e.status(), crate::error::Status::PermissionDenied, "{e}");
                assert!(e.message().contains("plain Error frame after the key's proof"), "{e}");
                assert!(!e.message().contains("no slot left"), "{e}");
            }
            source.join().unwrap();
        }
    }

    /// A peer that completes the key's proof and then speaks plain — what
    /// a relay that passed the proof through would do to speak in its own
    /// name — is refused `PERMISSION_DENIED`, whatever the frame (a control
    /// Describe or a fabric channel's IpcHello): only sealed frames follow
    /// a proof.
    #[test]
    fn a_plain_frame_after_the_keys_proof_is_refused() {
        for kind in [MsgKind::IpcHello, MsgKind::Describe] {
            let key = AuthKey::from_bytes(&[7u8; 32]).unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let endpoint = l.local_addr().unwrap();
            let k = key.clone();
            let peer = std::thread::spawn(move || {
                let mut s = TcpStream::connect(endpoint).unwrap();
                s.set_read_timeout(Some(TICK)).unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                let bound = Deadline { at: deadline, stop: &never_stop };
                auth::connect(&mut auth::Bounded { stream: &mut s, bound }, &k, "test", true).unwrap();
                io::write_frame(&mut s, kind, &[0u8; 8], &mut || Ok(())).unwrap();
                // Keep the socket until the source decided.
                let _ = s.read(&mut [0u8; 1 << 16]);
            });
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(TICK)).unwrap();
            let failures = AtomicU64::new(0);
            let got = open(&mut s, Some(&key), Duration::from_secs(60), &|| Ok(()), &failures);
            let e = got.map(|_| ()).expect_err("a plain frame after the proof was taken");
            assert_eq!(e.status(), crate::error::Status::PermissionDenied, "{kind:?}: {e}");
            assert!(e.message().contains("must be sealed"), "{e}");
            drop(s);
            peer.join().unwrap();
        }
    }
}
