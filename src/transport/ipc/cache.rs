//! `RelocationCache`: the requester's cache of open imports, keyed by
//! (source endpoint, source epoch, region id + epoch, local context).
//!
//! Concurrent first submissions for a key share one slot (the others wait
//! while it is constructed). At capacity a new key reclaims the least
//! recently used *idle* entry; active, constructing, closing and uncertain
//! entries are never evicted, and a full cache with no idle entry answers
//! `ResourceExhausted`. An entry leaves the cache only when its native close
//! and its receipt both succeeded; a failed one stays `Retained`, and one
//! that owes only its receipt gets a receipt-only retry on the next flush,
//! never a second native close.
//!
//! Generic over the cached value and its close so that the state machine is
//! model-checked (`tests/models.rs`) through the `sync` shim.

use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

/// Closes a value: `already_native_closed` says only the receipt is owed.
/// On failure: the error, and whether the native close had succeeded.
pub type CloseFn<'a, V> = &'a dyn Fn(&V, bool) -> std::result::Result<(), (Error, bool)>;

enum SlotState<V> {
    Constructing,
    Ready(Arc<V>),
    Closing,
    /// Close or receipt not confirmed: kept, never evicted.
    Retained {
        value: Arc<V>,
        native_closed: bool,
    },
}

struct Slot<V> {
    state: SlotState<V>,
    users: u32,
    last_used: u64,
}

struct State<K, V> {
    slots: HashMap<K, Slot<V>>,
    clock: u64,
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

impl<K: Clone + Eq + Hash, V> RelocationCache<K, V> {
    /// A cache of `capacity` entries.
    pub fn new(capacity: usize) -> RelocationCache<K, V> {
        RelocationCache { capacity, state: Mutex::new(State { slots: HashMap::new(), clock: 0 }), cv: Condvar::new() }
    }

    /// The value for `key` and whether it was just opened: shares a ready
    /// entry, waits for one being constructed or closed, or opens a new one
    /// (evicting the LRU idle entry at capacity). `label` names the peer and
    /// region in errors.
    pub fn acquire(
        &self,
        key: &K,
        deadline: Instant,
        label: &str,
        open: impl FnOnce() -> Result<V>,
        close: CloseFn<'_, V>,
    ) -> Result<(Arc<V>, bool)> {
        let mut c = self.state.lock();
        loop {
            c.clock += 1;
            let now = c.clock;
            if let Some(slot) = c.slots.get_mut(key) {
                match &slot.state {
                    SlotState::Ready(v) => {
                        let v = v.clone();
                        slot.users += 1;
                        slot.last_used = now;
                        return Ok((v, false));
                    }
                    SlotState::Retained { .. } => {
                        return Err(Error::Unavailable(format!(
                            "{label}: the cached import is retained after an unconfirmed close; flush the cache"
                        )))
                    }
                    SlotState::Constructing | SlotState::Closing => {
                        if self.cv.wait_until(&mut c, deadline).timed_out() {
                            return Err(Error::TimedOut(format!("{label}: cached import still being set up")));
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
                let SlotState::Ready(v) = std::mem::replace(&mut slot.state, SlotState::Closing) else {
                    unreachable!("victim is ready")
                };
                drop(c);
                let r = close(&v, false);
                c = self.state.lock();
                match r {
                    Ok(()) => {
                        c.slots.remove(&vk);
                    }
                    Err((_, native_closed)) => {
                        if let Some(s) = c.slots.get_mut(&vk) {
                            s.state = SlotState::Retained { value: v, native_closed };
                        }
                    }
                }
                self.cv.notify_all();
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
    /// retained (no close, no receipt, never evicted).
    pub fn mark_uncertain(&self, key: &K, value: Arc<V>) {
        let mut c = self.state.lock();
        if let Some(s) = c.slots.get_mut(key) {
            s.users = s.users.saturating_sub(1);
            s.state = SlotState::Retained { value, native_closed: false };
        }
        drop(c);
        self.cv.notify_all();
    }

    /// Closes every entry (waiting for its users until `deadline`); entries
    /// owing only a receipt get their receipt-only retry. New acquisitions
    /// may refill the cache meanwhile. Returns how many entries stay.
    pub fn flush(&self, deadline: Instant, close: CloseFn<'_, V>) -> usize {
        let keys: Vec<K> = self.state.lock().slots.keys().cloned().collect();
        let mut left = 0;
        for k in keys {
            let mut c = self.state.lock();
            let taken = loop {
                let Some(s) = c.slots.get_mut(&k) else { break None };
                match &s.state {
                    SlotState::Ready(_) if s.users == 0 => {
                        let SlotState::Ready(v) = std::mem::replace(&mut s.state, SlotState::Closing) else {
                            unreachable!()
                        };
                        break Some((v, false));
                    }
                    SlotState::Retained { native_closed: true, .. } => {
                        let SlotState::Retained { value, .. } = std::mem::replace(&mut s.state, SlotState::Closing)
                        else {
                            unreachable!()
                        };
                        break Some((value, true));
                    }
                    SlotState::Retained { native_closed: false, .. } => {
                        left += 1;
                        break None;
                    }
                    _ => {
                        if self.cv.wait_until(&mut c, deadline).timed_out() {
                            left += 1;
                            break None;
                        }
                    }
                }
            };
            drop(c);
            if let Some((v, native_closed)) = taken {
                let r = close(&v, native_closed);
                let mut c = self.state.lock();
                match r {
                    Ok(()) => {
                        c.slots.remove(&k);
                    }
                    Err((_, nc)) => {
                        left += 1;
                        if let Some(s) = c.slots.get_mut(&k) {
                            s.state = SlotState::Retained { value: v, native_closed: nc };
                        }
                    }
                }
                drop(c);
                self.cv.notify_all();
            }
        }
        left
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
