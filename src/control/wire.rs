//! The bytes of one TCP control connection (or of a fabric channel, the
//! IPC protocol over TCP) as its driver moves them: as
//! they are (engines without a key), or sealed in records
//! (`control::seal`) when the engines authenticated with a shared key.
//! Sealed, what is read reaches the protocol core (or registered memory)
//! only once its record checked, and what is sent is copied into a record
//! first and tagged from the copy (the core may let its memory go at once).
//! The blocking helpers carry the handshake's Describe frames.

use super::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN, MAX_CONTROL_BODY};
use super::io::{self, Tick};
use super::pipe::{Got, Pipe};
use super::seal::{Opener, Sealer, RECORD_MAX};
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read};
use std::net::TcpStream;

/// How a connection's bytes travel.
pub enum Wire {
    /// As they are.
    Plain,
    /// In sealed records.
    Sealed(Box<Sealed>),
}

/// The sealed state of a connection: its two halves and the buffer its
/// record bytes are read into.
pub struct Sealed {
    tx: Sealer,
    rx: Opener,
}

impl Wire {
    /// A sealed wire continuing the halves the handshake used.
    pub fn sealed((tx, rx): (Sealer, Opener)) -> Wire {
        Wire::Sealed(Box::new(Sealed { tx, rx }))
    }

    /// A wire for the halves, if the connection is sealed.
    pub fn from(halves: Option<(Sealer, Opener)>) -> Wire {
        halves.map_or(Wire::Plain, Wire::sealed)
    }

    /// Whether the connection is sealed.
    pub fn is_sealed(&self) -> bool {
        matches!(self, Wire::Sealed(_))
    }

    /// One non-blocking read: bytes for the core into `buf`. Sealed, only
    /// bytes of records that checked; a record that does not check is
    /// `PermissionDenied`, an end of stream inside a record `Unavailable`.
    pub fn read(&mut self, mut s: impl Pipe, buf: &mut [u8]) -> Result<Got> {
        let x = match self {
            Wire::Plain => return s.read(buf),
            Wire::Sealed(x) => x,
        };
        loop {
            let n = x.rx.take(buf)?;
            if n > 0 {
                return Ok(Got::Bytes(n));
            }
            // Record bytes go straight into the opener's buffer.
            match s.read(x.rx.room())? {
                Got::Bytes(n) => x.rx.filled(n)?,
                Got::Drained => return Ok(Got::Drained),
                Got::Eof if x.rx.mid_record() => {
                    return Err(Error::Unavailable("the peer closed the connection inside a sealed record".into()))
                }
                Got::Eof => return Ok(Got::Eof),
            }
        }
    }

    /// Sends up to `max` bytes of `parts` after their first `skip`, without
    /// blocking: how many the core may count as sent. Sealed, earlier
    /// records leave first (`WouldBlock` while they cannot), then one
    /// record is made and as much of it sent as the socket takes.
    pub fn send(&mut self, mut s: impl Pipe, parts: &[&[u8]], skip: u64, max: usize) -> std::io::Result<usize> {
        let x = match self {
            Wire::Plain => return s.send(parts, skip, max),
            Wire::Sealed(x) => x,
        };
        if !x.flush(&mut s)? {
            return Err(ErrorKind::WouldBlock.into());
        }
        let n = x.tx.seal(parts, skip as usize, max);
        match x.flush(&mut s) {
            Ok(_) => Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(n),
            Err(e) => Err(e),
        }
    }

    /// The bytes the connection still owes its peer as it closes: what
    /// earlier records left, then `last` (sealed as a record when the
    /// connection is). The wire sends nothing more.
    pub fn owed(&mut self, last: Option<&[u8]>) -> Vec<u8> {
        match self {
            Wire::Plain => last.map_or_else(Vec::new, <[u8]>::to_vec),
            Wire::Sealed(x) => {
                if let Some(b) = last {
                    x.tx.seal_all(b);
                }
                let owed = x.tx.pending().to_vec();
                x.tx.sent(owed.len());
                owed
            }
        }
    }

    /// Sends what earlier records left, without blocking: whether nothing
    /// is left (always, unsealed).
    pub fn flush(&mut self, mut s: impl Pipe) -> std::io::Result<bool> {
        match self {
            Wire::Plain => Ok(true),
            Wire::Sealed(x) => match x.flush(&mut s) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
                other => other,
            },
        }
    }
}

impl Sealed {
    /// Sends pending record bytes: true once none is left; `WouldBlock`
    /// when the socket is full.
    fn flush(&mut self, s: &mut impl Pipe) -> std::io::Result<bool> {
        while !self.tx.pending().is_empty() {
            match s.send(&[self.tx.pending()], 0, usize::MAX) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.tx.sent(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Sends one whole frame sealed, blocking within `tick`.
pub fn write_frame(s: &mut TcpStream, tx: &mut Sealer, kind: MsgKind, body: &[u8], tick: Tick<'_>) -> Result<()> {
    let mut bytes = FrameHeader::encode(kind, body.len() as u32).to_vec();
    bytes.extend_from_slice(body);
    tx.seal_all(&bytes);
    let n = tx.pending().len();
    let mut written = 0;
    io::write_all_parts(s, &[tx.pending()], tick, &mut written)?;
    tx.sent(n);
    Ok(())
}

/// Receives one whole frame sealed (a control frame, at most
/// `MAX_CONTROL_BODY`), blocking within `tick`; `first` holds record bytes
/// already read. The frame must end with its last record.
pub fn read_frame(s: &mut impl Read, rx: &mut Opener, first: &[u8], tick: Tick<'_>) -> Result<(FrameHeader, Vec<u8>)> {
    rx.received(first)?;
    let mut plain = Vec::new();
    let mut buf = vec![0u8; RECORD_MAX];
    loop {
        loop {
            let n = rx.take(&mut buf)?;
            if n == 0 {
                break;
            }
            plain.extend_from_slice(&buf[..n]);
        }
        if plain.len() >= FRAME_HEADER_LEN {
            let h = FrameHeader::decode(plain[..FRAME_HEADER_LEN].try_into().expect("a whole header"))?;
            if h.body_len > MAX_CONTROL_BODY {
                return Err(Error::Protocol(format!("a sealed {:?} of {} bytes is too large", h.kind, h.body_len)));
            }
            let whole = FRAME_HEADER_LEN + h.body_len as usize;
            if plain.len() == whole {
                plain.drain(..FRAME_HEADER_LEN);
                return Ok((h, plain));
            }
            if plain.len() > whole {
                return Err(Error::Protocol(format!("bytes followed the sealed {:?} in its record", h.kind)));
            }
        }
        let more = io::read_body(s, rx.wanted() as u32, tick)?;
        rx.received(&more)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::seal::{SessionKeys, RECORD_HEAD};
    use std::net::TcpListener;

    fn halves() -> ((Sealer, Opener), (Sealer, Opener)) {
        let k = b"a key of thirty-two bytes or so!";
        let a = SessionKeys::derive(k, &[4; 32], &[5; 32], true, Default::default()).split();
        let b = SessionKeys::derive(k, &[4; 32], &[5; 32], false, Default::default()).split();
        (a, b)
    }

    fn sockets() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn frames_cross_sealed_and_the_wire_goes_on_with_the_same_halves() {
        let (mut a, mut b) = sockets();
        let ((mut atx, arx), (btx, mut brx)) = halves();
        let body = vec![9u8; 200_000];
        write_frame(&mut a, &mut atx, MsgKind::Describe, &body, &mut || Ok(())).unwrap();
        let (h, got) = read_frame(&mut b, &mut brx, &[], &mut || Ok(())).unwrap();
        assert_eq!((h.kind, got), (MsgKind::Describe, body));
        // The drivers continue the sequence: a non-blocking exchange.
        let (mut wa, mut wb) = (Wire::sealed((atx, arx)), Wire::sealed((btx, brx)));
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        let payload: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let mut sent = 0;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 10_000];
        while got.len() < payload.len() {
            if sent < payload.len() {
                match wa.send(&a, &[&payload], sent as u64, usize::MAX) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            } else {
                wa.flush(&a).unwrap();
            }
            if let Got::Bytes(n) = wb.read(&b, &mut buf).unwrap() {
                got.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(got, payload);
    }

    #[test]
    fn a_byte_changed_on_the_way_is_refused_before_the_core_sees_it() {
        let (mut a, b) = sockets();
        let ((mut atx, _), (_, brx)) = halves();
        atx.seal_all(b"READ answer bytes");
        let mut wire = atx.pending().to_vec();
        wire[RECORD_HEAD + 3] ^= 1;
        std::io::Write::write_all(&mut a, &wire).unwrap();
        drop(a);
        let mut wb = Wire::sealed((halves().1 .0, brx));
        let mut buf = [0u8; 64];
        let e = loop {
            match wb.read(&b, &mut buf) {
                Ok(Got::Bytes(n)) => panic!("{n} bytes handed out"),
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(e.status(), crate::error::Status::PermissionDenied, "{e}");
    }

    /// `frame`, sealed by a key holder (records of at most `RECORD_MAX`),
    /// read back as a handshake's first frame.
    fn read_sealed(frame: &[u8]) -> Result<(FrameHeader, Vec<u8>)> {
        let ((mut atx, _), (_, mut brx)) = halves();
        atx.seal_all(frame);
        read_frame(&mut std::io::Cursor::new(atx.pending().to_vec()), &mut brx, &[], &mut || Ok(()))
    }

    /// A key holder's sealed first frame is a control frame: a data frame
    /// (whose header bound is a payload's) of one byte more than a control
    /// body is refused on its header, one of exactly the bound is read.
    /// Guards `read_frame`'s `h.body_len > MAX_CONTROL_BODY`.
    #[test]
    fn a_sealed_first_frame_larger_than_a_control_body_is_refused() {
        for len in [MAX_CONTROL_BODY, MAX_CONTROL_BODY + 1] {
            let mut frame = FrameHeader::encode(MsgKind::WriteRequest, len).to_vec();
            frame.resize(FRAME_HEADER_LEN + len as usize, 0x3c);
            let got = read_sealed(&frame);
            if len == MAX_CONTROL_BODY {
                let (h, body) = got.unwrap();
                assert_eq!((h.kind, body.len()), (MsgKind::WriteRequest, len as usize));
            } else {
                let Err(e) = got else { panic!("a sealed frame of {len} bytes taken") };
                assert_eq!(e, Error::Protocol(format!("a sealed WriteRequest of {len} bytes is too large")));
            }
        }
    }

    /// The sealed first frame must end with its record: bytes after it in
    /// the same record are refused (a peer may not slip a second frame
    /// past the handshake's reader). Guards `read_frame`'s
    /// `plain.len() > whole`.
    #[test]
    fn bytes_after_the_sealed_first_frame_in_its_record_are_refused() {
        let mut frame = FrameHeader::encode(MsgKind::Describe, 3).to_vec();
        frame.extend_from_slice(b"abc");
        let (h, body) = read_sealed(&frame).unwrap();
        assert_eq!((h.kind, body), (MsgKind::Describe, b"abc".to_vec()));
        frame.extend_from_slice(&FrameHeader::encode(MsgKind::Goodbye, 0));
        let e = read_sealed(&frame).unwrap_err();
        assert_eq!(e, Error::Protocol("bytes followed the sealed Describe in its record".into()));
    }

    /// A peer closing inside a sealed record ends the connection
    /// `UNAVAILABLE` naming it, not as an orderly close (the record's bytes
    /// never checked); closing after a whole record is orderly. Guards
    /// `Wire::read`'s `Got::Eof if x.rx.mid_record()`.
    #[test]
    fn a_close_inside_a_sealed_record_is_not_an_orderly_close() {
        for cut in [false, true] {
            let (mut a, b) = sockets();
            let ((mut atx, _), (_, brx)) = halves();
            atx.seal_all(b"READ answer bytes");
            let whole = atx.pending().to_vec();
            let sent = if cut { &whole[..whole.len() - 1] } else { &whole[..] };
            std::io::Write::write_all(&mut a, sent).unwrap();
            drop(a);
            let mut wb = Wire::sealed((halves().1 .0, brx));
            let mut buf = [0u8; 64];
            let mut got = Vec::new();
            let end = loop {
                match wb.read(&b, &mut buf) {
                    Ok(Got::Bytes(n)) => got.extend_from_slice(&buf[..n]),
                    Ok(Got::Drained) => continue,
                    other => break other,
                }
            };
            if cut {
                assert!(got.is_empty(), "{} bytes of an unchecked record handed out", got.len());
                let why = Error::Unavailable("the peer closed the connection inside a sealed record".into());
                assert!(matches!(end, Err(e) if e == why), "not refused naming the cut record");
            } else {
                assert_eq!(got, b"READ answer bytes");
                assert!(matches!(end, Ok(Got::Eof)), "an orderly close");
            }
        }
    }
}
