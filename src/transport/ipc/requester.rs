//! Requester side of the IPC protocol: opening imports (request, offer,
//! answer, handle), the relocation cache, subbatch copies and receipts.

use super::backend::{CopyOp, IpcBackend, Mapping, ReceivedHandle};
use super::faults::Faults;
use super::link::IpcLink;
use super::messages::{ExportOffer, ExportRef, ExportRequest, Revalidate, OP_READ, OP_WRITE};
use super::plan::classify;
use crate::control::frame::MsgKind;
use crate::control::message::RegionInfo;
use crate::error::{Error, Result};
use crate::sync_util::{Budget, Permit};
use crate::transfer::{ChunkOutcome, Op, RemoteEffect, Request};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// An open import: the mapping of a whole remote allocation and its charge.
pub struct Import {
    link: Arc<IpcLink>,
    offer: ExportOffer,
    mapping: Box<dyn Mapping>,
    _charge: Permit,
}

impl Import {
    fn export_ref(&self, value: u64, extra: u32) -> ExportRef {
        ExportRef { export_id: self.offer.export_id, token: self.offer.token, value, extra }
    }
}

/// Relocation cache key: source endpoint, source epoch, region id and
/// epoch, local context (one host context for CPU memory).
type Key = (String, u64, u64, u64, u64);

enum SlotState {
    Constructing,
    Ready(Arc<Import>),
    Closing,
    /// Native close or its receipt was not confirmed: kept, never evicted.
    /// `native_closed` says whether only the receipt is owed.
    Retained {
        import: Arc<Import>,
        native_closed: bool,
    },
}

struct Slot {
    state: SlotState,
    users: u32,
    last_used: u64,
}

#[derive(Default)]
struct Cache {
    slots: HashMap<Key, Slot>,
    clock: u64,
}

/// Imports that could not be closed with certainty (cache disabled).
struct Retained {
    _import: Arc<Import>,
    native_closed: bool,
}

/// Why a subbatch did not run.
pub enum GroupError {
    /// Rejected before any copy was posted: nothing happened remotely, and
    /// the requests may try another transport.
    NotPosted(Error),
}

/// Counts for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Imports opened since the engine started.
    pub opened: u64,
    /// Imports closed with confirmation (native close + acknowledged receipt).
    pub closed: u64,
    /// Cached imports ready for reuse or in use.
    pub cached: u64,
    /// Imports kept after an unconfirmed close or receipt.
    pub retained: u64,
    /// Physical bytes charged by imports.
    pub charged_bytes: u64,
}

/// The requester side of one IPC transport.
pub struct IpcRequester {
    backend: Arc<dyn IpcBackend>,
    budget: Arc<Budget>,
    capacity: usize,
    cache: Mutex<Cache>,
    cache_cv: Condvar,
    retained: Mutex<Vec<Retained>>,
    opened: AtomicU64,
    closed: AtomicU64,
    /// Fault injection switches (inert unless armed).
    pub faults: Arc<Faults>,
}

fn ops_of(items: &[(usize, Request)]) -> u32 {
    items.iter().fold(0, |acc, (_, r)| acc | if r.op == Op::Read { OP_READ } else { OP_WRITE })
}

fn envelope(items: &[(usize, Request)]) -> (u64, u64) {
    let start = items.iter().map(|(_, r)| r.remote_addr).min().unwrap_or(0);
    let end = items.iter().map(|(_, r)| r.remote_addr + r.len).max().unwrap_or(0);
    (start, end - start)
}

impl IpcRequester {
    /// A requester over `backend` with a cache of `capacity` entries (0: no cache).
    pub fn new(
        backend: Arc<dyn IpcBackend>,
        budget: Arc<Budget>,
        capacity: usize,
        faults: Arc<Faults>,
    ) -> IpcRequester {
        IpcRequester {
            backend,
            budget,
            capacity,
            cache: Mutex::new(Cache::default()),
            cache_cv: Condvar::new(),
            retained: Mutex::new(Vec::new()),
            opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            faults,
        }
    }

    /// Opens an import: ExportRequest -> Offer (validated here) -> charge ->
    /// Answer -> Handle -> map. Any failure is before a copy was posted.
    fn open(
        &self,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        env: (u64, u64),
        ops: u32,
        deadline: Instant,
    ) -> Result<Import> {
        let tag = link.tag();
        let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128) as u32;
        let req = ExportRequest { tag, region_epoch: region.epoch, addr: env.0, len: env.1, ops, wait_ms };
        let f = link.call(MsgKind::ExportRequest, &req.encode(), deadline, "export request")?;
        let offer = match f.kind {
            MsgKind::ExportOffer => ExportOffer::decode(&f.body)?,
            MsgKind::ExportReject => {
                let (t, e) = super::messages::decode_reject(&f.body)?;
                if t != tag {
                    return Err(Error::Protocol(format!("reject for tag {t}, expected {tag}")));
                }
                return Err(e);
            }
            other => return Err(Error::Protocol(format!("export request answered with {other:?}"))),
        };
        // Validate the grant: operation, range, epochs, fresh token.
        let grant_end = offer.grant_addr.checked_add(offer.grant_len);
        let valid = offer.tag == tag
            && offer.token != 0
            && offer.region_epoch == region.epoch
            && offer.ops & ops == ops
            && offer.grant_addr <= env.0
            && grant_end.is_some_and(|e| e >= env.0 + env.1 && e <= offer.base + offer.physical)
            && offer.base <= offer.grant_addr;
        if !valid {
            let decline = ExportRef { export_id: offer.export_id, token: offer.token, value: 0, extra: 0 };
            let _ = link.call(MsgKind::ExportAnswer, &decline.encode(), deadline, "decline");
            return Err(Error::Protocol(format!("{}: the offer does not match the request ({offer:?})", link.label)));
        }
        let answer =
            |accept: bool| ExportRef { export_id: offer.export_id, token: offer.token, value: accept as u64, extra: 0 };
        let charge = match self.budget.try_acquire(offer.physical) {
            Some(c) => c,
            None => {
                link.call(MsgKind::ExportAnswer, &answer(false).encode(), deadline, "decline")?;
                return Err(Error::ResourceExhausted(format!(
                    "mapping budget: importing {} physical bytes would exceed {} ({} in use)",
                    offer.physical,
                    self.budget.limit(),
                    self.budget.used()
                )));
            }
        };
        let f = link.call(MsgKind::ExportAnswer, &answer(true).encode(), deadline, "export answer")?;
        let (body, fd) = match f.kind {
            MsgKind::ExportHandle => (f.body, f.fd),
            MsgKind::ExportReject => return Err(super::messages::decode_reject(&f.body)?.1),
            other => return Err(Error::Protocol(format!("export answer answered with {other:?}"))),
        };
        if body.len() < 28 {
            return Err(Error::Protocol("ExportHandle body too short".into()));
        }
        let r = ExportRef::decode(&body[..28], "ExportHandle")?;
        if r.export_id != offer.export_id || r.token != offer.token {
            return Err(Error::Protocol("ExportHandle names another export".into()));
        }
        let handle = ReceivedHandle { bytes: body[28..].to_vec(), fd };
        match self.backend.import(handle, offer.physical) {
            Ok(mapping) => {
                self.opened.fetch_add(1, Ordering::Relaxed);
                Ok(Import { link: link.clone(), offer, mapping, _charge: charge })
            }
            Err(e) => {
                // Nothing was mapped: tell the source it may release.
                let _ = link.receipt(MsgKind::CloseReceipt, &answer(false), deadline);
                Err(e)
            }
        }
    }

    /// Native close, then the close receipt. Only both succeeding releases
    /// the import; a failed native close is never retried; a lost ACK is
    /// retried once as a receipt only.
    fn close_import(
        &self,
        imp: &Import,
        native_closed: bool,
        deadline: Instant,
    ) -> std::result::Result<(), (Error, bool)> {
        if !native_closed {
            imp.mapping.close().map_err(|e| (e, false))?;
        }
        imp.link.receipt(MsgKind::CloseReceipt, &imp.export_ref(0, 0), deadline).map_err(|e| (e, true))?;
        self.closed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs one subbatch: consecutive requests naming one remote region.
    /// Returns one outcome per item, or `NotPosted` if it never started.
    pub fn run_group(
        &self,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        items: &[(usize, Request)],
        deadline: Instant,
    ) -> std::result::Result<Vec<ChunkOutcome>, GroupError> {
        if let Some(e) = link.dead_reason() {
            return Err(GroupError::NotPosted(e));
        }
        let env = envelope(items);
        let ops = ops_of(items);
        if self.capacity == 0 {
            let imp = Arc::new(self.open(link, region, env, ops, deadline).map_err(GroupError::NotPosted)?);
            let (mut out, uncertain) = self.copy_all(&imp, items);
            if uncertain {
                // Completion unknown: keep the mapping, its charge and the
                // source's export; no receipt.
                self.retained.lock().push(Retained { _import: imp, native_closed: false });
                return Ok(out);
            }
            // Posted copies (even failed ones) end with the import closed.
            match self.close_import(&imp, false, deadline) {
                Ok(()) => {}
                Err((e, native_closed)) => {
                    self.retained.lock().push(Retained { _import: imp.clone(), native_closed });
                    fail_all(&mut out, items, &e);
                }
            }
            return Ok(out);
        }
        let key: Key = (link.endpoint.clone(), link.source.engine_epoch, region.id, region.epoch, 0);
        // A cached export serves later submissions too: ask for every
        // operation the region allows (each submission is revalidated).
        let region_ops = (if region.access.can_read() { OP_READ } else { 0 })
            | (if region.access.can_write() { OP_WRITE } else { 0 });
        let cache_ops = if ops & !region_ops == 0 { region_ops } else { ops };
        let (imp, fresh) = self.acquire(&key, link, region, env, cache_ops, deadline).map_err(GroupError::NotPosted)?;
        if !fresh {
            let v = Revalidate {
                tag: link.tag(),
                export_id: imp.offer.export_id,
                token: imp.offer.token,
                region_epoch: region.epoch,
                addr: env.0,
                len: env.1,
                ops,
            };
            let res = link.call(MsgKind::Revalidate, &v.encode(), deadline, "revalidate").and_then(|f| match f.kind {
                MsgKind::RevalidateOk => Ok(()),
                MsgKind::ExportReject => Err(super::messages::decode_reject(&f.body)?.1),
                other => Err(Error::Protocol(format!("revalidate answered with {other:?}"))),
            });
            if let Err(e) = res {
                self.release(&key);
                return Err(GroupError::NotPosted(e));
            }
        }
        let (mut out, uncertain) = self.copy_all(&imp, items);
        if uncertain {
            let mut c = self.cache.lock();
            if let Some(s) = c.slots.get_mut(&key) {
                s.users = s.users.saturating_sub(1);
                s.state = SlotState::Retained { import: imp, native_closed: false };
            }
            drop(c);
            self.cache_cv.notify_all();
            return Ok(out);
        }
        let bytes: u64 = items.iter().map(|(_, r)| r.len).sum();
        if out.iter().all(|o| o.result.is_ok()) {
            if let Err(e) = link.receipt(MsgKind::OpComplete, &imp.export_ref(bytes, items.len() as u32), deadline) {
                fail_all(&mut out, items, &e);
            }
        }
        self.release(&key);
        Ok(out)
    }

    /// Copies every item through the import and drains the completion. On
    /// a copy failure every item of the group is affected (and the drain
    /// still runs); `uncertain` is true when completion could not be
    /// confirmed, so the import must be retained, not closed.
    fn copy_all(&self, imp: &Import, items: &[(usize, Request)]) -> (Vec<ChunkOutcome>, bool) {
        let base = imp.mapping.base();
        let ops: Vec<CopyOp> = items
            .iter()
            .map(|(_, r)| {
                let remote = base + (r.remote_addr - imp.offer.base);
                match r.op {
                    Op::Read => CopyOp { dst: r.local_addr, src: remote, len: r.len },
                    Op::Write => CopyOp { dst: remote, src: r.local_addr, len: r.len },
                }
            })
            .collect();
        let plan = classify(&ops);
        let copied = imp.mapping.copy(&ops, plan);
        let drained = imp.mapping.wait();
        let mut out: Vec<ChunkOutcome> = items.iter().map(|(_, r)| ChunkOutcome::ok(r.op)).collect();
        let uncertain = drained.is_err();
        if let Err(e) = drained.and(copied) {
            fail_all(&mut out, items, &e);
        }
        (out, uncertain)
    }

    fn acquire(
        &self,
        key: &Key,
        link: &Arc<IpcLink>,
        region: &RegionInfo,
        env: (u64, u64),
        ops: u32,
        deadline: Instant,
    ) -> Result<(Arc<Import>, bool)> {
        let mut c = self.cache.lock();
        loop {
            c.clock += 1;
            let now = c.clock;
            if let Some(slot) = c.slots.get_mut(key) {
                match &slot.state {
                    SlotState::Ready(imp) => {
                        let imp = imp.clone();
                        slot.users += 1;
                        slot.last_used = now;
                        return Ok((imp, false));
                    }
                    SlotState::Retained { .. } => {
                        return Err(Error::Unavailable(format!(
                        "{}: the cached import of region {} is retained after an unconfirmed close; flush the cache",
                        link.label, region.id
                    )))
                    }
                    SlotState::Constructing | SlotState::Closing => {
                        if self.cache_cv.wait_until(&mut c, deadline).timed_out() {
                            return Err(Error::TimedOut(format!("{}: cached import still being set up", link.label)));
                        }
                        continue;
                    }
                }
            }
            if c.slots.len() >= self.capacity {
                let victim = c
                    .slots
                    .iter()
                    .filter(|(_, s)| s.users == 0 && matches!(s.state, SlotState::Ready(_)))
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(k, _)| k.clone());
                let Some(vk) = victim else {
                    return Err(Error::ResourceExhausted(format!(
                        "relocation cache full: {} entries, none idle",
                        self.capacity
                    )));
                };
                let slot = c.slots.get_mut(&vk).expect("victim");
                let SlotState::Ready(imp) = std::mem::replace(&mut slot.state, SlotState::Closing) else {
                    unreachable!("victim is ready")
                };
                drop(c);
                let r = self.close_import(&imp, false, deadline);
                c = self.cache.lock();
                match r {
                    Ok(()) => {
                        c.slots.remove(&vk);
                    }
                    Err((_, native_closed)) => {
                        if let Some(s) = c.slots.get_mut(&vk) {
                            s.state = SlotState::Retained { import: imp, native_closed };
                        }
                    }
                }
                self.cache_cv.notify_all();
                continue;
            }
            c.slots.insert(key.clone(), Slot { state: SlotState::Constructing, users: 0, last_used: now });
            drop(c);
            let r = self.open(link, region, env, ops, deadline);
            let mut c = self.cache.lock();
            let out = match r {
                Ok(imp) => {
                    let imp = Arc::new(imp);
                    let s = c.slots.get_mut(key).expect("constructing slot");
                    s.state = SlotState::Ready(imp.clone());
                    s.users = 1;
                    Ok((imp, true))
                }
                Err(e) => {
                    c.slots.remove(key);
                    Err(e)
                }
            };
            self.cache_cv.notify_all();
            return out;
        }
    }

    fn release(&self, key: &Key) {
        let mut c = self.cache.lock();
        if let Some(s) = c.slots.get_mut(key) {
            s.users = s.users.saturating_sub(1);
        }
        drop(c);
        self.cache_cv.notify_all();
    }

    /// Closes every cached import (waiting for users up to `deadline`)
    /// through the same receipts; new submissions may refill the cache.
    /// Retained entries owing only a receipt get their receipt-only retry.
    /// Returns how many entries could not be closed.
    pub fn flush(&self, deadline: Instant) -> usize {
        let keys: Vec<Key> = self.cache.lock().slots.keys().cloned().collect();
        let mut left = 0;
        for k in keys {
            let mut c = self.cache.lock();
            let taken = loop {
                let Some(s) = c.slots.get_mut(&k) else {
                    break None;
                };
                match &s.state {
                    SlotState::Ready(_) if s.users == 0 => {
                        let SlotState::Ready(imp) = std::mem::replace(&mut s.state, SlotState::Closing) else {
                            unreachable!()
                        };
                        break Some((imp, false));
                    }
                    SlotState::Retained { native_closed: true, .. } => {
                        let SlotState::Retained { import, .. } = std::mem::replace(&mut s.state, SlotState::Closing)
                        else {
                            unreachable!()
                        };
                        break Some((import, true));
                    }
                    SlotState::Retained { native_closed: false, .. } => {
                        left += 1;
                        break None;
                    }
                    _ => {
                        if self.cache_cv.wait_until(&mut c, deadline).timed_out() {
                            left += 1;
                            break None;
                        }
                    }
                }
            };
            drop(c);
            if let Some((imp, native_closed)) = taken {
                let r = self.close_import(&imp, native_closed, deadline);
                let mut c = self.cache.lock();
                match r {
                    Ok(()) => {
                        c.slots.remove(&k);
                    }
                    Err((_, nc)) => {
                        left += 1;
                        if let Some(s) = c.slots.get_mut(&k) {
                            s.state = SlotState::Retained { import: imp, native_closed: nc };
                        }
                    }
                }
                self.cache_cv.notify_all();
            }
        }
        // Uncached imports that owe only their receipt get one more try.
        let mut r = self.retained.lock();
        let mut kept = Vec::new();
        for ent in r.drain(..) {
            if ent.native_closed {
                let imp = &ent._import;
                if imp.link.receipt(MsgKind::CloseReceipt, &imp.export_ref(0, 0), deadline).is_ok() {
                    self.closed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            kept.push(ent);
        }
        left += kept.len();
        *r = kept;
        left
    }

    /// Counts for stats.
    pub fn counts(&self) -> ImportCounts {
        let c = self.cache.lock();
        let mut n = ImportCounts {
            opened: self.opened.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            ..ImportCounts::default()
        };
        for s in c.slots.values() {
            match &s.state {
                SlotState::Ready(i) => {
                    n.cached += 1;
                    n.charged_bytes += i.offer.physical;
                }
                SlotState::Retained { import, .. } => {
                    n.retained += 1;
                    n.charged_bytes += import.offer.physical;
                }
                _ => {}
            }
        }
        for r in self.retained.lock().iter() {
            n.retained += 1;
            n.charged_bytes += r._import.offer.physical;
        }
        n
    }
}

impl IpcRequester {
    /// Remote region ids with a cached import, least recently used first.
    pub fn cached_regions(&self) -> Vec<u64> {
        let c = self.cache.lock();
        let mut v: Vec<(u64, u64)> = c
            .slots
            .iter()
            .filter(|(_, s)| matches!(s.state, SlotState::Ready(_)))
            .map(|(k, s)| (s.last_used, k.2))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, r)| r).collect()
    }
}

fn fail_all(out: &mut [ChunkOutcome], items: &[(usize, Request)], e: &Error) {
    for (o, (_, r)) in out.iter_mut().zip(items) {
        let effect = if r.op == Op::Write { RemoteEffect::Unknown } else { RemoteEffect::None };
        *o = ChunkOutcome::failed(e.clone(), effect);
    }
}
