//! `Snapshot<T>`: a value that every reader takes without a lock (an
//! `Arc` of the current version) and that writers replace whole, one at a
//! time (copy, change, publish). For tables read on every submission and
//! changed rarely: the peers of an engine, the live engines of the C ABI.
//!
//! A reader announces itself in `readers` around the two steps that are
//! not atomic together (loading the pointer, counting a reference to what
//! it points at); a writer that replaced the pointer waits until no reader
//! is announced before it drops its own reference to the old version, so
//! that no reader counts a reference to a freed one. Readers are announced
//! for a few instructions only: the wait is a spin, not a sleep.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// A value read without a lock and replaced whole (see the module).
pub struct Snapshot<T> {
    /// The current version, from `Arc::into_raw` (the cell's reference).
    current: AtomicPtr<T>,
    /// Readers between loading `current` and counting their reference.
    readers: AtomicUsize,
    /// Held by the one writer at a time.
    writer: parking_lot::Mutex<()>,
    /// The cell owns an `Arc<T>` (Send and Sync as that is).
    _owns: PhantomData<Arc<T>>,
}

impl<T> Snapshot<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> Snapshot<T> {
        Snapshot {
            current: AtomicPtr::new(Arc::into_raw(Arc::new(value)).cast_mut()),
            readers: AtomicUsize::new(0),
            writer: parking_lot::Mutex::new(()),
            _owns: PhantomData,
        }
    }

    /// The current version (no lock).
    pub fn load(&self) -> Arc<T> {
        self.readers.fetch_add(1, SeqCst);
        let p = self.current.load(SeqCst);
        // SAFETY: `p` came from `Arc::into_raw` and its version is kept
        // alive by the cell's reference: a writer that replaced it drops
        // that reference only once no reader is announced, and this one
        // is, from before it loaded `p` until after the count below.
        let v = unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        };
        self.readers.fetch_sub(1, SeqCst);
        v
    }

    /// Replaces the value by what `change` makes of a copy of it, and
    /// returns what `change` returned. Writers take turns; readers meanwhile
    /// see the old version or the new one, whole.
    pub fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R
    where
        T: Clone,
    {
        let _turn = self.writer.lock();
        let mut next = T::clone(&self.load());
        let out = change(&mut next);
        self.swap_in(next);
        out
    }

    /// Replaces the value by `value` (no copy of the old one). Writers
    /// take turns; readers meanwhile see the old version or the new one.
    pub fn set(&self, value: T) {
        let _turn = self.writer.lock();
        self.swap_in(value);
    }

    /// Publishes `next` and lets go of the cell's reference to the version
    /// it replaces; the caller holds the writer's turn.
    fn swap_in(&self, next: T) {
        let old = self.current.swap(Arc::into_raw(Arc::new(next)).cast_mut(), SeqCst);
        // A reader that loaded `old` is still announced; one announced from
        // now on loads the new version.
        let mut spins = 0u32;
        while self.readers.load(SeqCst) != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: `old` came from `Arc::into_raw` (the cell's reference to
        // the replaced version); it is no longer published and no reader
        // is between loading it and counting a reference of its own.
        drop(unsafe { Arc::from_raw(old) });
    }
}

impl<T> Drop for Snapshot<T> {
    fn drop(&mut self) {
        // SAFETY: the cell's own reference (from `Arc::into_raw`); no reader
        // can run on a cell being dropped.
        drop(unsafe { Arc::from_raw(*self.current.get_mut()) });
    }
}

impl<T: Default> Default for Snapshot<T> {
    fn default() -> Snapshot<T> {
        Snapshot::new(T::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers see whole versions while writers replace them, every
    /// version is freed exactly once (the counts of a shared marker come
    /// back to one), and a reader's version outlives its replacement.
    #[test]
    fn readers_see_whole_versions_and_every_replaced_one_is_freed() {
        let marker = Arc::new(());
        let cell = Arc::new(Snapshot::new((0u64, 0u64, marker.clone())));
        let held = cell.load();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let cell = cell.clone();
                std::thread::spawn(move || {
                    let mut last = 0;
                    for _ in 0..20_000 {
                        let v = cell.load();
                        assert_eq!(v.0 * 2, v.1, "a torn version");
                        assert!(v.0 >= last, "a version older than one seen before");
                        last = v.0;
                    }
                })
            })
            .collect();
        for n in 1..=2_000u64 {
            let was = cell.update(|v| {
                v.1 = n * 2;
                std::mem::replace(&mut v.0, n)
            });
            assert_eq!(was, n - 1);
        }
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!((held.0, held.1), (0, 0));
        assert_eq!((cell.load().0, cell.load().1), (2_000, 4_000));
        drop(held);
        // The cell's version and the marker itself: nothing leaked.
        assert_eq!(Arc::strong_count(&marker), 2);
        drop(cell);
        assert_eq!(Arc::strong_count(&marker), 1);
    }
}
