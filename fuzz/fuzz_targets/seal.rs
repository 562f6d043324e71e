//! Sealed records against arbitrary bytes, in both modes: an opener fed
//! any bytes in any split never panics and never hands out a byte (nobody
//! without the session key can make a record that checks), and what a
//! sealer makes of any plaintext, cut anywhere, opens to exactly that
//! plaintext.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::control::seal::{SessionKeys, WireSecurity};

fn keys(connector: bool, wire: WireSecurity) -> SessionKeys {
    SessionKeys::derive(&[0x42; 32], &[1; 32], &[2; 32], connector, wire)
}

fuzz_target!(|data: &[u8]| {
    let split = 1 + data.first().copied().unwrap_or(0) as usize;
    let wire = if data.get(1).is_some_and(|b| b & 1 == 1) { WireSecurity::Encrypt } else { WireSecurity::Integrity };
    let mut buf = [0u8; 512];
    let (_, mut opener) = keys(false, wire).split();
    for piece in data.chunks(split) {
        if opener.received(piece).is_err() {
            break;
        }
        match opener.take(&mut buf) {
            Ok(n) => assert_eq!(n, 0, "a forged record was handed out"),
            Err(_) => break,
        }
    }
    let (mut sealer, _) = keys(true, wire).split();
    let (_, mut opener) = keys(false, wire).split();
    let mut at = 0;
    while at < data.len() {
        at += sealer.seal(&[data], at, split * 7);
    }
    let mut out = Vec::new();
    for piece in sealer.pending().to_vec().chunks(split) {
        opener.received(piece).expect("a sealed record is accepted");
        loop {
            let n = opener.take(&mut buf).expect("a sealed record checks");
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }
    assert_eq!(out, data);
});
