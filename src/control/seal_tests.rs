use super::*;

fn pair_in(wire: WireSecurity) -> (Sealer, Opener) {
    let a = SessionKeys::derive(b"a shared key of enough bytes....", &[1; 32], &[2; 32], true, wire);
    let b = SessionKeys::derive(b"a shared key of enough bytes....", &[1; 32], &[2; 32], false, wire);
    assert_eq!((a.send, a.recv), (b.recv, b.send));
    assert_ne!(a.send, a.recv, "each direction has its own key");
    (a.split().0, b.split().1)
}

fn pair() -> (Sealer, Opener) {
    pair_in(WireSecurity::Integrity)
}

/// Everything the opener hands out, fed `wire` in pieces of `split`.
fn open_all(o: &mut Opener, wire: &[u8], split: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1000];
    for piece in wire.chunks(split) {
        o.received(piece)?;
        loop {
            let n = o.take(&mut buf)?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }
    Ok(out)
}

fn message(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// What an opener asks for next: the rest of a record's head, then the
/// rest of its data and tag, never 0; exactly, in both modes.
#[test]
fn an_opener_wants_exactly_the_rest_of_the_record() {
    for (wire, tag) in [(WireSecurity::Integrity, RECORD_TAG), (WireSecurity::Encrypt, 16)] {
        let (mut s, mut o) = pair_in(wire);
        assert_eq!(o.wanted(), RECORD_HEAD, "{wire:?}");
        s.seal(&[&message(100)], 0, 100);
        let rec = s.pending().to_vec();
        assert_eq!(rec.len(), RECORD_HEAD + 100 + tag, "{wire:?}");
        o.received(&rec[..2]).unwrap();
        assert_eq!(o.take(&mut [0u8; 8]).unwrap(), 0);
        assert_eq!(o.wanted(), RECORD_HEAD - 2, "{wire:?}");
        o.received(&rec[2..RECORD_HEAD + 30]).unwrap();
        assert_eq!(o.take(&mut [0u8; 8]).unwrap(), 0);
        assert_eq!(o.wanted(), 70 + tag, "{wire:?}");
        o.received(&rec[RECORD_HEAD + 30..rec.len() - 1]).unwrap();
        assert_eq!(o.wanted(), 1, "{wire:?}");
        o.received(&rec[rec.len() - 1..]).unwrap();
        let mut out = [0u8; 200];
        assert_eq!(o.take(&mut out).unwrap(), 100);
        assert_eq!(&out[..100], &message(100)[..]);
        // Behind a record handed out while the next began to arrive,
        // the count is of the next one's bytes alone.
        s.sent(rec.len());
        s.seal(&[&message(60)], 0, 60);
        s.seal(&[&message(50)], 0, 50);
        let two = s.pending().to_vec();
        o.received(&two[..RECORD_HEAD + 60 + tag + 3]).unwrap();
        assert_eq!(o.take(&mut out).unwrap(), 60);
        assert_eq!(o.take(&mut out).unwrap(), 0);
        assert_eq!(o.wanted(), RECORD_HEAD - 3, "{wire:?}");
    }
}

/// What a peer can make one sealed connection hold: two whole records
/// not yet handed out, in any pieces, and not one byte more (a third
/// record's first byte is refused, nothing of it kept).
#[test]
fn an_opener_holds_at_most_two_records_not_handed_out() {
    let (mut s, mut o) = pair();
    let data = message(RECORD_MAX);
    for _ in 0..3 {
        s.seal(&[&data], 0, RECORD_MAX);
    }
    let wire = s.pending().to_vec();
    let one = RECORD_HEAD + RECORD_MAX + RECORD_TAG;
    assert_eq!(wire.len(), 3 * one);
    for piece in wire[..2 * one].chunks(9000) {
        o.received(piece).unwrap();
    }
    let e = o.received(&wire[2 * one..2 * one + 1]).unwrap_err();
    assert_eq!(e.status(), crate::error::Status::ProtocolError, "{e}");
    assert!(e.message().contains("beyond two records"), "{e}");
    // The two held records are whole and in order.
    let mut out = vec![0u8; RECORD_MAX];
    for _ in 0..2 {
        assert_eq!(o.take(&mut out).unwrap(), RECORD_MAX);
        assert_eq!(out, data);
    }
    assert_eq!(o.take(&mut out).unwrap(), 0);
}

/// Records read straight into the opener's room, in splits of any
/// size: once nothing is left to hand out there is always room for a
/// whole record (what was not handed out moves to the front), and the
/// plaintext comes out whole and in order, in both modes.
#[test]
fn reading_into_the_room_keeps_room_for_a_record_and_every_byte() {
    for wire in [WireSecurity::Integrity, WireSecurity::Encrypt] {
        let (mut s, mut o) = pair_in(wire);
        let msg = message(10 * RECORD_MAX + 123);
        let mut at = 0;
        while at < msg.len() {
            at += s.seal(&[&msg], at, RECORD_MAX - 1000 * (at % 3));
        }
        let sealed = s.pending().to_vec();
        let (mut out, mut fed, mut step) = (Vec::new(), 0usize, 1usize);
        let mut buf = vec![0u8; 5000];
        loop {
            // Now and then read more before the open record is all
            // handed out (what is left of it moves with the rest).
            let early = step % 3 == 0 && fed < sealed.len();
            loop {
                let n = o.take(&mut buf[..if early { 700 } else { 5000 }]).unwrap();
                out.extend_from_slice(&buf[..n]);
                if n == 0 || early {
                    break;
                }
            }
            if fed == sealed.len() {
                break;
            }
            let room = o.room();
            if !early {
                let need = RECORD_HEAD + RECORD_MAX + RECORD_TAG;
                assert!(room.len() >= need, "{wire:?}: room for {}", room.len());
            }
            let n = (step * 7919 % 70_000 + 1).min(room.len()).min(sealed.len() - fed);
            room[..n].copy_from_slice(&sealed[fed..fed + n]);
            o.filled(n).unwrap();
            (fed, step) = (fed + n, step + 1);
        }
        assert!(out == msg, "{wire:?}: {} of {} bytes came out right", out.len(), msg.len());
        // Exactly: two whole records fill the buffer; the first is
        // handed out and the second only begun when room is asked for:
        // what is left of the second moves to the front, then a third
        // arrives, and both come out whole.
        let (mut s, mut o) = pair_in(wire);
        let big = message(3 * RECORD_MAX);
        for k in 0..3 {
            s.seal(&[&big], k * RECORD_MAX, RECORD_MAX);
        }
        let sealed = s.pending().to_vec();
        let one = RECORD_HEAD + RECORD_MAX + wire_tag(wire);
        o.received(&sealed[..2 * one]).unwrap();
        let mut out = vec![0u8; RECORD_MAX];
        assert_eq!(o.take(&mut out).unwrap(), RECORD_MAX);
        assert_eq!(o.take(&mut out[..700]).unwrap(), 700);
        let mut got = out[..700].to_vec();
        let room = o.room();
        assert!(room.len() >= one, "{wire:?}: room for {}", room.len());
        room[..one].copy_from_slice(&sealed[2 * one..]);
        o.filled(one).unwrap();
        loop {
            let n = o.take(&mut out).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&out[..n]);
        }
        assert!(got == big[RECORD_MAX..], "{wire:?}: the second and third records");
    }
}

fn wire_tag(wire: WireSecurity) -> usize {
    match wire {
        WireSecurity::Integrity => RECORD_TAG,
        WireSecurity::Encrypt => 16,
    }
}

/// Debug output never shows the session keys.
#[test]
fn session_keys_print_without_their_bytes() {
    let k = SessionKeys::derive(b"a shared key of enough bytes....", &[1; 32], &[2; 32], true, WireSecurity::Integrity);
    assert_eq!(format!("{k:?}"), "SessionKeys(..)");
}

/// The session keys bind the shared key, not only the nonces (which
/// travel in the clear): the same handshake under another key gives
/// other keys, in both modes and both directions, and a record sealed
/// under one is refused by the other's opener.
#[test]
fn session_keys_bind_the_shared_key() {
    for wire in [WireSecurity::Integrity, WireSecurity::Encrypt] {
        let ours = SessionKeys::derive(b"a shared key of enough bytes....", &[1; 32], &[2; 32], true, wire);
        let guess = SessionKeys::derive(b"another key, as long as the first", &[1; 32], &[2; 32], false, wire);
        assert_ne!((ours.send, ours.recv), (guess.recv, guess.send), "{wire:?}");
        let (mut s, _) = ours.split();
        s.seal_all(b"a record of ours");
        let mut o = guess.split().1;
        let e = open_all(&mut o, s.pending(), 7).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::PermissionDenied, "{wire:?}: {e}");
    }
}

/// A skip past whole parts lands in the right part at the right byte,
/// and a record takes no more than `max` from the parts after it.
#[test]
fn a_skip_past_whole_parts_seals_the_bytes_after_it() {
    let parts: Vec<Vec<u8>> = (0..3u8).map(|p| (0..10u8).map(|i| p * 10 + i).collect()).collect();
    let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
    let (mut s, mut o) = pair();
    assert_eq!(s.seal(&refs, 15, 8), 8);
    assert_eq!(s.seal(&refs, 23, 100), 7);
    assert_eq!(s.seal(&refs, 30, 100), 0, "nothing after the last part");
    let wire = s.pending().to_vec();
    let want: Vec<u8> = (15..23).chain(23..30).collect();
    assert_eq!(open_all(&mut o, &wire, wire.len()).unwrap(), want);
}

#[test]
fn records_carry_parts_in_order_whatever_the_split() {
    let (mut s, mut o) = pair();
    let (a, b) = (message(100_000), message(3));
    // Parts after a skip, capped per record.
    let mut at = 5;
    while at < a.len() + b.len() {
        at += s.seal(&[&a, &b], at, 40_000);
    }
    let wire = s.pending().to_vec();
    s.sent(wire.len());
    assert_eq!(wire.len(), 99_998 + 3 * (RECORD_HEAD + RECORD_TAG), "three records of at most 40 000");
    let mut expect = a[5..].to_vec();
    expect.extend_from_slice(&b);
    for split in [1, 7, 4096, wire.len()] {
        let (mut s, mut o2) = pair();
        let mut at = 5;
        while at < a.len() + b.len() {
            at += s.seal(&[&a, &b], at, 40_000);
        }
        assert_eq!(open_all(&mut o2, s.pending(), split).unwrap(), expect, "split {split}");
    }
    assert_eq!(open_all(&mut o, &wire, 999).unwrap(), expect);
    assert!(!o.mid_record());
}

#[test]
fn a_flipped_bit_anywhere_is_refused() {
    let (mut s, _) = pair();
    s.seal_all(&message(300));
    let wire = s.pending().to_vec();
    for i in 0..wire.len() {
        let mut bad = wire.clone();
        bad[i] ^= 0x10;
        let (_, mut o) = pair();
        let e = open_all(&mut o, &bad, bad.len()).err();
        // A changed length either is out of range or leaves the record
        // incomplete (nothing handed out); anything else fails its tag.
        match e {
            Some(e) => assert_eq!(e.status(), crate::error::Status::PermissionDenied, "byte {i}: {e}"),
            None => assert!(i < RECORD_HEAD && o.mid_record(), "byte {i} changed and accepted"),
        }
    }
}

/// In both modes a record opens only as the next of its direction:
/// guards the sequence number in `tag` (integrity) and in `nonce`
/// (encrypt).
#[test]
fn replayed_reordered_and_dropped_records_are_refused() {
    for mode in [WireSecurity::Integrity, WireSecurity::Encrypt] {
        let (mut s, _) = pair_in(mode);
        let mut records = Vec::new();
        for i in 0..3 {
            let before = s.pending().len();
            s.seal_all(&message(10 + i));
            records.push(s.pending()[before..].to_vec());
        }
        let cases: [(&str, Vec<usize>, &str); 3] = [
            ("replay", vec![0, 0], "record 1 "),
            ("reorder", vec![1, 0], "record 0 "),
            ("drop", vec![0, 2], "record 1 "),
        ];
        for (what, order, failing) in cases {
            let (_, mut o) = pair_in(mode);
            let wire: Vec<u8> = order.iter().flat_map(|&i| records[i].clone()).collect();
            let e = open_all(&mut o, &wire, wire.len()).unwrap_err();
            assert!(e.message().contains(&format!("sealed {failing}failed its check")), "{}: {what}: {e}", mode.name());
        }
        // A record of another connection (other nonces) fails as well.
        let other = SessionKeys::derive(b"a shared key of enough bytes....", &[1; 32], &[3; 32], false, mode);
        let mut o = other.split().1;
        assert!(open_all(&mut o, &records[0], 64).is_err());
    }
}

#[test]
fn encrypted_records_hide_the_bytes_and_refuse_any_change() {
    let (mut s, mut o) = pair_in(WireSecurity::Encrypt);
    let text = b"the KV block nobody on the path may read".repeat(100);
    s.seal_all(&text);
    let wire = s.pending().to_vec();
    assert_eq!(wire.len(), text.len() + RECORD_HEAD + GCM_TAG);
    assert!(!wire.windows(20).any(|w| w == &text[..20]), "the plaintext shows on the wire");
    assert_eq!(open_all(&mut o, &wire, 333).unwrap(), text);
    for i in [0, RECORD_HEAD, RECORD_HEAD + 100, wire.len() - 1] {
        let mut bad = wire.clone();
        bad[i] ^= 0x40;
        let (_, mut o) = pair_in(WireSecurity::Encrypt);
        match open_all(&mut o, &bad, bad.len()) {
            Err(e) => assert_eq!(e.status(), crate::error::Status::PermissionDenied, "byte {i}: {e}"),
            Ok(got) => assert!(got.is_empty() && o.mid_record(), "byte {i} changed and accepted"),
        }
    }
    // Peers sealing in different modes fail at the first record (once
    // enough bytes came for the longer tag).
    let (mut s, _) = pair_in(WireSecurity::Encrypt);
    s.seal_all(&text);
    s.seal_all(&text);
    let (_, mut integrity) = pair();
    let e = open_all(&mut integrity, s.pending(), wire.len()).unwrap_err();
    assert!(e.message().contains("another wire_security"), "{e}");
}

#[test]
fn lengths_out_of_range_are_refused_before_anything_is_buffered() {
    for len in [0u32, RECORD_MAX as u32 + 1, u32::MAX] {
        let (_, mut o) = pair();
        let e = o.received(&len.to_le_bytes()).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::PermissionDenied, "{e}");
    }
}
