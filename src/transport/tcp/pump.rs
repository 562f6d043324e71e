//! The I/O pump both TCP drivers run (the requester's and the source's):
//! one loop that writes what a protocol core offers as far as the socket
//! takes it ([`write_out`]) and one that reads what the socket holds into
//! the core ([`receive`]), each bounded by a budget of bytes per turn, each
//! through the connection's [`Wire`] (sealed records or plain bytes) over
//! a [`Pipe`]: the connection's socket, or the simulator's in-memory pipe
//! that splits bytes at random (`tests/sim_tcp.rs`), so the simulator runs
//! these very loops.
//!
//! The reactor's sockets are edge-triggered: [`receive`] returns
//! [`Received::Drained`] only once a read found nothing (`WouldBlock`);
//! stopping earlier (its budget used, the core paused) is
//! [`Received::More`], and the caller runs it again without waiting for a
//! readable edge that may never come for those bytes.

pub use super::pipe::{Pipe, Socket};
use crate::control::io;
use crate::control::pipe::Got;
use crate::control::wire::Wire;
use crate::error::Result;
use crate::transport::tcp::proto::source::Segment;
use std::io::ErrorKind;
use std::time::Instant;

/// The bytes segment `s` of a core sends (the core names registered
/// memory by address; reading it is the driver's).
///
/// # Safety
/// For [`Segment::Memory`], `[addr, addr+len)` must be readable memory
/// that stays mapped while the slice lives: the core that yielded the
/// segment keeps its request's lease on the region until the bytes have
/// left, so a driver that drops the slices before telling the core what
/// it sent holds this.
pub unsafe fn segment_bytes(s: Segment<'_>) -> &[u8] {
    match s {
        Segment::Bytes(b) => b,
        // SAFETY: the caller's contract above.
        Segment::Memory { addr, len } => unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) },
    }
}

/// How far [`write_out`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Nothing is left to send.
    Complete,
    /// The pipe is full: its writable edge resumes it.
    Blocked,
    /// The turn's share is used (or the core asks for another turn): more
    /// is possible at once.
    Budget,
    /// The core's last bytes left: the connection closes.
    Closed,
}

/// A protocol core's sending side, as [`write_out`] drives it.
pub trait Outgoing {
    /// What to send now (the bytes of its parts, concatenated) and how many
    /// of them already left; no part when nothing is to be sent.
    fn parts(&mut self) -> (Vec<&[u8]>, u64);
    /// `n` bytes of what [`Outgoing::parts`] offered (after its skip) left.
    fn sent(&mut self, n: usize);
    /// Nothing is offered: how the write ends, or `None` to look again
    /// (the core has more now).
    fn nothing(&mut self) -> Option<Sent> {
        Some(Sent::Complete)
    }
    /// After a send: whether the connection is to close now.
    fn closes(&mut self) -> bool {
        false
    }
}

/// Writes what `out` offers through `wire` over `pipe`, as far as the pipe
/// takes it and until `budget` bytes left (each send capped by a ramp, one
/// per call). Sealed records made earlier leave first. An error is the
/// send's (`WriteZero`: the pipe took nothing).
pub fn write_out<P: Pipe, O: Outgoing>(
    pipe: &mut P,
    wire: &mut Wire,
    out: &mut O,
    budget: u64,
) -> std::io::Result<Sent> {
    let mut ramp = io::SendRamp::default();
    let mut done = 0u64;
    loop {
        if !wire.flush(&mut *pipe)? {
            return Ok(Sent::Blocked);
        }
        let (parts, skip) = out.parts();
        if parts.is_empty() {
            drop(parts);
            match out.nothing() {
                Some(s) => return Ok(s),
                None => continue,
            }
        }
        if done >= budget {
            return Ok(Sent::Budget);
        }
        let r = wire.send(&mut *pipe, &parts, skip, ramp.cap());
        drop(parts);
        match r {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                done += n as u64;
                out.sent(n);
                // Its last bytes leave before the connection closes.
                if out.closes() && wire.flush(&mut *pipe).unwrap_or(true) {
                    return Ok(Sent::Closed);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Sent::Blocked),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Where the next bytes read go.
pub enum Next<'m> {
    /// Straight into this memory (the rest of a payload), then
    /// [`Incoming::landed`].
    Direct(&'m mut [u8]),
    /// Into the caller's buffer, then [`Incoming::received`].
    Buffer,
    /// No reading now.
    Stop(Received),
}

/// A protocol core's receiving side, as [`receive`] drives it.
pub trait Incoming {
    /// Where the next bytes go.
    fn next(&mut self) -> Next<'_>;
    /// `n` bytes landed in the memory [`Next::Direct`] named.
    fn landed(&mut self, n: usize);
    /// Bytes read into the buffer; false when the peer ended the
    /// connection in order (its Goodbye).
    fn received(&mut self, bytes: &[u8]) -> Result<bool>;
    /// The peer ended the stream.
    fn eof(&mut self) -> Result<()>;
    /// Payload bytes still to come in the frame being read.
    fn payload_left(&self) -> Option<u64>;
}

/// How [`receive`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A read found nothing: the next readable edge brings more.
    Drained,
    /// It stopped with bytes possibly left in the pipe (its budget used,
    /// past `until`, or the core paused): no readable edge may come for
    /// them, run it again.
    More,
    /// The peer ended the connection in order, or the core reads no more.
    Closed,
}

/// Reads what `pipe` holds through `wire` into `inc`, at most `budget`
/// bytes (what it read is taken off; no read asks for more than is left)
/// and no more after `until`. Sealed, only bytes of records that checked
/// reach the core (or its memory).
pub fn receive<P: Pipe, I: Incoming>(
    pipe: &mut P,
    wire: &mut Wire,
    inc: &mut I,
    scratch: &mut [u8],
    budget: &mut u64,
    until: Option<Instant>,
) -> Result<Received> {
    loop {
        if *budget == 0 || until.is_some_and(|u| Instant::now() >= u) {
            return Ok(Received::More);
        }
        // No read past the budget: one straight into memory could
        // otherwise take all the socket holds (megabytes of a payload).
        let most = usize::try_from(*budget).unwrap_or(usize::MAX);
        let (got, to_scratch) = match inc.next() {
            Next::Stop(r) => return Ok(r),
            Next::Direct(mem) => {
                let n = mem.len().min(most);
                (wire.read(&mut *pipe, &mut mem[..n])?, false)
            }
            Next::Buffer => {
                let n = scratch.len().min(most);
                (wire.read(&mut *pipe, &mut scratch[..n])?, true)
            }
        };
        let n = match got {
            Got::Bytes(n) => n,
            Got::Drained => {
                // Sealed, the bytes still to come are more than the
                // payload left: no low-water mark.
                pipe.drained(inc.payload_left().filter(|_| !wire.is_sealed()));
                return Ok(Received::Drained);
            }
            Got::Eof => {
                inc.eof()?;
                return Ok(Received::Closed);
            }
        };
        *budget = budget.saturating_sub(n as u64);
        if !to_scratch {
            inc.landed(n);
        } else if !inc.received(&scratch[..n])? {
            return Ok(Received::Closed);
        }
    }
}
