//! Sealed connections: once two engines sharing a key have authenticated
//! (`control::auth`), every byte either sends on the connection travels in
//! *records*, each tagged with a key of that connection alone, so that a
//! process in the middle that does not know the key can neither change,
//! drop, replay, reorder nor inject a byte without the receiver noticing
//! before it acts on it.
//!
//! A record is `len u32 LE | data (len bytes, 1..=RECORD_MAX) | tag`;
//! `seq` counts the direction's records from 0 and is never sent. With
//! [`WireSecurity::Integrity`] the data is the plaintext and the tag (32
//! bytes) keyed BLAKE3 over `seq u64 LE | len u32 LE | data`; with
//! [`WireSecurity::Encrypt`] the data is AES-256-GCM ciphertext under the
//! nonce `seq` with `len` as associated data, and the tag GCM's (16). The
//! session keys are BLAKE3 `derive_key` of the shared key and both
//! handshake nonces, one per direction and per mode, so no two connections
//! (and no two directions) share one, and peers sealing in different modes
//! fail at their first record.
//!
//! This module holds no socket: [`Sealer`] makes records from plaintext,
//! [`Opener`] checks records and hands out their plaintext.

use crate::error::{Error, Result};

/// Most plaintext bytes one record carries.
pub const RECORD_MAX: usize = 64 << 10;
/// Bytes before a record's data.
pub const RECORD_HEAD: usize = 4;
/// Bytes of the longest tag (integrity's).
pub const RECORD_TAG: usize = 32;
/// Bytes of an encrypted record's tag.
const GCM_TAG: usize = 16;

/// What sealing protects (config `wire_security`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireSecurity {
    /// Every record tagged: nothing changed goes unnoticed; an observer
    /// reads the bytes.
    #[default]
    Integrity,
    /// Every record encrypted and tagged (AES-256-GCM): an observer learns
    /// only the records' lengths.
    Encrypt,
}

impl WireSecurity {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            WireSecurity::Integrity => "integrity",
            WireSecurity::Encrypt => "encrypt",
        }
    }

    /// From a config name.
    pub fn from_name(s: &str) -> Option<WireSecurity> {
        [WireSecurity::Integrity, WireSecurity::Encrypt].into_iter().find(|w| w.name() == s)
    }
}

/// How one direction's records are made and checked.
#[derive(Clone)]
enum Protect {
    Tag([u8; 32]),
    Cipher(Box<aes_gcm::Aes256Gcm>),
}

impl Protect {
    fn new(key: [u8; 32], wire: WireSecurity) -> Protect {
        use aes_gcm::KeyInit;
        match wire {
            WireSecurity::Integrity => Protect::Tag(key),
            WireSecurity::Encrypt => Protect::Cipher(Box::new(aes_gcm::Aes256Gcm::new(&key.into()))),
        }
    }

    fn tag_len(&self) -> usize {
        match self {
            Protect::Tag(_) => RECORD_TAG,
            Protect::Cipher(_) => GCM_TAG,
        }
    }
}

/// The GCM nonce of record `seq`.
fn nonce(seq: u64) -> aes_gcm::Nonce<aes_gcm::aead::consts::U12> {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    n.into()
}

/// The session keys of one connection, as seen from one side.
#[derive(Clone)]
pub struct SessionKeys {
    /// Protects what this side sends.
    pub send: [u8; 32],
    /// Checks what this side receives.
    pub recv: [u8; 32],
    /// What the records protect.
    pub wire: WireSecurity,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

/// The derivation context of a direction's key in a mode.
fn context(wire: WireSecurity, to_server: bool) -> String {
    let way = if to_server { "connector to server" } else { "server to connector" };
    format!("orbite 2026-12 sealed connection v1 {} {way}", wire.name())
}

impl SessionKeys {
    /// The keys of the connection whose handshake used `nonce_c` (the
    /// connector's) and `nonce_s` (the server's), under `key`; `connector`
    /// says which side this is; `wire` what the records protect.
    pub fn derive(key: &[u8], nonce_c: &[u8], nonce_s: &[u8], connector: bool, wire: WireSecurity) -> SessionKeys {
        let mut material = Vec::with_capacity(key.len() + nonce_c.len() + nonce_s.len() + 16);
        for part in [key, nonce_c, nonce_s] {
            material.extend_from_slice(&(part.len() as u64).to_le_bytes());
            material.extend_from_slice(part);
        }
        let c2s = blake3::derive_key(&context(wire, true), &material);
        let s2c = blake3::derive_key(&context(wire, false), &material);
        match connector {
            true => SessionKeys { send: c2s, recv: s2c, wire },
            false => SessionKeys { send: s2c, recv: c2s, wire },
        }
    }

    /// The sealing and opening halves.
    pub fn split(self) -> (Sealer, Opener) {
        (Sealer::new(Protect::new(self.send, self.wire)), Opener::new(Protect::new(self.recv, self.wire)))
    }
}

fn tag(key: &[u8; 32], seq: u64, data: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&seq.to_le_bytes());
    h.update(&(data.len() as u32).to_le_bytes());
    h.update(data);
    h.finalize()
}

/// Makes records: the sending half of a sealed connection.
pub struct Sealer {
    protect: Protect,
    seq: u64,
    /// Records made and not yet sent, from `at`.
    out: Vec<u8>,
    at: usize,
}

impl Sealer {
    fn new(protect: Protect) -> Sealer {
        Sealer { protect, seq: 0, out: Vec::new(), at: 0 }
    }

    /// Seals up to `max` plaintext bytes (at most [`RECORD_MAX`]) of
    /// `parts`, after their first `skip` bytes, into one record queued to
    /// be sent; returns how many plaintext bytes it took (0: none left).
    /// The bytes are copied first and tagged from the copy, so the record
    /// holds exactly what was tagged.
    pub fn seal(&mut self, parts: &[&[u8]], mut skip: usize, max: usize) -> usize {
        let max = max.min(RECORD_MAX);
        if self.at == self.out.len() {
            self.out.clear();
            self.at = 0;
        }
        let start = self.out.len();
        self.out.extend_from_slice(&[0; RECORD_HEAD]);
        let mut n = 0;
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let take = (p.len() - skip).min(max - n);
            self.out.extend_from_slice(&p[skip..skip + take]);
            skip = 0;
            n += take;
            if n == max {
                break;
            }
        }
        if n == 0 {
            self.out.truncate(start);
            return 0;
        }
        let len = (n as u32).to_le_bytes();
        self.out[start..start + RECORD_HEAD].copy_from_slice(&len);
        match &self.protect {
            Protect::Tag(key) => {
                let t = tag(key, self.seq, &self.out[start + RECORD_HEAD..]);
                self.out.extend_from_slice(t.as_bytes());
            }
            Protect::Cipher(c) => {
                use aes_gcm::aead::AeadInPlace;
                let t = c
                    .encrypt_in_place_detached(&nonce(self.seq), &len, &mut self.out[start + RECORD_HEAD..])
                    .expect("a record is far below GCM's length limit");
                self.out.extend_from_slice(&t);
            }
        }
        self.seq += 1;
        n
    }

    /// Seals all of `bytes` (as many records as it takes).
    pub fn seal_all(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            at += self.seal(&[bytes], at, RECORD_MAX);
        }
    }

    /// Record bytes waiting to be sent.
    pub fn pending(&self) -> &[u8] {
        &self.out[self.at..]
    }

    /// `n` of the pending bytes were sent.
    pub fn sent(&mut self, n: usize) {
        self.at += n;
        debug_assert!(self.at <= self.out.len());
    }
}

/// Bytes of an opener's buffer: two whole records.
const OPENER_BUF: usize = 2 * (RECORD_HEAD + RECORD_MAX + RECORD_TAG);

/// Checks records: the receiving half of a sealed connection.
pub struct Opener {
    protect: Protect,
    /// Bytes of this mode's tag.
    tag_len: usize,
    seq: u64,
    /// Record bytes received, in `buf[start..fill]`: the record being
    /// handed out (checked) or received first, then what came after it.
    buf: Box<[u8]>,
    start: usize,
    fill: usize,
    /// The checked record's plaintext still to hand out: `buf[at..end]`
    /// (`end` 0: no record is open).
    at: usize,
    end: usize,
}

impl Opener {
    fn new(protect: Protect) -> Opener {
        let tag_len = protect.tag_len();
        let buf = vec![0; OPENER_BUF].into_boxed_slice();
        Opener { protect, tag_len, seq: 0, buf, start: 0, fill: 0, at: 0, end: 0 }
    }

    /// The length the record at the front announces, once known.
    fn announced(&self) -> Option<usize> {
        let h = self.buf[self.start..self.fill].get(..RECORD_HEAD)?;
        Some(u32::from_le_bytes(h.try_into().expect("4 bytes")) as usize)
    }

    /// How many more record bytes would complete the record being
    /// received (at least 1). Meaningful once [`take`](Self::take)
    /// answered 0.
    pub fn wanted(&self) -> usize {
        let have = self.fill - self.start;
        match self.announced() {
            None => RECORD_HEAD - have,
            Some(len) => (RECORD_HEAD + len.min(RECORD_MAX) + self.tag_len).saturating_sub(have).max(1),
        }
    }

    /// Room at the end of the buffer for record bytes read straight off
    /// the connection — at least a whole record's worth once
    /// [`take`](Self::take) answered 0; say how many came with
    /// [`filled`](Self::filled).
    pub fn room(&mut self) -> &mut [u8] {
        if self.buf.len() - self.fill < RECORD_HEAD + RECORD_MAX + RECORD_TAG && self.start > 0 {
            // What is not handed out yet moves to the front.
            let from = self.start;
            self.buf.copy_within(from..self.fill, 0);
            (self.start, self.fill) = (0, self.fill - from);
            if self.end > 0 {
                (self.at, self.end) = (self.at - from, self.end - from);
            }
        }
        &mut self.buf[self.fill..]
    }

    /// `n` bytes of the [`room`](Self::room) were filled. A record whose
    /// length is out of range is refused at once.
    pub fn filled(&mut self, n: usize) -> Result<()> {
        self.fill += n;
        match self.announced() {
            Some(len) if len == 0 || len > RECORD_MAX => Err(Error::PermissionDenied(format!(
                "a sealed record of {len} bytes arrived (1 to {RECORD_MAX} allowed): the connection was \
                 tampered with, or the peer does not seal it"
            ))),
            _ => Ok(()),
        }
    }

    /// Record bytes as they came off the connection (at most a record's
    /// worth at a time).
    pub fn received(&mut self, bytes: &[u8]) -> Result<()> {
        for piece in bytes.chunks(RECORD_HEAD + RECORD_MAX + RECORD_TAG) {
            let room = self.room();
            if room.len() < piece.len() {
                return Err(Error::Protocol("record bytes arrived beyond two records not yet handed out".into()));
            }
            room[..piece.len()].copy_from_slice(piece);
            self.filled(piece.len())?;
        }
        Ok(())
    }

    /// Copies plaintext into `buf`: what is left of the record open, or
    /// of the next complete record once its tag checked. 0: no complete
    /// record yet. A tag that does not check ends the connection.
    pub fn take(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.end == 0 && !self.open()? {
            return Ok(0);
        }
        let n = (self.end - self.at).min(buf.len());
        buf[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        if self.at == self.end {
            // Handed out: the next record starts after its tag.
            self.start = self.end + self.tag_len;
            (self.at, self.end) = (0, 0);
            if self.start == self.fill {
                (self.start, self.fill) = (0, 0);
            }
        }
        Ok(n)
    }

    /// Whether a record has begun and is not complete (an end of stream
    /// now cuts it). Meaningful once [`take`](Self::take) answered 0.
    pub fn mid_record(&self) -> bool {
        self.fill > self.start && !self.complete()
    }

    fn complete(&self) -> bool {
        self.announced().is_some_and(|len| self.fill - self.start >= RECORD_HEAD + len + self.tag_len)
    }

    /// Checks the complete record at the front and opens it.
    fn open(&mut self) -> Result<bool> {
        if !self.complete() {
            return Ok(false);
        }
        let data = self.start + RECORD_HEAD;
        let end = data + self.announced().expect("complete");
        let checked = match &self.protect {
            Protect::Tag(key) => {
                let got: [u8; RECORD_TAG] = self.buf[end..end + RECORD_TAG].try_into().expect("a whole tag");
                // blake3::Hash compares in constant time.
                tag(key, self.seq, &self.buf[data..end]) == blake3::Hash::from(got)
            }
            Protect::Cipher(c) => {
                use aes_gcm::aead::AeadInPlace;
                let len = self.buf[self.start..data].to_vec();
                let t = aes_gcm::Tag::clone_from_slice(&self.buf[end..end + GCM_TAG]);
                c.decrypt_in_place_detached(&nonce(self.seq), &len, &mut self.buf[data..end], &t).is_ok()
            }
        };
        if !checked {
            return Err(Error::PermissionDenied(format!(
                "sealed record {} failed its check: the connection was altered, replayed or reordered on \
                 the way, or the peer holds another key or another wire_security",
                self.seq
            )));
        }
        self.seq += 1;
        (self.at, self.end) = (data, end);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
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
        let k =
            SessionKeys::derive(b"a shared key of enough bytes....", &[1; 32], &[2; 32], true, WireSecurity::Integrity);
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
                assert!(
                    e.message().contains(&format!("sealed {failing}failed its check")),
                    "{}: {what}: {e}",
                    mode.name()
                );
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
}
