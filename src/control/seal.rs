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
#[path = "seal_tests.rs"]
mod tests;
