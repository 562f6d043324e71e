//! `RelocationCache`: the requester's cache of open imports, keyed by
//! (source endpoint, source epoch, region id + epoch, local context).
//!
//! Concurrent first submissions for a key share one slot (the others wait
//! while it is constructed). At capacity a new key reclaims the least
//! recently used *idle* entry; active, constructing and closing entries are
//! never evicted, and a full cache with no idle entry answers
//! `ResourceExhausted`. An entry leaves the cache only when its native close
//! and its receipt both succeeded (or its close says the source is provably
//! gone, so no receipt is owed); a failed one stays `Retained`, and one that
//! owes only its receipt gets a receipt-only retry — when its key is asked
//! for again, on `reclaim` and on flush — never a second native close.
//!
//! Retained entries are kept apart from the bound: the capacity counts live
//! entries only, so entries that cannot be confirmed closed (a dead or
//! frozen source) never block imports from other sources. An entry that is
//! no longer current (its source left, or its channel was replaced) is
//! closed instead of handed out.
//!
//! Generic over the cached value and its close so that the state machine is
//! model-checked (`tests/models.rs`) through the `sync` shim.

use crate::error::{Error, Result};
use crate::sync::fast_hash::FastMap;
use crate::sync::{Condvar, Mutex};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

/// Closes a value: `already_native_closed` says only the receipt is owed.
/// On failure: the error, and whether the native close had succeeded.
pub type CloseFn<'a, V> = &'a dyn Fn(&V, bool) -> std::result::Result<(), (Error, bool)>;

/// Whether a cached value may still be handed out (its source and channel
/// are the ones it was opened with).
pub type CurrentFn<'a, V> = &'a dyn Fn(&V) -> bool;

enum SlotState<V> {
    Constructing,
    Ready(Arc<V>),
    Closing,
    /// A retained entry whose receipt is being retried (outside the bound).
    Retrying,
    /// Close or receipt not confirmed: kept, never evicted, outside the bound.
    Retained {
        value: Arc<V>,
        native_closed: bool,
        why: String,
    },
}

struct Slot<V> {
    state: SlotState<V>,
    users: u32,
    last_used: u64,
}

struct State<K, V> {
    slots: FastMap<K, Slot<V>>,
    clock: u64,
}

impl<K, V> State<K, V> {
    /// Entries counted against the capacity (everything but retained ones).
    fn live(&self) -> usize {
        self.slots.values().filter(|s| !matches!(s.state, SlotState::Retained { .. } | SlotState::Retrying)).count()
    }
}

/// What an entry is doing, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Cached and usable (idle or in use).
    Ready,
    /// Kept after an unconfirmed close.
    Retained,
    /// Being constructed or closed.
    Busy,
}

/// The cache.
pub struct RelocationCache<K, V> {
    capacity: usize,
    state: Mutex<State<K, V>>,
    cv: Condvar,
}

/// What one close attempt did to a slot.
enum Closed {
    Gone,
    Kept,
}

impl<K: Clone + Eq + Hash, V> RelocationCache<K, V> {
    /// A cache of `capacity` live entries.
    pub fn new(capacity: usize) -> RelocationCache<K, V> {
        RelocationCache {
            capacity,
            state: Mutex::new(State { slots: FastMap::default(), clock: 0 }),
            cv: Condvar::new(),
        }
    }

    /// Closes `v` (taken out of slot `k`, now `Closing`) outside the lock
    /// and settles the slot: removed on success, retained otherwise.
    fn close_slot(&self, k: &K, v: Arc<V>, native_closed: bool, close: CloseFn<'_, V>) -> (Closed, Option<Error>) {
        let r = close(&v, native_closed);
        let mut c = self.state.lock();
        let out = match r {
            Ok(()) => {
                c.slots.remove(k);
                (Closed::Gone, None)
            }
            Err((e, nc)) => {
                if let Some(s) = c.slots.get_mut(k) {
                    s.state = SlotState::Retained { value: v, native_closed: nc, why: e.message().to_string() };
                }
                (Closed::Kept, Some(e))
            }
        };
        drop(c);
        self.cv.notify_all();
        out
    }

    /// The value for `key` and whether it was just opened: shares a current
    /// ready entry, waits for one being constructed or closed, or opens a
    /// new one (evicting the LRU idle entry at capacity). An entry that is
    /// no longer `current` is closed first; a retained one owing only its
    /// receipt gets one receipt-only retry. `label` names the peer and
    /// region in errors (called only for one).
    pub fn acquire(
        &self,
        key: &K,
        deadline: Instant,
        label: &dyn Fn() -> String,
        open: impl FnOnce() -> Result<V>,
        close: CloseFn<'_, V>,
        current: CurrentFn<'_, V>,
    ) -> Result<(Arc<V>, bool)> {
        let mut retried = false;
        let mut c = self.state.lock();
        loop {
            c.clock += 1;
            let now = c.clock;
            if let Some(slot) = c.slots.get_mut(key) {
                match &slot.state {
                    SlotState::Ready(v) if current(v) => {
                        let v = v.clone();
                        slot.users += 1;
                        slot.last_used = now;
                        return Ok((v, false));
                    }
                    SlotState::Ready(_) if slot.users == 0 => {
                        // Its source left or its channel was replaced: close
                        // it (through the current channel) and open anew.
                        let SlotState::Ready(v) = std::mem::replace(&mut slot.state, SlotState::Closing) else {
                            unreachable!("ready")
                        };
                        drop(c);
                        self.close_slot(key, v, false, close);
                        c = self.state.lock();
                        continue;
                    }
                    SlotState::Retained { native_closed: true, .. } if !retried => {
                        retried = true;
                        let SlotState::Retained { value, .. } = std::mem::replace(&mut slot.state, SlotState::Retrying)
                        else {
                            unreachable!("retained")
                        };
                        drop(c);
                        self.close_slot(key, value, true, close);
                        c = self.state.lock();
                        continue;
                    }
                    SlotState::Retained { native_closed, why, .. } => {
                        let what = if *native_closed { "its close receipt" } else { "its native close or completion" };
                        return Err(Error::Unavailable(format!(
                            "{}: the import is retained: {what} could not be confirmed ({why}); \
                             each submission and flush retries the receipt",
                            label()
                        )));
                    }
                    SlotState::Ready(_) | SlotState::Constructing | SlotState::Closing | SlotState::Retrying => {
                        if self.cv.wait_until(&mut c, deadline).timed_out() {
                            return Err(Error::TimedOut(format!(
                                "{}: cached import still being set up or used",
                                label()
                            )));
                        }
                        continue;
                    }
                }
            }
            if c.live() >= self.capacity {
                let idle = c.slots.values().any(|s| s.users == 0 && matches!(s.state, SlotState::Ready(_)));
                if !idle {
                    return Err(Error::ResourceExhausted(format!(
                        "relocation cache full: {} live entries, none idle",
                        self.capacity
                    )));
                }
                drop(c);
                self.evict_lru_idle(close);
                c = self.state.lock();
                continue;
            }
            c.slots.insert(key.clone(), Slot { state: SlotState::Constructing, users: 0, last_used: now });
            drop(c);
            let r = open();
            let mut c = self.state.lock();
            let out = match r {
                Ok(v) => {
                    let v = Arc::new(v);
                    let s = c.slots.get_mut(key).expect("constructing slot");
                    s.state = SlotState::Ready(v.clone());
                    s.users = 1;
                    Ok((v, true))
                }
                Err(e) => {
                    c.slots.remove(key);
                    Err(e)
                }
            };
            drop(c);
            self.cv.notify_all();
            return out;
        }
    }

    /// Closes the least recently used idle entry (to free what it holds:
    /// a new import needs its mapping budget). `false`: no idle entry, or
    /// its close was not confirmed (it stays retained, holding its charge).
    pub fn evict_lru_idle(&self, close: CloseFn<'_, V>) -> bool {
        let mut c = self.state.lock();
        let victim = c
            .slots
            .iter()
            .filter(|(_, s)| s.users == 0 && matches!(s.state, SlotState::Ready(_)))
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone());
        let Some(vk) = victim else { return false };
        let slot = c.slots.get_mut(&vk).expect("victim");
        let SlotState::Ready(v) = std::mem::replace(&mut slot.state, SlotState::Closing) else {
            unreachable!("victim is ready")
        };
        drop(c);
        matches!(self.close_slot(&vk, v, false, close).0, Closed::Gone)
    }

    /// Shares the entry of the first of `keys` that is ready and `current`
    /// (its position among the keys, and the value), all under one lock,
    /// without waiting and without opening one; `None` when none is.
    pub fn share_first<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k K>,
        current: CurrentFn<'_, V>,
    ) -> Option<(usize, Arc<V>)>
    where
        K: 'k,
    {
        let mut c = self.state.lock();
        c.clock += 1;
        let now = c.clock;
        for (at, key) in keys.into_iter().enumerate() {
            let Some(slot) = c.slots.get_mut(key) else { continue };
            if let SlotState::Ready(v) = &slot.state {
                if current(v) {
                    let v = v.clone();
                    slot.users += 1;
                    slot.last_used = now;
                    return Some((at, v));
                }
            }
        }
        None
    }

    /// Whether `key` has an entry (in any state).
    pub fn contains(&self, key: &K) -> bool {
        self.state.lock().slots.contains_key(key)
    }

    /// A user is done with `key`'s entry.
    pub fn release(&self, key: &K) {
        let mut c = self.state.lock();
        if let Some(s) = c.slots.get_mut(key) {
            s.users = s.users.saturating_sub(1);
        }
        drop(c);
        self.cv.notify_all();
    }

    /// A user's completion could not be confirmed: the entry is kept as
    /// retained (no close, no receipt, never evicted, outside the bound).
    pub fn mark_uncertain(&self, key: &K, value: Arc<V>, why: &str) {
        let mut c = self.state.lock();
        if let Some(s) = c.slots.get_mut(key) {
            s.users = s.users.saturating_sub(1);
            s.state = SlotState::Retained { value, native_closed: false, why: why.to_string() };
        }
        drop(c);
        self.cv.notify_all();
    }

    /// Closes the idle entries that are no longer `current`, and retries the
    /// receipt of retained entries that owe only their receipt (`all`:
    /// every such retained entry; otherwise only those not `current`).
    /// Returns how many entries left the cache.
    pub fn reclaim(&self, close: CloseFn<'_, V>, current: CurrentFn<'_, V>, all: bool) -> usize {
        let picked: Vec<(K, Arc<V>, bool)> = {
            let mut c = self.state.lock();
            let mut out = Vec::new();
            for (k, s) in c.slots.iter_mut() {
                let take = match &s.state {
                    SlotState::Ready(v) => s.users == 0 && !current(v),
                    SlotState::Retained { value, native_closed: true, .. } => all || !current(value),
                    _ => false,
                };
                if take {
                    let busy =
                        if matches!(s.state, SlotState::Ready(_)) { SlotState::Closing } else { SlotState::Retrying };
                    match std::mem::replace(&mut s.state, busy) {
                        SlotState::Ready(v) => out.push((k.clone(), v, false)),
                        SlotState::Retained { value, .. } => out.push((k.clone(), value, true)),
                        _ => unreachable!("picked above"),
                    }
                }
            }
            out
        };
        picked
            .into_iter()
            .filter(|(k, v, nc)| matches!(self.close_slot(k, v.clone(), *nc, close).0, Closed::Gone))
            .count()
    }

    /// Closes every entry (waiting for its users until `deadline`); entries
    /// owing only a receipt get their receipt-only retry. New acquisitions
    /// may refill the cache meanwhile. Returns what stays: for each entry
    /// that could not be closed, its key and why.
    pub fn flush(&self, deadline: Instant, close: CloseFn<'_, V>) -> Vec<(K, String)> {
        self.flush_where(deadline, close, &|_| true, true)
    }

    /// [`RelocationCache::flush`] for the entries whose value `pick` selects.
    /// Entries in use, or with no value to judge yet (being set up or
    /// closed), are waited for when `wait_busy`, skipped otherwise.
    pub fn flush_where(
        &self,
        deadline: Instant,
        close: CloseFn<'_, V>,
        pick: &dyn Fn(&V) -> bool,
        wait_busy: bool,
    ) -> Vec<(K, String)> {
        let keys: Vec<K> = self.state.lock().slots.keys().cloned().collect();
        let mut left = Vec::new();
        for k in keys {
            let mut c = self.state.lock();
            let taken = loop {
                let Some(s) = c.slots.get_mut(&k) else { break None };
                match &s.state {
                    SlotState::Ready(v) if !pick(v) => break None,
                    SlotState::Retained { value, .. } if !pick(value) => break None,
                    SlotState::Ready(_) if s.users == 0 => {
                        let SlotState::Ready(v) = std::mem::replace(&mut s.state, SlotState::Closing) else {
                            unreachable!()
                        };
                        break Some((v, false));
                    }
                    SlotState::Retained { native_closed: true, .. } => {
                        let SlotState::Retained { value, .. } = std::mem::replace(&mut s.state, SlotState::Retrying)
                        else {
                            unreachable!()
                        };
                        break Some((value, true));
                    }
                    SlotState::Retained { native_closed: false, why, .. } => {
                        left.push((k.clone(), format!("its native close or completion was not confirmed ({why})")));
                        break None;
                    }
                    _ if !wait_busy => break None,
                    _ => {
                        if self.cv.wait_until(&mut c, deadline).timed_out() {
                            left.push((k.clone(), "still in use or being set up at the deadline".to_string()));
                            break None;
                        }
                    }
                }
            };
            drop(c);
            if let Some((v, native_closed)) = taken {
                if let (Closed::Kept, Some(e)) = self.close_slot(&k, v, native_closed, close) {
                    left.push((k.clone(), format!("its close could not be confirmed ({})", e.message())));
                }
            }
        }
        left
    }

    /// Entries counted against the capacity now (retained ones are not).
    pub fn live_entries(&self) -> usize {
        self.state.lock().live()
    }

    /// Every entry: key, last use (a logical clock), state and value.
    pub fn entries(&self) -> Vec<(K, u64, EntryState, Option<Arc<V>>)> {
        let c = self.state.lock();
        c.slots
            .iter()
            .map(|(k, s)| {
                let (st, v) = match &s.state {
                    SlotState::Ready(v) => (EntryState::Ready, Some(v.clone())),
                    SlotState::Retained { value, .. } => (EntryState::Retained, Some(value.clone())),
                    _ => (EntryState::Busy, None),
                };
                (k.clone(), s.last_used, st, v)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[test]
    fn a_full_cache_without_an_idle_entry_is_exhausted_but_retained_entries_do_not_count() {
        let c: RelocationCache<u8, u8> = RelocationCache::new(1);
        let close = |_: &u8, _: bool| -> std::result::Result<(), (Error, bool)> { Ok(()) };
        let (one, fresh) = c.acquire(&1, soon(), &|| "t".into(), || Ok(1), &close, &|_| true).unwrap();
        assert!(fresh);
        // Key 1 is in use: key 2 finds nothing idle to evict.
        let e = c.acquire(&2, soon(), &|| "t".into(), || Ok(2), &close, &|_| true).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::ResourceExhausted, "{e}");
        // Its completion turns out uncertain: retained, outside the bound.
        c.mark_uncertain(&1, one, "injected");
        assert_eq!(c.live_entries(), 0);
        let (two, fresh) = c.acquire(&2, soon(), &|| "t".into(), || Ok(2), &close, &|_| true).unwrap();
        assert!(fresh && *two == 2);
        // The retained key says why it cannot be used.
        let e = c.acquire(&1, soon(), &|| "key 1".into(), || Ok(1), &close, &|_| true).unwrap_err();
        assert!(e.message().contains("retained") && e.message().contains("injected"), "{e}");
        c.release(&2);
        // An entry that is no longer current is closed, not handed out.
        let (again, fresh) = c.acquire(&2, soon(), &|| "t".into(), || Ok(3), &close, &|v| *v != 2).unwrap();
        assert!(fresh && *again == 3);
    }

    /// An entry that stops being current while a user still copies through
    /// it is not closed by `reclaim` (the close would unmap it under the
    /// running copy): it stays, live and ready; once its last user leaves,
    /// the next `reclaim` closes it, exactly once. Guards `reclaim`'s
    /// `s.users == 0 && !current(v)` (round 9 I9: with `!current(v)` alone
    /// the import in use was closed).
    #[test]
    fn reclaim_closes_a_stale_entry_only_once_its_last_user_left() {
        use std::cell::{Cell, RefCell};
        let c: RelocationCache<u8, u8> = RelocationCache::new(2);
        let closed = RefCell::new(Vec::new());
        let close = |v: &u8, receipt_only: bool| -> std::result::Result<(), (Error, bool)> {
            closed.borrow_mut().push((*v, receipt_only));
            Ok(())
        };
        let current = Cell::new(true);
        let (v, fresh) = c.acquire(&1, soon(), &|| "t".into(), || Ok(7), &close, &|_| current.get()).unwrap();
        assert!(fresh && *v == 7);
        // Its source left (or its channel was replaced) while in use.
        current.set(false);
        assert_eq!(c.reclaim(&close, &|_| current.get(), false), 0);
        assert!(closed.borrow().is_empty(), "closed under its user: {:?}", closed.borrow());
        assert_eq!(c.live_entries(), 1);
        let states: Vec<(u8, EntryState)> = c.entries().into_iter().map(|(k, _, st, _)| (k, st)).collect();
        assert_eq!(states, vec![(1, EntryState::Ready)]);
        // The last user leaves: the next reclaim closes it, once.
        c.release(&1);
        assert_eq!(c.reclaim(&close, &|_| current.get(), false), 1);
        assert_eq!(*closed.borrow(), vec![(7, false)]);
        assert_eq!(c.live_entries(), 0);
        assert!(!c.contains(&1));
        assert_eq!(c.reclaim(&close, &|_| current.get(), false), 0);
        assert_eq!(closed.borrow().len(), 1);
    }
}
