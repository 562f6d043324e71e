//! Both sides of the control handshake: the requester connects and speaks
//! first with its Describe; the source answers with its own. Each side is
//! bounded by its deadline; a source that refuses answers with an Error
//! frame, which the requester returns as the status it names.

use crate::control::endpoint;
use crate::control::frame::MsgKind;
use crate::control::io::{self, HeaderRead, TICK};
use crate::control::message::{self, Describe};
use crate::error::{Error, Result};
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Requester side: connects to `endpoint`, sends `ours` and reads the
/// peer's Describe, all within `timeout`. Returns the connected stream
/// (read/write timeouts set to the I/O tick) and the peer's Describe.
pub fn connect(endpoint: &str, timeout: Duration, ours: &Describe) -> Result<(TcpStream, Describe)> {
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

/// Source side: reads the requester's Describe within `timeout` (a peer too
/// slow is a protocol error; `stop` ends the wait when the engine stops) and
/// answers with `mine()`. `Ok(None)`: the peer left before speaking.
pub fn answer(
    r: &mut impl Read,
    w: &mut impl AsRawFd,
    timeout: Duration,
    stop: &dyn Fn() -> Result<()>,
    mine: impl FnOnce() -> Describe,
) -> Result<Option<Describe>> {
    let deadline = Instant::now() + timeout;
    let mut tick = || {
        stop()?;
        if Instant::now() >= deadline {
            return Err(Error::Protocol("no Describe within the handshake timeout".into()));
        }
        Ok(())
    };
    let h = match io::read_header(r, &mut tick)? {
        HeaderRead::Eof => return Ok(None),
        HeaderRead::Frame(h) => h,
    };
    if h.kind != MsgKind::Describe {
        return Err(Error::Protocol(format!("expected Describe first, got {:?}", h.kind)));
    }
    let body = io::read_body(r, h.body_len, &mut tick)?;
    let peer = Describe::decode(&body)?;
    io::write_frame(w, MsgKind::Describe, &mine().encode(), &mut || stop())?;
    Ok(Some(peer))
}
