//! `Snapshot<T>`: a value that every reader takes without a lock (an
//! `Arc` of the current version) and that writers replace whole, one at a
//! time (copy, change, publish). For tables read on every submission and
//! changed rarely: the peers of an engine, the live engines of the C ABI,
//! a peer's Describe.
//!
//! A reader announces itself around the two steps that are not atomic
//! together (loading the pointer, counting a reference to what it points
//! at); a writer that replaced the pointer waits until no reader that
//! could have loaded the old one is still announced before it drops its
//! own reference to it, so that no reader counts a reference to a freed
//! version. Readers announce themselves under a phase that each writer
//! ends once it has replaced the pointer, and a writer waits only for
//! the readers of the phase it ended: readers arriving meanwhile count
//! under the next phase, so a stream of readers never holds a writer (a
//! writer may publish under a connection's lock). Readers are announced
//! for a few instructions only: the wait is a spin, not a sleep.
//!
//! Its atomics, lock and spin steps come from [`crate::sync`]: shuttle's
//! under `model-check`, where `tests/models.rs` checks that no reader
//! counts a reference to a dropped version and every replaced version is
//! dropped exactly once.

use crate::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use crate::sync::{hint, Mutex};
use std::marker::PhantomData;
use std::sync::Arc;

/// A value read without a lock and replaced whole (see the module).
pub struct Snapshot<T> {
    /// The current version, from `Arc::into_raw` (the cell's reference).
    current: AtomicPtr<T>,
    /// Readers between loading `current` and counting their reference, by
    /// the parity of the phase they announced themselves in.
    readers: [AtomicUsize; 2],
    /// The phase readers announce themselves in: ended (advanced by one)
    /// by each writer right after it replaced `current`.
    phase: AtomicU64,
    /// Held by the one writer at a time.
    writer: Mutex<()>,
    /// The cell owns an `Arc<T>` (Send and Sync as that is).
    _owns: PhantomData<Arc<T>>,
}

/// A reader announced in one phase of a [`Snapshot`], until dropped.
struct Announced<'a>(&'a AtomicUsize);

impl Drop for Announced<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl<T> Snapshot<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> Snapshot<T> {
        Snapshot {
            current: AtomicPtr::new(Arc::into_raw(Arc::new(value)).cast_mut()),
            readers: [AtomicUsize::new(0), AtomicUsize::new(0)],
            phase: AtomicU64::new(0),
            writer: Mutex::new(()),
            _owns: PhantomData,
        }
    }

    /// Announces a reader in the phase in force: counted under the
    /// phase's parity, and only once the phase is seen unchanged after the
    /// count (a reader counted under a phase a writer had already ended
    /// might be missed by that writer's wait: it counts again).
    fn announce(&self) -> Announced<'_> {
        loop {
            let phase = self.phase.load(SeqCst);
            let slot = &self.readers[(phase & 1) as usize];
            slot.fetch_add(1, SeqCst);
            let announced = Announced(slot);
            if self.phase.load(SeqCst) == phase {
                return announced;
            }
        }
    }

    /// The current version (no lock).
    pub fn load(&self) -> Arc<T> {
        let announced = self.announce();
        let p = self.current.load(SeqCst);
        // SAFETY: `p` came from `Arc::into_raw` and its version is kept
        // alive by the cell's reference: the writer that replaced it ended
        // the phase afterwards, so this reader, announced in a phase seen
        // before it loaded `p`, was announced in that phase or an earlier
        // one; each writer waits for the readers of the phase it ended
        // (writers take turns), so none drops the version before this
        // reader has counted its own reference below.
        let v = unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        };
        drop(announced);
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
        // A reader that loaded `old` announced itself in the phase ended
        // here (or in an earlier one, whose writer waited for it); one
        // announced from now on loads the new version.
        let ended = self.phase.fetch_add(1, SeqCst);
        let slot = &self.readers[(ended & 1) as usize];
        let mut spins = 0u32;
        while slot.load(SeqCst) != 0 {
            spins += 1;
            if spins < 64 {
                hint::spin_loop();
            } else {
                hint::yield_now();
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

    /// A writer waits only for the readers announced before it ended their
    /// phase, never for one that came after: with an early reader held
    /// announced (between loading and counting, as a preempted reader is)
    /// the writer waits; a reader announced while it waits does not keep
    /// it waiting once the early one has left. Guards the phase readers
    /// announce themselves in and the writer's wait on the ended phase
    /// alone (with one count of readers, a stream of readers arriving
    /// during the wait held the writer, and with it the connection lock it
    /// may publish under, for as long as the stream lasted).
    #[test]
    fn a_writer_waits_for_the_readers_before_it_and_never_for_those_after() {
        let cell = Arc::new(Snapshot::new(0u32));
        let early = cell.announce();
        let (done, finished) = std::sync::mpsc::channel();
        let writer = {
            let cell = cell.clone();
            std::thread::spawn(move || {
                cell.set(1);
                done.send(()).unwrap();
            })
        };
        // Published and its phase ended: the writer now waits for the
        // early reader. (The new value alone is not enough: a reader
        // announced between the writer's swap and its phase's end counts
        // under the ended phase, and the writer rightly waits for it.)
        while cell.phase.load(SeqCst) != 1 {
            std::thread::yield_now();
        }
        assert_eq!(*cell.load(), 1);
        let late = cell.announce();
        assert!(finished.try_recv().is_err(), "the writer did not wait for a reader announced before it");
        drop(early);
        let waited = finished.recv_timeout(std::time::Duration::from_secs(20));
        drop(late);
        writer.join().unwrap();
        assert_eq!(waited, Ok(()), "the writer waited for a reader announced after it published");
        assert_eq!(*cell.load(), 1);
    }
}
