//! The authentication exchange against arbitrary frames: neither side may
//! panic, and a server never accepts a peer that did not prove the key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::control::auth::{accept, connect, decode_response, AuthKey, FrameIo};
use orbite::control::frame::MsgKind;
use orbite::{Error, Result};

/// Frames taken from the fuzz input: kind (u16), length (u8), body.
struct Scripted<'a> {
    data: &'a [u8],
}

impl FrameIo for Scripted<'_> {
    fn send_frame(&mut self, _kind: MsgKind, _body: &[u8]) -> Result<()> {
        Ok(())
    }
    fn recv_frame(&mut self) -> Result<(MsgKind, Vec<u8>)> {
        if self.data.len() < 3 {
            return Err(Error::Unavailable("input exhausted".into()));
        }
        let kind = MsgKind::from_u16(u16::from_le_bytes([self.data[0], self.data[1]]))
            .ok_or_else(|| Error::Protocol("unknown kind".into()))?;
        let n = (self.data[2] as usize).min(self.data.len() - 3);
        let body = self.data[3..3 + n].to_vec();
        self.data = &self.data[3 + n..];
        Ok((kind, body))
    }
}

fuzz_target!(|data: &[u8]| {
    let key = AuthKey::from_bytes(&[0x42; 32]).unwrap();
    let _ = decode_response(data);
    let mut io = Scripted { data };
    if let Ok((kind, body)) = io.recv_frame() {
        // A server accepting only proves the input held an HMAC under the
        // key of a nonce drawn after the input was made: never.
        assert!(accept(&mut io, Some(&key), (kind, &body), true).is_err());
        let _ = accept(&mut Scripted { data }, None, (kind, &body), true);
    }
    let _ = connect(&mut Scripted { data }, &key, "fuzz", true);
});
