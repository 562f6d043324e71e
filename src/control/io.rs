//! Blocking socket I/O with a periodic "tick": sockets carry a short read and
//! write timeout, and each timeout calls the tick, which may abort the
//! operation (deadline passed, engine closing). No busy waiting.

use super::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::error::{Error, Result};
use std::io::{ErrorKind, IoSlice, Read};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Socket timeout between ticks.
pub const TICK: Duration = Duration::from_millis(50);

/// A callback run at each tick; an `Err` aborts the I/O.
pub type Tick<'a> = &'a mut dyn FnMut() -> Result<()>;

/// Outcome of reading a frame header.
pub enum HeaderRead {
    /// A valid header.
    Frame(FrameHeader),
    /// The peer closed the connection cleanly between frames.
    Eof,
}

fn lost(e: &std::io::Error) -> Error {
    Error::Unavailable(format!("connection lost: {e}"))
}

/// Reads exactly `buf.len()` bytes. `Ok(false)` if the peer closed before
/// the first byte (only when `eof_ok`).
pub fn read_full(s: &mut impl Read, buf: &mut [u8], tick: Tick<'_>, eof_ok: bool) -> Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match s.read(&mut buf[done..]) {
            Ok(0) if done == 0 && eof_ok => return Ok(false),
            Ok(0) => return Err(Error::Unavailable("peer closed the connection mid-frame".into())),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => tick()?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(lost(&e)),
        }
    }
    Ok(true)
}

/// Reads and validates a frame header.
pub fn read_header(s: &mut impl Read, tick: Tick<'_>) -> Result<HeaderRead> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    if !read_full(s, &mut h, tick, true)? {
        return Ok(HeaderRead::Eof);
    }
    Ok(HeaderRead::Frame(FrameHeader::decode(&h)?))
}

/// Reads a whole (control) body.
pub fn read_body(s: &mut impl Read, len: u32, tick: Tick<'_>) -> Result<Vec<u8>> {
    let mut b = vec![0u8; len as usize];
    read_full(s, &mut b, tick, false)?;
    Ok(b)
}

/// `sendmsg` with `MSG_NOSIGNAL`: a peer that went away gives `EPIPE`, never
/// a SIGPIPE that would kill a host process which did not ignore it (C
/// programs linking liborbite do not).
fn send_vectored(s: &impl AsRawFd, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid; iov points at `slices`, whose
    // IoSlice layout is the platform's iovec; nothing outlives the call.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = slices.as_ptr() as *mut libc::iovec;
    mh.msg_iovlen = slices.len().min(1024) as _;
    // SAFETY: mh describes valid buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One non-blocking `sendmsg` of `parts` (their concatenation), skipping
/// its first `skip` bytes: how many bytes the socket took (`WouldBlock`
/// when none). At most 1024 slices go in one call.
pub fn send_parts_from(s: &impl AsRawFd, parts: &[&[u8]], skip: u64) -> std::io::Result<usize> {
    send_parts_upto(s, parts, skip, usize::MAX)
}

/// [`send_parts_from`], offering the socket at most `max` bytes.
pub fn send_parts_upto(s: &impl AsRawFd, parts: &[&[u8]], mut skip: u64, max: usize) -> std::io::Result<usize> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len().min(1024));
    let mut room = max;
    for p in parts {
        if skip >= p.len() as u64 {
            skip -= p.len() as u64;
            continue;
        }
        let rest = &p[skip as usize..];
        let take = rest.len().min(room);
        slices.push(IoSlice::new(&rest[..take]));
        skip = 0;
        room -= take;
        if slices.len() == 1024 || room == 0 {
            break;
        }
    }
    if slices.is_empty() {
        return Ok(0);
    }
    send_vectored(s, &slices)
}

/// How much one `sendmsg` offers the socket, growing within a run of
/// sends: the first is small so that the peer starts reading (on another
/// core) while the rest is still being copied in, instead of after a whole
/// coalesced burst; each next one twice the last, so that long runs still
/// go in few calls.
pub struct SendRamp(usize);

/// The first send of a run offers at most this many bytes.
pub const FIRST_SEND: usize = 16 * 1024;

impl Default for SendRamp {
    fn default() -> SendRamp {
        SendRamp(FIRST_SEND)
    }
}

impl SendRamp {
    /// The cap for the next send (and the one after doubles).
    pub fn cap(&mut self) -> usize {
        let cap = self.0;
        self.0 = self.0.saturating_mul(2);
        cap
    }
}

/// Writes every byte of every slice to a socket; counts bytes written so
/// far in `written` (also when it fails).
pub fn write_all_parts(s: &mut impl AsRawFd, parts: &[&[u8]], tick: Tick<'_>, written: &mut u64) -> Result<()> {
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let mut done = 0u64;
    while done < total {
        match send_parts_from(s, parts, done) {
            Ok(0) => return Err(Error::Unavailable("connection closed while sending".into())),
            Ok(n) => {
                done += n as u64;
                *written += n as u64;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => tick()?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(lost(&e)),
        }
    }
    Ok(())
}

/// Writes one control frame.
pub fn write_frame(s: &mut impl AsRawFd, kind: MsgKind, body: &[u8], tick: Tick<'_>) -> Result<()> {
    let h = FrameHeader::encode(kind, body.len() as u32);
    let mut w = 0;
    write_all_parts(s, &[&h, body], tick, &mut w)
}

/// A tick that never aborts.
pub fn no_abort() -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    /// A capped send offers exactly `max` bytes, from `skip` on, across
    /// parts; the ramp starts small and doubles.
    #[test]
    fn a_capped_send_offers_exactly_its_cap() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..60u8).collect();
        let parts: [&[u8]; 3] = [&data[..10], &data[10..30], &data[30..]];
        assert_eq!(send_parts_upto(&a, &parts, 5, 17).unwrap(), 17);
        assert_eq!(send_parts_from(&a, &parts, 22).unwrap(), 38);
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, [&data[5..22], &data[22..]].concat());
        let mut ramp = SendRamp::default();
        assert_eq!([ramp.cap(), ramp.cap(), ramp.cap()], [FIRST_SEND, 2 * FIRST_SEND, 4 * FIRST_SEND]);
    }
}
