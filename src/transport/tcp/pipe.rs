//! The TCP drivers' socket as a byte pipe ([`Pipe`], in
//! `control::pipe`) for their I/O pump ([`super::pump`]): the connection's
//! non-blocking socket with the receive low-water mark it keeps.

use crate::control::io;
pub use crate::control::pipe::Pipe;
use crate::control::pipe::{read_once, Got};
use crate::error::Result;
use crate::transport::reactor::set_rcvlowat;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

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
