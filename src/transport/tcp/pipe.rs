//! The byte pipe a TCP driver's I/O pump ([`super::pump`]) and its wire
//! ([`super::wire`]) move bytes over: the connection's non-blocking socket
//! here, the simulator's in-memory pipe in `tests/sim_tcp.rs`.

use crate::control::io;
use crate::error::Result;
use crate::transport::reactor::{read_once, set_rcvlowat, Got};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

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

/// A driver's socket, with the receive low-water mark (`SO_RCVLOWAT`) it
/// keeps: once drained, the next readable edge comes when a good part of
/// the payload still to come is there (fewer, larger reads).
pub struct Socket<'a> {
    /// The connection's socket (non-blocking).
    pub stream: &'a TcpStream,
    /// The low-water mark in force.
    pub lowat: &'a mut usize,
}

impl Pipe for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> Result<Got> {
        read_once(self.stream, buf)
    }

    fn send(&mut self, parts: &[&[u8]], skip: u64, max: usize) -> std::io::Result<usize> {
        io::send_parts_upto(self.stream, parts, skip, max)
    }

    fn drained(&mut self, left: Option<u64>) {
        set_rcvlowat(self.stream.as_raw_fd(), self.lowat, left);
    }
}
