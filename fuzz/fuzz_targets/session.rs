//! A sealed session's receiving side, as a keyed connection reads its
//! control frames after the handshake (`control::wire::read_frame`):
//! - arbitrary bytes (a relay or a peer without the session key) never
//!   yield a frame and never panic: only typed errors;
//! - honest records whose plaintext is arbitrary (a peer with the key
//!   sending any frames, cut into records anywhere) yield exactly the
//!   frames the plaintext holds, each body as long as its header says,
//!   decoded by its kind's decoder without a panic, or a typed error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::control::frame::{MsgKind, FRAME_HEADER_LEN};
use orbite::control::message::{decode_error, Describe};
use orbite::control::notify_frame::{decode_ack, Notify};
use orbite::control::seal::{SessionKeys, WireSecurity};
use orbite::error::Result;
use orbite::control::wire::read_frame;

fn keys(connector: bool, wire: WireSecurity) -> SessionKeys {
    SessionKeys::derive(&[0x24; 32], &[3; 32], &[4; 32], connector, wire)
}

fn decode(kind: MsgKind, body: &[u8]) {
    match kind {
        MsgKind::Describe => drop(Describe::decode(body)),
        MsgKind::Error => drop(decode_error(body)),
        MsgKind::Notify => drop(Notify::decode(body)),
        MsgKind::NotifyAck => drop(decode_ack(body)),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let wire = if data.first().is_some_and(|b| b & 1 == 1) { WireSecurity::Encrypt } else { WireSecurity::Integrity };
    let record = 1 + data.get(1).copied().unwrap_or(0) as usize * 3;
    let mut tick = || -> Result<()> { Ok(()) };

    let (_, mut rx) = keys(false, wire).split();
    let mut forged = data;
    assert!(read_frame(&mut forged, &mut rx, &[], &mut tick).is_err(), "bytes nobody sealed made a frame");

    // The plaintext: what follows the two bytes that chose the mode and
    // the record size.
    let plain = &data[data.len().min(2)..];
    let (mut tx, _) = keys(true, wire).split();
    let (_, mut rx) = keys(false, wire).split();
    let mut at = 0;
    while at < plain.len() {
        at += tx.seal(&[plain], at, record);
    }
    let sealed = tx.pending().to_vec();
    let mut input = sealed.as_slice();
    let mut read = 0;
    while let Ok((h, body)) = read_frame(&mut input, &mut rx, &[], &mut tick) {
        assert_eq!(body.len(), h.body_len as usize);
        assert_eq!(&plain[read + FRAME_HEADER_LEN..read + FRAME_HEADER_LEN + body.len()], body.as_slice());
        read += FRAME_HEADER_LEN + body.len();
        decode(h.kind, &body);
    }
});
