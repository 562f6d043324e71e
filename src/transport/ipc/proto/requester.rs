//! The requester's side of the IPC protocol as decisions without I/O: no
//! lock, thread, clock or descriptor. [`Opening`] is one import's opening
//! exchange (request, offer checked against it, answer, handle);
//! [`revalidated`] reads a revalidation's answer; [`Ending::of`] decides
//! how a posted group ends. `ipc/requester/` sends and receives the frames
//! over its link and carries out what these return.

use super::super::messages::{decode_reject, ExportOffer, ExportRef, ExportRequest};
use crate::control::frame::MsgKind;
use crate::error::{Error, Result};

/// Bytes of the [`ExportRef`] an `ExportHandle` body starts with (the
/// backend's handle bytes follow).
const HANDLE_REF_LEN: usize = 28;

/// One import's opening exchange: the `ExportRequest` to send, the offer
/// answering it checked against it, the answer refs, and the handle that
/// answers an accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opening {
    request: ExportRequest,
    /// The offer [`Opening::offered`] found matching.
    offer: Option<ExportOffer>,
}

/// What an offer frame comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    /// It matches the request: answer it with [`Opening::answer`].
    Checked(ExportOffer),
    /// It does not: send `decline` as the `ExportAnswer` (its outcome does
    /// not matter), then fail with `error`.
    Declined {
        /// The decline naming the offered export.
        decline: ExportRef,
        /// The protocol error the open ends with.
        error: Error,
    },
}

/// The refusal an `ExportReject` body carries (its tag is not checked).
fn rejected(body: &[u8]) -> Error {
    match decode_reject(body) {
        Ok((_, e)) | Err(e) => e,
    }
}

impl Opening {
    /// The exchange asking for `env` (start, length) of a region in epoch
    /// `region_epoch` for `ops`, under `tag`, letting the source wait
    /// `wait_ms` for the allocation's loan.
    pub fn new(tag: u64, region_epoch: u64, env: (u64, u64), ops: u32, wait_ms: u32) -> Opening {
        let request = ExportRequest { tag, region_epoch, addr: env.0, len: env.1, ops, wait_ms };
        Opening { request, offer: None }
    }

    /// The request to send.
    pub fn request(&self) -> ExportRequest {
        self.request
    }

    /// Reads the frame answering the request. An offer is checked: its tag,
    /// a nonzero token, the region epoch, every operation asked for, a grant
    /// covering the envelope and lying within the allocation (`base` to
    /// `base + physical`); one that does not match is declined, naming the
    /// source as `label` in the error. A reject (of this tag) gives the
    /// error it carries; any other frame is a protocol error.
    pub fn offered(&mut self, kind: MsgKind, body: &[u8], label: &str) -> Result<Offered> {
        let tag = self.request.tag;
        let offer = match kind {
            MsgKind::ExportOffer => ExportOffer::decode(body)?,
            MsgKind::ExportReject => {
                let (t, e) = decode_reject(body)?;
                if t != tag {
                    return Err(Error::Protocol(format!("reject for tag {t}, expected {tag}")));
                }
                return Err(e);
            }
            other => return Err(Error::Protocol(format!("export request answered with {other:?}"))),
        };
        if !self.matches(&offer) {
            let decline = ExportRef { export_id: offer.export_id, token: offer.token, value: 0, extra: 0 };
            let error = Error::Protocol(format!("{label}: the offer does not match the request ({offer:?})"));
            return Ok(Offered::Declined { decline, error });
        }
        self.offer = Some(offer);
        Ok(Offered::Checked(offer))
    }

    /// Whether `o` grants what the request asked: operations, range,
    /// epochs, a fresh token.
    fn matches(&self, o: &ExportOffer) -> bool {
        let r = &self.request;
        let grant_end = o.grant_addr.checked_add(o.grant_len);
        let limit = o.base.checked_add(o.physical);
        o.tag == r.tag
            && o.token != 0
            && o.region_epoch == r.region_epoch
            && o.ops & r.ops == r.ops
            && o.grant_addr <= r.addr
            && grant_end.is_some_and(|e| e >= r.addr + r.len && limit.is_some_and(|l| e <= l))
            && o.base <= o.grant_addr
    }

    fn checked(&self) -> &ExportOffer {
        self.offer.as_ref().expect("an answer follows a checked offer")
    }

    /// The answer to the checked offer: accept (`true`) or decline. A
    /// decline is also the close receipt of an import that was not mapped.
    ///
    /// # Panics
    /// Before [`Opening::offered`] checked an offer.
    pub fn answer(&self, accept: bool) -> ExportRef {
        let o = self.checked();
        ExportRef { export_id: o.export_id, token: o.token, value: accept as u64, extra: 0 }
    }

    /// Reads the frame answering the accept: the handle's bytes (the
    /// backend's, after the ref naming the export), or the error of a
    /// reject, or a protocol error for any other frame, a short body or a
    /// handle naming another export or token.
    ///
    /// # Panics
    /// Before [`Opening::offered`] checked an offer.
    pub fn handle(&self, kind: MsgKind, body: &[u8]) -> Result<Vec<u8>> {
        match kind {
            MsgKind::ExportHandle => {}
            MsgKind::ExportReject => return Err(rejected(body)),
            other => return Err(Error::Protocol(format!("export answer answered with {other:?}"))),
        }
        if body.len() < HANDLE_REF_LEN {
            return Err(Error::Protocol("ExportHandle body too short".into()));
        }
        let r = ExportRef::decode(&body[..HANDLE_REF_LEN], "ExportHandle")?;
        let o = self.checked();
        if r.export_id != o.export_id || r.token != o.token {
            return Err(Error::Protocol("ExportHandle names another export".into()));
        }
        Ok(body[HANDLE_REF_LEN..].to_vec())
    }
}

/// Reads the frame answering a `Revalidate`: the slot generation a
/// `RevalidateOk` names after its tag (0 from a source without a board),
/// the error of a reject, or a protocol error for any other frame.
pub fn revalidated(kind: MsgKind, body: &[u8]) -> Result<u64> {
    match kind {
        MsgKind::RevalidateOk => Ok(body.get(8..16).map_or(0, |g| u64::from_le_bytes(g.try_into().expect("8 bytes")))),
        MsgKind::ExportReject => Err(rejected(body)),
        other => Err(Error::Protocol(format!("revalidate answered with {other:?}"))),
    }
}

/// How a posted group ended, as [`Ending::of`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupEnd {
    /// It ran inside its import's board slot (no receipt round trip).
    pub entered: bool,
    /// Its completion is not confirmed: the copies may still run.
    pub uncertain: bool,
    /// Every request of it succeeded.
    pub all_ok: bool,
    /// How many requests it had.
    pub requests: usize,
    /// The bytes of all its requests.
    pub bytes: u64,
}

/// What the driver does with a posted group's import once the group ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending<K> {
    /// Uncached, uncertain: keep the import (and the source's export) for
    /// good, no close, no receipt.
    Retain,
    /// Uncached: close the import with its close receipt.
    Close,
    /// Cached, uncertain: mark the cache entry uncertain.
    MarkUncertain(K),
    /// Cached, in the board slot: count `requests` requests of `bytes`
    /// bytes in the slot (zero and zero unless all succeeded), leave it,
    /// then release the cache entry.
    Leave {
        /// The cache entry.
        key: K,
        /// Requests to count.
        requests: u64,
        /// Bytes to count.
        bytes: u64,
    },
    /// Cached, outside the slot, all succeeded: send an `OpComplete`
    /// receipt of `bytes` bytes and `requests` requests, then release.
    Receipt {
        /// The cache entry.
        key: K,
        /// Bytes the receipt claims.
        bytes: u64,
        /// Requests it claims.
        requests: u32,
    },
    /// Cached, outside the slot, not all succeeded: release, no receipt.
    Release(K),
}

impl<K> Ending<K> {
    /// The ending of a group through the cache entry `key` (`None`: an
    /// import of its own, uncached).
    pub fn of(key: Option<K>, g: GroupEnd) -> Ending<K> {
        match key {
            None if g.uncertain => Ending::Retain,
            None => Ending::Close,
            Some(key) if g.uncertain => Ending::MarkUncertain(key),
            Some(key) if g.entered => match g.all_ok {
                true => Ending::Leave { key, requests: g.requests as u64, bytes: g.bytes },
                false => Ending::Leave { key, requests: 0, bytes: 0 },
            },
            Some(key) if g.all_ok => Ending::Receipt { key, bytes: g.bytes, requests: g.requests as u32 },
            Some(key) => Ending::Release(key),
        }
    }
}

#[cfg(test)]
#[path = "requester_tests.rs"]
mod tests;
