//! `Spare<T, N>`: up to `N` emptied vectors kept between uses, taken and
//! given back with one atomic swap a slot (no lock). For the per-request
//! vectors of a submission (the batch's records, the planned items, each
//! window's requests and copies): at 10^5 requests their memory, freed,
//! went back to the kernel and was faulted in again page by page by the
//! next submission; a kept one stays mapped. Several slots serve vectors
//! that are alive at once (the windows of a group copying on the pool
//! while the next is posted).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The vectors a `Spare` keeps are at most this many bytes in all: each
/// of its `N` at most an `N`th of it (larger ones are freed).
pub const SPARE_MAX_BYTES: usize = 32 << 20;

/// Spare vectors (see the module); one slot unless told.
pub struct Spare<T, const N: usize = 1> {
    /// Each a boxed empty `Vec<T>` from `Box::into_raw`, or null.
    slots: [AtomicPtr<Vec<T>>; N],
    _owns: PhantomData<Vec<T>>,
}

impl<T, const N: usize> Spare<T, N> {
    /// No vector kept yet.
    pub const fn new() -> Spare<T, N> {
        Spare { slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; N], _owns: PhantomData }
    }

    /// An empty vector with room for at least `n` (a kept one when there
    /// is one: the first slot's that holds one).
    pub fn take(&self, n: usize) -> Vec<T> {
        for slot in &self.slots {
            if slot.load(Ordering::Relaxed).is_null() {
                continue;
            }
            let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if p.is_null() {
                continue;
            }
            // SAFETY: a non-null slot holds a pointer from `Box::into_raw`
            // (`give`), and the swap made this call its one owner.
            let mut v = *unsafe { Box::from_raw(p) };
            v.reserve(n);
            return v;
        }
        Vec::with_capacity(n)
    }

    /// Keeps `v`, emptied, for a later `take` in the first empty slot
    /// (unless none is, or it is larger than an `N`th of
    /// [`SPARE_MAX_BYTES`]).
    pub fn give(&self, mut v: Vec<T>) {
        let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
        if bytes == 0 || bytes > SPARE_MAX_BYTES / N {
            return;
        }
        v.clear();
        let mut b = Box::into_raw(Box::new(v));
        for slot in &self.slots {
            if !slot.load(Ordering::Relaxed).is_null() {
                continue;
            }
            match slot.compare_exchange(std::ptr::null_mut(), b, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    b = std::ptr::null_mut();
                    break;
                }
                Err(_) => continue,
            }
        }
        if !b.is_null() {
            // SAFETY: `b` is from `Box::into_raw` above and was not published.
            drop(unsafe { Box::from_raw(b) });
        }
    }
}

impl<T, const N: usize> Default for Spare<T, N> {
    fn default() -> Spare<T, N> {
        Spare::new()
    }
}

impl<T, const N: usize> Drop for Spare<T, N> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let p = *slot.get_mut();
            if !p.is_null() {
                // SAFETY: from `Box::into_raw` (`give`), owned by the slot.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vector given back is the one taken next (same memory, emptied),
    /// one is kept at most, and one past the bound is not kept.
    #[test]
    fn the_vector_given_back_is_taken_again_emptied() {
        let spare: Spare<u64> = Spare::new();
        let mut v = spare.take(1000);
        v.extend(0..1000);
        let at = v.as_ptr();
        spare.give(v);
        spare.give(Vec::with_capacity(10));
        let again = spare.take(10);
        assert_eq!((again.as_ptr(), again.len(), again.capacity() >= 1000), (at, 0, true));
        assert_eq!(spare.take(10).capacity(), 10, "a second vector was kept");
        spare.give(Vec::with_capacity(SPARE_MAX_BYTES / 8 + 1));
        assert_eq!(spare.take(1).capacity(), 1, "a vector past the bound was kept");
    }

    /// Guards the slots of a `Spare<T, N>`: vectors alive at once are all
    /// kept (up to `N`), each taken again once; an `N + 1`th is freed, and
    /// so is one past an `N`th of the bound.
    #[test]
    fn each_slot_keeps_one_of_the_vectors_alive_at_once() {
        let spare: Spare<u64, 2> = Spare::new();
        spare.give(Vec::with_capacity(SPARE_MAX_BYTES / 16 + 1));
        assert_eq!(spare.take(1).capacity(), 1, "a vector past its slot's share of the bound was kept");
        let (a, b, c) = (spare.take(100), spare.take(200), spare.take(300));
        let mut at = vec![a.as_ptr(), b.as_ptr()];
        spare.give(a);
        spare.give(b);
        spare.give(c);
        let mut again: Vec<_> = (0..3).map(|_| spare.take(1)).collect();
        assert_eq!(
            again.iter().map(Vec::capacity).filter(|&n| n == 1).count(),
            1,
            "not exactly two of the three vectors were kept"
        );
        again.retain(|v| v.capacity() > 1);
        let mut got: Vec<_> = again.iter().map(Vec::as_ptr).collect();
        at.sort();
        got.sort();
        assert_eq!(got, at);
    }
}
