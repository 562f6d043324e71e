//! A connection's graceful close, once its protocol has ended: the bytes
//! still owed to the peer (an Error frame, sealed records) leave, the
//! write side is shut (FIN after them), and what the peer still sends is
//! read and dropped until it ends its side too. Closing a socket with
//! unread bytes in its receive buffer makes the kernel answer with a reset
//! and drop what it had not sent yet; a relay on the way may drop what it
//! had not passed on: the peer would lose the Error frame just written.
//!
//! Everything here is non-blocking, driven by the connection's I/O thread
//! without the connection's lock, and bounded: [`LINGER`] in time and
//! [`LINGER_BYTES`] read, so a peer that keeps sending cannot keep the
//! socket open (it gets the reset then).

use crate::control::io;
use crate::control::pipe::{read_once, Got};
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Longest a closing connection waits for its peer's end.
pub const LINGER: Duration = Duration::from_secs(2);

/// Most bytes a closing connection reads (and drops) from its peer.
pub const LINGER_BYTES: u64 = 16 << 20;

/// Most bytes read in one turn of the I/O thread.
const TURN_BYTES: u64 = 4 << 20;

/// Where one turn of a close left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Waiting for the socket (writable, readable or the deadline).
    Waiting,
    /// Its share of the turn used, with bytes maybe left: again at once.
    Again,
    /// Over: the socket may be closed without losing what was owed.
    Done,
}

/// A connection that is closing.
pub struct Linger {
    /// Bytes owed to the peer, not yet taken by the socket.
    owed: Vec<u8>,
    /// The write side is shut.
    shut: bool,
    /// Bytes the peer may still send before it is cut off.
    left: u64,
    deadline: Instant,
}

impl Linger {
    /// A close that first sends `owed`, from `now` on.
    pub fn new(owed: Vec<u8>, now: Instant) -> Linger {
        Linger { owed, shut: false, left: LINGER_BYTES, deadline: now + LINGER }
    }

    /// When the close gives up waiting for the peer.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// One non-blocking turn on `s` (its reads go to `scratch`).
    pub fn turn(&mut self, s: &TcpStream, scratch: &mut [u8], now: Instant) -> Closing {
        if now >= self.deadline {
            return Closing::Done;
        }
        while !self.owed.is_empty() {
            match io::send_parts_from(s, &[&self.owed], 0) {
                Ok(0) => return Closing::Done,
                Ok(n) => drop(self.owed.drain(..n)),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return Closing::Done,
            }
        }
        if self.owed.is_empty() && !self.shut {
            let _ = s.shutdown(Shutdown::Write);
            self.shut = true;
        }
        let mut budget = TURN_BYTES;
        loop {
            match read_once(s, scratch) {
                Ok(Got::Bytes(n)) => {
                    self.left = self.left.saturating_sub(n as u64);
                    budget = budget.saturating_sub(n as u64);
                    if self.left == 0 {
                        return Closing::Done;
                    }
                    if budget == 0 {
                        return Closing::Again;
                    }
                }
                Ok(Got::Drained) => return Closing::Waiting,
                // The peer ended its side: nothing unread is left behind.
                Ok(Got::Eof) if self.shut => return Closing::Done,
                Ok(Got::Eof) => return Closing::Waiting,
                Err(_) => return Closing::Done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// The owed bytes leave, then the FIN; what the peer sends is read
    /// until its end, and the close is over only then. Guards the drain
    /// loop of `turn` (without it the close ends with bytes unread).
    #[test]
    fn a_close_sends_what_is_owed_and_drains_until_the_peer_ends() {
        let (mut peer, s) = pair();
        s.set_nonblocking(true).unwrap();
        peer.write_all(&[7u8; 1000]).unwrap();
        let mut l = Linger::new(b"told".to_vec(), Instant::now());
        let mut scratch = vec![0u8; 64];
        let start = Instant::now();
        // The 1000 bytes come in, 64 at a time; the peer has not ended.
        while l.left > LINGER_BYTES - 1000 {
            assert_ne!(l.turn(&s, &mut scratch, Instant::now()), Closing::Done, "over before the peer's end");
            assert!(start.elapsed() < Duration::from_secs(30), "the peer's bytes were never drained");
        }
        assert_eq!(l.turn(&s, &mut scratch, Instant::now()), Closing::Waiting);
        assert_eq!(l.left, LINGER_BYTES - 1000);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"told");
        peer.shutdown(Shutdown::Write).unwrap();
        while l.turn(&s, &mut scratch, Instant::now()) != Closing::Done {
            assert!(start.elapsed() < Duration::from_secs(30), "the peer's end was never seen");
        }
    }

    /// A peer that keeps sending is cut off: by the bytes bound, and by
    /// the deadline.
    #[test]
    fn a_peer_that_keeps_sending_is_cut_off() {
        let (mut peer, s) = pair();
        s.set_nonblocking(true).unwrap();
        let mut l = Linger::new(Vec::new(), Instant::now());
        l.left = 10;
        peer.write_all(&[1u8; 100]).unwrap();
        let mut scratch = vec![0u8; 64];
        let start = Instant::now();
        loop {
            match l.turn(&s, &mut scratch, Instant::now()) {
                Closing::Done => break,
                _ => assert!(start.elapsed() < Duration::from_secs(30), "never cut off by its bytes"),
            }
        }
        let mut l = Linger::new(Vec::new(), Instant::now());
        assert_eq!(l.turn(&s, &mut scratch, l.deadline()), Closing::Done);
    }
}
