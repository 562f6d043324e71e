//! A non-blocking byte pipe to a peer, as the drivers' I/O pumps and a
//! connection's wire ([`super::wire`]) move bytes over it: one read
//! ([`Got`]), one send of gathered parts. The connection's socket is one
//! (`&TcpStream` here; the TCP driver's `Socket` with its receive
//! low-water mark in `transport::tcp::pipe`), the simulator's in-memory
//! pipe in `tests/sim_tcp.rs` another.

use super::io;
use crate::error::{Error, Result};
use std::net::TcpStream;

/// What one non-blocking read got.
pub enum Got {
    /// This many bytes.
    Bytes(usize),
    /// The peer ended the stream.
    Eof,
    /// Nothing more for now (the next readable edge brings more).
    Drained,
}

/// Reads once, without blocking, from `stream` into `buf`.
pub fn read_once(mut stream: &TcpStream, buf: &mut [u8]) -> Result<Got> {
    use std::io::{ErrorKind, Read};
    loop {
        return match Read::read(&mut stream, buf) {
            Ok(0) => Ok(Got::Eof),
            Ok(n) => Ok(Got::Bytes(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Got::Drained),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => Err(Error::Unavailable(format!("connection lost: {e}"))),
        };
    }
}

/// A non-blocking byte pipe to the peer.
pub trait Pipe {
    /// One read into `buf`: some bytes, the peer's end of stream, or
    /// [`Got::Drained`] when nothing is there now (`WouldBlock`).
    fn read(&mut self, buf: &mut [u8]) -> Result<Got>;
    /// One send of at most `max` bytes of `parts` (their concatenation)
    /// after its first `skip`: how many the pipe took (`WouldBlock` when
    /// none).
    fn send(&mut self, parts: &[&[u8]], skip: u64, max: usize) -> std::io::Result<usize>;
    /// A read found nothing; `left` payload bytes are still to come (or
    /// `None` between frames), for a pipe that waits for many at once.
    fn drained(&mut self, _left: Option<u64>) {}
}

impl Pipe for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> Result<Got> {
        read_once(self, buf)
    }

    fn send(&mut self, parts: &[&[u8]], skip: u64, max: usize) -> std::io::Result<usize> {
        io::send_parts_upto(*self, parts, skip, max)
    }
}

impl<P: Pipe + ?Sized> Pipe for &mut P {
    fn read(&mut self, buf: &mut [u8]) -> Result<Got> {
        (**self).read(buf)
    }

    fn send(&mut self, parts: &[&[u8]], skip: u64, max: usize) -> std::io::Result<usize> {
        (**self).send(parts, skip, max)
    }

    fn drained(&mut self, left: Option<u64>) {
        (**self).drained(left)
    }
}
