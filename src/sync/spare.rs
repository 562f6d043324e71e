//! `Spare<T>`: one emptied vector kept between uses, taken and given back
//! with one atomic swap each (no lock). For the per-request vectors of a
//! submission (the batch's records, the planned items): at 10^5 requests
//! their memory, freed, went back to the kernel and was faulted in again
//! page by page by the next submission; a kept one stays mapped.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A kept vector is at most this many bytes (larger ones are freed).
pub const SPARE_MAX_BYTES: usize = 32 << 20;

/// One spare vector (see the module).
pub struct Spare<T> {
    /// A boxed empty `Vec<T>` from `Box::into_raw`, or null.
    slot: AtomicPtr<Vec<T>>,
    _owns: PhantomData<Vec<T>>,
}

impl<T> Spare<T> {
    /// No vector kept yet.
    pub const fn new() -> Spare<T> {
        Spare { slot: AtomicPtr::new(std::ptr::null_mut()), _owns: PhantomData }
    }

    /// An empty vector with room for at least `n` (the kept one when there
    /// is one).
    pub fn take(&self, n: usize) -> Vec<T> {
        let p = self.slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if p.is_null() {
            return Vec::with_capacity(n);
        }
        // SAFETY: a non-null slot holds a pointer from `Box::into_raw`
        // (`give`), and the swap made this call its one owner.
        let mut v = *unsafe { Box::from_raw(p) };
        v.reserve(n);
        v
    }

    /// Keeps `v`, emptied, for the next `take` (unless one is kept already
    /// or it is larger than [`SPARE_MAX_BYTES`]).
    pub fn give(&self, mut v: Vec<T>) {
        let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
        if bytes == 0 || bytes > SPARE_MAX_BYTES || !self.slot.load(Ordering::Relaxed).is_null() {
            return;
        }
        v.clear();
        let b = Box::into_raw(Box::new(v));
        if self.slot.compare_exchange(std::ptr::null_mut(), b, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            // SAFETY: `b` is from `Box::into_raw` above and was not published.
            drop(unsafe { Box::from_raw(b) });
        }
    }
}

impl<T> Default for Spare<T> {
    fn default() -> Spare<T> {
        Spare::new()
    }
}

impl<T> Drop for Spare<T> {
    fn drop(&mut self) {
        let p = *self.slot.get_mut();
        if !p.is_null() {
            // SAFETY: from `Box::into_raw` (`give`), owned by the slot.
            drop(unsafe { Box::from_raw(p) });
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
}
