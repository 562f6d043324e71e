//! Blocking socket I/O with a periodic "tick": sockets carry a short read and
//! write timeout, and each timeout calls the tick, which may abort the
//! operation (deadline passed, engine closing). No busy waiting.

use super::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::error::{Error, Result};
use std::io::{ErrorKind, IoSlice, Read, Write};
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

/// Reads and discards `len` bytes.
pub fn discard(s: &mut impl Read, mut len: u64, tick: Tick<'_>) -> Result<()> {
    let mut scratch = vec![0u8; 64 * 1024];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        read_full(s, &mut scratch[..n], tick, false)?;
        len -= n as u64;
    }
    Ok(())
}

/// Writes every byte of every slice; returns bytes written so far in the
/// error case through `written`.
pub fn write_all_parts(s: &mut impl Write, parts: &[&[u8]], tick: Tick<'_>, written: &mut u64) -> Result<()> {
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        if off == parts[idx].len() {
            idx += 1;
            off = 0;
            continue;
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() - idx);
        slices.push(IoSlice::new(&parts[idx][off..]));
        for p in &parts[idx + 1..] {
            slices.push(IoSlice::new(p));
        }
        match s.write_vectored(&slices) {
            Ok(0) => return Err(Error::Unavailable("connection closed while sending".into())),
            Ok(mut n) => {
                *written += n as u64;
                while n > 0 {
                    let left = parts[idx].len() - off;
                    if n >= left {
                        n -= left;
                        idx += 1;
                        off = 0;
                    } else {
                        off += n;
                        n = 0;
                    }
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => tick()?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(lost(&e)),
        }
    }
    Ok(())
}

/// Writes one control frame.
pub fn write_frame(s: &mut impl Write, kind: MsgKind, body: &[u8], tick: Tick<'_>) -> Result<()> {
    let h = FrameHeader::encode(kind, body.len() as u32);
    let mut w = 0;
    write_all_parts(s, &[&h, body], tick, &mut w)
}

/// A tick that never aborts.
pub fn no_abort() -> Result<()> {
    Ok(())
}
