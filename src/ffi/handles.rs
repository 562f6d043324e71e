//! Which C handles are live, and of which type: every handle the library
//! gives out is recorded by address until it is freed, and every function
//! that takes one looks it up before touching it. A handle of another
//! type (a batch passed as an engine), a freed one, or any other pointer
//! is refused with `INVALID_ARGUMENT` instead of being dereferenced. What
//! cannot be detected: a handle freed while another thread is inside a
//! call on it, or one whose address a new handle of the same type reuses
//! (docs/threading.md: freeing a handle in use is undefined).

use super::types::{orbite_allocation, orbite_batch, orbite_direct, orbite_engine, orbite_stats};
use crate::error::{Error, Result};
use crate::sync::fast_hash::FastMap;
use once_cell::sync::Lazy;
use parking_lot::RwLock;

/// The handle types of the C ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Engine,
    Batch,
    Allocation,
    Stats,
    Direct,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Engine => "an orbite_engine",
            Kind::Batch => "an orbite_batch",
            Kind::Allocation => "an orbite_allocation",
            Kind::Stats => "an orbite_stats",
            Kind::Direct => "an orbite_direct",
        }
    }
}

/// A C handle type.
pub(crate) trait Handle {
    const KIND: Kind;
}

impl Handle for orbite_engine {
    const KIND: Kind = Kind::Engine;
}
impl Handle for orbite_batch {
    const KIND: Kind = Kind::Batch;
}
impl Handle for orbite_allocation {
    const KIND: Kind = Kind::Allocation;
}
impl Handle for orbite_stats {
    const KIND: Kind = Kind::Stats;
}
impl Handle for orbite_direct {
    const KIND: Kind = Kind::Direct;
}

/// Live handles by address, in shards (lookups from many threads take a
/// read lock on one shard only).
const SHARDS: usize = 16;
static LIVE: Lazy<[RwLock<FastMap<usize, Kind>>; SHARDS]> = Lazy::new(Default::default);

fn shard(addr: usize) -> &'static RwLock<FastMap<usize, Kind>> {
    // Handles are boxes: the low bits carry no information.
    &LIVE[(addr >> 4) % SHARDS]
}

/// Gives `value` out as a C handle (recorded as live).
pub(crate) fn give_out<T: Handle>(value: T) -> *mut T {
    let p = Box::into_raw(Box::new(value));
    shard(p as usize).write().insert(p as usize, T::KIND);
    p
}

/// The live handle `p` of type `T` (`name` names the argument), checked
/// before it is dereferenced.
pub(crate) fn live<'a, T: Handle>(p: *const T, name: &str) -> Result<&'a T> {
    if p.is_null() {
        return Err(Error::NullArgument(format!("{name} is NULL")));
    }
    match shard(p as usize).read().get(&(p as usize)) {
        Some(k) if *k == T::KIND => {}
        Some(k) => {
            return Err(Error::InvalidArgument(format!("{name} is {}, not {}", k.name(), T::KIND.name())));
        }
        None => {
            return Err(Error::InvalidArgument(format!(
                "{name} is not a live handle (freed already, or never {})",
                T::KIND.name()
            )))
        }
    }
    // SAFETY: p was given out by give_out as a Box<T> and not taken back
    // (it is recorded live with T's kind); the C contract forbids freeing
    // it while this call runs.
    Ok(unsafe { &*p })
}

/// Takes handle `p` back to free it: `None` for NULL, and an error (the
/// handle untouched) when `p` is not a live handle of type `T`.
pub(crate) fn take_back<T: Handle>(p: *mut T, name: &str) -> Result<Option<Box<T>>> {
    if p.is_null() {
        return Ok(None);
    }
    live(p as *const T, name)?;
    if shard(p as usize).write().remove(&(p as usize)).is_none() {
        // Another thread freed it between the check and now.
        return Err(Error::InvalidArgument(format!("{name} was freed by another call meanwhile")));
    }
    // SAFETY: p was given out by give_out as a Box<T>, and removing it from
    // the live set made this the one call that takes it back.
    Ok(Some(unsafe { Box::from_raw(p) }))
}
