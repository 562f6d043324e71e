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
use crate::sync::snapshot::Snapshot;
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
/// read lock on one shard only). Engines are not here: see [`ENGINES`].
const SHARDS: usize = 16;
static LIVE: Lazy<[RwLock<FastMap<usize, Kind>>; SHARDS]> = Lazy::new(Default::default);

/// Live engine handles: few, long-lived and named by every call, so they
/// are looked up without a lock (a submission then takes one lock here,
/// for its batch) and the set is replaced whole when one comes or goes.
static ENGINES: Lazy<Snapshot<FastMap<usize, ()>>> = Lazy::new(Default::default);

fn shard(addr: usize) -> &'static RwLock<FastMap<usize, Kind>> {
    // Handles are boxes: the low bits carry no information.
    &LIVE[(addr >> 4) % SHARDS]
}

/// The kind of live handle `addr`, looked up where a `want` lives first
/// (the other table only when it is not there: to name what it is).
fn kind_of(addr: usize, want: Kind) -> Option<Kind> {
    let engine = || ENGINES.load().contains_key(&addr).then_some(Kind::Engine);
    let other = || shard(addr).read().get(&addr).copied();
    match want {
        Kind::Engine => engine().or_else(other),
        _ => other().or_else(engine),
    }
}

/// Gives `value` out as a C handle (recorded as live).
pub(crate) fn give_out<T: Handle>(value: T) -> *mut T {
    let p = Box::into_raw(Box::new(value));
    match T::KIND {
        Kind::Engine => ENGINES.update(|m| {
            m.insert(p as usize, ());
        }),
        kind => {
            shard(p as usize).write().insert(p as usize, kind);
        }
    }
    p
}

/// The live handle `p` of type `T` (`name` names the argument), checked
/// before it is dereferenced.
pub(crate) fn live<'a, T: Handle>(p: *const T, name: &str) -> Result<&'a T> {
    if p.is_null() {
        return Err(Error::NullArgument(format!("{name} is NULL")));
    }
    match kind_of(p as usize, T::KIND) {
        Some(k) if k == T::KIND => {}
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
    let removed = match T::KIND {
        Kind::Engine => ENGINES.update(|m| m.remove(&(p as usize)).is_some()),
        _ => shard(p as usize).write().remove(&(p as usize)).is_some(),
    };
    if !removed {
        // Another thread freed it between the check and now.
        return Err(Error::InvalidArgument(format!("{name} was freed by another call meanwhile")));
    }
    // SAFETY: p was given out by give_out as a Box<T>, and removing it from
    // the live set made this the one call that takes it back.
    Ok(Some(unsafe { Box::from_raw(p) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeEngine(u32);
    impl Handle for FakeEngine {
        const KIND: Kind = Kind::Engine;
    }
    struct FakeBatch(u32);
    impl Handle for FakeBatch {
        const KIND: Kind = Kind::Batch;
    }

    fn message<T>(r: Result<T>) -> String {
        r.err().expect("refused").to_string()
    }

    /// Engines (looked up without a lock) and other handles (in the
    /// shards) are told apart both ways, each named for what it is, and a
    /// handle taken back is live no more. Guards `kind_of` looking in the
    /// other table before calling a handle dead.
    #[test]
    fn engines_and_batches_are_found_and_told_apart_in_their_two_tables() {
        let e = give_out(FakeEngine(7));
        let b = give_out(FakeBatch(9));
        assert_eq!(live(e, "engine").unwrap().0, 7);
        assert_eq!(live(b, "batch").unwrap().0, 9);
        let m = message(live(b as *const FakeEngine, "engine"));
        assert!(m.contains("engine is an orbite_batch, not an orbite_engine"), "{m}");
        let m = message(live(e as *const FakeBatch, "batch"));
        assert!(m.contains("batch is an orbite_engine, not an orbite_batch"), "{m}");
        assert_eq!(take_back(e, "engine").unwrap().unwrap().0, 7);
        assert_eq!(take_back(b, "batch").unwrap().unwrap().0, 9);
        for m in [message(live(e, "engine")), message(take_back(b, "batch"))] {
            assert!(m.contains("is not a live handle"), "{m}");
        }
    }
}
