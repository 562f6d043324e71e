//! Both sides of the control handshake: the requester connects,
//! authenticates when the engines share a key (`control::auth`), and speaks
//! first with its Describe; the source answers with its own. Each side is
//! bounded by its deadline; a source that refuses answers with an Error
//! frame, which the requester returns as the status it names.

use crate::control::auth::{self, AuthKey};
use crate::control::endpoint;
use crate::control::frame::{FrameHeader, MsgKind};
use crate::control::io::{self, HeaderRead, TICK};
use crate::control::message::{self, Describe};
use crate::error::{Error, Result};
use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Requester side: connects to `endpoint`, sends `ours` and reads the
/// peer's Describe, all within `timeout`. Returns the connected stream
/// (read/write timeouts set to the I/O tick) and the peer's Describe.
pub fn connect(
    endpoint: &str,
    timeout: Duration,
    key: Option<&AuthKey>,
    ours: &Describe,
) -> Result<(TcpStream, Describe)> {
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
    if let Some(key) = key {
        auth::connect(&mut auth::Bounded { stream: &mut s, deadline, stop: &|| Ok(()) }, key, endpoint)?;
    }
    let mut tick = || {
        if Instant::now() >= deadline {
            return Err(Error::TimedOut(format!("{endpoint} did not complete the handshake in time")));
        }
        Ok(())
    };
    io::write_frame(&mut s, MsgKind::Describe, &ours.encode(), &mut tick)?;
    let h = match io::read_header(&mut s, &mut tick)? {
        HeaderRead::Eof => {
            return Err(Error::Unavailable(format!("{endpoint} closed the connection during the handshake")))
        }
        HeaderRead::Frame(h) => h,
    };
    let body = io::read_body(&mut s, h.body_len, &mut tick)?;
    let peer = match h.kind {
        MsgKind::Describe => Describe::decode(&body)?,
        MsgKind::Error => {
            let (st, text) = message::decode_error(&body)?;
            return Err(Error::from_status(st, format!("{endpoint} refused the connection: {text}")));
        }
        other => return Err(Error::Protocol(format!("{endpoint} answered the handshake with {other:?}"))),
    };
    Ok((s, peer))
}

/// Source side, first step of every incoming TCP connection: reads the
/// first frame header within `timeout`. With `key` — or when the peer
/// starts authenticating — the authentication runs first, and the header
/// returned is the first one after it. `Ok(None)`: the peer left before
/// speaking. A failed authentication is counted in `auth_failures` and
/// answered with an `Error` frame before `Err` returns.
pub fn open(
    stream: &mut TcpStream,
    key: Option<&AuthKey>,
    timeout: Duration,
    stop: &dyn Fn() -> Result<()>,
    auth_failures: &AtomicU64,
) -> Result<Option<FrameHeader>> {
    let deadline = Instant::now() + timeout;
    let mut tick = || {
        stop()?;
        if Instant::now() >= deadline {
            return Err(Error::Protocol("no complete first frame within the handshake timeout".into()));
        }
        Ok(())
    };
    let first = match io::read_header(&mut *stream, &mut tick)? {
        HeaderRead::Eof => return Ok(None),
        HeaderRead::Frame(h) => h,
    };
    if key.is_none() && first.kind != MsgKind::AuthChallenge {
        return Ok(Some(first));
    }
    let authenticated = if first.body_len > auth::MAX_AUTH_BODY {
        Err(Error::PermissionDenied(format!(
            "this engine requires authentication (auth_key_file) before {:?}; configure the same key",
            first.kind
        )))
    } else {
        let body = io::read_body(&mut *stream, first.body_len, &mut tick)?;
        let mut io = auth::Bounded { stream: &mut *stream, deadline, stop };
        auth::accept(&mut io, key, (first.kind, &body))
    };
    if let Err(e) = authenticated {
        // Any failure of the exchange (a wrong proof, or a peer that gives
        // up once it finds this engine's key is not its own) is a failed
        // authentication.
        auth_failures.fetch_add(1, Ordering::Relaxed);
        let e = match e {
            Error::PermissionDenied(_) => e,
            other => Error::PermissionDenied(format!("authentication not completed: {}", other.message())),
        };
        send_error(stream, &e);
        return Err(e);
    }
    match io::read_header(&mut *stream, &mut tick)? {
        HeaderRead::Eof => Ok(None),
        HeaderRead::Frame(h) => Ok(Some(h)),
    }
}

/// Source side: given the connection's first frame header, reads the
/// requester's Describe within `timeout` (a peer too slow is a protocol
/// error; `stop` ends the wait when the engine stops) and answers with
/// `mine()`.
pub fn answer(
    first: FrameHeader,
    r: &mut impl Read,
    w: &mut TcpStream,
    timeout: Duration,
    stop: &dyn Fn() -> Result<()>,
    mine: impl FnOnce() -> Describe,
) -> Result<Describe> {
    let deadline = Instant::now() + timeout;
    let mut tick = || {
        stop()?;
        if Instant::now() >= deadline {
            return Err(Error::Protocol("no Describe within the handshake timeout".into()));
        }
        Ok(())
    };
    if first.kind != MsgKind::Describe {
        return Err(Error::Protocol(format!("expected Describe first, got {:?}", first.kind)));
    }
    let body = io::read_body(r, first.body_len, &mut tick)?;
    let peer = Describe::decode(&body)?;
    io::write_frame(w, MsgKind::Describe, &mine().encode(), &mut tick)?;
    Ok(peer)
}

/// Tells the peer why its connection ends (an `Error` frame, within one
/// second; a peer that does not read it is not waited for).
pub fn send_error(stream: &mut TcpStream, e: &Error) {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut tick = || {
        if Instant::now() >= deadline {
            return Err(Error::TimedOut("error frame".into()));
        }
        Ok(())
    };
    let _ = io::write_frame(stream, MsgKind::Error, &message::encode_error(e.status(), e.message()), &mut tick);
}
